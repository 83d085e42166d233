// dali_mesh: the codec fuzz harness (tests/io/test_codec_fuzz.py builds it with AddressSanitizer and
// UndefinedBehaviorSanitizer and runs it over a corpus of corrupted chunks). Reads records from
// the file argv[1]: little-endian int64 n_steps, ids[n_steps], args[n_steps], chunk_bytes, n, then
// n bytes; decodes each (csrc/codecs/codecs.h) from a buffer of exactly n bytes (so that a read
// past the chunk is a heap overflow the sanitizer reports) and prints one line per record:
// "ok <FNV-1a of the output> <ranges>" or "err <reason>", where <ranges> says what decoding only
// the record's ranges of the chunk (DecodeChunkRanges, into another buffer of the chunk's size) gave:
// "same" (their bytes equal the whole decode's), "differ", or "refused" (a reason); then what
// decoding them from only the stored bytes a read in parts takes (ReadStored, into a buffer of
// stale bytes, as a thread's reused buffer holds) gave: "parts-same", "parts-differ",
// "parts-refused", "parts-whole" (the whole chunk was read), or "parts-bad" (a read outside the
// chunk); then the same read in parts started from a guess (BlockLayout: the layout the last record
// read in parts showed, or every third record one made of the record's own bytes, sizes and block
// starts of any value): "guess-same", "guess-differ", "guess-refused", "guess-whole", "guess-bad".
// A record's ranges (int64 count, then [first, second) pairs) follow its chunk; a count of
// -1 means two ranges as the reader asks for a rank's band of a whole field.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "codecs/codecs.h"
#include "reader/fetch_plan.h"

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  dali_mesh::BlockLayout last;  // what the last record read in parts showed
  int64_t record = -1;
  std::ifstream in(argv[1], std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t pos = 0;
  auto word = [&](int64_t *v) {
    if (pos + 8 > data.size()) return false;
    std::memcpy(v, data.data() + pos, 8);
    pos += 8;
    return true;
  };
  while (pos < data.size()) {
    record++;
    int64_t n_steps = 0, chunk_bytes = 0, n = 0;
    if (!word(&n_steps) || n_steps < 0 || n_steps > 16) return 3;
    dali_mesh::Coder coder;
    std::vector<int64_t> ids(n_steps), args(n_steps);
    for (auto &v : ids)
      if (!word(&v)) return 3;
    for (auto &v : args)
      if (!word(&v)) return 3;
    for (int64_t k = 0; k < n_steps; k++) coder.steps.push_back({ids[k], args[k]});
    if (!word(&chunk_bytes) || !word(&n) || n < 0 || pos + n > data.size()) return 3;
    coder.chunk_bytes = chunk_bytes;
    std::unique_ptr<char[]> src(new char[n ? n : 1]), out(new char[chunk_bytes > 0 ? chunk_bytes : 1]);
    std::memcpy(src.get(), data.data() + pos, n);
    pos += n;
    std::string why = dali_mesh::CheckCoder(coder);
    int64_t n_ranges = 0;
    if (!word(&n_ranges) || n_ranges < -1 || n_ranges > 4096) return 3;
    const int64_t w = chunk_bytes > 0 ? chunk_bytes : 0;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    if (n_ranges < 0) ranges = {{w / 16, w / 16 + w / 8}, {w / 2, w / 2 + w / 9}};
    for (int64_t k = 0; k < n_ranges; k++) {
      int64_t lo = 0, hi = 0;
      if (!word(&lo) || !word(&hi) || lo < 0 || hi <= lo || hi > w || (k && lo < ranges.back().second)) return 3;
      ranges.push_back({lo, hi});
    }
    std::string part_why = why;
    std::unique_ptr<char[]> part(new char[chunk_bytes > 0 ? chunk_bytes : 1]);
    if (part_why.empty()) part_why = dali_mesh::DecodeChunkRanges(coder, src.get(), n, part.get(), ranges);
    if (why.empty()) why = dali_mesh::DecodeChunk(coder, src.get(), n, out.get());
    if (!why.empty()) {
      std::printf("err %s\n", why.c_str());
      continue;
    }
    const char *parts = "refused";
    if (part_why.empty()) {
      parts = "same";
      for (const auto &r : ranges)
        if (std::memcmp(part.get() + r.first, out.get() + r.first, r.second - r.first) != 0) parts = "differ";
    }
    // a read in parts (ReadStored) into a buffer of `stale` bytes, from `guess` when given: what the
    // ranges decoded from it are ("<kind>-same", "-differ", "-refused", "-whole", "-bad")
    auto read_in_parts = [&](const std::string &kind, int stale, const dali_mesh::BlockLayout *guess,
                             dali_mesh::BlockLayout *learnt) {
      std::unique_ptr<char[]> stored(new char[n ? n : 1]), decoded(new char[chunk_bytes > 0 ? chunk_bytes : 1]);
      std::memset(stored.get(), stale, n);
      bool bad = false;
      auto one = [&](int64_t lo, int64_t hi) {
        if (lo < 0 || hi > n || lo > hi) {
          bad = true;
          return;
        }
        std::memcpy(stored.get() + lo, src.get() + lo, hi - lo);
      };
      auto many = [&](const std::vector<std::pair<int64_t, int64_t>> &rs) {
        for (const auto &r : rs) one(r.first, r.second);
      };
      const bool was_parts = dali_mesh::ReadStored(coder, n, &ranges, stored.get(), one, /*min_stored=*/0,
                                                   guess ? dali_mesh::StoredRangesReader(many) : nullptr, guess,
                                                   learnt);
      if (bad) return kind + "-bad";
      if (!was_parts) return kind + "-whole";
      if (!dali_mesh::DecodeChunkRanges(coder, stored.get(), n, decoded.get(), ranges).empty()) return kind + "-refused";
      for (const auto &r : ranges)
        if (std::memcmp(decoded.get() + r.first, out.get() + r.first, r.second - r.first) != 0) return kind + "-differ";
      return kind + "-same";
    };
    const std::string in_parts = read_in_parts("parts", 0x5a, nullptr, nullptr);
    // the same read in parts, started from a guess
    dali_mesh::BlockLayout guess = last;
    if (record % 3 == 2 && n >= 16) {  // a guess of any values, from the record's own bytes
      auto le32 = [&](int64_t at) {
        uint32_t v = 0;
        if (at + 4 <= n) std::memcpy(&v, src.get() + at, 4);
        return v;
      };
      guess.n = static_cast<int64_t>(le32(4)) * (record % 2 ? 3 : 1) + (record % 5 == 0 ? INT64_C(1) << 40 : 0);
      guess.blocksize = static_cast<int32_t>(le32(8) & 0x7fffffff);
      guess.ts = static_cast<unsigned char>(src[3]);
      guess.memcpyed = src[2] & 2;
      guess.index_end = 16 + 4 * static_cast<int64_t>(le32(12) % 64);
      guess.starts.clear();
      for (int64_t j = 0; j < 40; j++) guess.starts.push_back(le32(16 + 4 * j) ^ (j * 7919));
    }
    dali_mesh::BlockLayout learnt;
    const std::string guessed = read_in_parts("guess", 0xa5, guess.n > 0 ? &guess : nullptr, &learnt);
    if (learnt.n > 0) last = learnt;
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; i < chunk_bytes; i++) h = (h ^ static_cast<unsigned char>(out[i])) * 1099511628211ull;
    std::printf("ok %016llx %s %s %s\n", static_cast<unsigned long long>(h), parts, in_parts.c_str(), guessed.c_str());
  }
  return 0;
}
