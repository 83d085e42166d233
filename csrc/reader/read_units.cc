// dali_mesh: reading a plan's units into a window (see read_units.h). Host only, DALI-free.
#include "reader/read_units.h"

#include <sys/mman.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <new>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "codecs/codecs.h"
#include "reader/fetch_plan.h"
#include "storage/reads_in_flight.h"

namespace dali_mesh {

using detail::Fail;

namespace {

template <int N>
void SwapBytes(char *p, int64_t n_values) {
  for (int64_t i = 0; i < n_values; i++, p += N) std::reverse(p, p + N);
}

// Swaps the values of units [b, e) of `plan` landed in `dst` when the plan says they are stored in
// the other byte order.
void SwapUnits(const ReadPlan &plan, int64_t b, int64_t e, char *dst) {
  if (plan.swap_unit <= 1) return;
  for (int64_t u = b; u < e; u++) {
    const int64_t n = plan.unit_bytes[u] / plan.swap_unit;
    for (int64_t j = 0; j < plan.unit_count[u]; j++) {
      char *p = dst + plan.dst_off[u] + j * plan.dst_step[u];
      switch (plan.swap_unit) {
        case 2: SwapBytes<2>(p, n); break;
        case 4: SwapBytes<4>(p, n); break;
        case 8: SwapBytes<8>(p, n); break;
        default:
          for (int64_t i = 0; i < n; i++) std::reverse(p + i * plan.swap_unit, p + (i + 1) * plan.swap_unit);
      }
    }
  }
}

}  // namespace

namespace {

// gaps land in a scratch of at most 1 MiB (a larger gap takes several buffers of it): a plan's gaps
// are a few KiB (merged reads), and a crafted plan's gap of terabytes must not become an allocation of
// that size
constexpr int64_t kMaxScratch = int64_t(1) << 20;
constexpr int kIovMax = 1024;  // buffers per request (the object splits by its own limit)

int64_t ScratchBytes(const ReadPlan &plan) { return std::max<int64_t>(1, std::min(plan.max_gap, kMaxScratch)); }

// The vector reads of groups [g0, g1) of `plan`, as ReadGroups makes them: each group's buffers in file
// order (runs at dst_of(u, j), and the gaps before them into `scratch`, of `scratch_bytes` at most each),
// read(&iov, first file byte) a batch of at most kIovMax at a time, then done(b, e) after each group's
// last. One walk for the reads and for their count (GroupReads).
template <typename Dst, typename Read, typename Done>
void WalkGroupReads(const ReadPlan &plan, int64_t g0, int64_t g1, char *scratch, int64_t scratch_bytes,
                    const Dst &dst_of, const Read &read, const Done &done) {
  std::vector<struct iovec> iov;
  iov.reserve(kIovMax);
  int64_t offset = 0;
  // a unit of many runs never becomes one vector of them all
  auto push = [&](char *p, int64_t n) {
    if (iov.size() == static_cast<size_t>(kIovMax)) {
      const int64_t n = std::accumulate(iov.begin(), iov.end(), int64_t(0),
                                        [](int64_t a, const struct iovec &v) { return a + int64_t(v.iov_len); });
      read(&iov, offset);
      offset += n;
      iov.clear();
    }
    iov.push_back({p, static_cast<size_t>(n)});
  };
  for (int64_t g = g0; g < g1; g++) {
    const int64_t b = plan.group_begin[g], e = plan.group_end[g];
    offset = plan.file_off[b];
    iov.clear();
    int64_t at = plan.file_off[b];  // the file byte read next
    for (int64_t u = b; u < e; u++) {
      for (int64_t j = 0; j < plan.unit_count[u]; j++) {
        const int64_t run = plan.file_off[u] + j * plan.file_step[u];
        for (int64_t gap = run - at; gap > 0; gap -= scratch_bytes) push(scratch, std::min(gap, scratch_bytes));
        push(dst_of(u, j), plan.unit_bytes[u]);
        at = run + plan.unit_bytes[u];
      }
    }
    read(&iov, offset);
    done(b, e);
  }
}

}  // namespace

void ReadGroups(const OpenFile &file, const ReadPlan &plan, int64_t base, int64_t g0, int64_t g1,
                char *dst, std::vector<char> *scratch) {
  const int64_t scratch_bytes = ScratchBytes(plan);
  if (static_cast<int64_t>(scratch->size()) < scratch_bytes) scratch->resize(scratch_bytes);
  if (g0 >= g1) return;
  // one registration for the task's reads (not one per group: a mutex and an allocation each), its
  // range from the first group's first byte to the last group's last
  const int64_t last = plan.group_end[g1 - 1] - 1;
  FlightGuard flight(file.path(), base + plan.file_off[plan.group_begin[g0]],
                     plan.file_end(last) - plan.file_off[plan.group_begin[g0]]);
  WalkGroupReads(
      plan, g0, g1, scratch->data(), scratch_bytes,
      [&](int64_t u, int64_t j) { return dst + plan.dst_off[u] + j * plan.dst_step[u]; },
      [&](std::vector<struct iovec> *iov, int64_t offset) { file.object().ReadVector(iov, base + offset); },
      // the file holds the other byte order: swap what was just read
      [&](int64_t b, int64_t e) { SwapUnits(plan, b, e, dst); });
}

std::vector<std::pair<int64_t, int64_t>> GroupReads(const ReadPlan &plan, int64_t g0, int64_t g1) {
  std::vector<std::pair<int64_t, int64_t>> out;
  WalkGroupReads(
      plan, g0, g1, nullptr, ScratchBytes(plan), [](int64_t, int64_t) { return static_cast<char *>(nullptr); },
      [&](std::vector<struct iovec> *iov, int64_t offset) {
        int64_t n = 0;
        for (const auto &v : *iov) n += static_cast<int64_t>(v.iov_len);
        out.push_back({offset, n});
      },
      [](int64_t, int64_t) {});
  return out;
}

void CopyUnits(const ReadPlan &plan, const char *src, char *dst) {
  const int64_t n = plan.file_off.size();
  for (int64_t u = 0; u < n; u++) {
    const char *s = src + plan.file_off[u];
    char *d = dst + plan.dst_off[u];
    const int64_t bytes = plan.unit_bytes[u], fs = plan.file_step[u], ds = plan.dst_step[u];
    for (int64_t j = 0; j < plan.unit_count[u]; j++, s += fs, d += ds) std::memcpy(d, s, bytes);
  }
  SwapUnits(plan, 0, n, dst);
}

bool TakesWholeChunk(const ReadPlan &plan, int64_t base, int64_t chunk_bytes) {
  return plan.coded && base == 0 && plan.file_off.size() == 1 && plan.file_off[0] == 0 &&
         plan.unit_count[0] == 1 && plan.unit_bytes[0] == chunk_bytes;
}

void SwapPlanUnits(const ReadPlan &plan, char *dst) { SwapUnits(plan, 0, plan.file_off.size(), dst); }

void AddUnitRanges(const ReadPlan &plan, int64_t base, std::vector<std::pair<int64_t, int64_t>> *ranges) {
  for (size_t u = 0; u < plan.file_off.size(); u++)
    ranges->push_back({base + plan.file_off[u], base + plan.file_end(u)});
}

void HeldBytes::Resize(int64_t n) {
  if (n <= size_) return;
  Free();
  if (n >= kMapBytes) {
    void *p = mmap(nullptr, static_cast<size_t>(n), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<char *>(p);
    mapped_ = true;
  } else {
    data_ = new char[n];
  }
  size_ = n;
}

void HeldBytes::Free() {
  if (data_ == nullptr) return;
  if (mapped_)
    munmap(data_, static_cast<size_t>(size_));
  else
    delete[] data_;
  data_ = nullptr;
  size_ = 0;
  mapped_ = false;
}

char *PlaceLike(HeldBytes *buffer, int64_t n, int64_t offset) {
  buffer->Resize(n + kPlacePage);
  const auto start = reinterpret_cast<uintptr_t>(buffer->data());
  return buffer->data() + ((static_cast<uintptr_t>(offset) - start) & (kPlacePage - 1));
}

AheadBudget::Held &AheadBudget::Held::operator=(Held &&o) noexcept {
  if (this != &o) {
    Reset();
    budget_ = std::move(o.budget_);
    batch_ = o.batch_;
    bytes_ = o.bytes_;
    counted_ = o.counted_;
    o.bytes_ = 0;
  }
  return *this;
}

void AheadBudget::Held::Reset() {
  if (budget_) budget_->Give(batch_, bytes_, counted_);
  budget_.reset();
  bytes_ = 0;
}

int64_t AheadBudget::Count(int64_t batch, int64_t bytes) {
  if (batch == wanted_ || bytes == 0) return 0;
  held_ += bytes;
  peak_ = std::max(peak_, held_);
  Counted &c = counted_[batch];
  if (c.id == 0) c.id = next_id_++;
  c.bytes += bytes;
  return c.id;
}

AheadBudget::Held AheadBudget::Take(int64_t bytes, int64_t batch) {
  if (bytes == 0) return Held();  // nothing to wait for (its order is kept by the takes that hold bytes)
  std::unique_lock<std::mutex> lock(mutex_);
  if (bytes < 0 || (batch != wanted_ && bytes > bound_))  // never (BatchReader::ReadAheadBatches admits less)
    Fail("a batch read ahead asked for " + std::to_string(bytes) + " bytes, which read_ahead_bytes (" +
         std::to_string(bound_) + ") never holds");
  const auto me = waiting_.insert(batch);
  const auto since = std::chrono::steady_clock::now();
  bool waited = false;
  // a cancel sets no condition: looked at every 10 ms, as DecodeGate's wait does
  while (batch != wanted_ && (held_ + bytes > bound_ || *waiting_.begin() != batch)) {
    waited = true;
    if (ReadCancelled()) {
      waiting_.erase(me);
      lock.unlock();
      cv_.notify_all();  // a later batch may be first now
      Fail("a batch read ahead was cancelled while its take of " + std::to_string(bytes) +
           " bytes waited for room in read_ahead_bytes (" + std::to_string(bound_) + ")");
    }
    cv_.wait_for(lock, std::chrono::milliseconds(10));
  }
  waiting_.erase(me);
  if (waited) {
    waits_++;
    longest_wait_us_ = std::max<int64_t>(longest_wait_us_, std::chrono::duration_cast<std::chrono::microseconds>(
                                                              std::chrono::steady_clock::now() - since).count());
  }
  const int64_t counted = Count(batch, bytes);
  lock.unlock();
  cv_.notify_all();  // the next batch's take may fit too
  return Held(shared_from_this(), batch, bytes, counted);
}

void AheadBudget::Want(int64_t batch) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    wanted_ = batch;
    const auto it = counted_.find(batch);
    if (it != counted_.end()) {
      held_ -= it->second.bytes;
      counted_.erase(it);
    }
  }
  cv_.notify_all();
}

