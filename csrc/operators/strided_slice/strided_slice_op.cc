// dali_mesh: schema of dali_mesh__StridedSlice and its CPU operator.
#include <algorithm>
#include <vector>

#include "kernels/slice_cpu.h"
#include "operators/strided_slice/strided_slice_op.h"

namespace dali_mesh {

class StridedSliceCPU : public StridedSliceBase<dali::CPUBackend> {
 public:
  explicit StridedSliceCPU(const dali::OpSpec &spec) : StridedSliceBase<dali::CPUBackend>(spec) {}

 protected:
  void RunImpl(dali::Workspace &ws) override {
    const auto &input = ws.Input<dali::CPUBackend>(0);
    auto &output = ws.Output<dali::CPUBackend>(0);
    output.SetLayout(input.GetLayout());
    const int n = input.num_samples();
    auto &tp = ws.GetThreadPool();
    ops_ = MakeCpuElementOps(params_);
    plans_.resize(n);
    const int in_size = DTypeSize(params_.in_type);
    // Split large samples into ranges of about 1 MiB of output, at most 4 per thread.
    constexpr int64_t kTaskBytes = 1 << 20;
    const int64_t max_tasks = std::max(1, tp.NumThreads()) * 4;
    for (int i = 0; i < n; i++) {
      PrepareCpuSlice(CollapseAxes(samples_[i]), input.raw_tensor(i), output.raw_mutable_tensor(i),
                      in_size, &plans_[i]);
      const int64_t vol = plans_[i].s.OutVolume();
      if (vol == 0) continue;
      const int64_t bytes = vol * ops_.out_size;
      const int64_t tasks = std::min(max_tasks, std::max<int64_t>(1, bytes / kTaskBytes));
      const int64_t per = (vol + tasks - 1) / tasks;
      for (int64_t b = 0; b < vol; b += per) {
        const int64_t e = std::min(vol, b + per);
        tp.AddWork([this, i, b, e](int) { RunCpuSlice(plans_[i], ops_, params_, b, e); }, e - b);
      }
    }
    tp.RunAll();
  }

 private:
  CpuElementOps ops_;
  std::vector<CpuSlicePlan> plans_;
};

}  // namespace dali_mesh

namespace dali {

DALI_SCHEMA(dali_mesh__StridedSlice)
    .DocStr(R"(Strided window of each sample with a boundary rule per axis, in one pass.

For each sample and each listed axis, ``out[i] = in[b(start + i * step)]``, where ``b`` maps a
position outside the axis (or outside the domain box) by that axis's boundary rule, numpy's
``np.pad`` names and meanings: ``constant`` (``fill_value``), ``periodic`` (``wrap``), ``reflect``
(edge not repeated), ``symmetric`` (edge repeated), ``edge``; any number of periods. Unlisted axes
are taken whole. With ``mean``/``std`` the values are ``(x - mean[c]) / std[c]`` in float32 (``c``:
the input's index on ``channel_axis``); ``constant`` cells hold ``fill_value`` as given. With
``dtype`` the output is cast (integers: rounded to nearest and saturated).)")
    .NumInput(1)
    .NumOutput(1)
    .InputDox(0, "input", "TensorList", "Samples of any numeric type or bool, any layout.")
    .AddArg("start", "Window start per listed axis (sample coordinates; may be negative).",
            DALI_INT_VEC, true)
    .AddArg("shape", "Window extent per listed axis (>= 0).", DALI_INT_VEC, true)
    .AddOptionalArg("step", "Step per listed axis (>= 1), or one for all.",
                                      std::vector<int>{1}, true)
    .AddOptionalArg<std::vector<int>>("axes", "Axes that start/shape/step refer to (default: all).",
                                      nullptr)
    .AddOptionalArg("boundary", "Boundary rule, one for all listed axes or one per listed axis.",
        std::vector<std::string>{"constant"})
    .AddOptionalArg("fill_value", "Value of constant cells (a float32; the output type must hold "
                    "it: integers of its range, or a float that does not overflow).", 0.0f)
    .AddOptionalArg("fill_value_text", "The fill value written as text, exactly (an integer or a "
                    "float, e.g. \"16777217\"); replaces fill_value when not empty. "
                    "dali_mesh.fn.strided_slice passes it.", std::string(""))
    .AddOptionalTypeArg("dtype", "Output type (default: the input's; float32 when normalising).")
    .AddOptionalArg<int>("channel_axis", "Axis whose index selects mean[c] and std[c].", nullptr)
    .AddOptionalArg<std::vector<float>>("mean", "Per-channel mean (or one value).", nullptr)
    .AddOptionalArg<std::vector<float>>("std", "Per-channel standard deviation (or one value).",
                                        nullptr)
    .AddOptionalArg<std::vector<int>>(
        "domain_start", "Start of the domain box per listed axis (default: the sample).", nullptr,
        true)
    .AddOptionalArg<std::vector<int>>(
        "domain_shape", "Extent of the domain box per listed axis: the boundary rule applies at "
        "its edges, as for a crop.", nullptr, true);

DALI_REGISTER_OPERATOR(dali_mesh__StridedSlice, ::dali_mesh::StridedSliceCPU, CPU);

}  // namespace dali
