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

// Whether the calling thread's read in flight was cancelled (CancelReads after it started).
bool ReadCancelled();

std::string ReadsInFlight();
void CancelReads();

}  // namespace dali_mesh

#endif  // DALI_MESH_STORAGE_READS_IN_FLIGHT_H_
