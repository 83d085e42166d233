// dali_mesh: the batch reader (see batch_reader.h).
#include "reader/batch_reader.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <condition_variable>
#include <exception>
#include <future>
#include <map>
#include <mutex>
#include <new>
#include <numeric>
#include <stdexcept>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "codecs/codecs.h"
#include "kernels/dm_types.h"
#include "reader/fetch_plan.h"
#include "reader/finish.h"
#include "reader/read_units.h"
#include "reader/tasks.h"
#include "storage/byte_store.h"
#include "storage/kept_threads.h"
#include "storage/reads_in_flight.h"

namespace dali_mesh {

using detail::Fail;

namespace {

// The text of its arguments streamed one after another (as dali::make_string, whose messages the
// operator gave before this reader was its own).
template <typename... Args>
std::string Str(const Args &...args) {
  std::ostringstream s;
  (s << ... << args);
  return s.str();
}

std::atomic<int64_t> g_ahead_used{0}, g_ahead_dropped{0}, g_ahead_failed{0};
std::atomic<int64_t> g_ahead_alive{0};  // batches read ahead whose buffers exist (Ahead objects)

// Rethrows a store's or reader's error (std::runtime_error) of a batch read ahead that failed while
// its Read waited `waited` seconds for it, saying so: its counts of attempts and seconds are all this
// batch's, nothing was read again. Returns for another error (no memory, ...): the batch is read again.
void FailAsRead(const std::exception_ptr &error, double waited) {
  try {
    std::rethrow_exception(error);
  } catch (const std::runtime_error &e) {
    char secs[32];
    std::snprintf(secs, sizeof(secs), "%.1f", waited);
    throw std::runtime_error(std::string(e.what()) + " (met while this batch was read ahead, " + secs +
                             " s after it was wanted; the batch was not read a second time)");
  } catch (...) {
  }
}

}  // namespace

int64_t AheadAlive() { return g_ahead_alive.load(); }

void ReadAheadCounts(int64_t *used, int64_t *dropped, int64_t *failed) {
  *used = g_ahead_used.load();
  *dropped = g_ahead_dropped.load();
  *failed = g_ahead_failed.load();
}

namespace {

// The plan set with every raw plan's groups larger than a task split, so that several threads read
// them (a coded plan's units are copied from a decoded chunk, not read), shared by the reader and
// the readers of its batches read ahead.
std::shared_ptr<const PlanSet> SplitForTasks(PlanSet plans, int64_t task_bytes) {
  for (auto &plan : plans.plans)
    if (!plan.coded) SplitLargeGroups(&plan, std::max(kMinTaskBytes, task_bytes));
  return std::make_shared<const PlanSet>(std::move(plans));
}

}  // namespace

// a batch read ahead: its ids, the reader that reads it (of the same plans, with its own batch
// state), its windows, and the job reading it with its cancel flag and how it ended. The job holds
// it too (a shared_ptr), so a batch dropped while its job runs is let go without waiting for it
struct BatchReader::Ahead {
  std::vector<int64_t> ids;
  std::unique_ptr<BatchReader> reader;
  std::vector<std::vector<char>> windows;
  std::unique_ptr<CancelFlag> cancel;
  JobClaim claim;  // its job, or its Read (or a drop) taking it back before the job started
  std::future<void> done;  // the job on a kept thread (KeptThreads::Readers, background lane)
  std::exception_ptr error;
  std::chrono::steady_clock::time_point ended;  // when the job ended
  bool cancels_meanwhile = false;  // CancelReads was called while the job ran
  bool no_buffers = false;  // no memory for its windows: its error is not its batch's
  AheadNeed need;           // what it holds against read_ahead_bytes
  int64_t take = 0;         // the most one take of it holds (reserved when it was started)
  int64_t seq = 0;          // its place in the order the reader's batches were started (AheadBudget)
  AheadBudget::Held windows_held;  // its windows, from before its job makes them until it is read or let go
  Ahead() { g_ahead_alive++; }
  ~Ahead() { g_ahead_alive--; }
  Ahead(const Ahead &) = delete;
  Ahead &operator=(const Ahead &) = delete;
};

BatchReader::BatchReader(PlanSet plans, ReaderOptions options)
    : BatchReader(SplitForTasks(std::move(plans), options.task_bytes), std::move(options)) {}

BatchReader::BatchReader(std::shared_ptr<const PlanSet> plans, ReaderOptions options)
    : shared_plans_(std::move(plans)), plans_(*shared_plans_), options_(std::move(options)) {
  ReaderOptions &o = options_;
  const std::string &src = plans_.source;
  if (o.dtype_name.empty()) o.dtype_name = DTypeName(o.dtype);
  o.task_bytes = std::max(kMinTaskBytes, o.task_bytes);
  if (o.outputs < 1 || plans_.items.size() % o.outputs != 0)
    Fail(Str(src, ": ", plans_.items.size(), " items are not ", o.outputs,
             " outputs' items per sample id; define the pipeline again"));
  num_ids_ = static_cast<int64_t>(plans_.items.size()) / o.outputs;
  const int64_t size = DTypeSize(o.dtype);
  for (size_t p = 0; p < plans_.plans.size(); p++) {
    if (plans_.plans[p].itemsize != size)
      Fail(Str(src, ": plan ", p, " has items of ", plans_.plans[p].itemsize, " bytes but dtype ", o.dtype_name,
               " has ", size, "; define the pipeline again"));
  }
  // every sample's window (its finishing plan) of an output has the same number of axes: the
  // output's
  ndim_.assign(o.outputs, 0);
  for (int k = 0; k < o.outputs; k++) {
    if (num_ids_ == 0) continue;
    ndim_[k] = plans_.plans[plans_.items[k * num_ids_].finish].ndim;
    for (int64_t id = 0; id < num_ids_; id++)
      if (plans_.plans[plans_.items[k * num_ids_ + id].finish].ndim != ndim_[k])
        Fail(Str(src, ": the samples' windows have different numbers of axes; define the pipeline again"));
  }
  // per-channel normalisation of the finished windows
  if (!o.mean.empty() || !o.stddev.empty()) {
    const std::string where = src + ": ";
    if (o.mean.size() != o.stddev.size())
      Fail(Str(where, "mean has ", o.mean.size(), " values, stddev ", o.stddev.size()));
    if (o.dtype != kFloat32) Fail(Str(where, "normalising needs float32 windows, not ", o.dtype_name));
    for (int nd : ndim_)
      if (o.channel_axis < 0 || o.channel_axis >= nd)
        Fail(Str(where, "channel_axis ", o.channel_axis, " is not an axis of the ", nd, "-dimensional windows"));
    for (size_t k = 0; k < o.stddev.size(); k++)
      if (!std::isfinite(o.mean[k]) || !std::isfinite(o.stddev[k]) || o.stddev[k] == 0)
        Fail(Str(where, "channel ", k, ": mean ", o.mean[k], " and stddev ", o.stddev[k],
                 " must be finite, stddev not 0"));
    for (const auto &it : plans_.items)
      if (plans_.plans[it.finish].shape[o.channel_axis] != static_cast<int64_t>(o.mean.size()))
        Fail(Str(where, "the windows have ", plans_.plans[it.finish].shape[o.channel_axis], " channels on axis ",
                 o.channel_axis, ", mean and stddev ", o.mean.size()));
  }
  // read ahead: always, or when a file is an object store's (a local file's reads are announced to
  // the kernel instead, and the page cache reads ahead)
  const ByteStore *local = StoreOf("file");
  reads_ahead_ = o.read_ahead == kReadAheadAlways;
  for (const auto &f : plans_.files)
    if (o.read_ahead == kReadAheadRemote && f.byte_store != nullptr && f.byte_store != local) reads_ahead_ = true;
  if (reads_ahead_) budget_ = std::make_shared<AheadBudget>(o.read_ahead_bytes);
  // the first file of each plan, named in messages about files that differ from it
  first_path_.assign(plans_.plans.size(), std::string());
  for (const auto &part : plans_.parts)
    if (first_path_[part.plan].empty())
      first_path_[part.plan] = plans_.files[plans_.plans[part.plan].coded ? plans_.chunks[part.file].file
                                                                            : part.file].key;
}

void BatchReader::SetBatch(const int64_t *ids, int n) {
  const int outputs = options_.outputs;
  items_.resize(static_cast<size_t>(outputs) * n);  // output k's window of sample i: items_[k * n + i]
  for (int i = 0; i < n; i++) {
    const int64_t id = ids[i];
    if (id < 0 || id >= num_ids_)
      Fail(Str("sample id ", id, " is out of range for the ", num_ids_, " samples of ", plans_.source));
    for (int k = 0; k < outputs; k++) items_[k * n + i] = plans_.items[k * num_ids_ + id];
  }
  ids_.assign(ids, ids + n);
  unread_ = true;
}

BatchReader::~BatchReader() {
  while (!ahead_.empty()) {
    auto a = std::move(ahead_.front());
    ahead_.pop_front();
    Drop(std::move(a));
  }
}

void BatchReader::Drop(std::shared_ptr<Ahead> ahead) {
  // a job still running is cancelled and let go: it ends on its own (its reads see the flag within
  // about a second; a local read blocked in the kernel when it returns), holding what it uses (its
  // Ahead, whose reader shares the plan set), so nothing here waits on a server or a disk
  ahead->claim.TakeBack();  // not started: it never will
  ahead->cancel->Cancel();
  ahead_dropped_++;
  g_ahead_dropped++;
  if (ahead->done.wait_for(std::chrono::seconds(0)) == std::future_status::ready) Keep(std::move(ahead));
}

void BatchReader::Keep(std::shared_ptr<Ahead> ahead) {
  ahead->windows_held.Reset();  // its buffers are kept for the next batch read ahead, which charges its own
  ahead->done = std::future<void>();
  ahead->error = nullptr;
  ahead->no_buffers = false;
  spare_.push_back(std::move(ahead));
}

void BatchReader::ReleaseSpare() { spare_.clear(); }

int64_t BatchReader::ahead_in_flight() const {
  int64_t n = 0;
  for (const auto &a : ahead_)
    n += a->done.valid() && a->done.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
  return n;
}

namespace {

// a + b and a * b of sizes a batch read ahead holds, or an error naming them: a crafted plan's sizes
// (a chunk's stored bytes up to 2**63 - 1) would pass int64 and take room from the count
[[noreturn]] void PastInt64(const std::string &source, const std::string &sum) {
  Fail(Str(source, ": a batch read ahead would hold ", sum, " bytes, more than int64 counts: the plan file is "
           "corrupt; define the pipeline again"));
}

int64_t Plus(int64_t a, int64_t b, const std::string &source) {
  int64_t sum;
  if (__builtin_add_overflow(a, b, &sum)) PastInt64(source, Str(a, " + ", b));
  return sum;
}

int64_t Times(int64_t a, int64_t k, const std::string &source) {
  int64_t product;
  if (__builtin_mul_overflow(a, k, &product)) PastInt64(source, Str(k, " x ", a));
  return product;
}

}  // namespace

int64_t BatchReader::DecodeHeld(int64_t c, bool into_window) const {
  // the decoded chunk (unless it is its window), and the decoder's scratch (ReadChunkTask's own)
  const PlanChunk &ch = plans_.chunks[c];
  const Coder &coder = plans_.coders[ch.coder];
  return Plus(into_window ? 0 : coder.chunk_bytes, DecodeScratchBytes(coder, ch.nbytes), plans_.source);
}

int64_t BatchReader::ChunkFetch(int64_t c, bool into_window) const {
  const PlanChunk &ch = plans_.chunks[c];
  const int64_t stored = ch.nbytes > 0 ? Plus(ch.nbytes, kPlacePage, plans_.source) : 0;
  return Plus(stored, DecodeHeld(c, into_window), plans_.source);
}

BatchReader::AheadNeed BatchReader::NeedOf(const std::vector<int64_t> &ids, int threads) const {
  AheadNeed need;
  // per chunk the batch reads: how many parts copy from it, and whether the one that does takes it whole
  // (decoded straight into its window: ReadChunkTask)
  std::map<int64_t, std::pair<int64_t, bool>> chunks;
  for (int64_t id : ids) {
    if (id < 0 || id >= num_ids_) return {-1, 0, 0};
    for (int k = 0; k < options_.outputs; k++) {
      const PlanItem &item = plans_.items[k * num_ids_ + id];
      const ReadPlan &window = plans_.plans[item.finish];
      need.windows = Plus(need.windows, Times(window.bytes(), window.fortran && window.volume() > 0 ? 2 : 1,
                                              plans_.source), plans_.source);
      for (int64_t p = item.part_begin; p < item.part_end; p++) {
        const auto &part = plans_.parts[p];
        const ReadPlan &plan = plans_.plans[part.plan];
        if (!plan.coded) continue;
        auto &use = chunks[part.file];
        use.first++;
        use.second = TakesWholeChunk(plan, part.base, plans_.coders[plans_.chunks[part.file].coder].chunk_bytes);
      }
    }
  }
  // the chunks PlanMergedFetches may fetch together (an object store's, read whole or not: a superset
  // of its, so that no run of its is longer), and the decode buffers of each of its lanes
  const ByteStore *local = StoreOf("file");
  std::vector<StoredSpan> spans;
  int64_t lane = 0;
  for (const auto &[c, use] : chunks) {
    need.fetch = std::max(need.fetch, ChunkFetch(c, use.first == 1 && use.second));
    const PlanChunk &ch = plans_.chunks[c];
    const ByteStore *store = plans_.files[ch.file].byte_store;
    if (ch.nbytes <= 0 || store == nullptr || store == local) continue;
    spans.push_back({ch.file, ch.offset, ch.nbytes});
    lane = std::max(lane, DecodeHeld(c, false));
  }
  if (spans.size() < 2) return need;
  for (const auto &run : ChunkRuns(spans, [&](int64_t f) { return plans_.files[f].byte_store->Cost(); })) {
    int64_t lo = spans[run.front()].offset, hi = lo;
    for (int64_t k : run) hi = std::max(hi, spans[k].offset + spans[k].nbytes);
    const int64_t lanes = std::min<int64_t>(static_cast<int64_t>(run.size()), std::max(1, threads));
    need.merged = std::max(need.merged, Plus(hi - lo, Times(lane, lanes, plans_.source), plans_.source));
  }
  return need;
}

bool BatchReader::ReadAhead(const int64_t *ids, int n, int threads) {
  if (!reads_ahead_ || n <= 0) return false;
  return ReadAheadList({std::vector<int64_t>(ids, ids + n)}, threads) == 1;
}

int BatchReader::ReadAheadList(const std::vector<std::vector<int64_t>> &list, int threads) {
  auto on_way = [&](const std::vector<int64_t> &ids) {
    return std::any_of(ahead_.begin(), ahead_.end(), [&](const auto &a) { return a->ids == ids; });
  };
  // the batch set now is read next, wanting it (its Read comes next): what it holds is counted no more,
  // and the batches read ahead hold the rest of the bound
  const Ahead *current = nullptr;
  for (const auto &a : ahead_)
    if (unread_ && a->ids == ids_) {
      current = a.get();
      budget_->Want(a->seq);
    }
  // the windows of the batches read ahead, and the largest take any of them reserved: every take of
  // each fits beside the windows of all (AheadBudget)
  const int64_t bound = options_.read_ahead_bytes;
  int64_t windows = 0, take = 0;
  for (const auto &a : ahead_) {
    if (a.get() == current) continue;
    windows = Plus(windows, a->need.windows, plans_.source);
    take = std::max(take, a->take);
  }
  std::vector<std::pair<std::vector<int64_t>, AheadNeed>> starts;  // those that fit, in order
  for (const auto &ids : list) {
    if (on_way(ids)) continue;
    if (std::any_of(starts.begin(), starts.end(), [&](const auto &s) { return s.first == ids; })) continue;
    const AheadNeed need = NeedOf(ids, threads);
    if (need.windows < 0) break;  // that batch's Read refuses it
    const int64_t w = Plus(windows, need.windows, plans_.source);
    if (w > bound || std::max(take, need.fetch) > bound - w) break;
    windows = w;
    take = std::max(take, need.fetch);
    starts.emplace_back(ids, need);
  }
  // each reserves a take as large as its merged requests would hold, at most what the windows of all
  // leave: those started together get the same room, whichever comes first
  for (auto &[ids, need] : starts) {
    // the oldest is not wanted any more: the batches read came after it
    while (static_cast<int>(ahead_.size()) > options_.read_ahead_batches) {
      auto oldest = std::find_if(ahead_.begin(), ahead_.end(), [&](const auto &a) { return a.get() != current; });
      auto a = std::move(*oldest);
      ahead_.erase(oldest);
      Drop(std::move(a));
    }
    bool started = false;
    try {
      started = StartAhead(std::move(ids), threads, need, std::max(need.fetch, std::min(need.merged, bound - windows)));
    } catch (const std::bad_alloc &) {  // no memory for its buffers: the batch is read when it is wanted
    }
    if (!started) break;
  }
  int n = 0;
  while (n < static_cast<int>(list.size()) && on_way(list[n])) n++;
  return n;
}

int BatchReader::ReadAheadBatches(const int64_t *ids, int n, int batches, int threads) {
  if (!reads_ahead_) return 0;
  batches = std::min(batches, options_.read_ahead_batches);
  for (size_t k = 0; k < ahead_.size();) {
    bool wanted = ahead_[k]->ids == ids_;
    for (int b = 0; b < batches && !wanted; b++)
      wanted = std::equal(ahead_[k]->ids.begin(), ahead_[k]->ids.end(), ids + int64_t(b) * n, ids + int64_t(b + 1) * n);
    if (wanted) {
      k++;
      continue;
    }
    auto stale = std::move(ahead_[k]);
    ahead_.erase(ahead_.begin() + k);
    Drop(std::move(stale));
  }
  std::vector<std::vector<int64_t>> list;
  for (int b = 0; b < batches; b++) list.emplace_back(ids + int64_t(b) * n, ids + int64_t(b + 1) * n);
  return n > 0 ? ReadAheadList(list, threads) : 0;
}

bool BatchReader::StartAhead(std::vector<int64_t> ids, int threads, AheadNeed need, int64_t take) {
  std::shared_ptr<Ahead> a;
  if (!spare_.empty()) {
    a = std::move(spare_.front());
    spare_.pop_front();
  } else {
    a = std::make_shared<Ahead>();
    ReaderOptions o = options_;
    o.read_ahead = kReadAheadOff;
    a->reader.reset(new BatchReader(shared_plans_, std::move(o)));
  }
  a->reader->device_fill_ = device_fill_;
  a->reader->guesses_ = guesses_;
  a->reader->gate_ = gate_;
  a->reader->yields_ = true;
  a->reader->budget_ = budget_;
  a->reader->batch_seq_ = a->seq = started_++;
  a->reader->run_room_ = a->take = take;
  a->reader->threads_ = std::max(1, threads);
  a->reader->SetBatch(ids.data(), static_cast<int>(ids.size()));
  a->ids = std::move(ids);
  a->need = need;
  a->cancel = std::make_unique<CancelFlag>();
  a->claim.Reset();
  try {
    a->done = KeptThreads::Readers().Submit(
        [job = a, threads, held = ahead_threads_]() mutable {
          // the task (held by job->done's shared state) holds this lambda, which holds the Ahead: the
          // Ahead is let go when the job ends, however it ends, or the two would keep each other (a
          // batch taken back or dropped while it ran would never be freed)
          struct LetGo {
            std::shared_ptr<Ahead> &ahead;
            ~LetGo() { ahead.reset(); }
          } let_go{job};
          if (!job->claim.Start()) return;  // its Read took it back
          held->fetch_add(1);
          const uint64_t cancels = CancelCount();
          {
            CancelScope scope(job->cancel.get());
            try {
              // its buffers made here, not by the read that starts it: 8 batches' windows zeroed there
              // (34 MB for 4 MB windows, ~10 ms) delayed the batch that read waits for
              std::vector<char *> out;
              try {
                // taken in the order the batches started, as their fetches: counted when it fits (ReadAheadList
                // kept room for them all beside the largest take), not over the fetches in flight
                job->windows_held = job->reader->budget_->Take(job->need.windows, job->seq);
                job->windows.resize(job->reader->num_windows());
                for (int64_t j = 0; j < job->reader->num_windows(); j++) {
                  job->windows[j].resize(job->reader->window_plan(j).bytes());
                  out.push_back(job->windows[j].data());
                }
              } catch (const std::bad_alloc &) {  // the batch is read when it is wanted, as if never started
                job->no_buffers = true;
                throw;
              }
              job->reader->Read(out,
                                RunOn(threads, KeptThreads::Lane::kBackground, held, kAheadThreadsPerReader));
            } catch (...) {
              job->error = std::current_exception();
            }
          }
          job->cancels_meanwhile = CancelCount() != cancels;
          job->ended = std::chrono::steady_clock::now();
          held->fetch_sub(1);
        },
        KeptThreads::Lane::kBackground);
  } catch (const std::system_error &) {  // no thread to be had: the batch is read when it is wanted
    Keep(std::move(a));
    return false;
  }
  ahead_.push_back(std::move(a));
  return true;
}

void BatchReader::Read(const std::vector<char *> &out, const RunTasks &run) {
  const int n = static_cast<int>(items_.size());
  const auto wanted = std::chrono::steady_clock::now();
  unread_ = false;
  // this batch read ahead: wait for it and copy its windows (the batches read ahead before it were
  // not wanted: dropped)
  for (size_t k = 0; k < ahead_.size(); k++) {
    if (ahead_[k]->ids != ids_) continue;
    for (size_t d = 0; d < k; d++) {
      auto stale = std::move(ahead_.front());
      ahead_.pop_front();
      Drop(std::move(stale));
    }
    auto a = std::move(ahead_.front());
    ahead_.pop_front();
    budget_->Want(a->seq);  // the batch being read: its fetches wait no more for room
    // its job not started while the background threads are all busy (maybe with other pipelines'
    // batches stuck on a dead server): it is taken back and the batch read here, now, rather than
    // wait behind work that is not this batch's; the job finds it taken and ends (it holds the Ahead:
    // not kept for reuse). A job queued while a thread is free is about to start: it is waited for
    bool taken = false;
    while (a->claim.queued() && a->done.wait_for(std::chrono::milliseconds(2)) != std::future_status::ready) {
      if (KeptThreads::Readers().Backlogged(KeptThreads::Lane::kBackground) && a->claim.TakeBack()) {
        taken = true;
        break;
      }
    }
    if (taken) break;
    a->done.get();
    const bool failed = a->error != nullptr;
    if (!failed) {
      run([&](int64_t j) { std::memcpy(out[j], a->windows[j].data(), a->windows[j].size()); }, n,
          [&](int64_t j) -> int64_t { return static_cast<int64_t>(a->windows[j].size()); });
      ahead_used_++;
      g_ahead_used++;
    } else {
      ahead_failed_++;
      g_ahead_failed++;
    }
    const std::exception_ptr error = a->error;
    // failed while this read waited for it, and not for a cancel of the process's reads: its store
    // retries were this batch's (read again, it would wait as long again), so its error is this read's
    const bool own = failed && a->ended > wanted && !a->cancels_meanwhile && !a->no_buffers;
    const double waited = std::chrono::duration<double>(a->ended - wanted).count();
    Keep(std::move(a));
    if (!failed) return;
    if (own) FailAsRead(error, waited);
    // it failed before the batch was wanted: the batch is read now, and fails (or not) as it does now
    // (a transient fault, or a cancel meant for another pipeline, is not replayed)
    break;
  }
  run_ = &run;
  // read here: the batches read ahead fetch meanwhile, and decode once it is read
  struct GateClosed {
    DecodeGate *gate;
    explicit GateClosed(DecodeGate *g) : gate(g) {
      if (gate) gate->Close();
    }
    ~GateClosed() {
      if (gate) gate->Open();
    }
  } closed(reads_ahead_ && !ahead_.empty() ? gate_.get() : nullptr);
  // the parts of this batch: (window, part index in plans_.parts)
  batch_parts_.clear();
  for (int i = 0; i < n; i++)
    for (int64_t k = items_[i].part_begin; k < items_[i].part_end; k++) batch_parts_.push_back({i, k});
  const int64_t np = batch_parts_.size();
  staging_.resize(n);
  dsts_.resize(n);
  for (int i = 0; i < n; i++) {
    const auto &plan = plans_.plans[items_[i].finish];
    dsts_[i] = out[i];
    if (plan.fortran && plan.volume() > 0) {  // read the file order, transposed in step 3
      staging_[i].resize(plan.bytes());
      dsts_[i] = staging_[i].data();
    }
  }
  // the byte ranges, in tasks of about task_bytes (large groups were split at load, so one large
  // sample uses every thread); a part that reads nothing (a Zarr array's metadata file) is one
  // task that only opens and checks its file
  // compressed chunks: each chunk the batch needs is read and decoded once (one task), however
  // many parts (forecast steps, halo boxes, samples) copy from it: coded_ holds (chunk, batch
  // part) sorted by chunk, chunk_tasks_ the runs of one chunk
  tasks_.clear();
  coded_.clear();
  versions_.Reset(plans_.files.size());
  for (int64_t j = 0; j < np; j++) {
    const auto &part = plans_.parts[batch_parts_[j].part];
    if (plans_.plans[part.plan].coded) {
      coded_.push_back({part.file, j});
      continue;
    }
    const auto split = SplitGroups(plans_.plans[part.plan], options_.task_bytes);
    if (split.empty()) tasks_.push_back({j, 0, 0});
    for (auto &g : split) tasks_.push_back({j, g.first, g.second});
  }
  std::sort(coded_.begin(), coded_.end());
  chunk_tasks_.clear();
  for (size_t k = 0; k < coded_.size(); k++)
    if (k == 0 || coded_[k].first != coded_[k - 1].first) chunk_tasks_.push_back(k);
  const int64_t n_raw = tasks_.size(), n_chunk = chunk_tasks_.size();
  chunk_tasks_.push_back(coded_.size());
  // per chunk: the bytes of its decoded chunk that its parts copy out (only those are decoded; a
  // Blosc chunk is read in parts when they are few)
  chunk_ranges_.resize(n_chunk);
  for (int64_t t = 0; t < n_chunk; t++) {
    auto &ranges = chunk_ranges_[t];
    ranges.clear();
    for (int64_t k = chunk_tasks_[t]; k < chunk_tasks_[t + 1]; k++) {
      const auto &part = plans_.parts[batch_parts_[coded_[k].second].part];
      AddUnitRanges(plans_.plans[part.plan], part.base, &ranges);
    }
    MergeRanges(&ranges);
  }
  PlanMergedFetches(n_chunk);
  struct FreeMerged {  // the merged fetches' bytes are freed when the batch is read, or fails
    std::vector<MergedFetch> &merged;
    ~FreeMerged() { merged.clear(); }
  } free_merged{merged_};
  auto no_cost = [](int64_t) -> int64_t { return 0; };
  // 1: announce every range of the batch, so that cold reads of all files run at once
  if (options_.prefetch) {
    run([&](int64_t t) {
          if (t < np) {
            const auto &part = plans_.parts[batch_parts_[t].part];
            if (!plans_.plans[part.plan].coded)
              PrefetchPath(plans_.files[part.file], plans_.plans[part.plan], part.base);
            return;
          }
          const auto &ch = plans_.chunks[coded_[chunk_tasks_[t - np]].first];
          // a chunk read in parts: its header and block index (the kernel would read all it is told)
          const bool parts = MayReadInParts(plans_.coders[ch.coder], ch.nbytes, chunk_ranges_[t - np]);
          PrefetchRange(plans_.files[ch.file], ch.offset, parts ? std::min<int64_t>(ch.nbytes, 64 << 10) : ch.nbytes);
        },
        np + n_chunk, no_cost);
  }
  // 2: per task: open and check the file (still what was planned for), read, close; or read and
  // decode a chunk and copy every part's units out of it; or fetch chunks of one file together,
  // decoded in parallel once every fetch is in (2b)
  const int64_t n_merged = merged_.size();
  run([&](int64_t t) {
        if (t >= n_raw + n_chunk) {
          FetchMerged(t - n_raw - n_chunk);
        } else if (t >= n_raw) {
          if (merged_of_[t - n_raw] < 0) ReadChunkTask(t - n_raw);
        } else {
          ReadRawTask(tasks_[t]);
        }
      },
      n_raw + n_chunk + n_merged, [&](int64_t t) -> int64_t {
        if (t < n_raw) return tasks_[t].g1 - tasks_[t].g0;
        if (t >= n_raw + n_chunk) return merged_[t - n_raw - n_chunk].hi - merged_[t - n_raw - n_chunk].lo;
        return plans_.chunks[coded_[chunk_tasks_[t - n_raw]].first].nbytes;
      });
  if (n_merged > 0 && !yields_) {  // (a batch read ahead decoded each request's chunks as it came: FetchMerged)
    std::vector<int64_t> decode;
    for (const auto &m : merged_) decode.insert(decode.end(), m.tasks.begin(), m.tasks.end());
    run([&](int64_t k) { ReadChunkTask(decode[k]); }, static_cast<int64_t>(decode.size()),
        [&](int64_t k) -> int64_t { return plans_.chunks[coded_[chunk_tasks_[decode[k]]].first].nbytes; });
  }
  // 3: transpose and boundary fills (those of plans filled on the device are left to the GPU)
  run([&](int64_t i) {
        const int64_t f = items_[i].finish;
        FinishWindow(plans_.plans[f], dsts_[i], out[i], !FillsOnDevice(f));
        if (!options_.mean.empty())
          NormalizeWindow(plans_.plans[f], out[i], options_.channel_axis, options_.mean, options_.stddev);
      },
      n, no_cost);
}

void BatchReader::ReadChunkTask(int64_t t) {
  const int64_t b = chunk_tasks_[t], e = chunk_tasks_[t + 1];
  const int64_t c = coded_[b].first;
  const auto &first = plans_.parts[batch_parts_[coded_[b].second].part];
  const int64_t chunk_bytes = plans_.coders[plans_.chunks[c].coder].chunk_bytes;
  const ReadPlan &first_plan = plans_.plans[first.plan];
  const MergedFetch *m = merged_of_[t] < 0 ? nullptr : &merged_[merged_of_[t]];
  const bool into_window = e - b == 1 && TakesWholeChunk(first_plan, first.base, chunk_bytes);
  // this thread's buffers, kept for its next chunks; a batch read ahead's are this chunk's own, held
  // against read_ahead_bytes from before its fetch until its decode ends (a merged request's room was
  // taken by FetchMerged, which decodes its chunks one after another)
  thread_local HeldBytes kept_stored, kept_decoded;
  HeldBytes own_stored, own_decoded, own_scratch;
  HeldBytes &stored = yields_ ? own_stored : kept_stored, &decoded = yields_ ? own_decoded : kept_decoded;
  HeldBytes *const scratch = yields_ ? &own_scratch : nullptr;  // the decoder's buffers (DecodeHeld)
  AheadBudget::Held room;
  if (yields_ && !m) room = budget_->Take(ChunkFetch(c, into_window), batch_seq_);
  // the chunk read, or decoded from the bytes fetched with its neighbours
  auto read = [&](char *out, const std::vector<std::pair<int64_t, int64_t>> *ranges) {
    if (m) {
      if (yields_) gate_->WaitOpen();
      DecodeStored(plans_, c, m->name, m->data + (plans_.chunks[c].offset - m->lo), out, ranges, scratch);
    } else {
      ReadChunk(plans_, c, first_plan, first_path_[first.plan], &stored, out, ranges, ranges ? guesses_.get() : nullptr,
                yields_ ? gate_.get() : nullptr, scratch);
    }
  };
  if (into_window) {
    // the chunk is the part's whole window (chunks that follow the shards): decoded straight into it
    char *window = dsts_[batch_parts_[coded_[b].second].sample] + first.dst_base;
    read(window + first_plan.dst_off[0], nullptr);
    SwapPlanUnits(first_plan, window);
    return;
  }
  decoded.Resize(chunk_bytes);
  // what the parts copy out of the chunk: only those bytes need decoding (a Blosc chunk of a whole
  // field decodes, and reads, the blocks of this rank's band)
  read(decoded.data(), &chunk_ranges_[t]);
  for (int64_t k = b; k < e; k++) {
    const auto &bp = batch_parts_[coded_[k].second];
    const auto &part = plans_.parts[bp.part];
    CopyUnits(plans_.plans[part.plan], decoded.data() + part.base, dsts_[bp.sample] + part.dst_base);
  }
}

void BatchReader::PlanMergedFetches(int64_t n_chunk) {
  merged_.clear();
  merged_of_.assign(n_chunk, -1);
  // only an object store's chunks: there a request is a round trip; a local file's chunks keep a pread
  // each (the page cache reads ahead, and a merged read would copy the gaps)
  const ByteStore *local = StoreOf("file");
  std::vector<StoredSpan> spans;
  std::vector<int64_t> span_task;
  int64_t scratch = 0;  // the largest decode buffers of the chunks that may be fetched together
  for (int64_t t = 0; t < n_chunk; t++) {
    const int64_t c = coded_[chunk_tasks_[t]].first;
    const PlanChunk &ch = plans_.chunks[c];
    const ByteStore *store = plans_.files[ch.file].byte_store;
    // read whole (a Blosc chunk read in parts keeps its own fetch); never written: no bytes to fetch
    if (ch.nbytes <= 0 || store == nullptr || store == local ||
        MayReadInParts(plans_.coders[ch.coder], ch.nbytes, chunk_ranges_[t]))
      continue;
    spans.push_back({ch.file, ch.offset, ch.nbytes});
    span_task.push_back(t);
    scratch = std::max(scratch, DecodeHeld(c, false));
  }
  if (spans.size() < 2) return;
  // a batch read ahead holds a request's bytes and the buffers of one decode at least (FetchMerged): at
  // most the take reserved for it when it was started (ReadAheadList), so that each request fits
  const int64_t most = yields_ ? std::min(kMaxMergedRequest, run_room_ - scratch) : kMaxMergedRequest;
  // the runs the fetch plan keeps within the batch's bound (kMaxMergedBatchBytes; the chunks of the
  // others are fetched alone): dali-mesh plan counts an epoch's fetches by the same call (fetch_epoch.cc)
  for (const auto &run :
       BatchChunkRuns(spans, [&](int64_t f) { return plans_.files[f].byte_store->Cost(); }, most)) {
    MergedFetch m;
    m.file = spans[run.front()].file;
    m.lo = spans[run.front()].offset;
    for (int64_t k : run) {
      m.hi = std::max(m.hi, spans[k].offset + spans[k].nbytes);
      m.tasks.push_back(span_task[k]);
    }
    for (int64_t t : m.tasks) merged_of_[t] = static_cast<int64_t>(merged_.size());
    merged_.push_back(std::move(m));
  }
}

void BatchReader::FetchMerged(int64_t i) {
  MergedFetch &m = merged_[i];
  // the file opened and checked by each plan whose chunks lie in it, as each chunk's read would
  std::vector<int64_t> check_plans;
  for (int64_t t : m.tasks) check_plans.push_back(plans_.parts[batch_parts_[coded_[chunk_tasks_[t]].second].part].plan);
  std::sort(check_plans.begin(), check_plans.end());
  check_plans.erase(std::unique(check_plans.begin(), check_plans.end()), check_plans.end());
  if (!yields_) {  // decoded in parallel once every request is in (Read's 2b), freed when the batch is read
    m.bytes.reset(new char[m.hi - m.lo]);
    m.data = m.bytes.get();
    m.name = ReadStoredRun(plans_, m.file, m.lo, m.hi, check_plans, first_path_, m.bytes.get());
    return;
  }
  // a batch read ahead holds the request's bytes and its decodes' scratch (ReadChunkTask's own) against
  // read_ahead_bytes, decodes its chunks as soon as it is in and lets it go: held until every request
  // of the batch was in, eight batches' requests stayed behind the decode gate. Its chunks are decoded
  // on as many of its threads as the take reserved for it holds buffers for beside the request (as
  // Read's 2b would on all), at least one (the request was cut to leave room for one: PlanMergedFetches,
  // so that the take never passes what was reserved): where that is one, a request of two chunks decoded one after the
  // other read an epoch in 0.84-0.98 s, two requests of a chunk each (room for one) in 1.23-1.32 s
  // (8 batches ahead in 16 MiB, 40 batches of two 4 MiB gzip chunks, 2 threads, 20 ms a request;
  // 3 runs each, 2026-12-07)
  const int64_t n = static_cast<int64_t>(m.tasks.size());
  int64_t scratch = 0;
  for (int64_t t : m.tasks) scratch = std::max(scratch, DecodeHeld(coded_[chunk_tasks_[t]].first, false));
  const int64_t bytes_held = m.hi - m.lo;
  const int64_t lanes = std::max<int64_t>(
      1, std::min<int64_t>({n, threads_, scratch > 0 ? (run_room_ - bytes_held) / scratch : n}));
  const AheadBudget::Held room = budget_->Take(bytes_held + lanes * scratch, batch_seq_);
  HeldBytes bytes;
  bytes.Resize(bytes_held);
  m.data = bytes.data();
  m.name = ReadStoredRun(plans_, m.file, m.lo, m.hi, check_plans, first_path_, bytes.data());
  std::atomic<int64_t> next{0};
  (*run_)([&](int64_t) {
            for (int64_t k; (k = next.fetch_add(1)) < n;) ReadChunkTask(m.tasks[k]);
          },
          lanes, [](int64_t) -> int64_t { return 0; });
  m.data = nullptr;
}

void BatchReader::ReadRawTask(const Task &task) {
  const auto &bp = batch_parts_[task.part];
  const auto &part = plans_.parts[bp.part];
  OpenFile file;
  file.Open(plans_.files[part.file], plans_.plans[part.plan], first_path_[part.plan]);
  versions_.Agree(part.file, file);  // a window read in several tasks: one version of its file
  thread_local std::vector<char> scratch;
  ReadGroups(file, plans_.plans[part.plan], part.base, task.g0, task.g1, dsts_[bp.sample] + part.dst_base,
             &scratch);
  file.CheckUnchanged();
}

}  // namespace dali_mesh