AheadBudget::Stats AheadBudget::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {held_, peak_, waits_, longest_wait_us_};
}

void AheadBudget::Give(int64_t batch, int64_t bytes, int64_t counted) {
  if (counted == 0) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // what a batch held when it was wanted left the count then (Want): only what is still counted goes
    const auto it = counted_.find(batch);
    if (it == counted_.end() || it->second.id != counted) return;
    const int64_t n = std::min(bytes, it->second.bytes);
    held_ -= n;
    if ((it->second.bytes -= n) == 0) counted_.erase(it);
  }
  cv_.notify_all();
}

void DecodeGate::Close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_++;
}

void DecodeGate::Open() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_--;
  }
  cv_.notify_all();
}

void DecodeGate::WaitOpen() const {
  std::unique_lock<std::mutex> lock(mutex_);
  // a cancel sets no condition: looked at every 10 ms
  while (closed_ > 0 && !ReadCancelled()) cv_.wait_for(lock, std::chrono::milliseconds(10));
}

namespace {

// DecodeChunk's scratch in `held` (grown to DecodeScratchBytes), or null: the decoder's own
char *ScratchFor(const Coder &coder, int64_t n, HeldBytes *held) {
  if (held == nullptr) return nullptr;
  const int64_t bytes = DecodeScratchBytes(coder, n);
  if (bytes == 0) return nullptr;
  held->Resize(bytes);
  return held->data();
}

}  // namespace

