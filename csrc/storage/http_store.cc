// dali_mesh: remote object stores through libcurl (see http_store.h): the store's methods; a request
// is sent by http_transfer.cc, the credentials held by the store (http_credentials.cc), the spec parsed
// by http_spec.cc.
#include "storage/http_store.h"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <future>
#include <memory>

#include "storage/http_object.h"
#include "storage/http_text.h"
#include "storage/http_transfer.h"
#include "storage/kept_threads.h"
#include "storage/reads_in_flight.h"

namespace dali_mesh {

namespace {

// The URL without user information or query (a presigned URL's signature is in its query).
std::string Shown(const std::string &url) {
  std::string u = url.substr(0, url.find_first_of("?#"));
  const size_t scheme = u.find("://");
  if (scheme != std::string::npos) {
    const size_t host = scheme + 3, slash = u.find('/', host), at = u.find('@', host);
    if (at != std::string::npos && (slash == std::string::npos || at < slash)) u.erase(host, at + 1 - host);
  }
  return ShownName(u);
}

// A store of the kinds "s3" and "http" for `spec`, or nullptr with the reason.
std::unique_ptr<ByteStore> MakeHttpStore(const std::string &spec, std::string *why) {
  HttpStoreConfig config;
  if (!ParseHttpSpec(spec, &config, why)) return nullptr;
  if (!HaveHttp()) {
    *why = "this build has no libcurl: remote objects cannot be read (install libcurl4-openssl-dev and rebuild: "
           "make install)";
    return nullptr;
  }
  return std::make_unique<HttpStore>(spec, config);
}

}  // namespace

DM_REGISTER_STORE("s3", MakeHttpStore)
DM_REGISTER_STORE("http", MakeHttpStore)

HttpStore::HttpStore(std::string spec, HttpStoreConfig config) : spec_(std::move(spec)), config_(std::move(config)) {
  if (!config_.cache.empty()) cache_ = std::make_unique<RangeCache>(config_.cache, config_.cache_bytes);
}

std::string HttpStore::NameOf(const std::string &key) const {
  return config_.kind == "s3" ? ShownName("s3://" + key) : Shown(key);
}

void HttpStore::SetCredentials(const std::string &key_id, const std::string &secret, const std::string &token) const {
  credentials_.Set(Credentials{key_id, secret, token});
}

#ifndef DALI_MESH_HAVE_CURL

bool HaveHttp() { return false; }
std::string HttpStore::UrlOf(const std::string &key) const { return key; }
[[noreturn]] static void NoCurl() {
  StoreFail("this build of dali_mesh has no libcurl or no expat: remote objects cannot be read (install "
            "libcurl4-openssl-dev and libexpat1-dev and rebuild: make install)");
}
std::unique_ptr<StoredObject> HttpStore::Open(const std::string &) const { NoCurl(); }
std::unique_ptr<StoredObject> HttpStore::OpenVersion(const std::string &, const ObjectVersion &) const { NoCurl(); }
bool HttpStore::Exists(const std::string &) const { NoCurl(); }
bool HttpStore::Head(const std::string &, ObjectVersion *) const { NoCurl(); }
bool HttpStore::OpenRange(const std::string &, int64_t, char *, int64_t *, ObjectVersion *) const { NoCurl(); }
int64_t HttpStore::Get(const std::string &, int64_t, int64_t, char *, const std::string &, int64_t) const { NoCurl(); }
int64_t HttpStore::GetVector(const std::string &, const std::vector<std::pair<char *, int64_t>> &, int64_t,
                             const std::string &, int64_t, bool) const {
  NoCurl();
}
void HttpStore::GetMany(const std::string &, const std::vector<StoredObject::Range> &, const std::string &,
                        int64_t) const {
  NoCurl();
}
Listing HttpStore::ListPage(const std::string &, bool, const std::string &) const { NoCurl(); }

#else  // DALI_MESH_HAVE_CURL

bool HaveHttp() { return true; }

// The URL of the bucket (with a trailing '/') for the store's addressing style.
static std::string BucketUrl(const HttpStoreConfig &config, const std::string &bucket) {
  // a bucket's name is letters, digits, '.', '-' and '_' (as remote.py's locations check): anything else
  // in a virtual-hosted URL's host ("evil.com/x?") would send the signed request elsewhere
  if (bucket.empty() || !std::all_of(bucket.begin(), bucket.end(), [](unsigned char c) {
        return std::isalnum(c) || c == '.' || c == '-' || c == '_';
      }))
    StoreFail("\"" + ShownName(bucket) + "\" is not a bucket's name (letters, digits, '.', '-' and '_')");
  if (config.path_style) return config.endpoint + "/" + EscapeKey(bucket, false) + "/";
  const size_t scheme = config.endpoint.find("://") + 3;
  return config.endpoint.substr(0, scheme) + bucket + "." + config.endpoint.substr(scheme) + "/";
}

std::string HttpStore::UrlOf(const std::string &key) const {
  if (config_.kind == "http") {
    // the store's credentials are its URL query (a presigned URL's signature): on every request, in
    // no message (NameOf shows the URL without it)
    const std::string query = credentials().token;
    if (query.empty()) return key;
    return key + (key.find('?') == std::string::npos ? "?" : "&") + query;
  }
  // s3: bucket/path, each segment percent-encoded as SigV4 canonicalises it
  const size_t slash = key.find('/');
  const std::string bucket = key.substr(0, slash), path = slash == std::string::npos ? "" : key.substr(slash + 1);
  return BucketUrl(config_, bucket) + EscapeKey(path, true);
}

bool HttpStore::Head(const std::string &key, ObjectVersion *version) const {
  Exchange x;
  const std::string name = NameOf(key);
  const long status = Perform(*this, UrlOf(key), name, "HEAD", true, "", "", &x);
  if (status == 404) return false;
  if (status < 200 || status >= 300) FailStatus(name + " (HEAD)", status, x);
  if (x.content_length < 0) StoreFail(name + " (HEAD): the answer has no Content-Length: the size of the object is unknown");
  version->size = x.content_length;
  version->mtime_ns = -1;
  version->tag = TagOf(x);
  return true;
}

bool HttpStore::OpenRange(const std::string &key, int64_t n, char *dst, int64_t *got, ObjectVersion *version) const {
  const std::string name = NameOf(key);
  if (n < 1 || !dst) StoreFail(name + ": an open reads the first bytes of the object: give n >= 1 and a buffer");
  const std::string range = "0-" + std::to_string(n - 1);
  const std::string where = name + " (open, bytes " + range + ")";
  std::vector<std::pair<char *, int64_t>> bufs = {{dst, n}};
  Exchange x;
  x.bufs = &bufs;
  x.open = true;
  FlightGuard flight(name, 0, n);
  // no If-Match: this answer names the version (no HEAD first, which S3 refuses on a URL presigned for GET)
  const long status = Perform(*this, UrlOf(key), name, "open, bytes " + range, false, range, "", &x);
  t_fresh_connection = true;  // until the answer is accepted: a rejected one may leave bytes behind
  if (status == 404) {
    t_fresh_connection = false;
    return false;
  }
  int64_t first = 0, last = -1, total = -1;
  if (status == 416) {
    // a range from byte 0 is unsatisfiable only for an empty object (RFC 9110; S3 and moto send no
    // Content-Range then, others "bytes */0"): one that names another size is a broken answer
    total = 0;
    if (!x.content_range.empty() &&
        (std::sscanf(x.content_range.c_str(), "bytes */%" SCNd64, &total) != 1 || total != 0))
      StoreFail(where + ": HTTP 416 for the object's first bytes, and its Content-Range (\"" +
                ShownName(x.content_range) + "\") does not say it is empty: a broken answer");
  } else if (status == 206) {
    if (std::sscanf(x.content_range.c_str(), "bytes %" SCNd64 "-%" SCNd64 "/%" SCNd64, &first, &last, &total) < 3)
      StoreFail(where + ": the answer has no valid Content-Range with the object's size (\"" +
                ShownName(x.content_range) + "\")");
    if (first != 0 || last - first + 1 != x.received || x.received != std::min(n, total))
      StoreFail(where + ": the answer holds bytes " + std::to_string(first) + "-" + std::to_string(last) + " of " +
                std::to_string(total) + " in " + std::to_string(x.received) + " bytes of body, not the range asked "
                "for: a short or broken answer; nothing of it is used");
  } else if (status == 200) {  // the server ignored the range: the whole object's first bytes
    total = x.cut ? x.content_length : x.received + x.skipped;
    if (x.received != std::min(n, total))
      StoreFail(where + ": the answer's body (" + std::to_string(x.received + x.skipped) + " bytes) is not the " +
                std::to_string(total) + " bytes its Content-Length says: a short or broken answer");
  } else {
    FailStatus(where, status, x);
  }
  if (!x.cut) t_fresh_connection = false;
  *got = x.received;
  version->size = total;
  version->mtime_ns = -1;
  version->tag = TagOf(x);
  return true;
}

void HttpStore::CheckVersion(const std::string &key, const std::string &etag, int64_t size,
                             const std::string &where) const {
  ObjectVersion now;
  char byte;
  int64_t got = 0;
  if (!OpenRange(key, 1, &byte, &got, &now))
    StoreFail(where + ": the object was deleted or replaced while it was read: what was read could mix two "
              "versions; define the pipeline again");
  // the answer to a GET without its ETag (a proxy that drops it): a HEAD may still name it
  if (!IsEtag(now.tag) && (!Head(key, &now) || !IsEtag(now.tag)))
    StoreFail(where + ": the server answers without the object's ETag and may ignore If-Match, so whether the bytes "
              "are of the version planned cannot be checked; they are not used (read through a server or proxy "
              "that keeps ETag and If-Match)");
  if (now.tag != etag || (size >= 0 && now.size != size))
    StoreFail(where + ": the object was replaced while it was read (the server ignored If-Match and sent no ETag; "
              "its ETag differs now): what was read could mix two versions; define the pipeline again");
}

std::string HttpStore::CacheId(const std::string &key, const std::string &etag, const std::string &range) const {
  if (config_.kind == "http") {
    // a query is never written in clear, and one the spec does not name by its hash cannot be told
    // apart from another: such ranges are not cached
    if (key.find_first_of("?#") != std::string::npos) return "";
    if (config_.query_hash.empty() && !credentials().token.empty()) return "";
  }
  // each field with its length: no key can pass for another key and ETag
  std::string id;
  auto field = [&id](const std::string &v) { id += std::to_string(v.size()) + ":" + v + "\n"; };
  field(config_.kind);
  field(config_.kind == "s3" ? config_.endpoint : config_.query_hash);
  field(key);
  field(etag);
  field(range);
  return id;
}

int64_t HttpStore::GetVector(const std::string &key, const std::vector<std::pair<char *, int64_t>> &bufs,
                             int64_t offset, const std::string &if_match, int64_t size, bool short_ok) const {
  int64_t n = 0;
  for (const auto &b : bufs) n += b.second;
  if (n <= 0) return 0;
  const std::string name = NameOf(key);
  const std::string range = std::to_string(offset) + "-" + std::to_string(offset + n - 1);
  const std::string what = "bytes " + range;
  Exchange x;
  x.bufs = &bufs;
  FlightGuard flight(name, offset, n);
  // If-Match only with an ETag (a tag made of a generation or a date is checked after the answer)
  const bool etag = IsEtag(if_match);
  // the cache keys a range by the store, the object, its version and the range: only with an ETag
  // (a replaced object has another)
  // and only for S3 (GCS XML) objects, whose ETag changes with their bytes: a plain HTTP server's may be
  // a modification time and a size (nginx), which a copy that keeps both keeps (RemoteStore.pins)
  const std::string cache_id = cache_ && etag && config_.kind == "s3" ? CacheId(key, if_match, range) : "";
  if (!cache_id.empty() && cache_->Get(cache_id, bufs)) return n;
  const long status = Perform(*this, UrlOf(key), name, what, false, range, etag ? if_match : "", &x);
  const std::string where = name + " (" + what + ")";
  t_fresh_connection = true;  // until the answer is accepted: a rejected one may leave bytes behind
  if (status == 416 && short_ok) {
    t_fresh_connection = false;
    return 0;  // the object ends before `offset`
  }
  if (status == 416) StoreFail(where + ": the range lies past the end of the object (HTTP 416): it is shorter than planned");
  if (status != 206 && status != 200) FailStatus(where, status, x);
  if (!if_match.empty() && !x.etag.empty() && etag && x.etag != if_match)
    StoreFail(where + ": the object was replaced since the plan was made (its ETag differs): define the pipeline again");
  int64_t first = 0, last = -1, total = -1;
  if (status == 206) {
    if (std::sscanf(x.content_range.c_str(), "bytes %" SCNd64 "-%" SCNd64 "/%" SCNd64, &first, &last, &total) < 2)
      StoreFail(where + ": the answer has no valid Content-Range (\"" + ShownName(x.content_range) + "\")");
    if (x.content_range.find("/*") != std::string::npos) total = -1;
  } else {  // 200: the server ignored the range and sent the whole object
    first = 0;
    last = x.received - 1;
    total = x.received;
    if (offset != 0)
      StoreFail(where + ": the server ignored the Range header (HTTP 200): byte ranges are not supported there");
  }
  if (first != offset || last - first + 1 != x.received)
    StoreFail(where + ": the answer holds bytes " + std::to_string(first) + "-" + std::to_string(last) + " in " +
              std::to_string(x.received) + " bytes of body, not the range asked for: a short or broken answer; "
              "nothing of it is used");
  if (size >= 0 && total >= 0 && total != size)
    StoreFail(where + ": the object is " + std::to_string(total) + " bytes now, " + std::to_string(size) +
              " when it was opened: it was replaced; define the pipeline again");
  if (x.received != n && !(short_ok && total >= 0 && last == total - 1))
    StoreFail(where + ": the object ended after " + std::to_string(x.received) + " of the " + std::to_string(n) +
              " bytes (it is " + std::to_string(total) + " bytes): it is shorter than planned");
  t_fresh_connection = false;
  // an answer without the ETag asked for: the server may have ignored If-Match (and sent another
  // version's bytes); the version is asked for again, so these bytes are the planned version's or an error
  if (etag && x.etag.empty()) CheckVersion(key, if_match, size, where);
  if (!cache_id.empty() && x.received == n) cache_->Put(cache_id, bufs);
  return x.received;
}

void HttpStore::GetMany(const std::string &key, const std::vector<StoredObject::Range> &ranges,
                        const std::string &if_match, int64_t size) const {
  // The fetch threads are the whole process's: with other pipelines' requests stuck on a dead server
  // ahead of this read's in their queue, a request may wait there for as long as those do. So this
  // thread takes back each of its requests that no fetch thread has started and sends it itself: it
  // never waits on a request that has not started, only on those running (under its cancel flag).
  std::vector<std::shared_ptr<JobClaim>> claims;  // of ranges 1..k-1: a fetch thread's, or taken back
  std::vector<std::future<void>> others;
  size_t k = 1;
  try {
    claims.reserve(ranges.size());  // no push_back below throws: claims[j] is the claim of others[j]
    others.reserve(ranges.size());
    for (; k < ranges.size(); k++) {
      const StoredObject::Range r = ranges[k];
      auto claim = std::make_shared<JobClaim>();
      // the pool's thread reads under the asking thread's cancel flag (a batch read ahead, dropped);
      // a request taken back is never sent by it (its buffer and flag may be gone by then)
      others.push_back(KeptThreads::Fetch().Submit([this, key, r, if_match, size, flag = CurrentCancelFlag(), claim] {
        if (!claim->Start()) return;
        CancelScope scope(flag);
        GetVector(key, {{r.dst, r.bytes}}, r.offset, if_match, size);
      }));
      claims.push_back(std::move(claim));
    }
  } catch (const std::exception &) {  // no thread or memory to be had: ranges k.. are read here
  }
  std::exception_ptr error;
  auto read_here = [&](const StoredObject::Range &r) {
    if (error) return;
    try {
      GetVector(key, {{r.dst, r.bytes}}, r.offset, if_match, size);
    } catch (...) {
      error = std::current_exception();
    }
  };
  if (!ranges.empty()) read_here(ranges[0]);
  for (size_t j = k; j < ranges.size(); j++) read_here(ranges[j]);
  // the requests not started yet, the last handed first (the fetch threads take the first first);
  // after a failure they are taken back and not sent (the read fails anyway)
  for (size_t j = claims.size(); j-- > 0;)
    if (claims[j]->TakeBack()) read_here(ranges[1 + j]);
  // every request sent ends before this returns: they write into the caller's buffers
  for (size_t j = 0; j < others.size(); j++) {
    if (!claims[j]->running()) continue;  // taken back: its job returns without sending
    try {
      others[j].get();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

int64_t HttpStore::Get(const std::string &key, int64_t offset, int64_t n, char *dst, const std::string &if_match,
                       int64_t size) const {
  if (n <= 0) return 0;
  if (offset < 0) StoreFail(NameOf(key) + ": read at negative offset " + std::to_string(offset));
  if (size >= 0) {  // fewer bytes only at the end of the object
    if (offset >= size) return 0;
    n = std::min(n, size - offset);
    GetVector(key, {{dst, n}}, offset, if_match, size);
    return n;
  }
  // the size is not known: one GET, fewer bytes where the object ends first (no HEAD request)
  return GetVector(key, {{dst, n}}, offset, if_match, -1, true);
}

std::unique_ptr<StoredObject> HttpStore::Open(const std::string &key) const {
  // one ranged GET names the version (size from Content-Range, ETag) and brings the first bytes (a
  // format's header): no HEAD, which S3 refuses on a URL presigned for GET
  std::string first(kOpenBytes, '\0');
  ObjectVersion v;
  int64_t got = 0;
  if (!OpenRange(key, kOpenBytes, first.data(), &got, &v)) StoreFail(NameOf(key) + ": no such object; check the location");
  first.resize(got);
  return MakeHttpObject(this, key, v, std::move(first));
}

std::unique_ptr<StoredObject> HttpStore::OpenVersion(const std::string &key, const ObjectVersion &planned) const {
  // a tag only (a size not planned: a Zarr metadata object): its reads ask for the size first
  if (planned.tag.empty()) return Open(key);
  return MakeHttpObject(this, key, planned);
}

bool HttpStore::Exists(const std::string &key) const {
  // a GET of one byte, not a HEAD (refused on a URL presigned for GET)
  ObjectVersion v;
  char byte;
  int64_t got = 0;
  return OpenRange(key, 1, &byte, &got, &v);
}

Listing HttpStore::ListPage(const std::string &prefix, bool delimiter, const std::string &continuation) const {
  if (config_.kind != "s3") StoreFail(Shown(prefix) + ": plain HTTP(S) locations cannot be listed");
  // an S3 key is bucket/path: the bucket's listing of the path's prefix
  const size_t slash = prefix.find('/');
  const std::string bucket = prefix.substr(0, slash), path = slash == std::string::npos ? "" : prefix.substr(slash + 1);
  // the query's parameters sorted by name, encoded (SigV4 signs them so)
  std::string query;
  if (!continuation.empty()) query += "continuation-token=" + EscapeKey(continuation, false) + "&";
  if (delimiter) query += "delimiter=%2F&";
  query += "list-type=2&prefix=" + EscapeKey(path, false);
  const std::string name = ShownName("s3://" + prefix);
  std::string text;
  Exchange x;
  x.text = &text;
  const long status = Perform(*this, BucketUrl(config_, bucket) + "?" + query, name, "list", false, "", "", &x);
  if (status != 200) FailStatus(name + " (list)", status, x);
  Listing page;
  std::string why;
  if (!ReadListing(text, bucket, &page, &why))
    StoreFail(name + " (list): the answer (HTTP 200, " + std::to_string(text.size()) + " bytes) is not a "
              "ListObjectsV2 page: " + why + "; a broken server, nothing of it is used");
  return page;
}

#endif  // DALI_MESH_HAVE_CURL

}  // namespace dali_mesh