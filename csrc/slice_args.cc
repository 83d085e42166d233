// dali_mesh: validation and collapsing of strided-slice arguments (see slice_args.h).
#include "slice_args.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "str_format.h"

namespace dali_mesh {

namespace {

// Whether `value` is held exactly by `type` (NaN and +-inf only by floating types).
bool Representable(double value, int type) {
  switch (type) {
    case kFloat64: return true;
    case kFloat32: return std::isnan(value) || std::isinf(value) ||
                          static_cast<double>(static_cast<float>(value)) == value;
    case kFloat16: {
      if (std::isnan(value) || std::isinf(value)) return true;
      return static_cast<double>(HalfToFloat(DoubleToHalf(value))) == value;
    }
    default: break;
  }
  if (std::isnan(value) || std::isinf(value) || value != std::floor(value)) return false;
  switch (type) {
    case kBool: return value == 0 || value == 1;
    case kUInt8: return value >= 0 && value <= 255;
    case kUInt16: return value >= 0 && value <= 65535;
    case kUInt32: return value >= 0 && value <= 4294967295.0;
    case kUInt64: return value >= 0 && value < 18446744073709551616.0;
    case kInt8: return value >= -128 && value <= 127;
    case kInt16: return value >= -32768 && value <= 32767;
    case kInt32: return value >= -2147483648.0 && value <= 2147483647.0;
    case kInt64: return value >= -9223372036854775808.0 && value < 9223372036854775808.0;
    default: return false;
  }
}

}  // namespace

int ParseBoundary(const std::string &name) {
  if (name == "constant") return kConstant;
  if (name == "periodic") return kPeriodic;
  if (name == "reflect") return kReflect;
  if (name == "symmetric") return kSymmetric;
  if (name == "edge") return kEdge;
  if (name == "trim") return kTrim;
  return -1;
}

const char *BoundaryName(int mode) {
  switch (mode) {
    case kConstant: return "constant";
    case kPeriodic: return "periodic";
    case kReflect: return "reflect";
    case kSymmetric: return "symmetric";
    case kEdge: return "edge";
    case kTrim: return "trim";
    default: return "unknown";
  }
}

void FillBytes(double fill_value, int out_type, uint8_t bytes[8]) {
  std::memset(bytes, 0, 8);
  DM_TYPE_SWITCH(out_type, T, {
    T v = Convert<T>::FromDouble(fill_value);
    std::memcpy(bytes, &v, sizeof(T));
  });
}

bool SliceSample::NeedPad() const {
  for (int d = 0; d < ndim; d++) {
    if (out_extent[d] == 0) return false;  // nothing to write at all
  }
  for (int d = 0; d < ndim; d++) {
    int64_t last = start[d] + (out_extent[d] - 1) * step[d];
    if (start[d] < 0 || last >= in_extent[d]) return true;
  }
  return false;
}

std::string CheckSliceParams(const SliceParams &p) {
  if (DTypeSize(p.in_type) == 0)
    return "unsupported input type (id " + std::to_string(p.in_type) +
           "); expected a numeric type or bool";
  if (DTypeSize(p.out_type) == 0)
    return "unsupported output dtype (id " + std::to_string(p.out_type) +
           "); expected a numeric type or bool";
  if (!Representable(p.fill_value, p.out_type)) {
    std::ostringstream s;
    s.precision(17);
    s << "fill_value " << p.fill_value << " cannot be held by the output type "
      << DTypeName(p.out_type) << "; pass a value of that type's range (integers for integer types)";
    return s.str();
  }
  if (p.mean.size() != p.stddev.size())
    return "mean has " + std::to_string(p.mean.size()) + " values and std " +
           std::to_string(p.stddev.size()) + "; give both with one value per channel";
  for (size_t c = 0; c < p.stddev.size(); c++) {
    if (p.stddev[c] == 0 || std::isnan(p.stddev[c]))
      return "std[" + std::to_string(c) + "] is " + std::to_string(p.stddev[c]) +
             ": a standard deviation must be nonzero";
  }
  return "";
}

std::string MakeSliceSample(const SliceUserArgs &a, const SliceParams &params, SliceSample *out) {
  const int ndim = static_cast<int>(a.in_shape.size());
  if (ndim > kMaxDims)
    return "the sample has " + std::to_string(ndim) + " dims; at most " +
           std::to_string(kMaxDims) + " are supported";
  std::vector<int> axes;
  if (a.all_axes) {
    for (int d = 0; d < ndim; d++) axes.push_back(d);
  } else {
    std::vector<bool> seen(ndim, false);
    for (int ax : a.axes) {
      if (ax < -ndim || ax >= ndim)
        return "axes " + ListStr(a.axes) + ": axis " + std::to_string(ax) +
               " is out of range for a sample of shape " + ShapeStr(a.in_shape);
      int n = ax < 0 ? ax + ndim : ax;
      if (seen[n]) return "axes " + ListStr(a.axes) + " lists axis " + std::to_string(n) + " twice";
      seen[n] = true;
      axes.push_back(n);
    }
  }
  const size_t na = axes.size();
  const std::string axes_str =
      a.all_axes ? "every axis of the sample of shape " + ShapeStr(a.in_shape)
                 : "axes " + ListStr(a.axes);
  if (a.start.size() != na)
    return "start " + ListStr(a.start) + " has " + std::to_string(a.start.size()) +
           " values for " + std::to_string(na) + " axes (" + axes_str +
           "); give one per axis, or pass axes=";
  if (a.shape.size() != na)
    return "shape " + ListStr(a.shape) + " has " + std::to_string(a.shape.size()) +
           " values for " + std::to_string(na) + " axes (" + axes_str + ")";
  if (!(a.step.empty() || a.step.size() == 1 || a.step.size() == na))
    return "step " + ListStr(a.step) + " has " + std::to_string(a.step.size()) + " values for " +
           std::to_string(na) + " axes (" + axes_str + "); give one, or one per axis";
  if (!(a.boundary.size() == 1 || a.boundary.size() == na))
    return "boundary has " + std::to_string(a.boundary.size()) + " names for " +
           std::to_string(na) + " axes (" + axes_str + "); give one, or one per axis";
  if (!(a.domain_start.empty() || a.domain_start.size() == na) ||
      a.domain_start.size() != a.domain_shape.size())
    return "domain_start " + ListStr(a.domain_start) + " and domain_shape " +
           ListStr(a.domain_shape) + " need one value per axis (" + axes_str + ")";

  SliceSample s;
  // an ndim-0 sample is one element: treat it as one axis of extent 1
  s.ndim = ndim == 0 ? 1 : ndim;
  int64_t stride = 1;
  for (int d = s.ndim - 1; d >= 0; d--) {
    int64_t n = ndim == 0 ? 1 : a.in_shape[d];
    if (n < 0) return "the sample shape " + ShapeStr(a.in_shape) + " has a negative extent";
    s.in_extent[d] = n;
    s.in_stride[d] = stride;
    s.start[d] = 0;
    s.out_extent[d] = n;
    s.step[d] = 1;
    s.boundary[d] = kConstant;
    stride *= n;
  }
  s.in_offset = 0;
  for (size_t k = 0; k < na; k++) {
    int d = axes[k];
    int64_t step = a.step.empty() ? 1 : a.step[a.step.size() == 1 ? 0 : k];
    if (step < 1)
      return "step " + ListStr(a.step) + ": step " + std::to_string(step) + " on axis " +
             std::to_string(d) + " must be >= 1";
    if (a.shape[k] < 0)
      return "shape " + ListStr(a.shape) + ": negative extent " + std::to_string(a.shape[k]) +
             " on axis " + std::to_string(d);
    int mode = a.boundary[a.boundary.size() == 1 ? 0 : k];
    if (mode < 0 || mode > kEdge)
      return std::string("boundary \"") + BoundaryName(mode) + "\" on axis " + std::to_string(d) +
             ": expected constant, periodic, reflect, symmetric or edge (trim is a mesh_roi rule: "
             "its windows lie inside the domain)";
    int64_t d0 = 0, dn = s.in_extent[d];
    if (!a.domain_start.empty()) {
      d0 = a.domain_start[k];
      dn = a.domain_shape[k];
      if (d0 < 0 || dn < 0 || d0 + dn > s.in_extent[d])
        return "domain " + std::to_string(d0) + ":" + std::to_string(d0 + dn) + " of axis " +
               std::to_string(d) + " lies outside the sample of shape " + ShapeStr(a.in_shape);
    }
    s.in_offset += d0 * s.in_stride[d];
    s.in_extent[d] = dn;
    s.start[d] = a.start[k] - d0;
    s.out_extent[d] = a.shape[k];
    s.step[d] = step;
    s.boundary[d] = static_cast<uint8_t>(mode);
    if (a.has_channel_axis && (d == a.channel_axis || d == a.channel_axis + ndim))
      s.channel_offset = d0;
  }
  if (s.OutVolume() > 0) {
    for (int d = 0; d < s.ndim; d++) {
      if (s.in_extent[d] == 0 && s.boundary[d] != kConstant)
        return std::string("axis ") + std::to_string(d) + " of the domain is empty: boundary \"" +
               BoundaryName(s.boundary[d]) + "\" has no cell to copy; use constant";
    }
  }
  if (params.Normalize()) {
    int64_t nch = static_cast<int64_t>(params.mean.size());
    if (!a.has_channel_axis) {
      if (nch != 1)
        return "mean/std have " + std::to_string(nch) +
               " values but no channel_axis is given; give channel_axis, or one value";
      s.channel_axis = -1;
    } else {
      if (a.channel_axis >= ndim || a.channel_axis < -ndim)
        return "channel_axis " + std::to_string(a.channel_axis) +
               " is out of range for a sample of shape " + ShapeStr(a.in_shape);
      int c = a.channel_axis < 0 ? a.channel_axis + ndim : a.channel_axis;
      if (a.in_shape[c] != nch)
        return "mean/std have " + std::to_string(nch) + " values but channel axis " +
               std::to_string(c) + " of the sample of shape " + ShapeStr(a.in_shape) + " has " +
               std::to_string(a.in_shape[c]) + " channels";
      s.channel_axis = c;
    }
  }
  *out = s;
  return "";
}

SliceSample CollapseAxes(const SliceSample &in) {
  SliceSample s = in;
  if (s.OutVolume() == 0) {  // nothing to copy: one empty axis
    SliceSample e = in;
    e.ndim = 1;
    e.in_extent[0] = 1;
    e.in_stride[0] = 1;
    e.start[0] = 0;
    e.out_extent[0] = 0;
    e.step[0] = 1;
    e.boundary[0] = kConstant;
    e.channel_axis = -1;
    return e;
  }
  // Merge from the innermost axis outwards: an outer axis joins the axis inside it when that one is
  // taken whole and contiguous, the outer one has step 1, and its rule maps whole rows to whole rows
  // (constant, periodic, or a window inside the domain).
  SliceSample r;
  r.in_offset = s.in_offset;
  r.channel_offset = s.channel_offset;
  r.channel_axis = -1;
  int n = 0;
  int64_t ax_in_extent[kMaxDims], ax_in_stride[kMaxDims], ax_start[kMaxDims], ax_out[kMaxDims],
      ax_step[kMaxDims];
  uint8_t ax_mode[kMaxDims];
  int ax_channel = -1;
  for (int d = s.ndim - 1; d >= 0; d--) {
    bool inner_whole = n > 0 && ax_start[n - 1] == 0 && ax_step[n - 1] == 1 &&
                       ax_out[n - 1] == ax_in_extent[n - 1] && ax_channel != n - 1;
    bool contiguous = n > 0 && s.in_stride[d] == ax_in_extent[n - 1] * ax_in_stride[n - 1];
    bool outer_ok = s.step[d] == 1 && d != s.channel_axis &&
                    (s.boundary[d] == kConstant || s.boundary[d] == kPeriodic ||
                     (s.start[d] >= 0 && s.start[d] + s.out_extent[d] <= s.in_extent[d]));
    if (inner_whole && contiguous && outer_ok) {
      int64_t k = ax_in_extent[n - 1];
      ax_in_extent[n - 1] = s.in_extent[d] * k;
      ax_start[n - 1] = s.start[d] * k;
      ax_out[n - 1] = s.out_extent[d] * k;
      ax_step[n - 1] = 1;
      // in range windows keep any rule: merged positions stay in range
      ax_mode[n - 1] = s.boundary[d] == kPeriodic ? kPeriodic : kConstant;
      continue;
    }
    ax_in_extent[n] = s.in_extent[d];
    ax_in_stride[n] = s.in_stride[d];
    ax_start[n] = s.start[d];
    ax_out[n] = s.out_extent[d];
    ax_step[n] = s.step[d];
    ax_mode[n] = s.boundary[d];
    if (d == s.channel_axis) ax_channel = n;
    n++;
  }
  r.ndim = n;
  for (int i = 0; i < n; i++) {  // reverse: outermost first
    int d = n - 1 - i;
    r.in_extent[d] = ax_in_extent[i];
    r.in_stride[d] = ax_in_stride[i];
    r.start[d] = ax_start[i];
    r.out_extent[d] = ax_out[i];
    r.step[d] = ax_step[i];
    r.boundary[d] = ax_mode[i];
  }
  r.channel_axis = ax_channel < 0 ? -1 : n - 1 - ax_channel;
  return r;
}

}  // namespace dali_mesh
