// dali_mesh: the CPU kernel of the strided slice. DALI-free; the DALI CPU operator and the C API's
// host entry point both run it.
//
// A sample is prepared once (per outer axis, the source index of every output position; for the
// innermost axis, runs of positions whose sources form an arithmetic sequence), then any range of
// output elements can be produced independently, so a large sample is split over threads.
#ifndef DALI_MESH_SLICE_CPU_H_
#define DALI_MESH_SLICE_CPU_H_

#include <cstdint>
#include <vector>

#include "kernels/slice_args.h"

namespace dali_mesh {

struct NormArgs {
  const float *mean;
  const float *stddev;
  int64_t channel0;      // channel of the first element of the run
  int64_t channel_step;  // channel increment per element (0 unless the channel axis is innermost)
};

// Per-batch element operations, chosen from the types once.
struct CpuElementOps {
  int in_size = 0, out_size = 0;
  bool convert = false;
  bool normalize = false;
  uint8_t fill[8] = {};
  // copy n elements (no conversion): out[k] = in[k * step]
  void (*copy)(void *out, const void *in, int64_t n, int64_t step) = nullptr;
};

CpuElementOps MakeCpuElementOps(const SliceParams &params);

struct CpuSlicePlan {
  SliceSample s;                       // collapsed
  const uint8_t *in = nullptr;         // the domain start
  uint8_t *out = nullptr;
  std::vector<int64_t> src[kMaxDims];  // outer axes: source index per output position, -1 = fill
  std::vector<AxisRun> inner_runs;
};

// `s` should be collapsed (CollapseAxes); `in` is the input sample's first element.
void PrepareCpuSlice(const SliceSample &s, const void *in, void *out, int in_size,
                     CpuSlicePlan *plan);

// Produces output elements [begin, end) (flat, row-major) of a prepared sample.
void RunCpuSlice(const CpuSlicePlan &plan, const CpuElementOps &ops, const SliceParams &params,
                 int64_t begin, int64_t end);

}  // namespace dali_mesh

#endif  // DALI_MESH_SLICE_CPU_H_
