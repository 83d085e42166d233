// dali_mesh: the mixed (GPU output) operator of dali_mesh__ReadWindows: the windows are read on
// the CPU threads into pinned staging (byte swap, transpose and boundary fills done there, so only
// the window's bytes cross the bus, once), then copied asynchronously on the operator's stream.
// Host code only (compiled as C++). Two staging buffers alternate, so batch k+1 is read while the
// copies of batch k run; a buffer is reused only after its copies are done (an event).
//
// Boundary cells on the device: a plan whose copies and fills are one strided slice of the cells
// it reads (DeviceFillProgram: constant, reflect, symmetric, edge halos; periodic halos are read
// from the far side as ranges of their own) is not finished on the host: its window (cells read,
// halo not yet written) goes to a device scratch buffer, and one launch of the strided-slice kernel
// (GpuSliceLauncher) writes every such sample's output, halo included. Other plans (chained copies,
// more than kMaxDims axes, a second fill value) are finished on the host as before.
// DALI_MESH_DEVICE_FILL=0 finishes every plan on the host.
// Not yet here: GPUDirect Storage (cuFile).
#ifdef DALI_MESH_WITH_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dali/core/cuda_error.h"
#include "kernels/slice_gpu.h"
#include "operators/read_windows/read_windows_op.h"
#include "reader/device_fill.h"

namespace dali_mesh {

class ReadWindowsMixed : public ReadWindowsBase<dali::MixedBackend> {
 public:
  explicit ReadWindowsMixed(const dali::OpSpec &spec) : ReadWindowsBase<dali::MixedBackend>(spec) {
    DALI_ENFORCE(reader_.options().mean.empty(),
                 dali::make_string("read_windows: ", reader_.plans().source, ": mean/stddev normalise on the CPU "
                                   "operator only; on the GPU use strided_slice after the read"));
    const char *env = std::getenv("DALI_MESH_DEVICE_FILL");
    if (env != nullptr && std::strcmp(env, "0") == 0) return;
    fills_ = ChooseDeviceFills(reader_.plans(), static_cast<int>(dtype_));  // DType: DALI's numbers
    reader_.FillOnDevice(fills_.on);
  }

  ~ReadWindowsMixed() override {
    if (device_id_ < 0) return;  // nothing was allocated
    // free on the device the buffers belong to (the destroying thread may have another one
    // current), then give the caller its device back, as GpuSliceLauncher::Release does
    int prev = -1;
    cudaGetDevice(&prev);
    if (prev != device_id_) CUDA_DTOR_CALL(cudaSetDevice(device_id_));
    if (scratch_) CUDA_DTOR_CALL(cudaFree(scratch_));
    for (auto &s : staging_buf_) {
      if (s.event) {
        CUDA_DTOR_CALL(cudaEventSynchronize(s.event));
        CUDA_DTOR_CALL(cudaEventDestroy(s.event));
      }
      if (s.pinned) CUDA_DTOR_CALL(cudaFreeHost(s.pinned));
    }
    if (prev >= 0 && prev != device_id_) cudaSetDevice(prev);
  }

