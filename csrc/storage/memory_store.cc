// dali_mesh: the memory store, objects held in this process: spec "memory;name=<name>" (one store per
// name), keys any bytes but NUL, written through the C API (dali_mesh_store_put / _delete) and read as
// every store is. dali_mesh/storage/memory/ writes a format there and reads it back, natively too,
// without a disk or a server. Host only, DALI-free.
//
// An object's bytes never change in place: a write makes a new version, tagged by the next of the
// store's counter, and an object opened reads the version it opened to the end; CheckUnchanged
// refuses one rewritten or deleted since (its key holds another version now). The stores are held
// once per process, in the kernels library, which the DALI plugin links: what Python writes, the
// plugin reads.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "storage/byte_store.h"

namespace dali_mesh {

namespace {

// The most entries (objects and prefixes) of one listing page, as S3's.
constexpr int kPageEntries = 1000;

// One version of an object: its bytes (shared with the objects opened at it) and its tag.
struct Held {
  std::shared_ptr<const std::string> bytes;
  std::string tag;
};

ObjectVersion VersionOf(const Held &held) {
  ObjectVersion v;
  v.size = static_cast<int64_t>(held.bytes->size());
  v.tag = held.tag;
  return v;
}

bool StartsWith(const std::string &s, const std::string &prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

class MemoryStore;

// An object opened at a version: its bytes are held until it is closed, whatever the key holds since.
class MemoryObject : public StoredObject {
 public:
  MemoryObject(const MemoryStore *store, std::string key, const std::string &name, const Held &held)
      : store_(store), key_(std::move(key)), bytes_(held.bytes) {
    name_ = name;
    version_ = VersionOf(held);
  }

  int64_t ReadAt(char *dst, int64_t n, int64_t offset) const override {
    if (offset < 0 || n < 0) return -EINVAL;
    const int64_t size = version_.size;
    const int64_t take = offset >= size ? 0 : std::min(n, size - offset);
    if (take > 0) std::memcpy(dst, bytes_->data() + offset, take);
    return take;
  }

  void ReadVector(std::vector<struct iovec> *iov, int64_t offset) const override {
    int64_t n = 0;
    for (const auto &v : *iov) n += static_cast<int64_t>(v.iov_len);
    if (offset < 0 || offset + n > version_.size)
      StoreFail(name_ + ": read of " + std::to_string(n) + " bytes at byte " + std::to_string(offset) +
                " runs past the end of the object (" + std::to_string(version_.size) + " bytes): it is shorter "
                "than planned");
    for (const auto &v : *iov) {
      std::memcpy(v.iov_base, bytes_->data() + offset, v.iov_len);
      offset += static_cast<int64_t>(v.iov_len);
    }
    iov->clear();
  }

  // every read is of the bytes opened: what a plan read at this version is still those bytes
  bool ReadsArePinned() const override { return true; }

  void CheckUnchanged() const override;

 private:
  const MemoryStore *store_;
  std::string key_;
  std::shared_ptr<const std::string> bytes_;
};

class MemoryStore : public ByteStore {
 public:
  MemoryStore(std::string spec, std::string name) : spec_(std::move(spec)), name_(std::move(name)) {}
  const std::string &spec() const override { return spec_; }

  std::unique_ptr<StoredObject> Open(const std::string &key) const override {
    return std::make_unique<MemoryObject>(this, key, NameOf(key), Found(key));
  }
  bool Exists(const std::string &key) const override {
    Held held;
    return Find(key, &held);
  }
  void Prefetch(const std::string &, const std::vector<std::pair<int64_t, int64_t>> &) const override {}

  bool Head(const std::string &key, ObjectVersion *version) const override {
    Held held;
    if (!Find(key, &held)) return false;
    *version = VersionOf(held);
    return true;
  }

  bool OpenRange(const std::string &key, int64_t n, char *dst, int64_t *got, ObjectVersion *version) const override {
    Held held;
    if (!Find(key, &held)) return false;
    *version = VersionOf(held);
    *got = std::min<int64_t>(std::max<int64_t>(n, 0), version->size);
    if (*got > 0) std::memcpy(dst, held.bytes->data(), *got);
    return true;
  }

  int64_t Get(const std::string &key, int64_t offset, int64_t n, char *dst, const std::string &if_match,
              int64_t size) const override {
    const Held held = Found(key);
    const int64_t now = static_cast<int64_t>(held.bytes->size());
    if ((!if_match.empty() && held.tag != if_match) || (size >= 0 && size != now))
      StoreFail(NameOf(key) + ": the object was replaced since it was opened (its version differs): what was read "
                "could mix two versions; open it again");
    if (offset < 0) StoreFail(NameOf(key) + ": read at negative offset " + std::to_string(offset));
    const int64_t take = offset >= now ? 0 : std::min(std::max<int64_t>(n, 0), now - offset);
    if (take > 0) std::memcpy(dst, held.bytes->data() + offset, take);
    return take;
  }

  Listing ListPage(const std::string &prefix, bool delimiter, const std::string &continuation) const override;

  void Put(const std::string &key, const char *data, int64_t n, const std::string &tag) const override {
    if (key.empty()) StoreFail("memory://" + name_ + "/: an object's key is not empty; give one");
    if (ControlCharAt(tag) >= 0) StoreFail(NameOf(key) + ": a version tag holds no control character");
    auto bytes = std::make_shared<const std::string>(n > 0 ? std::string(data, static_cast<size_t>(n)) : std::string());
    std::lock_guard<std::mutex> lock(mutex_);
    std::string version = tag;
    if (version.empty()) {
      version = std::to_string(++counter_);
    } else if (version.find_first_not_of("0123456789") == std::string::npos && version.size() < 19) {
      // a copy at another library's version: this store's own next versions come after it
      counter_ = std::max<int64_t>(counter_, std::stoll(version));
    }
    objects_[key] = Held{std::move(bytes), version};
  }

  bool Delete(const std::string &key) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return objects_.erase(key) > 0;
  }

  // What `key` holds now, or false.
  bool Find(const std::string &key, Held *held) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = objects_.find(key);
    if (it == objects_.end()) return false;
    *held = it->second;
    return true;
  }

