// dali_mesh: the szip codec (HDF5 szip): a 4-byte little-endian decoded size, then the stream, by
// libaec. The step's argument is the filter's parameters: options_mask | pixels_per_block << 16 |
// bits_per_pixel << 24 | pixels_per_scanline << 32.
#include "codecs/codec_table.h"

#ifdef DALI_MESH_HAVE_SZIP
extern "C" {  // libaec's szlib.h declares C functions without a C++ guard
#include <szlib.h>
}

#include "codecs/codec_util.h"

namespace dali_mesh {

namespace {

using detail::Num;

std::string Szip(const char *src, int64_t n, char *out, int64_t want, int64_t arg) {
  if (n < 4) return "an szip chunk of " + Num(n) + " bytes is shorter than its 4-byte size header";
  const auto *p = reinterpret_cast<const unsigned char *>(src);
  const int64_t declared = detail::Le32(p);
  if (declared != want)
    return "its szip header declares " + Num(declared) + " decoded bytes, not the chunk's " + Num(want);
  SZ_com_t params;
  params.options_mask = static_cast<int>(arg & 0xffff);
  params.pixels_per_block = static_cast<int>((arg >> 16) & 0xff);
  params.bits_per_pixel = static_cast<int>((arg >> 24) & 0xff);
  params.pixels_per_scanline = static_cast<int>((arg >> 32) & 0xffffffff);
  size_t got = static_cast<size_t>(want);
  const int rc = SZ_BufftoBuffDecompress(out, &got, src + 4, static_cast<size_t>(n - 4), &params);
  if (rc != SZ_OK) return "libaec failed to decode it (szip error " + Num(rc) + ")";
  if (static_cast<int64_t>(got) != want) return "libaec decoded " + Num(got) + " bytes, not " + Num(want);
  return "";
}

bool AnyParameters(int64_t arg) { return arg >= 0; }

}  // namespace

DM_REGISTER_DECODER(Szip, .decode = Szip, .arg_ok = AnyParameters)

}  // namespace dali_mesh

#else

namespace dali_mesh {
DM_NO_DECODER(Szip)
}  // namespace dali_mesh

#endif  // DALI_MESH_HAVE_SZIP
