// dali_mesh: the local cache of fetched byte ranges (see range_cache.h).
#include "storage/range_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <thread>
#include <tuple>

#include "storage/byte_store.h"

#ifdef DALI_MESH_HAVE_CRC32C
extern "C" uint32_t crc32c_extend(uint32_t crc, const uint8_t *data, size_t count);
#endif

namespace dali_mesh {

namespace {

constexpr char kMagic[8] = {'D', 'M', 'R', 'C', '0', '0', '0', '1'};

uint64_t Fnv1a(const char *p, size_t n, uint64_t h = 1469598103934665603ull) {
  for (size_t i = 0; i < n; i++) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 1099511628211ull;
  }
  return h;
}

// The checksum of an entry's bytes: CRC-32C where the build has Google's library, else FNV-1a.
uint64_t Checksum(const std::vector<std::pair<char *, int64_t>> &bufs) {
#ifdef DALI_MESH_HAVE_CRC32C
  uint32_t crc = 0;
  for (const auto &b : bufs) crc = crc32c_extend(crc, reinterpret_cast<const uint8_t *>(b.first), b.second);
  return crc;
#else
  uint64_t h = 1469598103934665603ull;
  for (const auto &b : bufs) h = Fnv1a(b.first, b.second, h);
  return h;
#endif
}

std::string Header(const std::string &id, int64_t n, uint64_t sum) {
  std::string h(kMagic, sizeof(kMagic));
  auto word = [&](uint64_t v) { h.append(reinterpret_cast<const char *>(&v), sizeof(v)); };
  word(id.size());
  h += id;
  word(static_cast<uint64_t>(n));
  word(sum);
  return h;
}

bool ReadFull(int fd, char *p, int64_t n, int64_t offset) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, offset);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= got;
    offset += got;
  }
  return true;
}

bool WriteFull(int fd, const char *p, int64_t n) {
  while (n > 0) {
    const ssize_t put = ::write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= put;
  }
  return true;
}

int64_t Total(const std::vector<std::pair<char *, int64_t>> &bufs) {
  int64_t n = 0;
  for (const auto &b : bufs) n += b.second;
  return n;
}

constexpr char kTmpPrefix[] = ".dmrc-tmp-";  // a temporary entry, renamed into place when whole
constexpr char kLockName[] = ".dmrc-lock";   // flock'ed by the process that evicts
constexpr int64_t kStaleTmpSeconds = 3600;   // a temporary this old was left by a killed process

bool IsHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

// An entry subfolder's name: two hex digits (never "." or "..").
bool IsSubName(const char *s) { return IsHex(s[0]) && IsHex(s[1]) && s[2] == '\0'; }

// An entry's name in subfolder `sub`: 16 hex digits, the first two those of `sub`.
bool IsEntryName(const char *s, const char *sub) {
  for (int i = 0; i < 16; i++)
    if (!IsHex(s[i])) return false;
  return s[16] == '\0' && s[0] == sub[0] && s[1] == sub[1];
}

// The entry name of `id`: 16 hex digits of its hash (its subfolder is the first two).
void EntryName(const std::string &id, char name[17]) {
  std::snprintf(name, 17, "%016llx", static_cast<unsigned long long>(Fnv1a(id.data(), id.size())));
}

// A folder or file of this user's that nobody else may change.
bool Private(const struct stat &st) { return st.st_uid == ::geteuid() && !(st.st_mode & 022); }

// Whether the file `fd` starts with the cache's magic: it was written by the cache.
bool HasMagic(int fd) {
  char m[sizeof(kMagic)];
  return ReadFull(fd, m, sizeof(m), 0) && std::memcmp(m, kMagic, sizeof(m)) == 0;
}

// Removes `name` of the folder `dfd` only while it is still the file `st` (another process may have
// renamed a new entry into place since it was looked at).
bool UnlinkSame(int dfd, const char *name, const struct stat &st) {
  struct stat now;
  return ::fstatat(dfd, name, &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_dev == st.st_dev && now.st_ino == st.st_ino &&
         ::unlinkat(dfd, name, 0) == 0;
}

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif

// Renames the temporary `tmp` to `name` in the folder `dfd` unless `name` exists (then another
// process put the entry first, or the name holds a file that is not the cache's: either is kept).
bool PlaceEntry(int dfd, const char *tmp, const char *name) {
#ifdef SYS_renameat2
  if (::syscall(SYS_renameat2, dfd, tmp, dfd, name, RENAME_NOREPLACE) == 0) return true;
  if (errno != EINVAL && errno != ENOSYS) return false;
#endif
  // a filesystem without RENAME_NOREPLACE: a hard link does not replace either
  if (::linkat(dfd, tmp, dfd, name, 0) == 0) {
    ::unlinkat(dfd, tmp, 0);
    return true;
  }
  if (errno != EPERM && errno != EOPNOTSUPP) return false;
  // nor hard links: a plain rename, the name was free when Put looked
  struct stat st;
  return ::fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT && ::renameat(dfd, tmp, dfd, name) == 0;
}

}  // namespace

