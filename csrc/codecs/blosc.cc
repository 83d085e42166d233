// dali_mesh: the blosc codec (numcodecs Blosc, Zarr v3 blosc): Blosc1 chunks, by c-blosc2 (see
// blosc.h). The step's argument is the array's item size (informative: a chunk shuffled by any type
// size decodes). Reading and decoding only some of a chunk's blocks: codecs.cc.
#include "codecs/codec_table.h"

#ifdef DALI_MESH_HAVE_BLOSC2
#include "codecs/blosc.h"

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "codecs/codec_util.h"

namespace dali_mesh {

namespace detail {

namespace {

struct BloscCtx {
  blosc2_context *ctx = nullptr;
  BloscCtx() {
    static std::once_flag init;
    std::call_once(init, [] { blosc2_init(); });
    blosc2_dparams params = BLOSC2_DPARAMS_DEFAULTS;
    params.nthreads = 1;  // DALI's threads decode chunks in parallel; Blosc's own stay idle
    ctx = blosc2_create_dctx(params);
  }
  ~BloscCtx() {
    if (ctx) blosc2_free_ctx(ctx);
  }
};

}  // namespace

blosc2_context *BloscContext() {
  thread_local BloscCtx ctx;
  return ctx.ctx;
}

bool BloscSplits(const unsigned char *h, int32_t blocksize) {
  return !(h[2] & 0x10) && h[3] >= 1 && h[3] <= 16 && blocksize / h[3] >= 128;
}

std::string BloscHeader(const char *src, int64_t n, int64_t want, int32_t *blocksize_out, int *stored_typesize) {
  if (n < BLOSC_MIN_HEADER_LENGTH) return "a Blosc chunk of " + Num(n) + " bytes is shorter than its header";
  int32_t nbytes = 0, cbytes = 0, blocksize = 0;
  if (blosc2_cbuffer_sizes(src, &nbytes, &cbytes, &blocksize) < 0) return "not a Blosc chunk (bad header)";
  if (nbytes != want)
    return "its Blosc header declares " + Num(nbytes) + " decoded bytes, not the chunk's " + Num(want);
  if (cbytes != n)
    return "its Blosc header declares " + Num(cbytes) + " stored bytes but the chunk has " + Num(n);
  // Zarr's Blosc chunks are Blosc1 chunks (numcodecs writes them, for v2 and v3 alike): refuse the
  // header fields c-blosc1 refuses (a newer format version, Blosc2-only flags, an unknown
  // compressor), which c-blosc2 would read as Blosc2 features of a corrupt chunk
  const auto *h = reinterpret_cast<const unsigned char *>(src);
  // the header's own block size (blosc2_cbuffer_sizes gives it clamped to the chunk's size)
  blocksize = static_cast<int32_t>(Le32(h + 8));
  if (h[0] < 1 || h[0] > 2) return "its Blosc header has format version " + Num(h[0]) + " (Blosc1 chunks have 1 or 2)";
  if (h[3] < 1) return "its Blosc header has type size 0";
  const bool memcpyed = h[2] & 0x02;
  // every Blosc1 compressor's stream format is version 1 (BLOSC_*_VERSION_FORMAT); c-blosc1 refuses others
  if (!memcpyed && h[1] != 1) return "its Blosc header has compressor format version " + Num(h[1]);
  // compressor codes (flags >> 5): 0 BloscLZ, 1 LZ4/LZ4HC, 2 Snappy, 3 Zlib, 4 Zstd; c-blosc1 and
  // numcodecs refuse the others
  if ((h[2] >> 5) > 4) return "its Blosc header names compressor code " + Num(h[2] >> 5) + ", which Blosc1 does not have";
  if (blocksize <= 0 || blocksize > nbytes)
    return "its Blosc header has block size " + Num(blocksize) + " for " + Num(nbytes) + " bytes";
  if ((h[2] & 0x08) || (h[2] & 0x05) == 0x05)
    return "its Blosc header has flags " + Num(h[2]) + " that Blosc1 chunks never have";
  // a memcpyed chunk is its header and its bytes as they are, nothing after them (numcodecs refuses more)
  if (memcpyed && n != want + BLOSC_MIN_HEADER_LENGTH)
    return "its Blosc header says the bytes are stored as they are, but the chunk has " + Num(n) + " bytes, not " +
           Num(want + BLOSC_MIN_HEADER_LENGTH);
  if (!memcpyed && BloscSplits(h, blocksize) && blocksize % h[3] != 0)
    return "its Blosc header has block size " + Num(blocksize) + ", not a multiple of its type size " + Num(h[3]);
  // a bit-shuffled block whose length is not a whole number of items: c-blosc2 (3.3.5) decodes it to
  // other bytes than c-blosc1 (numcodecs, which reads Zarr's Blosc) with no error (Zarr v3's
  // BloscCodec with a typesize that does not divide the chunk; the planner reads those by
  // partitioned_source)
  if (!memcpyed && (h[2] & 0x04) && (blocksize % h[3] != 0 || want % h[3] != 0))
    return "it is bit-shuffled by type size " + Num(h[3]) + " in blocks of " + Num(blocksize) + " of " + Num(want) +
           " bytes, not whole numbers of items, which c-blosc2 decodes other than c-blosc1 does";
  *blocksize_out = blocksize;
  *stored_typesize = h[3];
  return "";
}

const char *AsBlosc1(const char *src, int64_t n, int32_t blocksize, std::vector<char> *copy, char *room) {
  const auto *h = reinterpret_cast<const unsigned char *>(src);
  if ((h[2] & 0x02) || (h[2] & 0x10) || BloscSplits(h, blocksize)) return src;
  if (room == nullptr) {
    copy->resize(n);
    room = copy->data();
  }
  std::memcpy(room, src, n);
  room[2] = static_cast<char>(h[2] | 0x10);
  return room;
}

std::string Blosc(const char *src, int64_t n, char *out, int64_t want, char *room) {
  int32_t blocksize = 0;
  int stored_typesize = 0;
  std::string why = BloscHeader(src, n, want, &blocksize, &stored_typesize);
  if (!why.empty()) return why;
  blosc2_context *ctx = BloscContext();
  if (ctx == nullptr) return "c-blosc2 could not make a decompression context";
  thread_local std::vector<char> copy;
  src = AsBlosc1(src, n, blocksize, &copy, room);
  const int got = blosc2_decompress_ctx(ctx, src, static_cast<int32_t>(n), out, static_cast<int32_t>(want));
  if (got < 0) return "c-blosc2 failed to decode it (error " + Num(got) + ")";
  if (got != want) return "c-blosc2 decoded " + Num(got) + " bytes, not " + Num(want);
  return "";
}

}  // namespace detail

namespace {

std::string DecodeBlosc(const char *src, int64_t n, char *out, int64_t want, int64_t) {
  return detail::Blosc(src, n, out, want);
}

bool ItemSize(int64_t arg) { return arg >= 0 && arg <= 255; }

}  // namespace

DM_REGISTER_DECODER(Blosc, .decode = DecodeBlosc, .arg_ok = ItemSize)

}  // namespace dali_mesh

#else

namespace dali_mesh {
DM_NO_DECODER(Blosc)
}  // namespace dali_mesh

#endif  // DALI_MESH_HAVE_BLOSC2
