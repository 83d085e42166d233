// dali_mesh: schema of dali_mesh__ReadWindows and its CPU operator: the windows are read with
// preadv on DALI's thread pool straight into the output samples.
//
// The output samples come from the operator's own buffer pool, not from DALI's allocator: a fresh
// 16 MiB allocation is a new mapping whose every page faults on first touch, which measured here
// cost 3x the read itself (benchmarks/native_read_results.md). A pooled buffer returns to the pool
// when DALI (and the user) drop the last reference to it, so no sample is ever overwritten while
// someone holds it. Each batch is one contiguous buffer (as DALI's own allocation would be).
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "operators/read_windows/read_windows_op.h"

namespace dali_mesh {

namespace detail {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  ~BufferPool() {
    for (auto &kv : free_) std::free(kv.second);
  }

  // A buffer of `bytes`; it comes back here when the last shared_ptr to it goes.
  std::shared_ptr<void> Get(size_t bytes) {
    void *p = nullptr;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = free_.find(bytes);
      if (it != free_.end()) {
        p = it->second;
        free_.erase(it);
        free_bytes_ -= bytes;
      }
    }
    if (p == nullptr) {
      p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
      if (p == nullptr) throw std::bad_alloc();
    }
    std::weak_ptr<BufferPool> pool = weak_from_this();
    return std::shared_ptr<void>(p, [pool, bytes](void *q) {
      if (auto self = pool.lock()) {
        self->Put(q, bytes);
      } else {
        std::free(q);
      }
    });
  }

  // Keep at most this many bytes of free buffers (the rest is freed).
  void SetLimit(size_t bytes) {
    std::lock_guard<std::mutex> g(mu_);
    limit_ = bytes;
  }

 private:
  void Put(void *p, size_t bytes) {
    std::lock_guard<std::mutex> g(mu_);
    if (free_bytes_ + bytes <= limit_) {
      free_.emplace(bytes, p);
      free_bytes_ += bytes;
    } else {
      std::free(p);
    }
  }

  std::mutex mu_;
  std::multimap<size_t, void *> free_;
  size_t free_bytes_ = 0, limit_ = 0;
};

}  // namespace detail

class ReadWindowsCPU : public ReadWindowsBase<dali::CPUBackend> {
 public:
  explicit ReadWindowsCPU(const dali::OpSpec &spec)
      : ReadWindowsBase<dali::CPUBackend>(spec), pool_(std::make_shared<detail::BufferPool>()) {}

 protected:
  bool SetupImpl(std::vector<dali::OutputDesc> &output_desc, const dali::Workspace &ws) override {
    ReadWindowsBase<dali::CPUBackend>::SetupImpl(output_desc, ws);
    shape_.resize(output_desc.size());
    for (size_t k = 0; k < output_desc.size(); k++) shape_[k] = output_desc[k].shape;
    return false;  // RunImpl sets the samples, from the pool
  }

  void RunImpl(dali::Workspace &ws) override {
    const int n = shape_[0].num_samples();
    const size_t es = dali::TypeTable::GetTypeInfo(dtype_).size();
    std::vector<size_t> batch_bytes(outputs(), 0);
    size_t all_bytes = 0;
    for (int k = 0; k < outputs(); k++) {
      for (int i = 0; i < n; i++) batch_bytes[k] += dali::volume(shape_[k].tensor_shape_span(i)) * es;
      all_bytes += batch_bytes[k];
    }
    // enough for the batches DALI's queues and the user may hold at once
    pool_->SetLimit(4 * all_bytes);
    out_.resize(static_cast<size_t>(outputs()) * n);
    for (int k = 0; k < outputs(); k++) {
      // one contiguous buffer per output's batch: a pipeline output that is not contiguous would be
      // copied into one (MakeContiguous)
      auto &output = ws.Output<dali::CPUBackend>(k);
      auto buf = pool_->Get(batch_bytes[k]);
      output.Reset();
      output.ShareData(buf, batch_bytes[k], false, shape_[k], dtype_, dali::CPU_ONLY_DEVICE_ID,
                       dali::AccessOrder::host());
      for (int i = 0; i < n; i++) out_[k * n + i] = static_cast<char *>(output.raw_mutable_tensor(i));
    }
    ReadAll(out_, &ws.GetThreadPool());
  }

