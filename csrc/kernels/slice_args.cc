// dali_mesh: validation and collapsing of strided-slice arguments (see slice_args.h).
#include "kernels/slice_args.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "kernels/str_format.h"

namespace dali_mesh {

namespace {

// Whether the fill value can be held by `type`, as dali_mesh.partition.check_fill_value decides for
// the readers: integer types hold exactly the integers of their range; floating types hold any
// value that does not overflow to inf (it is rounded to nearest), and NaN / +-inf.
bool Representable(const SliceParams &p, int type) {
  if (IsFloatDType(type)) {
    if (p.fill_kind != kKindFloat) {
      // |integer| < 2**64 never overflows float32/64; float16 tops out at 65504
      if (type != kFloat16) return true;
      double v = p.fill_kind == kKindInt ? static_cast<double>(p.fill_int)
                                         : static_cast<double>(p.fill_uint);
      return !std::isinf(HalfToFloat(DoubleToHalf(v)));
    }
    const double value = p.fill_value;
    if (std::isnan(value) || std::isinf(value) || type == kFloat64) return true;
    if (type == kFloat32) return !std::isinf(static_cast<float>(value));
    return !std::isinf(HalfToFloat(DoubleToHalf(value)));
  }
  // integer and bool outputs: the exact integer, within range
  bool neg = false;
  uint64_t mag = 0;
  if (p.fill_kind == kKindInt) {
    neg = p.fill_int < 0;
    mag = neg ? uint64_t(0) - static_cast<uint64_t>(p.fill_int) : static_cast<uint64_t>(p.fill_int);
  } else if (p.fill_kind == kKindUInt) {
    mag = p.fill_uint;
  } else {
    const double value = p.fill_value;
    if (std::isnan(value) || std::isinf(value) || value != std::floor(value)) return false;
    if (!(value > -18446744073709551616.0 && value < 18446744073709551616.0)) return false;
    neg = value < 0;
    mag = static_cast<uint64_t>(neg ? -value : value);
  }
  if (type == kBool) return !neg && mag <= 1;
  const int bits = DTypeSize(type) * 8;
  const bool is_signed = type == kInt8 || type == kInt16 || type == kInt32 || type == kInt64;
  if (!is_signed) {
    if (neg && mag != 0) return false;
    return bits == 64 || mag < (uint64_t(1) << bits);
  }
  const uint64_t limit = uint64_t(1) << (bits - 1);  // |min|; max = limit - 1
  return neg ? mag <= limit : mag < limit;
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

void FillBytes(const SliceParams &p, uint8_t bytes[8]) {
  std::memset(bytes, 0, 8);
  DM_TYPE_SWITCH(p.out_type, T, {
    T v = p.fill_kind == kKindInt    ? Convert<T>::FromInt64(p.fill_int)
          : p.fill_kind == kKindUInt ? Convert<T>::FromUInt64(p.fill_uint)
                                     : Convert<T>::FromDouble(p.fill_value);
    std::memcpy(bytes, &v, sizeof(T));
  });
}

std::string FillValueStr(const SliceParams &p) {
  if (p.fill_kind == kKindInt) return std::to_string(p.fill_int);
  if (p.fill_kind == kKindUInt) return std::to_string(p.fill_uint);
  std::ostringstream s;
  s.precision(17);
  s << p.fill_value;
  return s.str();
}

std::string ParseFillValue(const std::string &text, SliceParams *p) {
  const char *c = text.c_str();
  char *end = nullptr;
  size_t k = (c[0] == '-' || c[0] == '+') ? 1 : 0;
  bool integer = text.size() > k;
  for (size_t i = k; i < text.size(); i++) integer = integer && text[i] >= '0' && text[i] <= '9';
  errno = 0;
  if (integer && c[0] == '-') {
    long long v = std::strtoll(c, &end, 10);
    if (errno == ERANGE)
      return "fill_value " + text + " is below the int64 range; no output type can hold it";
    p->SetFillInt(v);
  } else if (integer) {
    unsigned long long v = std::strtoull(c, &end, 10);
    if (errno == ERANGE)
      return "fill_value " + text + " is above the uint64 range; no integer type can hold it";
    if (v <= static_cast<unsigned long long>(INT64_MAX))
      p->SetFillInt(static_cast<int64_t>(v));
    else
      p->SetFillUInt(v);
  } else {
    // from_chars: the same text gives the same double whatever the process's locale
    double v = 0;
    const char *last = c + text.size();
    auto [ptr, ec] = std::from_chars(c[0] == '+' ? c + 1 : c, last, v);
    if (ec == std::errc::result_out_of_range)
      return "fill_value " + text + " is beyond the float64 range; no output type can hold it";
    if (ec != std::errc() || ptr != last)
      return "fill_value \"" + text + "\" is not a number; pass an int or a float";
    p->SetFill(v);
  }
  return "";
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
  if (!Representable(p, p.out_type))
    return "fill_value " + FillValueStr(p) + " cannot be held by the output type " +
           DTypeName(p.out_type) +
           "; pass a value of that type's range (integers for integer types)";
  if (p.mean.size() != p.stddev.size())
    return "mean has " + std::to_string(p.mean.size()) + " values and std " +
           std::to_string(p.stddev.size()) + "; give both with one value per channel";
  for (size_t c = 0; c < p.stddev.size(); c++) {
    if (p.stddev[c] == 0 || !std::isfinite(p.stddev[c]))
      return "std[" + std::to_string(c) + "] is " + std::to_string(p.stddev[c]) +
             ": a standard deviation must be finite and nonzero";
  }
  for (size_t c = 0; c < p.mean.size(); c++) {
    if (!std::isfinite(p.mean[c]))
      return "mean[" + std::to_string(c) + "] is " + std::to_string(p.mean[c]) +
             ": a mean must be finite";
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
    // (an empty sample may claim any extents: its strides must still fit an int64)
    if (d > 0 && __builtin_mul_overflow(stride, n, &stride))
      return "the sample shape " + ShapeStr(a.in_shape) + " has more than 2**63 elements per "
             "outer index; its strides do not fit an int64";
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
      // d0 + dn may overflow: compare dn with what is left of the axis instead
      if (d0 < 0 || dn < 0 || d0 > s.in_extent[d] || dn > s.in_extent[d] - d0)
        return "domain_start " + std::to_string(d0) + " and domain_shape " + std::to_string(dn) +
               " of axis " + std::to_string(d) + " do not lie inside the sample of shape " +
               ShapeStr(a.in_shape) + "; the domain box must be within the sample";
    }
    s.in_offset += d0 * s.in_stride[d];
    s.in_extent[d] = dn;
    if (__builtin_sub_overflow(a.start[k], d0, &s.start[d]))
      return "start " + std::to_string(a.start[k]) + " on axis " + std::to_string(d) +
             " minus domain_start " + std::to_string(d0) + " overflows int64; give a start "
             "within 2**62 of the domain";
    s.out_extent[d] = a.shape[k];
    s.step[d] = step;
    s.boundary[d] = static_cast<uint8_t>(mode);
    if (a.has_channel_axis && (d == a.channel_axis || d == a.channel_axis + ndim))
      s.channel_offset = d0;
  }
  // The output volume, without overflow (an argument input may carry any int64).
  int64_t volume = 1;
  for (int d = 0; d < s.ndim; d++)
    if (s.out_extent[d] == 0) volume = 0;
  for (int d = 0; d < s.ndim && volume > 0; d++) {
    if (__builtin_mul_overflow(volume, s.out_extent[d], &volume) || volume > kMaxPosition)
      return "shape " + ListStr(a.shape) + ": the window has more than 2**62 elements; give a "
             "window that fits in memory";
  }
  if (volume > 0) {
    // Bound every position the kernels compute (see kMaxPosition); the last position of an axis
    // is start + (shape - 1) * step, computed here without overflow.
    for (int d = 0; d < s.ndim; d++) {
      if (s.in_extent[d] >= kMaxPosition)
        return "axis " + std::to_string(d) + " of the domain has " +
               std::to_string(s.in_extent[d]) + " cells; at most 2**62 - 1 are supported";
      int64_t span, last;
      bool overflow = __builtin_mul_overflow(s.out_extent[d] - 1, s.step[d], &span) ||
                      __builtin_add_overflow(s.start[d], span, &last);
      if (overflow || s.start[d] <= -kMaxPosition || s.start[d] >= kMaxPosition ||
          last >= kMaxPosition)
        return "start " + std::to_string(s.start[d]) + ", shape " +
               std::to_string(s.out_extent[d]) + " and step " + std::to_string(s.step[d]) +
               " on axis " + std::to_string(d) + " (relative to the domain start) reach " +
               (overflow ? std::string("beyond the int64 range") : std::to_string(last)) +
               ": window positions must lie within +-2**62 of the domain start (a NaN cast to "
               "int64 gives -2**63); check the window arguments";
    }
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
  AxisStack ax;
  for (int d = s.ndim - 1; d >= 0; d--) {
    const int n = ax.n;
    bool inner_whole = ax.InnerWhole();
    bool contiguous = n > 0 && s.in_stride[d] == ax.in_extent[n - 1] * ax.in_stride[n - 1];
    bool outer_ok = s.step[d] == 1 && d != s.channel_axis &&
                    (s.boundary[d] == kConstant || s.boundary[d] == kPeriodic ||
                     (s.start[d] >= 0 && s.start[d] + s.out_extent[d] <= s.in_extent[d]));
    // the merged axis must keep its positions and extent within kMaxPosition (far windows of a
    // constant or periodic axis could overflow when scaled by the row length)
    int64_t m_extent = 0, m_start = 0, m_out = 0, m_last = 0;
    if (inner_whole && contiguous && outer_ok) {
      const int64_t k = ax.in_extent[n - 1];
      const bool fits = !__builtin_mul_overflow(s.in_extent[d], k, &m_extent) &&
                        !__builtin_mul_overflow(s.start[d], k, &m_start) &&
                        !__builtin_mul_overflow(s.out_extent[d], k, &m_out) &&
                        !__builtin_add_overflow(m_start, m_out, &m_last) &&
                        m_extent < kMaxPosition && m_start > -kMaxPosition &&
                        m_last < kMaxPosition;
      if (!fits) outer_ok = false;
    }
    if (inner_whole && contiguous && outer_ok) {
      ax.in_extent[n - 1] = m_extent;
      ax.start[n - 1] = m_start;
      ax.out[n - 1] = m_out;
      ax.step[n - 1] = 1;
      // in range windows keep any rule: merged positions stay in range
      ax.mode[n - 1] = s.boundary[d] == kPeriodic ? kPeriodic : kConstant;
      continue;
    }
    ax.Push(s, d);
  }
  ax.WriteTo(&r);
  return r;
}

}  // namespace dali_mesh
