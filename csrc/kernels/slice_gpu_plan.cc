// dali_mesh: host side of the GPU strided slice: descriptors, blocks, vectorisation, and the host
// emulation of the kernel (see slice_gpu.h). DALI-free and CUDA-free.
#include <algorithm>
#include <cstring>

#include "kernels/slice_gpu.h"

namespace dali_mesh {

namespace {

size_t AlignUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

// One piece of a sample (see slice_gpu.h): a box of the sample's output, as a SliceSample of its
// own (start, out_extent, boundary per axis; the domain and input strides of its sample) plus where
// the box lies in the output.
struct Piece {
  int64_t sample = 0;
  SliceSample s;
  int64_t out_offset = 0;               // output elements from the sample's first output element
  int64_t out_stride[kMaxDims] = {};    // the sample's output strides (innermost 1)
  int width = 0;                        // bytes per move of the copy kernel (0: converting)
  int vec = 1;                          // typed conversions: elements per move
};

// Output positions [lo, hi) of an axis whose sources lie inside the domain: r = start + i * step
// in [0, n) for i in [0, count). lo == hi when there are none.
void InRangeSpan(int64_t start, int64_t step, int64_t count, int64_t n, int64_t *lo, int64_t *hi) {
  int64_t l = start >= 0 ? 0 : CeilDiv(-start, step);
  int64_t h = n - start > 0 ? CeilDiv(n - start, step) : 0;  // |start|, n < 2**62: no overflow
  l = std::min(l, count);
  h = std::min(std::max(h, l), count);
  *lo = l;
  *hi = h;
}

// Cuts a sample into its in-bounds box and the strips around it (a partition of its output: strip
// d takes the positions outside the span of axis d and inside the spans of the axes before it). A
// sample inside its domain is one piece. Pieces are uncollapsed; empty pieces are left out.
void CutSample(int64_t sample, const SliceSample &u, std::vector<Piece> *pieces) {
  if (u.OutVolume() == 0) return;
  const int D = u.ndim;
  int64_t os[kMaxDims];
  os[D - 1] = 1;
  for (int d = D - 2; d >= 0; d--) os[d] = os[d + 1] * u.out_extent[d + 1];
  int64_t lo[kMaxDims], hi[kMaxDims];
  bool inside = true;
  for (int d = 0; d < D; d++) {
    InRangeSpan(u.start[d], u.step[d], u.out_extent[d], u.in_extent[d], &lo[d], &hi[d]);
    inside &= lo[d] == 0 && hi[d] == u.out_extent[d];
  }
  auto add = [&](const int64_t *first, const int64_t *extent) {
    Piece p;
    p.sample = sample;
    p.s = u;
    for (int d = 0; d < D; d++) {
      if (extent[d] == 0) return;
      p.s.start[d] = u.start[d] + first[d] * u.step[d];
      p.s.out_extent[d] = extent[d];
      p.out_offset += first[d] * os[d];
      p.out_stride[d] = os[d];
    }
    pieces->push_back(p);
  };
  int64_t first[kMaxDims], extent[kMaxDims];
  for (int d = 0; d < D; d++) {
    first[d] = inside ? 0 : lo[d];
    extent[d] = inside ? u.out_extent[d] : hi[d] - lo[d];
  }
  add(first, extent);  // the box (the whole sample when inside)
  if (inside) return;
  for (int d = 0; d < D; d++) {
    for (int e = 0; e < D; e++) {
      first[e] = e < d ? lo[e] : 0;
      extent[e] = e < d ? hi[e] - lo[e] : u.out_extent[e];
    }
    extent[d] = lo[d];  // below the span
    add(first, extent);
    first[d] = hi[d];  // above it
    extent[d] = u.out_extent[d] - hi[d];
    add(first, extent);
  }
}

// Merges adjacent axes of a piece where the inner one is taken whole, both are contiguous in the
// input and in the output, and the outer one's positions lie inside the domain. Unlike
// CollapseAxes, a padded outer axis is never merged: kept apart, its rows pad (or fill) whole while
// the axis inside them still moves vectors. The channel axis is never merged.
void CollapsePiece(Piece *p) {
  const SliceSample &s = p->s;
  SliceSample r = s;
  AxisStack ax;  // merged axes, innermost first
  for (int d = s.ndim - 1; d >= 0; d--) {
    const int n = ax.n;
    const bool merge =
        ax.InnerWhole() && s.in_stride[d] == ax.in_extent[n - 1] * ax.in_stride[n - 1] &&
        p->out_stride[d] == ax.out[n - 1] * ax.ostride[n - 1] && s.step[d] == 1 &&
        d != s.channel_axis && s.start[d] >= 0 && s.start[d] + s.out_extent[d] <= s.in_extent[d];
    // the merged axis keeps its extent below kMaxPosition (its positions lie inside it)
    int64_t m_extent = 0;
    if (merge && !__builtin_mul_overflow(s.in_extent[d], ax.in_extent[n - 1], &m_extent) &&
        m_extent < kMaxPosition) {
      const int64_t k = ax.in_extent[n - 1];
      ax.in_extent[n - 1] = m_extent;
      ax.start[n - 1] = s.start[d] * k;
      ax.out[n - 1] = s.out_extent[d] * k;
      ax.mode[n - 1] = kConstant;  // never consulted: every position is inside
      continue;
    }
    ax.Push(s, d, p->out_stride[d]);
  }
  ax.WriteTo(&r, p->out_stride);
  p->s = r;
}

// Whether a collapsed piece can move k elements of `esize` bytes at a time, reading them as one
// `in_bytes`-aligned vector and writing one `out_bytes`-aligned vector (`in`: the sample's first
// element; `out`: the piece's).
bool Vectorizable(const Piece &p, const void *in, const void *out, int esize, int64_t k,
                  int in_bytes, int out_bytes) {
  const SliceSample &s = p.s;
  const int d = s.ndim - 1;
  if (s.step[d] != 1 || s.in_stride[d] != 1) return false;
  if (s.start[d] < 0 || s.start[d] + s.out_extent[d] > s.in_extent[d]) return false;  // inner pads
  if (s.start[d] % k || s.out_extent[d] % k) return false;
  for (int a = 0; a < d; a++)
    if (s.in_stride[a] % k || p.out_stride[a] % k) return false;
  auto in_addr = reinterpret_cast<uintptr_t>(in) + static_cast<uintptr_t>(s.in_offset * esize);
  if (in_addr % in_bytes || reinterpret_cast<uintptr_t>(out) % out_bytes) return false;
  return true;
}

// Re-expresses a piece in elements of k = width / esize original elements.
void Widen(Piece *p, int64_t k) {
  SliceSample &w = p->s;
  const int d = w.ndim - 1;
  w.in_extent[d] /= k;
  w.start[d] /= k;
  w.out_extent[d] /= k;
  for (int a = 0; a < d; a++) {
    w.in_stride[a] /= k;
    p->out_stride[a] /= k;
  }
}

// The grid-stride loop of the kernel, run on the host.
template <bool kNeedPad, int kConv, bool kNorm>
void EmulateAll(const GpuBatchArgs &b, int64_t num_blocks, int64_t grid) {
  for (int64_t g = 0; g < grid; g++)
    for (int64_t blk = g; blk < num_blocks; blk += grid)
      for (unsigned tid = 0; tid < static_cast<unsigned>(kBlockDim); tid++)
        RunBlock<kNeedPad, kConv, kNorm>(b, blk, tid, kBlockDim);
}

template <int kConv, bool kNorm>
void EmulatePad(const GpuPlan &p, const GpuBatchArgs &b, int64_t grid) {
  if (p.need_pad)
    EmulateAll<true, kConv, kNorm>(b, p.num_blocks, grid);
  else
    EmulateAll<false, kConv, kNorm>(b, p.num_blocks, grid);
}

template <int kConv>
void EmulateNorm(const GpuPlan &p, const GpuBatchArgs &b, int64_t grid) {
  if (p.normalize)
    EmulatePad<kConv, true>(p, b, grid);
  else
    EmulatePad<kConv, false>(p, b, grid);
}

// The typed conversion kernel for a pair of types, or the generic one; typed kernels dereference
// typed pointers, so misaligned samples (possible through the C API) take the generic kernel.
int ChooseConv(const SliceParams &params, const std::vector<SliceSample> &samples,
               const void *const *in, void *const *out) {
  if (!params.Convert()) return kCopy;
  int conv = kConvGeneric;
  const int in_type = params.in_type, out_type = params.out_type;
  if (in_type == kFloat32 && out_type == kFloat16) conv = kConvF32ToF16;
  else if (in_type == kFloat32 && out_type == kFloat32) conv = kConvF32ToF32;
  else if (in_type == kUInt8 && out_type == kFloat32) conv = kConvU8ToF32;
  else if (in_type == kFloat16 && out_type == kFloat32) conv = kConvF16ToF32;
  if (conv == kConvGeneric) return conv;
  const uintptr_t ia = DTypeSize(in_type), oa = DTypeSize(out_type);
  for (size_t i = 0; i < samples.size(); i++) {
    // the domain start and the output (pieces lie whole elements from them)
    const uintptr_t a = reinterpret_cast<uintptr_t>(in[i]) + samples[i].in_offset * ia;
    if (a % ia || reinterpret_cast<uintptr_t>(out[i]) % oa) return kConvGeneric;
  }
  return conv;
}

}  // namespace

const char *ConvKindName(int conv) {
  switch (conv) {
    case kCopy: return "copy";
    case kConvGeneric: return "generic";
    case kConvF32ToF16: return "float32->float16";
    case kConvF32ToF32: return "float32->float32";
    case kConvU8ToF32: return "uint8->float32";
    case kConvF16ToF32: return "float16->float32";
    default: return "unknown";
  }
}

GpuBatchArgs GpuPlan::Args(const void *base) const {
  const uint8_t *p = static_cast<const uint8_t *>(base);
  GpuBatchArgs a;
  a.samples = reinterpret_cast<const GpuSampleDesc *>(p + samples_offset);
  a.blocks = reinterpret_cast<const GpuBlockDesc *>(p + blocks_offset);
  a.mean = normalize ? reinterpret_cast<const float *>(p + mean_offset) : nullptr;
  a.stddev = normalize ? reinterpret_cast<const float *>(p + std_offset) : nullptr;
  a.in_type = in_type;
  a.out_type = out_type;
  return a;
}

std::string BuildGpuPlan(const std::vector<SliceSample> &samples, const void *const *in,
                         void *const *out, const SliceParams &params, GpuPlan *plan) {
  std::string err = CheckSliceParams(params);
  if (!err.empty()) return err;
  const int64_t n = static_cast<int64_t>(samples.size());
  const int esize = DTypeSize(params.in_type);
  plan->num_samples = n;
  plan->in_type = params.in_type;
  plan->out_type = params.out_type;
  plan->convert = params.Convert();
  plan->normalize = params.Normalize();

  // pieces: each sample's in-bounds box and the strips of its halo, collapsed
  std::vector<Piece> pieces;
  pieces.reserve(n);
  for (int64_t i = 0; i < n; i++) CutSample(i, samples[i], &pieces);
  for (Piece &p : pieces) CollapsePiece(&p);
  const int out_size = DTypeSize(params.out_type);
  auto piece_out = [&](const Piece &p) {
    return static_cast<uint8_t *>(out[p.sample]) + p.out_offset * out_size;
  };

  // copies: the widest vector each piece allows (an odd-sized or misaligned sample, or a halo
  // strip, takes element moves without slowing the others)
  plan->elem_size = 0;
  if (!plan->convert) {
    for (Piece &p : pieces) {
      p.width = esize;
      for (int w = 16; w > esize; w /= 2) {
        if (Vectorizable(p, in[p.sample], piece_out(p), esize, w / esize, w, w)) {
          p.width = w;
          break;
        }
      }
      if (p.width > esize) Widen(&p, p.width / esize);
      plan->elem_size = std::max(plan->elem_size, p.width);
    }
    if (pieces.empty()) plan->elem_size = esize;
  }
  plan->conv = ChooseConv(params, samples, in, out);
  if (plan->conv > kConvGeneric) {
    // typed conversions: 4 or 2 elements per move on the plain path (padded pieces, and pieces
    // whose innermost axis is the channel, take element moves)
    for (Piece &p : pieces) {
      if (p.s.NeedPad() || p.s.channel_axis == p.s.ndim - 1) continue;
      for (int k = 4; k > 1; k /= 2) {
        if (Vectorizable(p, in[p.sample], piece_out(p), esize, k, k * esize, k * out_size)) {
          p.vec = k;
          break;
        }
      }
      if (p.vec > 1) Widen(&p, p.vec);
    }
  }
  // per sample: the width of its largest piece (the in-bounds box unless the halo outweighs it)
  const bool typed = plan->conv > kConvGeneric;
  plan->sample_elem_size.assign(n, plan->convert ? (typed ? esize : 0) : esize);
  {
    std::vector<int64_t> largest(n, -1);
    for (const Piece &p : pieces) {
      const int bytes = plan->convert ? (typed ? p.vec * esize : 0) : p.width;
      const int64_t vol = p.s.OutVolume() * (plan->convert ? p.vec : p.width);
      if (vol > largest[p.sample]) {
        largest[p.sample] = vol;
        plan->sample_elem_size[p.sample] = bytes;
      }
    }
  }

  uint8_t fill1[8];
  FillBytes(params, fill1);

  const int64_t np = static_cast<int64_t>(pieces.size());
  plan->num_pieces = np;
  plan->piece_elements = 0;
  for (const Piece &p : pieces)
    plan->piece_elements += p.s.OutVolume() * (plan->convert ? p.vec : p.width / esize);
  std::vector<GpuSampleDesc> descs(np);
  uint64_t total = 0;
  plan->need_pad = false;
  for (int64_t j = 0; j < np; j++) {
    const Piece &p = pieces[j];
    const SliceSample &s = p.s;
    GpuSampleDesc &g = descs[j];
    std::memset(&g, 0, sizeof(g));
    g.in = static_cast<const uint8_t *>(in[p.sample]) + samples[p.sample].in_offset * esize;
    g.out = piece_out(p);
    g.ndim = s.ndim;
    g.channel_axis = s.channel_axis;
    g.channel_offset = s.channel_offset;
    g.need_pad = s.NeedPad() ? 1 : 0;
    g.elem_size = p.width;
    g.vec = p.vec;
    plan->need_pad |= g.need_pad != 0;
    for (int d = 0; d < s.ndim; d++) {
      g.boundary[d] = s.boundary[d];
      g.in_extent[d] = s.in_extent[d];
      g.in_stride[d] = s.in_stride[d];
      g.start[d] = s.start[d];
      g.step[d] = s.step[d];
      g.out_extent[d] = s.out_extent[d];
      g.out_stride[d] = p.out_stride[d];
      g.out_div[d].Init(s.out_extent[d] > 0 ? static_cast<uint64_t>(s.out_extent[d]) : 1);
    }
    for (int b = 0; b < 16; b += out_size) std::memcpy(g.fill + b, fill1, out_size);
    total += static_cast<uint64_t>(s.OutVolume());
  }

  // blocks: 4 to 64 elements per thread, about 2048 blocks for large batches
  uint64_t per_thread = (total + kBlockDim * 2048ull - 1) / (kBlockDim * 2048ull);
  per_thread = std::min<uint64_t>(std::max<uint64_t>(per_thread, 4), 64);
  const uint64_t block_elems = per_thread * kBlockDim;
  std::vector<GpuBlockDesc> blocks;
  blocks.reserve(total / block_elems + np);
  for (int64_t j = 0; j < np; j++) {
    uint64_t vol = static_cast<uint64_t>(pieces[j].s.OutVolume());
    for (uint64_t b = 0; b < vol; b += block_elems)
      blocks.push_back(GpuBlockDesc{j, b, std::min(vol, b + block_elems)});
  }
  plan->num_blocks = static_cast<int64_t>(blocks.size());
  if (plan->num_blocks > 0x7fffffff)
    return "the batch needs " + std::to_string(plan->num_blocks) +
           " CUDA blocks, more than a grid holds; split the batch";

  const size_t nch = params.mean.size();
  plan->samples_offset = 0;
  plan->blocks_offset = AlignUp(sizeof(GpuSampleDesc) * np, 64);
  plan->mean_offset = AlignUp(plan->blocks_offset + sizeof(GpuBlockDesc) * blocks.size(), 64);
  plan->std_offset = AlignUp(plan->mean_offset + sizeof(float) * nch, 64);
  plan->blob.assign(AlignUp(plan->std_offset + sizeof(float) * nch, 64), 0);
  if (np)
    std::memcpy(plan->blob.data() + plan->samples_offset, descs.data(), sizeof(GpuSampleDesc) * np);
  if (!blocks.empty())
    std::memcpy(plan->blob.data() + plan->blocks_offset, blocks.data(),
                sizeof(GpuBlockDesc) * blocks.size());
  if (nch) {
    std::memcpy(plan->blob.data() + plan->mean_offset, params.mean.data(), sizeof(float) * nch);
    std::memcpy(plan->blob.data() + plan->std_offset, params.stddev.data(), sizeof(float) * nch);
  }
  return "";
}

void EmulateGpuPlan(const GpuPlan &p, int64_t grid) {
  if (p.num_blocks == 0) return;
  const GpuBatchArgs b = p.Args(p.blob.data());
  if (grid <= 0) grid = 3;  // a few blocks striding over all descriptors, as on a busy GPU
  grid = std::min(grid, p.num_blocks);
  switch (p.conv) {
    case kCopy: EmulatePad<kCopy, false>(p, b, grid); break;
    case kConvF32ToF16: EmulateNorm<kConvF32ToF16>(p, b, grid); break;
    case kConvF32ToF32: EmulateNorm<kConvF32ToF32>(p, b, grid); break;
    case kConvU8ToF32: EmulateNorm<kConvU8ToF32>(p, b, grid); break;
    case kConvF16ToF32: EmulateNorm<kConvF16ToF32>(p, b, grid); break;
    default: EmulatePad<kConvGeneric, false>(p, b, grid); break;
  }
}

}  // namespace dali_mesh
