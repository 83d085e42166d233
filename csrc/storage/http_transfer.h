// dali_mesh: one request of a remote store (http_store.h) through libcurl, as http_store.cc sends it:
// this thread's curl handle (its connections kept between requests), the answer's headers and body
// (Exchange: into the caller's buffers, or a listing's text), the stall watch, retries of 429, 5xx,
// dropped connections and stalls with exponential backoff and full jitter, bounded in attempts and
// time, and the failure an answer's status means. Host only, DALI-free; a build with libcurl only.
#ifndef DALI_MESH_STORAGE_HTTP_TRANSFER_H_
#define DALI_MESH_STORAGE_HTTP_TRANSFER_H_

#ifdef DALI_MESH_HAVE_CURL

#include <curl/curl.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "storage/http_store.h"

namespace dali_mesh {

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
  bool text_overflow = false;   // that body was longer than HttpStore::kListPageBytes
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
    overflow = cut = text_overflow = false;
    error_body.clear();
    error_code.clear();
    etag.clear();
    content_range.clear();
    last_modified.clear();
    generation.clear();
    content_length = -1;
  }
};

// Set when this thread's last answer was rejected (a short, long or misplaced body): its connection
// may hold bytes of that answer, so the next request opens a new one.
extern thread_local bool t_fresh_connection;

// One request (HEAD when `head`, else GET of `range` when not empty), retried as the header says;
// fills `x` and returns the final status, or fails naming `name`, `what` and the attempts.
long Perform(const HttpStore &store, const std::string &url, const std::string &name, const std::string &what,
             bool head, const std::string &range, const std::string &if_match, Exchange *x);

// Fails naming `where` with what the status `status` of the answer `x` means (no such object,
// replaced, access denied, a refused request).
[[noreturn]] void FailStatus(const std::string &where, long status, const Exchange &x);

// The version an answer names: its ETag, else its generation ("gen:"), else its date ("lm:").
std::string TagOf(const Exchange &x);

}  // namespace dali_mesh

#endif  // DALI_MESH_HAVE_CURL

#endif  // DALI_MESH_STORAGE_HTTP_TRANSFER_H_
