// dali_mesh: the CPU kernel of the strided slice (see slice_cpu.h).
#include "kernels/slice_cpu.h"

#include <algorithm>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dali_mesh {

namespace {

constexpr int64_t kChunk = 512;  // elements converted through the stack buffer at a time

template <int kSize>
struct UIntOfSize;
template <> struct UIntOfSize<1> { using type = uint8_t; };
template <> struct UIntOfSize<2> { using type = uint16_t; };
template <> struct UIntOfSize<4> { using type = uint32_t; };
template <> struct UIntOfSize<8> { using type = uint64_t; };

template <int kSize>
void CopyElems(void *out, const void *in, int64_t n, int64_t step) {
  using U = typename UIntOfSize<kSize>::type;
  if (step == 1) {
    std::memcpy(out, in, n * kSize);
    return;
  }
  U *o = static_cast<U *>(out);
  const U *i = static_cast<const U *>(in);
  if (step == 0) {
    U v = *i;
    for (int64_t k = 0; k < n; k++) o[k] = v;
    return;
  }
  for (int64_t k = 0; k < n; k++) o[k] = i[k * step];
}

template <typename U>
void FillTyped(uint8_t *out, int64_t n, const uint8_t *fill) {
  U v;
  std::memcpy(&v, fill, sizeof(U));
  U *o = reinterpret_cast<U *>(out);
  for (int64_t k = 0; k < n; k++) o[k] = v;
}

void FillElems(uint8_t *out, int64_t n, const uint8_t *fill, int size) {
  switch (size) {
    case 1: std::memset(out, fill[0], n); break;
    case 2: FillTyped<uint16_t>(out, n, fill); break;
    case 4: FillTyped<uint32_t>(out, n, fill); break;
    default: FillTyped<uint64_t>(out, n, fill); break;
  }
}

// ---- conversion in two stages through a buffer of the input's value kind -----------------------
union KindBuf {
  int64_t i[kChunk];
  uint64_t u[kChunk];
  double f[kChunk];
};

template <typename In>
void LoadValues(KindBuf *buf, const void *in, int64_t n, int64_t step) {
  using V = typename Load<In>::type;
  const In *p = static_cast<const In *>(in);
  V *dst = reinterpret_cast<V *>(buf);
  for (int64_t k = 0; k < n; k++) dst[k] = Load<In>::Get(p + k * step);
}

template <typename Out>
void StoreValues(void *out, const KindBuf *buf, int kind, int64_t n) {
  Out *o = static_cast<Out *>(out);
  if (kind == kKindInt) {
    for (int64_t k = 0; k < n; k++) o[k] = Convert<Out>::FromInt64(buf->i[k]);
  } else if (kind == kKindUInt) {
    for (int64_t k = 0; k < n; k++) o[k] = Convert<Out>::FromUInt64(buf->u[k]);
  } else {
    for (int64_t k = 0; k < n; k++) o[k] = Convert<Out>::FromDouble(buf->f[k]);
  }
}

template <typename In>
inline float AsFloat(const In *p) { return ToFloat(Load<In>::Get(p)); }
template <>
inline float AsFloat<float>(const float *p) { return *p; }

// dst[k] = (in[k*step] - mean[c]) / std[c] in float32
template <typename In>
void NormalizeToFloat(float *dst, const void *in, int64_t n, int64_t step, const NormArgs *na) {
  const In *p = static_cast<const In *>(in);
  if (na->channel_step == 0) {
    const float m = na->mean[na->channel0], sd = na->stddev[na->channel0];
    if (step == 1) {
      for (int64_t k = 0; k < n; k++) dst[k] = (AsFloat<In>(p + k) - m) / sd;
    } else {
      for (int64_t k = 0; k < n; k++) dst[k] = (AsFloat<In>(p + k * step) - m) / sd;
    }
    return;
  }
  int64_t c = na->channel0;
  for (int64_t k = 0; k < n; k++, c += na->channel_step)
    dst[k] = (AsFloat<In>(p + k * step) - na->mean[c]) / na->stddev[c];
}

template <typename Out>
void StoreFloats(void *out, const float *src, int64_t n) {
  Out *o = static_cast<Out *>(out);
  for (int64_t k = 0; k < n; k++) o[k] = Convert<Out>::FromDouble(static_cast<double>(src[k]));
}

// float -> float16: the x86 F16C instruction when the CPU has it (IEEE round to nearest even: the
// same bits as FloatToHalf), else FloatToHalf.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("f16c,avx"))) void StoreHalfF16C(void *out, const float *src, int64_t n) {
  uint16_t *o = static_cast<uint16_t *>(out);
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    __m256 v = _mm256_loadu_ps(src + k);
    _mm_storeu_si128(reinterpret_cast<__m128i *>(o + k), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; k < n; k++) o[k] = FloatToHalf(src[k]);
}
#endif

