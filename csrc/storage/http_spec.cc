// dali_mesh: a remote store's spec, parsed (see http_store.h for what it holds): the spec's one reader,
// for the store (ParseHttpSpec) and for Python's HTTP client of builds without libcurl (its settings as
// JSON, registered as the kinds' settings: byte_store.h StoreSettings).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "storage/byte_store.h"
#include "storage/http_store.h"

namespace dali_mesh {

namespace {

bool ParseSeconds(const std::string &v, double *out) {
  char *end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || *end || !(d > 0) || d > 1e6) return false;
  *out = d;
  return true;
}

// `text` as a JSON string (quoted; '"', '\\' and control characters escaped).
std::string JsonText(const std::string &text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\u%04x", static_cast<unsigned char>(c));
      out += esc;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string JsonNumber(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.17g", v);
  return text;
}

// The settings of an "s3" or "http" spec as HttpStoreConfig holds them, one JSON object of its fields.
bool HttpSettings(const std::string &spec, std::string *json, std::string *why) {
  HttpStoreConfig c;
  if (!ParseHttpSpec(spec, &c, why)) return false;
  *json = "{\"kind\":" + JsonText(c.kind) + ",\"endpoint\":" + JsonText(c.endpoint) + ",\"region\":" +
          JsonText(c.region) + ",\"path_style\":" + (c.path_style ? "true" : "false") + ",\"anonymous\":" +
          (c.anonymous ? "true" : "false") + ",\"retries\":" + std::to_string(c.retries) +
          ",\"retry_seconds\":" + JsonNumber(c.retry_seconds) + ",\"timeout\":" + JsonNumber(c.timeout) +
          ",\"stall\":" + JsonNumber(c.stall) + ",\"connect\":" + JsonNumber(c.connect) + ",\"query_hash\":" +
          JsonText(c.query_hash) + ",\"cache\":" + JsonText(c.cache) + ",\"cache_bytes\":" +
          std::to_string(c.cache_bytes) + "}";
  return true;
}

}  // namespace

DM_REGISTER_STORE_SETTINGS("s3", HttpSettings)
DM_REGISTER_STORE_SETTINGS("http", HttpSettings)

bool ParseHttpSpec(const std::string &spec, HttpStoreConfig *config, std::string *why) {
  HttpStoreConfig c;
  size_t start = 0;
  bool first = true;
  while (start <= spec.size()) {
    size_t end = spec.find(';', start);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(start, end - start);
    start = end + 1;
    if (first) {
      if (item != "s3" && item != "http") {
        *why = "not a remote store";
        return false;
      }
      c.kind = item;
      first = false;
      continue;
    }
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      *why = "setting without a value: " + ShownName(item);
      return false;
    }
    const std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    bool ok = true;
    if (k == "endpoint") {
      c.endpoint = v;
      ok = (v.rfind("http://", 0) == 0 || v.rfind("https://", 0) == 0) && v.back() != '/';
    } else if (k == "region") {
      c.region = v;
      ok = !v.empty() && v.find(':') == std::string::npos;
    } else if (k == "addressing") {
      ok = v == "path" || v == "virtual";
      c.path_style = v == "path";
    } else if (k == "anon") {
      ok = v == "0" || v == "1";
      c.anonymous = v == "1";
    } else if (k == "retries") {
      char *e = nullptr;
      const long n = std::strtol(v.c_str(), &e, 10);
      ok = !v.empty() && !*e && n >= 0 && n <= 100;
      c.retries = static_cast<int>(n);
    } else if (k == "retry_seconds") {
      ok = ParseSeconds(v, &c.retry_seconds);
    } else if (k == "timeout") {
      ok = ParseSeconds(v, &c.timeout);
    } else if (k == "stall") {
      ok = ParseSeconds(v, &c.stall);
    } else if (k == "connect") {
      ok = ParseSeconds(v, &c.connect);
    } else if (k == "cache") {
      c.cache = v;
      ok = !v.empty() && v[0] == '/';
    } else if (k == "cache_bytes") {
      char *e = nullptr;
      const long long n = std::strtoll(v.c_str(), &e, 10);
      ok = !v.empty() && !*e && n > 0;
      c.cache_bytes = n;
    } else if (k == "q") {  // which URL query (a hash of it: the query is the store's credential)
      ok = !v.empty() && v.size() <= 64 && v.find_first_not_of("0123456789abcdef") == std::string::npos;
      c.query_hash = v;
    } else if (k == "signer") {  // which credentials (a hash of them; stores with other keys differ)
      ok = !v.empty() && v.size() <= 64;
    } else {
      *why = "unknown setting " + ShownName(k);
      return false;
    }
    if (!ok) {
      *why = "bad value for " + k + ": " + ShownName(v);
      return false;
    }
  }
  if (c.kind == "s3" && c.endpoint.empty()) {
    *why = "an s3 store needs an endpoint";
    return false;
  }
  *config = c;
  return true;
}

}  // namespace dali_mesh
