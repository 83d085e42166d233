// dali_mesh: decoding compressed chunks (see codecs.h). The codecs are the libraries' own; this file
// only checks sizes and strings the steps together. Each library is optional at build time
// (DALI_MESH_HAVE_BLOSC2, _ZSTD, _LZ4, _ZLIB, _DEFLATE, ...), so that a machine without one still
// builds. Zlib and gzip streams are inflated by libdeflate where it is in the build (about twice
// zlib's speed: it inflates a whole stream into a buffer of known size, as a chunk is), else by zlib.
#include "kernels/codecs.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#ifdef DALI_MESH_HAVE_BLOSC2
#include <blosc2.h>
#endif
#ifdef DALI_MESH_HAVE_ZSTD
#include <zstd.h>
#endif
#ifdef DALI_MESH_HAVE_LZ4
#include <lz4.h>
#endif
#ifdef DALI_MESH_HAVE_DEFLATE
#include <libdeflate.h>
#elif defined(DALI_MESH_HAVE_ZLIB)
#include <zlib.h>
#endif
#ifdef DALI_MESH_HAVE_LZF
#include <lzf.h>
#endif
#ifdef DALI_MESH_HAVE_SZIP
extern "C" {  // libaec's szlib.h declares C functions without a C++ guard
#include <szlib.h>
}
#endif
#ifdef DALI_MESH_HAVE_CRC32C
// Google's crc32c library (crc32c/crc32c.h, its C API; the google-crc32c wheel ships the library
// without the header)
extern "C" uint32_t crc32c_value(const uint8_t *data, size_t count);
#endif
#include <cerrno>
#include <climits>

