// dali_mesh: threads kept for the life of the process (see kept_threads.h).
#include "storage/kept_threads.h"

#include <algorithm>
#include <memory>
#include <system_error>
#include <thread>
#include <utility>

namespace dali_mesh {

KeptThreads &KeptThreads::Fetch() {
  static auto *pool = new KeptThreads(32, 32);  // never destroyed: its threads outlive main
  return *pool;
}

KeptThreads &KeptThreads::Readers() {
  // a quarter of the threads is kept for the helpers of reads waited for: 70 pipelines whose batches
  // read ahead wait on a dead server hold 48, and a healthy pipeline's reads are still helped
  static auto *pool = new KeptThreads(64, 48);
  return *pool;
}

int KeptThreads::Runnable() const {
  const int background = std::min<int>(static_cast<int>(background_.size()),
                                       std::max(0, max_background_ - background_running_));
  return static_cast<int>(foreground_.size()) + background;
}

bool KeptThreads::Backlogged(Lane lane) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto &queue = lane == Lane::kForeground ? foreground_ : background_;
  if (queue.empty()) return false;
  if (lane == Lane::kBackground && background_running_ >= max_background_) return true;
  return idle_ == 0 && threads_ >= max_threads_;
}

std::future<void> KeptThreads::Submit(std::function<void()> fn, Lane lane) {
  auto task = std::make_shared<std::packaged_task<void()>>(std::move(fn));
  std::future<void> done = task->get_future();
  auto &queue = lane == Lane::kForeground ? foreground_ : background_;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue.emplace_back([task] { (*task)(); });
    if (idle_ < Runnable() && threads_ < max_threads_) {
      threads_++;
      try {
        std::thread([this] { Loop(); }).detach();
      } catch (const std::system_error &) {  // no thread to be had: the ones there run it, if any
        threads_--;
        if (threads_ == 0) {
          queue.pop_back();
          throw;
        }
      }
    }
  }
  cv_.notify_one();
  return done;
}

void KeptThreads::Loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    idle_++;
    cv_.wait(lock, [this] { return Runnable() > 0; });
    idle_--;
    const bool background = foreground_.empty();  // foreground work first
    auto &queue = background ? background_ : foreground_;
    auto fn = std::move(queue.front());
    queue.pop_front();
    if (background) background_running_++;
    lock.unlock();
    fn();
    lock.lock();
    // background work waiting for this share is taken by this thread at the top of the loop
    if (background) background_running_--;
  }
}

}  // namespace dali_mesh
