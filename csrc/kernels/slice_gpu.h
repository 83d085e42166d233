// dali_mesh: the GPU strided slice: descriptors, the kernel body and the host plan.
//
// DALI-free. The kernel body (RunBlock) is __host__ __device__: the CUDA kernel runs it with
// threadIdx/blockDim, and EmulateGpuPlan runs the very same code on the host, thread by thread, so
// the descriptor building, axis collapsing, vectorisation and index math that ship to the GPU are
// tested on machines without one.
//
// One launch per batch: one descriptor per piece of a sample and one per block of output elements,
// uploaded in one copy; the grid is sized to the GPU (a grid-stride loop over the block
// descriptors). A sample whose window leaves the domain is cut into pieces: its in-bounds box
// (planned like an unpadded copy, no boundary code) and the strips around it (the halo: few cells,
// boundary rule per element), each a box of the sample's output with the output's strides. Copies
// move 1, 2, 4, 8 or 16 bytes per thread, chosen per piece (a piece with step 1 on the innermost
// axis and no padding there moves 16 bytes where its extent and alignment allow; one misaligned
// sample does not slow the others, and a halo does not slow its sample's box). Padding is chosen at
// compile time (the plain path has no boundary code).
// Casts and normalisation run typed kernels for the common pairs (float->half, float->float,
// uint8->float, half->float; 4 or 2 elements per load and store on a piece's plain path where
// both sides line up) and a generic kernel (types dispatched at run time) for the rest; the
// conversion kernel is chosen per batch, so a batch with a sample whose pointers do not suit the
// typed kernel runs every sample through the generic one. On the
// plain path each thread issues the loads of several moves before their stores (PlainBlock).
#ifndef DALI_MESH_SLICE_GPU_H_
#define DALI_MESH_SLICE_GPU_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/index_math.h"
#include "kernels/slice_args.h"

