// dali_mesh: the mixed (GPU output) operator of dali_mesh__ReadWindows: the windows are read on
// the CPU threads into pinned staging (byte swap, transpose and boundary fills done there, so only
// the window's bytes cross the bus, once), then copied asynchronously on the operator's stream.
// Host code only (compiled as C++). Two staging buffers alternate, so batch k+1 is read while the
// copies of batch k run; a buffer is reused only after its copies are done (an event).
// Not yet here: GPUDirect Storage (cuFile) and device-side boundary fills.
#ifdef DALI_MESH_WITH_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "dali/core/cuda_error.h"
#include "read_windows_op.h"

namespace dali_mesh {

class ReadWindowsMixed : public ReadWindowsBase<dali::MixedBackend> {
 public:
  explicit ReadWindowsMixed(const dali::OpSpec &spec) : ReadWindowsBase<dali::MixedBackend>(spec) {}

  ~ReadWindowsMixed() override {
    for (auto &s : staging_buf_) {
      if (s.event) {
        CUDA_DTOR_CALL(cudaEventSynchronize(s.event));
        CUDA_DTOR_CALL(cudaEventDestroy(s.event));
      }
      if (s.pinned) CUDA_DTOR_CALL(cudaFreeHost(s.pinned));
    }
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
    for (int i = 0; i < n; i++) {
      if (bytes[i] == 0) continue;
      CUDA_CALL(cudaMemcpyAsync(output.raw_mutable_tensor(i), host_[i], bytes[i],
                                cudaMemcpyHostToDevice, ws.stream()));
    }
    CUDA_CALL(cudaEventRecord(s.event, ws.stream()));
  }

 private:
  struct Staging {
    char *pinned = nullptr;
    int64_t capacity = 0;
    cudaEvent_t event = nullptr;
  };
  Staging staging_buf_[2];
  int next_ = 0;
  std::vector<char *> host_;
};

}  // namespace dali_mesh

namespace dali {
DALI_REGISTER_OPERATOR(dali_mesh__ReadWindows, ::dali_mesh::ReadWindowsMixed, Mixed);
}  // namespace dali
#endif  // DALI_MESH_WITH_CUDA
