// dali_mesh: the text of the remote stores' requests and answers (see http_text.h).
#include "storage/http_text.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

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

namespace {

// `text` with each run of 16 or more of the characters keys, secrets, signatures and tokens are made
// of (letters, digits, + / = _ % . -) replaced by "[withheld]" when it is 32 or longer or holds a
// digit: an id, a secret, a signature echoed without its marker (words and plain paths stay).
std::string WithoutKeylikeRuns(const std::string &text) {
  auto keylike = [](unsigned char c) { return std::isalnum(c) || std::strchr("+/=_%.-", c) != nullptr; };
  std::string out;
  for (size_t i = 0; i < text.size();) {
    size_t j = i;
    bool digit = false;
    while (j < text.size() && text[j] != '\0' && keylike(static_cast<unsigned char>(text[j]))) {
      digit = digit || std::isdigit(static_cast<unsigned char>(text[j]));
      j++;
    }
    if (j == i) {
      out += text[i++];
      continue;
    }
    out += (j - i >= 16 && (j - i >= 32 || digit)) ? std::string("[withheld]") : text.substr(i, j - i);
    i = j;
  }
  return out;
}

}  // namespace

std::string ErrorCode(const std::string &body, const std::vector<std::string> &secrets) {
  auto tag = [&](const std::string &name) {
    const size_t a = body.find("<" + name + ">");
    if (a == std::string::npos) return std::string();
    const size_t from = a + name.size() + 2, b = body.find("</" + name + ">", from);
    if (b == std::string::npos) return std::string();
    // the whole element is cleaned before it is cut to length: a cut must not split a marker or a run;
    // the message is the server's words, which may echo what the request carried: key-like runs go too
    std::string text = WithoutCredentials(body.substr(from, b - from), secrets);
    if (name == "Message") text = WithoutKeylikeRuns(text);
    return ShownName(text.substr(0, 200));
  };
  const std::string code = tag("Code"), msg = tag("Message");
  if (code.empty()) return std::string();
  return msg.empty() ? code : code + ": " + msg;
}