template <>
void StoreFloats<f16>(void *out, const float *src, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has_f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  if (has_f16c) {
    StoreHalfF16C(out, src, n);
    return;
  }
#endif
  uint16_t *o = static_cast<uint16_t *>(out);
  for (int64_t k = 0; k < n; k++) o[k] = FloatToHalf(src[k]);
}

// float32 elements (strided) -> dst, as floats
void GatherFloats(float *dst, const void *in, int64_t n, int64_t step) {
  const float *p = static_cast<const float *>(in);
  for (int64_t k = 0; k < n; k++) dst[k] = p[k * step];
}

struct Stages {
  int in_kind;
  void (*load)(KindBuf *, const void *, int64_t, int64_t);
  void (*store)(void *, const KindBuf *, int, int64_t);
  void (*normalize)(float *, const void *, int64_t, int64_t, const NormArgs *);
  void (*store_float)(void *, const float *, int64_t);
  int in_size, out_size;
  bool out_is_float32;
  bool in_is_float32;  // casts from float32 go through StoreFloats (F16C for float16)
};

Stages MakeStages(int in_type, int out_type) {
  Stages st{};
  DM_TYPE_SWITCH(in_type, In, {
    st.in_kind = Load<In>::kind;
    st.load = &LoadValues<In>;
    st.normalize = &NormalizeToFloat<In>;
  });
  DM_TYPE_SWITCH(out_type, Out, {
    st.store = &StoreValues<Out>;
    st.store_float = &StoreFloats<Out>;
  });
  st.in_size = DTypeSize(in_type);
  st.out_size = DTypeSize(out_type);
  st.out_is_float32 = out_type == kFloat32;
  st.in_is_float32 = in_type == kFloat32;
  return st;
}

// One Stages per (in, out) pair, built on first use (tiny; thread-safe static init).
const Stages &GetStages(int in_type, int out_type) {
  static const auto table = [] {
    std::vector<Stages> t(kNumDTypes * kNumDTypes);
    for (int i = 0; i < kNumDTypes; i++)
      for (int o = 0; o < kNumDTypes; o++) t[i * kNumDTypes + o] = MakeStages(i, o);
    return t;
  }();
  return table[in_type * kNumDTypes + out_type];
}

void ConvertRunImpl(const Stages &st, void *out, const void *in, int64_t n, int64_t step,
                    const NormArgs *norm) {
  uint8_t *o = static_cast<uint8_t *>(out);
  const uint8_t *i = static_cast<const uint8_t *>(in);
  if (norm) {
    NormArgs na = *norm;
    if (st.out_is_float32) {
      st.normalize(reinterpret_cast<float *>(o), i, n, step, &na);
      return;
    }
    float tmp[kChunk];
    for (int64_t k = 0; k < n; k += kChunk) {
      int64_t m = std::min(kChunk, n - k);
      st.normalize(tmp, i + k * step * st.in_size, m, step, &na);
      st.store_float(o + k * st.out_size, tmp, m);
      na.channel0 += m * na.channel_step;
    }
    return;
  }
  if (st.in_is_float32) {
    float tmp[kChunk];
    for (int64_t k = 0; k < n; k += kChunk) {
      int64_t m = std::min(kChunk, n - k);
      const uint8_t *src = i + k * step * st.in_size;
      if (step == 1) {
        st.store_float(o + k * st.out_size, reinterpret_cast<const float *>(src), m);
      } else {
        GatherFloats(tmp, src, m, step);
        st.store_float(o + k * st.out_size, tmp, m);
      }
    }
    return;
  }
  KindBuf buf;
  for (int64_t k = 0; k < n; k += kChunk) {
    int64_t m = std::min(kChunk, n - k);
    st.load(&buf, i + k * step * st.in_size, m, step);
    st.store(o + k * st.out_size, &buf, st.in_kind, m);
  }
}

}  // namespace

CpuElementOps MakeCpuElementOps(const SliceParams &params) {
  CpuElementOps ops;
  ops.in_size = DTypeSize(params.in_type);
  ops.out_size = DTypeSize(params.out_type);
  ops.convert = params.Convert();
  ops.normalize = params.Normalize();
  FillBytes(params, ops.fill);
  switch (ops.in_size) {
    case 1: ops.copy = &CopyElems<1>; break;
    case 2: ops.copy = &CopyElems<2>; break;
    case 4: ops.copy = &CopyElems<4>; break;
    default: ops.copy = &CopyElems<8>; break;
  }
  return ops;
}