  std::string NameOf(const std::string &key) const { return ShownName("memory://" + name_ + "/" + key); }

 private:
  // What `key` holds now, or a failure naming it.
  Held Found(const std::string &key) const {
    Held held;
    if (!Find(key, &held))
      StoreFail(NameOf(key) + ": no such object; check the key (objects of a memory store live in the process "
                "that wrote them)");
    return held;
  }

  std::string spec_, name_;
  mutable std::mutex mutex_;
  mutable std::map<std::string, Held> objects_;  // sorted: a listing is a walk from its prefix
  mutable int64_t counter_ = 0;
};

void MemoryObject::CheckUnchanged() const {
  Held now;
  if (!store_->Find(key_, &now) || now.tag != version_.tag)
    StoreFail(name_ + ": the object changed while it was read (it was rewritten or deleted since it was opened): "
              "what was read is not the version its key holds now; read it again");
}

Listing MemoryStore::ListPage(const std::string &prefix, bool delimiter, const std::string &continuation) const {
  // the continuation names the last entry of the page before: "o" and an object's key, or "p" and a
  // prefix (whose keys are all skipped); keys hold no NUL, and neither does it
  const std::string after = continuation.substr(std::min<size_t>(1, continuation.size()));
  const bool after_prefix = !continuation.empty() && continuation[0] == 'p';
  Listing page;
  std::string last;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = continuation.empty() ? objects_.lower_bound(prefix) : objects_.upper_bound(after);
  while (it != objects_.end() && after_prefix && StartsWith(it->first, after)) ++it;
  for (int count = 0; it != objects_.end() && StartsWith(it->first, prefix); count++) {
    if (count == kPageEntries) {
      page.next = last;
      break;
    }
    const size_t slash = delimiter ? it->first.find('/', prefix.size()) : std::string::npos;
    if (slash == std::string::npos) {
      page.objects.push_back(ListedObject{it->first, static_cast<int64_t>(it->second.bytes->size()), it->second.tag});
      last = "o" + it->first;
      ++it;
      continue;
    }
    const std::string group = it->first.substr(0, slash + 1);
    page.prefixes.push_back(group);
    last = "p" + group;
    while (it != objects_.end() && StartsWith(it->first, group)) ++it;
  }
  return page;
}

// "memory;name=<name>": the store of that name, or nullptr with the reason.
std::unique_ptr<ByteStore> MakeMemoryStore(const std::string &spec, std::string *why) {
  const std::string kField = "memory;name=";
  const std::string name = StartsWith(spec, kField) ? spec.substr(kField.size()) : "";
  if (name.empty() || !std::all_of(name.begin(), name.end(), [](unsigned char c) {
        return std::isalnum(c) || c == '.' || c == '-' || c == '_';
      })) {
    *why = "a memory store's spec is memory;name=<name>, the name of letters, digits, '.', '-' and '_'";
    return nullptr;
  }
  return std::make_unique<MemoryStore>(spec, name);
}

}  // namespace

DM_REGISTER_STORE("memory", MakeMemoryStore)

}  // namespace dali_mesh
