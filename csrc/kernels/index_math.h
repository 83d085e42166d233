// dali_mesh: the index math of the strided, boundary-aware slice. One header for both backends:
// every function is __host__ __device__ (the CPU kernel, the GPU kernel and the host emulation of
// the GPU kernel all call these).
//
// Positions are relative to the domain start of an axis of n cells; callers keep |r| and n below
// 2**62 (kMaxPosition, checked by MakeSliceSample), so r +- n and 2 * n cannot overflow. A
// position r outside [0, n) is mapped as numpy's np.pad maps it (any number of periods):
//   constant  -> -1 (the fill value)         periodic  -> r mod n        (np.pad "wrap")
//   reflect   -> period 2n-2, edge not repeated (n == 1 repeats the value)
//   symmetric -> period 2n, edge repeated     edge      -> clamp to [0, n-1]
#ifndef DALI_MESH_INDEX_MATH_H_
#define DALI_MESH_INDEX_MATH_H_

#include <cstdint>

#include "kernels/dm_types.h"

namespace dali_mesh {

constexpr int kMaxDims = 8;

enum Boundary : uint8_t {
  kConstant = 0,
  kPeriodic = 1,
  kReflect = 2,
  kSymmetric = 3,
  kEdge = 4,
  kTrim = 5,  // mesh_roi only: the window is clipped to the domain (strided_slice rejects it)
};

// One unsigned compare for 0 <= r < n.
DM_HD DM_FORCEINLINE bool InRange(int64_t r, int64_t n) {
  return static_cast<uint64_t>(r) < static_cast<uint64_t>(n);
}

DM_HD DM_FORCEINLINE int64_t FloorMod(int64_t r, int64_t p) {
  int64_t m = r % p;
  return m < 0 ? m + p : m;
}

// Source index of position r on an axis of n >= 1 cells, or -1 for a constant fill.
// Positions within one period of the edges need no division (the common halo case).
DM_HD inline int64_t BoundaryIndex(int64_t r, int64_t n, int mode) {
  if (InRange(r, n)) return r;
  switch (mode) {
    case kPeriodic:
      if (r < 0 && r >= -n) return r + n;
      if (r >= n && r < 2 * n) return r - n;
      return FloorMod(r, n);
    case kReflect: {
      if (n == 1) return 0;
      if (r < 0 && -r < n) return -r;
      if (r >= n && r <= 2 * n - 2) return 2 * n - 2 - r;
      int64_t p = 2 * n - 2;
      int64_t m = FloorMod(r, p);
      return m < n ? m : p - m;
    }
    case kSymmetric: {
      if (r < 0 && r >= -n) return -r - 1;
      if (r >= n && r < 2 * n) return 2 * n - 1 - r;
      int64_t p = 2 * n;
      int64_t m = FloorMod(r, p);
      return m < n ? m : p - 1 - m;
    }
    case kEdge:
      return r < 0 ? 0 : n - 1;
    default:  // constant (and trim, whose windows never leave the domain)
      return -1;
  }
}

DM_HD DM_FORCEINLINE uint64_t MulHi64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

// Division by an invariant 64-bit divisor with a multiply-high (Granlund & Montgomery 1994, fig. 4.1):
//   l = ceil(log2 d), m = floor(2^64 (2^l - d) / d) + 1, q = (t + ((n - t) >> s1)) >> s2, t = mulhi(m, n)
// exact for every n < 2^64 and d >= 1. Set up on the host, used on either side.
struct FastDivU64 {
  uint64_t divisor;
  uint64_t mul;
  uint32_t shift1;
  uint32_t shift2;

  void Init(uint64_t d) {  // host only (128-bit division); d >= 1
    divisor = d;
    int l = 0;
    while (l < 64 && (uint64_t(1) << l) < d) ++l;  // ceil(log2 d)
    unsigned __int128 two_l = static_cast<unsigned __int128>(1) << l;
    unsigned __int128 num = (two_l - d) << 64;
    mul = static_cast<uint64_t>(num / d) + 1;
    shift1 = l < 1 ? l : 1;
    shift2 = l > 1 ? l - 1 : 0;
  }

  DM_HD DM_FORCEINLINE uint64_t Div(uint64_t n) const {
    uint64_t t = MulHi64(mul, n);
    return (t + ((n - t) >> shift1)) >> shift2;
  }
};

// A run of output positions [out_begin, out_begin + length) on one axis whose sources form an
// arithmetic sequence src_begin + k * src_step (src_begin < 0: constant fill; src_step may be 0
// (edge) or negative (a reflected stretch)).
struct AxisRun {
  int64_t out_begin;
  int64_t length;
  int64_t src_begin;
  int64_t src_step;
};

// ceil(a / b) for a >= 0, b >= 1, without forming a + b - 1 (b may be a step near 2**62).
DM_HD DM_FORCEINLINE int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// The longest run starting at output position i of an axis: positions r = start + i * step (step >=
// 1), n >= 1 cells (n == 0 only with constant). Returns the run; its length is >= 1 while i < count.
DM_HD inline AxisRun NextAxisRun(int64_t i, int64_t count, int64_t start, int64_t step, int64_t n,
                                 int mode) {
  AxisRun run;
  run.out_begin = i;
  int64_t left = count - i;
  int64_t r = start + i * step;
  if (InRange(r, n)) {
    run.src_begin = r;
    run.src_step = step;
    int64_t len = CeilDiv(n - r, step);  // positions until r leaves [0, n)
    run.length = len < left ? len : left;
    return run;
  }
  switch (mode) {
    case kPeriodic: {
      int64_t m = BoundaryIndex(r, n, mode);
      run.src_begin = m;
      run.src_step = step;
      int64_t len = CeilDiv(n - m, step);
      run.length = len < left ? len : left;
      return run;
    }
    case kReflect:
    case kSymmetric: {
      if (n == 1) {  // every position repeats the single value
        run.src_begin = 0;
        run.src_step = 0;
        run.length = left;
        return run;
      }
      int64_t p = mode == kReflect ? 2 * n - 2 : 2 * n;
      int64_t q = FloorMod(r, p);
      if (q < n) {  // forward stretch: q .. n-1
        run.src_begin = q;
        run.src_step = step;
        int64_t len = (n - 1 - q) / step + 1;
        run.length = len < left ? len : left;
      } else {  // backward stretch: q .. p-1 maps to p-q (reflect) or p-1-q (symmetric), descending
        run.src_begin = mode == kReflect ? p - q : p - 1 - q;
        run.src_step = -step;
        int64_t len = (p - 1 - q) / step + 1;
        run.length = len < left ? len : left;
      }
      return run;
    }
    case kEdge: {
      run.src_begin = r < 0 ? 0 : n - 1;
      run.src_step = 0;
      int64_t len = r < 0 ? CeilDiv(-r, step) : left;
      run.length = len < left ? len : left;
      return run;
    }
    default: {  // constant: fill until the positions enter [0, n), or to the end
      run.src_begin = -1;
      run.src_step = 0;
      int64_t len = (r < 0 && n > 0) ? CeilDiv(-r, step) : left;
      run.length = len < left ? len : left;
      return run;
    }
  }
}

}  // namespace dali_mesh

#endif  // DALI_MESH_INDEX_MATH_H_
