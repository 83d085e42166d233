// dali_mesh: which stored bytes of a chunk are fetched, and how (see fetch_plan.h). Host only,
// DALI-free.
#include "reader/fetch_plan.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace dali_mesh {

namespace {

// The parts of `ranges` not in `have` (both sorted and disjoint).
ByteRanges Missing(const ByteRanges &ranges, const ByteRanges &have) {
  ByteRanges out;
  size_t k = 0;
  for (auto [lo, hi] : ranges) {
    while (k < have.size() && have[k].second <= lo) k++;
    for (size_t i = k; i < have.size() && have[i].first < hi && lo < hi; i++) {
      if (have[i].first > lo) out.push_back({lo, have[i].first});
      lo = std::max(lo, have[i].second);
    }
    if (lo < hi) out.push_back({lo, hi});
  }
  return out;
}

// The first round trip's ranges of a read in parts from `guess` (nullptr: none): the header's first
// 4 KiB and the parts the guess places (`runs`: the ranges' blocks by its block size, GuessRuns), merged.
ByteRanges FirstTrip(int64_t n, const BlockLayout *guess, bool have_runs, const ByteRanges &runs) {
  ByteRanges first = {{0, std::min<int64_t>(n, 4096)}};
  if (guess) {
    const ByteRanges guessed = GuessedParts(*guess, n, have_runs, runs);
    first.insert(first.end(), guessed.begin(), guessed.end());
  }
  MergeRanges(&first);
  return first;
}

// Whether `guess` is a layout (GuessedParts places nothing otherwise), and then the blocks of its block
// size that a decode of `ranges` takes (the codec's BlockRuns), into `runs`: false for no runs (the
// ranges take the whole chunk at that block size, or no layout).
bool GuessRuns(const Coder &coder, const BlockLayout &g, const ByteRanges &ranges, ByteRanges *runs) {
  runs->clear();
  if (g.n <= 0 || g.blocksize <= 0 || g.index_end <= 0) return false;
  return BlockRuns(ranges, coder.chunk_bytes, g.blocksize, g.ts, runs);
}

int64_t BytesOf(const ByteRanges &ranges) {
  int64_t bytes = 0;
  for (const auto &r : ranges) bytes += r.second - r.first;
  return bytes;
}

// One chunk's reads in turn: each Fetch is one round trip (its requests sent together through
// `read_many`), of what is not read yet.
class ChunkFetch {
 public:
  ChunkFetch(const StoredReader &read, const StoredRangesReader &read_many, const RoundTrip &cost)
      : read_(read), read_many_(read_many), cost_(cost) {}

  // Fetches what of `want` is not read yet, in the requests PlanRequests chooses, or (`whole`) the
  // rest of it as one request from its first missing byte to its last.
  void Fetch(ByteRanges want, bool whole = false) {
    MergeRanges(&want);
    ByteRanges todo = Missing(want, have_);
    if (todo.empty()) return;
    if (whole) {
      todo = {{todo.front().first, todo.back().second}};
    } else {
      todo = PlanRequests(todo, cost_);
    }
    if (read_many_ && todo.size() > 1) {
      read_many_(todo);
    } else {
      for (const auto &p : todo) read_(p.first, p.second);
    }
    trips_ += read_many_ ? 1 : static_cast<int>(todo.size());
    have_.insert(have_.end(), todo.begin(), todo.end());
    MergeRanges(&have_);
  }
  const ByteRanges &have() const { return have_; }
  int trips() const { return trips_; }

 private:
  const StoredReader &read_;
  const StoredRangesReader &read_many_;
  const RoundTrip cost_;
  ByteRanges have_;  // the stored bytes read so far (sorted, disjoint)
  int trips_ = 0;
};

}  // namespace

int64_t MergeGap(const RoundTrip &cost) {
  const double gap = cost.latency_s * cost.bytes_per_s;
  // in double: a crafted or absurd measurement must not overflow
  if (!(gap > static_cast<double>(kLocalGap))) return kLocalGap;
  return gap >= 9e18 ? INT64_MAX : static_cast<int64_t>(gap);
}

