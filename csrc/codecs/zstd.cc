// dali_mesh: the zstd codec (Zarr v2 numcodecs Zstd, Zarr v3 zstd): zstd frame(s), by libzstd.
#include "codecs/codec_table.h"

#ifdef DALI_MESH_HAVE_ZSTD
#include <zstd.h>

#include "codecs/codec_util.h"

namespace dali_mesh {

namespace {

using detail::Num;

std::string Zstd(const char *src, int64_t n, char *out, int64_t want, int64_t) {
  // the first frame's declared size (a chunk is one frame as numcodecs and zarr write it; the size
  // decoded from all frames is checked below)
  const unsigned long long declared = ZSTD_getFrameContentSize(src, n);
  if (declared == ZSTD_CONTENTSIZE_ERROR) return "not a zstd stream (bad frame header)";
  if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared > static_cast<unsigned long long>(want))
    return "its zstd frame declares " + std::to_string(declared) + " decoded bytes, more than the chunk's " +
           Num(want);
  struct Ctx {
    ZSTD_DCtx *c = ZSTD_createDCtx();
    ~Ctx() { ZSTD_freeDCtx(c); }
  };
  thread_local Ctx ctx;
  const size_t got = ZSTD_decompressDCtx(ctx.c, out, want, src, n);
  if (ZSTD_isError(got)) return std::string("libzstd failed to decode it (") + ZSTD_getErrorName(got) + ")";
  if (static_cast<int64_t>(got) != want) return "libzstd decoded " + Num(got) + " bytes, not " + Num(want);
  return "";
}

}  // namespace

DM_REGISTER_DECODER(Zstd, .decode = Zstd, .arg_ok = detail::NoArgument)

}  // namespace dali_mesh

#else

namespace dali_mesh {
DM_NO_DECODER(Zstd)
}  // namespace dali_mesh

#endif  // DALI_MESH_HAVE_ZSTD
