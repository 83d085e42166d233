// dali_mesh: CUDA kernels and launch of the strided slice (see slice_gpu.h). DALI-free: the DALI GPU
// operator and the C entry point (dm_strided_slice_cuda) both launch through GpuSliceLauncher.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "kernels/slice_gpu.h"

namespace dali_mesh {

namespace {

// A grid sized to the GPU strides over the block descriptors (a batch may have many more).
// Bounded by the block size only: with a minimum of 4 blocks per SM (<= 64 registers) 18 of the 20
// instantiations spilled (216-1520 bytes of spill stores, ptxas -v, sm_90, CUDA 13.0); without it
// none spills, at 60-106 registers (2-4 blocks of 256 per SM, the occupancy calculator sizes the
// grid). tests/pipeline/test_build.py compiles this file with ptxas -v and refuses any spill.
// DALI_MESH_MIN_BLOCKS_PER_SM (CMake option, default 0: none) brings the minimum back, for `make
// gpu-check` to time both on a GPU (it builds a second kernels library with 4).
#if defined(DALI_MESH_MIN_BLOCKS_PER_SM) && DALI_MESH_MIN_BLOCKS_PER_SM > 0
#define DALI_MESH_KERNEL_BOUNDS __launch_bounds__(kBlockDim, DALI_MESH_MIN_BLOCKS_PER_SM)
#else
#define DALI_MESH_KERNEL_BOUNDS __launch_bounds__(kBlockDim)
#endif
template <bool kNeedPad, int kConv, bool kNorm>
__global__ void DALI_MESH_KERNEL_BOUNDS StridedSliceKernel(GpuBatchArgs b, int64_t num_blocks) {
  for (int64_t blk = blockIdx.x; blk < num_blocks; blk += gridDim.x)
    RunBlock<kNeedPad, kConv, kNorm>(b, blk, threadIdx.x, blockDim.x);
}

std::string CudaError(const char *what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

// Resident blocks per SM of a kernel, from the occupancy calculator, once per kernel and device
// (a launcher stays on one device; a few ints per instantiation).
template <bool kNeedPad, int kConv, bool kNorm>
int BlocksPerSM(int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];  // zero-initialised (static storage)
  if (device >= 0 && device < kMaxDevices && cache[device].load() > 0) return cache[device].load();
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &blocks, StridedSliceKernel<kNeedPad, kConv, kNorm>, kBlockDim, 0) != cudaSuccess ||
      blocks <= 0) {
    cudaGetLastError();  // clear it: a fallback grid is still correct
    blocks = 4;
  }
  if (device >= 0 && device < kMaxDevices) cache[device].store(blocks);
  return blocks;
}

template <bool kNeedPad, int kConv, bool kNorm>
void Launch(const GpuPlan &p, const GpuBatchArgs &b, cudaStream_t stream, int device, int sms) {
  const int64_t resident = static_cast<int64_t>(sms) * BlocksPerSM<kNeedPad, kConv, kNorm>(device);
  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(p.num_blocks, resident));
  StridedSliceKernel<kNeedPad, kConv, kNorm>
      <<<static_cast<unsigned>(grid), kBlockDim, 0, stream>>>(b, p.num_blocks);
}

template <int kConv, bool kNorm>
void LaunchPad(const GpuPlan &p, const GpuBatchArgs &b, cudaStream_t stream, int device, int sms) {
  if (p.need_pad)
    Launch<true, kConv, kNorm>(p, b, stream, device, sms);
  else
    Launch<false, kConv, kNorm>(p, b, stream, device, sms);
}

template <int kConv>
void LaunchNorm(const GpuPlan &p, const GpuBatchArgs &b, cudaStream_t stream, int device, int sms) {
  if (p.normalize)
    LaunchPad<kConv, true>(p, b, stream, device, sms);
  else
    LaunchPad<kConv, false>(p, b, stream, device, sms);
}

}  // namespace

void GpuSliceLauncher::Release() {
  if (device_id_ < 0) return;
  // free on the device the buffers belong to, then give the caller its device back
  int prev = -1;
  cudaGetDevice(&prev);
  if (prev != device_id_) cudaSetDevice(device_id_);
  for (int k = 0; k < kRing; k++) {
    if (done_[k]) {
      cudaEventSynchronize(static_cast<cudaEvent_t>(done_[k]));  // its kernel has read the slot
      cudaEventDestroy(static_cast<cudaEvent_t>(done_[k]));
    }
    if (device_[k]) cudaFree(device_[k]);
    if (pinned_[k]) cudaFreeHost(pinned_[k]);
    device_[k] = pinned_[k] = done_[k] = nullptr;
    capacity_[k] = 0;
  }
  if (prev >= 0 && prev != device_id_) cudaSetDevice(prev);
  device_id_ = -1;
  next_ = 0;
}

