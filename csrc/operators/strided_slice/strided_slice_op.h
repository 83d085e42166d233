// dali_mesh: the DALI operator dali_mesh__StridedSlice (fn.dali_mesh.strided_slice), shared part:
// argument parsing (OpSpec and argument inputs -> one SliceSample per sample) and output shapes.
// The CPU (.cc) and GPU (.cu) operators only run the kernels on what this builds.
#ifndef DALI_MESH_STRIDED_SLICE_OP_H_
#define DALI_MESH_STRIDED_SLICE_OP_H_

#include <string>
#include <vector>

#include "dali/pipeline/operator/checkpointing/stateless_operator.h"
#include "dali/pipeline/operator/operator.h"
#include "kernels/slice_args.h"

namespace dali_mesh {

namespace detail {

// Integer values of a named argument for one sample: an argument input (any integer type, one
// value or a 1-D list per sample) or a constant list. `present` tells whether it was given.
inline std::vector<int64_t> IntsArg(const dali::OpSpec &spec, const dali::Workspace &ws,
                                    const std::string &name, int sample, bool *present) {
  std::vector<int64_t> v;
  *present = false;
  if (spec.HasTensorArgument(name)) {
    *present = true;
    const auto &t = ws.ArgumentInput(name);
    DALI_ENFORCE(sample < t.num_samples(),
                 dali::make_string("argument input \"", name, "\" has ", t.num_samples(),
                                   " samples; the batch has more"));
    const auto &sh = t.tensor_shape(sample);
    DALI_ENFORCE(sh.sample_dim() <= 1,
                 dali::make_string("argument input \"", name, "\" must be a scalar or a 1-D list "
                                   "per sample, got shape ", sh));
    int64_t n = dali::volume(sh);
    const void *p = t.raw_tensor(sample);
    v.resize(n);
    switch (t.type()) {
#define DM_CASE(ID, T) \
  case ID: for (int64_t k = 0; k < n; k++) v[k] = static_cast<int64_t>(static_cast<const T *>(p)[k]); break;
      DM_CASE(DALI_INT8, int8_t)
      DM_CASE(DALI_INT16, int16_t)
      DM_CASE(DALI_INT32, int32_t)
      DM_CASE(DALI_INT64, int64_t)
      DM_CASE(DALI_UINT8, uint8_t)
      DM_CASE(DALI_UINT16, uint16_t)
      DM_CASE(DALI_UINT32, uint32_t)
#undef DM_CASE
      case DALI_UINT64:
        for (int64_t k = 0; k < n; k++) {
          uint64_t x = static_cast<const uint64_t *>(p)[k];
          // a cast would turn 2**64 - 1 into -1: refuse what int64 cannot hold
          DALI_ENFORCE(x <= static_cast<uint64_t>(INT64_MAX),
                       dali::make_string("argument input \"", name, "\" of sample ", sample,
                                         " holds the uint64 value ", x, ", beyond the int64 range; "
                                         "pass values below 2**63"));
          v[k] = static_cast<int64_t>(x);
        }
        break;
      default:
        DALI_FAIL(dali::make_string("argument input \"", name, "\" has type ", t.type(),
                                    "; expected an integer type"));
    }
  } else if (spec.HasArgument(name)) {
    *present = true;
    for (int x : spec.GetRepeatedArgument<int>(name)) v.push_back(x);
  }
  return v;
}

}  // namespace detail

// Stateless (a function of its inputs and arguments): DALI's checkpoints need nothing from it.
template <typename Backend>
class StridedSliceBase : public dali::StatelessOperator<Backend> {
 public:
  explicit StridedSliceBase(const dali::OpSpec &spec) : dali::StatelessOperator<Backend>(spec) {
    if (spec.HasArgument("axes")) {
      all_axes_ = false;
      axes_ = spec.GetRepeatedArgument<int>("axes");
    }
    for (const std::string &name : spec.GetRepeatedArgument<std::string>("boundary")) {
      int mode = ParseBoundary(name);
      DALI_ENFORCE(mode >= 0 && mode != kTrim,
                   dali::make_string("boundary \"", name, "\" is not known; expected constant, "
                                     "periodic, reflect, symmetric or edge",
                                     mode == kTrim ? " (trim is a mesh_roi rule: its windows lie "
                                                     "inside the domain)" : ""));
      boundary_.push_back(mode);
    }
    DALI_ENFORCE(!boundary_.empty(), "boundary is empty; give one name, or one per axis");
    // fill_value travels as a float32 (DALI's float arguments); dali_mesh.fn also passes it as
    // text, exactly (an int32 16777217 or a float32 overflow stays what the user wrote)
    std::string fill_text;
    if (spec.TryGetArgument(fill_text, "fill_value_text") && !fill_text.empty()) {
      std::string err = ParseFillValue(fill_text, &params_);
      DALI_ENFORCE(err.empty(), "strided_slice: " + err);
    } else {
      params_.SetFill(spec.GetArgument<float>("fill_value"));
    }
    has_dtype_ = spec.TryGetArgument(dtype_, "dtype");
    if (spec.HasArgument("channel_axis")) {
      has_channel_axis_ = true;
      channel_axis_ = spec.GetArgument<int>("channel_axis");
    }
    if (spec.HasArgument("mean") || spec.HasArgument("std")) {
      params_.mean = spec.HasArgument("mean") ? spec.GetRepeatedArgument<float>("mean")
                                              : std::vector<float>();
      params_.stddev = spec.HasArgument("std") ? spec.GetRepeatedArgument<float>("std")
                                               : std::vector<float>();
      if (params_.mean.empty()) params_.mean.assign(params_.stddev.size(), 0.f);
      if (params_.stddev.empty()) params_.stddev.assign(params_.mean.size(), 1.f);
    }
  }

