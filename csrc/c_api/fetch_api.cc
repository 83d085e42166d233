// dali_mesh: the C entry points of the reader's fetch plan (csrc/reader/fetch_plan.h), in
// libdali_mesh_kernels.so and bound in dali_mesh/_kernels/fetch_api.py: which requests fetch a set of
// wanted byte ranges at a given latency and bandwidth (the tests hold its decisions to recorded
// links and fuzz its invariants), and which chunks of a batch one request fetches together (the tests
// hold it to its contract), and what an epoch of the reader fetches (fetch_epoch.h: `dali-mesh plan`'s
// counts and every cost estimate, by the reader's own code).
//
// Functions that take `err` return a count (>= 0) on success, or -1 with a message in err[0..err_len).
#include <cstdint>
#include <exception>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "c_api/export.h"
#include "plan/plan.h"
#include "reader/fetch_epoch.h"
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

// The chunks fetched by one request each (ChunkRuns) among the `n` chunks read whole
// spans[3k], spans[3k+1], spans[3k+2] = (file, offset, nbytes): file in [0, n_files), offset >= 0,
// nbytes >= 0 (0: fetched by none), offset + nbytes within int64. A request to file f waits
// latency_s[f] for its first byte and then brings bytes_per_s[f] (0: not measured; both arrays of
// n_files values, or both null: every file local). `max_bytes`: a run's most bytes from its first to
// its last (0: the reader's own, kMaxMergedRequest). Returns the number m of runs: run r is
// index[run_end[r-1]..run_end[r]) (run_end[-1] = 0), indices into the chunks in the run's order;
// `index` has room for n values and `run_end` for n / 2 (a run holds two chunks or more). Or -1 with
// a message.
DM_EXPORT int64_t dali_mesh_chunk_runs(const int64_t *spans, int64_t n, const double *latency_s,
                                       const double *bytes_per_s, int64_t n_files, int64_t max_bytes,
                                       int64_t *index, int64_t *run_end, char *err, int64_t err_len) {
  try {
    if (n < 0 || (n > 0 && (!spans || !index || !run_end)))
      return Fail("dali_mesh_chunk_runs: no chunks given", err, err_len);
    if (n_files < 0 || (!latency_s) != (!bytes_per_s) || (n_files > 0 && !latency_s))
      return Fail("dali_mesh_chunk_runs: give latency_s and bytes_per_s for every file, or neither", err, err_len);
    if (max_bytes < 0)
      return Fail("max_bytes must be >= 0 (0: the reader's own), not " + std::to_string(max_bytes), err, err_len);
    std::vector<dali_mesh::RoundTrip> costs(static_cast<size_t>(n_files));
    for (int64_t f = 0; f < n_files && latency_s; f++) {
      if (!(latency_s[f] >= 0) || !(bytes_per_s[f] >= 0))
        return Fail("latency_s and bytes_per_s must be >= 0, not " + std::to_string(latency_s[f]) + " and " +
                    std::to_string(bytes_per_s[f]) + " (file " + std::to_string(f) + ")", err, err_len);
      costs[f] = dali_mesh::RoundTrip{latency_s[f], bytes_per_s[f]};
    }
    std::vector<dali_mesh::StoredSpan> chunks(static_cast<size_t>(n));
    for (int64_t k = 0; k < n; k++) {
      const int64_t file = spans[3 * k], offset = spans[3 * k + 1], nbytes = spans[3 * k + 2];
      if (file < 0 || (latency_s && file >= n_files))
        return Fail("chunk " + std::to_string(k) + "'s file " + std::to_string(file) + " is not one of the " +
                    std::to_string(n_files) + " files whose cost is given", err, err_len);
      if (offset < 0 || nbytes < 0 || nbytes > std::numeric_limits<int64_t>::max() - offset)
        return Fail("chunk " + std::to_string(k) + ": offset " + std::to_string(offset) + " and " +
                    std::to_string(nbytes) + " bytes must be >= 0 and end within int64", err, err_len);
      chunks[k] = dali_mesh::StoredSpan{file, offset, nbytes};
    }
    const auto runs = dali_mesh::ChunkRuns(
        chunks, [&](int64_t file) { return latency_s ? costs[file] : dali_mesh::RoundTrip(); },
        max_bytes > 0 ? max_bytes : dali_mesh::kMaxMergedRequest);
    int64_t at = 0;
    for (size_t r = 0; r < runs.size(); r++) {
      for (int64_t k : runs[r]) index[at++] = k;
      run_end[r] = at;
    }
    return static_cast<int64_t>(runs.size());
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}

// The stored bytes from which a Blosc chunk may be read in parts (fetch_plan.h kMinPartsBytes): the
// planner reads one header of each coder whose chunks reach it (PlanSet.blosc_probes).
DM_EXPORT int64_t dali_mesh_min_parts_bytes(void) { return dali_mesh::kMinPartsBytes; }

// What an epoch of the batch reader fetches (fetch_epoch.h EpochFetches), counted by the reader's own
// code without reading: the plan file `plan_path` (as the reader loads it), the `n` sample ids `ids` read
// in batches of `batch_size` (the last one shorter) with `outputs` windows per id and the reader's
// `task_bytes`; `n_headers` Blosc headers of 16 bytes each at headers[16k..16k+16), of a chunk of coder
// header_coders[k]; and per store of the plan file (its store table, in order) what a request costs,
// latency_s[s] and bytes_per_s[s] (both null: each store's own measure). Writes per batch b its requests,
// body bytes, round trips and chunks read in parts (estimated) to out[4b..4b+4) (room for out_len values)
// and returns the number of batches, or -1 with a message.
DM_EXPORT int64_t dali_mesh_epoch_fetches(const char *plan_path, const int64_t *ids, int64_t n, int64_t batch_size,
                                          int64_t outputs, int64_t task_bytes, const int64_t *header_coders,
                                          const char *headers, int64_t n_headers, const double *latency_s,
                                          const double *bytes_per_s, int64_t n_stores, int64_t *out, int64_t out_len,
                                          char *err, int64_t err_len) {
  try {
    if (!plan_path) return Fail("dali_mesh_epoch_fetches: no plan file given", err, err_len);
    if (n < 0 || (n > 0 && !ids)) return Fail("dali_mesh_epoch_fetches: no sample ids given", err, err_len);
    if (batch_size < 1) return Fail("batch_size must be at least 1, not " + std::to_string(batch_size), err, err_len);
    if (outputs < 1 || outputs > (1 << 20))
      return Fail("outputs must be at least 1, not " + std::to_string(outputs), err, err_len);
    if (n_headers < 0 || (n_headers > 0 && (!header_coders || !headers)))
      return Fail("dali_mesh_epoch_fetches: headers not given", err, err_len);
    if (n_stores < 0 || (!latency_s) != (!bytes_per_s) || (n_stores > 0 && !latency_s))
      return Fail("dali_mesh_epoch_fetches: give latency_s and bytes_per_s for every store, or neither", err, err_len);
    const int64_t batches = n == 0 ? 0 : (n - 1) / batch_size + 1;
    if (!out || out_len < 4 * batches)
      return Fail("dali_mesh_epoch_fetches: room for " + std::to_string(4 * batches) + " values needed", err, err_len);
    dali_mesh::EpochOptions options;
    options.outputs = static_cast<int>(outputs);
    options.task_bytes = task_bytes;
    for (int64_t k = 0; k < n_headers; k++)
      options.headers[header_coders[k]] = std::string(headers + 16 * k, 16);
    for (int64_t s = 0; s < n_stores && latency_s; s++) {
      if (!(latency_s[s] >= 0) || !(bytes_per_s[s] >= 0))
        return Fail("latency_s and bytes_per_s must be >= 0, not " + std::to_string(latency_s[s]) + " and " +
                    std::to_string(bytes_per_s[s]) + " (store " + std::to_string(s) + ")", err, err_len);
      options.costs.push_back(dali_mesh::RoundTrip{latency_s[s], bytes_per_s[s]});
    }
    const dali_mesh::PlanSet plans = dali_mesh::LoadPlanSet(plan_path);
    const auto got = dali_mesh::EpochFetches(plans, ids, n, batch_size, options);
    for (size_t b = 0; b < got.size(); b++) {
      out[4 * b] = got[b].requests;
      out[4 * b + 1] = got[b].bytes;
      out[4 * b + 2] = got[b].round_trips;
      out[4 * b + 3] = got[b].parts_chunks;
    }
    return static_cast<int64_t>(got.size());
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}
