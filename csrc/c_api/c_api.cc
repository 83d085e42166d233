// dali_mesh: the C entry points of libdali_mesh_kernels.so, a DALI-free library that runs the same
// host code and kernels as the DALI operators. Used through ctypes by the tests (CPU kernel, host
// emulation of the GPU kernel, and on a GPU machine the CUDA kernel on torch/cupy memory) and by
// benchmarks/kernel_bench.py.
//
// Every function returns 0 on success, or -1 with a message in err[0..errlen).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "c_api/export.h"
#include "kernels/mesh_roi.h"
#include "kernels/slice_args.h"
#include "kernels/slice_cpu.h"
#include "kernels/slice_gpu.h"

namespace {

using dali_mesh::c_api::Fail;

// The arguments of sample i of a batch whose per-sample arrays are flattened [nsamples * ndim];
// domain_starts/domain_shapes may be null (the whole sample).
dali_mesh::SliceUserArgs SampleArgs(int i, int ndim, const int64_t *in_shapes, const int64_t *starts,
                                    const int64_t *shapes, const int64_t *steps,
                                    const int32_t *boundaries, const int64_t *domain_starts,
                                    const int64_t *domain_shapes) {
  dali_mesh::SliceUserArgs u;
  const size_t o = static_cast<size_t>(i) * ndim;
  u.in_shape.assign(in_shapes + o, in_shapes + o + ndim);
  u.start.assign(starts + o, starts + o + ndim);
  u.shape.assign(shapes + o, shapes + o + ndim);
  u.step.assign(steps + o, steps + o + ndim);
  u.boundary.assign(boundaries + o, boundaries + o + ndim);
  if (domain_starts && domain_shapes) {
    u.domain_start.assign(domain_starts + o, domain_starts + o + ndim);
    u.domain_shape.assign(domain_shapes + o, domain_shapes + o + ndim);
  }
  return u;
}

}  // namespace

// 3: dm_mesh_roi takes explicit split sizes; 4: the read plans' test hooks (plan_api.cc); 5: plan
// dump, canonical JSON and checksum; 8: the codec table (codec_api.cc) and the batch reader
// (reader_api.cc); 11: the batch reader reads ahead (dali_mesh_reader_open's read_ahead,
// dali_mesh_reader_read_ahead, dali_mesh_reader_ahead_counts); 13: a store spec's settings as its one
// parser reads them (dali_mesh_store_settings); 14: the fetch plan's requests (fetch_api.cc) and a
// store's measured round trip (dali_mesh_store_round_trip); 15: the chunks one request fetches together
// (dali_mesh_chunk_runs); 16: stores whose reads Python answers (dali_mesh_store_bind_reader,
// dali_mesh_store_unbind_readers)
DM_EXPORT int dm_abi_version(void) { return 16; }

