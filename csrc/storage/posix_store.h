// dali_mesh: the local POSIX store: keys are file paths of this machine. Host only, DALI-free.
//
// Files are opened read-only and non-blocking (a FIFO never blocks the open) and refused unless
// regular; read with pread/preadv without readahead (POSIX_FADV_RANDOM: the kernel reads only the
// pages asked for); prefetched with POSIX_FADV_WILLNEED in pieces the kernel does not cap. A file's
// version is its device, inode, size and modification and change times (Linux 6.13+ gives a write
// right after a stat a fine-grained time, so it is seen).
#ifndef DALI_MESH_STORAGE_POSIX_STORE_H_
#define DALI_MESH_STORAGE_POSIX_STORE_H_

#include <string>

#include "storage/byte_store.h"

namespace dali_mesh {

class PosixStore : public ByteStore {
 public:
  const std::string &spec() const override;
  std::unique_ptr<StoredObject> Open(const std::string &key) const override;
  bool Exists(const std::string &key) const override;
  void Prefetch(const std::string &key, const std::vector<std::pair<int64_t, int64_t>> &ranges) const override;
  // A file's version (device, inode, size, times; no tag), or false when there is no such file.
  bool Head(const std::string &key, ObjectVersion *version) const override;
  bool OpenRange(const std::string &key, int64_t n, char *dst, int64_t *got, ObjectVersion *version) const override;
  // A file has no tag: `if_match` must be empty.
  int64_t Get(const std::string &key, int64_t offset, int64_t n, char *dst, const std::string &if_match,
              int64_t size) const override;
};

// pread of `n` bytes at `offset`, retried after EINTR/EAGAIN and short reads: the bytes read (fewer
// than `n` only at the end of the file), or -errno (-ECANCELED for a cancelled read).
int64_t PreadFull(int fd, char *buf, int64_t n, int64_t offset);

}  // namespace dali_mesh

#endif  // DALI_MESH_STORAGE_POSIX_STORE_H_
