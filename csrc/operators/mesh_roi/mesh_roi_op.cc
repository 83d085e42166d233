// dali_mesh: the DALI operator dali_mesh__MeshRoi (fn.dali_mesh.mesh_roi), CPU: the window of this
// rank for each sample's shape, by the rules of Python's Layout.region (csrc/kernels/mesh_roi.cc).
#include <string>
#include <vector>

#include "dali/pipeline/operator/checkpointing/stateless_operator.h"
#include "dali/pipeline/operator/operator.h"
#include "kernels/index_math.h"
#include "kernels/mesh_roi.h"
#include "kernels/slice_args.h"

namespace dali_mesh {

// Stateless (a function of its input shapes and arguments): DALI's checkpoints need nothing from it.
class MeshRoiCPU : public dali::StatelessOperator<dali::CPUBackend> {
 public:
  explicit MeshRoiCPU(const dali::OpSpec &spec) : dali::StatelessOperator<dali::CPUBackend>(spec) {
    for (int v : spec.GetRepeatedArgument<int>("mesh_shape")) args_.mesh_shape.push_back(v);
    for (int v : spec.GetRepeatedArgument<int>("coordinate")) args_.coordinate.push_back(v);
    for (int v : spec.GetRepeatedArgument<int>("shard_axes")) args_.shard_axes.push_back(v);
    for (int v : spec.GetRepeatedArgument<int>("halo_lo")) args_.halo_lo.push_back(v);
    for (int v : spec.GetRepeatedArgument<int>("halo_hi")) args_.halo_hi.push_back(v);
    for (const std::string &name : spec.GetRepeatedArgument<std::string>("boundary")) {
      int mode = ParseBoundary(name);
      DALI_ENFORCE(mode >= 0, dali::make_string("mesh_roi: boundary \"", name, "\" is not known; "
                                                "expected constant, periodic, reflect, symmetric, "
                                                "edge or trim"));
      args_.boundary.push_back(mode);
    }
    std::string split = spec.GetArgument<std::string>("split");
    args_.split = ParseSplit(split);
    DALI_ENFORCE(args_.split >= 0, dali::make_string("mesh_roi: split \"", split, "\" is not known; "
                                                     "expected chunk, physicsnemo, even or "
                                                     "explicit"));
    if (spec.HasArgument("split_size_counts") || spec.HasArgument("split_sizes")) {
      DALI_ENFORCE(spec.HasArgument("split_size_counts") && spec.HasArgument("split_sizes"),
                   "mesh_roi: give both split_size_counts and split_sizes, or neither");
      args_.split_size_counts = spec.GetRepeatedArgument<int64_t>("split_size_counts");
      args_.split_sizes = spec.GetRepeatedArgument<int64_t>("split_sizes");
    }
    if (spec.HasArgument("crop_start") || spec.HasArgument("crop_stop")) {
      DALI_ENFORCE(spec.HasArgument("crop_start") && spec.HasArgument("crop_stop"),
                   "mesh_roi: give both crop_start and crop_stop, or neither");
      for (int v : spec.GetRepeatedArgument<int>("crop_start")) args_.crop_start.push_back(v);
      for (int v : spec.GetRepeatedArgument<int>("crop_stop")) args_.crop_stop.push_back(v);
    }
    output_domain_ = spec.GetArgument<bool>("output_domain");
    std::string err = CheckMeshRoiArgs(args_);
    DALI_ENFORCE(err.empty(), "mesh_roi: " + err);
  }

 protected:
  bool SetupImpl(std::vector<dali::OutputDesc> &output_desc, const dali::Workspace &ws) override {
    const auto &input = ws.Input<dali::CPUBackend>(0);
    const int n = input.num_samples();
    DALI_ENFORCE(input.sample_dim() == 1,
                 dali::make_string("mesh_roi: the input must be a 1-D shape per sample (e.g. "
                                   "x.shape()), got ", input.sample_dim(), "-D samples"));
    dali::TensorListShape<> shape(n, 1);
    for (int i = 0; i < n; i++) shape.tensor_shape_span(i)[0] = input.tensor_shape(i)[0];
    const int nout = output_domain_ ? 4 : 2;
    output_desc.resize(nout);
    for (int k = 0; k < nout; k++) {
      output_desc[k].shape = shape;
      output_desc[k].type = DALI_INT64;
    }
    return true;
  }

