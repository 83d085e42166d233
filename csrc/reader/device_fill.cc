// dali_mesh: a plan's boundary program on the device (see device_fill.h).
#include "reader/device_fill.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/index_math.h"

namespace dali_mesh {

std::string DeviceFillProgram(const ReadPlan &plan, SliceSample *sample) {
  const int nd = plan.ndim;
  if (nd < 1 || nd > kMaxDims) return std::to_string(nd) + " axes (the GPU kernel takes 1.." +
                                      std::to_string(kMaxDims) + ")";
  if (plan.volume() == 0) return "an empty window";
  SliceSample s;
  s.ndim = nd;
  int64_t stride = 1;
  for (int a = nd - 1; a >= 0; a--) {
    s.in_stride[a] = stride;
    stride *= plan.shape[a];
  }
  s.in_offset = 0;
  for (int a = 0; a < nd; a++) {
    const int64_t n = plan.shape[a];
    // 0: read, 1: copied, 2: filled; each position once
    std::vector<uint8_t> mark(n, 0);
    for (int64_t p : plan.copy_dst[a]) {
      if (mark[p]) return "axis " + std::to_string(a) + " copies a position twice";
      mark[p] = 1;
    }
    for (int64_t p : plan.fills[a]) {
      if (mark[p]) return "axis " + std::to_string(a) + " copies and fills one position";
      mark[p] = 2;
    }
    int64_t lo = 0;
    while (lo < n && mark[lo]) lo++;
    int64_t hi = lo;
    while (hi < n && !mark[hi]) hi++;
    if (lo == n) return "axis " + std::to_string(a) + " has no cell read";
    for (int64_t p = hi; p < n; p++)
      if (!mark[p]) return "the cells read on axis " + std::to_string(a) + " are not one range";
    const bool copies = !plan.copy_dst[a].empty(), fills = !plan.fills[a].empty();
    if (copies && fills) return "axis " + std::to_string(a) + " has copies and fills";
    uint8_t mode = kConstant;
    if (copies) {
      bool found = false;
      for (uint8_t m : {kReflect, kSymmetric, kEdge, kPeriodic}) {
        bool ok = true;
        for (size_t k = 0; ok && k < plan.copy_dst[a].size(); k++)
          ok = BoundaryIndex(plan.copy_dst[a][k] - lo, hi - lo, m) + lo == plan.copy_src[a][k];
        if (ok) {
          mode = m;
          found = true;
          break;
        }
      }
      if (!found) return "axis " + std::to_string(a) + "'s copies follow no boundary rule of the read cells";
    }
    s.in_extent[a] = hi - lo;
    s.in_offset += lo * s.in_stride[a];
    s.start[a] = -lo;
    s.out_extent[a] = n;
    s.step[a] = 1;
    s.boundary[a] = mode;
  }
  *sample = s;
  return "";
}

SliceParams DeviceFillParams(const ReadPlan &plan, int dtype) {
  SliceParams params;
  params.in_type = params.out_type = dtype;
  if (plan.fill.empty()) return params;
  const char *f = plan.fill.data();
  auto get = [&](auto zero) {
    decltype(zero) v;
    std::memcpy(&v, f, sizeof(v));
    return v;
  };
  switch (dtype) {
    case kInt8: params.SetFillInt(get(int8_t())); break;
    case kInt16: params.SetFillInt(get(int16_t())); break;
    case kInt32: params.SetFillInt(get(int32_t())); break;
    case kInt64: params.SetFillInt(get(int64_t())); break;
    case kUInt8: case kBool: params.SetFillUInt(get(uint8_t())); break;
    case kUInt16: params.SetFillUInt(get(uint16_t())); break;
    case kUInt32: params.SetFillUInt(get(uint32_t())); break;
    case kUInt64: params.SetFillUInt(get(uint64_t())); break;
    case kFloat16: params.SetFill(HalfToFloat(get(uint16_t()))); break;
    case kFloat32: params.SetFill(get(float())); break;
    case kFloat64: params.SetFill(get(double())); break;
    default: break;
  }
  return params;
}

DeviceFills ChooseDeviceFills(const PlanSet &set, int dtype) {
  DeviceFills fills;
  fills.on.assign(set.plans.size(), 0);
  fills.program.resize(set.plans.size());
  int64_t fill_plan = -1;  // one launch takes one fill value: the first plan's that has one
  for (size_t k = 0; k < set.plans.size(); k++) {
    const ReadPlan &plan = set.plans[k];
    if (!DeviceFillProgram(plan, &fills.program[k]).empty()) continue;
    if (!plan.fill.empty()) {
      if (fill_plan < 0) fill_plan = k;
      else if (plan.fill != set.plans[fill_plan].fill) continue;
    }
    fills.on[k] = 1;
  }
  fills.params = DeviceFillParams(fill_plan >= 0 ? set.plans[fill_plan] : ReadPlan(), dtype);
  fills.params.in_type = fills.params.out_type = dtype;
  return fills;
}

}  // namespace dali_mesh