namespace dali_mesh {

namespace {

bool IsDecompressor(int64_t id) {
  return id == kCodecBlosc || id == kCodecZstd || id == kCodecLz4 || id == kCodecZlib || id == kCodecGzip ||
         id == kCodecLzf || id == kCodecSzip;
}

bool IsChecksum(int64_t id) { return id == kCodecFletcher32 || id == kCodecCrc32c; }

std::string Num(int64_t v) { return std::to_string(v); }

// The little-endian 32-bit word at `p` (size headers, checksums, Blosc header fields and block starts).
uint32_t Le32(const unsigned char *p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

// A coder of exactly one Blosc step, no checksum: what c-blosc2 can read and decode in parts.
[[maybe_unused]] bool OneBloscStep(const Coder &coder) { return coder.steps.size() == 1 && coder.steps[0].id == kCodecBlosc; }

// ---- checksums -------------------------------------------------------------------------------------
// HDF5's Fletcher-32 (H5_checksum_fletcher32 in H5checksum.c, as the fletcher32 filter applies it):
// 16-bit big-endian words, sums reduced every 360 words; an odd last byte is the high byte of a word.
uint32_t Fletcher32(const unsigned char *data, size_t n) {
  size_t len = n / 2;
  uint32_t sum1 = 0, sum2 = 0;
  while (len) {
    size_t tlen = len > 360 ? 360 : len;
    len -= tlen;
    do {
      sum1 += static_cast<uint32_t>((static_cast<uint16_t>(data[0]) << 8) | data[1]);
      data += 2;
      sum2 += sum1;
    } while (--tlen);
    sum1 = (sum1 & 0xffff) + (sum1 >> 16);
    sum2 = (sum2 & 0xffff) + (sum2 >> 16);
  }
  if (n % 2) {
    sum1 += static_cast<uint32_t>(static_cast<uint16_t>(*data) << 8);
    sum2 += sum1;
    sum1 = (sum1 & 0xffff) + (sum1 >> 16);
    sum2 = (sum2 & 0xffff) + (sum2 >> 16);
  }
  sum1 = (sum1 & 0xffff) + (sum1 >> 16);
  sum2 = (sum2 & 0xffff) + (sum2 >> 16);
  return (sum2 << 16) | sum1;
}

// ---- decompressors: each writes exactly `want` bytes or says why not --------------------------------
#ifdef DALI_MESH_HAVE_BLOSC2
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

// Whether c-blosc1 splits a (not leftover) block of a chunk with header `h` into type-size streams:
// the header's "don't split" flag (0x10) clear, and, the rule from before that flag existed, type size
// <= 16 and block size / type size >= 128 (c-blosc 1.x blosc_d). numcodecs, which writes and reads
// Zarr's Blosc chunks, decodes by c-blosc1. c-blosc2 splits whenever the flag is clear: chunks that
// c-blosc wrote since it sets the flag agree, older ones may not (AsBlosc1 then sets the flag).
bool BloscSplits(const unsigned char *h, int32_t blocksize) {
  return !(h[2] & 0x10) && h[3] >= 1 && h[3] <= 16 && blocksize / h[3] >= 128;
}

// The checks of a Blosc1 chunk's header before it is decoded (sizes, versions, flags, compressor);
// "" or why not. `*blocksize_out`: the header's block size, `*stored_typesize`: its type size (the
// item size the chunk was shuffled with: numcodecs writes the array's, Zarr v3's BloscCodec may
// write 1 for any dtype; c-blosc2 and numcodecs decode either, so any type size is taken).
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

// `src` as c-blosc2 must see it to decode what c-blosc1 decodes: `src` itself, or (an old chunk whose
// split rules differ, see BloscSplits) a copy in `copy` whose header says "don't split".
const char *AsBlosc1(const char *src, int64_t n, int32_t blocksize, std::vector<char> *copy) {
  const auto *h = reinterpret_cast<const unsigned char *>(src);
  if ((h[2] & 0x02) || (h[2] & 0x10) || BloscSplits(h, blocksize)) return src;
  copy->assign(src, src + n);
  (*copy)[2] = static_cast<char>(h[2] | 0x10);
  return copy->data();
}

std::string Blosc(const char *src, int64_t n, char *out, int64_t want) {
  int32_t blocksize = 0;
  int stored_typesize = 0;
  std::string why = BloscHeader(src, n, want, &blocksize, &stored_typesize);
  if (!why.empty()) return why;
  thread_local BloscCtx ctx;
  if (ctx.ctx == nullptr) return "c-blosc2 could not make a decompression context";
  thread_local std::vector<char> copy;
  src = AsBlosc1(src, n, blocksize, &copy);
  const int got = blosc2_decompress_ctx(ctx.ctx, src, static_cast<int32_t>(n), out, static_cast<int32_t>(want));
  if (got < 0) return "c-blosc2 failed to decode it (error " + Num(got) + ")";
  if (got != want) return "c-blosc2 decoded " + Num(got) + " bytes, not " + Num(want);
  return "";
}

// The runs of whole blocks BloscRanges decodes for `ranges`: each range widened to the blocks it
// touches, runs closer than a block joined; false when the chunk is to be decoded whole (the runs
// cover three quarters of it or more, or its blocks do not fall on whole items).
//
// Whole blocks only, because c-blosc2's blosc2_getitem_bytes_ctx (c-blosc2 3.3.5, the blosc2 4.14.1
// wheel) returns wrong bytes with no error for a range exactly one block long, or exactly the last
// block's length, that crosses a block boundary: _blosc_getitem takes the block it reaches second for
// "the single block asked" (startb == 0 && bsize == nitems_bytes) and decodes it over the start of
// the output (tests/io/test_blosc_ranges.py holds the reproducer). A run that starts on a block and
// ends on a block (or the chunk's end) never meets that condition except when it is that one block.
bool BloscMerged(const std::vector<std::pair<int64_t, int64_t>> &ranges, int64_t want, int32_t blocksize, int ts,
                 std::vector<std::pair<int64_t, int64_t>> *merged) {
  merged->clear();
  if (ts < 1 || blocksize % ts || want % ts) return false;
  int64_t covered = 0;
  for (auto r : ranges) {
    r.first = std::max<int64_t>(0, r.first) / blocksize * blocksize;
    r.second = std::min(want, (r.second + blocksize - 1) / blocksize * blocksize);
    if (r.first >= r.second) continue;
    if (!merged->empty() && r.first - merged->back().second < blocksize) {
      merged->back().second = std::max(merged->back().second, r.second);
    } else {
      merged->push_back(r);
    }
  }
  for (const auto &r : *merged) covered += r.second - r.first;
  return covered * 4 < want * 3;
}

// Only the byte ranges `ranges` of a Blosc chunk (sorted, disjoint, inside `want`): c-blosc2 decodes
// the whole blocks they touch (BloscMerged), each block straight into its place in `out` where the
// blocks are large (one blosc2_getitem_bytes_ctx call per block: no copy through c-blosc2's scratch),
// a run of small blocks in one call; when they cover most of the chunk, the whole chunk as by Blosc.
std::string BloscRanges(const char *src, int64_t n, char *out, int64_t want,
                        const std::vector<std::pair<int64_t, int64_t>> &ranges) {
  int32_t blocksize = 0;
  int ts = 0;
  std::string why = BloscHeader(src, n, want, &blocksize, &ts);
  if (!why.empty()) return why;
  std::vector<std::pair<int64_t, int64_t>> merged;
  if (!BloscMerged(ranges, want, blocksize, ts, &merged)) return Blosc(src, n, out, want);
  thread_local BloscCtx ctx;
  if (ctx.ctx == nullptr) return "c-blosc2 could not make a decompression context";
  thread_local std::vector<char> copy;
  src = AsBlosc1(src, n, blocksize, &copy);
  const int64_t step = blocksize >= (int64_t(64) << 10) ? blocksize : want;
  for (const auto &r : merged) {
    for (int64_t lo = r.first; lo < r.second; lo += step) {
      const int64_t len = std::min(r.second, lo + step) - lo;
      const int got = blosc2_getitem_bytes_ctx(ctx.ctx, src, static_cast<int32_t>(n), static_cast<int32_t>(lo),
                                               static_cast<int32_t>(len), out + lo, static_cast<int32_t>(len));
      if (got < 0) return "c-blosc2 failed to decode it (error " + Num(got) + ")";
      if (got != len) return "c-blosc2 decoded " + Num(got) + " bytes of a range of " + Num(len);
    }
  }
  return "";
}

// The end of block `j`'s streams in a Blosc1 chunk that is not memcpyed, read as c-blosc2's blosc_d
// reads them (c-blosc2 3.3.5): `nstreams` streams from `start`, each a little-endian int32 size c then
// c bytes (c > 0), nothing (c == 0: zeros) or one token byte (c < 0: a run). `inside(lo, hi)` says
// whether the bytes [lo, hi) of the chunk were read; -1 when a stream reaches bytes that were not
// (streams that overlap another block's, or run past the next block's start), or past `n`.
template <typename Inside>
int64_t BloscBlockEnd(const unsigned char *chunk, int64_t n, int64_t start, int nstreams, const Inside &inside) {
  int64_t pos = start;
  for (int s = 0; s < nstreams; s++) {
    if (pos + 4 > n || !inside(pos, pos + 4)) return -1;
    const int32_t c = static_cast<int32_t>(Le32(chunk + pos));
    pos += 4;
    const int64_t body = c > 0 ? c : (c < 0 ? 1 : 0);
    if (pos + body > n || !inside(pos, pos + body)) return -1;
    pos += body;
  }
  return pos;
}
#endif

#ifdef DALI_MESH_HAVE_ZSTD
std::string Zstd(const char *src, int64_t n, char *out, int64_t want) {
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
#endif

#ifdef DALI_MESH_HAVE_LZ4
std::string Lz4(const char *src, int64_t n, char *out, int64_t want) {
  if (n < 4) return "an LZ4 chunk of " + Num(n) + " bytes is shorter than its 4-byte size header";
  const auto *p = reinterpret_cast<const unsigned char *>(src);
  const int64_t declared = Le32(p);
  if (declared != want)
    return "its LZ4 header declares " + Num(declared) + " decoded bytes, not the chunk's " + Num(want);
  if (want > LZ4_MAX_INPUT_SIZE || n - 4 > INT32_MAX) return "an LZ4 chunk larger than LZ4 blocks can be";
  const int got = LZ4_decompress_safe(src + 4, out, static_cast<int>(n - 4), static_cast<int>(want));
  if (got < 0) return "liblz4 failed to decode it (a corrupt block)";
  if (got != want) return "liblz4 decoded " + Num(got) + " bytes, not " + Num(want);
  return "";
}
#endif

// A gzip chunk as numcodecs' GZip (Python's GzipFile) reads it: one or more members, each of which
// may be followed by zero bytes (padding); anything else after a member (garbage, a member cut
// short) is an error. `member(at, out, room, &used, &got)` inflates the member at src + at into out
// (room bytes at most), returning "" or why not.
template <typename Member>
std::string GzipMembers(const char *src, int64_t n, char *out, int64_t want, const Member &member) {
  int64_t at = 0, got = 0;
  while (true) {
    int64_t used = 0, made = 0;
    std::string why = member(at, out + got, want - got, &used, &made);
    if (!why.empty()) return why;
    at += used;
    got += made;
    while (at < n && src[at] == 0) at++;  // zero padding between or after members
    if (at >= n) break;
    if (n - at < 2 || static_cast<unsigned char>(src[at]) != 0x1f || static_cast<unsigned char>(src[at + 1]) != 0x8b)
      return "bytes after its gzip member at byte " + Num(at) + " are neither zeros nor another gzip member";
  }
  if (got != want) return "its gzip members hold " + Num(got) + " bytes, not the chunk's " + Num(want);
  return "";
}

#ifdef DALI_MESH_HAVE_DEFLATE
// gzip: gzip members (GzipMembers), else a zlib stream; bytes after a zlib stream are not read (as
// zlib's inflate and numcodecs' Zlib)
std::string Inflate(const char *src, int64_t n, char *out, int64_t want, bool gzip) {
  const char *what = gzip ? "gzip" : "zlib";
  struct Free {
    void operator()(libdeflate_decompressor *d) const { libdeflate_free_decompressor(d); }
  };
  thread_local std::unique_ptr<libdeflate_decompressor, Free> d(libdeflate_alloc_decompressor());
  if (!d) return std::string("libdeflate could not start a ") + what + " decoder";
  auto one = [&](int64_t at, char *dst, int64_t room, int64_t *used, int64_t *made) -> std::string {
    size_t in_used = 0, out_made = 0;
    const auto rc = gzip ? libdeflate_gzip_decompress_ex(d.get(), src + at, n - at, dst, room, &in_used, &out_made)
                         : libdeflate_zlib_decompress_ex(d.get(), src + at, n - at, dst, room, &in_used, &out_made);
    if (rc == LIBDEFLATE_INSUFFICIENT_SPACE)
      return std::string("its ") + what + " stream holds more than the chunk's " + Num(want) + " bytes";
    if (rc != LIBDEFLATE_SUCCESS)
      return std::string("libdeflate failed to decode it (a corrupt or truncated ") + what + " stream)";
    *used = static_cast<int64_t>(in_used);
    *made = static_cast<int64_t>(out_made);
    return "";
  };
  if (gzip) return GzipMembers(src, n, out, want, one);
  int64_t used = 0, made = 0;
  std::string why = one(0, out, want, &used, &made);
  if (!why.empty()) return why;
  if (made != want) return std::string("its ") + what + " stream holds " + Num(made) + " bytes, not the chunk's " + Num(want);
  return "";
}
#elif defined(DALI_MESH_HAVE_ZLIB)
// One zlib stream (window bits 15) or gzip member (31) from src[0..n) into out[0..room): its bytes
// used and made; "" or why not.
std::string InflateOne(const char *src, int64_t n, char *out, int64_t room, bool gzip, int64_t *used, int64_t *made) {
  const int window_bits = gzip ? 31 : 15;
  const char *what = gzip ? "gzip" : "zlib";
  z_stream zs;
  std::memset(&zs, 0, sizeof(zs));
  if (inflateInit2(&zs, window_bits) != Z_OK) return std::string("zlib could not start a ") + what + " stream";
  zs.next_in = reinterpret_cast<Bytef *>(const_cast<char *>(src));
  zs.next_out = reinterpret_cast<Bytef *>(out);
  // uInt counts: large chunks are fed in pieces
  int64_t in_left = n, out_left = room;
  int rc = Z_OK;
  while (rc == Z_OK) {
    const uInt in_now = static_cast<uInt>(std::min<int64_t>(in_left, 1 << 30));
    const uInt out_now = static_cast<uInt>(std::min<int64_t>(out_left, 1 << 30));
    zs.avail_in = in_now;
    zs.avail_out = out_now;
    rc = inflate(&zs, Z_NO_FLUSH);
    in_left -= in_now - zs.avail_in;
    out_left -= out_now - zs.avail_out;
    if (rc == Z_BUF_ERROR && out_left == 0) break;  // output full, stream not ended: more than declared
    if (rc == Z_BUF_ERROR && in_left == 0) break;   // input used up, stream not ended: truncated
    if (rc == Z_BUF_ERROR) rc = Z_OK;               // a piece boundary: go on
  }
  inflateEnd(&zs);
  *used = n - in_left;
  *made = room - out_left;
  if (rc == Z_STREAM_END) return "";
  if (rc == Z_BUF_ERROR && out_left == 0) return std::string("its ") + what + " stream holds more than the chunk's bytes";
  if (rc == Z_BUF_ERROR) return std::string("its ") + what + " stream is truncated";
  return std::string("zlib failed to decode it (") + (zs.msg ? zs.msg : what) + ")";
}

// gzip: gzip members (GzipMembers), else a zlib stream; bytes after a zlib stream are not read
std::string Inflate(const char *src, int64_t n, char *out, int64_t want, bool gzip) {
  if (gzip)
    return GzipMembers(src, n, out, want, [&](int64_t at, char *dst, int64_t room, int64_t *used, int64_t *made) {
      return InflateOne(src + at, n - at, dst, room, true, used, made);
    });
  int64_t used = 0, made = 0;
  std::string why = InflateOne(src, n, out, want, false, &used, &made);
  if (!why.empty()) return why;
  if (made != want) return "its zlib stream holds " + Num(made) + " bytes, not the chunk's " + Num(want);
  return "";
}
#endif

#ifdef DALI_MESH_HAVE_LZF
std::string Lzf(const char *src, int64_t n, char *out, int64_t want) {
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
#endif

#ifdef DALI_MESH_HAVE_SZIP
std::string Szip(const char *src, int64_t n, char *out, int64_t want, int64_t arg) {
  if (n < 4) return "an szip chunk of " + Num(n) + " bytes is shorter than its 4-byte size header";
  const auto *p = reinterpret_cast<const unsigned char *>(src);
  const int64_t declared = Le32(p);
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
#endif

std::string Decompress(int64_t id, int64_t arg, const char *src, int64_t n, char *out, int64_t want) {
  (void)arg, (void)src, (void)n, (void)out, (void)want;  // unused in a build without any codec library
  switch (id) {
#ifdef DALI_MESH_HAVE_BLOSC2
    case kCodecBlosc: return Blosc(src, n, out, want);
#endif
#ifdef DALI_MESH_HAVE_ZSTD
    case kCodecZstd: return Zstd(src, n, out, want);
#endif
#ifdef DALI_MESH_HAVE_LZ4
    case kCodecLz4: return Lz4(src, n, out, want);
#endif
#if defined(DALI_MESH_HAVE_DEFLATE) || defined(DALI_MESH_HAVE_ZLIB)
    case kCodecZlib: return Inflate(src, n, out, want, false);
    case kCodecGzip: return Inflate(src, n, out, want, true);
#endif
#ifdef DALI_MESH_HAVE_LZF
    case kCodecLzf: return Lzf(src, n, out, want);
#endif
#ifdef DALI_MESH_HAVE_SZIP
    case kCodecSzip: return Szip(src, n, out, want, arg);
#endif
    default: return std::string(CodecName(id)) + " is not in this build (" + CodecLibrary(id) + " was not found)";
  }
}

// HDF5's H5Z_filter_shuffle, reversed: byte j of element i was stored at j * count + i; the bytes
// after the last whole element are stored as they are. Element by element for the common sizes
// (the es source streams read in step and the output written in order: about memcpy's speed, four
// times a byte plane at a time, which strides the whole output es times).
template <int64_t ES>
void UnshuffleBy(const char *src, int64_t count, char *out) {
  for (int64_t i = 0; i < count; i++)
    for (int64_t j = 0; j < ES; j++) out[i * ES + j] = src[j * count + i];
}

void Unshuffle(const char *src, int64_t n, int64_t es, char *out) {
  if (es <= 1 || n < es) {
    std::memcpy(out, src, n);
    return;
  }
  const int64_t count = n / es;
  switch (es) {
    case 2: UnshuffleBy<2>(src, count, out); break;
    case 4: UnshuffleBy<4>(src, count, out); break;
    case 8: UnshuffleBy<8>(src, count, out); break;
    default:
      for (int64_t j = 0; j < es; j++) {
        const char *s = src + j * count;
        char *d = out + j;
        for (int64_t i = 0; i < count; i++, d += es) *d = s[i];
      }
  }
  std::memcpy(out + count * es, src + count * es, n - count * es);
}

}  // namespace

const char *CodecName(int64_t id) {
  switch (id) {
    case kCodecBlosc: return "blosc";
    case kCodecZstd: return "zstd";
    case kCodecLz4: return "lz4";
    case kCodecZlib: return "zlib";
    case kCodecGzip: return "gzip";
    case kCodecShuffle: return "shuffle";
    case kCodecFletcher32: return "fletcher32";
    case kCodecLzf: return "lzf";
    case kCodecSzip: return "szip";
    case kCodecCrc32c: return "crc32c";
    default: return "an unknown codec";
  }
}

const char *CodecLibrary(int64_t id) {
  switch (id) {
    case kCodecBlosc: return "c-blosc2";
    case kCodecZstd: return "libzstd";
    case kCodecLz4: return "liblz4";
    case kCodecZlib: case kCodecGzip: return "libdeflate or zlib";
    case kCodecLzf: return "liblzf";
    case kCodecSzip: return "libaec";
    case kCodecCrc32c: return "libcrc32c";
    default: return "";
  }
}

bool CodecAvailable(int64_t id) {
  switch (id) {
    case kCodecBlosc:
#ifdef DALI_MESH_HAVE_BLOSC2
      return true;
#else
      return false;
#endif
    case kCodecZstd:
#ifdef DALI_MESH_HAVE_ZSTD
      return true;
#else
      return false;
#endif
    case kCodecLz4:
#ifdef DALI_MESH_HAVE_LZ4
      return true;
#else
      return false;
#endif
    case kCodecZlib: case kCodecGzip:
#if defined(DALI_MESH_HAVE_DEFLATE) || defined(DALI_MESH_HAVE_ZLIB)
      return true;
#else
      return false;
#endif
    case kCodecLzf:
#ifdef DALI_MESH_HAVE_LZF
      return true;
#else
      return false;
#endif
    case kCodecSzip:
#ifdef DALI_MESH_HAVE_SZIP
      return true;
#else
      return false;
#endif
    case kCodecCrc32c:
#ifdef DALI_MESH_HAVE_CRC32C
      return true;
#else
      return false;
#endif
    case kCodecShuffle: case kCodecFletcher32: return true;
    default: return false;
  }
}

std::string CheckCoder(const Coder &coder) {
  if (coder.chunk_bytes < 0) return "a negative chunk size";
  int stage = 0;  // 0: checksums, 1: after the decompressor
  for (const auto &s : coder.steps) {
    if (!CodecAvailable(s.id)) {
      if (IsDecompressor(s.id) || s.id == kCodecCrc32c)
        return std::string(CodecName(s.id)) + " is not in this build (" + CodecLibrary(s.id) + ")";
      return "codec id " + Num(s.id) + " is unknown";
    }
    if (IsChecksum(s.id)) {
      if (stage != 0) return "a checksum after the decompressor";
    } else if (IsDecompressor(s.id)) {
      if (stage != 0) return "two decompressors";
      if (s.arg < 0 || (s.id == kCodecBlosc && s.arg > 255) ||
          (s.id != kCodecBlosc && s.id != kCodecSzip && s.arg != 0))
        return std::string(CodecName(s.id)) + " argument " + Num(s.arg);
      stage = 1;
    } else if (s.id == kCodecShuffle) {
      if (s.arg < 1 || s.arg > 1 << 20) return "shuffle element size " + Num(s.arg);
      stage = 1;  // size-keeping: nothing but more size-keeping steps may follow
    }
  }
  if (!coder.fill.empty() && coder.chunk_bytes % static_cast<int64_t>(coder.fill.size()))
    return "a fill value of " + Num(coder.fill.size()) + " bytes for a chunk of " + Num(coder.chunk_bytes);
  return "";
}

void MergeRanges(std::vector<std::pair<int64_t, int64_t>> *ranges) {
  std::sort(ranges->begin(), ranges->end());
  size_t k = 0;
  for (size_t i = 0; i < ranges->size(); i++) {
    if (k && (*ranges)[i].first <= (*ranges)[k - 1].second) {
      (*ranges)[k - 1].second = std::max((*ranges)[k - 1].second, (*ranges)[i].second);
    } else {
      (*ranges)[k++] = (*ranges)[i];
    }
  }
  ranges->resize(k);
}

bool MayReadInParts(const Coder &coder, int64_t n, const std::vector<std::pair<int64_t, int64_t>> &ranges,
                    int64_t min_stored) {
#ifdef DALI_MESH_HAVE_BLOSC2
  if (!OneBloscStep(coder) || n < min_stored) return false;
  int64_t covered = 0;
  for (const auto &r : ranges) covered += r.second - r.first;
  return covered * 4 < coder.chunk_bytes * 3;
#else
  (void)coder, (void)n, (void)ranges, (void)min_stored;
  return false;
#endif
}

namespace {

#ifdef DALI_MESH_HAVE_BLOSC2
// A Blosc chunk's layout as a read in parts needs it, from its header: the runs of whole blocks to
// decode and where the block index ends.
struct BloscLayout {
  int32_t blocksize = 0;
  int ts = 0;
  bool memcpyed = false, splits = false;  // splits: BloscSplits
  int64_t nblocks = 0, index_end = 0;
  std::vector<std::pair<int64_t, int64_t>> merged;  // the runs of whole blocks to decode (BloscMerged)
};

// false when the chunk is to be read whole (not a chunk a part of which is enough, or a header or
// index that is not sound: decoded whole, its error is DecodeChunk's)
bool BloscLayoutOf(const Coder &coder, const char *head, int64_t n, const std::vector<std::pair<int64_t, int64_t>> &ranges,
                   BloscLayout *l) {
  if (!OneBloscStep(coder) || coder.chunk_bytes > INT32_MAX) return false;
  const int64_t want = coder.chunk_bytes;
  if (!BloscHeader(head, n, want, &l->blocksize, &l->ts).empty()) return false;
  if (!BloscMerged(ranges, want, l->blocksize, l->ts, &l->merged)) return false;
  const auto *h = reinterpret_cast<const unsigned char *>(head);
  l->memcpyed = h[2] & 0x02;
  l->splits = BloscSplits(h, l->blocksize);
  l->nblocks = (want + l->blocksize - 1) / l->blocksize;
  l->index_end = int64_t{BLOSC_MIN_HEADER_LENGTH} + (l->memcpyed ? 0 : 4 * l->nblocks);
  return l->index_end <= n;
}

// Which stored bytes of the chunk at `at` (its header and block index read) a decode of `l`'s runs
// reads: the header, the index and each touched block from its start to the next start above it (or
// the chunk's end); false for a corrupt index (decoded whole, its error). A block whose streams reach
// further (streams that overlap, valid for c-blosc) is found by StreamsWereRead.
bool StoredParts(const BloscLayout &l, const char *at, int64_t n, std::vector<std::pair<int64_t, int64_t>> *stored) {
  constexpr int64_t kHeader = BLOSC_MIN_HEADER_LENGTH;  // 16: a Blosc1 chunk's header
  stored->assign(1, {0, l.index_end});
  if (l.memcpyed) {  // the decoded bytes follow the header as they are
    for (const auto &r : l.merged) stored->push_back({kHeader + r.first, kHeader + r.second});
    MergeRanges(stored);
    return true;
  }
  const auto *h = reinterpret_cast<const unsigned char *>(at);
  std::vector<int64_t> starts(l.nblocks);
  for (int64_t j = 0; j < l.nblocks; j++) {
    starts[j] = Le32(h + kHeader + 4 * j);
    if (starts[j] < l.index_end || starts[j] >= n) return false;
  }
  std::vector<int64_t> sorted = starts;
  std::sort(sorted.begin(), sorted.end());
  for (const auto &r : l.merged) {
    for (int64_t j = r.first / l.blocksize; j <= (r.second - 1) / l.blocksize; j++) {
      const auto next = std::upper_bound(sorted.begin(), sorted.end(), starts[j]);
      stored->push_back({starts[j], next == sorted.end() ? n : *next});
    }
  }
  MergeRanges(stored);
  return true;
}

// Sorted, disjoint ranges: whether [lo, hi) lies inside one of them.
bool Inside(const std::vector<std::pair<int64_t, int64_t>> &have, int64_t lo, int64_t hi) {
  if (lo >= hi) return true;
  auto it = std::upper_bound(have.begin(), have.end(), std::make_pair(lo, INT64_MAX));
  return it != have.begin() && std::prev(it)->first <= lo && hi <= std::prev(it)->second;
}

// Whether the stored bytes `read` (sorted, disjoint ranges of the chunk at `at`, its parts read as
// StoredParts names them) hold every byte c-blosc2 reads to decode `l`'s runs: each touched block's
// streams, walked as c-blosc2 walks them.
bool StreamsWereRead(const BloscLayout &l, const char *at, int64_t n, int64_t want,
                     const std::vector<std::pair<int64_t, int64_t>> &read) {
  if (l.memcpyed) return true;  // StoredParts read every byte the runs take
  const auto *h = reinterpret_cast<const unsigned char *>(at);
  for (const auto &r : l.merged) {
    for (int64_t j = r.first / l.blocksize; j <= (r.second - 1) / l.blocksize; j++) {
      const bool leftover = j == l.nblocks - 1 && want % l.blocksize != 0;
      const int nstreams = (l.splits && !leftover) ? l.ts : 1;
      const int64_t start = Le32(h + BLOSC_MIN_HEADER_LENGTH + 4 * j);
      if (BloscBlockEnd(h, n, start, nstreams, [&](int64_t lo, int64_t hi) { return Inside(read, lo, hi); }) < 0)
        return false;
    }
  }
  return true;
}
#endif

}  // namespace

bool ReadStored(const Coder &coder, int64_t n, const std::vector<std::pair<int64_t, int64_t>> *ranges, char *at,
                const StoredReader &read, int64_t min_stored) {
#ifdef DALI_MESH_HAVE_BLOSC2
  if (ranges && MayReadInParts(coder, n, *ranges, min_stored)) {
    // a Blosc chunk whose blocks the ranges touch only some of: its header and block index, then
    // those blocks' stored bytes; whole when a touched block's streams reach bytes not read (never
    // decode the stale bytes of a reused buffer)
    int64_t have = std::min<int64_t>(n, 4096);  // the chunk's leading bytes read so far
    read(0, have);
    BloscLayout l;
    std::vector<std::pair<int64_t, int64_t>> parts;
    if (have >= BLOSC_MIN_HEADER_LENGTH && BloscLayoutOf(coder, at, n, *ranges, &l)) {
      if (l.index_end > have) {  // a longer index
        read(have, l.index_end);
        have = l.index_end;
      }
      if (StoredParts(l, at, n, &parts)) {
        for (const auto &p : parts)
          if (p.second > have) read(std::max(p.first, have), p.second);
        parts.push_back({0, have});
        MergeRanges(&parts);
        if (StreamsWereRead(l, at, n, coder.chunk_bytes, parts)) return true;
      }
    }
    read(have, n);
    return false;
  }
#endif
  (void)coder, (void)ranges, (void)at, (void)min_stored;
  read(0, n);
  return false;
}

std::string DecodeChunkRanges(const Coder &coder, const char *src, int64_t n, char *out,
                              const std::vector<std::pair<int64_t, int64_t>> &ranges) {
#ifdef DALI_MESH_HAVE_BLOSC2
  if (OneBloscStep(coder) && coder.chunk_bytes <= INT32_MAX)
    return BloscRanges(src, n, out, coder.chunk_bytes, ranges);
#endif
  // every other coder decodes the whole chunk, whose size is then checked: a Zstd frame, say,
  // could be decoded only up to the ranges' end, but the blocks before it do not state their
  // decoded sizes, so a corrupt block could shift the bytes decoded after it unseen (the frame's
  // declared size, checked at its end, is what catches that)
  (void)ranges;
  return DecodeChunk(coder, src, n, out);
}

std::string DecodeChunk(const Coder &coder, const char *src, int64_t n, char *out) {
  const int64_t want = coder.chunk_bytes;
  // the stored bytes after the checksums, then the decompressor's output; `out` is the last step's
  thread_local std::vector<char> tmp;
  const char *cur = src;
  int64_t size = n;
  size_t k = 0;
  for (; k < coder.steps.size() && IsChecksum(coder.steps[k].id); k++) {
    const bool crc = coder.steps[k].id == kCodecCrc32c;
    const char *what = crc ? "crc32c" : "Fletcher-32";
    if (size < 4) return "a chunk of " + Num(size) + " bytes has no room for its " + what + " checksum";
    size -= 4;
    const auto *b = reinterpret_cast<const unsigned char *>(cur);
    const uint32_t stored = Le32(b + size);
    if (crc) {
#ifdef DALI_MESH_HAVE_CRC32C
      if (crc32c_value(b, static_cast<size_t>(size)) != stored)
        return "its crc32c checksum does not match (the chunk is corrupt)";
#endif
      continue;
    }
    const uint32_t sum = Fletcher32(b, size);
    // HDF5 accepts the sum with its bytes swapped in pairs too (written by old big-endian builds)
    const uint32_t swapped = ((sum & 0x00ff00ffu) << 8) | ((sum & 0xff00ff00u) >> 8);
    if (stored != sum && stored != swapped) return "its Fletcher-32 checksum does not match (the chunk is corrupt)";
  }
  // the steps left: [decompressor] then size-keeping steps, each into out or tmp so that the last
  // one lands in out
  const size_t left = coder.steps.size() - k;
  if (left == 0) {
    if (size != want) return "a chunk of " + Num(size) + " stored bytes, not the " + Num(want) + " of a raw chunk";
    std::memcpy(out, cur, want);
    return "";
  }
  for (size_t s = k; s < coder.steps.size(); s++) {
    const CodecStep &step = coder.steps[s];
    // the destination: out and tmp by turns, counted back from the last step (into out), so that no
    // step writes over its own source and none copies its source aside
    char *dst = out;
    if ((coder.steps.size() - 1 - s) % 2) {
      tmp.resize(want);
      dst = tmp.data();
    }
    if (IsDecompressor(step.id)) {
      std::string err = Decompress(step.id, step.arg, cur, size, dst, want);
      if (!err.empty()) return err;
    } else {
      if (size != want) return "a chunk of " + Num(size) + " bytes before " + CodecName(step.id) + ", not " + Num(want);
      if (step.id == kCodecShuffle) Unshuffle(cur, size, step.arg, dst);
    }
    cur = dst;
    size = want;
  }
  return "";
}

void FillMissingChunk(const Coder &coder, char *out) {
  const int64_t n = coder.chunk_bytes, es = coder.fill.size();
  if (es == 0) {
    std::memset(out, 0, n);
    return;
  }
  for (int64_t i = 0; i + es <= n; i += es) std::memcpy(out + i, coder.fill.data(), es);
}

}  // namespace dali_mesh
