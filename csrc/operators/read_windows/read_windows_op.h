// dali_mesh: the DALI operator dali_mesh__ReadWindows (fn.dali_mesh.read_windows), shared part:
// the plan set (loaded once from the plan file that dali_mesh.pipeline.native writes), the per-sample
// output shapes, and the three-phase execution on host memory (announce every range to the
// kernel; read the byte ranges in tasks of about `task_bytes`, each opening, checking and closing
// its file; swap, transpose and fill per sample).
// The CPU operator reads straight into its output; the mixed operator into pinned staging.
#ifndef DALI_MESH_READ_WINDOWS_OP_H_
#define DALI_MESH_READ_WINDOWS_OP_H_

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "dali/pipeline/operator/checkpointing/stateless_operator.h"
#include "dali/pipeline/operator/operator.h"
#include "kernels/read_plan.h"

namespace dali_mesh {

template <typename Backend>
class ReadWindowsBase : public dali::StatelessOperator<Backend> {
 public:
  explicit ReadWindowsBase(const dali::OpSpec &spec) : dali::StatelessOperator<Backend>(spec) {
    plans_ = LoadPlanSet(spec.GetArgument<std::string>("plan_file"));
    dtype_ = spec.GetArgument<dali::DALIDataType>("dtype");
    task_bytes_ = std::max<int64_t>(4096, spec.GetArgument<int64_t>("task_bytes"));
    prefetch_ = spec.GetArgument<bool>("prefetch");
    // a group larger than a task is read by several tasks (several threads)
    for (auto &plan : plans_.plans) SplitLargeGroups(&plan, task_bytes_);
    const int64_t size = dali::TypeTable::GetTypeInfo(dtype_).size();
    for (size_t p = 0; p < plans_.plans.size(); p++) {
      DALI_ENFORCE(plans_.plans[p].itemsize == size,
                   dali::make_string("read_windows: ", plans_.source, ": plan ", p, " has items of ",
                                     plans_.plans[p].itemsize, " bytes but dtype ", dtype_, " has ",
                                     size, "; define the pipeline again"));
    }
    // every sample's window (its finishing plan) has the same number of axes: the output's
    ndim_ = plans_.items.empty() ? 0 : plans_.plans[plans_.items[0].finish].ndim;
    for (const auto &it : plans_.items)
      DALI_ENFORCE(plans_.plans[it.finish].ndim == ndim_,
                   dali::make_string("read_windows: ", plans_.source, ": the samples' windows have "
                                     "different numbers of axes; define the pipeline again"));
    // the first file of each plan, named in messages about files that differ from it
    first_path_.assign(plans_.plans.size(), std::string());
    for (const auto &part : plans_.parts)
      if (first_path_[part.plan].empty()) first_path_[part.plan] = plans_.files[part.file].path;
  }

 protected:
  bool SetupImpl(std::vector<dali::OutputDesc> &output_desc, const dali::Workspace &ws) override {
    const auto &ids = ws.Input<dali::CPUBackend>(0);
    const int n = ids.num_samples();
    items_.resize(n);
    const int ndim = ndim_;
    dali::TensorListShape<> shape(n, ndim);
    for (int i = 0; i < n; i++) {
      DALI_ENFORCE(dali::volume(ids.tensor_shape(i)) == 1,
                   dali::make_string("read_windows: sample ", i, ": the input must be one sample id "
                                     "per sample, got shape ", ids.tensor_shape(i)));
      int64_t id = 0;
      switch (ids.type()) {
        case DALI_INT64: id = *static_cast<const int64_t *>(ids.raw_tensor(i)); break;
        case DALI_INT32: id = *static_cast<const int32_t *>(ids.raw_tensor(i)); break;
        default:
          DALI_FAIL(dali::make_string("read_windows: sample ids have type ", ids.type(),
                                      "; expected int32 or int64"));
      }
      DALI_ENFORCE(id >= 0 && id < static_cast<int64_t>(plans_.items.size()),
                   dali::make_string("read_windows: sample id ", id, " is out of range for the ",
                                     plans_.items.size(), " samples of ", plans_.source));
      items_[i] = plans_.items[id];
      const auto &plan = plans_.plans[items_[i].finish];
      auto sh = shape.tensor_shape_span(i);
      for (int d = 0; d < ndim; d++) sh[d] = plan.shape[d];
    }
    output_desc.resize(1);
    output_desc[0].shape = shape;
    output_desc[0].type = dtype_;
    return true;
  }

