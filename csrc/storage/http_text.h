// dali_mesh: the text of the remote stores' requests and answers (http_store.cc): an S3 key
// percent-encoded as SigV4 signs it, header values checked before they are sent, a server's error
// text made safe to show, and a ListObjectsV2 page read into a Listing. Host only, DALI-free. The
// servers' XML is read by expat (a streaming parser, refusing document types: no entity is ever
// expanded), so ErrorCode and ReadListing are built with the remote stores (DALI_MESH_HAVE_CURL:
// libcurl and expat found).
#ifndef DALI_MESH_STORAGE_HTTP_TEXT_H_
#define DALI_MESH_STORAGE_HTTP_TEXT_H_

#include <string>
#include <vector>

#include "storage/byte_store.h"

namespace dali_mesh {

// Whether a version's tag is an ETag (sent as If-Match), not a generation ("gen:...") or a
// modification date ("lm:...", answers without either), which are checked after the answer.
inline bool IsEtag(const std::string &tag) {
  return !tag.empty() && tag.rfind("gen:", 0) != 0 && tag.rfind("lm:", 0) != 0;
}

// `text` percent-encoded as SigV4 canonicalises it: every byte but A-Z a-z 0-9 - . _ ~ as %XX
// (uppercase hex), and '/' kept when `path` (between the segments of a key). An S3 key is opaque
// bytes: "k/sub/../a.npy" stays those bytes (sent with CURLOPT_PATH_AS_IS, never squashed).
std::string EscapeKey(const std::string &text, bool path);

// Fails naming `where` and the header when `value` holds a control character (it is never sent).
void CheckHeaderValue(const std::string &where, const std::string &header, const std::string &value);

// `text` (a server's error message) with anything credential-like removed: each of `secrets` (a key
// id, secret, session token, URL query) wherever it occurs, and everything from a credential's
// marker on (an echoed Authorization header "AWS4-HMAC-SHA256 Credential=...", "Signature=",
// "X-Amz-Signature", "X-Amz-Security-Token", "X-Amz-Credential", "Bearer ...").
std::string WithoutCredentials(const std::string &text, const std::vector<std::string> &secrets);

// "Code: Message" of an S3 error body: its first <Code> and <Message> as far as the body is XML (the
// text of one it breaks off in is kept), each at most 200 characters, shown as ShownName shows keys,
// WithoutCredentials; in the message every key-like run of 16+ characters, 32+ or with a digit, is
// withheld too: a signature echoed bare. "" when the body has no <Code>. Never the rest of the body: a
// SignatureDoesNotMatch body echoes the string that was signed.
std::string ErrorCode(const std::string &body, const std::vector<std::string> &secrets);

// One page of an S3 ListObjectsV2 answer `xml` of `bucket` read into `page`: each Contents' Key, Size
// and ETag, each CommonPrefixes' Prefix (as the store's keys, "bucket/key"; percent-decoded where the
// answer says EncodingType url), NextContinuationToken where IsTruncated is true, and the answer's
// length. The one reader of S3's listing text (expat's). False with the reason in `why` for a text
// that is not such XML (a document type, an entity other than XML's own, unbalanced tags, elements
// nested more than 64 deep) or a key, prefix or token holding a NUL (a C string would end there and
// name another key).
bool ReadListing(const std::string &xml, const std::string &bucket, Listing *page, std::string *why);

}  // namespace dali_mesh

#endif  // DALI_MESH_STORAGE_HTTP_TEXT_H_
