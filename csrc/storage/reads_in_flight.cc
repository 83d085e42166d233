// dali_mesh: the reads in flight of this process, and their cancellation (see reads_in_flight.h).
#include "storage/reads_in_flight.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>

namespace dali_mesh {

namespace {

struct Flight {
  std::string path;
  int64_t offset = 0, bytes = 0;
  std::chrono::steady_clock::time_point since;
  pthread_t thread;
};

std::mutex &FlightMutex() {
  static auto *m = new std::mutex;  // never destroyed: reads may still run while the process exits
  return *m;
}

std::map<uint64_t, Flight> &Flights() {
  static auto *m = new std::map<uint64_t, Flight>;
  return *m;
}

// CancelReads() ends the reads in flight when it is called, not later ones: a pipeline built after
// a failure (a resume from a checkpoint) reads as usual. A read is cancelled when it was started
// before the last cancel: t_flight_epoch (the cancel count when the calling thread's read started;
// none in flight: never cancelled) below g_cancel_epoch.
std::atomic<uint64_t> g_cancel_epoch{0};
thread_local uint64_t t_flight_epoch = UINT64_MAX;
uint64_t g_next_flight = 0;

void OnCancelSignal(int) {}  // only interrupts the read (EINTR); the read then sees ReadCancelled()

}  // namespace

FlightGuard::FlightGuard(const std::string &name, int64_t offset, int64_t bytes) : outer_epoch_(t_flight_epoch) {
  std::lock_guard<std::mutex> lock(FlightMutex());
  id_ = ++g_next_flight;
  Flights()[id_] = Flight{name, offset, bytes, std::chrono::steady_clock::now(), pthread_self()};
  t_flight_epoch = std::min(outer_epoch_, g_cancel_epoch.load());
}

FlightGuard::~FlightGuard() {
  std::lock_guard<std::mutex> lock(FlightMutex());
  Flights().erase(id_);
  t_flight_epoch = outer_epoch_;
}

namespace {
thread_local const CancelFlag *t_cancel_flag = nullptr;
}  // namespace

bool ReadCancelled() {
  return t_flight_epoch < g_cancel_epoch.load() || (t_cancel_flag != nullptr && t_cancel_flag->cancelled());
}

CancelScope::CancelScope(const CancelFlag *flag) : outer_(t_cancel_flag) {
  if (flag != nullptr) t_cancel_flag = flag;
}

CancelScope::~CancelScope() { t_cancel_flag = outer_; }

const CancelFlag *CurrentCancelFlag() { return t_cancel_flag; }

std::string ReadsInFlight() {
  static const char kHex[] = "0123456789abcdef";
  const auto now = std::chrono::steady_clock::now();
  std::string out;
  std::lock_guard<std::mutex> lock(FlightMutex());
  for (const auto &kv : Flights()) {
    const Flight &f = kv.second;
    std::string hex;
    for (unsigned char c : f.path) {
      hex += kHex[c >> 4];
      hex += kHex[c & 15];
    }
    const double seconds = std::chrono::duration<double>(now - f.since).count();
    out += "{\"path\": \"" + hex + "\", \"offset\": " + std::to_string(f.offset) + ", \"bytes\": " +
           std::to_string(f.bytes) + ", \"seconds\": " + std::to_string(seconds) + "}\n";
  }
  return out;
}

uint64_t CancelCount() { return g_cancel_epoch.load(); }

void CancelReads() {
  static std::once_flag installed;
  const int sig = SIGRTMIN + 5;  // glibc keeps SIGRTMIN..SIGRTMIN+2 for itself
  std::call_once(installed, [sig] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = OnCancelSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: a blocked read returns EINTR
    ::sigaction(sig, &sa, nullptr);
  });
  std::lock_guard<std::mutex> lock(FlightMutex());
  g_cancel_epoch.fetch_add(1);
  for (const auto &kv : Flights()) ::pthread_kill(kv.second.thread, sig);
}

}  // namespace dali_mesh
