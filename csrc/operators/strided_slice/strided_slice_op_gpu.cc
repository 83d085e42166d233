// dali_mesh: GPU operator of dali_mesh__StridedSlice: a thin shell over the DALI-free host code
// (BuildGpuPlan) and launcher (GpuSliceLauncher, slice_gpu.cu) that libdali_mesh_kernels.so also
// exports, so the ctypes GPU tests run the code that ships. Host code only: compiled as C++ (no
// device code here), which saves compiling DALI's headers once per CUDA architecture.
#include <vector>

#include "kernels/slice_gpu.h"
#include "operators/strided_slice/strided_slice_op.h"

namespace dali_mesh {

class StridedSliceGPU : public StridedSliceBase<dali::GPUBackend> {
 public:
  explicit StridedSliceGPU(const dali::OpSpec &spec) : StridedSliceBase<dali::GPUBackend>(spec) {}

 protected:
  void RunImpl(dali::Workspace &ws) override {
    const auto &input = ws.Input<dali::GPUBackend>(0);
    auto &output = ws.Output<dali::GPUBackend>(0);
    output.SetLayout(input.GetLayout());
    const int n = input.num_samples();
    in_ptrs_.resize(n);
    out_ptrs_.resize(n);
    for (int i = 0; i < n; i++) {
      in_ptrs_[i] = input.raw_tensor(i);
      out_ptrs_[i] = output.raw_mutable_tensor(i);
    }
    std::string err = BuildGpuPlan(samples_, in_ptrs_.data(), out_ptrs_.data(), params_, &plan_);
    DALI_ENFORCE(err.empty(), "strided_slice: " + err);
    err = launcher_.Run(plan_, ws.stream());
    DALI_ENFORCE(err.empty(), "strided_slice (GPU): " + err);
  }

 private:
  std::vector<const void *> in_ptrs_;
  std::vector<void *> out_ptrs_;
  GpuPlan plan_;
  GpuSliceLauncher launcher_;
};

}  // namespace dali_mesh

namespace dali {
DALI_REGISTER_OPERATOR(dali_mesh__StridedSlice, ::dali_mesh::StridedSliceGPU, GPU);
}  // namespace dali
