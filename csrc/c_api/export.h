// dali_mesh: what the C entry points of libdali_mesh_kernels.so (csrc/c_api/) share: the export
// attribute, the error convention (a message copied into the caller's err[0..err_len)) and the text
// convention (CopyText).
#ifndef DALI_MESH_C_API_EXPORT_H_
#define DALI_MESH_C_API_EXPORT_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#define DM_EXPORT extern "C" __attribute__((visibility("default")))

namespace dali_mesh::c_api {

// Copies `msg` into err[0..err_len) (cut to fit, NUL-terminated; nothing when err is null) and
// returns -1, the entry points' failure value.
inline int Fail(const std::string &msg, char *err, int64_t err_len) {
  if (err && err_len > 0) {
    const size_t n = std::min(msg.size(), static_cast<size_t>(err_len - 1));
    std::memcpy(err, msg.data(), n);
    err[n] = '\0';
  }
  return -1;
}

// The text convention of the entry points that return text: returns its length n, and writes it and
// a NUL to out[0..out_size) only when out_size > n (the caller asks again with n + 1 bytes).
inline int64_t CopyText(const std::string &text, char *out, int64_t out_size) {
  const int64_t n = static_cast<int64_t>(text.size());
  if (out && out_size > n) {
    std::memcpy(out, text.data(), text.size());
    out[n] = '\0';
  }
  return n;
}

}  // namespace dali_mesh::c_api

#endif  // DALI_MESH_C_API_EXPORT_H_
