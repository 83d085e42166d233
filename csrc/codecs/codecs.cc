// dali_mesh: decoding compressed chunks (see codecs.h): the coder's steps strung together, each
// codec's decoder from the table (codec_table.h; one file per codec); and a Blosc chunk read and
// decoded in its blocks (the header checks and the whole decode are blosc.cc's). Each library is
// optional at build time (DALI_MESH_HAVE_BLOSC2, _ZSTD, ...: CMakeLists.txt from the table), so
// that a machine without one still builds.
#include "codecs/codecs.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "codecs/blosc.h"
#include "codecs/codec_util.h"

namespace dali_mesh {

namespace {

using detail::Le32;
using detail::Num;

bool IsKind(int64_t id, CodecKind kind) {
  const CodecInfo *c = FindCodec(id);
  return c && c->kind == kind;
}

bool IsDecompressor(int64_t id) { return IsKind(id, CodecKind::kDecompressor); }

bool IsChecksum(int64_t id) { return IsKind(id, CodecKind::kChecksum); }

#ifdef DALI_MESH_HAVE_BLOSC2
using detail::AsBlosc1;
using detail::Blosc;
using detail::BloscContext;
using detail::BloscHeader;
using detail::BloscSplits;

// Only the byte ranges `ranges` of a Blosc chunk (sorted, disjoint, inside `want`): c-blosc2 decodes
// the whole blocks they touch (BlockRuns), each block straight into its place in `out` where the
// blocks are large (one blosc2_getitem_bytes_ctx call per block: no copy through c-blosc2's scratch),
// a run of small blocks in one call; when they cover most of the chunk, the whole chunk as by Blosc.
std::string BloscRanges(const char *src, int64_t n, char *out, int64_t want,
                        const std::vector<std::pair<int64_t, int64_t>> &ranges, char *room) {
  int32_t blocksize = 0;
  int ts = 0;
  std::string why = BloscHeader(src, n, want, &blocksize, &ts);
  if (!why.empty()) return why;
  std::vector<std::pair<int64_t, int64_t>> merged;
  if (!BlockRuns(ranges, want, blocksize, ts, &merged)) return Blosc(src, n, out, want, room);
  blosc2_context *ctx = BloscContext();
  if (ctx == nullptr) return "c-blosc2 could not make a decompression context";
  thread_local std::vector<char> copy;
  src = AsBlosc1(src, n, blocksize, &copy, room);
  const int64_t step = blocksize >= (int64_t(64) << 10) ? blocksize : want;
  for (const auto &r : merged) {
    for (int64_t lo = r.first; lo < r.second; lo += step) {
      const int64_t len = std::min(r.second, lo + step) - lo;
      const int got = blosc2_getitem_bytes_ctx(ctx, src, static_cast<int32_t>(n), static_cast<int32_t>(lo),
                                               static_cast<int32_t>(len), out + lo, static_cast<int32_t>(len));
      if (got < 0) return "c-blosc2 failed to decode it (error " + Num(got) + ")";
      if (got != len) return "c-blosc2 decoded " + Num(got) + " bytes of a range of " + Num(len);
    }
  }
  return "";
}

// Sorted, disjoint ranges: whether [lo, hi) lies inside one of them.
bool Inside(const std::vector<std::pair<int64_t, int64_t>> &have, int64_t lo, int64_t hi) {
  if (lo >= hi) return true;
  auto it = std::upper_bound(have.begin(), have.end(), std::make_pair(lo, INT64_MAX));
  return it != have.begin() && std::prev(it)->first <= lo && hi <= std::prev(it)->second;
}

// The end of block `j`'s streams in a Blosc1 chunk that is not memcpyed, read as c-blosc2's blosc_d
// reads them (c-blosc2 3.3.5): `nstreams` streams from `start`, each a little-endian int32 size c then
// c bytes (c > 0), nothing (c == 0: zeros) or one token byte (c < 0: a run). `inside(lo, hi)` says
// whether the bytes [lo, hi) of the chunk were read; -1 when a stream reaches bytes that were not
// (streams that overlap another block's, or run past the next block's start), or past `n`.
template <typename Inside>
int64_t BloscBlockEnd(const unsigned char *chunk, int64_t n, int64_t start, int nstreams, const Inside &inside) {
  int64_t pos = start;
  for (int s = 0; s < nstreams; s++) {
    if (pos + 4 > n || !inside(pos, pos + 4)) return -1;
    const int32_t c = static_cast<int32_t>(Le32(chunk + pos));
    pos += 4;
    const int64_t body = c > 0 ? c : (c < 0 ? 1 : 0);
    if (pos + body > n || !inside(pos, pos + body)) return -1;
    pos += body;
  }
  return pos;
}
#endif

// The bytes of the chunk DecodeChunk decodes between two steps: none when one step (after the checksums)
// transforms the stored bytes, a chunk when more do (they write into out and the intermediate by turns).
int64_t IntermediateBytes(const Coder &coder) {
  const auto transforms = std::count_if(coder.steps.begin(), coder.steps.end(),
                                        [](const CodecStep &s) { return !IsChecksum(s.id); });
  return transforms >= 2 ? coder.chunk_bytes : 0;
}

// The decompressor `id`'s output: exactly `want` bytes, or why not. `room`: Blosc's (Blosc's own when null).
std::string Decompress(int64_t id, int64_t arg, const char *src, int64_t n, char *out, int64_t want, char *room) {
#ifdef DALI_MESH_HAVE_BLOSC2
  if (id == kCodecBlosc && room != nullptr) return Blosc(src, n, out, want, room);
#else
  (void)room;
#endif
  const CodecInfo *c = FindCodec(id);
  if (c && c->decoder && c->decoder->decode) return c->decoder->decode(src, n, out, want, arg);
  return std::string(CodecName(id)) + " is not in this build (" + CodecLibrary(id) + " was not found)";
}

}  // namespace

const char *CodecName(int64_t id) {
  const CodecInfo *c = FindCodec(id);
  return c ? c->name : "an unknown codec";
}

const char *CodecLibrary(int64_t id) {
  const CodecInfo *c = FindCodec(id);
  return c ? c->library : "";
}

bool CodecAvailable(int64_t id) {
  const CodecInfo *c = FindCodec(id);
  return c && c->decoder;
}

std::string CheckCoder(const Coder &coder) {
  if (coder.chunk_bytes < 0) return "a negative chunk size";
  int stage = 0;  // 0: checksums, 1: after the decompressor
  for (const auto &s : coder.steps) {
    const CodecInfo *c = FindCodec(s.id);
    if (c == nullptr) return "codec id " + Num(s.id) + " is unknown";
    if (c->decoder == nullptr) return std::string(c->name) + " is not in this build (" + c->library + ")";
    const bool arg_ok = c->decoder->arg_ok == nullptr || c->decoder->arg_ok(s.arg);
    switch (c->kind) {
      case CodecKind::kChecksum:
        if (stage != 0) return "a checksum after the decompressor";
        break;
      case CodecKind::kDecompressor:
        if (stage != 0) return "two decompressors";
        [[fallthrough]];
      case CodecKind::kKeepsSize:  // nothing but more size-keeping steps may follow
        if (!arg_ok) return std::string(c->name) + " " + c->decoder->arg_name + " " + Num(s.arg);
        stage = 1;
        break;
    }
  }
  if (!coder.fill.empty() && coder.chunk_bytes % static_cast<int64_t>(coder.fill.size()))
    return "a fill value of " + Num(coder.fill.size()) + " bytes for a chunk of " + Num(coder.chunk_bytes);
  return "";
}

#ifdef DALI_MESH_HAVE_BLOSC2
// BloscRanges decodes the runs BlockRuns names: each range widened to the blocks it touches, runs
// closer than a block joined.
//
// Whole blocks only, because c-blosc2's blosc2_getitem_bytes_ctx (c-blosc2 3.3.5, the blosc2 4.14.1
// wheel) returns wrong bytes with no error for a range exactly one block long, or exactly the last
// block's length, that crosses a block boundary: _blosc_getitem takes the block it reaches second for
// "the single block asked" (startb == 0 && bsize == nitems_bytes) and decodes it over the start of
// the output (tests/io/test_blosc_ranges.py holds the reproducer). A run that starts on a block and
// ends on a block (or the chunk's end) never meets that condition except when it is that one block.
bool BlockRuns(const std::vector<std::pair<int64_t, int64_t>> &ranges, int64_t want, int32_t blocksize, int ts,
               std::vector<std::pair<int64_t, int64_t>> *merged) {
  merged->clear();
  if (ts < 1 || blocksize < 1 || blocksize % ts || want % ts) return false;
  int64_t covered = 0;
  for (auto r : ranges) {
    r.first = std::max<int64_t>(0, r.first) / blocksize * blocksize;
    r.second = std::min(want, (r.second + blocksize - 1) / blocksize * blocksize);
    if (r.first >= r.second) continue;
    if (!merged->empty() && r.first - merged->back().second < blocksize) {
      merged->back().second = std::max(merged->back().second, r.second);
    } else {
      merged->push_back(r);
    }
  }
  for (const auto &r : *merged) covered += r.second - r.first;
  return covered * 4 < want * 3;
}

namespace {

// The layout a chunk's header declares (its index not read), or false (see Described::kNotBlocks).
bool HeaderLayout(const Coder &coder, const char *head, int64_t n, BlockLayout *l) {
  *l = BlockLayout();
  if (!BlocksOfCoder(coder) || coder.chunk_bytes > INT32_MAX) return false;
  const int64_t want = coder.chunk_bytes;
  if (!BloscHeader(head, n, want, &l->blocksize, &l->ts).empty()) return false;
  const auto *h = reinterpret_cast<const unsigned char *>(head);
  l->n = n;
  l->decoded = want;
  l->memcpyed = h[2] & 0x02;
  l->splits = BloscSplits(h, l->blocksize);
  l->nblocks = (want + l->blocksize - 1) / l->blocksize;
  l->index_end = kBlockHeaderBytes + (l->memcpyed ? 0 : 4 * l->nblocks);
  return l->index_end <= n;
}

// Reads the block index of the chunk at `at` (its bytes [0, index_end) read) into layout->starts;
// false for an index that points outside the chunk's blocks.
bool ReadBlockIndex(const char *at, BlockLayout *l) {
  l->starts.clear();
  if (l->memcpyed) return true;
  const auto *h = reinterpret_cast<const unsigned char *>(at);
  l->starts.resize(l->nblocks);
  for (int64_t j = 0; j < l->nblocks; j++) {
    l->starts[j] = Le32(h + kBlockHeaderBytes + 4 * j);
    if (l->starts[j] < l->index_end || l->starts[j] >= l->n) return false;
  }
  return true;
}

}  // namespace

Described DescribeBlocks(const Coder &coder, const char *at, const std::vector<std::pair<int64_t, int64_t>> &have,
                         int64_t n, const std::vector<std::pair<int64_t, int64_t>> &ranges, BlockLayout *l) {
  if (!Inside(have, 0, std::min(n, kBlockHeaderBytes)) || !HeaderLayout(coder, at, n, l)) {
    *l = BlockLayout();
    return Described::kNotBlocks;
  }
  if (!BlockRuns(ranges, coder.chunk_bytes, l->blocksize, l->ts, &l->runs)) {
    l->runs.clear();
    return Described::kWholeDecode;
  }
  if (!Inside(have, 0, l->index_end)) return Described::kNeedIndex;
  if (!ReadBlockIndex(at, l)) {
    *l = BlockLayout();
    return Described::kNotBlocks;
  }
  return Described::kBlocks;
}

bool StreamsWereRead(const BlockLayout &l, const char *at, const std::vector<std::pair<int64_t, int64_t>> &read) {
  if (l.memcpyed) return true;  // the stored bytes of its runs are every byte they take
  const auto *h = reinterpret_cast<const unsigned char *>(at);
  for (const auto &r : l.runs) {
    for (int64_t j = r.first / l.blocksize; j <= (r.second - 1) / l.blocksize && j < l.nblocks; j++) {
      const bool leftover = j == l.nblocks - 1 && l.decoded % l.blocksize != 0;
      const int nstreams = (l.splits && !leftover) ? l.ts : 1;
      const int64_t start = Le32(h + kBlockHeaderBytes + 4 * j);
      if (BloscBlockEnd(h, l.n, start, nstreams, [&](int64_t lo, int64_t hi) { return Inside(read, lo, hi); }) < 0)
        return false;
    }
  }
  return true;
}
#else
bool BlockRuns(const std::vector<std::pair<int64_t, int64_t>> &, int64_t, int32_t, int,
               std::vector<std::pair<int64_t, int64_t>> *runs) {
  runs->clear();
  return false;
}
Described DescribeBlocks(const Coder &, const char *, const std::vector<std::pair<int64_t, int64_t>> &, int64_t,
                         const std::vector<std::pair<int64_t, int64_t>> &, BlockLayout *l) {
  *l = BlockLayout();
  return Described::kNotBlocks;
}
bool StreamsWereRead(const BlockLayout &, const char *, const std::vector<std::pair<int64_t, int64_t>> &) {
  return false;
}
#endif

int64_t DecodeScratchBytes(const Coder &coder, int64_t n) {
  int64_t bytes = IntermediateBytes(coder);
  const bool blosc = std::any_of(coder.steps.begin(), coder.steps.end(), [](const CodecStep &s) {
    return s.id == kCodecBlosc;
  });
  if (blosc && __builtin_add_overflow(bytes, std::max<int64_t>(n, 0), &bytes)) return INT64_MAX;
  return bytes;
}

std::string DecodeChunkRanges(const Coder &coder, const char *src, int64_t n, char *out,
                              const std::vector<std::pair<int64_t, int64_t>> &ranges, char *scratch) {
#ifdef DALI_MESH_HAVE_BLOSC2
  // (one step: no intermediate chunk, Blosc's copy at the start of the scratch)
  if (BlocksOfCoder(coder) && coder.chunk_bytes <= INT32_MAX)
    return BloscRanges(src, n, out, coder.chunk_bytes, ranges, scratch);
#endif
  // every other coder decodes the whole chunk, whose size is then checked: a Zstd frame, say,
  // could be decoded only up to the ranges' end, but the blocks before it do not state their
  // decoded sizes, so a corrupt block could shift the bytes decoded after it unseen (the frame's
  // declared size, checked at its end, is what catches that)
  (void)ranges;
  return DecodeChunk(coder, src, n, out, scratch);
}

std::string DecodeChunk(const Coder &coder, const char *src, int64_t n, char *out, char *scratch) {
  const int64_t want = coder.chunk_bytes;
  // the stored bytes after the checksums, then the decompressor's output; `out` is the last step's.
  // The intermediate chunk and Blosc's copy: the caller's scratch (DecodeScratchBytes: the intermediate
  // first, when there is one), or this thread's, kept: a batch read ahead decodes on any of the
  // process's background threads, and each kept a chunk's worth for its life (Zarr v2 shuffle and zlib,
  // 4 MiB chunks, 8 batches ahead in 16 MiB: peak RSS 86-106 MiB over the read without read-ahead)
  thread_local std::vector<char> tmp;
  char *blosc_room = nullptr;
  if (scratch != nullptr)
    blosc_room = scratch + IntermediateBytes(coder);
  const char *cur = src;
  int64_t size = n;
  size_t k = 0;
  for (; k < coder.steps.size() && IsChecksum(coder.steps[k].id); k++) {
    const CodecInfo *c = FindCodec(coder.steps[k].id);
    const char *what = c->decoder && c->decoder->label ? c->decoder->label : c->name;
    if (size < 4) return "a chunk of " + Num(size) + " bytes has no room for its " + what + " checksum";
    size -= 4;
    const auto *b = reinterpret_cast<const unsigned char *>(cur);
    if (c->decoder == nullptr) continue;  // not in this build (CheckCoder refuses such a coder)
    std::string why = c->decoder->verify(b, size, Le32(b + size));
    if (!why.empty()) return why;
  }
  // the steps left: [decompressor] then size-keeping steps, each into out or tmp so that the last
  // one lands in out
  const size_t left = coder.steps.size() - k;
  if (left == 0) {
    if (size != want) return "a chunk of " + Num(size) + " stored bytes, not the " + Num(want) + " of a raw chunk";
    std::memcpy(out, cur, want);
    return "";
  }
  for (size_t s = k; s < coder.steps.size(); s++) {
    const CodecStep &step = coder.steps[s];
    // the destination: out and tmp by turns, counted back from the last step (into out), so that no
    // step writes over its own source and none copies its source aside
    char *dst = out;
    if ((coder.steps.size() - 1 - s) % 2) {
      if (scratch != nullptr) {
        dst = scratch;
      } else {
        tmp.resize(want);
        dst = tmp.data();
      }
    }
    if (IsDecompressor(step.id)) {
      std::string err = Decompress(step.id, step.arg, cur, size, dst, want, blosc_room);
      if (!err.empty()) return err;
    } else {
      if (size != want) return "a chunk of " + Num(size) + " bytes before " + CodecName(step.id) + ", not " + Num(want);
      const CodecInfo *c = FindCodec(step.id);
      if (c && c->decoder && c->decoder->decode) {
        std::string err = c->decoder->decode(cur, size, dst, want, step.arg);
        if (!err.empty()) return err;
      }
    }
    cur = dst;
    size = want;
  }
  return "";
}

void FillMissingChunk(const Coder &coder, char *out) {
  const int64_t n = coder.chunk_bytes, es = coder.fill.size();
  if (es == 0) {
    std::memset(out, 0, n);
    return;
  }
  for (int64_t i = 0; i + es <= n; i += es) std::memcpy(out + i, coder.fill.data(), es);
}

}  // namespace dali_mesh