DM_EXPORT int dm_has_cuda(void) {
#ifdef DALI_MESH_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}

DM_EXPORT int64_t dm_boundary_index(int64_t r, int64_t n, int mode) {
  return dali_mesh::BoundaryIndex(r, n, mode);
}

DM_EXPORT uint64_t dm_fast_div(uint64_t divisor, uint64_t n) {
  dali_mesh::FastDivU64 f;
  f.Init(divisor);
  return f.Div(n);
}

// The software float -> float16 conversion (used where the CPU lacks F16C), for tests.
DM_EXPORT void dm_floats_to_half(const float *in, uint16_t *out, int64_t n) {
  for (int64_t k = 0; k < n; k++) out[k] = dali_mesh::FloatToHalf(in[k]);
}

// split 3 (explicit): split_size_counts has mesh_ndim entries and split_sizes nsplit_sizes (see
// MeshRoiArgs); both may be null for the named rules.
DM_EXPORT int dm_mesh_roi(const int64_t *shape, int ndim, int mesh_ndim, const int64_t *mesh_shape,
                          const int64_t *coordinate, const int64_t *shard_axes, int nhalo,
                          const int64_t *halo_lo, const int64_t *halo_hi, int nboundary,
                          const int32_t *boundary, int split, const int64_t *split_size_counts,
                          int64_t nsplit_sizes, const int64_t *split_sizes,
                          const int64_t *crop_start, const int64_t *crop_stop,
                          int64_t *window_start, int64_t *window_shape, char *err, int errlen) {
  dali_mesh::MeshRoiArgs a;
  a.mesh_shape.assign(mesh_shape, mesh_shape + mesh_ndim);
  a.coordinate.assign(coordinate, coordinate + mesh_ndim);
  a.shard_axes.assign(shard_axes, shard_axes + mesh_ndim);
  a.halo_lo.assign(halo_lo, halo_lo + nhalo);
  a.halo_hi.assign(halo_hi, halo_hi + nhalo);
  a.boundary.assign(boundary, boundary + nboundary);
  a.split = split;
  if (split_size_counts)
    a.split_size_counts.assign(split_size_counts, split_size_counts + mesh_ndim);
  if (split_sizes && nsplit_sizes > 0)
    a.split_sizes.assign(split_sizes, split_sizes + nsplit_sizes);
  if (crop_start && crop_stop) {
    a.crop_start.assign(crop_start, crop_start + ndim);
    a.crop_stop.assign(crop_stop, crop_stop + ndim);
  }
  std::string e = dali_mesh::ComputeMeshRoi(shape, ndim, a, window_start, window_shape);
  return e.empty() ? 0 : Fail(e, err, errlen);
}

// A batch of `nsamples` samples of `ndim` dims, every axis listed; per-sample arrays are flattened
// [nsamples * ndim]. domain_starts/domain_shapes may be null (the whole sample).
//   backend 0: the CPU kernel (as the DALI CPU operator runs it, on one thread)
//   backend 1: the GPU kernel body emulated on the host (host pointers)
//   backend 2: the CUDA kernel (device pointers; `launcher` from dm_cuda_launcher_create or null,
//              `stream` a cudaStream_t or null for the default stream); asynchronous.
// The fill value is exact: fill_kind 0 takes fill_value (a double), 1 fill_int (an int64), 2
// fill_int's bits as a uint64.
DM_EXPORT int dm_strided_slice(int backend, void *launcher, int nsamples, int ndim,
                               const void *const *in, void *const *out, const int64_t *in_shapes,
                               const int64_t *starts, const int64_t *shapes, const int64_t *steps,
                               const int32_t *boundaries, const int64_t *domain_starts,
                               const int64_t *domain_shapes, int in_type, int out_type,
                               double fill_value, int fill_kind, int64_t fill_int,
                               int has_channel_axis, int channel_axis, int nch,
                               const float *mean, const float *stddev, void *stream, char *err,
                               int errlen) {
  using namespace dali_mesh;  // NOLINT
  SliceParams p;
  p.in_type = in_type;
  p.out_type = out_type;
  // fill_kind: 0 the double fill_value, 1 the int64 fill_int, 2 fill_int's bits as a uint64
  if (fill_kind == 1)
    p.SetFillInt(fill_int);
  else if (fill_kind == 2)
    p.SetFillUInt(static_cast<uint64_t>(fill_int));
  else
    p.SetFill(fill_value);
  if (nch > 0) {
    p.mean.assign(mean, mean + nch);
    p.stddev.assign(stddev, stddev + nch);
  }
  std::string e = CheckSliceParams(p);
  if (!e.empty()) return Fail(e, err, errlen);
  std::vector<SliceSample> samples(nsamples);
  for (int i = 0; i < nsamples; i++) {
    SliceUserArgs u = SampleArgs(i, ndim, in_shapes, starts, shapes, steps, boundaries,
                                 domain_starts, domain_shapes);
    u.has_channel_axis = has_channel_axis != 0;
    u.channel_axis = channel_axis;
    e = MakeSliceSample(u, p, &samples[i]);
    if (!e.empty()) return Fail("sample " + std::to_string(i) + ": " + e, err, errlen);
    // the kernels' typed loads and stores need elements at their natural alignment (on a GPU a
    // misaligned access is a sticky error that loses the context); DALI's buffers always are, a
    // numpy view at an odd byte offset is not
    const int in_size = DTypeSize(in_type), out_size = DTypeSize(out_type);
    if (reinterpret_cast<uintptr_t>(in[i]) % in_size || reinterpret_cast<uintptr_t>(out[i]) % out_size)
      return Fail("sample " + std::to_string(i) + ": the input and output must be aligned to their "
                      "element sizes (" + std::to_string(in_size) + " and " + std::to_string(out_size) +
                      " bytes); copy a misaligned array first (np.ascontiguousarray of a fresh array)",
                  err, errlen);
  }
  if (backend == 0) {
    CpuElementOps ops = MakeCpuElementOps(p);
    for (int i = 0; i < nsamples; i++) {
      CpuSlicePlan plan;
      PrepareCpuSlice(CollapseAxes(samples[i]), in[i], out[i], DTypeSize(in_type), &plan);
      RunCpuSlice(plan, ops, p, 0, plan.s.OutVolume());
    }
    return 0;
  }
  GpuPlan plan;
  e = BuildGpuPlan(samples, in, out, p, &plan);
  if (!e.empty()) return Fail(e, err, errlen);
  if (backend == 1) {
    EmulateGpuPlan(plan);
    return 0;
  }
#ifdef DALI_MESH_WITH_CUDA
  if (backend == 2) {
    GpuSliceLauncher tmp;
    GpuSliceLauncher *l = launcher ? static_cast<GpuSliceLauncher *>(launcher) : &tmp;
    e = l->Run(plan, stream);
    // a temporary launcher frees its buffers on return: cudaFree waits for the kernel
    return e.empty() ? 0 : Fail(e, err, errlen);
  }
#endif
  (void)launcher;
  (void)stream;
  return Fail("backend " + std::to_string(backend) +
                  " is not available: this library was built without CUDA (rebuild with nvcc on "
                  "PATH, or DALI_MESH_CUDA=1)",
              err, errlen);
}

// Plan statistics of the GPU path (for tests and benchmarks), into info[7 + nsamples]: the widest
// elem_size, need_pad, convert, num_blocks, the conversion kernel (ConvKind), each sample's input
// bytes per move in its largest piece (its in-bounds box unless the halo outweighs it; the copy
// kernel or a typed conversion; 0 for the generic conversion), then the number of pieces
// (in-bounds boxes and halo strips) and the output elements they cover (the batch's output volume:
// the pieces partition it); last, so that callers of the 5 + nsamples layout still work.
// Normalisation: nch > 0.
DM_EXPORT int dm_gpu_plan_info(int nsamples, int ndim, const void *const *in, void *const *out,
                               const int64_t *in_shapes, const int64_t *starts,
                               const int64_t *shapes, const int64_t *steps,
                               const int32_t *boundaries, int in_type, int out_type, int nch,
                               int64_t *info, char *err, int errlen) {
  using namespace dali_mesh;  // NOLINT
  SliceParams p;
  p.in_type = in_type;
  p.out_type = out_type;
  p.mean.assign(std::max(nch, 0), 0.f);
  p.stddev.assign(std::max(nch, 0), 1.f);
  std::vector<SliceSample> samples(nsamples);
  for (int i = 0; i < nsamples; i++) {
    SliceUserArgs u = SampleArgs(i, ndim, in_shapes, starts, shapes, steps, boundaries, nullptr,
                                 nullptr);
    u.has_channel_axis = nch > 1;
    u.channel_axis = 0;
    std::string e = MakeSliceSample(u, p, &samples[i]);
    if (!e.empty()) return Fail(e, err, errlen);
  }
  GpuPlan plan;
  std::string e = BuildGpuPlan(samples, in, out, p, &plan);
  if (!e.empty()) return Fail(e, err, errlen);
  info[0] = plan.elem_size;
  info[1] = plan.need_pad;
  info[2] = plan.convert;
  info[3] = plan.num_blocks;
  info[4] = plan.conv;
  for (int i = 0; i < nsamples; i++) info[5 + i] = plan.sample_elem_size[i];
  info[5 + nsamples] = plan.num_pieces;
  info[6 + nsamples] = plan.piece_elements;
  return 0;
}

DM_EXPORT void *dm_cuda_launcher_create(void) {
#ifdef DALI_MESH_WITH_CUDA
  return new dali_mesh::GpuSliceLauncher();
#else
  return nullptr;
#endif
}

DM_EXPORT void dm_cuda_launcher_destroy(void *launcher) {
#ifdef DALI_MESH_WITH_CUDA
  delete static_cast<dali_mesh::GpuSliceLauncher *>(launcher);
#else
  (void)launcher;
#endif
}