namespace {

// `name` without a namespace prefix ("s3:Key" -> "Key"), as ElementTree's readers matched any namespace.
std::string LocalName(const std::string &name) {
  const size_t colon = name.find(':');
  return colon == std::string::npos ? name : name.substr(colon + 1);
}

// Appends the code point `cp` as UTF-8.
void AppendUtf8(uint32_t cp, std::string *out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// XML character data `text` with its references (&lt; &gt; &amp; &quot; &apos; &#N; &#xH;) replaced;
// false for any other entity or a reference to no character (NUL, past U+10FFFF).
bool XmlDecoded(const std::string &text, std::string *out) {
  out->clear();
  for (size_t i = 0; i < text.size(); i++) {
    if (text[i] != '&') {
      *out += text[i];
      continue;
    }
    const size_t end = text.find(';', i);
    if (end == std::string::npos || end - i > 12) return false;
    const std::string ref = text.substr(i + 1, end - i - 1);
    i = end;
    if (ref == "lt") *out += '<';
    else if (ref == "gt") *out += '>';
    else if (ref == "amp") *out += '&';
    else if (ref == "quot") *out += '"';
    else if (ref == "apos") *out += '\'';
    else if (ref.size() > 1 && ref[0] == '#') {
      const bool hex = ref[1] == 'x';
      const std::string digits = ref.substr(hex ? 2 : 1);
      const char *allowed = hex ? "0123456789abcdefABCDEF" : "0123456789";
      if (digits.empty() || digits.find_first_not_of(allowed) != std::string::npos) return false;
      const unsigned long cp = std::stoul(digits, nullptr, hex ? 16 : 10);
      if (cp == 0 || cp > 0x10FFFF) return false;
      AppendUtf8(static_cast<uint32_t>(cp), out);
    } else {
      return false;
    }
  }
  return true;
}

// `text` with each %XX decoded (an answer's keys with EncodingType url); a '%' without two hex digits is kept.
std::string PercentDecoded(const std::string &text) {
  auto hex = [](char c) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return -1;
    return c <= '9' ? c - '0' : (c | 32) - 'a' + 10;
  };
  std::string out;
  for (size_t i = 0; i < text.size(); i++) {
    if (text[i] == '%' && i + 2 < text.size() && hex(text[i + 1]) >= 0 && hex(text[i + 2]) >= 0) {
      out += static_cast<char>(hex(text[i + 1]) * 16 + hex(text[i + 2]));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

}  // namespace

bool ReadListing(const std::string &xml, const std::string &bucket, Listing *page, std::string *why) {
  *page = Listing();
  page->received = static_cast<int64_t>(xml.size());
  std::vector<std::string> open;  // the elements open, outermost first (local names)
  std::string text, value, token;  // the character data since the last tag; a leaf's, decoded
  ListedObject object;
  bool truncated = false, url = false, ended = false;
  auto fail = [&](const std::string &what) {
    *why = what;
    return false;
  };
  for (size_t i = 0; i < xml.size();) {
    if (xml[i] != '<') {
      const size_t next = xml.find('<', i);
      text.append(xml, i, (next == std::string::npos ? xml.size() : next) - i);
      i = next == std::string::npos ? xml.size() : next;
      continue;
    }
    if (xml.compare(i, 2, "<?") == 0 || xml.compare(i, 4, "<!--") == 0) {  // a declaration, a comment
      const bool pi = xml[i + 1] == '?';
      const size_t end = xml.find(pi ? "?>" : "-->", i);
      if (end == std::string::npos) return fail("an unterminated " + std::string(pi ? "declaration" : "comment"));
      i = end + (pi ? 2 : 3);
      continue;
    }
    if (xml.compare(i, 9, "<![CDATA[") == 0) {  // raw character data: escaped, so that it is taken as is
      const size_t end = xml.find("]]>", i);
      if (end == std::string::npos) return fail("an unterminated CDATA section");
      for (char c : xml.substr(i + 9, end - i - 9)) text += c == '&' ? std::string("&amp;") : std::string(1, c);
      i = end + 3;
      continue;
    }
    if (xml.compare(i, 2, "<!") == 0) return fail("a document type (its entities are not read)");
    const size_t end = xml.find('>', i);
    if (end == std::string::npos) return fail("an unterminated tag");
    const bool closing = xml[i + 1] == '/', empty = !closing && xml[end - 1] == '/';
    std::string tag = xml.substr(i + (closing ? 2 : 1), end - i - (closing ? 2 : 1) - (empty ? 1 : 0));
    tag = LocalName(tag.substr(0, tag.find_first_of(" \t\r\n")));
    i = end + 1;
    if (tag.empty()) return fail("a tag without a name");
    if (!closing) {
      if (open.empty() && (ended || tag != "ListBucketResult"))
        return fail(ended ? "elements after its root" : "its root is <" + ShownName(tag) + ">");
      if (open.size() == 1 && tag == "Contents") object = ListedObject();
      open.push_back(tag);
      text.clear();
      if (!empty) continue;
    } else if (open.empty() || open.back() != tag) {
      return fail("</" + ShownName(tag) + "> closes no element open");
    }
    // an element ends: its text (a leaf's: the data since its start tag), where the listing has it
    if (!XmlDecoded(text, &value)) return fail("a reference that is not XML's");
    text.clear();
    const std::string parent = open.size() >= 2 ? open[open.size() - 2] : std::string();
    if (open.size() == 3 && parent == "Contents") {
      if (tag == "Key") object.key = value;
      else if (tag == "ETag") object.tag = value;
      else if (tag == "Size") {
        const size_t a = value.find_first_not_of(" \t\r\n"), b = value.find_last_not_of(" \t\r\n");
        const std::string digits = a == std::string::npos ? std::string() : value.substr(a, b - a + 1);
        if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos)
          return fail("a Size that is not a number");
        object.size = std::stoll(digits);
      }
    } else if (open.size() == 3 && parent == "CommonPrefixes" && tag == "Prefix") {
      page->prefixes.push_back(value);
    } else if (open.size() == 2) {
      if (tag == "Contents") {
        page->objects.push_back(object);
      } else if (tag == "IsTruncated") {
        std::string t;
        for (char c : value)
          if (!std::isspace(static_cast<unsigned char>(c))) t += static_cast<char>(std::tolower(c));
        truncated = t == "true";
      } else if (tag == "NextContinuationToken") {
        token = value;
      } else if (tag == "EncodingType") {
        url = value == "url";
      }
    }
    open.pop_back();
    ended = open.empty();
  }
  if (!open.empty()) return fail("<" + ShownName(open.back()) + "> is not closed");
  if (!ended) return fail("no <ListBucketResult>");
  for (auto &o : page->objects) o.key = bucket + "/" + (url ? PercentDecoded(o.key) : o.key);
  for (auto &p : page->prefixes) p = bucket + "/" + (url ? PercentDecoded(p) : p);
  for (const auto &o : page->objects)
    if (o.key.find('\0') != std::string::npos) return fail("a key holds a NUL");
  for (const auto &p : page->prefixes)
    if (p.find('\0') != std::string::npos) return fail("a prefix holds a NUL");
  if (token.find('\0') != std::string::npos) return fail("the continuation token holds a NUL");
  if (truncated) page->next = token;  // truncated without a token: nothing to ask for, the listing ends
  return true;
}

}  // namespace dali_mesh
