// dali_mesh: what an epoch of the batch reader fetches, counted without reading (see fetch_epoch.h).
#include "reader/fetch_epoch.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "codecs/codecs.h"
#include "reader/batch_reader.h"
#include "reader/fetch_plan.h"
#include "reader/read_units.h"
#include "reader/tasks.h"

namespace dali_mesh {

using detail::Fail;

namespace {

void PutLe32(char *at, int64_t v) {
  const auto u = static_cast<uint32_t>(v);
  for (int i = 0; i < 4; i++) at[i] = static_cast<char>((u >> (8 * i)) & 0xff);
}

uint32_t GetLe32(const char *at) {
  uint32_t u = 0;
  for (int i = 0; i < 4; i++) u |= static_cast<uint32_t>(static_cast<unsigned char>(at[i])) << (8 * i);
  return u;
}

// A stand-in for the stored bytes of a chunk of `n` bytes by `coder` whose coder's chunks begin with
// `header` (16 bytes of one of them), in `image` (grown, never shrunk; only the bytes a read in parts
// looks at are written: the header, the block index and each block's stream size): the header with this
// chunk's sizes, stored as it is when its size says so (the decoded bytes and a header), one stream a
// block, and blocks placed as if they compressed alike. Null when there is none to make (no header, a
// chunk of over 1 GiB, blocks too small to hold their streams' sizes).
const char *StandIn(const Coder &coder, int64_t n, const std::string &header, std::vector<char> *image) {
  constexpr int64_t kMostImage = int64_t(1) << 30;
  const int64_t want = coder.chunk_bytes;
  if (header.size() < static_cast<size_t>(kBlockHeaderBytes) || n < kBlockHeaderBytes || n > kMostImage || want <= 0)
    return nullptr;
  if (static_cast<int64_t>(image->size()) < n) image->resize(n);
  char *at = image->data();
  std::memcpy(at, header.data(), kBlockHeaderBytes);
  auto *h = reinterpret_cast<unsigned char *>(at);
  const bool memcpyed = n == want + kBlockHeaderBytes;
  h[2] = static_cast<unsigned char>((memcpyed ? (h[2] | 0x02) : (h[2] & ~0x02)) | 0x10);  // one stream a block
  if (!memcpyed) h[1] = 1;
  PutLe32(at + 4, want);
  PutLe32(at + 12, n);
  const int64_t blocksize = GetLe32(at + 8);
  if (memcpyed || blocksize <= 0) return at;  // (a block size the header refuses: read whole, as the chunk)
  const int64_t nblocks = (want + blocksize - 1) / blocksize;
  const int64_t index_end = kBlockHeaderBytes + 4 * nblocks;
  if (index_end >= n) return at;
  const double per = static_cast<double>(n - index_end) / static_cast<double>(nblocks * blocksize);
  auto start = [&](int64_t j) { return index_end + static_cast<int64_t>(static_cast<double>(j * blocksize) * per); };
  for (int64_t j = 0; j < nblocks; j++) {
    const int64_t lo = start(j), hi = j + 1 < nblocks ? start(j + 1) : n;
    if (hi - lo < 4) return nullptr;
    PutLe32(at + kBlockHeaderBytes + 4 * j, lo);
    PutLe32(at + lo, hi - lo - 4);
  }
  return at;
}

// The reads OpenFile::Open makes of `file` checked by `plan` (open_file.cc): the metadata object read
// whole when its plan checks it and it has no tag, the header the plan checks, a shard's index unless the
// object's reads are pinned to its ETag (an S3 object with a tag). The open itself costs none (the plan's
// version is taken).
std::pair<int64_t, int64_t> OpenReads(const PlanFile &file, const ReadPlan &plan, const std::string &spec) {
  int64_t requests = 0, bytes = 0;
  if (plan.check_offset == kCheckJson && file.tag.empty()) {
    requests++;
    bytes += std::max<int64_t>(file.size, 0);
  } else if (plan.check_offset != kCheckJson && !plan.check.empty()) {
    requests++;
    bytes += static_cast<int64_t>(plan.check.size());
  }
  const bool pinned = !file.tag.empty() && (spec == "s3" || spec.compare(0, 3, "s3;") == 0);
  if (file.check_offset >= 0 && !pinned) {
    requests++;
    bytes += static_cast<int64_t>(file.check.size());
  }
  return {requests, bytes};
}

}  // namespace

std::vector<BatchFetches> EpochFetches(const PlanSet &loaded, const int64_t *ids, int64_t n, int64_t batch_size,
                                       const EpochOptions &options) {
  if (batch_size < 1) Fail("batch_size must be at least 1, not " + std::to_string(batch_size));
  if (n < 0 || (n > 0 && ids == nullptr)) Fail("no sample ids given");
  const int outputs = options.outputs;
  if (outputs < 1 || loaded.items.size() % outputs != 0)
    Fail(loaded.source + ": " + std::to_string(loaded.items.size()) + " items are not " + std::to_string(outputs) +
         " outputs' items per sample id");
  const int64_t num_ids = static_cast<int64_t>(loaded.items.size()) / outputs;
  for (int64_t k = 0; k < n; k++)
    if (ids[k] < 0 || ids[k] >= num_ids)
      Fail("sample id " + std::to_string(ids[k]) + " is out of range for the " + std::to_string(num_ids) +
           " samples of " + loaded.source);
  // the raw plans' groups split as the reader splits them when it loads them (BatchReader's SplitForTasks)
  const int64_t task_bytes = std::max(kMinTaskBytes, options.task_bytes);
  PlanSet plans = loaded;
  for (auto &plan : plans.plans)
    if (!plan.coded) SplitLargeGroups(&plan, task_bytes);
  const ByteStore *local = StoreOf("file");
  auto spec_of = [&](int64_t f) -> const std::string & { return plans.stores[plans.files[f].store]; };
  auto cost = [&](int64_t f) {
    const PlanFile &pf = plans.files[f];
    if (pf.store >= 0 && pf.store < static_cast<int64_t>(options.costs.size())) return options.costs[pf.store];
    return pf.byte_store ? pf.byte_store->Cost() : RoundTrip();
  };
  // the stores whose reads in parts guess (StoredObject::GuessParts: an object store's, not a local file's
  // or an object held in memory)
  auto guessing = [&](int64_t f) {
    const std::string &spec = spec_of(f);
    const ByteStore *store = plans.files[f].byte_store;
    return store != nullptr && store != local && spec != "file" && spec.compare(0, 6, "memory") != 0;
  };
  PartsGuesses guesses;  // the reader's, kept across its batches
  std::vector<char> image;
  std::vector<BatchFetches> out;
  for (int64_t b0 = 0; b0 < n; b0 += batch_size) {
    const int64_t m = std::min(batch_size, n - b0);
    BatchFetches batch;
    auto chain = [&](int64_t requests_in_turn) { batch.round_trips = std::max(batch.round_trips, requests_in_turn); };
    // the batch's parts (BatchReader::Read): output k's window of ids[i] is window k * m + i
    std::vector<std::pair<int64_t, int64_t>> coded;  // (chunk, index into batch_parts), sorted by chunk
    std::vector<int64_t> batch_parts;                // the parts of the batch's windows, in order
    for (int k = 0; k < outputs; k++) {
      for (int64_t i = 0; i < m; i++) {
        const PlanItem &item = plans.items[k * num_ids + ids[b0 + i]];
        for (int64_t p = item.part_begin; p < item.part_end; p++) {
          const PlanPart &part = plans.parts[p];
          const ReadPlan &plan = plans.plans[part.plan];
          if (plan.coded) {
            coded.push_back({part.file, static_cast<int64_t>(batch_parts.size())});
            batch_parts.push_back(p);
            continue;
          }
          // a raw part: its tasks, each opening and checking its file, then its groups' vector reads in turn
          auto split = SplitGroups(plan, task_bytes);
          if (split.empty()) split.push_back({0, 0});
          for (const auto &g : split) {
            const auto [opens, open_bytes] = OpenReads(plans.files[part.file], plan, spec_of(part.file));
            const auto reads = GroupReads(plan, g.first, g.second);
            batch.requests += opens + static_cast<int64_t>(reads.size());
            batch.bytes += open_bytes;
            for (const auto &r : reads) batch.bytes += r.second;
            chain(opens + static_cast<int64_t>(reads.size()));
          }
        }
      }
    }
    // each chunk once, however many parts copy from it, with the bytes they copy out
    std::sort(coded.begin(), coded.end());
    struct ChunkUse {
      int64_t chunk = 0, first_part = 0, parts = 0;
      ByteRanges ranges;
      bool into_window = false;
    };
    std::vector<ChunkUse> chunks;
    for (size_t k = 0; k < coded.size(); k++) {
      const int64_t p = batch_parts[coded[k].second];
      const PlanPart &part = plans.parts[p];
      if (k == 0 || coded[k].first != coded[k - 1].first) {
        chunks.emplace_back();
        chunks.back().chunk = coded[k].first;
        chunks.back().first_part = p;
      }
      chunks.back().parts++;
      AddUnitRanges(plans.plans[part.plan], part.base, &chunks.back().ranges);
    }
    for (ChunkUse &use : chunks) {
      MergeRanges(&use.ranges);
      // (ReadChunkTask: a chunk that is its one part's whole window is decoded straight into it, all of it)
      const PlanPart &first = plans.parts[use.first_part];
      use.into_window = use.parts == 1 && TakesWholeChunk(plans.plans[first.plan], first.base,
                                                          plans.coders[plans.chunks[use.chunk].coder].chunk_bytes);
    }
    // an object store's chunks read whole that lie side by side in a file: one request per run
    std::vector<StoredSpan> spans;
    std::vector<size_t> span_use;
    for (size_t t = 0; t < chunks.size(); t++) {
      const PlanChunk &ch = plans.chunks[chunks[t].chunk];
      const ByteStore *store = plans.files[ch.file].byte_store;
      if (ch.nbytes <= 0 || store == nullptr || store == local ||
          MayReadInParts(plans.coders[ch.coder], ch.nbytes, chunks[t].ranges))
        continue;
      spans.push_back({ch.file, ch.offset, ch.nbytes});
      span_use.push_back(t);
    }
    std::vector<char> merged(chunks.size(), 0);
    if (spans.size() >= 2) {
      for (const auto &run : BatchChunkRuns(spans, cost)) {
        const int64_t file = spans[run.front()].file, lo = spans[run.front()].offset;
        int64_t hi = lo;
        std::vector<int64_t> check_plans;
        for (int64_t k : run) {
          hi = std::max(hi, spans[k].offset + spans[k].nbytes);
          merged[span_use[k]] = 1;
          check_plans.push_back(plans.parts[chunks[span_use[k]].first_part].plan);
        }
        std::sort(check_plans.begin(), check_plans.end());
        check_plans.erase(std::unique(check_plans.begin(), check_plans.end()), check_plans.end());
        int64_t opens = 0;
        for (int64_t p : check_plans) {  // ReadStoredRun opens the file for each plan of its chunks
          const auto [r, bytes] = OpenReads(plans.files[file], plans.plans[p], spec_of(file));
          opens += r;
          batch.bytes += bytes;
        }
        batch.requests += opens + 1;
        batch.bytes += hi - lo;
        chain(opens + 1);
      }
    }
    // every other chunk: read (FetchChunk, the reader's decision) in its own task
    for (size_t t = 0; t < chunks.size(); t++) {
      if (merged[t]) continue;
      const ChunkUse &use = chunks[t];
      const PlanChunk &ch = plans.chunks[use.chunk];
      const Coder &coder = plans.coders[ch.coder];
      if (ch.nbytes == -1) {  // missing when planned: one request finds it still missing
        batch.requests++;
        chain(1);
        continue;
      }
      const auto [opens, open_bytes] = OpenReads(plans.files[ch.file], plans.plans[plans.parts[use.first_part].plan],
                                                 spec_of(ch.file));
      batch.requests += opens;
      batch.bytes += open_bytes;
      if (ch.nbytes < 0) {  // a shard's index lists it as never written: its file opened and checked
        chain(opens);
        continue;
      }
      const ByteRanges *ranges = use.into_window ? nullptr : &use.ranges;
      const char *at = nullptr;
      if (ranges && MayReadInParts(coder, ch.nbytes, *ranges)) {
        const auto header = options.headers.find(ch.coder);
        if (header != options.headers.end()) at = StandIn(coder, ch.nbytes, header->second, &image);
        if (at == nullptr) ranges = nullptr;  // nothing shows its blocks: counted as read whole
      }
      auto read = [&](int64_t lo, int64_t hi) {
        batch.requests++;
        batch.bytes += hi - lo;
      };
      auto read_many = [&](const ByteRanges &rs) {
        for (const auto &r : rs) read(r.first, r.second);
      };
      const bool guess = ranges && guessing(ch.file);
      int trips = 1;
      const bool in_parts =
          FetchChunk(coder, ch.nbytes, ranges, const_cast<char *>(at), read, read_many, guess ? &guesses : nullptr,
                     guess ? plans.files[ch.file].byte_store->spec() + '\n' + PartsGuesses::StemOf(plans.files[ch.file].key)
                           : std::string(),
                     ch.coder, cost(ch.file), &trips);
      batch.parts_chunks += in_parts;
      chain(opens + trips);
    }
    out.push_back(batch);
  }
  return out;
}

}  // namespace dali_mesh