namespace dali_mesh {

constexpr int kBlockDim = 256;
// Moves per thread whose loads are issued together on the plain path (see PlainBlock).
constexpr int kUnroll = 4;

#if defined(__CUDACC__)
#define DM_UNROLL _Pragma("unroll")
#else
#define DM_UNROLL
#endif

// 16-byte moves: CUDA's uint4 (one 128-bit load/store) on the device, a plain struct on the host.
#if defined(__CUDACC__)
using Vec16 = uint4;
#else
struct alignas(16) Vec16 {
  uint32_t v[4];
};
#endif

// Which kernel converts (cast and/or normalisation); kCopy: no conversion.
enum ConvKind : int {
  kCopy = -1,
  kConvGeneric = 0,   // any pair, types dispatched at run time
  kConvF32ToF16 = 1,
  kConvF32ToF32 = 2,  // normalisation only
  kConvU8ToF32 = 3,
  kConvF16ToF32 = 4,
};
const char *ConvKindName(int conv);

// One piece of a sample: a box of the sample's output (`out` is its first element, `out_stride` the
// output's element strides; the innermost axis is contiguous) and the positions it takes from the
// domain (start, step, boundary per axis, as a whole sample would).
struct alignas(16) GpuSampleDesc {
  const void *in;  // the domain start
  void *out;       // the piece's first output element
  int32_t ndim;
  int32_t channel_axis;  // -1: none (normalisation without channels uses channel 0)
  int64_t channel_offset;
  int32_t need_pad;
  int32_t elem_size;  // bytes per element moved by the copy kernel for this piece (1 .. 16)
  int32_t vec;        // typed conversions: elements per move on the plain path (1, 2 or 4)
  uint8_t boundary[kMaxDims];
  int64_t in_extent[kMaxDims];
  int64_t in_stride[kMaxDims];
  int64_t start[kMaxDims];
  int64_t step[kMaxDims];
  int64_t out_extent[kMaxDims];
  int64_t out_stride[kMaxDims];  // output elements between neighbours on each axis (the innermost: 1)
  FastDivU64 out_div[kMaxDims];
  alignas(16) uint8_t fill[16];  // the fill value's bytes, repeated to the element size
};

struct GpuBlockDesc {
  int64_t sample;  // the piece (index into the sample descriptors)
  uint64_t begin;  // flat elements [begin, end) of that piece (row-major over its out_extent)
  uint64_t end;
};

struct GpuBatchArgs {
  const GpuSampleDesc *samples;
  const GpuBlockDesc *blocks;
  const float *mean;  // nullptr: no normalisation
  const float *stddev;
  int32_t in_type;
  int32_t out_type;
};

// ---- kernel body (host and device) ---------------------------------------------------------------

// Coordinates of the piece's flat index `idx`: the innermost coordinate, and the outer axes' input
// offset, output offset (of the row's first element), fill flag and channel.
template <bool kNeedPad>
DM_HD DM_FORCEINLINE void LocateRow(const GpuSampleDesc &s, uint64_t idx, int64_t &inner,
                                    int64_t &offset, int64_t &out_row, bool &fill,
                                    int64_t &channel) {
  const int D = s.ndim;
  uint64_t q = s.out_div[D - 1].Div(idx);
  inner = static_cast<int64_t>(idx - q * static_cast<uint64_t>(s.out_extent[D - 1]));
  uint64_t rest = q;
  offset = 0;
  out_row = 0;
  fill = false;
  channel = 0;
  for (int d = D - 2; d >= 0; d--) {
    int64_t c;
    if (d > 0) {
      uint64_t q2 = s.out_div[d].Div(rest);
      c = static_cast<int64_t>(rest - q2 * static_cast<uint64_t>(s.out_extent[d]));
      rest = q2;
    } else {
      c = static_cast<int64_t>(rest);
    }
    int64_t r = s.start[d] + c * s.step[d];
    int64_t si = kNeedPad ? BoundaryIndex(r, s.in_extent[d], s.boundary[d]) : r;
    if (kNeedPad && si < 0) fill = true;
    offset += si * s.in_stride[d];
    out_row += c * s.out_stride[d];
    if (d == s.channel_axis) channel = s.channel_offset + si;
  }
}

// The plain path (no padding) of a block: each thread gathers the addresses of its next kUnroll
// moves, issues their loads, then their stores. One load at a time per thread keeps too few bytes
// in flight for HBM to run at full speed when a move is narrower than 16 bytes (2048 threads x 8
// bytes per SM, where the H200 needs about 25 KiB), e.g. the 8-byte moves of an ERA5 box with a
// 2-cell longitude halo, or the 4-byte loads of a cast. `Op` loads a raw value (Op::Raw) at an
// input index and stores it (converted) at an output index with its channel.
template <typename Op>
DM_HD DM_FORCEINLINE void PlainBlock(const GpuSampleDesc &s, const Op &op, uint64_t begin,
                                     uint64_t end, unsigned tid, unsigned nthreads) {
  uint64_t idx = begin + tid;
  if (idx >= end) return;
  const int D = s.ndim;
  const int64_t L = s.out_extent[D - 1];
  const int64_t start = s.start[D - 1], step = s.step[D - 1], stride = s.in_stride[D - 1];
  const bool channel_inner = s.channel_axis == D - 1;
  int64_t inner, offset, out_row, channel;
  bool row_fill;
  LocateRow<false>(s, idx, inner, offset, out_row, row_fill, channel);
  bool more = true;
  while (more) {
    int64_t src[kUnroll], dst[kUnroll], ch[kUnroll];
    int m = 0;
    DM_UNROLL
    for (int k = 0; k < kUnroll; k++) {
      if (more) {
        const int64_t r = start + inner * step;
        src[k] = offset + r * stride;
        dst[k] = out_row + inner;
        ch[k] = channel_inner ? s.channel_offset + r : channel;
        m = k + 1;
        idx += nthreads;
        if (idx >= end) {
          more = false;
        } else {
          inner += nthreads;
          if (inner >= L) LocateRow<false>(s, idx, inner, offset, out_row, row_fill, channel);
        }
      }
    }
    typename Op::Raw v[kUnroll] = {};
    DM_UNROLL
    for (int k = 0; k < kUnroll; k++)
      if (k < m) v[k] = op.Load(src[k]);
    DM_UNROLL
    for (int k = 0; k < kUnroll; k++)
      if (k < m) op.Store(dst[k], v[k], ch[k]);
  }
}

template <typename Elem>
struct CopyOp {
  using Raw = Elem;
  const Elem *__restrict__ in;
  Elem *__restrict__ out;
  DM_HD DM_FORCEINLINE Elem Load(int64_t i) const { return in[i]; }
  DM_HD DM_FORCEINLINE void Store(int64_t o, Elem v, int64_t) const { out[o] = v; }
};

// The element-by-element walk of the padded path, shared by copies and conversions: output elements
// [begin, end) of sample `s`, every `nthreads`-th from `begin + tid`, the boundary rule applied on the
// innermost axis per element (outer axes by LocateRow). For each element it calls
// `put(out_index, in_index, si, channel)`: `in_index` < 0 when the element is a fill (a constant cell
// or a filled row), `si` the innermost input index.
template <bool kNeedPad, typename Put>
DM_HD DM_FORCEINLINE void WalkElements(const GpuSampleDesc &s, uint64_t begin, uint64_t end, unsigned tid,
                                       unsigned nthreads, const Put &put) {
  uint64_t idx = begin + tid;
  if (idx >= end) return;
  const int D = s.ndim;
  const int64_t L = s.out_extent[D - 1];
  const int64_t start = s.start[D - 1], step = s.step[D - 1], stride = s.in_stride[D - 1];
  const int64_t n = s.in_extent[D - 1];
  const int mode = s.boundary[D - 1];
  int64_t inner, offset, out_row, channel;
  bool row_fill;
  LocateRow<kNeedPad>(s, idx, inner, offset, out_row, row_fill, channel);
  for (;;) {
    const int64_t r = start + inner * step;
    const int64_t si = kNeedPad ? BoundaryIndex(r, n, mode) : r;
    put(out_row + inner, (kNeedPad && (row_fill || si < 0)) ? int64_t(-1) : offset + si * stride, si, channel);
    idx += nthreads;
    if (idx >= end) break;
    inner += nthreads;
    if (inner >= L) LocateRow<kNeedPad>(s, idx, inner, offset, out_row, row_fill, channel);
  }
}

template <typename Elem>
struct PadCopyPut {
  const Elem *__restrict__ in;
  Elem *__restrict__ out;
  Elem fill;
  DM_HD DM_FORCEINLINE void operator()(int64_t o, int64_t i, int64_t, int64_t) const {
    out[o] = i < 0 ? fill : in[i];
  }
};

template <typename Elem, bool kNeedPad>
DM_HD void CopyBlock(const GpuSampleDesc &s, uint64_t begin, uint64_t end, unsigned tid,
                     unsigned nthreads) {
  if constexpr (!kNeedPad) {
    PlainBlock(s, CopyOp<Elem>{static_cast<const Elem *>(s.in), static_cast<Elem *>(s.out)}, begin,
               end, tid, nthreads);
    return;
  }
  // the padded path: one move at a time, the boundary rule on the innermost axis per element
  PadCopyPut<Elem> put{static_cast<const Elem *>(s.in), static_cast<Elem *>(s.out), Elem{}};
  memcpy(&put.fill, s.fill, sizeof(Elem));
  WalkElements<kNeedPad>(s, begin, end, tid, nthreads, put);
}

template <typename T>
DM_HD DM_FORCEINLINE void StoreConverted(void *out, int kind, int64_t i, uint64_t u, double f) {
  T v = kind == kKindInt ? Convert<T>::FromInt64(i)
                         : (kind == kKindUInt ? Convert<T>::FromUInt64(u) : Convert<T>::FromDouble(f));
  memcpy(out, &v, sizeof(T));
}

DM_HD DM_FORCEINLINE void Assign(int64_t v, int64_t &i, uint64_t &, double &) { i = v; }
DM_HD DM_FORCEINLINE void Assign(uint64_t v, int64_t &, uint64_t &u, double &) { u = v; }
DM_HD DM_FORCEINLINE void Assign(double v, int64_t &, uint64_t &, double &f) { f = v; }

// out = cast(in) or cast((float(in) - mean[c]) / std[c]); types dispatched at run time (uniform
// over a launch, so the branches do not diverge).
DM_HD inline void ConvertElement(const void *in, int in_type, void *out, int out_type,
                                 const float *mean, const float *stddev, int64_t channel) {
  int kind = kKindInt;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  DM_TYPE_SWITCH(in_type, T, {
    T x;
    memcpy(&x, in, sizeof(T));
    kind = Load<T>::kind;
    Assign(Load<T>::Get(&x), i, u, f);
  });
  if (mean) {
    float x = kind == kKindInt ? ToFloat(i) : (kind == kKindUInt ? ToFloat(u) : ToFloat(f));
    x = (x - mean[channel]) / stddev[channel];
    kind = kKindFloat;
    f = static_cast<double>(x);
  }
  DM_TYPE_SWITCH(out_type, T, { StoreConverted<T>(out, kind, i, u, f); });
}

struct ConvertPut {
  const uint8_t *in;
  uint8_t *out;
  const GpuSampleDesc &s;
  const GpuBatchArgs &b;
  int in_size, out_size;
  bool channel_inner;
  DM_HD DM_FORCEINLINE void operator()(int64_t o, int64_t i, int64_t si, int64_t channel) const {
    uint8_t *dst = out + o * out_size;
    if (i < 0) {
      memcpy(dst, s.fill, out_size);
    } else {
      ConvertElement(in + i * in_size, b.in_type, dst, b.out_type, b.mean, b.stddev,
                     channel_inner ? s.channel_offset + si : channel);
    }
  }
};

template <bool kNeedPad>
DM_HD void ConvertBlock(const GpuSampleDesc &s, const GpuBatchArgs &b, uint64_t begin,
                        uint64_t end, unsigned tid, unsigned nthreads) {
  const ConvertPut put{static_cast<const uint8_t *>(s.in), static_cast<uint8_t *>(s.out), s, b,
                       DTypeSize(b.in_type), DTypeSize(b.out_type), s.channel_axis == s.ndim - 1};
  WalkElements<kNeedPad>(s, begin, end, tid, nthreads, put);
}

// ---- typed conversions (the common pairs; the same results as ConvertElement) --------------------
template <typename T>
DM_HD DM_FORCEINLINE float ValueAsFloat(T x) { return ToFloat(Load<T>::Get(&x)); }
template <>
DM_HD DM_FORCEINLINE float ValueAsFloat<float>(float x) { return x; }
template <>
DM_HD DM_FORCEINLINE float ValueAsFloat<uint8_t>(uint8_t x) { return static_cast<float>(x); }
template <>
DM_HD DM_FORCEINLINE float ValueAsFloat<f16>(f16 x) { return HalfToFloat(x.bits); }

template <typename Out>
DM_HD DM_FORCEINLINE Out FloatTo(float v) { return Convert<Out>::FromDouble(static_cast<double>(v)); }
template <>
DM_HD DM_FORCEINLINE float FloatTo<float>(float v) { return v; }
// FloatToHalf(f) == DoubleToHalf((double)f) for every float, in 32-bit integer ops
template <>
DM_HD DM_FORCEINLINE f16 FloatTo<f16>(float v) { return f16{FloatToHalf(v)}; }

template <typename In, typename Out, bool kNorm>
DM_HD DM_FORCEINLINE Out ConvertOne(In x, const float *mean, const float *stddev, int64_t c) {
  if constexpr (kNorm) {
    return FloatTo<Out>((ValueAsFloat(x) - mean[c]) / stddev[c]);
  } else if constexpr (std::is_same_v<In, float> || std::is_same_v<In, f16>) {
    return FloatTo<Out>(ValueAsFloat(x));  // exact as a float
  } else {
    return ConvertValue<Out>(Load<In>::Get(&x));
  }
}

template <int kConv>
struct ConvTypes;
template <>
struct ConvTypes<kConvF32ToF16> { using In = float; using Out = f16; };
template <>
struct ConvTypes<kConvF32ToF32> { using In = float; using Out = float; };
template <>
struct ConvTypes<kConvU8ToF32> { using In = uint8_t; using Out = float; };
template <>
struct ConvTypes<kConvF16ToF32> { using In = f16; using Out = float; };

template <typename In, typename Out, bool kNorm>
struct ConvertOp {
  using Raw = In;
  const In *__restrict__ in;
  Out *__restrict__ out;
  const float *mean;
  const float *stddev;
  DM_HD DM_FORCEINLINE In Load(int64_t i) const { return in[i]; }
  DM_HD DM_FORCEINLINE void Store(int64_t o, In v, int64_t channel) const {
    out[o] = ConvertOne<In, Out, kNorm>(v, mean, stddev, channel);
  }
};

// K elements moved as one (a 16-, 8- or 4-byte load or store where the plan found them aligned).
template <typename T, int K>
struct alignas(sizeof(T) * K) Pack {
  T v[K];
};

// K elements per move (the plan widened the piece by K; the channel is not its innermost axis, so
// one channel serves the K elements).
template <typename In, typename Out, bool kNorm, int K>
struct ConvertVecOp {
  using Raw = Pack<In, K>;
  const Raw *__restrict__ in;
  Pack<Out, K> *__restrict__ out;
  const float *mean;
  const float *stddev;
  DM_HD DM_FORCEINLINE Raw Load(int64_t i) const { return in[i]; }
  DM_HD DM_FORCEINLINE void Store(int64_t o, const Raw &v, int64_t channel) const {
    Pack<Out, K> r;
    DM_UNROLL
    for (int j = 0; j < K; j++) r.v[j] = ConvertOne<In, Out, kNorm>(v.v[j], mean, stddev, channel);
    out[o] = r;
  }
};

template <typename In, typename Out, bool kNorm, int K>
DM_HD DM_FORCEINLINE void ConvertPlainVec(const GpuSampleDesc &s, const GpuBatchArgs &b,
                                          uint64_t begin, uint64_t end, unsigned tid,
                                          unsigned nthreads) {
  PlainBlock(s,
             ConvertVecOp<In, Out, kNorm, K>{static_cast<const Pack<In, K> *>(s.in),
                                             static_cast<Pack<Out, K> *>(s.out), b.mean, b.stddev},
             begin, end, tid, nthreads);
}

template <typename In, typename Out, bool kNorm>
struct TypedConvertPut {
  const In *__restrict__ in;
  Out *__restrict__ out;
  const GpuSampleDesc &s;
  const GpuBatchArgs &b;
  bool channel_inner;
  Out fill;
  DM_HD DM_FORCEINLINE void operator()(int64_t o, int64_t i, int64_t si, int64_t channel) const {
    out[o] = i < 0 ? fill
                   : ConvertOne<In, Out, kNorm>(in[i], b.mean, b.stddev, channel_inner ? s.channel_offset + si : channel);
  }
};

template <typename In, typename Out, bool kNeedPad, bool kNorm>
DM_HD void ConvertBlockTyped(const GpuSampleDesc &s, const GpuBatchArgs &b, uint64_t begin,
                             uint64_t end, unsigned tid, unsigned nthreads) {
  if constexpr (!kNeedPad) {
    switch (s.vec) {  // uniform over a block: no divergence
      case 4: ConvertPlainVec<In, Out, kNorm, 4>(s, b, begin, end, tid, nthreads); return;
      case 2: ConvertPlainVec<In, Out, kNorm, 2>(s, b, begin, end, tid, nthreads); return;
      default:
        PlainBlock(s,
                   ConvertOp<In, Out, kNorm>{static_cast<const In *>(s.in),
                                             static_cast<Out *>(s.out), b.mean, b.stddev},
                   begin, end, tid, nthreads);
        return;
    }
  }
  TypedConvertPut<In, Out, kNorm> put{static_cast<const In *>(s.in), static_cast<Out *>(s.out), s, b,
                                      s.channel_axis == s.ndim - 1, Out{}};
  memcpy(&put.fill, s.fill, sizeof(Out));
  WalkElements<kNeedPad>(s, begin, end, tid, nthreads, put);
}

// A copy with the sample's own element size (uniform over a block: no divergence).
template <bool kNeedPad>
DM_HD void CopySample(const GpuSampleDesc &s, uint64_t begin, uint64_t end, unsigned tid,
                      unsigned nthreads) {
  switch (s.elem_size) {
    case 1: CopyBlock<uint8_t, kNeedPad>(s, begin, end, tid, nthreads); break;
    case 2: CopyBlock<uint16_t, kNeedPad>(s, begin, end, tid, nthreads); break;
    case 4: CopyBlock<uint32_t, kNeedPad>(s, begin, end, tid, nthreads); break;
    case 8: CopyBlock<uint64_t, kNeedPad>(s, begin, end, tid, nthreads); break;
    default: CopyBlock<Vec16, kNeedPad>(s, begin, end, tid, nthreads); break;
  }
}

// The body of one block descriptor (tid = threadIdx.x, nthreads = blockDim.x). kNeedPad: some
// sample of the batch pads (each sample still takes the plain path when it does not).
template <bool kNeedPad, int kConv, bool kNorm>
DM_HD void RunBlock(const GpuBatchArgs &b, int64_t block, unsigned tid, unsigned nthreads) {
  const GpuBlockDesc blk = b.blocks[block];
  const GpuSampleDesc &s = b.samples[blk.sample];
  const bool pad = kNeedPad && s.need_pad;
  if constexpr (kConv == kCopy) {
    if (pad)
      CopySample<kNeedPad>(s, blk.begin, blk.end, tid, nthreads);
    else
      CopySample<false>(s, blk.begin, blk.end, tid, nthreads);
  } else if constexpr (kConv == kConvGeneric) {
    if (pad)
      ConvertBlock<kNeedPad>(s, b, blk.begin, blk.end, tid, nthreads);
    else
      ConvertBlock<false>(s, b, blk.begin, blk.end, tid, nthreads);
  } else {
    using In = typename ConvTypes<kConv>::In;
    using Out = typename ConvTypes<kConv>::Out;
    if (pad)
      ConvertBlockTyped<In, Out, kNeedPad, kNorm>(s, b, blk.begin, blk.end, tid, nthreads);
    else
      ConvertBlockTyped<In, Out, false, kNorm>(s, b, blk.begin, blk.end, tid, nthreads);
  }
}

// ---- host plan -------------------------------------------------------------------------------------

struct GpuPlan {
  std::vector<uint8_t> blob;  // [piece descs][block descs][mean][std], one upload
  size_t samples_offset = 0, blocks_offset = 0, mean_offset = 0, std_offset = 0;
  int64_t num_samples = 0, num_pieces = 0, num_blocks = 0;
  int64_t piece_elements = 0;  // output elements the pieces cover (they partition the outputs)
  int elem_size = 1;  // the widest element moved by the copy kernel over the pieces (0: convert)
  // per sample: the input bytes per move of its largest piece (its in-bounds box when it has one;
  // the copy kernel, or a typed conversion's plain path; 0 for the generic conversion)
  std::vector<int> sample_elem_size;
  int conv = kCopy;   // ConvKind
  bool need_pad = false;
  bool convert = false;
  bool normalize = false;
  int in_type = 0, out_type = 0;

