// dali_mesh: a plan's reads cut into thread-pool tasks by bytes, so that one large window is read
// by every thread, and the tasks run on threads (the C API's and the batches read ahead; the operator
// runs them on DALI's thread pool). DALI-free.
#ifndef DALI_MESH_READER_TASKS_H_
#define DALI_MESH_READER_TASKS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "plan/plan.h"
#include "storage/kept_threads.h"

namespace dali_mesh {

// Splits every group of `plan` that spans more than `max_bytes` of the file into groups of at most
// about `max_bytes` (units larger than that into pieces of whole items), so that one large
// contiguous window is read by several threads. The bytes read and where they land are unchanged.
void SplitLargeGroups(ReadPlan *plan, int64_t max_bytes);

// Splits a plan's groups into tasks of about `task_bytes` bytes each: [g_begin, g_end) pairs.
std::vector<std::pair<int64_t, int64_t>> SplitGroups(const ReadPlan &plan, int64_t task_bytes);

using TaskFn = std::function<void(int64_t task)>;
using TaskCost = std::function<int64_t(int64_t task)>;
// Runs fn(0) .. fn(n - 1), in any order and on any threads, and returns when all have run; an
// error of a task is rethrown (DALI's ThreadPool::RunAll does both). cost(t): task t's size, a hint
// for the order (ThreadPool::AddWork's priority).
using RunTasks = std::function<void(const TaskFn &fn, int64_t n, const TaskCost &cost)>;

// RunTasks on this thread, task after task (an error stops the rest).
void RunSerially(const TaskFn &fn, int64_t n, const TaskCost &cost);

// RunTasks on `threads` threads (this one among them, the others under its CancelScope's flag), the
// larger tasks first (as DALI's thread pool orders its work by priority); every task runs, the first
// error is rethrown after the last. The others are kept threads (KeptThreads::Readers, foreground
// lane) that help while they can: the calling thread never waits for one that has not started.
RunTasks RunOnThreads(int threads);

// RunOnThreads with its helpers in `lane`; with `held` (the threads a reader's batches read ahead
// hold), a helper that would make more than `held_most` of them leaves at once.
RunTasks RunOn(int threads, KeptThreads::Lane lane, std::shared_ptr<std::atomic<int>> held, int held_most);

}  // namespace dali_mesh

#endif  // DALI_MESH_READER_TASKS_H_
