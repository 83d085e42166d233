// The harness of tests/storage/test_listing_fuzz.py: the remote stores' XML readers
// (csrc/storage/http_text.cc ReadListing and ErrorCode, expat's) built with AddressSanitizer and
// UBSan, given each case of a file. A case is a 4-byte little-endian length and the bytes of a body;
// its answer (to stdout) is a 4-byte length and "A" with the page as dali_mesh_store_list encodes it
// (csrc/storage/byte_store.h EncodeListing: o/p/n/r records of length-prefixed fields), or "R" with the reason it was
// refused; then the same framing of ErrorCode's reading of the body as an error body.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "storage/byte_store.h"
#include "storage/http_text.h"

namespace {

void Put(const std::string &text) {
  const uint32_t n = static_cast<uint32_t>(text.size());
  const unsigned char size[4] = {static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
                                 static_cast<unsigned char>(n >> 16), static_cast<unsigned char>(n >> 24)};
  std::fwrite(size, 1, 4, stdout);
  std::fwrite(text.data(), 1, text.size(), stdout);
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  std::ifstream in(argv[1], std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<std::string> secrets = {"SECRET-OF-THE-FUZZ-0123456789"};
  for (size_t at = 0; at + 4 <= data.size();) {
    const auto *p = reinterpret_cast<const unsigned char *>(data.data() + at);
    const size_t n = p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<size_t>(p[3]) << 24);
    at += 4;
    if (at + n > data.size()) return 3;
    const std::string body = data.substr(at, n);  // a copy of exactly its size: a read past it is reported
    at += n;
    dali_mesh::Listing page;
    std::string why;
    if (dali_mesh::ReadListing(body, "data", &page, &why)) {
      Put("A" + dali_mesh::EncodeListing(page));
    } else {
      Put("R" + why);
    }
    Put(dali_mesh::ErrorCode(body, secrets));
  }
  return 0;
}
