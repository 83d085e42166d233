// dali_mesh: the byte store's registry and shared helpers (see byte_store.h).
#include "storage/byte_store.h"

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "storage/http_store.h"
#include "storage/posix_store.h"

namespace dali_mesh {

const ByteStore *StoreOf(const std::string &spec) {
  // never destroyed: reads on kept threads (a batch read ahead, requests sent together) may still
  // run while the process exits, past static destructors
  static const auto *posix = new PosixStore();
  if (spec == posix->spec()) return posix;
  HttpStoreConfig config;
  std::string why;
  if (!HaveHttp() || !ParseHttpSpec(spec, &config, &why)) return nullptr;
  // one store per spec for the life of the process (plans and readers hold pointers to it)
  static auto *mutex = new std::mutex;
  static auto *stores = new std::map<std::string, std::unique_ptr<HttpStore>>;
  std::lock_guard<std::mutex> lock(*mutex);
  auto &store = (*stores)[spec];
  if (!store) store = std::make_unique<HttpStore>(spec, config);
  return store.get();
}

std::string WhyNoStore(const std::string &spec) {
  HttpStoreConfig config;
  std::string why;
  if (!ParseHttpSpec(spec, &config, &why))
    return "byte store \"" + ShownName(spec) + "\" (" + why + "; this build reads: file" +
           (HaveHttp() ? ", s3, http)" : ")");
  return "byte store \"" + ShownName(spec) + "\": this build has no libcurl (remote objects are read in Python)";
}

[[noreturn]] void StoreFail(const std::string &msg) { throw std::runtime_error("read_windows: " + msg); }

void StoredObject::ReadRanges(const std::vector<Range> &ranges) const {
  for (const auto &r : ranges) {
    const int64_t got = ReadAt(r.dst, r.bytes, r.offset);
    if (got == -ECANCELED)
      StoreFail(name_ + ": read at byte " + std::to_string(r.offset) + " cancelled: the pipeline was stopped after "
                "an error");
    if (got < 0) StoreFail(name_ + ": read at byte " + std::to_string(r.offset) + " failed (" + std::strerror(-got) + ")");
    if (got != r.bytes)
      StoreFail(name_ + ": read at byte " + std::to_string(r.offset) + " returned " + std::to_string(got) + " of " +
                std::to_string(r.bytes) + " bytes: the file was truncated while reading");
  }
}

std::string ShownName(const std::string &path) {
  std::string out;
  const auto *s = reinterpret_cast<const unsigned char *>(path.data());
  const size_t n = path.size();
  auto hex = [&](unsigned char c) {
    static const char kDigits[] = "0123456789abcdef";
    out += "\\x";
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  };
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = len > 0 && i + len <= n && !(len == 2 && c < 0xc2);
    for (size_t k = 1; ok && k < len; k++) ok = (s[i + k] & 0xc0) == 0x80;
    if (ok && len == 1 && (c < 0x20 || c == 0x7f)) ok = false;
    if (!ok) {
      hex(c);
      i++;
    } else {
      out.append(path, i, len);
      i += len;
    }
  }
  return out;
}

}  // namespace dali_mesh
