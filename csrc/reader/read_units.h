// dali_mesh: reading a plan's units into a window: a raw part's groups of byte ranges (one vector
// read each), a compressed chunk read and decoded once and its parts' units copied out, the byte
// swap, and the announcements (prefetch) of what a batch will read. DALI-free, host only.
#ifndef DALI_MESH_READER_READ_UNITS_H_
#define DALI_MESH_READER_READ_UNITS_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "codecs/codecs.h"
#include "reader/fetch_plan.h"
#include "plan/plan.h"
#include "reader/open_file.h"

namespace dali_mesh {

// Reads units' groups [g0, g1) of `plan` from `file` at `base` into `dst` (the staging buffer: the
// output itself for C-order files) and byte-swaps them if the plan says so. `scratch` is grown to
// the largest gap.
void ReadGroups(const OpenFile &file, const ReadPlan &plan, int64_t base, int64_t g0, int64_t g1,
                char *dst, std::vector<char> *scratch);

// The requests ReadGroups sends for groups [g0, g1) of `plan` (one vector read each, of at most 1024
// buffers, gaps included): each one's first byte (at base 0) and its bytes, in the order sent; the
// same walk (fetch_epoch.h counts an epoch's requests by it).
std::vector<std::pair<int64_t, int64_t>> GroupReads(const ReadPlan &plan, int64_t g0, int64_t g1);

// Host bytes for a chunk's stored bytes or its decode, grown and never shrunk (Resize), and given
// back to the system when freed: from kMapBytes up they are a mapping of their own (mmap), as glibc's
// malloc maps blocks of that size only until a free raises its threshold (to the largest block freed,
// up to 32 MiB); then it serves chunk-sized blocks from the arena of the thread that asks and keeps
// them there when freed. The buffers of batches read ahead, each a chunk's and freed after its decode
// on the background threads, stayed in the process that way: with new[], 8 batches ahead of sharded
// gzip chunks (1.5 MiB stored, 4 MiB decoded; tests/reader/test_read_ahead_memory.py's) grew the peak
// RSS 72-95 MiB more than reading without read-ahead under a read_ahead_bytes of 16 MiB, with mappings
// 11-14 MiB (3 runs each, 2026-12-07).
class HeldBytes {
 public:
  static constexpr int64_t kMapBytes = int64_t(128) << 10;  // glibc's mmap threshold before it adapts
  HeldBytes() = default;
  ~HeldBytes() { Free(); }
  HeldBytes(const HeldBytes &) = delete;
  HeldBytes &operator=(const HeldBytes &) = delete;
  // Room for at least `n` bytes; the bytes held are not kept when it grows.
  void Resize(int64_t n);
  void Free();
  char *data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  char *data_ = nullptr;
  int64_t size_ = 0;
  bool mapped_ = false;
};

// The page a read is placed in (PlaceLike): a chunk's stored bytes take this much more room.
constexpr int64_t kPlacePage = 4096;

// Room for `n` bytes in `buffer` (grown to n + kPlacePage) at an address that equals `offset` modulo
// the page size: where a read of the file bytes at `offset` should land. The kernel copies a read out
// of the page cache with `rep movsb`, which this project's AMD EPYC VMs run 4-7x slower when the
// destination lies 1-31 bytes after the source modulo 4096 (pread of warm Blosc chunks: 1.3-1.7
// against 6-12 GB/s; a std::vector's malloc'd data often starts 16 bytes into a page, so the chunk
// reads took that path); glibc's memmove avoids such short distances, the kernel's copy does not.
char *PlaceLike(HeldBytes *buffer, int64_t n, int64_t offset);

// The batch a read waits for decodes first: while a reader reads a batch itself (one not read ahead:
// an epoch's first, or after the sample order changed), the readers of its batches read ahead fetch
// their chunks but wait to decode them. Their fetches are round trips and go on; their decodes would
// take the cores the waited-for batch decodes on (2 cores, 8 batches ahead: its decodes got a fifth
// of them). Any thread.
class DecodeGate {
 public:
  void Close();  // a read of a batch of its own begins (nests)
  void Open();   // it ends
  // Returns once no read of a batch of its own is in progress, or when the calling thread's reads are
  // cancelled (a batch read ahead then dropped ends without waiting for the read it yielded to).
  void WaitOpen() const;

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  int closed_ = 0;
};

// What the batches one reader reads ahead hold, against ReaderOptions::read_ahead_bytes (the bound):
// their windows, taken by a batch's job before it makes them and given back when the batch is read or let
// go, and each fetch and decode of theirs (a chunk's stored bytes and decode buffers, or a merged
// request's bytes and its chunks' decode buffers), taken before the fetch and given back after the
// decode. Takes wait for room, in the order their batches were started, so that the next batch is
// served first; fetches hold their room through the decode gate's wait (DecodeGate). Nothing waits for
// room while holding some but a batch's windows: room held is being fetched or decoded, and comes back.
// The count never passes the bound, and every take of a batch started comes: BatchReader::ReadAheadBatches
// starts a batch only when the windows of all its batches read ahead, with the most any one take of any
// of them may hold (each batch's reserved take, the size its merged requests are cut to), fit the bound;
// once the fetches in flight are decoded, the first take waiting fits. Before (windows counted when a
// job made them, over the bound; a merged request sized by the room left when its batch started, 15 of
// 16 MiB for the first), a request that no longer fit blocked every later batch until it was wanted,
// and the count reached 19.9-25.7 MiB at bounds of 14-20 MiB (2026-12-08).
// The batch a read waits for (Want) is the batch being read: what it holds is counted no more, and its
// takes are given at once, as a read of its own would. Kept counted, its fetch in flight left
// no room for the next batch's: 8 batches ahead in 16 MiB (40 batches of two 4 MiB gzip chunks, 2
// threads, 20 ms a request) read an epoch in 1.63-1.69 s against 1.61 s without read-ahead; counted
// no more, in 0.98-1.04 s against 1.35 s (3 runs each, 2026-12-07). Any thread.
class AheadBudget : public std::enable_shared_from_this<AheadBudget> {
 public:
  explicit AheadBudget(int64_t bytes) : bound_(bytes) {}

