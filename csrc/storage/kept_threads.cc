// dali_mesh: threads kept for the life of the process (see kept_threads.h).
#include "storage/kept_threads.h"

#include <memory>
#include <system_error>
#include <thread>
#include <utility>

namespace dali_mesh {

KeptThreads &KeptThreads::Fetch() {
  static auto *pool = new KeptThreads(32);  // never destroyed: its threads outlive main
  return *pool;
}

KeptThreads &KeptThreads::Readers() {
  static auto *pool = new KeptThreads(64);
  return *pool;
}

std::future<void> KeptThreads::Submit(std::function<void()> fn) {
  auto task = std::make_shared<std::packaged_task<void()>>(std::move(fn));
  std::future<void> done = task->get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.emplace_back([task] { (*task)(); });
    if (idle_ < static_cast<int>(queue_.size()) && threads_ < max_threads_) {
      threads_++;
      try {
        std::thread([this] { Loop(); }).detach();
      } catch (const std::system_error &) {  // no thread to be had: the ones there run it, if any
        threads_--;
        if (threads_ == 0) {
          queue_.pop_back();
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
    cv_.wait(lock, [this] { return !queue_.empty(); });
    idle_--;
    auto fn = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    fn();
    lock.lock();
  }
}

}  // namespace dali_mesh
