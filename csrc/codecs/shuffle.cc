// dali_mesh: the shuffle codec (HDF5 byte shuffle), a size-keeping step after the decompressor; the
// step's argument is the element size. Built in.
#include <cstring>
#include <string>

#include "codecs/codec_table.h"

namespace dali_mesh {

namespace {

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

std::string DecodeShuffle(const char *src, int64_t n, char *out, int64_t, int64_t es) {
  Unshuffle(src, n, es, out);
  return "";
}

bool ElementSize(int64_t arg) { return arg >= 1 && arg <= 1 << 20; }

}  // namespace

DM_REGISTER_DECODER(Shuffle, .decode = DecodeShuffle, .arg_ok = ElementSize, .arg_name = "element size")

}  // namespace dali_mesh