  // Bytes of a batch held against the budget, given back when it goes (or is reset).
  class Held {
   public:
    Held() = default;
    Held(std::shared_ptr<AheadBudget> budget, int64_t batch, int64_t bytes, int64_t counted)
        : budget_(std::move(budget)), batch_(batch), bytes_(bytes), counted_(counted) {}
    Held(Held &&o) noexcept
        : budget_(std::move(o.budget_)), batch_(o.batch_), bytes_(o.bytes_), counted_(o.counted_) {
      o.bytes_ = 0;
    }
    Held &operator=(Held &&o) noexcept;
    ~Held() { Reset(); }
    void Reset();

   private:
    std::shared_ptr<AheadBudget> budget_;
    int64_t batch_ = 0, bytes_ = 0;
    int64_t counted_ = 0;  // the batch's count these bytes are in (Count), 0: none (its batch was wanted)
  };

  // `bytes` for the batch started `batch`-th (its windows, or a fetch and decode): returns once they fit
  // beside what is held and no batch started before it waits, or at once when that batch is wanted or
  // `bytes` is 0 (a missing chunk filled into its window). Throws when the calling thread's reads are
  // cancelled meanwhile (a batch dropped: it never fetches), and for more bytes than the bound.
  Held Take(int64_t bytes, int64_t batch);
  // The batch started `batch`-th is the one a read waits for.
  void Want(int64_t batch);
  int64_t bound() const { return bound_; }
  // What was counted, for tests and reports: now, at most since the budget was made, the takes that
  // waited for room and the longest wait (microseconds)
  struct Stats {
    int64_t held = 0, peak = 0, waits = 0, longest_wait_us = 0;
  };
  Stats stats() const;

 private:
  int64_t Count(int64_t batch, int64_t bytes);  // mutex_ held; the count's id (Held's), 0: not counted
  void Give(int64_t batch, int64_t bytes, int64_t counted);

