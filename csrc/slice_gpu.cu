// dali_mesh: CUDA kernels and launch of the strided slice (see slice_gpu.h). DALI-free: the DALI GPU
// operator and the C entry point (dm_strided_slice_cuda) both launch through GpuSliceLauncher.
#include <cuda_runtime.h>

#include <string>

#include "slice_gpu.h"

namespace dali_mesh {

namespace {

template <typename Elem, bool kNeedPad, bool kConvert>
__global__ void __launch_bounds__(kBlockDim) StridedSliceKernel(GpuBatchArgs b) {
  RunBlock<Elem, kNeedPad, kConvert>(b, blockIdx.x, threadIdx.x, blockDim.x);
}

template <typename Elem, bool kConvert>
void LaunchPad(const GpuPlan &p, const GpuBatchArgs &b, cudaStream_t stream) {
  dim3 grid(static_cast<unsigned>(p.num_blocks));
  if (p.need_pad)
    StridedSliceKernel<Elem, true, kConvert><<<grid, kBlockDim, 0, stream>>>(b);
  else
    StridedSliceKernel<Elem, false, kConvert><<<grid, kBlockDim, 0, stream>>>(b);
}

std::string CudaError(const char *what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

}  // namespace

GpuSliceLauncher::~GpuSliceLauncher() {
  // Freeing synchronises with the device, so a kernel still reading device_ has finished.
  if (device_) cudaFree(device_);
  if (pinned_) cudaFreeHost(pinned_);
  if (copy_done_) cudaEventDestroy(static_cast<cudaEvent_t>(copy_done_));
  if (kernel_done_) cudaEventDestroy(static_cast<cudaEvent_t>(kernel_done_));
}

std::string GpuSliceLauncher::Run(const GpuPlan &plan, void *stream_handle) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  if (plan.num_blocks == 0) return "";
  cudaError_t e;
  int dev = -1;
  if ((e = cudaGetDevice(&dev)) != cudaSuccess) return CudaError("cudaGetDevice", e);
  if (device_id_ != dev || plan.blob.size() > capacity_) {
    // (re)allocate: cudaFree waits for the device, so the old buffers are no longer in use
    if (device_) cudaFree(device_);
    if (pinned_) cudaFreeHost(pinned_);
    if (copy_done_) cudaEventDestroy(static_cast<cudaEvent_t>(copy_done_));
    if (kernel_done_) cudaEventDestroy(static_cast<cudaEvent_t>(kernel_done_));
    device_ = pinned_ = copy_done_ = kernel_done_ = nullptr;
    capacity_ = 0;
    size_t cap = plan.blob.size() < 4096 ? 4096 : plan.blob.size() * 2;
    if ((e = cudaMalloc(&device_, cap)) != cudaSuccess) return CudaError("cudaMalloc", e);
    if ((e = cudaMallocHost(&pinned_, cap)) != cudaSuccess) return CudaError("cudaMallocHost", e);
    cudaEvent_t ev1, ev2;
    if ((e = cudaEventCreateWithFlags(&ev1, cudaEventDisableTiming)) != cudaSuccess)
      return CudaError("cudaEventCreate", e);
    copy_done_ = ev1;
    if ((e = cudaEventCreateWithFlags(&ev2, cudaEventDisableTiming)) != cudaSuccess)
      return CudaError("cudaEventCreate", e);
    kernel_done_ = ev2;
    capacity_ = cap;
    device_id_ = dev;
  } else {
    // pinned_ may still be the source of the previous upload (usually long finished)
    if ((e = cudaEventSynchronize(static_cast<cudaEvent_t>(copy_done_))) != cudaSuccess)
      return CudaError("cudaEventSynchronize", e);
    // device_ may still be read by the previous kernel on another stream
    if ((e = cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(kernel_done_), 0)) != cudaSuccess)
      return CudaError("cudaStreamWaitEvent", e);
  }
  std::memcpy(pinned_, plan.blob.data(), plan.blob.size());
  if ((e = cudaMemcpyAsync(device_, pinned_, plan.blob.size(), cudaMemcpyHostToDevice, stream)) !=
      cudaSuccess)
    return CudaError("cudaMemcpyAsync", e);
  if ((e = cudaEventRecord(static_cast<cudaEvent_t>(copy_done_), stream)) != cudaSuccess)
    return CudaError("cudaEventRecord", e);

  const GpuBatchArgs b = plan.Args(device_);
  if (plan.convert) {
    LaunchPad<uint8_t, true>(plan, b, stream);
  } else {
    switch (plan.elem_size) {
      case 1: LaunchPad<uint8_t, false>(plan, b, stream); break;
      case 2: LaunchPad<uint16_t, false>(plan, b, stream); break;
      case 4: LaunchPad<uint32_t, false>(plan, b, stream); break;
      case 8: LaunchPad<uint64_t, false>(plan, b, stream); break;
      default: LaunchPad<uint4, false>(plan, b, stream); break;
    }
  }
  if ((e = cudaGetLastError()) != cudaSuccess) return CudaError("strided_slice kernel launch", e);
  if ((e = cudaEventRecord(static_cast<cudaEvent_t>(kernel_done_), stream)) != cudaSuccess)
    return CudaError("cudaEventRecord", e);
  return "";
}

}  // namespace dali_mesh