ByteRanges PlanRequests(const ByteRanges &wanted, const RoundTrip &cost) {
  if (wanted.size() < 2) return wanted;
  const int64_t merge_gap = MergeGap(cost);
  int64_t budget = BytesOf(wanted) / kOverReadDivisor;  // what the model's merges may read beyond the wanted
  // join[i]: the gap after wanted[i] is read; the local gaps always, the model's narrowest first
  std::vector<char> join(wanted.size() - 1, 0);
  std::vector<size_t> wide;
  for (size_t i = 0; i + 1 < wanted.size(); i++) {
    const int64_t gap = wanted[i + 1].first - wanted[i].second;
    if (gap < kLocalGap) {
      join[i] = 1;
    } else if (gap < merge_gap) {
      wide.push_back(i);
    }
  }
  auto gap_of = [&](size_t i) { return wanted[i + 1].first - wanted[i].second; };
  std::stable_sort(wide.begin(), wide.end(), [&](size_t a, size_t b) { return gap_of(a) < gap_of(b); });
  for (size_t i : wide) {
    if (gap_of(i) > budget) break;  // the gaps after it are wider still
    budget -= gap_of(i);
    join[i] = 1;
  }
  ByteRanges out = {wanted.front()};
  for (size_t i = 1; i < wanted.size(); i++) {
    if (join[i - 1]) {
      out.back().second = wanted[i].second;
    } else {
      out.push_back(wanted[i]);
    }
  }
  return out;
}

void MergeRanges(ByteRanges *ranges) {
  std::sort(ranges->begin(), ranges->end());
  size_t k = 0;
  for (size_t i = 0; i < ranges->size(); i++) {
    if (k && (*ranges)[i].first <= (*ranges)[k - 1].second) {
      (*ranges)[k - 1].second = std::max((*ranges)[k - 1].second, (*ranges)[i].second);
    } else {
      (*ranges)[k++] = (*ranges)[i];
    }
  }
  ranges->resize(k);
}

bool MayReadInParts(const Coder &coder, int64_t n, const ByteRanges &ranges, int64_t min_stored) {
  // (a coder the plan loader took is one this build decodes: CheckCoder)
  if (!BlocksOfCoder(coder) || n < min_stored) return false;
  int64_t covered = 0;
  for (const auto &r : ranges) covered += r.second - r.first;
  return covered * 4 < coder.chunk_bytes * 3;
}

ByteRanges BlockStoredBytes(const BlockLayout &l, const ByteRanges &runs) {
  ByteRanges out;
  if (l.blocksize <= 0) return out;
  if (l.memcpyed) {  // the decoded bytes follow the header as they are
    for (const auto &r : runs) out.push_back({kBlockHeaderBytes + r.first, kBlockHeaderBytes + r.second});
    return out;
  }
  std::vector<int64_t> sorted = l.starts;
  std::sort(sorted.begin(), sorted.end());
  const int64_t nblocks = static_cast<int64_t>(l.starts.size());
  for (const auto &r : runs) {
    for (int64_t j = r.first / l.blocksize; j <= (r.second - 1) / l.blocksize && j < nblocks; j++) {
      const auto next = std::upper_bound(sorted.begin(), sorted.end(), l.starts[j]);
      out.push_back({l.starts[j], next == sorted.end() ? l.n : *next});
    }
  }
  return out;
}

ByteRanges GuessedParts(const BlockLayout &g, int64_t n, bool have_runs, const ByteRanges &runs) {
  ByteRanges out;
  if (g.n <= 0 || g.blocksize <= 0 || g.index_end <= 0) return out;
  out.push_back({0, std::min(n, g.index_end)});
  if (!have_runs) return out;
  auto add = [&](double lo, double hi) {  // in double: a crafted size must not overflow
    const double margin = std::max(4096.0, (hi - lo) / 64);
    lo = std::clamp(lo - margin, 0.0, static_cast<double>(n));
    hi = std::clamp(hi + margin, 0.0, static_cast<double>(n));
    if (lo < hi) out.push_back({static_cast<int64_t>(lo), static_cast<int64_t>(hi)});
  };
  // a memcpyed chunk's bytes lie where its decoded bytes do; compressed blocks scale with the chunk
  const double scale = g.memcpyed ? 1.0 : static_cast<double>(n) / static_cast<double>(g.n);
  for (const auto &p : BlockStoredBytes(g, runs)) add(p.first * scale, p.second * scale);
  return out;
}

