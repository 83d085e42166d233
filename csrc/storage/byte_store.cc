// dali_mesh: the byte stores' registry, the operations a store may lack, and shared helpers (see
// byte_store.h).
#include "storage/byte_store.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace dali_mesh {

namespace {

// Never destroyed: reads on kept threads (a batch read ahead, requests sent together) may still run
// while the process exits, past static destructors. Built at first use: the stores' files register
// their kinds from their static initialisers, in an order the linker picks.
std::mutex &RegistryMutex() {
  static auto *mutex = new std::mutex;
  return *mutex;
}
std::map<std::string, StoreFactory> &Factories() {
  static auto *factories = new std::map<std::string, StoreFactory>;
  return *factories;
}
// one store per spec for the life of the process (plans and readers hold pointers to it)
std::map<std::string, std::unique_ptr<ByteStore>> &Stores() {
  static auto *stores = new std::map<std::string, std::unique_ptr<ByteStore>>;
  return *stores;
}

// each kind's reader of its specs' settings (StoreSettings)
std::map<std::string, StoreSettingsReader> &SettingsReaders() {
  static auto *readers = new std::map<std::string, StoreSettingsReader>;
  return *readers;
}

std::string KindOf(const std::string &spec) { return spec.substr(0, spec.find(';')); }

std::string Kinds() {
  std::string kinds;
  for (const auto &f : Factories()) kinds += (kinds.empty() ? "" : ", ") + f.first;
  return kinds.empty() ? "none" : kinds;
}

// the requests and body bytes of the network stores (FetchCounters)
std::atomic<int64_t> g_requests{0}, g_bytes{0};

// The store named `spec`, made by its kind's factory at the first ask, or nullptr with the reason.
const ByteStore *Find(const std::string &spec, std::string *why) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  const auto known = Stores().find(spec);
  if (known != Stores().end()) return known->second.get();
  const std::string kind = KindOf(spec);
  const auto factory = Factories().find(kind);
  if (factory == Factories().end()) {
    *why = "this build has no store of kind \"" + ShownName(kind) + "\" (its kinds: " + Kinds() + ")";
    return nullptr;
  }
  std::unique_ptr<ByteStore> store = factory->second(spec, why);
  return store ? (Stores()[spec] = std::move(store)).get() : nullptr;
}

}  // namespace

bool RegisterStore(const char *kind, StoreFactory factory) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Factories()[kind] = factory;
  return true;
}

bool RegisterStoreSettings(const char *kind, StoreSettingsReader reader) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  SettingsReaders()[kind] = reader;
  return true;
}

std::string StoreSettings(const std::string &spec) {
  StoreSettingsReader reader = nullptr;
  std::string kinds;
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    const auto found = SettingsReaders().find(KindOf(spec));
    if (found != SettingsReaders().end()) reader = found->second;
    for (const auto &r : SettingsReaders()) kinds += (kinds.empty() ? "" : ", ") + r.first;
  }
  if (!reader)
    StoreFail("byte store \"" + ShownName(spec) + "\": a store of kind \"" + ShownName(KindOf(spec)) +
              "\" has no settings to read (the kinds that have: " + (kinds.empty() ? "none" : kinds) + ")");
  std::string json, why;
  if (!reader(spec, &json, &why)) StoreFail("byte store \"" + ShownName(spec) + "\": " + why);
  return json;
}

const ByteStore *StoreOf(const std::string &spec) {
  std::string why;
  return Find(spec, &why);
}

std::string WhyNoStore(const std::string &spec) {
  std::string why;
  if (Find(spec, &why)) return "byte store \"" + ShownName(spec) + "\" is read by this build";
  return "byte store \"" + ShownName(spec) + "\": " + why;
}

void FetchCounters(int64_t *requests, int64_t *bytes) {
  *requests = g_requests.load();
  *bytes = g_bytes.load();
}

void CountFetch(int64_t requests, int64_t bytes) {
  g_requests += requests;
  g_bytes += bytes;
}

bool ByteStore::Head(const std::string &, ObjectVersion *) const { NotSupported("ask for an object's version"); }

bool ByteStore::OpenRange(const std::string &, int64_t, char *, int64_t *, ObjectVersion *) const {
  NotSupported("open an object by its first bytes");
}

int64_t ByteStore::Get(const std::string &, int64_t, int64_t, char *, const std::string &, int64_t) const {
  NotSupported("read a range of an object without opening it");
}

Listing ByteStore::ListPage(const std::string &, bool, const std::string &) const { NotSupported("list keys"); }

int ControlCharAt(const std::string &value) {
  for (size_t i = 0; i < value.size(); i++) {
    const unsigned char c = static_cast<unsigned char>(value[i]);
    if (c < 0x20 || c == 0x7f) return static_cast<int>(i);
  }
  return -1;
}

void ByteStore::SetCredentials(const std::string &, const std::string &, const std::string &) const {
  NotSupported("take credentials");
}

void ByteStore::Put(const std::string &, const char *, int64_t, const std::string &) const {
  NotSupported("write objects");
}

bool ByteStore::Delete(const std::string &) const { NotSupported("delete objects"); }

void ByteStore::NotSupported(const std::string &what) const {
  StoreFail("byte store \"" + ShownName(spec()) + "\" cannot " + what + ": a store of kind " + KindOf(spec()) +
            " does not");
}

[[noreturn]] void StoreFail(const std::string &msg) { throw std::runtime_error("read_windows: " + msg); }

namespace {

// The median of the values kept (0 for none).
double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

void Keep(std::vector<double> *ring, size_t *next, double value) {
  if (ring->size() < static_cast<size_t>(RoundTripMeter::kKept)) {
    ring->push_back(value);
  } else {
    (*ring)[*next] = value;
  }
  *next = (*next + 1) % RoundTripMeter::kKept;
}

}  // namespace

void RoundTripMeter::Record(double first_byte_s, int64_t body_bytes, double body_s) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (first_byte_s >= 0) Keep(&latency_, &next_latency_, first_byte_s);
  if (body_bytes >= kLongBody && body_s > 0) Keep(&rate_, &next_rate_, static_cast<double>(body_bytes) / body_s);
}

RoundTrip RoundTripMeter::Now() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return RoundTrip{Median(latency_), Median(rate_)};
}

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

namespace {
void PutField(const std::string &value, std::string *out) {
  *out += std::to_string(value.size());
  *out += ':';
  *out += value;
}
}  // namespace

std::string EncodeListing(const Listing &page) {
  std::string out;
  for (const auto &o : page.objects) {
    out += 'o';
    PutField(o.key, &out);
    PutField(std::to_string(o.size), &out);
    PutField(o.tag, &out);
  }
  for (const auto &p : page.prefixes) {
    out += 'p';
    PutField(p, &out);
  }
  if (!page.next.empty()) {
    out += 'n';
    PutField(page.next, &out);
  }
  out += 'r';
  PutField(std::to_string(page.received), &out);
  return out;
}

}  // namespace dali_mesh
