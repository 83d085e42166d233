// dali_mesh: the batch reader: the windows of a batch of sample ids, read by a plan set into host
// memory on the threads of a "run these tasks" callback. DALI-free: the read_windows operator
// (csrc/operators/read_windows/) parses its arguments into ReaderOptions and runs the tasks on DALI's
// thread pool; the C API (csrc/c_api/reader_api.cc) runs them on threads of its own, so that the
// tests drive the reader without DALI.
//
// A batch is read in three phases:
//   1. every range of the batch is announced to its store (prefetch), so that cold reads of all
//      files run at once;
//   2. tasks: the byte ranges of raw parts in tasks of about `task_bytes` (large groups are split
//      when the plans are loaded, so one large window uses every thread), each opening, checking
//      and closing its file (at most one open object per thread, whatever the batch size or the
//      number of files per sample); and each compressed chunk the batch needs read and decoded
//      once (only the bytes its parts copy out: a Blosc chunk's blocks of this rank's band), every
//      part's units copied out of it; every file's version must agree across the batch's tasks
//      (FileVersions); chunks read whole that lie next to each other in one object-store file (an
//      HDF5 file's chunks, a reference set's ranges of one file) are fetched by one request per run
//      of neighbours (fetch_plan.h ChunkRuns), then decoded in parallel from their slices (a batch read
//      ahead decodes each request's chunks as it comes, holding what it fetched against
//      read_ahead_bytes: AheadBudget);
//   3. per window: the Fortran transpose, the boundary program (unless the device fills it) and
//      the per-channel normalisation.
// With `outputs` K > 1 (a forecast's input and target) the plan set's items are K runs of one item
// per sample id, output k's first; the K windows of a batch are read as one batch of K * n, so a
// compressed chunk that several outputs need (a time chunk holding input and target steps, the
// target of one sample that is the input of another) is read and decoded once.
#ifndef DALI_MESH_READER_BATCH_READER_H_
#define DALI_MESH_READER_BATCH_READER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "plan/plan.h"
#include "reader/open_file.h"
#include "reader/read_units.h"
#include "reader/tasks.h"

namespace dali_mesh {

// The threads one reader's batches read ahead hold at once, their jobs and the jobs' helpers together
// (the background lane of KeptThreads::Readers is shared by every reader of the process): a helper
// starts only below this; a job always runs (at most kMaxAheadBatches + 1 live, and dropped ones
// ending), so a few more may be held.
constexpr int kAheadThreadsPerReader = 16;
// The most batches one reader reads ahead (ReaderOptions::read_ahead_batches): each holds a job's
// thread while it reads, so that many readers of one process stay within the background lane.
constexpr int kMaxAheadBatches = 8;

// Batches read from what was read ahead, batches read ahead then dropped unused, and batches whose
// read ahead failed (read again when wanted), by every batch reader of this library in this process
// (BatchReader::ReadAhead).
void ReadAheadCounts(int64_t *used, int64_t *dropped, int64_t *failed);
// Batches read ahead whose buffers exist now, in this process (each freed when its batch was read,
// dropped or taken back, and its job has ended): for tests of leaks.
int64_t AheadAlive();

// The fewest bytes a read task is given (ReaderOptions::task_bytes below it is raised to it).
constexpr int64_t kMinTaskBytes = 4096;

// What the read_windows operator's arguments say, as plain values.
struct ReaderOptions {
  int dtype = -1;          // the output type, a DType (DALI's type numbers)
  std::string dtype_name;  // as messages name it ("": DTypeName(dtype))
  int outputs = 1;         // windows per sample id
  int64_t task_bytes = int64_t(4) << 20;  // bytes read per task (at least kMinTaskBytes)
  bool prefetch = true;    // announce every range of a batch to its store first
  // per-channel normalisation of float32 windows (x - mean[c]) / stddev[c], c the index on
  // channel_axis; empty: none
  std::vector<float> mean, stddev;
  int channel_axis = -1;
  // reading the next batch while this one is used (ReadAhead): kReadAheadOff, kReadAheadRemote (when
  // the plan set reads an object store: there a batch's reads wait on round trips) or kReadAheadAlways
  int read_ahead = 1;
  // batches read ahead at most (1..kMaxAheadBatches), the batches after the one being read: at 50 ms
  // a round trip, two batches ahead hide what one does not
  int read_ahead_batches = 1;
  // what the batches read ahead (those after the one being read) hold together, at most: their
  // windows, and the chunks they fetched and the buffers they decode them in (AheadBudget in
  // read_units.h). A batch is read ahead only when its windows, with those of the batches read ahead
  // before it, leave room for the largest single fetch and decode of any of them (fewer batches are
  // read ahead, none when one does not fit); its fetches then wait for room, the next batch's first.
  // The batch being read is not counted: when it was read ahead and the read waits for it, its
  // fetches take their room at once, as a read of its own would
  int64_t read_ahead_bytes = int64_t(1) << 30;
};
constexpr int kReadAheadOff = 0, kReadAheadRemote = 1, kReadAheadAlways = 2;

class BatchReader {
 public:
  // Checks `plans` against `options` (items per output, item sizes, numbers of axes, the
  // normalisation's channels), naming the plan file, and splits every raw plan's groups larger than
  // a task so that several threads read them.
  BatchReader(PlanSet plans, ReaderOptions options);