namespace {

// A read in parts (MayReadInParts holds) from its first round trip `first`: the codec describes the
// chunk from what was read (its header and index: DescribeBlocks, again only when the index is longer
// than the first trip took), the blocks a decode takes are fetched, and the codec says whether their
// streams lie in what was read (StreamsWereRead; else the rest of the chunk is read whole). The
// codec is asked twice, three times for a long index.
bool ReadParts(const Coder &coder, int64_t n, const ByteRanges &ranges, char *at, const StoredReader &read,
               const StoredRangesReader &read_many, const ByteRanges &first, BlockLayout *learnt, int *trips,
               const RoundTrip &cost) {
  ChunkFetch fetch(read, read_many, cost);
  fetch.Fetch(first);
  BlockLayout layout;
  Described d = DescribeBlocks(coder, at, fetch.have(), n, ranges, &layout);
  if (d == Described::kNeedIndex) {  // a longer index than the first read took
    fetch.Fetch({{0, layout.index_end}});
    d = DescribeBlocks(coder, at, fetch.have(), n, ranges, &layout);
  }
  bool in_parts = false;
  if (d == Described::kBlocks) {
    fetch.Fetch(BlockStoredBytes(layout, layout.runs));
    in_parts = StreamsWereRead(layout, at, fetch.have());
    if (learnt) *learnt = std::move(layout);
  } else if (d == Described::kWholeDecode && learnt) {
    // its blocks make the decode of the ranges a whole chunk's (blocks too large for them): the header
    // alone shows it, and tells the next chunk of the array to be read whole in one round trip
    *learnt = std::move(layout);
  }
  // whole when a touched block's streams reach bytes not read (never decode the stale bytes of a
  // reused buffer)
  if (!in_parts) fetch.Fetch({{0, n}}, true);
  if (trips) *trips = fetch.trips();
  return in_parts;
}

}  // namespace

bool ReadStored(const Coder &coder, int64_t n, const ByteRanges *ranges, char *at, const StoredReader &read,
                int64_t min_stored, const StoredRangesReader &read_many, const BlockLayout *guess,
                BlockLayout *learnt, int *trips, const RoundTrip &cost) {
  if (trips) *trips = 1;
  if (!ranges || !MayReadInParts(coder, n, *ranges, min_stored)) {
    read(0, n);
    return false;
  }
  // a Blosc chunk whose blocks the ranges touch only some of: its header and block index, then those
  // blocks' stored bytes
  ByteRanges runs;
  const bool have_runs = guess && GuessRuns(coder, *guess, *ranges, &runs);
  return ReadParts(coder, n, *ranges, at, read, read_many, FirstTrip(n, guess, have_runs, runs), learnt, trips, cost);
}

bool PartsGuesses::Get(const std::string &stem, int64_t coder, BlockLayout *guess, bool *held) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = last_.find({stem, coder});
  if (it == last_.end()) return false;
  *guess = it->second.first;
  *held = it->second.second;
  return true;
}

void PartsGuesses::Put(const std::string &stem, int64_t coder, BlockLayout guess, bool held) {
  std::lock_guard<std::mutex> lock(mutex_);
  last_[{stem, coder}] = {std::move(guess), held};
}

