// dali_mesh: remote object stores through libcurl (see http_store.h).
#include "storage/http_store.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "storage/http_object.h"
#include "storage/http_text.h"
#include "storage/kept_threads.h"
#include "storage/reads_in_flight.h"

#ifdef DALI_MESH_HAVE_CURL
#include <curl/curl.h>
#endif

namespace dali_mesh {

namespace {

std::atomic<int64_t> g_requests{0}, g_bytes{0};

// the most of a whole-object answer without a length an open counts through to learn the object's size
// (as the Python client's MAX_BODY): a server that ignores ranges and streams without end is an error
constexpr int64_t kMaxSkipped = int64_t{16} << 20;

struct Credentials {
  std::string key_id, secret, token;
};

// never destroyed: a kept thread may still send a request while the process exits
std::mutex &CredentialsMutex() {
  static auto *m = new std::mutex;
  return *m;
}
std::map<std::string, Credentials> &CredentialsTable() {
  static auto *table = new std::map<std::string, Credentials>;
  return *table;
}

Credentials CredentialsOf(const std::string &spec) {
  std::lock_guard<std::mutex> lock(CredentialsMutex());
  auto it = CredentialsTable().find(spec);
  return it == CredentialsTable().end() ? Credentials{} : it->second;
}

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

}  // namespace

void SetStoreCredentials(const std::string &spec, const std::string &key_id, const std::string &secret,
                         const std::string &token) {
  std::lock_guard<std::mutex> lock(CredentialsMutex());
  // an http store's credentials are its URL query alone (token, without a key)
  if (key_id.empty() && secret.empty() && token.empty())
    CredentialsTable().erase(spec);
  else
    CredentialsTable()[spec] = Credentials{key_id, secret, token};
}

HttpStore::HttpStore(std::string spec, HttpStoreConfig config) : spec_(std::move(spec)), config_(std::move(config)) {
  if (!config_.cache.empty()) cache_ = std::make_unique<RangeCache>(config_.cache, config_.cache_bytes);
}

std::string HttpStore::NameOf(const std::string &key) const {
  return config_.kind == "s3" ? ShownName("s3://" + key) : Shown(key);
}

#ifndef DALI_MESH_HAVE_CURL

bool HaveHttp() { return false; }
void FetchCounters(int64_t *requests, int64_t *bytes) { *requests = *bytes = 0; }
std::string HttpStore::UrlOf(const std::string &key) const { return key; }
[[noreturn]] static void NoCurl() {
  StoreFail("this build of dali_mesh has no libcurl: remote objects are read in Python (install "
            "libcurl4-openssl-dev and rebuild for the native reader)");
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
std::string HttpStore::ListPage(const std::string &, const std::string &, bool, const std::string &) const { NoCurl(); }

#else  // DALI_MESH_HAVE_CURL

bool HaveHttp() { return true; }

void FetchCounters(int64_t *requests, int64_t *bytes) {
  *requests = g_requests.load();
  *bytes = g_bytes.load();
}

namespace {

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// One curl handle per thread: its connections stay open between requests (curl_easy_reset keeps them).
struct ThreadHandle {
  CURL *curl = nullptr;
  ~ThreadHandle() {
    if (curl) curl_easy_cleanup(curl);
  }
};

// Set when this thread's last answer was rejected (a short, long or misplaced body): its connection
// may hold bytes of that answer, so the next request opens a new one.
thread_local bool t_fresh_connection = false;

CURL *HandleOfThread() {
  thread_local ThreadHandle handle;
  if (handle.curl && t_fresh_connection) {  // drop the connections of this thread's handle
    curl_easy_cleanup(handle.curl);
    handle.curl = nullptr;
  }
  t_fresh_connection = false;
  if (!handle.curl) {
    GlobalInit();
    handle.curl = curl_easy_init();
    if (!handle.curl) StoreFail("libcurl could not make a handle (out of memory?)");
  } else {
    curl_easy_reset(handle.curl);
  }
  return handle.curl;
}

std::string Lower(std::string s) {
  for (auto &ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

std::string Trim(const std::string &s) {
  const size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

// What one response said, and where its body went.
struct Exchange {
  // the destination of a 2xx body: buffers in order
  const std::vector<std::pair<char *, int64_t>> *bufs = nullptr;
  size_t buf = 0;
  int64_t in_buf = 0, received = 0;
  bool overflow = false;
  // an open's first bytes (OpenRange): a 200 answer (the whole object) is taken as far as the buffers
  // go; the rest is cut off (`cut`: its Content-Length gives the size) or, without one, counted
  // (`skipped`) and dropped
  bool open = false, cut = false;
  int64_t skipped = 0;
  std::string error_body;  // the first KiBs of a body of an error answer
  std::string *text = nullptr;  // where a 2xx body goes when it is not read into buffers (a listing)
  // the stall watch (OnProgress): bytes received so far, when the last arrived, the limit
  int64_t last_down = 0;
  std::chrono::steady_clock::time_point last_byte;
  double stall = 30;
  bool stalled = false;
  CURL *curl = nullptr;
  // headers (of the last response: a redirect's are dropped)
  std::string etag, content_range, last_modified, generation;
  int64_t content_length = -1;
  // a non-2xx answer's "Code: Message", credentials removed (http_text.h)
  std::string error_code;

  void Reset() {
    buf = 0;
    in_buf = received = skipped = 0;
    overflow = cut = false;
    error_body.clear();
    error_code.clear();
    etag.clear();
    content_range.clear();
    last_modified.clear();
    generation.clear();
    content_length = -1;
  }
};

size_t OnHeader(char *data, size_t size, size_t n, void *user) {
  auto *x = static_cast<Exchange *>(user);
  const std::string line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {  // a new response (after a redirect or a 100 Continue)
    x->etag.clear();
    x->content_range.clear();
    x->last_modified.clear();
    x->generation.clear();
    x->content_length = -1;
    return size * n;
  }
  const size_t colon = line.find(':');
  if (colon == std::string::npos) return size * n;
  const std::string name = Lower(Trim(line.substr(0, colon))), value = Trim(line.substr(colon + 1));
  if (name == "etag") x->etag = value;
  else if (name == "content-range") x->content_range = value;
  else if (name == "last-modified") x->last_modified = value;
  else if (name == "x-goog-generation") x->generation = value;
  else if (name == "content-length") x->content_length = std::strtoll(value.c_str(), nullptr, 10);
  return size * n;
}

size_t OnBody(char *data, size_t size, size_t n, void *user) {
  auto *x = static_cast<Exchange *>(user);
  const int64_t total = static_cast<int64_t>(size * n);
  long status = 0;
  curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &status);
  if (status >= 200 && status < 300) g_bytes += total;
  if (x->text && status >= 200 && status < 300) {
    if (x->text->size() + total > (size_t(64) << 20)) return 0;  // no listing page is that large
    x->text->append(data, total);
    return size * n;
  }
  if (status < 200 || status >= 300 || !x->bufs) {
    if (x->error_body.size() < 4096) x->error_body.append(data, std::min<size_t>(total, 4096 - x->error_body.size()));
    return size * n;
  }
  int64_t done = 0;
  while (done < total) {
    if (x->buf >= x->bufs->size()) {  // more than asked for: an error, never data
      if (x->open && status == 200) {  // an open's whole object: its first bytes only
        x->received += done;
        if (x->content_length >= 0) {
          x->cut = true;
          return 0;
        }
        x->skipped += total - done;
        if (x->skipped > kMaxSkipped) {  // no length, and no end in sight: not read whole to learn the size
          x->overflow = true;
          return 0;
        }
        return size * n;
      }
      x->overflow = true;
      return 0;
    }
    const auto &b = (*x->bufs)[x->buf];
    const int64_t take = std::min(total - done, b.second - x->in_buf);
    std::memcpy(b.first + x->in_buf, data + done, take);
    done += take;
    x->in_buf += take;
    if (x->in_buf == b.second) {
      x->buf++;
      x->in_buf = 0;
    }
  }
  x->received += total;
  return size * n;
}

// Cancellation, and a stall: no byte received for `stall` seconds (libcurl's own low-speed limit
// averages over its last seconds, so a stall after some bytes would be seen late).
int OnProgress(void *user, curl_off_t, curl_off_t now_down, curl_off_t, curl_off_t) {
  auto *x = static_cast<Exchange *>(user);
  if (ReadCancelled()) return 1;
  const auto now = std::chrono::steady_clock::now();
  if (now_down != x->last_down) {
    x->last_down = now_down;
    x->last_byte = now;
  } else if (std::chrono::duration<double>(now - x->last_byte).count() > x->stall) {
    x->stalled = true;
    return 1;
  }
  return 0;
}

bool Transient(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY:     // e.g. bytes of an earlier, broken answer
    case CURLE_UNSUPPORTED_PROTOCOL:   // ("Received HTTP/0.9"): the retry opens a new connection
      return true;
    default:
      return false;
  }
}

bool TransientStatus(long status) {
  return status == 408 || status == 429 || status == 500 || status == 502 || status == 503 || status == 504;
}

double Jitter(double cap) {
  thread_local std::mt19937_64 gen{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, cap)(gen);
}

}  // namespace


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
    const std::string query = CredentialsOf(spec_).token;
    if (query.empty()) return key;
    return key + (key.find('?') == std::string::npos ? "?" : "&") + query;
  }
  // s3: bucket/path, each segment percent-encoded as SigV4 canonicalises it
  const size_t slash = key.find('/');
  const std::string bucket = key.substr(0, slash), path = slash == std::string::npos ? "" : key.substr(slash + 1);
  return BucketUrl(config_, bucket) + EscapeKey(path, true);
}

namespace {

// One request (HEAD when `head`, else GET of `range` when not empty), retried as the header says;
// fills `x` and returns the final status, or fails naming `name`, `what` and the attempts.
long Perform(const HttpStore &store, const std::string &url, const std::string &name, const std::string &what,
             bool head, const std::string &range, const std::string &if_match, Exchange *x) {
  const HttpStoreConfig &cfg = store.config();
  const auto t0 = std::chrono::steady_clock::now();
  std::string last;
  for (int attempt = 0;; attempt++) {
    if (ReadCancelled()) StoreFail(name + " (" + what + "): cancelled: the pipeline was stopped after an error");
    CURL *curl = HandleOfThread();
    x->Reset();
    if (x->text) x->text->clear();
    x->curl = curl;
    x->last_down = 0;
    x->last_byte = std::chrono::steady_clock::now();
    x->stall = cfg.stall;
    x->stalled = false;
    char errbuf[CURL_ERROR_SIZE] = {0};
    const Credentials cred = CredentialsOf(store.spec());
    const bool s3_signed = cfg.kind == "s3" && !cfg.anonymous;
    // every header value and the URL checked before anything is sent: a control character would end
    // the header (or request line) and start another
    const std::string where_sent = name + " (" + what + ")";
    CheckHeaderValue(where_sent, "If-Match", if_match);
    CheckHeaderValue(where_sent, "Range", range);
    if (s3_signed) CheckHeaderValue(where_sent, "x-amz-security-token", cred.token);
    if (ControlCharAt(url) >= 0)
      StoreFail(where_sent + ": the URL holds a control character; it is not sent (give the location without one)");
    struct curl_slist *headers = nullptr;
    headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");  // curl 7.88 omits it
    if (!range.empty()) headers = curl_slist_append(headers, ("Range: bytes=" + range).c_str());
    if (!if_match.empty()) headers = curl_slist_append(headers, ("If-Match: " + if_match).c_str());
    if (s3_signed && !cred.token.empty())
      headers = curl_slist_append(headers, ("x-amz-security-token: " + cred.token).c_str());
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    // the path as given: an S3 key is opaque bytes ("k/sub/../a.npy" is that object, never "k/a.npy"),
    // and SigV4 signs the path sent
    curl_easy_setopt(curl, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_NOBODY, head ? 1L : 0L);
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, OnProgress);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, x);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(cfg.connect * 1000));
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(cfg.timeout * 1000));
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_ACCEPT_ENCODING, nullptr);  // bytes as stored: no Content-Encoding
    if (s3_signed && !cred.key_id.empty()) {
      const std::string sigv4 = "aws:amz:" + cfg.region + ":s3";
      curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
      curl_easy_setopt(curl, CURLOPT_USERNAME, cred.key_id.c_str());
      curl_easy_setopt(curl, CURLOPT_PASSWORD, cred.secret.c_str());
    }
    g_requests++;
    const CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    // the secret is not left in the handle between requests
    curl_easy_setopt(curl, CURLOPT_PASSWORD, "");
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);
    curl_slist_free_all(headers);
    const std::vector<std::string> secrets = {cred.key_id, cred.secret, cred.token};
    if (status < 200 || status >= 300) x->error_code = ErrorCode(x->error_body, secrets);
    const std::string &where = where_sent;
    if (rc == CURLE_ABORTED_BY_CALLBACK && !x->stalled)
      StoreFail(where + ": cancelled: the pipeline was stopped after an error");
    if (rc != CURLE_OK) t_fresh_connection = true;  // whatever the connection holds, it is not used again
    if (rc == CURLE_WRITE_ERROR && x->cut) return status;  // an open's first bytes of a whole object
    if (rc == CURLE_WRITE_ERROR && x->overflow)
      StoreFail(where + ": the server sent more bytes than the range asked for (HTTP " + std::to_string(status) +
                "): a broken server or proxy; nothing of it is used");
    bool again = false;
    if (x->stalled) {
      char secs[32];
      std::snprintf(secs, sizeof(secs), "%g", cfg.stall);
      last = std::string("stalled: no byte for ") + secs + " s (stall=" + secs + ")";
      again = true;
    } else if (rc != CURLE_OK) {
      // libcurl's own words (a host, a TLS failure); a URL's query is withheld if it shows in them
      last = std::string(curl_easy_strerror(rc)) +
             (errbuf[0] ? " (" + WithoutCredentials(errbuf, secrets) + ")" : std::string());
      if (!Transient(rc)) StoreFail(where + ": " + last);
      again = true;
    } else if (TransientStatus(status)) {
      last = "HTTP " + std::to_string(status);
      if (!x->error_code.empty()) last += " " + x->error_code;
      again = true;
    }
    if (!again) return status;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double wait = Jitter(std::min(5.0, 0.05 * double(int64_t(1) << std::min(attempt, 20))));
    if (attempt >= cfg.retries || elapsed + wait > cfg.retry_seconds)
      StoreFail(where + ": " + last + " after " + std::to_string(attempt + 1) + " attempt" + (attempt ? "s" : "") +
                " in " + std::to_string(static_cast<int>(elapsed + 0.5)) + " s (retries=" +
                std::to_string(cfg.retries) + ", retry_seconds=" + std::to_string(static_cast<int>(cfg.retry_seconds)) +
                "); the store is unreachable or overloaded");
    // in slices, so that a cancelled read (a batch read ahead, dropped) does not sleep on
    using Clock = std::chrono::steady_clock;
    const Clock::time_point until =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait));
    while (!ReadCancelled() && Clock::now() < until)
      std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(50), until - Clock::now()));
    if (ReadCancelled()) StoreFail(where + ": cancelled: the pipeline was stopped after an error");
  }
}

