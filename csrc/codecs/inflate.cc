// dali_mesh: the zlib and gzip codecs (numcodecs Zlib and GZip, HDF5 deflate, Zarr v3 gzip): a zlib
// stream or gzip members, inflated by libdeflate where it is in the build (about twice zlib's speed:
// it inflates a whole stream into a buffer of known size, as a chunk is), else by zlib.
#include "codecs/codec_table.h"

#if defined(DALI_MESH_HAVE_DEFLATE) || defined(DALI_MESH_HAVE_ZLIB)
#ifdef DALI_MESH_HAVE_DEFLATE
#include <libdeflate.h>
#else
#include <zlib.h>
#endif

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "codecs/codec_util.h"

namespace dali_mesh {

namespace {

using detail::Num;

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

std::string Zlib(const char *src, int64_t n, char *out, int64_t want, int64_t) { return Inflate(src, n, out, want, false); }

std::string Gzip(const char *src, int64_t n, char *out, int64_t want, int64_t) { return Inflate(src, n, out, want, true); }

}  // namespace

DM_REGISTER_DECODER(Zlib, .decode = Zlib, .arg_ok = detail::NoArgument)

DM_REGISTER_DECODER(Gzip, .decode = Gzip, .arg_ok = detail::NoArgument)

}  // namespace dali_mesh

#else

namespace dali_mesh {
DM_NO_DECODER(Zlib)
DM_NO_DECODER(Gzip)
}  // namespace dali_mesh

#endif  // DALI_MESH_HAVE_DEFLATE || DALI_MESH_HAVE_ZLIB
