// dali_mesh: schema of dali_mesh__ReadWindows and its CPU operator: the windows are read with
// preadv on DALI's thread pool straight into the output batch.
#include <string>
#include <vector>

#include "read_windows_op.h"

namespace dali_mesh {

class ReadWindowsCPU : public ReadWindowsBase<dali::CPUBackend> {
 public:
  explicit ReadWindowsCPU(const dali::OpSpec &spec) : ReadWindowsBase<dali::CPUBackend>(spec) {}

 protected:
  void RunImpl(dali::Workspace &ws) override {
    auto &output = ws.Output<dali::CPUBackend>(0);
    const int n = output.num_samples();
    out_.resize(n);
    for (int i = 0; i < n; i++) out_[i] = static_cast<char *>(output.raw_mutable_tensor(i));
    ReadAll(out_, &ws.GetThreadPool());
  }

 private:
  std::vector<char *> out_;
};

}  // namespace dali_mesh

namespace dali {

DALI_SCHEMA(dali_mesh__ReadWindows)
    .DocStr(R"(Reads this rank's window of each sample from its file, by a byte-range plan.

The plan file (written by ``dali_mesh.native.read_windows``) holds, per distinct file layout, the
byte ranges of the window (merged reads, ``preadv`` straight into the output), the byte-swap and
Fortran-order flags and the boundary program (copies for reflect/symmetric/edge/periodic cells,
constant fills), plus the file table and, per sample id, its file, plan and base offset. The input
is one sample id per sample. Files are opened read-only with ``O_NONBLOCK`` and
``POSIX_FADV_RANDOM``; a missing, non-regular, truncated or changed file is an error naming it.
Stateless: checkpointing works.)")
    .NumInput(1)
    .NumOutput(1)
    .InputDox(0, "sample_id", "TensorList", "One int32/int64 sample id per sample.")
    .AddArg("plan_file", "Path of the plan file written by dali_mesh.native.", DALI_STRING)
    .AddArg("dtype", "Output type (the planned files' dtype, native byte order).", DALI_DATA_TYPE)
    .AddOptionalArg<int64_t>("task_bytes", "Bytes read per thread-pool task (large windows are "
                             "split across threads).", int64_t(4) << 20);

DALI_REGISTER_OPERATOR(dali_mesh__ReadWindows, ::dali_mesh::ReadWindowsCPU, CPU);

}  // namespace dali
