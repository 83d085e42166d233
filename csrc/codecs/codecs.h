// dali_mesh: decoding one compressed chunk (Zarr v2/v3 compressors, HDF5 filter pipelines) into
// exactly the chunk's bytes, with the codecs of well-kept libraries: c-blosc2 (Blosc1 chunks),
// libzstd, liblz4, libdeflate or zlib, liblzf, libaec (szip). DALI-free, host only, thread-safe (per-thread contexts).
// The codecs are listed in one table (codec_table.inc: id, name, kind, library), each decoded by its
// own file (csrc/codecs/<codec>.cc); this header strings their steps together.
//
// A coder is a short program: checksum steps on the stored bytes (HDF5 Fletcher-32: verified and
// stripped), at most one decompressor, then steps that keep the size (HDF5 byte shuffle). The
// decompressor's output must be exactly the chunk's size: a stream that declares or yields another
// size (a decompression bomb, a truncated or foreign stream) is an error, never a short or padded
// chunk. Errors are returned as text (the caller names the file and chunk).
#ifndef DALI_MESH_CODECS_CODECS_H_
#define DALI_MESH_CODECS_CODECS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "codecs/codec_table.h"

namespace dali_mesh {

struct CodecStep {
  int64_t id = 0;  // a CodecId (codec_table.inc)
  int64_t arg = 0;
};

struct Coder {
  std::vector<CodecStep> steps;  // in decode order
  int64_t chunk_bytes = 0;       // the decoded chunk's size
  std::string fill;              // a missing chunk's value (one item, stored byte order); may be empty: zeros
};

// "" if `coder` is a program DecodeChunk runs (known codecs, checksums first, at most one
// decompressor, size-keeping steps after it, arguments in range), else why not.
std::string CheckCoder(const Coder &coder);

// Whether this build decodes codec `id` (its library, each optional at build time, was found; the
// planner then falls back, naming the missing library).
bool CodecAvailable(int64_t id);

// The codec's name as messages and the planner show it ("blosc", "zstd", ...).
const char *CodecName(int64_t id);

// The library that provides codec `id` ("c-blosc2", "libzstd", "liblz4", "libdeflate or zlib", "" for the
// built-in steps and unknown ids), for messages about a build without it.
const char *CodecLibrary(int64_t id);

// The bytes a decode of a chunk of `n` stored bytes by `coder` needs beside its output (DecodeChunk's
// `scratch`): the decoded chunk once more when two or more steps transform it (a shuffle after a
// decompressor: the shuffle's input), and a copy of the stored bytes for a Blosc step (an old chunk
// whose header c-blosc2 must read with its "don't split" flag set: AsBlosc1). INT64_MAX when that
// passes int64.
int64_t DecodeScratchBytes(const Coder &coder, int64_t n);

// Decodes the `n` stored bytes at `src` by `coder` into `out` (coder.chunk_bytes bytes). Returns ""
// or why the chunk is bad (corrupt stream, wrong size, checksum mismatch). `src` is not changed.
// `scratch`: DecodeScratchBytes(coder, n) bytes the caller holds and counts (a batch read ahead); without
// it, buffers of the calling thread's, kept for its next chunks (the reads of the batch being read, on
// DALI's threads: no allocation per chunk).
std::string DecodeChunk(const Coder &coder, const char *src, int64_t n, char *out, char *scratch = nullptr);

// As DecodeChunk, but only the bytes [first, second) of each of `ranges` (sorted, disjoint, inside
// the chunk) must be decoded, at their offsets in `out` (the rest of `out` is then undefined): a
// chunk of one Blosc step decodes only the blocks they touch (c-blosc2's getitem), every other coder
// the whole chunk. The checks of the stored bytes are DecodeChunk's, and so is `scratch`.
std::string DecodeChunkRanges(const Coder &coder, const char *src, int64_t n, char *out,
                              const std::vector<std::pair<int64_t, int64_t>> &ranges, char *scratch = nullptr);

// ---- a Blosc chunk's layout, for a read in parts ----------------------------------------------------
// A codec only DESCRIBES a chunk (its header -> block size and index; the blocks a decode of some
// ranges takes; whether the streams of those blocks lie in the bytes read) and decodes; whether a
// chunk is read in parts, what is fetched, merged and guessed, and in how many round trips, is the
// reader's fetch plan (csrc/reader/fetch_plan.h), which asks the codec at most three times a chunk.
//
// A Blosc chunk's layout: its header's block size, type size and flags, where its block index ends,
// the index itself, and the blocks a decode of the ranges it was described for takes.
struct BlockLayout {
  int64_t n = 0;        // the chunk's stored bytes (0: no layout)
  int64_t decoded = 0;  // its decoded bytes
  int32_t blocksize = 0;
  int ts = 0;
  bool memcpyed = false;
  bool splits = false;  // blocks split into type-size streams (BloscSplits)
  int64_t nblocks = 0;
  int64_t index_end = 0;        // the header and the block index end here
  std::vector<int64_t> starts;  // the block index (empty for a memcpyed chunk, or before it is read)
  // the runs of whole blocks a decode of the ranges takes (BlockRuns); empty: the chunk is decoded whole
  std::vector<std::pair<int64_t, int64_t>> runs;
};

// The bytes of a chunk's start that hold a Blosc header.
constexpr int64_t kBlockHeaderBytes = 16;

// Whether chunks of `coder` are ones a part of which may be decoded (one Blosc step, nothing else):
// a property of the coder, no call needed.
inline bool BlocksOfCoder(const Coder &coder) { return coder.steps.size() == 1 && coder.steps[0].id == kCodecBlosc; }

// The runs of whole blocks of `blocksize` that a decode of `ranges` (of a decoded chunk of `want`
// bytes) touches, runs closer than a block joined, into `runs`; false when the chunk is to be decoded
// whole (the runs cover three quarters of it or more, or its blocks do not fall on whole items).
bool BlockRuns(const std::vector<std::pair<int64_t, int64_t>> &ranges, int64_t want, int32_t blocksize, int ts,
               std::vector<std::pair<int64_t, int64_t>> *runs);

// What the bytes `have` (sorted, disjoint ranges of the chunk of `n` stored bytes by `coder` at `at`,
// its first kBlockHeaderBytes among them) show of its layout, for a decode of `ranges`:
enum class Described {
  kNotBlocks,    // not a chunk a part of which may be decoded (not a sound Blosc header, over 2 GiB, an index
                 // past its end, an index pointing outside its blocks): read whole, decoded whole
  kWholeDecode,  // its header: the decode of the ranges takes the whole chunk (layout without index or runs)
  kNeedIndex,    // its header: its index (up to layout->index_end) is not read yet
  kBlocks,       // header and index: layout->starts and layout->runs
};
Described DescribeBlocks(const Coder &coder, const char *at, const std::vector<std::pair<int64_t, int64_t>> &have,
                         int64_t n, const std::vector<std::pair<int64_t, int64_t>> &ranges, BlockLayout *layout);

// Whether the stored bytes `read` (sorted, disjoint ranges of the chunk at `at`) hold every byte
// c-blosc2 reads to decode layout.runs of the chunk of `layout` (DescribeBlocks' kBlocks): each
// touched block's streams walked as c-blosc2 walks them (streams may overlap another block's or run
// past the next block's start, and be valid Blosc: then not everything needed was read).
bool StreamsWereRead(const BlockLayout &layout, const char *at, const std::vector<std::pair<int64_t, int64_t>> &read);

// Fills `out` (coder.chunk_bytes) with a missing chunk's value.
void FillMissingChunk(const Coder &coder, char *out);

}  // namespace dali_mesh

#endif  // DALI_MESH_CODECS_CODECS_H_
