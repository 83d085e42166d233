// dali_mesh: stores whose reads Python answers (see callback_store.h): spec "icechunk;repo=...;snapshot=..."
// (dali_mesh/storage/icechunk/: one snapshot of an Icechunk repository, read through the icechunk
// library's ranged reads of native and virtual chunks). Host only, DALI-free.
//
// A snapshot never changes (a commit makes another; the spec names the snapshot), so an object opened
// at the version a plan recorded is taken as it is, without a call (OpenVersion), its reads are pinned
// and CheckUnchanged has nothing to look at. Each read is a round trip of the Python store, so a chunk
// read in parts sends its guessed blocks with its header (GuessParts), and the ranges of one read go
// to Python in one call, which sends them together (Icechunk's get_partial_values).
#include "storage/callback_store.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "storage/byte_store.h"
#include "storage/reads_in_flight.h"

namespace dali_mesh {

namespace {

// The longest message of a callback, and the longest version tag.
constexpr int64_t kMessageBytes = 4096;
constexpr int64_t kTagBytes = 1024;

class CallbackStore;

// Every callback store made in this library (never destroyed, as the stores themselves: StoreOf), for
// UnbindCallbackStores.
std::mutex &StoresMutex() {
  static auto *mutex = new std::mutex;
  return *mutex;
}
std::vector<const CallbackStore *> &AllStores() {
  static auto *stores = new std::vector<const CallbackStore *>;
  return *stores;
}

class CallbackStore : public ByteStore {
 public:
  explicit CallbackStore(std::string spec) : spec_(std::move(spec)) {}
  const std::string &spec() const override { return spec_; }

  std::unique_ptr<StoredObject> Open(const std::string &key) const override;
  std::unique_ptr<StoredObject> OpenVersion(const std::string &key, const ObjectVersion &planned) const override;
  bool Exists(const std::string &key) const override {
    ObjectVersion v;
    return Head(key, &v);
  }
  void Prefetch(const std::string &, const std::vector<std::pair<int64_t, int64_t>> &) const override {}

  bool Head(const std::string &key, ObjectVersion *version) const override {
    int64_t size = -1;
    std::string tag(kTagBytes, '\0');
    char err[kMessageBytes] = {0};
    int64_t found;
    {
      Call call(this, key);
      found = call.head(key.c_str(), &size, tag.data(), kTagBytes, err, kMessageBytes);
    }
    if (found < 0) Failed(key, err);
    if (found == 0) return false;
    if (size < 0) StoreFail(NameOf(key) + ": the Python store answered a negative size (" + std::to_string(size) + ")");
    version->size = size;
    version->tag = tag.substr(0, tag.find('\0'));
    return true;
  }

  int64_t Get(const std::string &key, int64_t offset, int64_t n, char *dst, const std::string &,
              int64_t size) const override {
    if (offset < 0) StoreFail(NameOf(key) + ": read at negative offset " + std::to_string(offset));
    if (size >= 0) n = std::min(n, std::max<int64_t>(0, size - offset));
    if (n <= 0) return 0;
    return Read(key, {{dst, offset, n}})[0];
  }

  // Reads `ranges` of `key` in one call of the Python store: the bytes each got.
  std::vector<int64_t> Read(const std::string &key, const std::vector<StoredObject::Range> &ranges) const {
    const size_t n = ranges.size();
    std::vector<int64_t> offsets(n), sizes(n), got(n, -1);
    std::vector<char *> dsts(n);
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
      offsets[i] = ranges[i].offset;
      sizes[i] = ranges[i].bytes;
      dsts[i] = ranges[i].dst;
      total += ranges[i].bytes;
    }
    if (n == 0) return got;
    if (ReadCancelled())
      StoreFail(NameOf(key) + ": read at byte " + std::to_string(offsets[0]) + " cancelled: the pipeline was stopped "
                "after an error");
    FlightGuard flight(NameOf(key), offsets[0], total);
    char err[kMessageBytes] = {0};
    int64_t rc;
    {
      Call call(this, key);
      rc = call.read(key.c_str(), static_cast<int64_t>(n), offsets.data(), sizes.data(), dsts.data(), got.data(), err,
                     kMessageBytes);
    }
    if (rc < 0) Failed(key, err);
    int64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
      if (got[i] < 0 || got[i] > sizes[i])
        StoreFail(NameOf(key) + ": the Python store answered " + std::to_string(got[i]) + " bytes for a read of " +
                  std::to_string(sizes[i]) + " at byte " + std::to_string(offsets[i]));
      bytes += got[i];
    }
    // counted as a network store's fetches (FetchCounters: what tools report as fetched): the library
    // sends a request per range
    CountFetch(static_cast<int64_t>(n), bytes);
    return got;
  }

