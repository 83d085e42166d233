// dali_mesh: reading a plan's units into a window: a raw part's groups of byte ranges (one vector
// read each), a compressed chunk read and decoded once and its parts' units copied out, the byte
// swap, and the announcements (prefetch) of what a batch will read. DALI-free, host only.
#ifndef DALI_MESH_READER_READ_UNITS_H_
#define DALI_MESH_READER_READ_UNITS_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>
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

// Room for `n` bytes in `buffer` (grown to n + 4096) at an address that equals `offset` modulo the
// page size: where a read of the file bytes at `offset` should land. The kernel copies a read out
// of the page cache with `rep movsb`, which this project's AMD EPYC VMs run 4-7x slower when the
// destination lies 1-31 bytes after the source modulo 4096 (pread of warm Blosc chunks: 1.3-1.7
// against 6-12 GB/s; a std::vector's malloc'd data often starts 16 bytes into a page, so the chunk
// reads took that path); glibc's memmove avoids such short distances, the kernel's copy does not.
char *PlaceLike(std::vector<char> *buffer, int64_t n, int64_t offset);

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

// Reads chunk `c` of `set` (its file opened and checked by `check_plan` as a part's file is) and
// decodes it into `decoded` (its coder's chunk_bytes); a missing chunk is filled with the coder's
// fill value once its file is seen to be still missing. `stored` is grown to the stored size and a
// page (the stored bytes are read to PlaceLike's address).
// Errors name the file, the chunk's bytes and the reason (a corrupt stream, a size or checksum
// that does not match).
// With `ranges` (sorted, disjoint byte ranges of the decoded chunk: what its parts copy out), only
// those must be decoded (DecodeChunkRanges: a Blosc chunk decodes only the blocks they touch).
// `guesses`: where chunks read in parts before lay out (fetch_plan.h PartsGuesses), used when the
// store guesses (StoredObject::GuessParts) and updated; what is fetched is FetchChunk's choice.
// `yield`: waited on (WaitOpen) between the chunk's fetch and its decode (a batch read ahead).
void ReadChunk(const PlanSet &set, int64_t c, const ReadPlan &check_plan, const std::string &first_path,
               std::vector<char> *stored, char *decoded,
               const std::vector<std::pair<int64_t, int64_t>> *ranges = nullptr, PartsGuesses *guesses = nullptr,
               const DecodeGate *yield = nullptr);

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
// those bytes must be decoded).
void DecodeStored(const PlanSet &set, int64_t c, const std::string &name, const char *src, char *decoded,
                  const std::vector<std::pair<int64_t, int64_t>> *ranges);

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