  // Reads every sample's window into `out[i]` (host memory of the output's size). `pool` may be
  // null (serial). Each task opens, checks, reads and closes its own file: at most one descriptor
  // per thread is open at once, whatever the batch size or the number of files per sample (a Zarr
  // sample has one per chunk touched).
  void ReadAll(const std::vector<char *> &out, dali::ThreadPool *pool) {
    auto run = [&](auto &&fn, int64_t tasks, auto &&cost) {
      if (pool == nullptr) {
        for (int64_t t = 0; t < tasks; t++) fn(t);
        return;
      }
      for (int64_t t = 0; t < tasks; t++) pool->AddWork([&fn, t](int) { fn(t); }, cost(t));
      pool->RunAll();
    };
    ReadAllImpl(out, run);
  }

  template <typename Run>
  void ReadAllImpl(const std::vector<char *> &out, Run &run) {
    const int n = static_cast<int>(items_.size());
    // the parts of this batch: (sample, part index in plans_.parts)
    batch_parts_.clear();
    for (int i = 0; i < n; i++)
      for (int64_t k = items_[i].part_begin; k < items_[i].part_end; k++) batch_parts_.push_back({i, k});
    const int64_t np = batch_parts_.size();
    staging_.resize(n);
    dsts_.resize(n);
    for (int i = 0; i < n; i++) {
      const auto &plan = plans_.plans[items_[i].finish];
      dsts_[i] = out[i];
      if (plan.fortran && plan.volume() > 0) {  // read the file order, transposed in step 3
        staging_[i].resize(plan.bytes());
        dsts_[i] = staging_[i].data();
      }
    }
    // the byte ranges, in tasks of about task_bytes_ (large groups were split at load, so one large
    // sample uses every thread); a part that reads nothing (a Zarr array's metadata file) is one
    // task that only opens and checks its file
    tasks_.clear();
    for (int64_t j = 0; j < np; j++) {
      const auto split = SplitGroups(plans_.plans[plans_.parts[batch_parts_[j].part].plan], task_bytes_);
      if (split.empty()) tasks_.push_back({j, 0, 0});
      for (auto &g : split) tasks_.push_back({j, g.first, g.second});
    }
    // 1: announce every range of the batch, so that cold reads of all files run at once
    if (prefetch_) {
      run([&](int64_t j) {
            const auto &part = plans_.parts[batch_parts_[j].part];
            PrefetchPath(plans_.files[part.file].path, plans_.plans[part.plan], part.base);
          },
          np, [&](int64_t) { return 0; });
    }
    // 2: per task: open and check the file (still what was planned for), read, close
    run([&](int64_t t) {
          const auto &task = tasks_[t];
          const auto &bp = batch_parts_[task.part];
          const auto &part = plans_.parts[bp.part];
          OpenFile file;
          file.Open(plans_.files[part.file], plans_.plans[part.plan], first_path_[part.plan]);
          thread_local std::vector<char> scratch;
          ReadGroups(file, plans_.plans[part.plan], part.base, task.g0, task.g1,
                     dsts_[bp.sample] + part.dst_base, &scratch);
        },
        static_cast<int64_t>(tasks_.size()), [&](int64_t t) { return tasks_[t].g1 - tasks_[t].g0; });
    // 3: transpose and boundary fills (those of plans filled on the device are left to the GPU)
    run([&](int64_t i) {
          const int64_t f = items_[i].finish;
          FinishWindow(plans_.plans[f], dsts_[i], out[i], !DeviceFills(f));
        },
        n, [&](int64_t) { return 0; });
  }

  bool DeviceFills(int64_t plan) const {
    return !device_fill_.empty() && device_fill_[plan];
  }

  struct BatchPart {
    int sample;
    int64_t part;
  };
  struct Task {
    int64_t part;  // index into batch_parts_
    int64_t g0, g1;
  };
  PlanSet plans_;
  std::vector<std::string> first_path_;
  dali::DALIDataType dtype_ = DALI_NO_TYPE;
  int64_t task_bytes_ = 4 << 20;
  bool prefetch_ = true;
  int ndim_ = 0;
  std::vector<PlanItem> items_;
  std::vector<std::vector<char>> staging_;
  std::vector<char *> dsts_;
  std::vector<BatchPart> batch_parts_;
  std::vector<Task> tasks_;
  // per plan: its boundary cells are filled on the device (the mixed operator), not on the host
  std::vector<uint8_t> device_fill_;
};

}  // namespace dali_mesh

#endif  // DALI_MESH_READ_WINDOWS_OP_H_
