// dali_mesh: the fletcher32 codec (HDF5 Fletcher-32): the last 4 bytes checksum the others. Built in.
#include <cstddef>
#include <cstdint>
#include <string>

#include "codecs/codec_table.h"

namespace dali_mesh {

namespace {

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

std::string Verify(const unsigned char *data, int64_t n, uint32_t stored) {
  const uint32_t sum = Fletcher32(data, n);
  // HDF5 accepts the sum with its bytes swapped in pairs too (written by old big-endian builds)
  const uint32_t swapped = ((sum & 0x00ff00ffu) << 8) | ((sum & 0xff00ff00u) >> 8);
  if (stored != sum && stored != swapped) return "its Fletcher-32 checksum does not match (the chunk is corrupt)";
  return "";
}

}  // namespace

DM_REGISTER_DECODER(Fletcher32, .verify = Verify, .label = "Fletcher-32")

}  // namespace dali_mesh