RangeCache::RangeCache(std::string dir, int64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {}

RangeCache::~RangeCache() {
  if (root_fd_ >= 0) ::close(root_fd_);
}

void RangeCache::Ready() const {
  std::call_once(ready_, [this] {
    const std::string shown = ShownName(dir_);
    if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST)
      StoreFail("cache_dir " + shown + " cannot be created (" + std::strerror(errno) + ")");
    const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) StoreFail("cache_dir " + shown + " is not a folder (" + std::strerror(errno) + ")");
    struct stat st;
    auto check = [&](int fd, const std::string &what, const char *fix) {
      if (::fstat(fd, &st) != 0) st.st_uid = static_cast<uid_t>(-1);
      if (st.st_uid != ::geteuid()) {
        ::close(fd);
        StoreFail(what + " belongs to uid " + std::to_string(st.st_uid) + ", not to this user (" +
                  std::to_string(::geteuid()) + "): its owner could put other bytes in place of the ones fetched; " +
                  fix);
      }
      if (st.st_mode & 022) {
        ::close(fd);
        StoreFail(what + " is writable by others: they could put other bytes in place of the ones fetched; chmod go-w "
                  "it or " + fix);
      }
    };
    check(dfd, "cache_dir " + shown, "use a folder of your own");
    // the cache's own subfolder: nothing outside it is read, changed or deleted
    const std::string root = "the cache's folder " + ShownName(dir_ + "/" + kSubfolder);
    if (::mkdirat(dfd, kSubfolder, 0700) != 0 && errno != EEXIST) {
      const int e = errno;
      ::close(dfd);
      StoreFail(root + " cannot be created (" + std::strerror(e) + ")");
    }
    const int fd = ::openat(dfd, kSubfolder, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    const int e = errno;
    ::close(dfd);
    if (fd < 0)
      StoreFail(root + (e == ELOOP || e == ENOTDIR
                            ? " is a symlink or not a folder: the cache does not follow it; remove it or use another "
                              "cache_dir"
                            : " cannot be opened (" + std::string(std::strerror(e)) + ")"));
    check(fd, root, "remove it (the cache makes it again) or use another cache_dir");
    root_fd_ = fd;
  });
}

int RangeCache::OpenSub(const char *sub, bool create) const {
  if (create && ::mkdirat(root_fd_, sub, 0700) != 0 && errno != EEXIST) return -1;
  const int fd = ::openat(root_fd_, sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st;
  if (::fstat(fd, &st) != 0 || !Private(st)) {  // another's, or writable by others: not used, not deleted
    ::close(fd);
    return -1;
  }
  return fd;
}

bool RangeCache::Get(const std::string &id, const std::vector<std::pair<char *, int64_t>> &bufs) const {
  Ready();
  char name[17];
  EntryName(id, name);
  const char sub[3] = {name[0], name[1], '\0'};
  const int sfd = OpenSub(sub, false);
  if (sfd < 0) return false;
  // O_NONBLOCK: a FIFO at the name must not block the read
  const int fd = ::openat(sfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    ::close(sfd);
    return false;
  }
  const int64_t n = Total(bufs);
  bool hit = false, damaged = false;
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && HasMagic(fd)) {
    damaged = true;  // an entry of the cache's own: this one, else damaged (or another id of the same hash)
    const std::string head = Header(id, n, 0);
    std::string got(head.size(), '\0');
    uint64_t sum = 0;
    // the header up to its checksum (the key and length) must be this entry's
    if (st.st_size == static_cast<off_t>(head.size()) + n && ReadFull(fd, got.data(), got.size(), 0) &&
        got.compare(0, head.size() - 8, head, 0, head.size() - 8) == 0) {
      std::memcpy(&sum, got.data() + head.size() - 8, 8);
      int64_t at = static_cast<int64_t>(head.size());
      hit = true;
      for (const auto &b : bufs) {
        if (!ReadFull(fd, b.first, b.second, at)) {
          hit = false;
          break;
        }
        at += b.second;
      }
      hit = hit && Checksum(bufs) == sum;
    }
  }
  if (hit) {
    ::futimens(fd, nullptr);  // recently used
  } else if (damaged) {
    UnlinkSame(sfd, name, st);  // fetched again; a file without the magic is not the cache's: left alone
  }
  ::close(fd);
  ::close(sfd);
  return hit;
}

