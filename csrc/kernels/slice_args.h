// dali_mesh: plain argument structs of the strided slice, their validation and the collapsing of
// axes. Host only, DALI-free (the DALI operators, the CPU kernel, the GPU plan and the C API all
// start from these).
#ifndef DALI_MESH_SLICE_ARGS_H_
#define DALI_MESH_SLICE_ARGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/index_math.h"

namespace dali_mesh {

// Window positions (relative to the domain start) lie in (-kMaxPosition, kMaxPosition) and domain
// extents below kMaxPosition, so that every index computation of the kernels (r - n, 2 * n,
// start + i * step, ...) fits an int64 without checks in the hot loops. MakeSliceSample refuses
// anything beyond (e.g. the INT64_MIN a NaN becomes when cast to an integer).
constexpr int64_t kMaxPosition = int64_t(1) << 62;

// One sample, every axis described (axes not listed by the user are taken whole).
// Positions (start) are relative to the domain start; the boundary rule applies at the domain's
// edges. The domain is a box inside the input sample (the whole sample by default).
struct SliceSample {
  int ndim = 0;
  int64_t in_extent[kMaxDims] = {};  // extents of the domain
  int64_t in_stride[kMaxDims] = {};  // element strides of the input sample
  int64_t in_offset = 0;             // element offset of the domain start in the input sample
  int64_t start[kMaxDims] = {};
  int64_t out_extent[kMaxDims] = {};
  int64_t step[kMaxDims] = {};
  uint8_t boundary[kMaxDims] = {};
  int channel_axis = -1;       // axis whose source index selects mean/std, or -1
  int64_t channel_offset = 0;  // domain start along the channel axis (channel = offset + source)

  int64_t OutVolume() const {
    int64_t v = 1;
    for (int d = 0; d < ndim; d++) v *= out_extent[d];
    return v;
  }
  // Whether any output position of any axis lies outside the domain.
  bool NeedPad() const;
};

// Arguments shared by every sample of a batch.
struct SliceParams {
  int in_type = kFloat32;
  int out_type = kFloat32;
  // The fill value, exactly: fill_kind says which member holds it (a double holds integers only
  // up to 2**53; the integer members carry any int64 / uint64).
  double fill_value = 0;
  int fill_kind = kKindFloat;  // kKindFloat: fill_value; kKindInt: fill_int; kKindUInt: fill_uint
  int64_t fill_int = 0;
  uint64_t fill_uint = 0;
  void SetFill(double v) { fill_kind = kKindFloat; fill_value = v; }
  void SetFillInt(int64_t v) { fill_kind = kKindInt; fill_int = v; fill_value = static_cast<double>(v); }
  void SetFillUInt(uint64_t v) { fill_kind = kKindUInt; fill_uint = v; fill_value = static_cast<double>(v); }
  std::vector<float> mean;    // empty: no normalisation
  std::vector<float> stddev;  // same length as mean
  bool Normalize() const { return !mean.empty(); }
  bool Convert() const { return Normalize() || in_type != out_type; }
};

// The user's arguments for one sample, as given (lists over `axes`).
struct SliceUserArgs {
  std::vector<int64_t> in_shape;      // the sample's shape
  std::vector<int> axes;              // empty + all_axes: every axis in order
  bool all_axes = true;
  std::vector<int64_t> start, shape, step;  // step may be empty (1) or one value for all axes
  std::vector<int> boundary;          // one for all axes or one per listed axis
  std::vector<int64_t> domain_start, domain_shape;  // empty: the whole sample (per listed axis)
  bool has_channel_axis = false;
  int channel_axis = 0;  // may be negative (from the end)
};

// Builds the sample's plain arguments; returns an error message naming the value ("" when valid).
std::string MakeSliceSample(const SliceUserArgs &args, const SliceParams &params,
                            SliceSample *out);

// Checks batch-wide arguments (types, fill value, mean/std); "" when valid.
std::string CheckSliceParams(const SliceParams &params);

// Merges adjacent axes where the inner one is taken whole (and the outer one's rule allows it),
// so kernels see as few axes as possible. The channel axis is never merged.
SliceSample CollapseAxes(const SliceSample &s);

// The axes of a SliceSample gathered innermost first while adjacent axes are merged (CollapseAxes,
// CollapsePiece), then written back outermost first. `ostride`: output strides, kept by callers
// that have them (a piece of a GPU plan).
struct AxisStack {
  int n = 0;
  int64_t in_extent[kMaxDims], in_stride[kMaxDims], start[kMaxDims], out[kMaxDims], step[kMaxDims],
      ostride[kMaxDims];
  uint8_t mode[kMaxDims];
  int channel = -1;  // the entry holding the channel axis, or -1

  // Whether the innermost entry is taken whole (start 0, step 1, all of its extent) and is not
  // the channel axis: the condition for an outer axis to merge into it.
  bool InnerWhole() const {
    return n > 0 && start[n - 1] == 0 && step[n - 1] == 1 && out[n - 1] == in_extent[n - 1] &&
           channel != n - 1;
  }
  // Axis `d` of `s` as a new outer entry.
  void Push(const SliceSample &s, int d, int64_t out_stride = 0) {
    in_extent[n] = s.in_extent[d];
    in_stride[n] = s.in_stride[d];
    start[n] = s.start[d];
    out[n] = s.out_extent[d];
    step[n] = s.step[d];
    ostride[n] = out_stride;
    mode[n] = s.boundary[d];
    if (d == s.channel_axis) channel = n;
    n++;
  }
  // The entries into `r` (axes, rules, channel axis), outermost first; with `out_stride`, the
  // output strides too.
  void WriteTo(SliceSample *r, int64_t *out_stride = nullptr) const {
    r->ndim = n;
    for (int i = 0; i < n; i++) {
      const int d = n - 1 - i;
      r->in_extent[d] = in_extent[i];
      r->in_stride[d] = in_stride[i];
      r->start[d] = start[i];
      r->out_extent[d] = out[i];
      r->step[d] = step[i];
      r->boundary[d] = mode[i];
      if (out_stride) out_stride[d] = ostride[i];
    }
    r->channel_axis = channel < 0 ? -1 : n - 1 - channel;
  }
};

// Parses a boundary name ("constant", "periodic", "reflect", "symmetric", "edge"; "trim" for
// mesh_roi). Returns -1 when unknown.
int ParseBoundary(const std::string &name);
const char *BoundaryName(int mode);

// The fill value as the bytes of the output type (checked by CheckSliceParams).
void FillBytes(double fill_value, int out_type, uint8_t bytes[8]);
void FillBytes(const SliceParams &params, uint8_t bytes[8]);

// Parses a fill value written as text ("16777217", "-3", "1e+39", "nan", "-inf"): integers exactly
// (int64 or uint64), anything else as a double. Returns "" or an error naming the text.
std::string ParseFillValue(const std::string &text, SliceParams *params);

// A fill value as text, exactly (for error messages).
std::string FillValueStr(const SliceParams &params);

}  // namespace dali_mesh

#endif  // DALI_MESH_SLICE_ARGS_H_