  // The name errors give `key`: the Python store's (icechunk://<repository>@<snapshot>/<key>) once
  // bound, the spec before.
  std::string NameOf(const std::string &key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return ShownName((name_.empty() ? "byte store \"" + spec_ + "\"" : name_) + "/" + key);
  }

  void Bind(const std::string &name, CallbackHead head, CallbackRead read) const {
    std::lock_guard<std::mutex> lock(mutex_);
    head_ = head;
    read_ = read;
    exiting_ = false;
    if (!name.empty()) name_ = name;
  }

  // Unbinds the store (`exiting`: for good, the process exits) and waits until `deadline` for its
  // calls in flight: those still in flight.
  int64_t Unbind(std::chrono::steady_clock::time_point deadline, bool exiting) const {
    std::unique_lock<std::mutex> lock(mutex_);
    head_ = nullptr;
    read_ = nullptr;
    exiting_ = exiting;
    idle_.wait_until(lock, deadline, [this] { return in_flight_ == 0; });
    return in_flight_;
  }

 private:
  // One call of the bound functions: takes them (or fails naming the store), counted in flight while
  // it lives, so that an unbinding waits for it.
  struct Call {
    Call(const CallbackStore *store, const std::string &key) : store_(store) {
      std::lock_guard<std::mutex> lock(store->mutex_);
      if (!store->read_ || !store->head_) {
        const std::string name = ShownName((store->name_.empty() ? "byte store \"" + store->spec_ + "\"" :
                                            store->name_) + "/" + key);
        if (store->exiting_)
          StoreFail(name + ": cannot be read: the Python process that answers this store's reads is exiting");
        StoreFail(name + ": nothing in this process answers the reads of this store (its reads go through Python's "
                  "icechunk library): build the source (ZarrSource, read_windows) in this process, which gives the "
                  "native reader its reads; a plan written by another process cannot be read here without it");
      }
      head = store->head_;
      read = store->read_;
      store->in_flight_++;
    }
    ~Call() {
      std::lock_guard<std::mutex> lock(store_->mutex_);
      if (--store_->in_flight_ == 0) store_->idle_.notify_all();
    }
    Call(const Call &) = delete;
    Call &operator=(const Call &) = delete;
    const CallbackStore *store_;
    CallbackHead head = nullptr;
    CallbackRead read = nullptr;
  };

  // Fails with the Python store's message (which names the key; else named here).
  [[noreturn]] void Failed(const std::string &key, const char *err) const {
    const std::string message(err, strnlen(err, kMessageBytes));
    if (message.empty()) StoreFail(NameOf(key) + ": the Python store's read failed without a message");
    StoreFail(message.find(key) != std::string::npos ? message : NameOf(key) + ": " + message);
  }

  std::string spec_;
  mutable std::mutex mutex_;
  mutable std::condition_variable idle_;
  mutable std::string name_;
  mutable CallbackHead head_ = nullptr;
  mutable CallbackRead read_ = nullptr;
  mutable int64_t in_flight_ = 0;
  mutable bool exiting_ = false;
};

// A key of the snapshot, at its size: its bytes never change.
class CallbackObject : public StoredObject {
 public:
  CallbackObject(const CallbackStore *store, std::string key, const ObjectVersion &v)
      : store_(store), key_(std::move(key)) {
    name_ = store->NameOf(key_);
    version_ = v;
  }

  int64_t ReadAt(char *dst, int64_t n, int64_t offset) const override {
    if (offset < 0 || n < 0) return -EINVAL;
    const int64_t take = version_.size < 0 ? n : std::min(n, std::max<int64_t>(0, version_.size - offset));
    if (take <= 0) return 0;
    return store_->Read(key_, {{dst, offset, take}})[0];
  }

  void ReadVector(std::vector<struct iovec> *iov, int64_t offset) const override {
    int64_t n = 0;
    for (const auto &v : *iov) n += static_cast<int64_t>(v.iov_len);
    Within(offset, n);
    if (n == 0) {
      iov->clear();
      return;
    }
    // one range, one request: several buffers are filled from one staging copy
    std::string staged;
    char *dst = static_cast<char *>((*iov)[0].iov_base);
    if (iov->size() > 1) {
      staged.resize(static_cast<size_t>(n));
      dst = staged.data();
    }
    const int64_t got = store_->Read(key_, {{dst, offset, n}})[0];
    if (got != n) Short(offset, n, got);
    if (iov->size() > 1) {
      int64_t at = 0;
      for (const auto &v : *iov) {
        std::memcpy(v.iov_base, staged.data() + at, v.iov_len);
        at += static_cast<int64_t>(v.iov_len);
      }
    }
    iov->clear();
  }

