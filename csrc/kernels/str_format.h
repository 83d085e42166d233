// dali_mesh: lists and shapes as text, for the error messages of argument validation (host only).
#ifndef DALI_MESH_STR_FORMAT_H_
#define DALI_MESH_STR_FORMAT_H_

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace dali_mesh {

// "[a, b, c]"
template <typename T>
std::string ListStr(const std::vector<T> &v) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < v.size(); i++) s << (i ? ", " : "") << v[i];
  s << "]";
  return s.str();
}

// "(a, b, c)", "(a,)" for one axis: as Python prints a shape tuple.
inline std::string ShapeStr(const int64_t *shape, int ndim) {
  std::ostringstream s;
  s << "(";
  for (int i = 0; i < ndim; i++) s << (i ? ", " : "") << shape[i];
  if (ndim == 1) s << ",";
  s << ")";
  return s.str();
}

inline std::string ShapeStr(const std::vector<int64_t> &v) {
  return ShapeStr(v.data(), static_cast<int>(v.size()));
}

}  // namespace dali_mesh

#endif  // DALI_MESH_STR_FORMAT_H_
