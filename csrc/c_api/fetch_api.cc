// dali_mesh: the C entry points of the reader's fetch plan (csrc/reader/fetch_plan.h), in
// libdali_mesh_kernels.so and bound in dali_mesh/_kernels/fetch_api.py: which requests fetch a set of
// wanted byte ranges at a given latency and bandwidth (the tests hold its decisions to recorded
// links and fuzz its invariants).
//
// Functions that take `err` return a count (>= 0) on success, or -1 with a message in err[0..err_len).
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "c_api/export.h"
#include "reader/fetch_plan.h"

using dali_mesh::c_api::Fail;

// The requests (PlanRequests) that fetch the `n` byte ranges wanted[2k]..wanted[2k+1] (sorted,
// disjoint, non-empty) from a store whose requests wait `latency_s` for their first byte and then
// bring `bytes_per_s` (0: not measured): their number m, the ranges written to out[0..2m) (room for
// 2n values: never more requests than ranges), or -1 with a message.
DM_EXPORT int64_t dali_mesh_plan_requests(const int64_t *wanted, int64_t n, double latency_s, double bytes_per_s,
                                          int64_t *out, char *err, int64_t err_len) {
  try {
    if (n < 0 || (n > 0 && (!wanted || !out))) return Fail("dali_mesh_plan_requests: no ranges given", err, err_len);
    if (!(latency_s >= 0) || !(bytes_per_s >= 0))
      return Fail("latency_s and bytes_per_s must be >= 0, not " + std::to_string(latency_s) + " and " +
                  std::to_string(bytes_per_s), err, err_len);
    dali_mesh::ByteRanges rs;
    for (int64_t k = 0; k < n; k++) {
      const int64_t lo = wanted[2 * k], hi = wanted[2 * k + 1];
      if (lo < 0 || hi <= lo || (k && lo < rs.back().second))
        return Fail("ranges must be sorted, disjoint and non-empty (range " + std::to_string(k) + ": [" +
                    std::to_string(lo) + ", " + std::to_string(hi) + "))", err, err_len);
      rs.push_back({lo, hi});
    }
    const dali_mesh::ByteRanges got = dali_mesh::PlanRequests(rs, dali_mesh::RoundTrip{latency_s, bytes_per_s});
    for (size_t k = 0; k < got.size(); k++) {
      out[2 * k] = got[k].first;
      out[2 * k + 1] = got[k].second;
    }
    return static_cast<int64_t>(got.size());
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}

// The largest gap the link (latency_s, bytes_per_s) reads rather than send another request
// (MergeGap: latency times bandwidth, at least the local 64 KiB).
DM_EXPORT int64_t dali_mesh_merge_gap(double latency_s, double bytes_per_s) {
  return dali_mesh::MergeGap(dali_mesh::RoundTrip{latency_s, bytes_per_s});
}
