// dali_mesh: the lzf codec (HDF5 LZF, h5py's filter 32000): one LZF stream, by liblzf.
#include "codecs/codec_table.h"

#ifdef DALI_MESH_HAVE_LZF
#include <lzf.h>

#include <cerrno>
#include <climits>

#include "codecs/codec_util.h"

namespace dali_mesh {

namespace {

using detail::Num;

std::string Lzf(const char *src, int64_t n, char *out, int64_t want, int64_t) {
  if (n > UINT_MAX || want > UINT_MAX) return "an LZF chunk larger than liblzf takes";
  errno = 0;
  const unsigned got = lzf_decompress(src, static_cast<unsigned>(n), out, static_cast<unsigned>(want));
  if (got == 0 && want > 0) {
    if (errno == E2BIG) return "its LZF stream holds more than the chunk's " + Num(want) + " bytes";
    return "liblzf failed to decode it (a corrupt stream)";
  }
  if (static_cast<int64_t>(got) != want) return "its LZF stream holds " + Num(got) + " bytes, not the chunk's " + Num(want);
  return "";
}

}  // namespace

DM_REGISTER_DECODER(Lzf, .decode = Lzf, .arg_ok = detail::NoArgument)

}  // namespace dali_mesh

#else

namespace dali_mesh {
DM_NO_DECODER(Lzf)
}  // namespace dali_mesh

#endif  // DALI_MESH_HAVE_LZF
