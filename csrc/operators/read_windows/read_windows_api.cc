// dali_mesh: the read_windows operator's reads, seen from Python (dali_mesh.pipeline.plugin binds
// these on the loaded plugin). Exported from libdali_mesh.so; what they report is the core's, in the
// kernels library the plugin links (one copy per process: a PlanReader's reads are counted too).
#include <cstdint>
#include <string>

#include "c_api/export.h"
#include "reader/batch_reader.h"
#include "storage/reads_in_flight.h"

// The native reads in flight as JSON lines (see ReadsInFlight in storage/reads_in_flight.h), by
// CopyText: returns their length n, written NUL-terminated when out_size > n.
DM_EXPORT int64_t dali_mesh_reads_in_flight(char *out, int64_t out_size) {
  return dali_mesh::c_api::CopyText(dali_mesh::ReadsInFlight(), out, out_size);
}

// Makes the native reads in flight fail, interrupting those blocked in the kernel (see CancelReads in
// storage/reads_in_flight.h): after a pipeline failure, so that its threads return.
DM_EXPORT void dali_mesh_cancel_reads() { dali_mesh::CancelReads(); }

// The operator's batches read from what was read ahead (out[0]), read ahead then dropped unused
// (out[1]), and read ahead in vain (it failed: read again when wanted, out[2]) in this process
// (ReadAheadCounts in reader/batch_reader.h).
DM_EXPORT void dali_mesh_read_ahead_counts(int64_t *out) {
  dali_mesh::ReadAheadCounts(&out[0], &out[1], &out[2]);
}