  const PlanSet &plans() const { return plans_; }
  const ReaderOptions &options() const { return options_; }
  int64_t num_ids() const { return num_ids_; }  // the sample ids the plan set has items for
  int ndim(int output) const { return ndim_[output]; }  // the number of axes of an output's windows

  // The batch of sample ids ids[0..n): window j = k * n + i is output k's window of ids[i].
  // Fails for an id out of range.
  void SetBatch(const int64_t *ids, int n);
  int64_t num_windows() const { return static_cast<int64_t>(items_.size()); }
  // The finishing plan of window j of the batch (its shape and bytes), and that plan's index.
  int64_t window_plan_index(int64_t j) const { return items_[j].finish; }
  const ReadPlan &window_plan(int64_t j) const { return plans_.plans[items_[j].finish]; }

  // Leaves the boundary cells of the plans with on[plan] to the device (Read does not fill them).
  void FillOnDevice(std::vector<uint8_t> on) { device_fill_ = std::move(on); }
  bool FillsOnDevice(int64_t plan) const { return !device_fill_.empty() && device_fill_[plan]; }

  // Reads every window j of the batch into out[j] (host memory of window_plan(j).bytes()), the
  // tasks run by `run`. A batch of these ids read ahead is waited for and copied instead, when its
  // job has started; one still queued (every background thread busy, e.g. with other pipelines'
  // batches stuck on a dead server) is taken back and read now, so a read never waits behind work
  // that is not its own. A batch whose read ahead failed while this read waited for it fails with
  // that error (its retries were this batch's: a second read would wait as long again); one whose
  // read ahead failed before it was wanted, or while reads were cancelled (CancelReads), is read now.
  void Read(const std::vector<char *> &out, const RunTasks &run);

