// dali_mesh: the DALI operator dali_mesh__ReadWindows (fn.dali_mesh.read_windows), shared part: the
// operator's arguments parsed into ReaderOptions and the plan set (loaded once from the plan file
// that dali_mesh.pipeline.native writes) handed to the DALI-free batch reader
// (csrc/reader/batch_reader.h), which does the work; the sample ids of a batch taken from the input,
// and the per-sample output shapes. The CPU operator reads straight into its output; the mixed
// operator into pinned staging.
#ifndef DALI_MESH_READ_WINDOWS_OP_H_
#define DALI_MESH_READ_WINDOWS_OP_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "dali/pipeline/operator/checkpointing/stateless_operator.h"
#include "dali/pipeline/operator/operator.h"
#include "reader/batch_reader.h"

namespace dali_mesh {

template <typename Backend>
class ReadWindowsBase : public dali::StatelessOperator<Backend> {
 public:
  explicit ReadWindowsBase(const dali::OpSpec &spec)
      : dali::StatelessOperator<Backend>(spec),
        dtype_(spec.GetArgument<dali::DALIDataType>("dtype")),
        reader_(LoadPlanSet(spec.GetArgument<std::string>("plan_file")), OptionsOf(spec)) {}

 protected:
  // DType numbers are DALI's DALIDataType numbers
  static ReaderOptions OptionsOf(const dali::OpSpec &spec) {
    ReaderOptions o;
    const auto dtype = spec.GetArgument<dali::DALIDataType>("dtype");
    o.dtype = static_cast<int>(dtype);
    o.dtype_name = dali::make_string(dtype);
    o.outputs = spec.GetArgument<int>("outputs");
    o.task_bytes = spec.GetArgument<int64_t>("task_bytes");
    o.prefetch = spec.GetArgument<bool>("prefetch");
    // per-channel normalisation of the finished windows (CPU operator: the mixed one refuses it)
    o.mean = spec.GetRepeatedArgument<float>("mean");
    o.stddev = spec.GetRepeatedArgument<float>("stddev");
    o.channel_axis = spec.GetArgument<int>("channel_axis");
    o.read_ahead = spec.GetArgument<int>("read_ahead");
    o.read_ahead_batches = spec.GetArgument<int>("read_ahead_batches");
    DALI_ENFORCE(o.read_ahead_batches >= 1 && o.read_ahead_batches <= kMaxAheadBatches,
                 dali::make_string("read_windows: read_ahead_batches must be 1 to ", kMaxAheadBatches, ", got ",
                                   o.read_ahead_batches));
    o.read_ahead_bytes = spec.GetArgument<int64_t>("read_ahead_bytes");
    return o;
  }

  int outputs() const { return reader_.options().outputs; }

  // The sample ids of input 0, one per sample.
  static void IdsOf(const dali::Workspace &ws, std::vector<int64_t> *out) {
    const auto &ids = ws.Input<dali::CPUBackend>(0);
    const int n = ids.num_samples();
    out->resize(n);
    for (int i = 0; i < n; i++) {
      DALI_ENFORCE(dali::volume(ids.tensor_shape(i)) == 1,
                   dali::make_string("read_windows: sample ", i, ": the input must be one sample id per sample, "
                                     "got shape ", ids.tensor_shape(i)));
      (*out)[i] = IdAt(ids, i, 0, "sample ids");
    }
  }