std::string PartsGuesses::StemOf(const std::string &key) {
  // only the chunk's own coordinates go: the array's path may hold numbers too (a pressure level's
  // group "z/500", "p.zarr/850"), and two arrays of one stem and coder would mislead each other's
  // guesses at every read (each then read whole, or in two round trips, for good)
  const size_t slash = key.rfind('/');
  const std::string last = key.substr(slash == std::string::npos ? 0 : slash + 1);
  auto coordinates = [](const std::string &part, const char *chars) {
    return !part.empty() && part.find_first_not_of(chars) == std::string::npos;
  };
  auto dirname = [&](size_t at) { return at == std::string::npos ? std::string() : key.substr(0, at); };
  // Zarr v2's "0.1.2", Zarr v3's "c.0.1" (dot-separated coordinates: one path component)
  if ((last.find('.') != std::string::npos && coordinates(last, "0123456789.")) ||
      (last.size() > 2 && last.compare(0, 2, "c.") == 0 && coordinates(last.substr(2), "0123456789.")))
    return dirname(slash);
  // "/"-separated coordinates: the trailing numbers, then Zarr v3's "c" before them ("t/c/0/1/2"); an
  // array's numeric name above "/"-separated v2 coordinates joins them (a rare layout: its arrays' guesses
  // are then shared, a cost in round trips only)
  size_t end = key.size();
  for (;;) {
    const size_t at = key.rfind('/', end ? end - 1 : 0);
    const size_t begin = at == std::string::npos ? 0 : at + 1;
    if (begin >= end) break;
    const std::string part = key.substr(begin, end - begin);
    if (part == "c") return dirname(at);
    if (!coordinates(part, "0123456789")) break;
    if (at == std::string::npos) return std::string();
    end = at;
  }
  return key.substr(0, end);
}

namespace {

// Reads a chunk whole in one request, a read from `guess` (the array's last layout) having been judged not
// worth it, and learns this chunk's own layout for the next one: whether a read in parts from the guess
// (its first round trip `first`) would have held every byte the decode takes; or, its blocks sparing none
// of the ranges, that the next chunk is read whole at once too. A chunk whose layout differs from the
// guess's (another block size) so puts its own, and the array's reads go back to parts when they may.
void ReadWholeAndLearn(const Coder &coder, int64_t n, const ByteRanges &ranges, char *at, const StoredReader &read,
                       const ByteRanges &first, PartsGuesses *guesses, const std::string &stem, int64_t coder_index) {
  read(0, n);
  BlockLayout layout;
  const Described d = DescribeBlocks(coder, at, {{0, n}}, n, ranges, &layout);
  if (d == Described::kWholeDecode) {
    guesses->Put(stem, coder_index, std::move(layout), true);
    return;
  }
  if (d != Described::kBlocks) return;
  ByteRanges need = BlockStoredBytes(layout, layout.runs);
  need.push_back({0, layout.index_end});
  MergeRanges(&need);
  const bool would_hold = Missing(need, first).empty() && StreamsWereRead(layout, at, first);
  guesses->Put(stem, coder_index, std::move(layout), would_hold);
}

}  // namespace

bool FetchChunk(const Coder &coder, int64_t n, const ByteRanges *ranges, char *at, const StoredReader &read,
                const StoredRangesReader &read_many, PartsGuesses *guesses, const std::string &stem,
                int64_t coder_index, const RoundTrip &cost, int *trips) {
  BlockLayout guess;
  bool held = true;
  const bool have_guess = guesses && ranges && guesses->Get(stem, coder_index, &guess, &held);
  if (trips) *trips = 1;
  if (!ranges || !MayReadInParts(coder, n, *ranges, kMinPartsBytes)) {
    read(0, n);
    return false;
  }
  // the ranges' blocks by the guess's block size (the codec's rule: asked once for the whole chunk read)
  ByteRanges guess_runs;
  const bool have_runs = have_guess && GuessRuns(coder, guess, *ranges, &guess_runs);
  const ByteRanges first = FirstTrip(n, have_guess ? &guess : nullptr, have_runs, guess_runs);
  if (have_guess) {
    // the array's blocks too large for these ranges to spare any (a halo reaching a fourth of four 1 MiB
    // blocks): the header first, then the rest, would be two round trips for the whole chunk; or the last
    // guess did not hold (a Blosc chunk compressed by several threads stores its blocks in the order they
    // finished) and the bytes a whole read adds cost less than a round trip at `cost`
    bool whole = guess.blocksize > 0 && !have_runs;
    if (!whole && !held && cost.bytes_per_s > 0)
      whole = static_cast<double>(n - BytesOf(first)) / cost.bytes_per_s < cost.latency_s;
    if (whole) {
      ReadWholeAndLearn(coder, n, *ranges, at, read, first, guesses, stem, coder_index);
      return false;
    }
  }
  BlockLayout learnt;
  int turns = 0;
  const bool in_parts = ReadParts(coder, n, *ranges, at, read, read_many, first, guesses ? &learnt : nullptr, &turns,
                                  cost);
  // held: a guess that brought everything in the first round trip; a chunk read without one gives the
  // next its first try
  if (guesses && learnt.n > 0)
    guesses->Put(stem, coder_index, std::move(learnt), !have_guess || (in_parts && turns <= 1));
  if (trips) *trips = turns;
  return in_parts;
}