GpuSliceLauncher::~GpuSliceLauncher() { Release(); }

std::string GpuSliceLauncher::Run(const GpuPlan &plan, void *stream_handle) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  if (plan.num_blocks == 0) return "";
  cudaError_t e;
  int dev = -1;
  if ((e = cudaGetDevice(&dev)) != cudaSuccess) return CudaError("cudaGetDevice", e);
  if (dev != device_id_) {  // first use, or another device: start over there
    Release();
    if ((e = cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
      return CudaError("cudaDeviceGetAttribute(MultiProcessorCount)", e);
    device_id_ = dev;
  }
  const int k = next_;
  next_ = (next_ + 1) % kRing;
  if (done_[k]) {
    // the slot's previous batch (kRing launches ago) must have been uploaded and read; a host wait
    // only when the GPU is that far behind
    if ((e = cudaEventSynchronize(static_cast<cudaEvent_t>(done_[k]))) != cudaSuccess)
      return CudaError("cudaEventSynchronize", e);
  } else {
    cudaEvent_t ev;
    if ((e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) != cudaSuccess)
      return CudaError("cudaEventCreate", e);
    done_[k] = ev;
  }
  const size_t size = plan.blob.size();
  if (size > capacity_[k]) {
    // grow geometrically: allocation and cudaFree synchronise the device, so rarely
    const size_t cap = std::max<size_t>({size, 2 * capacity_[k], 64 << 10});
    if (device_[k]) cudaFree(device_[k]);
    if (pinned_[k]) cudaFreeHost(pinned_[k]);
    device_[k] = pinned_[k] = nullptr;
    capacity_[k] = 0;
    if ((e = cudaMalloc(&device_[k], cap)) != cudaSuccess) return CudaError("cudaMalloc", e);
    if ((e = cudaMallocHost(&pinned_[k], cap)) != cudaSuccess) return CudaError("cudaMallocHost", e);
    capacity_[k] = cap;
  }
  std::memcpy(pinned_[k], plan.blob.data(), size);
  if ((e = cudaMemcpyAsync(device_[k], pinned_[k], size, cudaMemcpyHostToDevice, stream)) !=
      cudaSuccess)
    return CudaError("cudaMemcpyAsync", e);

  const GpuBatchArgs b = plan.Args(device_[k]);
  const int sms = sm_count_;
  // DALI_MESH_KERNEL_PART 1 or 2 (tests/pipeline/test_build.py only): an object file with one part
  // of the kernel instantiations, so that their ptxas report is made by two nvcc processes at once
#if !defined(DALI_MESH_KERNEL_PART) || DALI_MESH_KERNEL_PART != 2
  switch (plan.conv) {
    case kCopy: LaunchPad<kCopy, false>(plan, b, stream, dev, sms); break;
    case kConvF32ToF16: LaunchNorm<kConvF32ToF16>(plan, b, stream, dev, sms); break;
    case kConvF32ToF32: LaunchNorm<kConvF32ToF32>(plan, b, stream, dev, sms); break;
#if !defined(DALI_MESH_KERNEL_PART)
    case kConvU8ToF32: LaunchNorm<kConvU8ToF32>(plan, b, stream, dev, sms); break;
    case kConvF16ToF32: LaunchNorm<kConvF16ToF32>(plan, b, stream, dev, sms); break;
#endif
    default: LaunchPad<kConvGeneric, false>(plan, b, stream, dev, sms); break;
  }
#else
  switch (plan.conv) {
    case kConvU8ToF32: LaunchNorm<kConvU8ToF32>(plan, b, stream, dev, sms); break;
    case kConvF16ToF32: LaunchNorm<kConvF16ToF32>(plan, b, stream, dev, sms); break;
    default: break;
  }
#endif
  if ((e = cudaGetLastError()) != cudaSuccess) return CudaError("strided_slice kernel launch", e);
  // after the kernel: the upload from pinned_[k] and the reads of device_[k] are both done
  if ((e = cudaEventRecord(static_cast<cudaEvent_t>(done_[k]), stream)) != cudaSuccess)
    return CudaError("cudaEventRecord", e);
  return "";
}

}  // namespace dali_mesh
