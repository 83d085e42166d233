// dali_mesh: the local POSIX store (see posix_store.h).
#include "storage/posix_store.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "storage/reads_in_flight.h"

namespace dali_mesh {

namespace {

std::string Errno(int e) { return std::strerror(e); }

std::array<int64_t, 5> Identity(const struct stat &st) {
  return {int64_t(st.st_dev), int64_t(st.st_ino), int64_t(st.st_size),
          int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
          int64_t(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec};
}

ObjectVersion VersionOf(const struct stat &st) {
  ObjectVersion v;
  v.size = st.st_size;
  v.mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  v.identity = Identity(st);
  return v;
}

// POSIX_FADV_WILLNEED of bytes [lo, hi) of `fd`, in pieces the kernel does not cap.
void WillNeed(int fd, int64_t lo, int64_t hi) {
  constexpr int64_t kPiece = 512 << 10;
  for (int64_t a = lo; a < hi; a = hi - a > kPiece ? a + kPiece : hi)
    ::posix_fadvise(fd, a, std::min(kPiece, hi - a), POSIX_FADV_WILLNEED);
}

class PosixObject : public StoredObject {
 public:
  PosixObject(int fd, const std::string &name, const struct stat &st) : fd_(fd) {
    name_ = name;
    version_ = VersionOf(st);
  }
  ~PosixObject() override { ::close(fd_); }

  int64_t ReadAt(char *dst, int64_t n, int64_t offset) const override { return PreadFull(fd_, dst, n, offset); }

  void ReadVector(std::vector<struct iovec> *iov_in, int64_t offset) const override {
    static const int kIovMax = [] {
      long v = ::sysconf(_SC_IOV_MAX);
      return v > 1 ? static_cast<int>(std::min<long>(v, 1024)) : 1024;
    }();
    std::vector<struct iovec> &iov = *iov_in;
    size_t i = 0;
    while (i < iov.size()) {
      const int count = static_cast<int>(std::min<size_t>(iov.size() - i, kIovMax));
      ssize_t got = ::preadv(fd_, iov.data() + i, count, offset);
      if (got < 0) {
        if (errno == EINTR && ReadCancelled())
          StoreFail(name_ + ": read at byte " + std::to_string(offset) + " cancelled: the pipeline was "
                    "stopped after an error");
        if (errno == EINTR || errno == EAGAIN) continue;
        StoreFail(name_ + ": read at byte " + std::to_string(offset) + " failed (" + Errno(errno) + ")");
      }
      if (got == 0)
        StoreFail(name_ + ": read at byte " + std::to_string(offset) + " returned nothing: the " +
                  "file was truncated while reading");
      offset += got;
      // drop the buffers filled, trim a partly filled one, go on
      while (got > 0 && i < iov.size()) {
        if (static_cast<size_t>(got) >= iov[i].iov_len) {
          got -= iov[i].iov_len;
          i++;
        } else {
          iov[i].iov_base = static_cast<char *>(iov[i].iov_base) + got;
          iov[i].iov_len -= got;
          got = 0;
        }
      }
    }
  }

  void CheckUnchanged() const override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) StoreFail(name_ + ": fstat failed (" + Errno(errno) + ")");
    if (Identity(st) != version_.identity)
      StoreFail(name_ + ": the file changed while it was read (its size, modification or change time differ after "
                "the read): it was rewritten in place, and what was read could mix two versions; write files to "
                "a new name and rename them over the old ones");
  }

 private:
  int fd_;
};

}  // namespace

int64_t PreadFull(int fd, char *buf, int64_t n, int64_t offset) {
  int64_t done = 0;
  while (done < n) {
    ssize_t got = ::pread(fd, buf + done, n - done, offset + done);
    if (got < 0) {
      if (errno == EINTR && ReadCancelled()) return -ECANCELED;
      if (errno == EINTR || errno == EAGAIN) continue;
      return -errno;
    }
    if (got == 0) break;
    done += got;
  }
  return done;
}

const std::string &PosixStore::spec() const {
  static const std::string kSpec = "file";
  return kSpec;
}

std::unique_ptr<StoredObject> PosixStore::Open(const std::string &key) const {
  const std::string name = ShownName(key);  // for messages only
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below)
  int fd = ::open(key.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT) StoreFail(name + ": no such file; check the path and the file list");
    StoreFail(name + ": cannot be opened (" + Errno(e) + ")");
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    StoreFail(name + ": fstat failed (" + Errno(e) + ")");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    StoreFail(name + ": not a regular file (a directory, FIFO, socket or device); give data files");
  }
  // no readahead: the kernel reads only the pages asked for
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  return std::make_unique<PosixObject>(fd, name, st);
}

bool PosixStore::Exists(const std::string &key) const {
  struct stat st;
  return ::stat(key.c_str(), &st) == 0 || errno != ENOENT;
}

bool PosixStore::Head(const std::string &key, ObjectVersion *version) const {
  struct stat st;
  if (::stat(key.c_str(), &st) != 0) {
    if (errno == ENOENT) return false;
    StoreFail(ShownName(key) + ": stat failed (" + Errno(errno) + ")");
  }
  if (!S_ISREG(st.st_mode)) StoreFail(ShownName(key) + ": not a regular file (a directory, FIFO, socket or device)");
  *version = VersionOf(st);
  return true;
}

bool PosixStore::OpenRange(const std::string &key, int64_t n, char *dst, int64_t *got, ObjectVersion *version) const {
  if (!Exists(key)) return false;
  const std::unique_ptr<StoredObject> file = Open(key);
  const int64_t read = file->ReadAt(dst, n, 0);
  if (read < 0) StoreFail(file->name() + ": read at byte 0 failed (" + Errno(-read) + ")");
  file->CheckUnchanged();  // the bytes are of the version named
  *got = read;
  *version = file->version();
  return true;
}

int64_t PosixStore::Get(const std::string &key, int64_t offset, int64_t n, char *dst, const std::string &if_match,
                        int64_t) const {
  if (!if_match.empty())
    StoreFail(ShownName(key) + ": a file has no version tag to match (\"" + ShownName(if_match) + "\" given)");
  if (offset < 0) StoreFail(ShownName(key) + ": read at negative offset " + std::to_string(offset));
  const std::unique_ptr<StoredObject> file = Open(key);
  const int64_t got = file->ReadAt(dst, n, offset);
  if (got < 0) StoreFail(file->name() + ": read at byte " + std::to_string(offset) + " failed (" + Errno(-got) + ")");
  return got;
}

void PosixStore::Prefetch(const std::string &key, const std::vector<std::pair<int64_t, int64_t>> &ranges) const {
  // opened to announce, then closed: the kernel's reads go on after the descriptor is closed
  int fd = ::open(key.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    const int64_t size = st.st_size;
    for (const auto &r : ranges) {
      int64_t hi;
      // a crafted plan or chunk index may put a range near 2**63: announce only what lies inside
      // the file (the read itself reports the rest)
      if (r.second <= 0 || r.first >= size || __builtin_add_overflow(r.first, r.second, &hi)) continue;
      WillNeed(fd, std::max<int64_t>(r.first, 0), std::min(hi, size));
    }
  }
  ::close(fd);
}

namespace {

std::unique_ptr<ByteStore> MakePosixStore(const std::string &spec, std::string *why) {
  if (spec != "file") {
    *why = "the local store takes no settings (its spec is \"file\")";
    return nullptr;
  }
  return std::make_unique<PosixStore>();
}

}  // namespace

DM_REGISTER_STORE("file", MakePosixStore)

}  // namespace dali_mesh