  // The ids of the batches after this one, input 1 (per sample, its ids in those batches: one id, or a
  // 1-D tensor of one per batch), batch-major in `out` (batch b's: out[b * n ..]); returns how many
  // batches there are (the fewest any sample gives).
  static int NextIdsOf(const dali::Workspace &ws, std::vector<int64_t> *out) {
    const auto &ids = ws.Input<dali::CPUBackend>(1);
    const int n = ids.num_samples();
    int64_t batches = n > 0 ? kMaxAheadBatches : 0;
    for (int i = 0; i < n; i++) {
      const auto &shape = ids.tensor_shape(i);
      DALI_ENFORCE(shape.sample_dim() <= 1,
                   dali::make_string("read_windows: sample ", i, ": the input of the next batches must be one ",
                                     "sample id per batch (a 1-D tensor), got shape ", shape));
      batches = std::min(batches, dali::volume(shape));
    }
    out->resize(batches * n);
    for (int64_t b = 0; b < batches; b++)
      for (int i = 0; i < n; i++) (*out)[b * n + i] = IdAt(ids, i, b, "next batches' sample ids");
    return static_cast<int>(batches);
  }

  static int64_t IdAt(const dali::TensorList<dali::CPUBackend> &ids, int i, int64_t k, const char *what) {
    switch (ids.type()) {
      case DALI_INT64: return static_cast<const int64_t *>(ids.raw_tensor(i))[k];
      case DALI_INT32: return static_cast<const int32_t *>(ids.raw_tensor(i))[k];
      default:
        DALI_FAIL(dali::make_string("read_windows: ", what, " have type ", ids.type(), "; expected int32 or int64"));
    }
  }

  bool SetupImpl(std::vector<dali::OutputDesc> &output_desc, const dali::Workspace &ws) override {
    IdsOf(ws, &ids_);
    const int n = static_cast<int>(ids_.size());
    // the next batches' ids (-1: none, past the epoch's last batch), read ahead while this one is read
    next_ids_.clear();
    next_batches_ = ws.NumInput() > 1 ? NextIdsOf(ws, &next_ids_) : 0;
    reader_.SetBatch(ids_.data(), n);
    output_desc.resize(outputs());
    for (int k = 0; k < outputs(); k++) {
      const int ndim = reader_.ndim(k);
      output_desc[k].shape = dali::TensorListShape<>(n, ndim);
      output_desc[k].type = dtype_;
      for (int i = 0; i < n; i++) {
        const auto &shape = reader_.window_plan(k * n + i).shape;
        auto sh = output_desc[k].shape.tensor_shape_span(i);
        for (int d = 0; d < ndim; d++) sh[d] = shape[d];
      }
    }
    return true;
  }

  // Reads every window of the batch (window j: output j / n's window of sample j % n) into `out[j]`
  // (host memory of the window's size), the tasks on `pool` (null: on this thread).
  void ReadAll(const std::vector<char *> &out, dali::ThreadPool *pool) {
    // the next batches start first, so that their round trips overlap this one's (those up to the
    // epoch's end: a batch with a -1 and those after it are not read ahead); at an epoch's last batch
    // (no next one) the buffers kept from batches read ahead are freed
    if (next_batches_ > 0) {
      const int n = static_cast<int>(ids_.size());
      int batches = 0;
      while (batches < next_batches_ && std::find(next_ids_.begin() + int64_t(batches) * n,
                                                  next_ids_.begin() + int64_t(batches + 1) * n,
                                                  int64_t(-1)) == next_ids_.begin() + int64_t(batches + 1) * n)
        batches++;
      reader_.ReadAheadBatches(next_ids_.data(), n, batches, pool ? pool->NumThreads() : 1);
      if (batches == 0) reader_.ReleaseSpare();
    }
    if (pool == nullptr) {
      reader_.Read(out, RunSerially);
      return;
    }
    reader_.Read(out, [pool](const TaskFn &fn, int64_t tasks, const TaskCost &cost) {
      for (int64_t t = 0; t < tasks; t++) pool->AddWork([&fn, t](int) { fn(t); }, cost(t));
      pool->RunAll();
    });
  }

  dali::DALIDataType dtype_ = DALI_NO_TYPE;
  BatchReader reader_;
  std::vector<int64_t> ids_, next_ids_;  // this batch's; the next batches', batch-major
  int next_batches_ = 0;
};

}  // namespace dali_mesh

#endif  // DALI_MESH_READ_WINDOWS_OP_H_
