// dali_mesh: a plan's boundary program as one launch of the strided-slice kernel (the halo cells
// filled on the GPU, the mixed read_windows operator), and which plans of a set take that path.
// Host code, DALI-free.
#ifndef DALI_MESH_READER_DEVICE_FILL_H_
#define DALI_MESH_READER_DEVICE_FILL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/slice_args.h"
#include "plan/plan.h"

namespace dali_mesh {

// The boundary program of `plan` (its copies and fills) as one strided slice of the cells it reads,
// as the GPU strided-slice kernel runs it (device-side halo fills). Per axis the cells read are a
// range [lo, hi) of the window, and every other position is a constant fill, or a copy from
// BoundaryIndex(position - lo, hi - lo, mode) + lo for one mode: then `sample` takes the window
// (C order, element strides) as its input with that range as its domain, start -lo, the window's
// extents as its output, and the modes. The host program copies axis by axis; the slice computes
// every cell at once from the cells read: the same cells, since each axis's copies read only cells
// read along that axis. Returns "" or why not (chained copies, a copy and a fill on one axis, no
// cell read on an axis, more than kMaxDims axes, an empty window): the host then finishes.
std::string DeviceFillProgram(const ReadPlan &plan, SliceSample *sample);

// The fill value of `plan` (type `dtype`, a DType) as strided-slice parameters (a copy: in and out
// types `dtype`).
SliceParams DeviceFillParams(const ReadPlan &plan, int dtype);

// The plans of a set whose boundary cells the device fills, and how.
struct DeviceFills {
  std::vector<uint8_t> on;           // per plan: filled on the device (else finished on the host)
  std::vector<SliceSample> program;  // per plan: its DeviceFillProgram (valid where `on`)
  SliceParams params;                // the launch's: the fill value, in and out types `dtype`
};

// The plans of `set` (items of `dtype`, a DType) that the device fills: those whose program is one
// strided slice (DeviceFillProgram) and whose fill value, if any, is the first such plan's (one
// launch takes one fill value); the others are finished on the host.
DeviceFills ChooseDeviceFills(const PlanSet &set, int dtype);

}  // namespace dali_mesh

#endif  // DALI_MESH_READER_DEVICE_FILL_H_
