// dali_mesh: element types and value conversions, shared by the CPU and GPU code paths.
//
// DALI-free on purpose: the C entry-point library (libdali_mesh_kernels.so) is built from the same
// headers without DALI, and every function here compiles for host and device.
//
// Conversion rules (the operator's `dtype` cast, as DALI's fn.cast):
//   * to an integer type: floats are rounded to nearest (ties to even) and saturated; NaN -> 0;
//     integers are saturated; bool in -> 0/1.
//   * to a floating type: IEEE round to nearest (overflow -> inf), as numpy's astype.
//     float16 is rounded once, directly from the exact value (no double rounding).
//   * to bool: value != 0.
#ifndef DALI_MESH_DM_TYPES_H_
#define DALI_MESH_DM_TYPES_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__CUDACC__)
#define DM_HD __host__ __device__
#define DM_FORCEINLINE __forceinline__
#else
#define DM_HD
#define DM_FORCEINLINE inline __attribute__((always_inline))
#endif

namespace dali_mesh {

// Type ids: the numbers of DALI's DALIDataType, so that they cross the C API unchanged.
enum DType : int {
  kUInt8 = 0,
  kUInt16 = 1,
  kUInt32 = 2,
  kUInt64 = 3,
  kInt8 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kFloat16 = 8,
  kFloat32 = 9,
  kFloat64 = 10,
  kBool = 11,
};
constexpr int kNumDTypes = 12;

DM_HD inline int DTypeSize(int t) {
  switch (t) {
    case kUInt8: case kInt8: case kBool: return 1;
    case kUInt16: case kInt16: case kFloat16: return 2;
    case kUInt32: case kInt32: case kFloat32: return 4;
    case kUInt64: case kInt64: case kFloat64: return 8;
    default: return 0;
  }
}

inline const char *DTypeName(int t) {
  switch (t) {
    case kUInt8: return "uint8";
    case kUInt16: return "uint16";
    case kUInt32: return "uint32";
    case kUInt64: return "uint64";
    case kInt8: return "int8";
    case kInt16: return "int16";
    case kInt32: return "int32";
    case kInt64: return "int64";
    case kFloat16: return "float16";
    case kFloat32: return "float32";
    case kFloat64: return "float64";
    case kBool: return "bool";
    default: return "unknown";
  }
}

DM_HD inline bool IsFloatDType(int t) { return t == kFloat16 || t == kFloat32 || t == kFloat64; }

// IEEE binary16 kept as its bits: conversions are done here, identically on host and device.
struct f16 {
  uint16_t bits;
};

DM_HD DM_FORCEINLINE uint64_t DoubleBits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof(u));
  return u;
}

DM_HD DM_FORCEINLINE float FloatFromBits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

// binary16 -> float: exact.
DM_HD inline float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // normal: rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;  // +-0
  } else {
    // subnormal: value = mant * 2^-24; normalise into a float
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400u) == 0);
    bits = sign | static_cast<uint32_t>(112 - e) << 23 | ((mant & 0x3ffu) << 13);
  }
  return FloatFromBits(bits);
}

// double -> binary16, rounded once to nearest, ties to even; overflow -> inf.
DM_HD inline uint16_t DoubleToHalf(double d) {
  uint64_t u = DoubleBits(d);
  uint16_t sign = static_cast<uint16_t>((u >> 48) & 0x8000u);
  int exp = static_cast<int>((u >> 52) & 0x7ff);
  uint64_t mant = u & ((uint64_t(1) << 52) - 1);
  if (exp == 0x7ff)  // inf or NaN (NaN stays a quiet NaN)
    return sign | 0x7c00u | (mant ? 0x200u : 0u);
  int e = exp - 1023;  // unbiased exponent of the double (subnormal doubles round to 0 below)
  if (e > 15) return sign | 0x7c00u;
  if (e >= -14) {  // normal half (rounding may carry into the exponent, up to inf: correct)
    uint32_t h = static_cast<uint32_t>(e + 15) << 10 | static_cast<uint32_t>(mant >> 42);
    uint64_t rem = mant & ((uint64_t(1) << 42) - 1);
    const uint64_t half = uint64_t(1) << 41;
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  if (exp == 0) return sign;  // double subnormal or zero: far below half's range
  // subnormal half: units of 2^-24; value = m * 2^(e - 52), m has 53 bits
  uint64_t m = mant | (uint64_t(1) << 52);
  int shift = 28 - e;  // e = -15 -> 43 ... ; > 53 means < 2^-25 (rounds to 0 unless above half ulp)
  if (shift > 63) return sign;
  uint64_t q = m >> shift;
  uint64_t rem = m & ((uint64_t(1) << shift) - 1);
  uint64_t halfway = uint64_t(1) << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));
}

