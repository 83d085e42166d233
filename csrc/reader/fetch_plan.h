// dali_mesh: which stored bytes of a chunk are fetched, merged into how many requests, in how many
// round trips: the one place of the reader that decides it, whether a chunk is read in parts among it
// (MayReadInParts). A codec only describes a chunk's layout (codecs.h DescribeBlocks: a Blosc header
// and index -> its blocks and those a decode takes; StreamsWereRead) and decodes; a store only reads the ranges it is given (ReadRanges: an object store's requests in
// flight together) and measures what a request costs (RoundTripMeter). DALI-free, host only.
//
// A request costs a round trip (its latency) plus its bytes over the bandwidth; requests sent
// together cost one round trip. So two wanted ranges are fetched as one when reading the gap between
// them costs less than the wait for a request (PlanRequests), and a chunk read in parts sends its
// header, index and the blocks an earlier chunk's layout places (a guess) in its first round trip:
// one round trip when the guess holds, two when it does not (ReadStored). Across chunks: a batch's
// chunks read whole that lie next to each other in one file are fetched by one request (ChunkRuns),
// the coalescing Icechunk and VirtualiZarr lack (VirtualiZarr measured adjacent ranges merged at 2.8x
// faster than none).
#ifndef DALI_MESH_READER_FETCH_PLAN_H_
#define DALI_MESH_READER_FETCH_PLAN_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "codecs/codecs.h"
#include "storage/byte_store.h"