  // Starts reading the batch ids[0..n) on threads of its own (`threads` of them, at most
  // kAheadThreadsPerReader for all its batches read ahead) into buffers of its own, when this reader
  // reads ahead (ReaderOptions::read_ahead) and the batch's windows, with those of the batches read
  // ahead other than the one set now (SetBatch; it is wanted from now, as its Read comes next), leave
  // room in read_ahead_bytes for the largest take any of them reserved (its fetch and decode, or a merged
  // request and its decodes), and for the largest fetch and decode of this one. It reserves, for each of
  // its takes, the most its merged requests would take, at most what the windows leave (each take then
  // waits for room: AheadBudget): a batch the sample order gives
  // later, announced while this one is read, so that its round trips overlap this batch's. At most
  // read_ahead_batches + 1 batches are read ahead (the one being read among them); the oldest is
  // dropped (its reads cancelled) when a later one would be one more, and those before a batch read
  // are dropped when it is read, without waiting for their reads. Ids out of range are left to that
  // batch's Read to refuse. Only a hint: the data, the checks and the errors are those of a Read of
  // that batch. Returns whether the batch is being read ahead.
  bool ReadAhead(const int64_t *ids, int n, int threads);
  // The batches after the one set now (SetBatch), in the sample order, n ids each (ids[b * n ..]):
  // the batches read ahead that are neither this one nor among them are dropped (the order changed:
  // a new shuffle, a restored checkpoint), then they are read ahead in order (ReadAhead), at most
  // read_ahead_batches of them, up to the first that is not (out of range, or it does not fit
  // read_ahead_bytes): a batch is never read ahead before the one that comes first. Those started together
  // reserve takes as large as the windows of them all leave (at ReadAhead's first of one batch, the
  // first would reserve what the windows of one leave, and the next ones would not fit beside it).
  // Returns how many are being read ahead.
  int ReadAheadBatches(const int64_t *ids, int n, int batches, int threads);
  bool ReadsAhead() const { return reads_ahead_; }
  // Frees the buffers kept from batches read ahead (at an epoch's end: no batch is read ahead across it).
  void ReleaseSpare();
  // Batches read whose windows were read ahead, batches read ahead then dropped unused, and batches
  // whose read ahead failed (read again by Read).
  int64_t ahead_used() const { return ahead_used_; }
  int64_t ahead_dropped() const { return ahead_dropped_; }
  int64_t ahead_failed() const { return ahead_failed_; }
  // What its batches read ahead hold against read_ahead_bytes (AheadBudget::Stats; zeros when it does
  // not read ahead), and how many of them are being read now (their jobs not ended)
  AheadBudget::Stats ahead_budget() const { return budget_ ? budget_->stats() : AheadBudget::Stats(); }
  int64_t ahead_in_flight() const;

  ~BatchReader();
  BatchReader(const BatchReader &) = delete;
  BatchReader &operator=(const BatchReader &) = delete;

 private:
  BatchReader(std::shared_ptr<const PlanSet> plans, ReaderOptions options);
  struct Ahead;
  // What a batch read ahead holds against read_ahead_bytes (AheadBudget): its windows (and the staging
  // of those in Fortran order); the largest of its fetches and decodes of a chunk, each held alone (a
  // chunk's stored bytes and kPlacePage, and its decode buffers: ChunkFetch); and the most a merged
  // request of its chunks would hold with its decodes on its threads (0: none), when room allows
  struct AheadNeed {
    int64_t windows = 0, fetch = 0, merged = 0;
  };
  void Drop(std::shared_ptr<Ahead> ahead);  // cancels its job and lets it go (kept for reuse if it ended)
  void Keep(std::shared_ptr<Ahead> ahead);  // an ended one, for reuse
  // ReadAhead's and ReadAheadBatches' work: the batches of `list` read ahead in order, up to the first
  // that does not fit; how many of the first are on their way
  int ReadAheadList(const std::vector<std::vector<int64_t>> &list, int threads);
  // starts the job; `take`: the most one take of the batch holds (its merged requests are cut to it)
  bool StartAhead(std::vector<int64_t> ids, int threads, AheadNeed need, int64_t take);
  // a batch's, read on `threads` threads (windows -1: an id out of range); fails for sizes past int64
  AheadNeed NeedOf(const std::vector<int64_t> &ids, int threads) const;
  int64_t ChunkFetch(int64_t c, bool into_window) const;  // a chunk's fetch and decode, held alone
  int64_t DecodeHeld(int64_t c, bool into_window) const;  // the buffers a decode of chunk c holds

  struct BatchPart {
    int sample;    // the window (index into items_)
    int64_t part;  // index into plans_.parts
  };
  struct Task {
    int64_t part;  // index into batch_parts_
    int64_t g0, g1;
  };
  void ReadChunkTask(int64_t t);  // read and decode chunk run t of chunk_tasks_, copy its parts out
  void PlanMergedFetches(int64_t n_chunk);  // merged_ and merged_of_ for this batch's chunk runs
  void FetchMerged(int64_t m);              // read merged_[m]'s bytes
  void ReadRawTask(const Task &task);

