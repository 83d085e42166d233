// dali_mesh: one request of a remote store through libcurl (see http_transfer.h).
#include "storage/http_transfer.h"

#ifdef DALI_MESH_HAVE_CURL

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "storage/http_text.h"
#include "storage/reads_in_flight.h"

namespace dali_mesh {

thread_local bool t_fresh_connection = false;

namespace {

// the most of a whole-object answer without a length an open counts through to learn the object's size
// (as the Python client's MAX_BODY): a server that ignores ranges and streams without end is an error
constexpr int64_t kMaxSkipped = int64_t{16} << 20;

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
  if (status >= 200 && status < 300) CountFetch(0, total);
  if (x->text && status >= 200 && status < 300) {
    if (static_cast<int64_t>(x->text->size()) + total > HttpStore::kListPageBytes) {  // no page is that large
      x->text_overflow = true;
      return 0;
    }
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
    const Credentials cred = store.credentials();
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
    CountFetch(1, 0);
    const CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    if (rc == CURLE_OK && !head && status >= 200 && status < 300) {
      // the store's latency and bandwidth, for the fetch plan's choice of what to merge (RoundTripMeter)
      curl_off_t first_us = 0, total_us = 0, body = 0;
      curl_easy_getinfo(curl, CURLINFO_STARTTRANSFER_TIME_T, &first_us);
      curl_easy_getinfo(curl, CURLINFO_TOTAL_TIME_T, &total_us);
      curl_easy_getinfo(curl, CURLINFO_SIZE_DOWNLOAD_T, &body);
      store.round_trip().Record(first_us * 1e-6, body, (total_us - first_us) * 1e-6);
    }
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
    if (rc == CURLE_WRITE_ERROR && x->text_overflow)
      StoreFail(where + ": the server sent more bytes than " + std::to_string(HttpStore::kListPageBytes) +
                " (the most one listing page may be; HTTP " + std::to_string(status) + "): a broken server; nothing "
                "of it is used");
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
  if (status >= 300 && status < 400)
    StoreFail(where + ": the server answers with a redirect (" + said + "): redirects are not followed (the "
              "request's credentials would go to the host it names); give the final location, or the endpoint_url "
              "of the bucket's region");
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

// The version an answer names: its ETag, else its generation ("gen:"), else its date ("lm:").
std::string TagOf(const Exchange &x) {
  if (!x.etag.empty()) return x.etag;
  if (!x.generation.empty()) return "gen:" + x.generation;
  return x.last_modified.empty() ? std::string() : "lm:" + x.last_modified;
}

}  // namespace dali_mesh

#endif  // DALI_MESH_HAVE_CURL
