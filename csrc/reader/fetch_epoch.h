// dali_mesh: what an epoch of the batch reader fetches, counted without reading: the requests, body
// bytes and round trips of each batch of a list of sample ids, for `dali-mesh plan` and every cost
// estimate (csrc/c_api/fetch_api.cc dali_mesh_epoch_fetches, dali_mesh/_kernels/fetch_api.py). Each
// decision is the reader's own code: the raw tasks (tasks.h SplitLargeGroups, SplitGroups) and their
// vector reads (read_units.h GroupReads), a chunk's ranges (AddUnitRanges, MergeRanges), the chunks
// fetched together (fetch_plan.h BatchChunkRuns), and a chunk's fetch (fetch_plan.h FetchChunk, with the
// array's guesses as the reader keeps them) run on a stand-in for the chunk's bytes. DALI-free, host only.
//
// What is not known without the data, and how it is taken:
//  - a Blosc chunk read in parts: where its blocks lie. The stand-in holds the header of one chunk of
//    its coder (`headers`, 16 bytes, read by the caller), its own sizes, and a block index that places
//    every block as if the blocks compressed alike (one stream each); FetchChunk reads it as the chunk.
//    Its counts are marked estimated (parts_chunks). A coder without a header: its chunks read whole.
//  - objects are opened at the version the plan holds (an ETag: S3, GCS), which costs no request; a
//    plan's check of a file (a header, a metadata object without tag) costs the read OpenFile makes.
//  - every request of a batch is sent at once (enough threads): a batch takes as many round trips as its
//    longest chain of requests sent in turn (a raw task's check and vector reads, a chunk's fetch).
#ifndef DALI_MESH_READER_FETCH_EPOCH_H_
#define DALI_MESH_READER_FETCH_EPOCH_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "storage/byte_store.h"

namespace dali_mesh {

// What one batch fetches.
struct BatchFetches {
  int64_t requests = 0;     // GET requests (a chunk found still missing: one, no body)
  int64_t bytes = 0;        // body bytes
  int64_t round_trips = 0;  // its longest chain of requests sent in turn
  int64_t parts_chunks = 0; // chunks read in parts (their blocks placed by the stand-in: estimated)
};

struct EpochOptions {
  int outputs = 1;                        // windows per sample id (ReaderOptions::outputs)
  int64_t task_bytes = int64_t(4) << 20;  // ReaderOptions::task_bytes
  // per coder index: the first 16 bytes of one of its chunks (a Blosc header), for chunks read in parts
  std::map<int64_t, std::string> headers;
  // per store of the plan set (PlanSet::stores): what a request costs; empty: each store's own measure
  // (ByteStore::Cost, as the reader weighs it now)
  std::vector<RoundTrip> costs;
};

// The batches of `ids` (n of them, in that order, `batch_size` each, the last one shorter) read from
// `plans` as BatchReader::Read reads them, one after another, the guesses of chunks read in parts kept
// across batches. Fails (std::runtime_error) for an id out of range, naming it.
std::vector<BatchFetches> EpochFetches(const PlanSet &plans, const int64_t *ids, int64_t n, int64_t batch_size,
                                       const EpochOptions &options);

}  // namespace dali_mesh

#endif  // DALI_MESH_READER_FETCH_EPOCH_H_