  std::shared_ptr<const PlanSet> shared_plans_;  // shared with the readers of batches read ahead
  const PlanSet &plans_;
  ReaderOptions options_;
  int64_t num_ids_ = 0;
  std::vector<int> ndim_;                // per output
  std::vector<std::string> first_path_;  // per plan: the first file it reads, named in messages
  std::vector<uint8_t> device_fill_;     // per plan: its boundary cells are filled on the device
  // the batch
  std::vector<PlanItem> items_;
  std::vector<std::vector<char>> staging_;  // Fortran-order windows are read here, transposed to out
  std::vector<char *> dsts_;
  std::vector<BatchPart> batch_parts_;
  std::vector<Task> tasks_;
  FileVersions versions_;  // each file's version, as the batch's first read of it found it
  std::vector<std::pair<int64_t, int64_t>> coded_;  // (chunk, index into batch_parts_), by chunk
  std::vector<int64_t> chunk_tasks_;                 // runs of coded_ with one chunk, and the end
  std::vector<std::vector<std::pair<int64_t, int64_t>>> chunk_ranges_;  // per run: the bytes copied out
  // chunks of one object-store file fetched by one request (ChunkRuns): per request, its file, its
  // bytes [lo, hi) and the chunk runs (indices into chunk_tasks_) decoded from them; per chunk run, its
  // request or -1 (fetched alone). The bytes are freed when the batch is read
  struct MergedFetch {
    int64_t file = 0, lo = 0, hi = 0;
    std::vector<int64_t> tasks;
    std::unique_ptr<char[]> bytes;
    const char *data = nullptr;  // its bytes (a batch read ahead's are FetchMerged's own)
    std::string name;            // the file as messages show it
  };
  std::vector<MergedFetch> merged_;
  std::vector<int64_t> merged_of_;
  // where the chunks read in parts lay out, for the next ones (remote stores): shared with the readers
  // of its batches read ahead, so that a chunk one of them learnt places the others' first round trip
  // (each learning on its own cost every batch in flight at an epoch's start a second round trip)
  std::shared_ptr<PartsGuesses> guesses_ = std::make_shared<PartsGuesses>();
  // closed while this reader reads a batch itself; the readers of its batches read ahead share it and
  // yield (wait on it before each decode)
  std::shared_ptr<DecodeGate> gate_ = std::make_shared<DecodeGate>();
  bool yields_ = false;  // this reader reads a batch ahead (its parent's gate_ and budget_)
  // what its batches read ahead hold (read_ahead_bytes), shared with their readers; a reader of a batch
  // read ahead: that batch's place in the order its batches were started, the most one take of it holds
  // (a request of its merged chunks with their decodes, cut to fit: reserved when it was started), and
  // the threads it reads on
  std::shared_ptr<AheadBudget> budget_;
  int64_t batch_seq_ = 0, run_room_ = 0;
  int threads_ = 1;
  const RunTasks *run_ = nullptr;  // what runs the tasks of the batch being read (FetchMerged's decodes)
  std::vector<int64_t> ids_;  // the batch's sample ids
  bool unread_ = false;       // the batch set has not been read yet (its Read comes next)
  // batches read ahead, oldest first, and those done with (their readers and buffers reused)
  bool reads_ahead_ = false;
  std::deque<std::shared_ptr<Ahead>> ahead_, spare_;
  int64_t started_ = 0;  // batches started ahead (AheadBudget's order)
  // the kept threads its batches read ahead hold now (shared with their jobs, which may outlive it)
  std::shared_ptr<std::atomic<int>> ahead_threads_ = std::make_shared<std::atomic<int>>(0);
  int64_t ahead_used_ = 0, ahead_dropped_ = 0, ahead_failed_ = 0;
};

}  // namespace dali_mesh

#endif  // DALI_MESH_READER_BATCH_READER_H_
