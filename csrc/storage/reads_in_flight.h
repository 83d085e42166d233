// dali_mesh: the reads in flight of this process, and their cancellation. Host only, DALI-free.
//
// Every read of a stored object (a plan's merged reads, a chunk's bytes, the checks when an object is
// opened) is registered while it runs: object name, byte range, start time, thread. ReadsInFlight()
// lists them as JSON lines {"path": hex, "offset", "bytes", "seconds"}, so that a watchdog names the
// object and bytes a stuck read is on. CancelReads() makes the reads in flight fail (reads started
// later, e.g. by a pipeline resumed from a checkpoint, are not affected): those blocked in the kernel
// are interrupted by a signal (installed without SA_RESTART, so the call returns EINTR, which a store
// then fails on instead of retrying: ReadCancelled()), so that the threads return and the process can
// exit. A read the kernel does not interrupt (uninterruptible sleep, e.g. a hard NFS mount) returns
// when it returns.
#ifndef DALI_MESH_STORAGE_READS_IN_FLIGHT_H_
#define DALI_MESH_STORAGE_READS_IN_FLIGHT_H_

#include <atomic>
#include <cstdint>
#include <string>

namespace dali_mesh {

// Registers one read (of `name`, `bytes` at `offset`) for as long as it lives.
class FlightGuard {
 public:
  FlightGuard(const std::string &name, int64_t offset, int64_t bytes);
  ~FlightGuard();
  FlightGuard(const FlightGuard &) = delete;
  FlightGuard &operator=(const FlightGuard &) = delete;

 private:
  uint64_t id_ = 0;
  uint64_t outer_epoch_;
};

// Whether the calling thread's read in flight was cancelled (CancelReads after it started), or the
// thread runs under a CancelScope whose flag is set.
bool ReadCancelled();

// A flag that cancels the reads of the threads running under it (CancelScope), as CancelReads does
// for every read of the process: a batch read ahead and then not wanted is dropped this way. Reads
// blocked in the kernel are not interrupted (the flag is for remote reads, which look at it at
// least once a second); a read sees it at its next look and fails as cancelled.
class CancelFlag {
 public:
  void Cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  std::atomic<bool> cancelled_{false};
};

// While it lives, the calling thread's reads are also cancelled by `flag` (null: none); scopes nest.
class CancelScope {
 public:
  explicit CancelScope(const CancelFlag *flag);
  ~CancelScope();
  CancelScope(const CancelScope &) = delete;
  CancelScope &operator=(const CancelScope &) = delete;

 private:
  const CancelFlag *outer_;
};

// The flag the calling thread runs under (null: none), for work it hands to other threads.
const CancelFlag *CurrentCancelFlag();

std::string ReadsInFlight();
void CancelReads();
// How many times CancelReads was called: a read that failed while it changed may have been cancelled
// for another pipeline's sake (a batch read ahead that failed so is read again when wanted).
uint64_t CancelCount();

}  // namespace dali_mesh

#endif  // DALI_MESH_STORAGE_READS_IN_FLIGHT_H_