  const int64_t bound_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  int64_t held_ = 0, peak_ = 0, waits_ = 0, longest_wait_us_ = 0;
  int64_t wanted_ = -1;
  // per batch, the bytes of held_ it holds (none of the wanted one), and the id of that count: a batch
  // wanted and then read ahead again (its read taken back) counts afresh, and its bytes held from
  // before are not given back from the new count
  struct Counted {
    int64_t bytes = 0, id = 0;
  };
  std::map<int64_t, Counted> counted_;
  int64_t next_id_ = 1;
  std::multiset<int64_t> waiting_;  // the batches whose takes wait for room
};

// Reads chunk `c` of `set` (its file opened and checked by `check_plan` as a part's file is) and
// decodes it into `decoded` (its coder's chunk_bytes); a missing chunk is filled with the coder's
// fill value once its file is seen to be still missing. `stored` is grown to the stored size and
// kPlacePage (the stored bytes are read to PlaceLike's address).
// Errors name the file, the chunk's bytes and the reason (a corrupt stream, a size or checksum
// that does not match).
// With `ranges` (sorted, disjoint byte ranges of the decoded chunk: what its parts copy out), only
// those must be decoded (DecodeChunkRanges: a Blosc chunk decodes only the blocks they touch).
// `guesses`: where chunks read in parts before lay out (fetch_plan.h PartsGuesses), used when the
// store guesses (StoredObject::GuessParts) and updated; what is fetched is FetchChunk's choice.
// `yield`: waited on (WaitOpen) between the chunk's fetch and its decode (a batch read ahead).
// `scratch`: grown to DecodeScratchBytes for the decode's buffers (a batch read ahead's, counted by its
// budget: ChunkFetch); without it, the decoder's buffers of the calling thread.
void ReadChunk(const PlanSet &set, int64_t c, const ReadPlan &check_plan, const std::string &first_path,
               HeldBytes *stored, char *decoded,
               const std::vector<std::pair<int64_t, int64_t>> *ranges = nullptr, PartsGuesses *guesses = nullptr,
               const DecodeGate *yield = nullptr, HeldBytes *scratch = nullptr);

// Reads bytes [lo, hi) of plan file `file` of `set` into `dst` in one request: the chunks of a run
// (fetch_plan.h ChunkRuns) fetched together. The file is opened and checked by each of `check_plans`
// (the plans whose chunks lie there, `first_paths` naming each plan's first file, as ReadChunk opens
// it for each chunk) and seen unchanged after the read. Returns the file as messages show it. Errors
// name the file and the bytes (past its end: truncated or changed since the plan was made).
std::string ReadStoredRun(const PlanSet &set, int64_t file, int64_t lo, int64_t hi,
                          const std::vector<int64_t> &check_plans, const std::vector<std::string> &first_paths,
                          char *dst);

// Decodes chunk `c` of `set` from its stored bytes at `src` (read by ReadStoredRun from the file
// messages show as `name`) into `decoded`, as ReadChunk does after its read (with `ranges`, only
// those bytes must be decoded; `scratch` as ReadChunk's).
void DecodeStored(const PlanSet &set, int64_t c, const std::string &name, const char *src, char *decoded,
                  const std::vector<std::pair<int64_t, int64_t>> *ranges, HeldBytes *scratch = nullptr);

// Adds to `ranges` the bytes of a decoded chunk that the units of the coded plan `plan` at `base`
// copy (one range per unit: its first run to its last run's end).
void AddUnitRanges(const ReadPlan &plan, int64_t base, std::vector<std::pair<int64_t, int64_t>> *ranges);


// Copies the units of the coded plan `plan` from the decoded chunk at `src` (the part's base
// added) into `dst` and byte-swaps them if the plan says so.
void CopyUnits(const ReadPlan &plan, const char *src, char *dst);

// Whether the coded plan `plan`, at `base` in a decoded chunk of `chunk_bytes`, takes the whole
// chunk as one unit: the chunk may then be decoded straight into the window (no scratch, no copy).
bool TakesWholeChunk(const ReadPlan &plan, int64_t base, int64_t chunk_bytes);

// Byte-swaps the units of `plan` in `dst` (its window) if the plan says so.
void SwapPlanUnits(const ReadPlan &plan, char *dst);

// Announces `nbytes` at `offset` of `file` to its store, as PrefetchPath.
void PrefetchRange(const PlanFile &file, int64_t offset, int64_t nbytes);

// Announces every group of `plan` at `base` of `file` to its store (the POSIX store: the kernel
// starts reading them, POSIX_FADV_WILLNEED): cold, the ranges of all files of a batch are then in
// flight at once. Errors are left to the read, which reports them.
void PrefetchPath(const PlanFile &file, const ReadPlan &plan, int64_t base);

}  // namespace dali_mesh

#endif  // DALI_MESH_READER_READ_UNITS_H_
