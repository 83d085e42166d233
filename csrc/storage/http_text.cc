// dali_mesh: the text of the remote stores' requests and answers (see http_text.h).
#include "storage/http_text.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

#ifdef DALI_MESH_HAVE_CURL
#include <curl/curl.h>
#include <expat.h>
#endif

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

#ifdef DALI_MESH_HAVE_CURL  // built with the remote stores: expat reads their XML, libcurl unescapes keys

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

static_assert(sizeof(XML_Char) == 1, "expat built for UTF-8 (libexpat, not libexpatw)");

// The most elements open at once in a server's XML (a ListObjectsV2 page nests 4 deep, an error 2):
// deeper is refused, so that a page of 16 MiB of start tags holds no millions of names.
constexpr size_t kMaxXmlDepth = 64;

// expat reads namespaces (a prefix must be bound) and gives a name as "namespace}local" ("local" in
// none), as for ElementTree ('}' is in no local name; expat refuses a namespace holding it).
constexpr XML_Char kNameSeparator = '}';

// The local name of expat's `name` ("http://s3.amazonaws.com/doc/2006-03-01/}Key" -> "Key"): the
// readers take any namespace, as ElementTree's readers did.
std::string LocalName(const char *name) {
  const char *separator = std::strrchr(name, kNameSeparator);
  return separator == nullptr ? std::string(name) : std::string(separator + 1);
}

// One XML document read by expat's streaming parser: Start, Text and End in document order, with
// the elements' local names; a handler's Stop ends the reading. Expat refuses what is not XML
// (unbalanced tags, a reference to no character or to an entity other than XML's five); here a
// document type is refused where it starts, before any declaration in it is read, so that no entity
// is ever declared or expanded (a billion laughs, an external entity), and elements nest at most
// kMaxXmlDepth deep.
class XmlReader {
 public:
  virtual ~XmlReader() = default;
  // Reads `text` whole: XML_ERROR_NONE, or expat's error (XML_ERROR_ABORTED where a handler stopped
  // it: why() says why) with `where` its place ("line 1, column 40").
  XML_Error Read(const std::string &text, std::string *where);
  const std::string &why() const { return why_; }

 protected:
  virtual void Start(const std::string &tag) = 0;
  virtual void Text(const char *data, int size) = 0;
  virtual void End(const std::string &tag) = 0;
  // Ends the reading (expat may still report an element's end, which is not passed on).
  void Stop(const std::string &why) {
    if (why_.empty()) why_ = why;
    XML_StopParser(parser_, XML_FALSE);
  }

 private:
  XML_Parser parser_ = nullptr;
  std::string why_;
  size_t depth_ = 0;
};

XML_Error XmlReader::Read(const std::string &text, std::string *where) {
  std::unique_ptr<XML_ParserStruct, void (*)(XML_Parser)> parser(XML_ParserCreateNS(nullptr, kNameSeparator),
                                                          XML_ParserFree);
  if (parser == nullptr) throw std::bad_alloc();
  if (text.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    *where = "its length, " + std::to_string(text.size()) + " bytes";
    return XML_ERROR_NO_MEMORY;
  }
  parser_ = parser.get();
  XML_SetUserData(parser_, this);
  XML_SetElementHandler(
      parser_,
      [](void *user, const XML_Char *name, const XML_Char **) {
        auto *self = static_cast<XmlReader *>(user);
        if (!self->why_.empty()) return;
        if (++self->depth_ > kMaxXmlDepth)
          return self->Stop("elements nested more than " + std::to_string(kMaxXmlDepth) + " deep");
        self->Start(LocalName(name));
      },
      [](void *user, const XML_Char *name) {
        auto *self = static_cast<XmlReader *>(user);
        if (!self->why_.empty()) return;
        self->depth_--;
        self->End(LocalName(name));
      });
  XML_SetCharacterDataHandler(parser_, [](void *user, const XML_Char *data, int size) {
    auto *self = static_cast<XmlReader *>(user);
    if (self->why_.empty()) self->Text(data, size);
  });
  XML_SetStartDoctypeDeclHandler(parser_, [](void *user, const XML_Char *, const XML_Char *, const XML_Char *, int) {
    static_cast<XmlReader *>(user)->Stop("a document type (its entities are not read)");
  });
  // unreachable (an entity is declared in a document type, stopped at its start): a second lock
  XML_SetEntityDeclHandler(parser_, [](void *user, const XML_Char *, int, const XML_Char *, int, const XML_Char *,
                                       const XML_Char *, const XML_Char *, const XML_Char *) {
    static_cast<XmlReader *>(user)->Stop("an entity declaration (not read)");
  });
  XML_SetParamEntityParsing(parser_, XML_PARAM_ENTITY_PARSING_NEVER);
  if (XML_Parse(parser_, text.data(), static_cast<int>(text.size()), XML_TRUE) == XML_STATUS_OK)
    return XML_ERROR_NONE;
  *where = "line " + std::to_string(XML_GetCurrentLineNumber(parser_)) + ", column " +
           std::to_string(XML_GetCurrentColumnNumber(parser_));
  return XML_GetErrorCode(parser_);
}

