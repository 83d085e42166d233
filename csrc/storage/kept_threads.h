// dali_mesh: threads kept for the life of the process, for work that runs outside DALI's thread
// pool: the requests one thread sends together (HttpStore::GetMany) and the batches a reader reads
// ahead. Host only, DALI-free.
//
// A thread is started when work waits and none is idle (at most a pool's bound), and never stopped:
// no thread waits on a destroyed queue at exit, and a thread's thread-local state (its curl handle
// with its open connections, its codec contexts and scratch buffers) serves all the work it runs,
// where a thread per batch would connect again and fault in fresh buffers every batch.
//
// Work is in one of two lanes. Foreground work (the helpers of a read someone waits for) is taken
// first; background work (batches read ahead and their helpers) holds at most a bounded share of the
// threads, so that read-aheads stuck on a dead server never hold every thread: a read waited for
// still finds threads to help it.
#ifndef DALI_MESH_STORAGE_KEPT_THREADS_H_
#define DALI_MESH_STORAGE_KEPT_THREADS_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>

namespace dali_mesh {

// Who does a job handed to the kept threads: the thread that starts it (Start), or the one that asked
// for it, taking it back before any thread started it (TakeBack); exactly one of them wins, so a job
// is never done twice nor left undone, and the asker never waits on a job that has not started.
class JobClaim {
 public:
  bool Start() { return From(kQueued, kRunning); }
  bool TakeBack() { return From(kQueued, kTaken); }
  bool queued() const { return state_.load() == kQueued; }
  bool running() const { return state_.load() == kRunning; }
  void Reset() { state_.store(kQueued); }  // for a job handed out again

 private:
  static constexpr int kQueued = 0, kRunning = 1, kTaken = 2;
  bool From(int from, int to) { return state_.compare_exchange_strong(from, to); }
  std::atomic<int> state_{kQueued};
};

class KeptThreads {
 public:
  enum class Lane { kForeground, kBackground };

  // The requests a thread sends together (GetMany): they never wait on other work of this pool, and
  // the thread never waits on one of them that no thread of this pool has started (it takes it back
  // and sends it itself: the pool is the whole process's, and may be held by other pipelines'
  // requests stuck on a dead server).
  static KeptThreads &Fetch();
  // Batches read ahead (background) and the helpers of the C API's reads (RunOnThreads): work that
  // may send requests through Fetch(), so it has a pool of its own (a full Fetch() pool then still
  // answers).
  static KeptThreads &Readers();

  // Runs `fn` on one of the threads; the future holds its end (and its exception). Throws
  // std::system_error, with `fn` not queued, when the pool has no thread and none can be started.
  std::future<void> Submit(std::function<void()> fn, Lane lane = Lane::kForeground);

  // Whether work queued in `lane` waits for a thread: every thread is busy, or (background) the lane
  // holds its whole share. Work queued then may wait behind other work for as long as that runs.
  bool Backlogged(Lane lane);

 private:
  KeptThreads(int max_threads, int max_background) : max_threads_(max_threads), max_background_(max_background) {}
  void Loop();
  // work queued that a thread may take now (background work only while under its share); mutex_ held
  int Runnable() const;

  const int max_threads_, max_background_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> foreground_, background_;
  int threads_ = 0, idle_ = 0, background_running_ = 0;
};

}  // namespace dali_mesh

#endif  // DALI_MESH_STORAGE_KEPT_THREADS_H_