// float -> binary16, rounded to nearest even with 32-bit integer ops (F. Giesen's
// float_to_half_fast3_rtne); equals DoubleToHalf((double)f) for every float.
DM_HD inline uint16_t FloatToHalf(float value) {
  uint32_t f;
  memcpy(&f, &value, sizeof(f));
  const uint32_t sign = f & 0x80000000u;
  f ^= sign;
  uint16_t o;
  if (f >= (127u + 16u) << 23) {  // >= 65536 (or inf / NaN): inf, or a quiet NaN
    o = f > (255u << 23) ? 0x7e00u : 0x7c00u;
  } else if (f < (113u << 23)) {  // subnormal half or zero: let the FPU round (nearest even)
    const uint32_t magic_bits = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    float m = FloatFromBits(magic_bits);
    float v = FloatFromBits(f) + m;
    uint32_t vb;
    memcpy(&vb, &v, sizeof(vb));
    o = static_cast<uint16_t>(vb - magic_bits);
  } else {
    const uint32_t mant_odd = (f >> 13) & 1u;
    f += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;  // rebias, rounding bias part 1
    f += mant_odd;                                          // part 2: ties to even
    o = static_cast<uint16_t>(f >> 13);
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}

// ---- saturating conversions from the three canonical value kinds --------------------------------
template <typename T>
struct IntLimits {
  static constexpr T lo = std::numeric_limits<T>::min();
  static constexpr T hi = std::numeric_limits<T>::max();
};

template <typename Out>
struct Convert {
  // Out is an integer type (the specialisations below cover floats, f16 and bool).
  DM_HD static Out FromDouble(double x) {
    if (x != x) return Out(0);
    if (x <= static_cast<double>(IntLimits<Out>::lo)) return IntLimits<Out>::lo;
    // (double)hi rounds up to 2^bits for 64-bit types: x >= that is out of range
    if (x >= static_cast<double>(IntLimits<Out>::hi)) return IntLimits<Out>::hi;
    return static_cast<Out>(rint(x));
  }
  DM_HD static Out FromInt64(int64_t x) {
    if (std::numeric_limits<Out>::is_signed) {
      if (x < static_cast<int64_t>(IntLimits<Out>::lo)) return IntLimits<Out>::lo;
      if (x > static_cast<int64_t>(IntLimits<Out>::hi)) return IntLimits<Out>::hi;
      return static_cast<Out>(x);
    }
    if (x < 0) return Out(0);
    if (static_cast<uint64_t>(x) > static_cast<uint64_t>(IntLimits<Out>::hi)) return IntLimits<Out>::hi;
    return static_cast<Out>(x);
  }
  DM_HD static Out FromUInt64(uint64_t x) {
    if (x > static_cast<uint64_t>(IntLimits<Out>::hi)) return IntLimits<Out>::hi;
    return static_cast<Out>(x);
  }
};

template <>
struct Convert<float> {
  DM_HD static float FromDouble(double x) { return static_cast<float>(x); }
  DM_HD static float FromInt64(int64_t x) { return static_cast<float>(x); }
  DM_HD static float FromUInt64(uint64_t x) { return static_cast<float>(x); }
};

template <>
struct Convert<double> {
  DM_HD static double FromDouble(double x) { return x; }
  DM_HD static double FromInt64(int64_t x) { return static_cast<double>(x); }
  DM_HD static double FromUInt64(uint64_t x) { return static_cast<double>(x); }
};

template <>
struct Convert<f16> {
  DM_HD static f16 FromDouble(double x) { return f16{DoubleToHalf(x)}; }
  // |x| > 2^53 would round in (double)x, but any such value is inf in half: the result is exact.
  DM_HD static f16 FromInt64(int64_t x) { return f16{DoubleToHalf(static_cast<double>(x))}; }
  DM_HD static f16 FromUInt64(uint64_t x) { return f16{DoubleToHalf(static_cast<double>(x))}; }
};

template <>
struct Convert<bool> {
  DM_HD static bool FromDouble(double x) { return x != 0; }
  DM_HD static bool FromInt64(int64_t x) { return x != 0; }
  DM_HD static bool FromUInt64(uint64_t x) { return x != 0; }
};

// Value kinds an input element is loaded into (each holds every value of its types exactly).
enum ValueKind : int { kKindInt = 0, kKindUInt = 1, kKindFloat = 2 };

template <typename In>
struct Load;  // Load<In>::kind, Load<In>::Get(ptr) -> int64_t / uint64_t / double

#define DM_LOAD_AS(T, KIND, R)                                                  \
  template <>                                                                   \
  struct Load<T> {                                                              \
    static constexpr int kind = KIND;                                           \
    using type = R;                                                             \
    DM_HD static R Get(const T *p) { return static_cast<R>(*p); }               \
  };
DM_LOAD_AS(int8_t, kKindInt, int64_t)
DM_LOAD_AS(int16_t, kKindInt, int64_t)
DM_LOAD_AS(int32_t, kKindInt, int64_t)
DM_LOAD_AS(int64_t, kKindInt, int64_t)
DM_LOAD_AS(uint8_t, kKindUInt, uint64_t)
DM_LOAD_AS(uint16_t, kKindUInt, uint64_t)
DM_LOAD_AS(uint32_t, kKindUInt, uint64_t)
DM_LOAD_AS(uint64_t, kKindUInt, uint64_t)
DM_LOAD_AS(float, kKindFloat, double)
DM_LOAD_AS(double, kKindFloat, double)
#undef DM_LOAD_AS

template <>
struct Load<bool> {
  static constexpr int kind = kKindUInt;
  using type = uint64_t;
  // read the byte, not a bool: a bool holding another bit pattern would be UB
  DM_HD static uint64_t Get(const bool *p) {
    return *reinterpret_cast<const uint8_t *>(p) != 0 ? 1u : 0u;
  }
};

template <>
struct Load<f16> {
  static constexpr int kind = kKindFloat;
  using type = double;
  DM_HD static double Get(const f16 *p) { return static_cast<double>(HalfToFloat(p->bits)); }
};

// Out <- one loaded value, dispatched on the value's C++ type.
template <typename Out>
DM_HD DM_FORCEINLINE Out ConvertValue(int64_t v) { return Convert<Out>::FromInt64(v); }
template <typename Out>
DM_HD DM_FORCEINLINE Out ConvertValue(uint64_t v) { return Convert<Out>::FromUInt64(v); }
template <typename Out>
DM_HD DM_FORCEINLINE Out ConvertValue(double v) { return Convert<Out>::FromDouble(v); }

// The value of an element, as float32 (for normalisation).
DM_HD DM_FORCEINLINE float ToFloat(int64_t v) { return static_cast<float>(v); }
DM_HD DM_FORCEINLINE float ToFloat(uint64_t v) { return static_cast<float>(v); }
DM_HD DM_FORCEINLINE float ToFloat(double v) { return static_cast<float>(v); }

// Calls f(T*) with the C++ type of a DType (a null pointer of that type, for deduction).
#define DM_TYPE_SWITCH(dtype, T, ...)                   \
  switch (dtype) {                                      \
    case ::dali_mesh::kUInt8: { using T = uint8_t; __VA_ARGS__; break; }   \
    case ::dali_mesh::kUInt16: { using T = uint16_t; __VA_ARGS__; break; } \
    case ::dali_mesh::kUInt32: { using T = uint32_t; __VA_ARGS__; break; } \
    case ::dali_mesh::kUInt64: { using T = uint64_t; __VA_ARGS__; break; } \
    case ::dali_mesh::kInt8: { using T = int8_t; __VA_ARGS__; break; }     \
    case ::dali_mesh::kInt16: { using T = int16_t; __VA_ARGS__; break; }   \
    case ::dali_mesh::kInt32: { using T = int32_t; __VA_ARGS__; break; }   \
    case ::dali_mesh::kInt64: { using T = int64_t; __VA_ARGS__; break; }   \
    case ::dali_mesh::kFloat16: { using T = ::dali_mesh::f16; __VA_ARGS__; break; } \
    case ::dali_mesh::kFloat32: { using T = float; __VA_ARGS__; break; }   \
    case ::dali_mesh::kFloat64: { using T = double; __VA_ARGS__; break; }  \
    case ::dali_mesh::kBool: { using T = bool; __VA_ARGS__; break; }       \
    default: break;                                     \
  }

}  // namespace dali_mesh

#endif  // DALI_MESH_DM_TYPES_H_