void RangeCache::Put(const std::string &id, const std::vector<std::pair<char *, int64_t>> &bufs) const {
  Ready();
  const int64_t n = Total(bufs);
  if (n > max_bytes_ / 4) return;  // an entry larger than a quarter of the cache would evict it all
  char name[17];
  EntryName(id, name);
  const char sub[3] = {name[0], name[1], '\0'};
  const int sfd = OpenSub(sub, true);
  if (sfd < 0) return;
  struct stat st;
  if (::fstatat(sfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {  // put by another process, or not the cache's: kept
    ::close(sfd);
    return;
  }
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = kTmpPrefix + std::to_string(::getpid()) + "-" +
                          std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id())) + "-" +
                          std::to_string(counter++);
  const int fd = ::openat(sfd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    ::close(sfd);
    return;
  }
  const std::string head = Header(id, n, Checksum(bufs));
  bool ok = WriteFull(fd, head.data(), head.size());
  for (const auto &b : bufs) ok = ok && WriteFull(fd, b.first, b.second);
  ok = ::close(fd) == 0 && ok;
  if (!ok || !PlaceEntry(sfd, tmp.c_str(), name)) {
    ::unlinkat(sfd, tmp.c_str(), 0);
    ::close(sfd);
    return;
  }
  ::close(sfd);
  if ((written_ += n + static_cast<int64_t>(head.size())) > max_bytes_ / 10) Evict();
}

void RangeCache::Evict() const {
  Ready();
  std::unique_lock<std::mutex> lock(evict_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // another thread of this process is at it
  written_ = 0;
  // one process at a time looks at the folder
  const int lfd = ::openat(root_fd_, kLockName, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
  if (lfd < 0) return;
  if (::flock(lfd, LOCK_EX | LOCK_NB) != 0) {
    ::close(lfd);
    return;
  }
  struct Entry {
    int64_t mtime_ns, bytes;
    dev_t dev;
    ino_t ino;
    char name[17];
  };
  std::vector<Entry> entries;
  int64_t total = 0;
  const int64_t stale_tmp = static_cast<int64_t>(std::time(nullptr)) - kStaleTmpSeconds;
  // a fresh open of the folder (root_fd_'s offset is shared by every thread): readdir from its start
  const int tfd = ::openat(root_fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *top = tfd >= 0 ? ::fdopendir(tfd) : nullptr;
  if (!top && tfd >= 0) ::close(tfd);
  while (const dirent *d = top ? ::readdir(top) : nullptr) {
    if (!IsSubName(d->d_name)) continue;
    const int sfd = OpenSub(d->d_name, false);
    if (sfd < 0) continue;
    const int rfd = ::openat(sfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *in = rfd >= 0 ? ::fdopendir(rfd) : nullptr;
    if (!in && rfd >= 0) ::close(rfd);
    while (const dirent *e = in ? ::readdir(in) : nullptr) {
      const bool entry = IsEntryName(e->d_name, d->d_name);
      if (!entry && std::strncmp(e->d_name, kTmpPrefix, sizeof(kTmpPrefix) - 1) != 0) continue;  // not the cache's
      struct stat st;
      if (::fstatat(sfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid())
        continue;
      if (!entry) {  // a temporary file left by a killed process
        if (st.st_mtim.tv_sec < stale_tmp) ::unlinkat(sfd, e->d_name, 0);
        continue;
      }
      Entry x{int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec, st.st_size, st.st_dev, st.st_ino, {}};
      std::memcpy(x.name, e->d_name, sizeof(x.name));
      entries.push_back(x);
      total += st.st_size;
    }
    if (in) ::closedir(in);
    ::close(sfd);
  }
  if (top) ::closedir(top);
  if (total > max_bytes_) {
    std::sort(entries.begin(), entries.end(),
              [](const Entry &a, const Entry &b) { return a.mtime_ns < b.mtime_ns; });
    const int64_t target = max_bytes_ / 10 * 9;
    for (const auto &x : entries) {
      if (total <= target) break;
      const char sub[3] = {x.name[0], x.name[1], '\0'};
      const int sfd = OpenSub(sub, false);
      if (sfd < 0) continue;
      const int fd = ::openat(sfd, x.name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0) {
        if (errno == ENOENT) total -= x.bytes;  // gone since (a reader removed it as damaged)
        ::close(sfd);
        continue;
      }
      struct stat st;
      // still the file looked at, and the cache's (its magic): else not counted, and kept
      const bool ours = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_dev == x.dev && st.st_ino == x.ino &&
                        HasMagic(fd);
      ::close(fd);
      if (!ours || UnlinkSame(sfd, x.name, st)) total -= x.bytes;
      ::close(sfd);
    }
  }
  ::flock(lfd, LOCK_UN);
  ::close(lfd);
}

}  // namespace dali_mesh