void ReadChunk(const PlanSet &set, int64_t c, const ReadPlan &check_plan, const std::string &first_path,
               HeldBytes *stored, char *decoded, const std::vector<std::pair<int64_t, int64_t>> *ranges,
               PartsGuesses *guesses, const DecodeGate *yield, HeldBytes *scratch) {
  const PlanChunk &ch = set.chunks[c];
  const Coder &coder = set.coders[ch.coder];
  const PlanFile &pf = set.files[ch.file];
  if (ch.nbytes == -2) {
    // an inner chunk a shard's index lists as never written: the shard file must still be the one
    // whose index was read (its size and modification time are checked), then the fill value
    OpenFile file;
    file.Open(pf, check_plan, first_path);
    FillMissingChunk(coder, decoded);
    return;
  }
  if (ch.nbytes < 0) {
    // never written when planned: it must still be missing (a chunk written since is data the plan
    // does not know, not fill values)
    if (pf.byte_store->Exists(pf.key))
      Fail(ShownName(pf.key) + ": this chunk was missing when the plan was made (it reads as the fill value) but "
           "exists now: the array changed since; define the pipeline again");
    FillMissingChunk(coder, decoded);
    return;
  }
  OpenFile file;
  file.Open(pf, check_plan, first_path);
  const int64_t size = file.size();
  const std::string where = file.path() + ": chunk of " + std::to_string(ch.nbytes) + " bytes at byte " +
                            std::to_string(ch.offset);
  if (ch.offset > size || ch.nbytes > size - ch.offset)
    Fail(where + " runs past the end of the file (" + std::to_string(size) + " bytes): the file is "
         "truncated or changed since the plan was made");
  char *const at = PlaceLike(stored, ch.nbytes, ch.offset);
  auto read_at = [&](int64_t lo, int64_t hi) {  // the chunk's stored bytes [lo, hi), at their offsets
    if (lo >= hi) return;
    FlightGuard flight(file.path(), ch.offset + lo, hi - lo);
    const int64_t got = file.object().ReadAt(at + lo, hi - lo, ch.offset + lo);
    if (got == -ECANCELED)
      Fail(where + ": read cancelled: the pipeline was stopped after an error");
    if (got < 0) Fail(where + ": read failed (" + std::strerror(-got) + ")");
    if (got != hi - lo) Fail(where + ": the file was truncated while reading");
  };
  // the blocks' parts at once (an object store's requests in flight together: one round trip)
  auto read_many = [&](const std::vector<std::pair<int64_t, int64_t>> &parts) {
    std::vector<StoredObject::Range> rs;
    for (const auto &p : parts)
      if (p.first < p.second) rs.push_back({at + p.first, ch.offset + p.first, p.second - p.first});
    if (rs.empty()) return;
    FlightGuard flight(file.path(), ch.offset + parts.front().first, parts.back().second - parts.front().first);
    file.object().ReadRanges(rs);
  };
  // a Blosc chunk whose blocks this batch needs only some of (a band of a whole field) is read in
  // parts, as the fetch plan decides from the store's cost and the array's last layout
  const bool guessing = guesses && ranges && file.object().GuessParts();
  FetchChunk(coder, ch.nbytes, ranges, at, read_at, read_many, guessing ? guesses : nullptr,
             guessing ? pf.byte_store->spec() + '\n' + PartsGuesses::StemOf(pf.key) : std::string(), ch.coder,
             file.object().Cost());
  file.CheckUnchanged();
  if (yield) yield->WaitOpen();
  char *const room = ScratchFor(coder, ch.nbytes, scratch);
  const std::string why = ranges ? DecodeChunkRanges(coder, at, ch.nbytes, decoded, *ranges, room)
                                 : DecodeChunk(coder, at, ch.nbytes, decoded, room);
  if (!why.empty()) Fail(where + " cannot be decoded: " + why + "; the file is corrupt");
}

