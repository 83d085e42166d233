// dali_mesh: remote object stores read by ranged GETs through libcurl: S3 and S3-compatible stores
// (SigV4: keys, session tokens, custom endpoints, path-style or virtual-hosted addressing), Google
// Cloud Storage through its S3-interoperable XML API (HMAC keys, or anonymous for public buckets) and
// plain HTTP(S). Host only, DALI-free.
//
// A store is named in a plan by its spec, which holds no credential:
//   "s3;endpoint=<url>;region=<r>;addressing=path|virtual;anon=0|1[;signer=H][;retries=N;retry_seconds=S;
//    timeout=S;stall=S;connect=S][;cache=DIR;cache_bytes=N]"   keys "bucket/path/of/object"; signer: 64 bits of a hash of the
//    credentials, so that stores of one endpoint with other keys are other stores (never a key or secret)
//   "http[;q=H][;retries=...;cache=...]"               keys are whole http:// or https:// URLs (without
//    their query: a presigned URL's query is the store's credential, its token, sent on every request;
//    q: 32 hex digits of a SHA-256 of it, so that stores of other queries are other stores)
// cache: the ranges fetched are kept in the folder DIR, at most N bytes (range_cache.h).
// Credentials are given to the store (SetCredentials, from Python's storage_options or the environment)
// and kept in its memory only; never in a spec, a message or a plan.
//
// Each thread keeps one curl handle (its connections stay open between requests). An object is
// opened by one ranged GET of its first bytes (no HEAD: S3 refuses it on a URL presigned for GET):
// its Content-Range gives the size, its ETag the version, and the bytes are kept. Every read is one
// ranged GET whose answer is checked (status, Content-Range, body length) and sends If-Match with
// the ETag opened (or the plan's), so an object replaced since is an error naming it, never a mix of
// two versions; an answer without that ETag (a server that may ignore If-Match) has the version asked
// for again. S3 keys are opaque bytes, sent percent-encoded as SigV4 signs them and never normalised
// ("a/../b" is that key); no header value holding a control character is sent. 429, 5xx, dropped connections and stalls are retried with exponential
// backoff and full jitter, bounded in attempts and in total time; errors name the URL (without
// credentials or query), the range, the status and the attempts.
//
// Registered as the kinds "s3" and "http" (byte_store.h); the files: http_store.cc (the store),
// http_transfer.h (one request through libcurl), http_credentials.cc (the store's credentials),
// http_spec.cc (its spec, parsed), http_object.h.
#ifndef DALI_MESH_STORAGE_HTTP_STORE_H_
#define DALI_MESH_STORAGE_HTTP_STORE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "storage/byte_store.h"
#include "storage/range_cache.h"

namespace dali_mesh {

struct HttpStoreConfig {
  std::string kind;          // "s3" (keys bucket/path) or "http" (keys are URLs)
  std::string endpoint;      // s3: scheme://host[:port] (no trailing slash)
  std::string region = "us-east-1";
  bool path_style = true;    // s3: endpoint/bucket/key, else scheme://bucket.host/key
  bool anonymous = false;    // s3: unsigned requests (public buckets)
  int retries = 8;           // attempts after the first, for 429, 5xx, dropped connections and stalls
  double retry_seconds = 60; // no new attempt starts this long after the first
  double timeout = 300;      // one request, connect to last byte
  double stall = 30;         // a request that receives nothing for this long is dropped (and retried)
  double connect = 10;       // connecting
  std::string query_hash;    // http: which URL query the store's credentials are (a hash of it), "": none
  std::string cache;         // a folder caching the ranges fetched (range_cache.h); "": none
  int64_t cache_bytes = int64_t(8) << 30;
};

// Parses a spec (see above); false with the reason in `why`.
bool ParseHttpSpec(const std::string &spec, HttpStoreConfig *config, std::string *why);

// Whether this build reads remote stores (it was linked with libcurl).
bool HaveHttp();

// What a store's requests are sent with: an s3 store signs with key_id and secret (token: a session
// token, may be empty; an empty key: unsigned requests); an http store's token is its URL query.
struct Credentials {
  std::string key_id, secret, token;
};

// A store's credentials: set by one thread (Python gives them) while others send requests with them
// (http_credentials.cc).
class HeldCredentials {
 public:
  void Set(Credentials credentials);
  Credentials Get() const;

 private:
  mutable std::mutex mutex_;
  Credentials credentials_;
};

class HttpStore : public ByteStore {
 public:
  HttpStore(std::string spec, HttpStoreConfig config);
  const std::string &spec() const override { return spec_; }
  std::unique_ptr<StoredObject> Open(const std::string &key) const override;
  // With the version the plan recorded (an ETag): no HEAD request; every read sends If-Match.
  std::unique_ptr<StoredObject> OpenVersion(const std::string &key, const ObjectVersion &planned) const override;
  bool Exists(const std::string &key) const override;
  void Prefetch(const std::string &, const std::vector<std::pair<int64_t, int64_t>> &) const override {}

