// dali_mesh: the text of the remote stores' requests and answers (see http_text.h).
#include "storage/http_text.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "storage/byte_store.h"

namespace dali_mesh {

std::string EscapeKey(const std::string &text, bool path) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    const bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                            c == '-' || c == '.' || c == '_' || c == '~';
    if (unreserved || (path && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

int ControlCharAt(const std::string &value) {
  for (size_t i = 0; i < value.size(); i++) {
    const unsigned char c = static_cast<unsigned char>(value[i]);
    if (c < 0x20 || c == 0x7f) return static_cast<int>(i);
  }
  return -1;
}

void CheckHeaderValue(const std::string &where, const std::string &header, const std::string &value) {
  const int at = ControlCharAt(value);
  if (at < 0) return;
  char code[8];
  std::snprintf(code, sizeof(code), "0x%02x", static_cast<unsigned char>(value[at]));
  // the value itself is not shown: it may be a credential
  StoreFail(where + ": the " + header + " header's value holds a control character (" + code + " at character " +
            std::to_string(at) + "), which would end the header and start another; it is not sent (a broken or "
            "hostile listing, or a bad if_match): list the objects again or give the ETag as the server sent it");
}

namespace {

std::string Lower(std::string s) {
  for (auto &ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

}  // namespace

std::string WithoutCredentials(const std::string &text, const std::vector<std::string> &secrets) {
  std::string out = text;
  for (const std::string &secret : secrets) {
    if (secret.size() < 4) continue;  // shorter "secrets" would blank ordinary words, and guard nothing
    for (size_t at = out.find(secret); at != std::string::npos; at = out.find(secret, at))
      out.replace(at, secret.size(), "[withheld]");
  }
  // what an echoed Authorization header, presigned query or session token starts with: the rest of
  // the text goes (a signature or token runs to the next separator, which differs between servers)
  static const char *const kMarkers[] = {"aws4-hmac-sha256", "credential=", "signature=", "signedheaders=",
                                         "x-amz-signature", "x-amz-security-token", "x-amz-credential",
                                         "authorization:", "bearer ", "basic "};
  const std::string lower = Lower(out);
  size_t cut = std::string::npos;
  for (const char *marker : kMarkers) cut = std::min(cut, lower.find(marker));
  if (cut != std::string::npos) out = out.substr(0, cut) + "[credentials withheld]";
  return out;
}

std::string ErrorCode(const std::string &body, const std::vector<std::string> &secrets) {
  auto tag = [&](const std::string &name) {
    const size_t a = body.find("<" + name + ">");
    if (a == std::string::npos) return std::string();
    const size_t from = a + name.size() + 2, b = body.find("</" + name + ">", from);
    if (b == std::string::npos) return std::string();
    // the whole element is cleaned before it is cut to length: a cut must not split a marker
    return ShownName(WithoutCredentials(body.substr(from, b - from), secrets).substr(0, 200));
  };
  const std::string code = tag("Code"), msg = tag("Message");
  if (code.empty()) return std::string();
  return msg.empty() ? code : code + ": " + msg;
}

}  // namespace dali_mesh