// The first <Code> and <Message> of an S3 error body (of any namespace), as far as the body is XML:
// the text of an element the body breaks off in (cut at 4 KiB, an '&' not escaped) is kept.
class ErrorReader : public XmlReader {
 public:
  std::string code, message;

 protected:
  void Start(const std::string &tag) override {
    if (into_ != nullptr) {
      inner_++;
    } else if (tag == "Code" && !seen_code_) {
      into_ = &code, inner_ = 0, seen_code_ = true;
    } else if (tag == "Message" && !seen_message_) {
      into_ = &message, inner_ = 0, seen_message_ = true;
    }
  }
  void Text(const char *data, int size) override {
    if (into_ != nullptr && into_->size() < 4096) into_->append(data, static_cast<size_t>(size));
  }
  void End(const std::string &) override {
    if (into_ != nullptr && inner_-- == 0) into_ = nullptr;
  }

 private:
  std::string *into_ = nullptr;  // the element whose text is being read, or none
  int inner_ = 0;                // elements open inside it
  bool seen_code_ = false, seen_message_ = false;
};

// One page of a ListObjectsV2 answer (see ReadListing), its keys as the answer writes them.
class ListingReader : public XmlReader {
 public:
  explicit ListingReader(Listing *page) : page_(page) {}
  std::vector<std::string> open;  // the elements open, outermost first
  std::string token;
  bool truncated = false, url = false;

 protected:
  void Start(const std::string &tag) override {
    if (open.empty() && tag != "ListBucketResult") return Stop("its root is <" + ShownName(tag) + ">");
    if (open.size() == 1 && tag == "Contents") object_ = ListedObject();
    open.push_back(tag);
    text_.clear();
  }
  void Text(const char *data, int size) override { text_.append(data, static_cast<size_t>(size)); }
  // an element ends: its text (a leaf's: the data since its start tag), where the listing has it
  void End(const std::string &tag) override {
    const std::string parent = open.size() >= 2 ? open[open.size() - 2] : std::string();
    if (open.size() == 3 && parent == "Contents") {
      if (tag == "Key") object_.key = text_;
      else if (tag == "ETag") object_.tag = text_;
      else if (tag == "Size") {
        const size_t a = text_.find_first_not_of(" \t\r\n"), b = text_.find_last_not_of(" \t\r\n");
        const std::string digits = a == std::string::npos ? std::string() : text_.substr(a, b - a + 1);
        if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos)
          return Stop("a Size that is not a number");
        object_.size = std::stoll(digits);
      }
    } else if (open.size() == 3 && parent == "CommonPrefixes" && tag == "Prefix") {
      page_->prefixes.push_back(text_);
    } else if (open.size() == 2) {
      if (tag == "Contents") {
        page_->objects.push_back(object_);
      } else if (tag == "IsTruncated") {
        std::string t;
        for (unsigned char c : text_)
          if (!std::isspace(c)) t += static_cast<char>(std::tolower(c));
        truncated = t == "true";
      } else if (tag == "NextContinuationToken") {
        token = text_;
      } else if (tag == "EncodingType") {
        url = text_ == "url";
      }
    }
    open.pop_back();
    text_.clear();
  }

 private:
  Listing *page_;
  ListedObject object_;
  std::string text_;  // the character data since the last tag
};

