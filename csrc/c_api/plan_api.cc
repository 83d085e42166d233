// dali_mesh: the C entry points of the read plans' test hooks (see kernels/read_plan.h).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "kernels/read_plan.h"
#include "kernels/slice_gpu.h"

// ---- test hook: the device fill program against the host program, on the kernel's host emulation --

extern "C" {

// For every plan of the plan file at `plan_path`: a window of pseudo-random bytes (the cells read)
// finished by the host program (FinishWindow) and, where DeviceFillProgram gives one, by the GPU
// strided-slice kernel's host emulation (BuildGpuPlan + EmulateGpuPlan) into another buffer.
// Returns the number of plans whose device program equals the host's byte for byte, or -1 (a
// mismatch or an error, described in `err`); *host_only counts the plans left to the host.
__attribute__((visibility("default"))) int64_t dali_mesh_check_device_fill(const char *plan_path, int dtype, int64_t *host_only, char *err,
                                    int64_t err_len) {
  auto fail = [&](const std::string &msg) -> int64_t {
    if (err && err_len > 0) {
      std::strncpy(err, msg.c_str(), err_len - 1);
      err[err_len - 1] = '\0';
    }
    return -1;
  };
  try {
    using namespace dali_mesh;
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
      if (!e.empty()) return fail("plan " + std::to_string(k) + ": BuildGpuPlan: " + e);
      EmulateGpuPlan(gplan);
      if (host != device) {
        size_t i = 0;
        while (host[i] == device[i]) i++;
        return fail("plan " + std::to_string(k) + ": the device fill differs from the host's at byte " +
                    std::to_string(i));
      }
      checked++;
    }
    return checked;
  } catch (const std::exception &e) {
    return fail(e.what());
  }
}


// For every plan of the plan file at `plan_path`: its groups split as the operator splits them
// (SplitLargeGroups, then SplitGroups with `task_bytes`). Returns the number of tasks of all plans
// (-1 on an error, described in `err`); *max_task is the most file bytes one task spans.
__attribute__((visibility("default"))) int64_t dali_mesh_plan_tasks(const char *plan_path, int64_t task_bytes,
                                                                    int64_t *max_task, char *err,
                                                                    int64_t err_len) {
  try {
    using namespace dali_mesh;
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
    if (err && err_len > 0) {
      std::strncpy(err, e.what(), err_len - 1);
      err[err_len - 1] = '\0';
    }
    return -1;
  }
}

}  // extern "C"
