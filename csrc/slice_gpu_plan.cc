// dali_mesh: host side of the GPU strided slice: descriptors, blocks, vectorisation, and the host
// emulation of the kernel (see slice_gpu.h). DALI-free and CUDA-free.
#include <algorithm>
#include <cstring>

#include "slice_gpu.h"

namespace dali_mesh {

namespace {

size_t AlignUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Whether a collapsed sample can move `width`-byte vectors of `esize`-byte elements.
bool Vectorizable(const SliceSample &s, const void *in, const void *out, int esize, int width) {
  if (s.OutVolume() == 0) return true;
  const int64_t k = width / esize;
  const int D = s.ndim;
  const int d = D - 1;
  if (s.step[d] != 1 || s.in_stride[d] != 1) return false;
  if (s.start[d] < 0 || s.start[d] + s.out_extent[d] > s.in_extent[d]) return false;  // inner pads
  if (s.start[d] % k || s.out_extent[d] % k) return false;
  for (int a = 0; a < D - 1; a++)
    if (s.in_stride[a] % k) return false;
  auto in_addr = reinterpret_cast<uintptr_t>(in) + static_cast<uintptr_t>(s.in_offset * esize);
  if (in_addr % width || reinterpret_cast<uintptr_t>(out) % width) return false;
  return true;
}

// Re-expresses a sample in elements of k = width / esize original elements.
SliceSample Widen(const SliceSample &s, int64_t k) {
  SliceSample w = s;
  const int d = s.ndim - 1;
  w.in_extent[d] = s.in_extent[d] / k;
  w.start[d] = s.start[d] / k;
  w.out_extent[d] = s.out_extent[d] / k;
  for (int a = 0; a < d; a++) w.in_stride[a] = s.in_stride[a] / k;
  w.in_offset = s.in_offset / k;  // only the pointer matters below; in_offset * esize is aligned
  return w;
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
int ChooseConv(const SliceParams &params, const std::vector<GpuSampleDesc> &descs) {
  if (!params.Convert()) return kCopy;
  int conv = kConvGeneric;
  const int in = params.in_type, out = params.out_type;
  if (in == kFloat32 && out == kFloat16) conv = kConvF32ToF16;
  else if (in == kFloat32 && out == kFloat32) conv = kConvF32ToF32;
  else if (in == kUInt8 && out == kFloat32) conv = kConvU8ToF32;
  else if (in == kFloat16 && out == kFloat32) conv = kConvF16ToF32;
  if (conv == kConvGeneric) return conv;
  const uintptr_t ia = DTypeSize(in), oa = DTypeSize(out);
  for (const GpuSampleDesc &g : descs)
    if (reinterpret_cast<uintptr_t>(g.in) % ia || reinterpret_cast<uintptr_t>(g.out) % oa)
      return kConvGeneric;
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

  std::vector<SliceSample> c(n);
  for (int64_t i = 0; i < n; i++) c[i] = CollapseAxes(samples[i]);

  // copies: the widest vector each sample allows, per sample (an odd-sized or misaligned sample
  // takes element moves without slowing the others)
  plan->sample_elem_size.assign(n, 0);
  plan->elem_size = 0;
  if (!plan->convert) {
    for (int64_t i = 0; i < n; i++) {
      int width = esize;
      for (int w = 16; w > esize; w /= 2) {
        if (Vectorizable(c[i], in[i], out[i], esize, w)) {
          width = w;
          break;
        }
      }
      if (width > esize) c[i] = Widen(c[i], width / esize);
      plan->sample_elem_size[i] = width;
      plan->elem_size = std::max(plan->elem_size, width);
    }
    if (n == 0) plan->elem_size = esize;
  }

  uint8_t fill1[8];
  FillBytes(params, fill1);
  const int out_size = DTypeSize(params.out_type);

  std::vector<GpuSampleDesc> descs(n);
  uint64_t total = 0;
  plan->need_pad = false;
  for (int64_t i = 0; i < n; i++) {
    const SliceSample &s = c[i];
    GpuSampleDesc &g = descs[i];
    std::memset(&g, 0, sizeof(g));
    g.in = static_cast<const uint8_t *>(in[i]) + samples[i].in_offset * esize;
    g.out = out[i];
    g.ndim = s.ndim;
    g.channel_axis = s.channel_axis;
    g.channel_offset = s.channel_offset;
    g.need_pad = s.NeedPad() ? 1 : 0;
    g.elem_size = plan->convert ? 0 : plan->sample_elem_size[i];
    plan->need_pad |= g.need_pad != 0;
    for (int d = 0; d < s.ndim; d++) {
      g.boundary[d] = s.boundary[d];
      g.in_extent[d] = s.in_extent[d];
      g.in_stride[d] = s.in_stride[d];
      g.start[d] = s.start[d];
      g.step[d] = s.step[d];
      g.out_extent[d] = s.out_extent[d];
      g.out_div[d].Init(s.out_extent[d] > 0 ? static_cast<uint64_t>(s.out_extent[d]) : 1);
    }
    for (int b = 0; b < 16; b += out_size) std::memcpy(g.fill + b, fill1, out_size);
    total += static_cast<uint64_t>(s.OutVolume());
  }

  plan->conv = ChooseConv(params, descs);

  // blocks: 4 to 64 elements per thread, about 2048 blocks for large batches
  uint64_t per_thread = (total + kBlockDim * 2048ull - 1) / (kBlockDim * 2048ull);
  per_thread = std::min<uint64_t>(std::max<uint64_t>(per_thread, 4), 64);
  const uint64_t block_elems = per_thread * kBlockDim;
  std::vector<GpuBlockDesc> blocks;
  blocks.reserve(total / block_elems + n);
  for (int64_t i = 0; i < n; i++) {
    uint64_t vol = static_cast<uint64_t>(c[i].OutVolume());
    for (uint64_t b = 0; b < vol; b += block_elems)
      blocks.push_back(GpuBlockDesc{i, b, std::min(vol, b + block_elems)});
  }
  plan->num_blocks = static_cast<int64_t>(blocks.size());
  if (plan->num_blocks > 0x7fffffff)
    return "the batch needs " + std::to_string(plan->num_blocks) +
           " CUDA blocks, more than a grid holds; split the batch";

  const size_t nch = params.mean.size();
  plan->samples_offset = 0;
  plan->blocks_offset = AlignUp(sizeof(GpuSampleDesc) * n, 64);
  plan->mean_offset = AlignUp(plan->blocks_offset + sizeof(GpuBlockDesc) * blocks.size(), 64);
  plan->std_offset = AlignUp(plan->mean_offset + sizeof(float) * nch, 64);
  plan->blob.assign(AlignUp(plan->std_offset + sizeof(float) * nch, 64), 0);
  if (n) std::memcpy(plan->blob.data() + plan->samples_offset, descs.data(), sizeof(GpuSampleDesc) * n);
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
