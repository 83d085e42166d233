// dali_mesh: a local disk cache of the byte ranges a process fetched from a remote store, for
// training over many epochs: epoch 2 reads local disk, and each node caches only its ranks' share.
// Host only, DALI-free.
//
// An entry is one range of one version of one object: keyed by the object's name, its version (ETag)
// and the range, so a replaced object is never served from the cache (its ETag differs). The folder
// is this user's only (created 0700; refused when another user owns it or others may write it, as the
// plan folder), several processes share it: an entry is written to a temporary name and renamed (a
// reader sees a whole entry or none), and holds its key and a checksum of its bytes, checked at every
// read (a mismatch is a miss, and the entry is removed). The folder is bounded by max_bytes with LRU
// eviction (a hit touches the entry's modification time; a process that wrote a tenth of the bound
// since its last look removes the oldest entries until the folder holds 90% of it). A cache that
// cannot write (a full disk) leaves reads alone.
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
  RangeCache(std::string dir, int64_t max_bytes);
  // Fills `bufs` with the cached bytes of `id` (their total is the range's length), or false.
  bool Get(const std::string &id, const std::vector<std::pair<char *, int64_t>> &bufs) const;
  // Keeps the bytes of `bufs` as the entry `id` (best effort: a failure leaves the cache as it was).
  void Put(const std::string &id, const std::vector<std::pair<char *, int64_t>> &bufs) const;
  const std::string &dir() const { return dir_; }

 private:
  // Creates and checks the folder on first use; fails naming it when it is not this user's own.
  void Ready() const;
  std::string PathOf(const std::string &id) const;
  void Evict() const;

  std::string dir_;
  int64_t max_bytes_;
  mutable std::once_flag ready_;
  mutable std::mutex evict_mutex_;
  mutable std::atomic<int64_t> written_{0};  // bytes written since this process last looked at the folder
};

}  // namespace dali_mesh

#endif  // DALI_MESH_STORAGE_RANGE_CACHE_H_