[[noreturn]] void FailStatus(const std::string &where, long status, const Exchange &x) {
  const std::string said = "HTTP " + std::to_string(status) + (x.error_code.empty() ? "" : " " + x.error_code);
  if (status == 404) StoreFail(where + ": no such object (" + said + "); check the location");
  if (status == 412)
    StoreFail(where + ": the object was replaced since the plan was made (" + said + ": its ETag differs): what "
              "was read could mix two versions; define the pipeline again");
  if (status == 401 || status == 403)
    StoreFail(where + ": access denied (" + said + "); check the credentials (storage_options key/secret/token, "
              "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE), the region and the "
              "object's permissions, or anon=True for a public bucket");
  if (status == 400)
    StoreFail(where + ": the server refused the request (" + said + "); check the credentials (an expired or "
              "wrong session token), the region and the endpoint");
  StoreFail(where + ": " + said);
}

}  // namespace

// The version an answer names: its ETag, else its generation ("gen:"), else its date ("lm:").
static std::string TagOf(const Exchange &x) {
  if (!x.etag.empty()) return x.etag;
  if (!x.generation.empty()) return "gen:" + x.generation;
  return x.last_modified.empty() ? std::string() : "lm:" + x.last_modified;
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
    if (config_.query_hash.empty() && !CredentialsOf(spec_).token.empty()) return "";
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

std::string HttpStore::ListPage(const std::string &bucket, const std::string &prefix, bool delimiter,
                                const std::string &continuation) const {
  if (config_.kind != "s3") StoreFail(Shown(bucket) + ": plain HTTP(S) locations cannot be listed");
  // the query's parameters sorted by name, encoded (SigV4 signs them so)
  std::string query;
  if (!continuation.empty()) query += "continuation-token=" + EscapeKey(continuation, false) + "&";
  if (delimiter) query += "delimiter=%2F&";
  query += "list-type=2&prefix=" + EscapeKey(prefix, false);
  const std::string name = ShownName("s3://" + bucket + "/" + prefix);
  std::string text;
  Exchange x;
  x.text = &text;
  const long status = Perform(*this, BucketUrl(config_, bucket) + "?" + query, name, "list", false, "", "", &x);
  if (status != 200) FailStatus(name + " (list)", status, x);
  return text;
}

#endif  // DALI_MESH_HAVE_CURL

}  // namespace dali_mesh
