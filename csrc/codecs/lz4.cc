// dali_mesh: the lz4 codec (numcodecs LZ4): a 4-byte little-endian decoded size, then one LZ4
// block, by liblz4.
#include "codecs/codec_table.h"

#ifdef DALI_MESH_HAVE_LZ4
#include <lz4.h>

#include <climits>

#include "codecs/codec_util.h"

namespace dali_mesh {

namespace {

using detail::Num;

std::string Lz4(const char *src, int64_t n, char *out, int64_t want, int64_t) {
  if (n < 4) return "an LZ4 chunk of " + Num(n) + " bytes is shorter than its 4-byte size header";
  const auto *p = reinterpret_cast<const unsigned char *>(src);
  const int64_t declared = detail::Le32(p);
  if (declared != want)
    return "its LZ4 header declares " + Num(declared) + " decoded bytes, not the chunk's " + Num(want);
  if (want > LZ4_MAX_INPUT_SIZE || n - 4 > INT32_MAX) return "an LZ4 chunk larger than LZ4 blocks can be";
  const int got = LZ4_decompress_safe(src + 4, out, static_cast<int>(n - 4), static_cast<int>(want));
  if (got < 0) return "liblz4 failed to decode it (a corrupt block)";
  if (got != want) return "liblz4 decoded " + Num(got) + " bytes, not " + Num(want);
  return "";
}

}  // namespace

DM_REGISTER_DECODER(Lz4, .decode = Lz4, .arg_ok = detail::NoArgument)

}  // namespace dali_mesh

#else

namespace dali_mesh {
DM_NO_DECODER(Lz4)
}  // namespace dali_mesh

#endif  // DALI_MESH_HAVE_LZ4