  void RunImpl(dali::Workspace &ws) override {
    const auto &input = ws.Input<dali::CPUBackend>(0);
    const int n = input.num_samples();
    const int nout = output_domain_ ? 4 : 2;
    std::vector<int64_t *> outs(nout);
    for (int i = 0; i < n; i++) {
      const int ndim = static_cast<int>(input.tensor_shape(i)[0]);
      std::vector<int64_t> shape(ndim);
      const void *p = input.raw_tensor(i);
      switch (input.type()) {
        case DALI_INT64:
          for (int d = 0; d < ndim; d++) shape[d] = static_cast<const int64_t *>(p)[d];
          break;
        case DALI_INT32:
          for (int d = 0; d < ndim; d++) shape[d] = static_cast<const int32_t *>(p)[d];
          break;
        case DALI_UINT64:
          for (int d = 0; d < ndim; d++) {
            uint64_t x = static_cast<const uint64_t *>(p)[d];
            DALI_ENFORCE(x <= static_cast<uint64_t>(INT64_MAX),
                         dali::make_string("mesh_roi, sample ", i, ": shape value ", x,
                                           " is beyond the int64 range"));
            shape[d] = static_cast<int64_t>(x);
          }
          break;
        case DALI_UINT32:
          for (int d = 0; d < ndim; d++) shape[d] = static_cast<const uint32_t *>(p)[d];
          break;
        default:
          DALI_FAIL(dali::make_string("mesh_roi: the shape input has type ", input.type(),
                                      "; expected int32, int64, uint32 or uint64"));
      }
      for (int k = 0; k < nout; k++)
        outs[k] = static_cast<int64_t *>(ws.Output<dali::CPUBackend>(k).raw_mutable_tensor(i));
      std::string err = ComputeMeshRoi(shape.data(), ndim, args_, outs[0], outs[1],
                                       output_domain_ ? outs[2] : nullptr,
                                       output_domain_ ? outs[3] : nullptr);
      DALI_ENFORCE(err.empty(), dali::make_string("mesh_roi, sample ", i, ": ", err));
    }
  }

 private:
  MeshRoiArgs args_;
  bool output_domain_ = false;
};

}  // namespace dali_mesh

namespace dali {

DALI_SCHEMA(dali_mesh__MeshRoi)
    .DocStr(R"(Window of this rank of a device mesh for each sample's shape.

Outputs ``window_start`` and ``window_shape`` (int64, one value per axis): the owned cells of the
rank at ``coordinate`` (split by ``split``; two mesh dims sharding one axis are nested, outer mesh dim
first), plus ``halo_lo``/``halo_hi`` cells; positions outside the domain are kept for
``strided_slice`` to fill, except on ``trim`` axes, where the window is clipped to the domain. A rank
whose owned region is empty gets its owned region (zero cells, at the domain end). With
``output_domain=True`` two more outputs give the domain (``crop_start``, ``crop_stop - crop_start``,
or the whole sample).)")
    .NumInput(1)
    .NumOutput(2)
    .OutputFn([](const dali::OpSpec &spec) {
      return spec.GetArgument<bool>("output_domain") ? 4 : 2;
    })
    .InputDox(0, "shape", "TensorList",
              "Per-sample shape, a 1-D integer tensor (e.g. ``x.shape()`` or "
              "``fn.peek_image_shape(jpegs)``).")
    .AddArg("mesh_shape", "Ranks per mesh dim.", DALI_INT_VEC)
    .AddArg("coordinate", "This rank's coordinate, one per mesh dim.", DALI_INT_VEC)
    .AddArg("shard_axes", "Per mesh dim: the sample axis it shards, or -1.", DALI_INT_VEC)
    .AddOptionalArg("halo_lo", "Halo below, one value or one per axis.",
                                      std::vector<int>{0})
    .AddOptionalArg("halo_hi", "Halo above, one value or one per axis.",
                                      std::vector<int>{0})
    .AddOptionalArg("boundary", "Boundary rule, one or one per axis (trim clips the window to the domain).",
        std::vector<std::string>{"constant"})
    .AddOptionalArg("split",
                    "chunk (torch.chunk, DTensor), physicsnemo, even, or explicit (the sizes of "
                    "every shard in split_size_counts/split_sizes).",
                    std::string("chunk"))
    .AddOptionalArg<std::vector<int64_t>>(
        "split_size_counts",
        "split=explicit: per mesh dim, how many sizes it gives in split_sizes: 0, or on the "
        "innermost mesh dim sharding an axis the number of combined shards of that axis (the "
        "product of the sizes of the mesh dims sharding it).",
        nullptr)
    .AddOptionalArg<std::vector<int64_t>>(
        "split_sizes",
        "split=explicit: the shard sizes of every list in mesh-dim order; a list holds the combined "
        "shards of one axis, row-major over its mesh dims (outer first), and sums to the axis (or "
        "crop) length.",
        nullptr)
    .AddOptionalArg<std::vector<int>>("crop_start", "Domain box start per axis.", nullptr)
    .AddOptionalArg<std::vector<int>>("crop_stop", "Domain box stop per axis.", nullptr)
    .AddOptionalArg("output_domain", "Also output domain_start and domain_shape.", false);

DALI_REGISTER_OPERATOR(dali_mesh__MeshRoi, ::dali_mesh::MeshRoiCPU, CPU);

}  // namespace dali