// `text` with each %XX decoded by libcurl (an answer's keys with EncodingType url): a '%' without two
// hex digits is kept, and so is '+'.
std::string UrlDecoded(const std::string &text) {
  int size = 0;
  char *out = curl_easy_unescape(nullptr, text.data(), static_cast<int>(text.size()), &size);
  if (out == nullptr) throw std::bad_alloc();
  std::string decoded(out, static_cast<size_t>(size));
  curl_free(out);
  return decoded;
}

// Why a page that expat did not read whole is no listing (at `where`, "line 1, column 40").
std::string NotAListing(XML_Error error, const ListingReader &read, const std::string &where) {
  if (!read.why().empty()) return read.why() + " (" + where + ")";
  const std::string expat = " (expat: " + std::string(XML_ErrorString(error)) + ", " + where + ")";
  switch (error) {
    case XML_ERROR_NO_ELEMENTS:
      return (read.open.empty() ? "no <ListBucketResult>" : "<" + ShownName(read.open.back()) + "> is not closed") +
             expat;
    case XML_ERROR_TAG_MISMATCH:
      return "an end tag closes no element open" + expat;
    case XML_ERROR_JUNK_AFTER_DOC_ELEMENT:
      return "elements or text after its root" + expat;
    case XML_ERROR_UNDEFINED_ENTITY:
    case XML_ERROR_BAD_CHAR_REF:
    case XML_ERROR_BINARY_ENTITY_REF:
    case XML_ERROR_RECURSIVE_ENTITY_REF:
      return "a reference that is not XML's" + expat;
    default:
      return "not XML" + expat;
  }
}

}  // namespace

std::string ErrorCode(const std::string &body, const std::vector<std::string> &secrets) {
  ErrorReader read;
  std::string where;
  read.Read(body, &where);  // a body that is not XML to its end: what was read before is kept
  // each text is cleaned before it is cut to length: a cut must not split a marker or a run; the
  // message is the server's words, which may echo what the request carried: key-like runs go too
  auto shown = [&](const std::string &text, bool message) {
    std::string clean = WithoutCredentials(text, secrets);
    if (message) clean = WithoutKeylikeRuns(clean);
    return ShownName(clean.substr(0, 200));
  };
  const std::string code = shown(read.code, false), msg = shown(read.message, true);
  if (code.empty()) return std::string();
  return msg.empty() ? code : code + ": " + msg;
}

bool ReadListing(const std::string &xml, const std::string &bucket, Listing *page, std::string *why) {
  *page = Listing();
  auto fail = [&](const std::string &what) {
    *page = Listing();  // nothing of it is used
    *why = what;
    return false;
  };
  ListingReader read(page);
  std::string where;
  const XML_Error error = read.Read(xml, &where);
  if (error != XML_ERROR_NONE) return fail(NotAListing(error, read, where));
  page->received = static_cast<int64_t>(xml.size());
  for (auto &o : page->objects) o.key = bucket + "/" + (read.url ? UrlDecoded(o.key) : o.key);
  for (auto &p : page->prefixes) p = bucket + "/" + (read.url ? UrlDecoded(p) : p);
  // a C string would end at a NUL and name another key
  for (const auto &o : page->objects)
    if (o.key.find('\0') != std::string::npos) return fail("a key holds a NUL");
  for (const auto &p : page->prefixes)
    if (p.find('\0') != std::string::npos) return fail("a prefix holds a NUL");
  if (read.token.find('\0') != std::string::npos) return fail("the continuation token holds a NUL");
  // truncated without a token (a ListObjects V1 answer: NextMarker, or none): the rest cannot be asked
  // for, and a listing taken as complete would read the objects past this page as missing (fill values)
  if (read.truncated && read.token.empty())
    return fail("it says it is truncated (IsTruncated true) but names no NextContinuationToken: the rest of the "
                "listing cannot be asked for (a ListObjects V1 answer? the server must answer list-type=2)");
  if (read.truncated) page->next = read.token;
  return true;
}

#endif  // DALI_MESH_HAVE_CURL

}  // namespace dali_mesh
