// dali_mesh: the mixed (GPU output) operator of dali_mesh__ReadWindows: the windows are read on
// the CPU threads into pinned staging (byte swap, transpose and boundary fills done there, so only
// the window's bytes cross the bus, once), then copied asynchronously on the operator's stream.
// Host code only (compiled as C++). The staging of a batch is reused for the next one only after
// its copies are done (an event). Not yet here: GPUDirect Storage (cuFile) and device-side fills.
#ifdef DALI_MESH_WITH_CUDA
#include <cuda_runtime_api.h>

#include <vector>

#include "dali/core/cuda_error.h"
#include "read_windows_op.h"

namespace dali_mesh {

class ReadWindowsMixed : public ReadWindowsBase<dali::MixedBackend> {
 public:
  explicit ReadWindowsMixed(const dali::OpSpec &spec) : ReadWindowsBase<dali::MixedBackend>(spec) {}

  ~ReadWindowsMixed() override {
    if (event_) {
      CUDA_DTOR_CALL(cudaEventSynchronize(event_));
      CUDA_DTOR_CALL(cudaEventDestroy(event_));
    }
    if (pinned_) CUDA_DTOR_CALL(cudaFreeHost(pinned_));
  }

 protected:
  void RunImpl(dali::Workspace &ws) override {
    auto &output = ws.Output<dali::GPUBackend>(0);
    const int n = output.num_samples();
    constexpr int64_t kAlign = 256;
    std::vector<int64_t> offset(n + 1, 0), bytes(n);
    for (int i = 0; i < n; i++) {
      bytes[i] = plans_.plans[items_[i].finish].bytes();
      offset[i + 1] = offset[i] + (bytes[i] + kAlign - 1) / kAlign * kAlign;
    }
    if (event_ == nullptr) CUDA_CALL(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    // the previous batch's copies read the staging: wait for them before overwriting it
    CUDA_CALL(cudaEventSynchronize(event_));
    if (capacity_ < offset[n]) {
      const int64_t want = std::max<int64_t>(offset[n], capacity_ * 2);
      if (pinned_) CUDA_CALL(cudaFreeHost(pinned_));
      pinned_ = nullptr;
      capacity_ = 0;
      CUDA_CALL(cudaMallocHost(reinterpret_cast<void **>(&pinned_), want));
      capacity_ = want;
    }
    host_.resize(n);
    for (int i = 0; i < n; i++) host_[i] = pinned_ + offset[i];
    ReadAll(host_, ws.HasThreadPool() ? &ws.GetThreadPool() : nullptr);
    for (int i = 0; i < n; i++) {
      if (bytes[i] == 0) continue;
      CUDA_CALL(cudaMemcpyAsync(output.raw_mutable_tensor(i), host_[i], bytes[i],
                                      cudaMemcpyHostToDevice, ws.stream()));
    }
    CUDA_CALL(cudaEventRecord(event_, ws.stream()));
  }

 private:
  char *pinned_ = nullptr;
  int64_t capacity_ = 0;
  cudaEvent_t event_ = nullptr;
  std::vector<char *> host_;
};

}  // namespace dali_mesh

namespace dali {
DALI_REGISTER_OPERATOR(dali_mesh__ReadWindows, ::dali_mesh::ReadWindowsMixed, Mixed);
}  // namespace dali
#endif  // DALI_MESH_WITH_CUDA
