// dali_mesh: the byte store, the one seam between the reader and where bytes live. Host only,
// DALI-free.
//
// A store is a key space of objects read by byte ranges: this machine's files (posix_store.h), HTTP(S),
// S3 and GCS objects (http_store.h), objects held in the process (memory_store.cc). Each store's file
// registers its kind (DM_REGISTER_STORE); StoreOf finds a plan's store by its spec. The reader
// (csrc/reader/) never holds a file descriptor: it opens a plan file's key in the store the plan names,
// reads byte ranges of the opened object into its own buffers and checks, after the reads, that the
// object is still the version it opened (a window is never a mix of two versions). The Python side has the same seam
// (dali_mesh/storage/). The model: zarr-python's Store + ByteRequest, tensorstore's kvstore +
// ByteRange, DALI's FileStream siblings (local, O_DIRECT, S3).
#ifndef DALI_MESH_STORAGE_BYTE_STORE_H_
#define DALI_MESH_STORAGE_BYTE_STORE_H_

#include <sys/uio.h>

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace dali_mesh {

// What a request to a store costs, as the fetch plan (csrc/reader/fetch_plan.h) weighs a gap between
// two ranges against a request: the wait for its first byte (s) and the bytes per second of its body.
// 0 where not known (a local file: no request to save, bytes_per_s unmeasured).
struct RoundTrip {
  double latency_s = 0;
  double bytes_per_s = 0;
};

// A store's RoundTrip measured from its own requests: the moving medians of the last kKept times to
// the first byte and of the body rates of the last kKept long bodies (a short body's rate is its
// latency's noise). Medians: one request that queued behind others, or one retried, does not move
// them. Any thread.
class RoundTripMeter {
 public:
  static constexpr int kKept = 15;
  // Bodies of at least this many bytes give a rate.
  static constexpr int64_t kLongBody = int64_t(256) << 10;
  // One answered request: `first_byte_s` from its start to its first byte, then `body_bytes` in
  // `body_s`.
  void Record(double first_byte_s, int64_t body_bytes, double body_s);
  RoundTrip Now() const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> latency_, rate_;  // rings of at most kKept
  size_t next_latency_ = 0, next_rate_ = 0;
};

// One version of an object: its size; for a file its device, inode, size, modification and change
// times (ns); for an object store its ETag or generation (tag).
struct ObjectVersion {
  int64_t size = -1;
  int64_t mtime_ns = -1;
  std::array<int64_t, 5> identity{};
  std::string tag;
  bool operator==(const ObjectVersion &o) const {
    return size == o.size && mtime_ns == o.mtime_ns && identity == o.identity && tag == o.tag;
  }
  bool operator!=(const ObjectVersion &o) const { return !(*this == o); }
};

// One page of a listing (ByteStore::ListPage): the objects under a prefix (each a store's key, as Open
// takes it, with its size and version tag), the prefixes one level down (each ending with '/') and
// where the next page starts. Every store builds it; S3's XML is read into it by the S3 store alone.
struct ListedObject {
  std::string key;
  int64_t size = -1;
  std::string tag;
};
struct Listing {
  std::vector<ListedObject> objects;
  std::vector<std::string> prefixes;
  // The continuation of the next page (no NUL: it is passed back as a C string); "": the last page.
  std::string next;
  // The bytes of the store's answer this page was read from (S3: the XML body; 0 where nothing was
  // received), for the caller's bounds on a listing.
  int64_t received = 0;
};

// A listing page as dali_mesh_store_list hands it to Python, read by dali_mesh/storage/listing.py
// read_page (keep the two together; tests/storage/test_memory.py lists keys of every byte through them):
//   page   := record*
//   record := 'o' field(key) field(size) field(tag)   an object
//           | 'p' field(prefix)                       a prefix one level down (ends with '/')
//           | 'n' field(next)                         the next page's continuation (absent: the last page)
//           | 'r' field(received)                     the bytes of the store's answer
//   field  := decimal length ':' bytes                (size, received: decimal text)
// Length-prefixed, so a key may hold any byte.
std::string EncodeListing(const Listing &page);

// An object opened for reading. Its version is fixed at the open; errors name the object.
class StoredObject {
 public:
  virtual ~StoredObject() = default;
  // The object as messages show it (a path, a URL without credentials).
  const std::string &name() const { return name_; }
  const ObjectVersion &version() const { return version_; }
  int64_t size() const { return version_.size; }
  // Reads up to `n` bytes at `offset` into `dst`: the bytes read (fewer than `n` only at the end of
  // the object), or -errno (-ECANCELED for a read cancelled by CancelReads).
  virtual int64_t ReadAt(char *dst, int64_t n, int64_t offset) const = 0;
  // Fills every buffer of `iov`, in order, from `offset` on (the iovecs are consumed); fails naming
  // the object and the byte when a read fails, is cancelled or ends early (the object shrank).
  virtual void ReadVector(std::vector<struct iovec> *iov, int64_t offset) const = 0;
  // Fills each of `ranges` (dst, offset, bytes) with the object's bytes, all of them or a failure
  // naming the object and the byte; a store may read them at once (an object store sends the
  // requests together), this one reads them in turn.
  struct Range {
    char *dst;
    int64_t offset;
    int64_t bytes;
  };
  virtual void ReadRanges(const std::vector<Range> &ranges) const;
  // Whether a read in parts (a Blosc chunk's header and index, then its blocks) should send its
  // first request together with the parts an earlier chunk's layout suggests (fetch_plan.h GuessedParts): true where
  // each request is a round trip (an object store without a local cache), false for local files,
  // where the extra bytes cost more than a second read.
  virtual bool GuessParts() const { return false; }
  // What a request for this object costs now (its store's RoundTripMeter); a local file: nothing.
  virtual RoundTrip Cost() const { return RoundTrip(); }
  // Whether every read of this object is of the version opened, checked by the store as it answers
  // (an object store's If-Match with the ETag the plan recorded): bytes read when the plan was made
  // at that version (a shard's index) then need no second look.
  virtual bool ReadsArePinned() const { return false; }
  // Fails naming the object when it is not the version opened (rewritten in place while it was
  // read: what was read may mix two versions).
  virtual void CheckUnchanged() const = 0;

 protected:
  std::string name_;
  ObjectVersion version_;
};

class ByteStore {
 public:
  virtual ~ByteStore() = default;
  // What a plan names the store by (no credential ever goes into it).
  virtual const std::string &spec() const = 0;
  // The object `key` opened for reading; fails naming it when it does not exist ("no such file"),
  // is no object (a folder, a FIFO) or cannot be opened.
  virtual std::unique_ptr<StoredObject> Open(const std::string &key) const = 0;
  // As Open, for an object a plan recorded at version `planned`: a store may take it as the version
  // and check it at every read instead of asking (an object store sends If-Match with the ETag, and
  // saves a request per open); the local store opens and checks as Open does.
  virtual std::unique_ptr<StoredObject> OpenVersion(const std::string &key, const ObjectVersion &planned) const {
    (void)planned;
    return Open(key);
  }
  // What a request to this store costs now, as measured from its own requests (RoundTripMeter);
  // nothing for a store whose reads are no requests (local files, objects in memory).
  virtual RoundTrip Cost() const { return RoundTrip(); }
  // Whether `key` exists (a chunk the plan found missing must still be missing).
  virtual bool Exists(const std::string &key) const = 0;
  // Announces reads of [offset, offset + bytes) ranges of `key` that come soon (a hint: errors are
  // left to the reads).
  virtual void Prefetch(const std::string &key, const std::vector<std::pair<int64_t, int64_t>> &ranges) const = 0;

  // What Python's stores (dali_mesh/storage/) ask through the C API (csrc/c_api/store_api.cc) for
  // planning and fallback reads. A store that lacks one fails naming itself and the operation
  // (NotSupported).
  //
  // The version of `key` (its size and tag), or false when it does not exist.
  virtual bool Head(const std::string &key, ObjectVersion *version) const;
  // An open in one request: at most `n` (>= 1) first bytes of `key` into `dst` (`got`: fewer when the
  // object is smaller) and its version as Head names it, or false when it does not exist.
  virtual bool OpenRange(const std::string &key, int64_t n, char *dst, int64_t *got, ObjectVersion *version) const;
  // `n` bytes of `key` at `offset` into `dst`, fewer only at the end of the object; of the version
  // tagged `if_match` when not empty (another is an error naming the object as replaced); `size` the
  // object's size when known (-1: not). Returns the bytes.
  virtual int64_t Get(const std::string &key, int64_t offset, int64_t n, char *dst, const std::string &if_match,
                      int64_t size) const;
  // One page of the listing of the keys under `prefix` (a key's first bytes), those further down
  // grouped at their next '/' into prefixes when `delimiter`, after `continuation` ("": the first
  // page; else a page's Listing::next).
  virtual Listing ListPage(const std::string &prefix, bool delimiter, const std::string &continuation) const;
  // Gives the store credentials, which it keeps (in memory only) and sends its requests with (all three
  // empty: none).
  virtual void SetCredentials(const std::string &key_id, const std::string &secret, const std::string &token) const;
  // Writes `n` bytes at `data` as the object `key`, a new version (a store that keeps versions in
  // `tag` takes `tag` when not empty: a copy of another library's object at its version).
  virtual void Put(const std::string &key, const char *data, int64_t n, const std::string &tag) const;
  // Removes the object `key`: false when there was none.
  virtual bool Delete(const std::string &key) const;

 protected:
  // Fails naming the store and `what` it cannot do ("list", "write").
  [[noreturn]] void NotSupported(const std::string &what) const;
};

// The store a plan names by `spec` (its kind, the first field up to ';': "file", "s3", "http",
// "memory"), one for the life of the process and never destroyed (plans, readers and reads on kept
// threads hold pointers to it), or nullptr when this build has no store of that spec (WhyNoStore
// says why).
const ByteStore *StoreOf(const std::string &spec);
std::string WhyNoStore(const std::string &spec);

// How a store's kind makes the store named `spec`: the store, or nullptr with the reason in `why` (a
// spec it cannot parse, a build without the store's library).
using StoreFactory = std::unique_ptr<ByteStore> (*)(const std::string &spec, std::string *why);

// Registers `factory` for the specs of `kind` (through DM_REGISTER_STORE, at static initialisation:
// StoreOf is first called after it); returns true.
bool RegisterStore(const char *kind, StoreFactory factory);

// How a store's file registers its kind (at namespace scope): DM_REGISTER_STORE("memory", MakeMemoryStore).
// Every store's object file is linked whole into the kernels library, which the DALI plugin links
// (CMakeLists.txt: an OBJECT library, not an archive whose unreferenced members the linker would
// drop); tests/storage/test_memory.py checks that the plugin reaches every kind.
#define DM_REGISTER_STORE(kind, factory) DM_REGISTER_STORE_AT(kind, factory, __LINE__)
#define DM_REGISTER_STORE_AT(kind, factory, line) DM_REGISTER_STORE_NAMED(kind, factory, line)
#define DM_REGISTER_STORE_NAMED(kind, factory, line) \
  [[maybe_unused]] static const bool dm_store_registered_##line = ::dali_mesh::RegisterStore(kind, factory);

// How a store's kind gives the settings of a spec to another reader of them (Python's checks of the
// specs it writes): the spec parsed by the kind's one parser, as one JSON object, or false with
// the reason in `why`. The spec is read here only: no second grammar of it exists.
using StoreSettingsReader = bool (*)(const std::string &spec, std::string *json, std::string *why);

// Registers `reader` for the specs of `kind` (through DM_REGISTER_STORE_SETTINGS, as RegisterStore).
bool RegisterStoreSettings(const char *kind, StoreSettingsReader reader);

// The settings of the store `spec` as JSON (its kind's reader; also where this build cannot make the
// store, e.g. without libcurl), or fails naming the spec and why.
std::string StoreSettings(const std::string &spec);

#define DM_REGISTER_STORE_SETTINGS(kind, reader) DM_REGISTER_STORE_SETTINGS_AT(kind, reader, __LINE__)
#define DM_REGISTER_STORE_SETTINGS_AT(kind, reader, line) DM_REGISTER_STORE_SETTINGS_NAMED(kind, reader, line)
#define DM_REGISTER_STORE_SETTINGS_NAMED(kind, reader, line) \
  [[maybe_unused]] static const bool dm_store_settings_registered_##line = \
      ::dali_mesh::RegisterStoreSettings(kind, reader);

// What this library's network stores fetched in this process: requests sent (every attempt) and body
// bytes received (ranges read, listings; error bodies not), for tools that report network bytes.
void FetchCounters(int64_t *requests, int64_t *bytes);
// Counts a request sent, or body bytes received, of a network store.
void CountFetch(int64_t requests, int64_t bytes);

// The first control character (< 0x20 or 0x7f: CR, LF, NUL...) of `value`, or -1. A header value
// holding one would end the header and start another (an ETag "x\r\nHost: elsewhere").
int ControlCharAt(const std::string &value);

// A key as messages show it: valid UTF-8 as is, other bytes and control characters as \xNN (a Linux
// path may hold any bytes; an error text that is not UTF-8 would not reach Python).
std::string ShownName(const std::string &key);

// Throws the reader's error (std::runtime_error "read_windows: <msg>").
[[noreturn]] void StoreFail(const std::string &msg);

}  // namespace dali_mesh

#endif  // DALI_MESH_STORAGE_BYTE_STORE_H_