 protected:
  bool SetupImpl(std::vector<dali::OutputDesc> &output_desc, const dali::Workspace &ws) override {
    const auto &input = ws.Input<Backend>(0);
    const int n = input.num_samples();
    params_.in_type = static_cast<int>(input.type());
    DALI_ENFORCE(DTypeSize(params_.in_type) > 0,
                 dali::make_string("strided_slice: input type ", input.type(),
                                   " is not supported; expected a numeric type or bool"));
    params_.out_type = has_dtype_ ? static_cast<int>(dtype_)
                                  : (params_.Normalize() ? static_cast<int>(kFloat32)
                                                         : params_.in_type);
    DALI_ENFORCE(DTypeSize(params_.out_type) > 0,
                 dali::make_string("strided_slice: dtype ", dtype_, " is not supported; expected "
                                   "a numeric type or bool"));
    std::string err = CheckSliceParams(params_);
    DALI_ENFORCE(err.empty(), "strided_slice: " + err);

    const auto &spec = this->spec_;
    samples_.resize(n);
    const int ndim = input.sample_dim();
    dali::TensorListShape<> out_shape(n, ndim);
    for (int i = 0; i < n; i++) {
      SliceUserArgs u;
      for (int d = 0; d < ndim; d++) u.in_shape.push_back(input.tensor_shape_span(i)[d]);
      u.all_axes = all_axes_;
      u.axes = axes_;
      bool present;
      u.start = detail::IntsArg(spec, ws, "start", i, &present);
      u.shape = detail::IntsArg(spec, ws, "shape", i, &present);
      u.step = detail::IntsArg(spec, ws, "step", i, &present);
      u.boundary = boundary_;
      bool has_dom_start, has_dom_shape;
      u.domain_start = detail::IntsArg(spec, ws, "domain_start", i, &has_dom_start);
      u.domain_shape = detail::IntsArg(spec, ws, "domain_shape", i, &has_dom_shape);
      DALI_ENFORCE(has_dom_start == has_dom_shape,
                   "strided_slice: give both domain_start and domain_shape, or neither");
      u.has_channel_axis = has_channel_axis_;
      u.channel_axis = channel_axis_;
      err = MakeSliceSample(u, params_, &samples_[i]);
      DALI_ENFORCE(err.empty(), dali::make_string("strided_slice, sample ", i, ": ", err));
      auto os = out_shape.tensor_shape_span(i);
      for (int d = 0; d < ndim; d++) os[d] = samples_[i].out_extent[d];
    }
    output_desc.resize(1);
    output_desc[0].shape = std::move(out_shape);
    output_desc[0].type = static_cast<dali::DALIDataType>(params_.out_type);
    return true;
  }

  std::vector<int> axes_;
  bool all_axes_ = true;
  std::vector<int> boundary_;
  bool has_dtype_ = false;
  dali::DALIDataType dtype_ = DALI_NO_TYPE;
  bool has_channel_axis_ = false;
  int channel_axis_ = 0;
  SliceParams params_;
  std::vector<SliceSample> samples_;
};

}  // namespace dali_mesh

#endif  // DALI_MESH_STRIDED_SLICE_OP_H_
