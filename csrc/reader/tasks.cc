// dali_mesh: a plan's reads cut into tasks by bytes, and the tasks run on threads (see tasks.h).
#include "reader/tasks.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <numeric>
#include <utility>
#include <vector>

#include "storage/reads_in_flight.h"

namespace dali_mesh {

void SplitLargeGroups(ReadPlan *plan, int64_t max_bytes) {
  const int64_t n_groups = plan->group_begin.size();
  if (max_bytes <= 0 || n_groups == 0) return;
  // pieces of a unit: whole items (a byte swap and a transpose never see half an item)
  const int64_t piece = std::max<int64_t>(1, max_bytes / plan->itemsize) * plan->itemsize;
  bool needed = false;
  for (int64_t g = 0; g < n_groups && !needed; g++) {
    const int64_t b = plan->group_begin[g], e = plan->group_end[g];
    needed = plan->file_end(e - 1) - plan->file_off[b] > max_bytes;
  }
  if (!needed) return;
  std::vector<int64_t> fo, dof, ub, cnt, fst, dst, gb, ge;
  auto add = [&](int64_t f, int64_t d, int64_t b, int64_t n, int64_t fs, int64_t ds) {
    fo.push_back(f);
    dof.push_back(d);
    ub.push_back(b);
    cnt.push_back(n);
    fst.push_back(n > 1 ? fs : 0);
    dst.push_back(n > 1 ? ds : 0);
  };
  for (int64_t g = 0; g < n_groups; g++) {
    int64_t start = -1;  // file offset where the group being built starts
    gb.push_back(fo.size());
    // closes the group being built (when it holds a unit) if `need` bytes from `off` would take it
    // past max_bytes; returns the room left from `off`
    auto room_at = [&](int64_t off, int64_t need) {
      if (start < 0) start = off;
      if (start + max_bytes - off < need && static_cast<int64_t>(fo.size()) > gb.back()) {
        ge.push_back(fo.size());
        gb.push_back(fo.size());
        start = off;
      }
      return start + max_bytes - off;
    };
    for (int64_t u = plan->group_begin[g]; u < plan->group_end[g]; u++) {
      const int64_t bytes = plan->unit_bytes[u], n = plan->unit_count[u];
      if (n > 1 && bytes <= max_bytes) {
        // runs of a repeated unit: as many per unit as fit in the group's room, at least one
        for (int64_t j = 0; j < n;) {
          const int64_t off = plan->file_off[u] + j * plan->file_step[u];
          const int64_t room = room_at(off, bytes);
          const int64_t take = std::min(n - j, room < bytes ? 1 : 1 + (room - bytes) / plan->file_step[u]);
          add(off, plan->dst_off[u] + j * plan->dst_step[u], bytes, take, plan->file_step[u], plan->dst_step[u]);
          j += take;
        }
        continue;
      }
      for (int64_t j = 0; j < n; j++) {  // runs larger than max_bytes: each in pieces of whole items
        const int64_t run = plan->file_off[u] + j * plan->file_step[u], run_dst = plan->dst_off[u] + j * plan->dst_step[u];
        for (int64_t done = 0; done < bytes;) {
          const int64_t off = run + done;
          // close the group when this unit (or piece) would take it past max_bytes
          const int64_t room = std::max(room_at(off, plan->itemsize), plan->itemsize);
          const int64_t left = bytes - done;
          int64_t take = left;
          if (take > room) take = std::max<int64_t>(plan->itemsize, room / plan->itemsize * plan->itemsize);
          take = std::min({take, left, std::max<int64_t>(piece, plan->itemsize)});
          add(off, run_dst + done, take, 1, 0, 0);
          done += take;
        }
      }
    }
    ge.push_back(fo.size());
  }
  plan->file_off = std::move(fo);
  plan->dst_off = std::move(dof);
  plan->unit_bytes = std::move(ub);
  plan->unit_count = std::move(cnt);
  plan->file_step = std::move(fst);
  plan->dst_step = std::move(dst);
  plan->group_begin = std::move(gb);
  plan->group_end = std::move(ge);
}

std::vector<std::pair<int64_t, int64_t>> SplitGroups(const ReadPlan &plan, int64_t task_bytes) {
  std::vector<std::pair<int64_t, int64_t>> tasks;
  const int64_t n = plan.group_begin.size();
  int64_t start = 0, acc = 0;
  for (int64_t g = 0; g < n; g++) {
    const int64_t b = plan.group_begin[g], e = plan.group_end[g];
    acc += plan.file_end(e - 1) - plan.file_off[b];
    if (acc >= task_bytes) {
      tasks.emplace_back(start, g + 1);
      start = g + 1;
      acc = 0;
    }
  }
  if (start < n) tasks.emplace_back(start, n);
  return tasks;
}

void RunSerially(const TaskFn &fn, int64_t n, const TaskCost &) {
  for (int64_t t = 0; t < n; t++) fn(t);
}

RunTasks RunOn(int threads, KeptThreads::Lane lane, std::shared_ptr<std::atomic<int>> held, int held_most) {
  if (threads <= 1) return RunSerially;
  return [threads, lane, held, held_most](const TaskFn &fn, int64_t n, const TaskCost &cost) {
    // the calling thread takes tasks in cost order, and up to threads - 1 kept threads help it; a
    // helper that starts after the last task was taken (the pool was busy) finds none and leaves, so
    // the caller never waits for a helper that has not started, only for those running a task
    struct Shared {
      const TaskFn *fn;
      std::vector<int64_t> order;
      std::atomic<int64_t> next{0};
      std::mutex mutex;
      std::condition_variable done;
      std::exception_ptr error;
      int running = 0;
      bool closed = false;
      const CancelFlag *flag;
    };
    auto shared = std::make_shared<Shared>();
    shared->fn = &fn;
    shared->flag = CurrentCancelFlag();
    shared->order.resize(n);
    std::vector<int64_t> costs(n);
    std::iota(shared->order.begin(), shared->order.end(), int64_t(0));
    for (int64_t t = 0; t < n; t++) costs[t] = cost(t);
    std::stable_sort(shared->order.begin(), shared->order.end(),
                     [&](int64_t a, int64_t b) { return costs[a] > costs[b]; });
    auto work = [](Shared &s) {
      for (int64_t k; (k = s.next.fetch_add(1)) < static_cast<int64_t>(s.order.size());) {
        try {
          (*s.fn)(s.order[k]);
        } catch (...) {
          std::lock_guard<std::mutex> lock(s.mutex);
          if (!s.error) s.error = std::current_exception();
        }
      }
    };
    const int64_t helpers = std::min<int64_t>(threads, n) - 1;
    try {
      for (int64_t k = 0; k < helpers; k++) {
        KeptThreads::Readers().Submit(
            [shared, work, held, held_most] {
              {
                std::lock_guard<std::mutex> lock(shared->mutex);
                if (shared->closed) return;
                if (held && held->fetch_add(1) >= held_most) {
                  held->fetch_sub(1);
                  return;
                }
                shared->running++;
              }
              {
                CancelScope scope(shared->flag);
                work(*shared);
              }
              if (held) held->fetch_sub(1);
              std::lock_guard<std::mutex> lock(shared->mutex);
              if (--shared->running == 0) shared->done.notify_all();
            },
            lane);
      }
    } catch (const std::exception &) {  // no thread or memory for more helpers: fewer help
    }
    work(*shared);
    std::unique_lock<std::mutex> lock(shared->mutex);
    shared->closed = true;
    shared->done.wait(lock, [&] { return shared->running == 0; });
    if (shared->error) std::rethrow_exception(shared->error);
  };
}

RunTasks RunOnThreads(int threads) { return RunOn(threads, KeptThreads::Lane::kForeground, nullptr, 0); }

}  // namespace dali_mesh