 private:
  std::shared_ptr<detail::BufferPool> pool_;
  std::vector<dali::TensorListShape<>> shape_;  // per output
  std::vector<char *> out_;
};

}  // namespace dali_mesh

namespace dali {

DALI_SCHEMA(dali_mesh__ReadWindows)
    .DocStr(R"(Reads this rank's window of each sample from its file, by a byte-range plan.

The plan file (written by ``dali_mesh.pipeline.native.read_windows``) holds, per distinct file layout, the
byte ranges of the window (merged reads, ``preadv`` straight into the output), the byte-swap and
Fortran-order flags and the boundary program (copies for reflect/symmetric/edge/periodic cells,
constant fills), plus the file table and, per sample id, its file, plan and base offset. The input
is one sample id per sample. Files are opened read-only with ``O_NONBLOCK`` and
``POSIX_FADV_RANDOM``; a missing, non-regular, truncated or changed file is an error naming it.
Stateless: checkpointing works.)")
    .NumInput(1, 2)
    .NumOutput(1)
    .OutputFn([](const OpSpec &spec) { return spec.GetArgument<int>("outputs"); })
    .InputDox(0, "sample_id", "TensorList", "One int32/int64 sample id per sample.")
    .InputDox(1, "next_sample_id", "TensorList", "Optional: per sample, its sample ids in the next "
              "batches (a 1-D tensor, batch t+1 first; -1: none, past the epoch's end), those batches read "
              "ahead on threads of the operator's own while this batch is read (read_ahead, "
              "read_ahead_batches). A hint: a batch read ahead that is not among them is dropped.")
    .AddArg("plan_file", "Path of the plan file written by dali_mesh.pipeline.native.", DALI_STRING)
    .AddArg("dtype", "Output type (the planned files' dtype, native byte order).", DALI_DATA_TYPE)
    .AddOptionalArg("outputs", "Windows per sample id, one output each (a forecast's input and target: "
                    "2): the plan file's items are that many runs of one item per sample id. A chunk "
                    "that several outputs' windows need is read and decoded once.", 1)
    .AddOptionalArg<int64_t>("task_bytes", "Bytes read per thread-pool task (large windows are "
                             "split across threads).", int64_t(4) << 20)
    .AddOptionalArg("prefetch", "Announce every range of the batch to the kernel "
                    "(POSIX_FADV_WILLNEED) when the files are opened, so that cold reads of all "
                    "files run at once; exactly the ranges read, no readahead beyond them.", true)
    .AddOptionalArg("mean", "Per-channel means: each finished float32 window becomes "
                    "(x - mean[c]) / stddev[c] in place, c its index on channel_axis, every cell "
                    "(boundary cells too). CPU only (on the GPU, strided_slice after the read).",
                    std::vector<float>())
    .AddOptionalArg("stddev", "Per-channel standard deviations (as many as mean).", std::vector<float>())
    .AddOptionalArg("channel_axis", "The windows' axis that mean and stddev index.", -1)
    .AddOptionalArg("read_ahead", "Read the batches of next_sample_id ahead: 0 never, 1 when the plan "
                    "reads an object store (its reads wait on round trips), 2 always.", 1)
    .AddOptionalArg("read_ahead_batches", "The most batches read ahead (1 to 8; fewer when "
                    "next_sample_id gives fewer): at 20-50 ms a round trip, 8 hide what 4 do not.", 8)
    .AddOptionalArg<int64_t>("read_ahead_bytes", "What the batches read ahead hold together, at most: "
                             "their windows, and the chunks they fetched with the buffers they decode them "
                             "in; fewer batches are read ahead when they do not fit (the batch being read is "
                             "not counted).", int64_t(1) << 30);

DALI_REGISTER_OPERATOR(dali_mesh__ReadWindows, ::dali_mesh::ReadWindowsCPU, CPU);

}  // namespace dali
