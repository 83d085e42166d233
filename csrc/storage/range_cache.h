// dali_mesh: a local disk cache of the byte ranges a process fetched from a remote store, for
// training over many epochs: epoch 2 reads local disk, and each node caches only its ranks' share.
// Host only, DALI-free.
//
// An entry is one range of one version of one object: keyed by the object's name, its version (ETag)
// and the range, so a replaced object is never served from the cache (its ETag differs).
//
// The user's folder (`dir`, any existing folder of theirs, even $HOME) is never scanned: the cache
// keeps everything in a subfolder of its own, dir/dali_mesh-cache-v1/ (kSubfolder), and reads, changes
// or deletes nothing outside it. Inside it, entries are files named `hh/hhhhhhhhhhhhhhhh` (16 hex
// digits of the id's hash, the subfolder its first two) starting with the magic "DMRC0001";
// temporaries are `hh/.dmrc-tmp-*`; a lock file `.dmrc-lock`. Eviction deletes only such entries
// (the magic read before the unlink) and such temporaries older than an hour; it never follows a
// symlink (every name is opened relative to a folder fd with O_NOFOLLOW) and never enters `.`/`..`.
//
// The folders are this user's only: dir and the cache's subfolder are refused (an error naming them)
// when another user owns them or others may write them, or when the subfolder is a symlink; an entry
// subfolder that fails the same check is not used (a miss, no put) and never deleted. Several
// processes share the cache: an entry is written to a temporary name and renamed into place without
// replacing anything (a reader sees a whole entry or none), and holds its key and a checksum of its
// bytes, checked at every read (a damaged entry of the cache's own is a miss and is removed; a file
// without the magic is a miss and is left alone). The cache is bounded by max_bytes with LRU eviction
// (a hit touches the entry's modification time; a process that wrote a tenth of the bound since its
// last look removes the oldest entries until the cache holds 90% of it, one process at a time under a
// flock). A cache that cannot write (a full disk) leaves reads alone.
#ifndef DALI_MESH_STORAGE_RANGE_CACHE_H_
#define DALI_MESH_STORAGE_RANGE_CACHE_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace dali_mesh {

class RangeCache {
 public:
  // The cache's own subfolder of `dir`: a version in its name, so that another layout gets another one.
  static constexpr const char *kSubfolder = "dali_mesh-cache-v1";

  RangeCache(std::string dir, int64_t max_bytes);
  ~RangeCache();
  RangeCache(const RangeCache &) = delete;
  RangeCache &operator=(const RangeCache &) = delete;

  // Fills `bufs` with the cached bytes of `id` (their total is the range's length), or false.
  bool Get(const std::string &id, const std::vector<std::pair<char *, int64_t>> &bufs) const;
  // Keeps the bytes of `bufs` as the entry `id` (best effort: a failure leaves the cache as it was).
  void Put(const std::string &id, const std::vector<std::pair<char *, int64_t>> &bufs) const;
  // Brings the cache within its bound (Put calls it whenever a tenth of the bound was written; public
  // for the tests' entry point, csrc/c_api/cache_api.cc).
  void Evict() const;
  const std::string &dir() const { return dir_; }

 private:
  // Creates and checks the folders on first use; fails naming them when they are not this user's own.
  void Ready() const;
  // The entry subfolder `sub` (two hex digits) as an fd, created first when `create`; -1 when it is
  // missing, not a folder, a symlink, or not this user's own.
  int OpenSub(const char *sub, bool create) const;

  std::string dir_;
  int64_t max_bytes_;
  mutable std::once_flag ready_;
  mutable int root_fd_ = -1;  // dir_/kSubfolder, opened once (O_DIRECTORY | O_NOFOLLOW)
  mutable std::mutex evict_mutex_;
  mutable std::atomic<int64_t> written_{0};  // bytes written since this process last looked at the folder
};

}  // namespace dali_mesh

#endif  // DALI_MESH_STORAGE_RANGE_CACHE_H_