void PrepareCpuSlice(const SliceSample &s, const void *in, void *out, int in_size,
                     CpuSlicePlan *plan) {
  plan->s = s;
  plan->in = static_cast<const uint8_t *>(in) + s.in_offset * in_size;
  plan->out = static_cast<uint8_t *>(out);
  for (int d = 0; d < kMaxDims; d++) plan->src[d].clear();
  plan->inner_runs.clear();
  if (s.OutVolume() == 0) return;
  const int D = s.ndim;
  for (int d = 0; d < D - 1; d++) {
    auto &src = plan->src[d];
    src.resize(s.out_extent[d]);
    for (int64_t i = 0; i < s.out_extent[d]; i++) {
      int64_t r = s.start[d] + i * s.step[d];
      src[i] = s.in_extent[d] > 0 ? BoundaryIndex(r, s.in_extent[d], s.boundary[d]) : -1;
    }
  }
  const int d = D - 1;
  for (int64_t i = 0; i < s.out_extent[d];) {
    AxisRun run = NextAxisRun(i, s.out_extent[d], s.start[d], s.step[d], s.in_extent[d],
                              s.in_extent[d] > 0 ? int(s.boundary[d]) : int(kConstant));
    plan->inner_runs.push_back(run);
    i += run.length;
  }
}

void RunCpuSlice(const CpuSlicePlan &plan, const CpuElementOps &ops, const SliceParams &params,
                 int64_t begin, int64_t end) {
  const SliceSample &s = plan.s;
  if (begin >= end) return;
  const int D = s.ndim;
  const int64_t L = s.out_extent[D - 1];
  const int out_size = ops.out_size, in_size = ops.in_size;
  const Stages *st = ops.convert ? &GetStages(params.in_type, params.out_type) : nullptr;
  const bool channel_inner = ops.normalize && s.channel_axis == D - 1;
  const int64_t inner_stride = s.in_stride[D - 1];

  int64_t row = begin / L, col = begin % L;
  int64_t idx[kMaxDims] = {};
  for (int d = D - 2; d >= 0; d--) {
    idx[d] = row % s.out_extent[d];
    row /= s.out_extent[d];
  }
  uint8_t *out = plan.out + begin * out_size;
  int64_t remaining = end - begin;
  const auto &runs = plan.inner_runs;
  while (remaining > 0) {
    const int64_t c1 = std::min(L, col + remaining);
    bool fill = false;
    int64_t off = 0, channel = 0;
    for (int d = 0; d < D - 1; d++) {
      int64_t si = plan.src[d][idx[d]];
      if (si < 0) {
        fill = true;
        break;
      }
      off += si * s.in_stride[d];
      if (d == s.channel_axis) channel = s.channel_offset + si;
    }
    if (fill) {
      FillElems(out, c1 - col, ops.fill, out_size);
      out += (c1 - col) * out_size;
    } else if (!st && runs.size() == 1 && runs[0].src_begin >= 0 && runs[0].src_step == 1 &&
               inner_stride == 1) {
      // the common plain window: one contiguous run per row
      const int64_t n = c1 - col;
      std::memcpy(out, plan.in + (off + runs[0].src_begin + col) * in_size, n * out_size);
      out += n * out_size;
    } else {
      // first run that ends after `col`
      auto it = std::upper_bound(runs.begin(), runs.end(), col,
                                 [](int64_t c, const AxisRun &r) { return c < r.out_begin + r.length; });
      for (int64_t c = col; c < c1; ++it) {
        const AxisRun &run = *it;
        const int64_t b = std::min(c1, run.out_begin + run.length);
        const int64_t n = b - c;
        if (run.src_begin < 0) {
          FillElems(out, n, ops.fill, out_size);
        } else {
          const int64_t src0 = run.src_begin + (c - run.out_begin) * run.src_step;
          const uint8_t *in = plan.in + (off + src0 * inner_stride) * in_size;
          // one element needs no step (and a lone position's step may be near 2**62)
          const int64_t step = n > 1 ? run.src_step * inner_stride : 0;
          if (!st) {
            ops.copy(out, in, n, step);
          } else if (ops.normalize) {
            NormArgs na{params.mean.data(), params.stddev.data(), 0, 0};
            if (channel_inner) {
              na.channel0 = s.channel_offset + src0;
              na.channel_step = run.src_step;
            } else if (s.channel_axis >= 0) {
              na.channel0 = channel;
            }
            ConvertRunImpl(*st, out, in, n, step, &na);
          } else {
            ConvertRunImpl(*st, out, in, n, step, nullptr);
          }
        }
        out += n * out_size;
        c = b;
      }
    }
    remaining -= c1 - col;
    col = 0;
    for (int d = D - 2; d >= 0; d--) {  // next row
      if (++idx[d] < s.out_extent[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace dali_mesh
