// dali_mesh: the crc32c codec (Zarr v3 crc32c): the last 4 bytes, little-endian, are the CRC-32C of
// the others, by Google's crc32c library (as the google-crc32c wheel ships it).
#include "codecs/codec_table.h"

#ifdef DALI_MESH_HAVE_CRC32C
#include <cstddef>
#include <cstdint>
#include <string>

// Google's crc32c library (crc32c/crc32c.h, its C API; the google-crc32c wheel ships the library
// without the header)
extern "C" uint32_t crc32c_value(const uint8_t *data, size_t count);

namespace dali_mesh {

namespace {

std::string Verify(const unsigned char *data, int64_t n, uint32_t stored) {
  if (crc32c_value(data, static_cast<size_t>(n)) != stored) return "its crc32c checksum does not match (the chunk is corrupt)";
  return "";
}

}  // namespace

DM_REGISTER_DECODER(Crc32c, .verify = Verify)

}  // namespace dali_mesh

#else

namespace dali_mesh {
DM_NO_DECODER(Crc32c)
}  // namespace dali_mesh

#endif  // DALI_MESH_HAVE_CRC32C
