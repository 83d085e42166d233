// dali_mesh: the local cache of fetched byte ranges (see range_cache.h).
#include "storage/range_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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

}  // namespace

RangeCache::RangeCache(std::string dir, int64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {}

void RangeCache::Ready() const {
  std::call_once(ready_, [this] {
    if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST)
      StoreFail("cache_dir " + ShownName(dir_) + " cannot be created (" + std::strerror(errno) + ")");
    struct stat st;
    if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      StoreFail("cache_dir " + ShownName(dir_) + " is not a folder");
    if (st.st_uid != ::geteuid())
      StoreFail("cache_dir " + ShownName(dir_) + " belongs to uid " + std::to_string(st.st_uid) + ", not to this user (" +
                std::to_string(::geteuid()) + "): its owner could put other bytes in place of the ones fetched; use a "
                "folder of your own");
    if (st.st_mode & 022)
      StoreFail("cache_dir " + ShownName(dir_) + " is writable by others: they could put other bytes in place of the "
                "ones fetched; chmod go-w it or use another folder");
  });
}

std::string RangeCache::PathOf(const std::string &id) const {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(Fnv1a(id.data(), id.size())));
  return dir_ + "/" + std::string(hex, 2) + "/" + hex;
}

bool RangeCache::Get(const std::string &id, const std::vector<std::pair<char *, int64_t>> &bufs) const {
  Ready();
  const std::string path = PathOf(id);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  const int64_t n = Total(bufs);
  bool hit = false;
  struct stat st;
  const std::string head = Header(id, n, 0);
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == static_cast<off_t>(head.size()) + n) {
    std::string got(head.size(), '\0');
    uint64_t sum = 0;
    // the header up to its checksum (the key and length) must be this entry's
    if (ReadFull(fd, got.data(), got.size(), 0) && got.compare(0, head.size() - 8, head, 0, head.size() - 8) == 0) {
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
  } else {
    ::unlink(path.c_str());  // a damaged or foreign entry is fetched again
  }
  ::close(fd);
  return hit;
}

void RangeCache::Put(const std::string &id, const std::vector<std::pair<char *, int64_t>> &bufs) const {
  Ready();
  const int64_t n = Total(bufs);
  if (n > max_bytes_ / 4) return;  // an entry larger than a quarter of the cache would evict it all
  const std::string path = PathOf(id);
  const std::string folder = path.substr(0, path.rfind('/'));
  if (::mkdir(folder.c_str(), 0700) != 0 && errno != EEXIST) return;
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = folder + "/.tmp-" + std::to_string(::getpid()) + "-" +
                          std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id())) + "-" +
                          std::to_string(counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  const std::string head = Header(id, n, Checksum(bufs));
  bool ok = WriteFull(fd, head.data(), head.size());
  for (const auto &b : bufs) ok = ok && WriteFull(fd, b.first, b.second);
  ok = ::close(fd) == 0 && ok;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return;
  }
  if ((written_ += n + static_cast<int64_t>(head.size())) > max_bytes_ / 10) Evict();
}

void RangeCache::Evict() const {
  std::unique_lock<std::mutex> lock(evict_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // another thread of this process is at it
  written_ = 0;
  // one process at a time looks at the folder
  const std::string lock_path = dir_ + "/.lock";
  const int lfd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lfd < 0) return;
  if (::flock(lfd, LOCK_EX | LOCK_NB) != 0) {
    ::close(lfd);
    return;
  }
  std::vector<std::tuple<int64_t, int64_t, std::string>> entries;  // (mtime ns, bytes, path)
  int64_t total = 0;
  const int64_t stale_tmp = static_cast<int64_t>(std::time(nullptr)) - 3600;
  if (DIR *top = ::opendir(dir_.c_str())) {
    while (const dirent *d = ::readdir(top)) {
      if (std::strlen(d->d_name) != 2) continue;
      const std::string sub = dir_ + "/" + d->d_name;
      DIR *in = ::opendir(sub.c_str());
      if (!in) continue;
      while (const dirent *e = ::readdir(in)) {
        if (e->d_name[0] == '.' && (!std::strcmp(e->d_name, ".") || !std::strcmp(e->d_name, ".."))) continue;
        const std::string p = sub + "/" + e->d_name;
        struct stat st;
        if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (e->d_name[0] == '.') {  // a temporary file left by a killed process
          if (st.st_mtim.tv_sec < stale_tmp) ::unlink(p.c_str());
          continue;
        }
        entries.emplace_back(int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec, st.st_size, p);
        total += st.st_size;
      }
      ::closedir(in);
    }
    ::closedir(top);
  }
  if (total > max_bytes_) {
    std::sort(entries.begin(), entries.end());
    const int64_t target = max_bytes_ / 10 * 9;
    for (const auto &e : entries) {
      if (total <= target) break;
      if (::unlink(std::get<2>(e).c_str()) == 0) total -= std::get<1>(e);
    }
  }
  ::flock(lfd, LOCK_UN);
  ::close(lfd);
}

}  // namespace dali_mesh