std::string ReadStoredRun(const PlanSet &set, int64_t file_index, int64_t lo, int64_t hi,
                          const std::vector<int64_t> &check_plans, const std::vector<std::string> &first_paths,
                          char *dst) {
  const PlanFile &pf = set.files[file_index];
  OpenFile file;
  for (int64_t p : check_plans) file.Open(pf, set.plans[p], first_paths[p]);
  const std::string where = file.path() + ": chunks of bytes " + std::to_string(lo) + ".." + std::to_string(hi);
  if (hi > file.size())
    Fail(where + " run past the end of the file (" + std::to_string(file.size()) + " bytes): the file is "
         "truncated or changed since the plan was made");
  FlightGuard flight(file.path(), lo, hi - lo);
  const int64_t got = file.object().ReadAt(dst, hi - lo, lo);
  if (got == -ECANCELED) Fail(where + ": read cancelled: the pipeline was stopped after an error");
  if (got < 0) Fail(where + ": read failed (" + std::strerror(-got) + ")");
  if (got != hi - lo) Fail(where + ": the file was truncated while reading");
  file.CheckUnchanged();
  return file.path();
}

void DecodeStored(const PlanSet &set, int64_t c, const std::string &name, const char *src, char *decoded,
                  const std::vector<std::pair<int64_t, int64_t>> *ranges, HeldBytes *scratch) {
  const PlanChunk &ch = set.chunks[c];
  const Coder &coder = set.coders[ch.coder];
  char *const room = ScratchFor(coder, ch.nbytes, scratch);
  const std::string why = ranges ? DecodeChunkRanges(coder, src, ch.nbytes, decoded, *ranges, room)
                                 : DecodeChunk(coder, src, ch.nbytes, decoded, room);
  if (!why.empty())
    Fail(name + ": chunk of " + std::to_string(ch.nbytes) + " bytes at byte " + std::to_string(ch.offset) +
         " cannot be decoded: " + why + "; the file is corrupt");
}

void PrefetchRange(const PlanFile &file, int64_t offset, int64_t nbytes) {
  if (nbytes <= 0) return;
  file.byte_store->Prefetch(file.key, {{offset, nbytes}});
}

void PrefetchPath(const PlanFile &file, const ReadPlan &plan, int64_t base) {
  if (plan.group_begin.empty()) return;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  ranges.reserve(plan.group_begin.size());
  for (size_t g = 0; g < plan.group_begin.size(); g++) {
    const int64_t b = plan.group_begin[g], e = plan.group_end[g];
    int64_t lo, hi;
    // a crafted plan or chunk index may put a group near 2**63: never overflow (the store announces
    // only what lies inside the object; the read itself reports the rest)
    if (__builtin_add_overflow(base, plan.file_off[b], &lo) || __builtin_add_overflow(base, plan.file_end(e - 1), &hi))
      continue;
    lo = std::max<int64_t>(lo, 0);
    if (hi > lo) ranges.emplace_back(lo, hi - lo);
  }
  file.byte_store->Prefetch(file.key, ranges);
}

}  // namespace dali_mesh