  void ReadRanges(const std::vector<Range> &ranges) const override {
    for (const auto &r : ranges) Within(r.offset, r.bytes);
    const std::vector<int64_t> got = store_->Read(key_, ranges);
    for (size_t i = 0; i < ranges.size(); i++)
      if (got[i] != ranges[i].bytes) Short(ranges[i].offset, ranges[i].bytes, got[i]);
  }

  // each read is a round trip of the Python store
  bool GuessParts() const override { return true; }
  // a snapshot's key holds the bytes it held when the plan read it
  bool ReadsArePinned() const override { return true; }
  void CheckUnchanged() const override {}

 private:
  // a range inside the object (of a size not known: the Python store answers where it ends)
  void Within(int64_t offset, int64_t n) const {
    if (offset < 0 || n < 0 || (version_.size >= 0 && (offset > version_.size || n > version_.size - offset)))
      StoreFail(name_ + ": read of " + std::to_string(n) + " bytes at byte " + std::to_string(offset) +
                " runs past the end of the object (" + std::to_string(version_.size) + " bytes): it is shorter than "
                "planned");
  }
  [[noreturn]] void Short(int64_t offset, int64_t n, int64_t got) const {
    StoreFail(name_ + ": read of " + std::to_string(n) + " bytes at byte " + std::to_string(offset) + " returned " +
              std::to_string(got) + ": the object is shorter than planned");
  }

  const CallbackStore *store_;
  std::string key_;
};

std::unique_ptr<StoredObject> CallbackStore::Open(const std::string &key) const {
  ObjectVersion v;
  if (!Head(key, &v))
    StoreFail(NameOf(key) + ": no such key in the snapshot; check the key (the plan was made from another "
              "snapshot?)");
  return std::make_unique<CallbackObject>(this, key, v);
}

std::unique_ptr<StoredObject> CallbackStore::OpenVersion(const std::string &key, const ObjectVersion &planned) const {
  // the spec names the snapshot, whose keys never change: a key the plan found (it recorded the
  // snapshot's tag) is there, at the size the plan found (-1 where it did not ask: an array's metadata,
  // which a plan that names its tag never reads again), without a call per open
  if (!planned.tag.empty()) return std::make_unique<CallbackObject>(this, key, planned);
  return Open(key);
}

// "icechunk;...": its store (bound later, by the Python store of that spec).
std::unique_ptr<ByteStore> MakeCallbackStore(const std::string &spec, std::string *why) {
  if (spec.find(';') == std::string::npos) {
    *why = "an icechunk store's spec names its repository and snapshot (icechunk;repo=...;snapshot=...), written by "
           "dali_mesh/storage/icechunk/";
    return nullptr;
  }
  auto store = std::make_unique<CallbackStore>(spec);
  std::lock_guard<std::mutex> lock(StoresMutex());
  AllStores().push_back(store.get());
  return store;
}

}  // namespace

DM_REGISTER_STORE("icechunk", MakeCallbackStore)

void BindCallbackStore(const std::string &spec, const std::string &name, CallbackHead head, CallbackRead read) {
  const ByteStore *store = StoreOf(spec);
  if (!store) StoreFail(WhyNoStore(spec));
  const auto *callbacks = dynamic_cast<const CallbackStore *>(store);
  if (!callbacks)
    StoreFail("byte store \"" + ShownName(spec) + "\" reads its objects itself: its reads are not Python's to answer");
  if ((head == nullptr) != (read == nullptr))
    StoreFail("byte store \"" + ShownName(spec) + "\": bind both functions (head and read), or neither to unbind");
  if (head)
    callbacks->Bind(name, head, read);
  else
    callbacks->Unbind(std::chrono::steady_clock::now(), false);
}

int64_t UnbindCallbackStores(double wait_s) {
  std::vector<const CallbackStore *> stores;
  {
    std::lock_guard<std::mutex> lock(StoresMutex());
    stores = AllStores();
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::microseconds(static_cast<int64_t>(std::max(0.0, wait_s) * 1e6));
  int64_t left = 0;
  for (const auto *store : stores) left += store->Unbind(deadline, true);
  return left;
}

}  // namespace dali_mesh
