// dali_mesh: the C entry points of the read plans (csrc/kernels/read_plan.h), in
// libdali_mesh_kernels.so and bound in dali_mesh/_kernels.py: test hooks that run the plan
// executor's pieces on a plan file written by dali_mesh.native.
//
// Every function returns a count (>= 0) on success, or -1 with a message in err[0..err_len).
#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "c_api/export.h"
#include "kernels/read_plan.h"
#include "kernels/slice_gpu.h"

using dali_mesh::c_api::Fail;

// For every plan of the plan file at `plan_path`: a window of pseudo-random bytes (the cells read)
// finished by the host program (FinishWindow) and, where DeviceFillProgram gives one, by the GPU
// strided-slice kernel's host emulation (BuildGpuPlan + EmulateGpuPlan) into another buffer.
// Returns the number of plans whose device program equals the host's byte for byte, or -1 (a
// mismatch or an error, described in `err`); *host_only counts the plans left to the host.
DM_EXPORT int64_t dali_mesh_check_device_fill(const char *plan_path, int dtype, int64_t *host_only,
                                              char *err, int64_t err_len) {
  try {
    using namespace dali_mesh;  // NOLINT
    PlanSet set = LoadPlanSet(plan_path);
    int64_t checked = 0;
    *host_only = 0;
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (size_t k = 0; k < set.plans.size(); k++) {
      const ReadPlan &plan = set.plans[k];
      SliceSample sample;
      if (!DeviceFillProgram(plan, &sample).empty()) {
        ++*host_only;
        continue;
      }
      std::vector<char> window(plan.bytes());
      for (auto &c : window) {  // xorshift: every byte of the window, read or not
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c = static_cast<char>(x >> 56);
      }
      std::vector<char> host = window, device(plan.bytes(), '\xcd');
      FinishWindow(plan, host.data(), host.data());
      const void *in[1] = {window.data()};
      void *out[1] = {device.data()};
      GpuPlan gplan;
      std::string e = BuildGpuPlan({sample}, in, out, DeviceFillParams(plan, dtype), &gplan);
      if (!e.empty()) return Fail("plan " + std::to_string(k) + ": BuildGpuPlan: " + e, err, err_len);
      EmulateGpuPlan(gplan);
      if (host != device) {
        size_t i = 0;
        while (host[i] == device[i]) i++;
        return Fail("plan " + std::to_string(k) + ": the device fill differs from the host's at byte " +
                        std::to_string(i),
                    err, err_len);
      }
      checked++;
    }
    return checked;
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}

// For every plan of the plan file at `plan_path`: its groups split as the operator splits them
// (SplitLargeGroups, then SplitGroups with `task_bytes`). Returns the number of tasks of all plans
// (-1 on an error, described in `err`); *max_task is the most file bytes one task spans.
DM_EXPORT int64_t dali_mesh_plan_tasks(const char *plan_path, int64_t task_bytes, int64_t *max_task,
                                       char *err, int64_t err_len) {
  try {
    using namespace dali_mesh;  // NOLINT
    PlanSet set = LoadPlanSet(plan_path);
    int64_t n = 0;
    *max_task = 0;
    for (auto &plan : set.plans) {
      SplitLargeGroups(&plan, task_bytes);
      for (auto &t : SplitGroups(plan, task_bytes)) {
        n++;
        const int64_t b = plan.group_begin[t.first], e = plan.group_end[t.second - 1];
        *max_task = std::max(*max_task, plan.file_off[e - 1] + plan.unit_bytes[e - 1] - plan.file_off[b]);
      }
    }
    return n;
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}