  // The object as messages name it: s3://bucket/key, or the URL without credentials and query.
  std::string NameOf(const std::string &key) const;
  // HEAD: the version of `key` (size, ETag in tag), or false when it does not exist.
  bool Head(const std::string &key, ObjectVersion *version) const override;
  // An open: one GET of bytes [0, n) (n >= 1), no If-Match; at most n bytes into `dst` (`got`: fewer
  // when the object is smaller) and its version as Head names it (size from Content-Range, or a 200's
  // length, or 0 for a 416: an empty object; ETag, else "gen:"/"lm:"), or false when it does not exist.
  bool OpenRange(const std::string &key, int64_t n, char *dst, int64_t *got, ObjectVersion *version) const override;
  // How many first bytes an open fetches and keeps (a format's header is read from them).
  static constexpr int64_t kOpenBytes = int64_t(64) << 10;
  // One ranged GET of [offset, offset + n) into `dst` (fewer bytes only at the end of the object);
  // `if_match` (an ETag) when not empty; `size` the object's size when known (-1: the answer says
  // where it ends). Returns the bytes.
  int64_t Get(const std::string &key, int64_t offset, int64_t n, char *dst, const std::string &if_match,
              int64_t size) const override;
  // As Get, into the buffers of `iov` in order, all of them filled or an error.
  // `short_ok`: the object may end inside the range (its size is not known): the bytes received.
  int64_t GetVector(const std::string &key, const std::vector<std::pair<char *, int64_t>> &bufs, int64_t offset,
                    const std::string &if_match, int64_t size, bool short_ok = false) const;
  // Each range (dst, offset, bytes) as its own ranged GET, the requests in flight together (this
  // thread's and those of a pool of fetch threads, each with its kept connections): one round trip
  // for a Blosc chunk's blocks of a band instead of one per range. All filled, or the first failure.
  void GetMany(const std::string &key, const std::vector<StoredObject::Range> &ranges, const std::string &if_match,
               int64_t size) const;

  // One page (at most 1000 keys) of an S3 ListObjectsV2 of the bucket of `prefix` ("bucket/path")
  // under its path, grouped at '/' when `delimiter`, after `continuation` (empty: the first page): the
  // XML answer (at most kListPageBytes) read into a Listing (http_text.h ReadListing). A plain HTTP(S)
  // store cannot list.
  Listing ListPage(const std::string &prefix, bool delimiter, const std::string &continuation) const override;
  // The most bytes of one listing page's answer (S3's pages of 1,000 keys are ~300 KB): a longer one
  // is an error, not read to its end (remote.py's LIST_PAGE_BYTES).
  static constexpr int64_t kListPageBytes = int64_t(16) << 20;
  // This store's credentials, kept by it alone: an s3 store signs with key_id and secret (token: a
  // session token, may be empty); an http store's token is its URL query (without '?'), appended to
  // every request and shown in no message. All three empty: none (unsigned requests).
  void SetCredentials(const std::string &key_id, const std::string &secret, const std::string &token) const override;
  // What the next request is sent with (a copy: another thread may set new ones meanwhile).
  Credentials credentials() const { return credentials_.Get(); }

  const HttpStoreConfig &config() const { return config_; }
  // What this store's requests cost, measured from its answered GETs (Perform records each).
  RoundTripMeter &round_trip() const { return round_trip_; }
  RoundTrip Cost() const override { return round_trip_.Now(); }

 private:
  std::string UrlOf(const std::string &key) const;
  // A read's answer had no ETag (its server may ignore If-Match): the object must still be `etag`
  // (and `size` bytes), asked again; fails naming `where` when it was replaced or cannot be told.
  void CheckVersion(const std::string &key, const std::string &etag, int64_t size, const std::string &where) const;
  // The cache's id of `range` of `key` at `etag`: the store's kind, its endpoint (s3) or its URL
  // query's hash (http), the key, the ETag and the range; never the signer nor a query in clear.
  // "": not cached (an http key holding a query, or a query the spec does not name).
  std::string CacheId(const std::string &key, const std::string &etag, const std::string &range) const;
  std::string spec_;
  HttpStoreConfig config_;
  std::unique_ptr<RangeCache> cache_;
  // mutable: the stores are shared as const (plans and readers hold them), their credentials set later
  mutable HeldCredentials credentials_;
  mutable RoundTripMeter round_trip_;
};

}  // namespace dali_mesh

#endif  // DALI_MESH_STORAGE_HTTP_STORE_H_