namespace dali_mesh {

using ByteRanges = std::vector<std::pair<int64_t, int64_t>>;

// Sorts `ranges` (byte ranges) and merges those that overlap or touch.
void MergeRanges(ByteRanges *ranges);

// Whether a chunk of `n` stored bytes by `coder` may be read in parts for `ranges` (a Blosc chunk of
// at least `min_stored` bytes that the ranges cover less than three quarters of): its reads then
// start with its header and block index (ReadStored), and announcing the whole chunk would read it
// all. Below 256 KiB the extra reads of the index cost more than they save.
constexpr int64_t kMinPartsBytes = int64_t(256) << 10;
bool MayReadInParts(const Coder &coder, int64_t n, const ByteRanges &ranges, int64_t min_stored = kMinPartsBytes);

// The stored bytes of each block of `runs` (BlockRuns by the layout's block size) in the chunk of
// `layout` (its index read): from its start to the next start above it (or the chunk's end); a
// memcpyed chunk's bytes follow its header as they are. Blocks past the index are left out. The
// header and index are not included. May overlap: the caller merges.
ByteRanges BlockStoredBytes(const BlockLayout &layout, const ByteRanges &runs);

// A gap under which two ranges are always fetched as one, whatever the store: a local file's reads
// merge such gaps (a second pread costs more than 64 KiB copied from the page cache), and a remote
// store's do too while its bandwidth is not measured yet.
constexpr int64_t kLocalGap = int64_t(64) << 10;

// The largest gap `cost` makes worth reading rather than a request: its latency times its bandwidth
// (the bytes that arrive in the time a request waits), at least kLocalGap.
int64_t MergeGap(const RoundTrip &cost);

// The bytes a request merged by the model may read beyond those wanted: 1/kOverReadDivisor of them.
constexpr int64_t kOverReadDivisor = 16;

// The requests that fetch `wanted` (sorted, disjoint, non-empty byte ranges) at the store cost
// `cost`: sorted, disjoint ranges, each wanted range inside one of them. Neighbours closer than
// kLocalGap are fetched as one (as every plan did before the model); wider gaps under MergeGap(cost)
// too, the narrowest first, while the bytes read beyond `wanted` stay within 1/kOverReadDivisor of them: no
// merge reads a gap that costs more than the request it saves, and the bound on bytes holds
// at any latency (a rank reads at most 0.40x of whole-field Blosc chunks whose band's blocks are
// 0.375x: 1/16 more). Requests sent together cost one round trip whether merged or not: a merge saves
// a request (billed, and a connection's turn), never a round trip, so it is worth few bytes.
// Gaps narrower than kLocalGap are merged outside that bound (at most one such gap per range).
//
//   wanted [0,4M) [4.1M,8M) [8.5M,12M) (gaps 100K and 512K, in KiB and MiB; 11.4M wanted: 730K may be
//   over-read)
//     local file (0 ms)       MergeGap 64K   -> [0,4M) [4.1M,8M) [8.5M,12M)   3 requests
//     2 ms, 100 MB/s          MergeGap 200K  -> [0,8M) [8.5M,12M)             2 requests
//     20 ms, 100 MB/s         MergeGap 2M    -> [0,12M)                       1 request, 612K over
ByteRanges PlanRequests(const ByteRanges &wanted, const RoundTrip &cost);

// Reads bytes [lo, hi) of a stored chunk to at + lo, or throws.
using StoredReader = std::function<void(int64_t lo, int64_t hi)>;
// Reads several such ranges (disjoint, sorted), or throws: a store may read them at once (an object
// store's requests in flight together).
using StoredRangesReader = std::function<void(const ByteRanges &ranges)>;

// The stored bytes of a chunk of `n` stored bytes by `coder` that `guess` (the layout of an earlier
// chunk of the same array, BlockLayout with its index) places the header, the index and the blocks
// of `ranges` in: its block starts scaled by the chunks' sizes, each part widened by a margin of 1/64
// of it (at least 4 KiB), clipped to the chunk. Chunks of one array by one coder have the same block
// size and compress alike, so their blocks start at about the same fractions of the chunk. Empty for
// no guess. A guess only decides what is fetched first: what is decoded is checked against the
// chunk's own header and index. `runs`: BlockRuns of the ranges by the guess's block size (false:
// none, the header and index alone).
ByteRanges GuessedParts(const BlockLayout &guess, int64_t n, bool have_runs, const ByteRanges &runs);

// Reads the stored bytes of a chunk of `n` stored bytes that DecodeChunkRanges (or, without
// `ranges`, DecodeChunk) needs, each at its offset in `at`, through `read`. A chunk that
// MayReadInParts for `ranges` is read in parts: its header and block index, the stored bytes of the
// blocks the ranges touch, then a check that every stream of those blocks lies in what was read
// (StreamsWereRead; else the rest of the chunk is read). Every other chunk is read whole. Returns
// whether it was read in parts (the bytes of `at` outside the parts read are then not the chunk's).
// `min_stored`: MayReadInParts' (tests read small chunks in parts too). `read_many`, when given,
// reads several ranges together (else one `read` after another).
// `guess` (an earlier chunk's layout, GuessedParts): fetched with the header in the first
// `read_many`, so that a right guess takes one round trip and a wrong one two. `learnt`: set to this
// chunk's layout (its index read) when it was read in parts. `trips`: set to the number of reads in
// turn it took (`read_many` counting one). `cost`: what a request to the chunk's store costs
// (PlanRequests; a local file's: nothing).
bool ReadStored(const Coder &coder, int64_t n, const ByteRanges *ranges, char *at, const StoredReader &read,
                int64_t min_stored = kMinPartsBytes, const StoredRangesReader &read_many = nullptr,
                const BlockLayout *guess = nullptr, BlockLayout *learnt = nullptr, int *trips = nullptr,
                const RoundTrip &cost = RoundTrip());

// The last layout a chunk read in parts showed, per array and coder (an array's key stem: its chunk
// key without the trailing chunk coordinates; the coder's index), and whether the guess it was read
// from held (its first round trip brought every byte the decode needed). Any thread.
class PartsGuesses {
 public:
  bool Get(const std::string &stem, int64_t coder, BlockLayout *guess, bool *held) const;
  void Put(const std::string &stem, int64_t coder, BlockLayout guess, bool held);
  // The stem of a chunk key: without its chunk coordinates ("t2m/0.1.2", "t2m/c/0/1/2", "z/500/0.0.0" ->
  // "z/500": an array's numeric name stays). The reader keys the guesses by its file's store and stem.
  static std::string StemOf(const std::string &key);

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int64_t>, std::pair<BlockLayout, bool>> last_;
};

// Reads a chunk's stored bytes for `ranges` into `at` as ReadStored does, from the guess `guesses`
// holds for the array `stem` and coder `coder_index` (none: nullptr), which it updates. When the
// array's last guess did not hold (a Blosc chunk compressed by several threads stores its blocks in
// the order they finished: no earlier chunk places them), a read in parts takes two round trips:
// the chunk is then read whole in one, when the bytes that adds cost less than a round trip at
// `cost` ((stored - parts) / bytes_per_s < latency_s: a fast link; on a slow one, or a local file,
// the parts); and when the guess's blocks spare none of the ranges, whole at once. A chunk read whole
// still shows its layout (another block size than the guess's: the array's next reads go by its own),
// and whether the guess would have held. Returns
// whether it was read in parts; `trips` as ReadStored's.
bool FetchChunk(const Coder &coder, int64_t n, const ByteRanges *ranges, char *at, const StoredReader &read,
                const StoredRangesReader &read_many, PartsGuesses *guesses, const std::string &stem,
                int64_t coder_index, const RoundTrip &cost, int *trips = nullptr);

// ---- chunks of one file fetched together ---------------------------------------------------------

// A chunk of a batch read whole: the plan file it lies in, and its stored bytes' offset and length.
struct StoredSpan {
  int64_t file = 0, offset = 0, nbytes = 0;
};

// The most bytes one request fetched for several chunks holds, from its first byte to its last: a
// batch's merged fetches are held until their chunks are decoded.
constexpr int64_t kMaxMergedRequest = int64_t(64) << 20;

// The chunks of `spans` (a batch's chunks read whole) fetched by one request each: runs of chunks of
// one file whose stored ranges touch, overlap (two keys of one range) or lie across a gap that
// PlanRequests reads at that file's `cost(file)`, each run at most `max_bytes` from its first byte to
// its last (a longer run is cut between chunks). Each run: indices into `spans` by offset (two keys of
// one range by index), two or more; a chunk not in a run is fetched alone, as before. Chunks of 0
// bytes are in none.
//
//   file 0: [0,100) [100,300) [300,350)   file 1: [0,50) [1M,1M+50)   (local gap: 64 KiB)
//     -> {0, 1, 2} of file 0; file 1's chunks alone (a gap of 1 MiB over 100 wanted bytes)
std::vector<std::vector<int64_t>> ChunkRuns(const std::vector<StoredSpan> &spans,
                                            const std::function<RoundTrip(int64_t file)> &cost,
                                            int64_t max_bytes = kMaxMergedRequest);

// The most stored bytes a batch's merged fetches hold at once (each at most kMaxMergedRequest): the
// chunks of runs beyond it are fetched alone (BatchChunkRuns, for the reader and dali-mesh plan alike).
constexpr int64_t kMaxMergedBatchBytes = int64_t(256) << 20;

// The runs of ChunkRuns(spans, cost, max_bytes) that a batch fetches merged, in order: those that fit
// kMaxMergedBatchBytes together with the runs kept before them (BatchReader::PlanMergedFetches).
std::vector<std::vector<int64_t>> BatchChunkRuns(const std::vector<StoredSpan> &spans,
                                                 const std::function<RoundTrip(int64_t file)> &cost,
                                                 int64_t max_bytes = kMaxMergedRequest);

}  // namespace dali_mesh

#endif  // DALI_MESH_READER_FETCH_PLAN_H_
