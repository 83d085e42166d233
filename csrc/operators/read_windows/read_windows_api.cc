// dali_mesh: the read_windows operator's reads, seen from Python (dali_mesh.pipeline.plugin binds
// these on the loaded plugin). Exported from libdali_mesh.so, not the kernels library: the reads in
// flight are the plugin's own (each library holds its own copy of the DALI-free core).
#include <cstdint>
#include <cstring>
#include <string>

#include "c_api/export.h"
#include "kernels/read_plan.h"

// The native reads in flight as JSON lines (see ReadsInFlight in read_plan.h): returns the text's
// length n and writes it NUL-terminated when out_size > n (ask again with a larger buffer otherwise).
DM_EXPORT int64_t dali_mesh_reads_in_flight(char *out, int64_t out_size) {
  const std::string text = dali_mesh::ReadsInFlight();
  const int64_t n = static_cast<int64_t>(text.size());
  if (out && out_size > n) {
    std::memcpy(out, text.data(), text.size());
    out[n] = '\0';
  }
  return n;
}

// Makes the native reads in flight fail, interrupting those blocked in the kernel (see CancelReads in
// read_plan.h): after a pipeline failure, so that its threads return.
DM_EXPORT void dali_mesh_cancel_reads() { dali_mesh::CancelReads(); }