  // The kernel arguments with the blob at `base` (device memory, or blob.data() to emulate).
  GpuBatchArgs Args(const void *base) const;
};

// Builds the plan of a batch. `samples` are uncollapsed (this collapses them); in[i] / out[i] are
// the samples' first elements. Returns "" or an error message.
std::string BuildGpuPlan(const std::vector<SliceSample> &samples, const void *const *in,
                         void *const *out, const SliceParams &params, GpuPlan *plan);

// Runs the plan's kernel body on the host, block by block and thread by thread (pointers are host
// pointers), with a grid of `grid` blocks striding over the block descriptors as on the GPU (0: a
// small grid, so the stride loop is exercised). Exact: the kernel has no shared memory and no
// thread cooperation.
void EmulateGpuPlan(const GpuPlan &plan, int64_t grid = 0);

// Runs plans on the GPU (defined in slice_gpu.cu; only when built with CUDA).
//
// The descriptors go through a ring of kRing slots, each a pinned staging buffer, a device buffer
// and an event recorded after the kernel that reads them: a launch waits on the host only when the
// slot it reuses is still in flight (kRing batches behind), so DALI's executor can run ahead.
// Buffers grow geometrically (cudaMalloc synchronises the device: it happens a few times, not per
// batch). Not thread-safe: one launcher per operator instance.
class GpuSliceLauncher {
 public:
  static constexpr int kRing = 4;
  GpuSliceLauncher() = default;
  ~GpuSliceLauncher();
  GpuSliceLauncher(const GpuSliceLauncher &) = delete;
  GpuSliceLauncher &operator=(const GpuSliceLauncher &) = delete;
  // Uploads the descriptors and launches on `stream` (a cudaStream_t). Returns "" or the error.
  std::string Run(const GpuPlan &plan, void *stream);

 private:
  void Release();  // waits for and frees every slot, with the launcher's device current

  void *device_[kRing] = {};
  void *pinned_[kRing] = {};
  size_t capacity_[kRing] = {};
  void *done_[kRing] = {};  // cudaEvent_t: the last kernel that read slot k has finished
  int next_ = 0;
  int device_id_ = -1;
  int sm_count_ = 0;
};

}  // namespace dali_mesh

#endif  // DALI_MESH_SLICE_GPU_H_