std::vector<std::vector<int64_t>> ChunkRuns(const std::vector<StoredSpan> &spans,
                                            const std::function<RoundTrip(int64_t file)> &cost, int64_t max_bytes) {
  std::vector<int64_t> order;
  for (size_t k = 0; k < spans.size(); k++)
    if (spans[k].nbytes > 0) order.push_back(static_cast<int64_t>(k));
  // two keys of one range: by index, so that a run's order is one (std::sort is not stable) and the
  // planner's estimate, a stable sort (plan_set.py _chunk_runs), is the same
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return std::tie(spans[a].file, spans[a].offset, spans[a].nbytes, a) <
           std::tie(spans[b].file, spans[b].offset, spans[b].nbytes, b);
  });
  std::vector<std::vector<int64_t>> runs;
  std::vector<int64_t> run;
  int64_t run_lo = 0, run_hi = 0;
  auto close = [&] {
    if (run.size() >= 2) runs.push_back(run);
    run.clear();
  };
  for (size_t b = 0, e; b < order.size(); b = e) {
    const int64_t file = spans[order[b]].file;
    ByteRanges wanted;
    for (e = b; e < order.size() && spans[order[e]].file == file; e++)
      wanted.push_back({spans[order[e]].offset, spans[order[e]].offset + spans[order[e]].nbytes});
    MergeRanges(&wanted);  // two keys of one range, or touching chunks: one wanted range
    const ByteRanges requests = PlanRequests(wanted, cost(file));
    size_t r = 0;
    for (size_t k = b; k < e; k++) {
      const StoredSpan &s = spans[order[k]];
      const int64_t end = s.offset + s.nbytes;
      // the request holding this chunk (each wanted range lies inside one): a later one begins a run
      while (requests[r].second < end) {
        close();
        r++;
      }
      if (!run.empty() && std::max(run_hi, end) - run_lo > max_bytes) close();
      if (run.empty()) run_lo = s.offset, run_hi = end;
      run.push_back(order[k]);
      run_hi = std::max(run_hi, end);
    }
    close();
  }
  return runs;
}

std::vector<std::vector<int64_t>> BatchChunkRuns(const std::vector<StoredSpan> &spans,
                                                 const std::function<RoundTrip(int64_t file)> &cost,
                                                 int64_t max_bytes) {
  std::vector<std::vector<int64_t>> kept;
  int64_t held = 0;
  for (auto &run : ChunkRuns(spans, cost, max_bytes)) {
    int64_t lo = spans[run.front()].offset, hi = lo;
    for (int64_t k : run) hi = std::max(hi, spans[k].offset + spans[k].nbytes);
    // the batch's merged bytes are held until decoded: beyond the bound, chunks are fetched alone
    if (held + (hi - lo) > kMaxMergedBatchBytes) continue;
    held += hi - lo;
    kept.push_back(std::move(run));
  }
  return kept;
}

}  // namespace dali_mesh
