// dali_mesh: a plan's reads cut into thread-pool tasks by bytes, so that one large window is read
// by every thread. DALI-free.
#ifndef DALI_MESH_READER_TASKS_H_
#define DALI_MESH_READER_TASKS_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "plan/plan.h"

namespace dali_mesh {

// Splits every group of `plan` that spans more than `max_bytes` of the file into groups of at most
// about `max_bytes` (units larger than that into pieces of whole items), so that one large
// contiguous window is read by several threads. The bytes read and where they land are unchanged.
void SplitLargeGroups(ReadPlan *plan, int64_t max_bytes);

// Splits a plan's groups into tasks of about `task_bytes` bytes each: [g_begin, g_end) pairs.
std::vector<std::pair<int64_t, int64_t>> SplitGroups(const ReadPlan &plan, int64_t task_bytes);

}  // namespace dali_mesh

#endif  // DALI_MESH_READER_TASKS_H_
