// dali_mesh: the DALI operator dali_mesh__ReadWindows (fn.dali_mesh.read_windows), shared part:
// the plan set (loaded once from the plan file that dali_mesh.pipeline.native writes), the per-sample
// output shapes, and the three-phase execution on host memory (announce every range to the
// kernel; read the byte ranges in tasks of about `task_bytes`, each opening, checking and closing
// its file; swap, transpose and fill per sample).
// With `outputs` K > 1 (a forecast's input and target) the plan set's items are K runs of one item
// per sample id, output k's first; the K windows of a batch are read as one batch of K * n, so a
// compressed chunk that several outputs need (a time chunk holding input and target steps, the
// target of one sample that is the input of another) is read and decoded once.
// The CPU operator reads straight into its output; the mixed operator into pinned staging.
#ifndef DALI_MESH_READ_WINDOWS_OP_H_
#define DALI_MESH_READ_WINDOWS_OP_H_

#include <algorithm>
#include <cmath>
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
    outputs_ = spec.GetArgument<int>("outputs");
    DALI_ENFORCE(outputs_ >= 1 && plans_.items.size() % outputs_ == 0,
                 dali::make_string("read_windows: ", plans_.source, ": ", plans_.items.size(), " items are not ",
                                   outputs_, " outputs' items per sample id; define the pipeline again"));
    num_ids_ = static_cast<int64_t>(plans_.items.size()) / outputs_;
    // a group larger than a task is read by several tasks (several threads); a coded plan's units
    // are copied from a decoded chunk, not read
    for (auto &plan : plans_.plans)
      if (!plan.coded) SplitLargeGroups(&plan, task_bytes_);
    const int64_t size = dali::TypeTable::GetTypeInfo(dtype_).size();
    for (size_t p = 0; p < plans_.plans.size(); p++) {
      DALI_ENFORCE(plans_.plans[p].itemsize == size,
                   dali::make_string("read_windows: ", plans_.source, ": plan ", p, " has items of ",
                                     plans_.plans[p].itemsize, " bytes but dtype ", dtype_, " has ",
                                     size, "; define the pipeline again"));
    }
    // every sample's window (its finishing plan) of an output has the same number of axes: the
    // output's
    ndim_.assign(outputs_, 0);
    for (int k = 0; k < outputs_; k++) {
      if (num_ids_ == 0) continue;
      ndim_[k] = plans_.plans[plans_.items[k * num_ids_].finish].ndim;
      for (int64_t id = 0; id < num_ids_; id++)
        DALI_ENFORCE(plans_.plans[plans_.items[k * num_ids_ + id].finish].ndim == ndim_[k],
                     dali::make_string("read_windows: ", plans_.source, ": the samples' windows have "
                                       "different numbers of axes; define the pipeline again"));
    }
    // per-channel normalisation of the finished windows (CPU operator: the mixed one refuses it)
    mean_ = spec.GetRepeatedArgument<float>("mean");
    stddev_ = spec.GetRepeatedArgument<float>("stddev");
    channel_axis_ = spec.GetArgument<int>("channel_axis");
    if (!mean_.empty() || !stddev_.empty()) {
      const std::string where = dali::make_string("read_windows: ", plans_.source, ": ");
      DALI_ENFORCE(mean_.size() == stddev_.size(),
                   dali::make_string(where, "mean has ", mean_.size(), " values, stddev ", stddev_.size()));
      DALI_ENFORCE(dtype_ == DALI_FLOAT, dali::make_string(where, "normalising needs float32 windows, not ", dtype_));
      for (int nd : ndim_)
        DALI_ENFORCE(channel_axis_ >= 0 && channel_axis_ < nd,
                     dali::make_string(where, "channel_axis ", channel_axis_, " is not an axis of the ", nd,
                                       "-dimensional windows"));
      for (size_t k = 0; k < stddev_.size(); k++)
        DALI_ENFORCE(std::isfinite(mean_[k]) && std::isfinite(stddev_[k]) && stddev_[k] != 0,
                     dali::make_string(where, "channel ", k, ": mean ", mean_[k], " and stddev ", stddev_[k],
                                       " must be finite, stddev not 0"));
      for (const auto &it : plans_.items)
        DALI_ENFORCE(plans_.plans[it.finish].shape[channel_axis_] == static_cast<int64_t>(mean_.size()),
                     dali::make_string(where, "the windows have ", plans_.plans[it.finish].shape[channel_axis_],
                                       " channels on axis ", channel_axis_, ", mean and stddev ", mean_.size()));
    }
    // the first file of each plan, named in messages about files that differ from it
    first_path_.assign(plans_.plans.size(), std::string());
    for (const auto &part : plans_.parts)
      if (first_path_[part.plan].empty())
        first_path_[part.plan] = plans_.files[plans_.plans[part.plan].coded ? plans_.chunks[part.file].file
                                                                              : part.file].key;
  }

 protected:
  bool SetupImpl(std::vector<dali::OutputDesc> &output_desc, const dali::Workspace &ws) override {
    const auto &ids = ws.Input<dali::CPUBackend>(0);
    const int n = ids.num_samples();
    items_.resize(static_cast<size_t>(outputs_) * n);  // output k's window of sample i: items_[k * n + i]
    output_desc.resize(outputs_);
    for (int k = 0; k < outputs_; k++) {
      output_desc[k].shape = dali::TensorListShape<>(n, ndim_[k]);
      output_desc[k].type = dtype_;
    }
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
      DALI_ENFORCE(id >= 0 && id < num_ids_,
                   dali::make_string("read_windows: sample id ", id, " is out of range for the ",
                                     num_ids_, " samples of ", plans_.source));
      for (int k = 0; k < outputs_; k++) {
        items_[k * n + i] = plans_.items[k * num_ids_ + id];
        const auto &plan = plans_.plans[items_[k * n + i].finish];
        auto sh = output_desc[k].shape.tensor_shape_span(i);
        for (int d = 0; d < ndim_[k]; d++) sh[d] = plan.shape[d];
      }
    }
    return true;
  }

  // Reads every window of the batch (items_[j]: output j / n's window of sample j % n) into
  // `out[j]` (host memory of the window's size). `pool` may be
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
    // compressed chunks: each chunk the batch needs is read and decoded once (one task), however
    // many parts (forecast steps, halo boxes, samples) copy from it: coded_ holds (chunk, batch
    // part) sorted by chunk, chunk_tasks_ the runs of one chunk
    tasks_.clear();
    coded_.clear();
    versions_.Reset(plans_.files.size());
    for (int64_t j = 0; j < np; j++) {
      const auto &part = plans_.parts[batch_parts_[j].part];
      if (plans_.plans[part.plan].coded) {
        coded_.push_back({part.file, j});
        continue;
      }
      const auto split = SplitGroups(plans_.plans[part.plan], task_bytes_);
      if (split.empty()) tasks_.push_back({j, 0, 0});
      for (auto &g : split) tasks_.push_back({j, g.first, g.second});
    }
    std::sort(coded_.begin(), coded_.end());
    chunk_tasks_.clear();
    for (size_t k = 0; k < coded_.size(); k++)
      if (k == 0 || coded_[k].first != coded_[k - 1].first) chunk_tasks_.push_back(k);
    const int64_t n_raw = tasks_.size(), n_chunk = chunk_tasks_.size();
    chunk_tasks_.push_back(coded_.size());
    // per chunk: the bytes of its decoded chunk that its parts copy out (only those are decoded; a
    // Blosc chunk is read in parts when they are few)
    chunk_ranges_.resize(n_chunk);
    for (int64_t t = 0; t < n_chunk; t++) {
      auto &ranges = chunk_ranges_[t];
      ranges.clear();
      for (int64_t k = chunk_tasks_[t]; k < chunk_tasks_[t + 1]; k++) {
        const auto &part = plans_.parts[batch_parts_[coded_[k].second].part];
        AddUnitRanges(plans_.plans[part.plan], part.base, &ranges);
      }
      MergeRanges(&ranges);
    }
    // 1: announce every range of the batch, so that cold reads of all files run at once
    if (prefetch_) {
      run([&](int64_t t) {
            if (t < np) {
              const auto &part = plans_.parts[batch_parts_[t].part];
              if (!plans_.plans[part.plan].coded)
                PrefetchPath(plans_.files[part.file], plans_.plans[part.plan], part.base);
              return;
            }
            const auto &ch = plans_.chunks[coded_[chunk_tasks_[t - np]].first];
            // a chunk read in parts: its header and block index (the kernel would read all it is told)
            const bool parts = MayReadInParts(plans_.coders[ch.coder], ch.nbytes, chunk_ranges_[t - np]);
            PrefetchRange(plans_.files[ch.file], ch.offset, parts ? std::min<int64_t>(ch.nbytes, 64 << 10) : ch.nbytes);
          },
          np + n_chunk, [&](int64_t) { return 0; });
    }
    // 2: per task: open and check the file (still what was planned for), read, close; or read and
    // decode a chunk and copy every part's units out of it
    run([&](int64_t t) {
          if (t >= n_raw) {
            const int64_t b = chunk_tasks_[t - n_raw], e = chunk_tasks_[t - n_raw + 1];
            const int64_t c = coded_[b].first;
            const auto &first = plans_.parts[batch_parts_[coded_[b].second].part];
            thread_local std::vector<char> stored, decoded;
            const int64_t chunk_bytes = plans_.coders[plans_.chunks[c].coder].chunk_bytes;
            const ReadPlan &first_plan = plans_.plans[first.plan];
            if (e - b == 1 && TakesWholeChunk(first_plan, first.base, chunk_bytes)) {
              // the chunk is the part's whole window (chunks that follow the shards): decoded
              // straight into it
              char *dst = dsts_[batch_parts_[coded_[b].second].sample] + first.dst_base + first_plan.dst_off[0];
              ReadChunk(plans_, c, first_plan, first_path_[first.plan], &stored, dst);
              SwapPlanUnits(first_plan, dsts_[batch_parts_[coded_[b].second].sample] + first.dst_base);
              return;
            }
            decoded.resize(chunk_bytes);
            // what the parts copy out of the chunk: only those bytes need decoding (a Blosc chunk
            // of a whole field decodes, and reads, the blocks of this rank's band)
            ReadChunk(plans_, c, first_plan, first_path_[first.plan], &stored, decoded.data(),
                      &chunk_ranges_[t - n_raw]);
            for (int64_t k = b; k < e; k++) {
              const auto &bp = batch_parts_[coded_[k].second];
              const auto &part = plans_.parts[bp.part];
              CopyUnits(plans_.plans[part.plan], decoded.data() + part.base, dsts_[bp.sample] + part.dst_base);
            }
            return;
          }
          const auto &task = tasks_[t];
          const auto &bp = batch_parts_[task.part];
          const auto &part = plans_.parts[bp.part];
          OpenFile file;
          file.Open(plans_.files[part.file], plans_.plans[part.plan], first_path_[part.plan]);
          versions_.Agree(part.file, file);  // a window read in several tasks: one version of its file
          thread_local std::vector<char> scratch;
          ReadGroups(file, plans_.plans[part.plan], part.base, task.g0, task.g1,
                     dsts_[bp.sample] + part.dst_base, &scratch);
          file.CheckUnchanged();
        },
        n_raw + n_chunk, [&](int64_t t) {
          if (t < n_raw) return tasks_[t].g1 - tasks_[t].g0;
          return plans_.chunks[coded_[chunk_tasks_[t - n_raw]].first].nbytes;
        });
    // 3: transpose and boundary fills (those of plans filled on the device are left to the GPU)
    run([&](int64_t i) {
          const int64_t f = items_[i].finish;
          FinishWindow(plans_.plans[f], dsts_[i], out[i], !DeviceFills(f));
          if (!mean_.empty()) NormalizeWindow(plans_.plans[f], out[i], channel_axis_, mean_, stddev_);
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
  std::vector<std::vector<std::pair<int64_t, int64_t>>> chunk_ranges_;
  std::vector<std::string> first_path_;
  dali::DALIDataType dtype_ = DALI_NO_TYPE;
  int64_t task_bytes_ = 4 << 20;
  bool prefetch_ = true;
  int outputs_ = 1;        // windows per sample id (the operator's outputs)
  int64_t num_ids_ = 0;    // sample ids the plan set has items for
  std::vector<int> ndim_;  // per output: its windows' number of axes
  std::vector<float> mean_, stddev_;  // empty: no normalisation
  int channel_axis_ = -1;
  std::vector<PlanItem> items_;
  std::vector<std::vector<char>> staging_;
  std::vector<char *> dsts_;
  std::vector<BatchPart> batch_parts_;
  std::vector<Task> tasks_;
  FileVersions versions_;  // each file's version, as the batch's first read of it found it
  std::vector<std::pair<int64_t, int64_t>> coded_;  // (chunk, index into batch_parts_)
  std::vector<int64_t> chunk_tasks_;                 // runs of coded_ with one chunk, and the end
  // per plan: its boundary cells are filled on the device (the mixed operator), not on the host
  std::vector<uint8_t> device_fill_;
};

}  // namespace dali_mesh

#endif  // DALI_MESH_READ_WINDOWS_OP_H_
