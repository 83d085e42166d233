// dali_mesh: what the codecs' files share (csrc/codecs/, internal): numbers in messages and the
// little-endian words of their formats.
#ifndef DALI_MESH_CODECS_CODEC_UTIL_H_
#define DALI_MESH_CODECS_CODEC_UTIL_H_

#include <cstdint>
#include <string>

namespace dali_mesh::detail {

inline std::string Num(int64_t v) { return std::to_string(v); }

// The little-endian 32-bit word at `p` (size headers, checksums, Blosc header fields and block starts).
inline uint32_t Le32(const unsigned char *p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

// A step that takes no argument: 0 only (CodecDecoder::arg_ok).
inline bool NoArgument(int64_t arg) { return arg == 0; }

}  // namespace dali_mesh::detail

#endif  // DALI_MESH_CODECS_CODEC_UTIL_H_