 protected:
  void RunImpl(dali::Workspace &ws) override {
    // the batch's windows: output j / n's of sample j % n (BatchReader::window_plan(j))
    const int n_ids = ws.Output<dali::GPUBackend>(0).num_samples();
    const int n = outputs() * n_ids;
    constexpr int64_t kAlign = 256;
    std::vector<int64_t> offset(n + 1, 0), bytes(n);
    for (int i = 0; i < n; i++) {
      bytes[i] = reader_.window_plan(i).bytes();
      offset[i + 1] = offset[i] + (bytes[i] + kAlign - 1) / kAlign * kAlign;
    }
    if (device_id_ < 0) CUDA_CALL(cudaGetDevice(&device_id_));  // DALI made the op's device current
    Staging &s = staging_buf_[next_];
    next_ ^= 1;
    if (s.event == nullptr) CUDA_CALL(cudaEventCreateWithFlags(&s.event, cudaEventDisableTiming));
    // the copies of two batches ago read this buffer: wait for them before overwriting it
    CUDA_CALL(cudaEventSynchronize(s.event));
    if (s.capacity < offset[n]) {
      const int64_t want = std::max<int64_t>(offset[n], s.capacity * 2);
      if (s.pinned) CUDA_CALL(cudaFreeHost(s.pinned));
      s.pinned = nullptr;
      s.capacity = 0;
      CUDA_CALL(cudaMallocHost(reinterpret_cast<void **>(&s.pinned), want));
      s.capacity = want;
    }
    host_.resize(n);
    for (int i = 0; i < n; i++) host_[i] = s.pinned + offset[i];
    ReadAll(host_, ws.HasThreadPool() ? &ws.GetThreadPool() : nullptr);
    // samples whose halo the device fills: their windows go to the scratch buffer first
    std::vector<int64_t> scratch_off(n, -1);
    int64_t scratch_bytes = 0;
    for (int i = 0; i < n; i++) {
      if (bytes[i] == 0 || !reader_.FillsOnDevice(reader_.window_plan_index(i))) continue;
      scratch_off[i] = scratch_bytes;
      scratch_bytes += (bytes[i] + kAlign - 1) / kAlign * kAlign;
    }
    if (scratch_bytes > scratch_capacity_) {
      // the last batch's kernel may still read the old buffer
      const int64_t want = std::max<int64_t>(scratch_bytes, scratch_capacity_ * 2);
      CUDA_CALL(cudaStreamSynchronize(ws.stream()));
      if (scratch_) CUDA_CALL(cudaFree(scratch_));
      scratch_ = nullptr;
      scratch_capacity_ = 0;
      CUDA_CALL(cudaMalloc(reinterpret_cast<void **>(&scratch_), want));
      scratch_capacity_ = want;
    }
    fill_samples_.clear();
    fill_in_.clear();
    fill_out_.clear();
    for (int i = 0; i < n; i++) {
      if (bytes[i] == 0) continue;
      void *dst = ws.Output<dali::GPUBackend>(i / n_ids).raw_mutable_tensor(i % n_ids);
      if (scratch_off[i] >= 0) {
        fill_samples_.push_back(fills_.program[reader_.window_plan_index(i)]);
        fill_in_.push_back(scratch_ + scratch_off[i]);
        fill_out_.push_back(dst);
        dst = scratch_ + scratch_off[i];
      }
      CUDA_CALL(cudaMemcpyAsync(dst, host_[i], bytes[i], cudaMemcpyHostToDevice, ws.stream()));
    }
    CUDA_CALL(cudaEventRecord(s.event, ws.stream()));
    if (!fill_samples_.empty()) {
      std::string err = BuildGpuPlan(fill_samples_, fill_in_.data(), fill_out_.data(), fills_.params,
                                     &fill_plan_);
      DALI_ENFORCE(err.empty(), dali::make_string("read_windows: ", reader_.plans().source,
                                                  ": the device boundary fill: ", err));
      err = launcher_.Run(fill_plan_, ws.stream());
      DALI_ENFORCE(err.empty(), dali::make_string("read_windows: the device boundary fill: ", err));
    }
  }

 private:
  struct Staging {
    char *pinned = nullptr;
    int64_t capacity = 0;
    cudaEvent_t event = nullptr;
  };
  int device_id_ = -1;  // the device of the buffers below (set at the first batch)
  Staging staging_buf_[2];
  int next_ = 0;
  std::vector<char *> host_;
  // device boundary fills
  DeviceFills fills_;  // which plans the device fills, their programs and the launch's parameters
  std::vector<SliceSample> fill_samples_;
  std::vector<const void *> fill_in_;
  std::vector<void *> fill_out_;
  GpuPlan fill_plan_;
  GpuSliceLauncher launcher_;
  char *scratch_ = nullptr;
  int64_t scratch_capacity_ = 0;
};

}  // namespace dali_mesh

namespace dali {
DALI_REGISTER_OPERATOR(dali_mesh__ReadWindows, ::dali_mesh::ReadWindowsMixed, Mixed);
}  // namespace dali
#endif  // DALI_MESH_WITH_CUDA
