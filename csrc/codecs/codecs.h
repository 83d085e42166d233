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
#include <functional>
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

// Decodes the `n` stored bytes at `src` by `coder` into `out` (coder.chunk_bytes bytes). Returns ""
// or why the chunk is bad (corrupt stream, wrong size, checksum mismatch). `src` is not changed.
std::string DecodeChunk(const Coder &coder, const char *src, int64_t n, char *out);

// As DecodeChunk, but only the bytes [first, second) of each of `ranges` (sorted, disjoint, inside
// the chunk) must be decoded, at their offsets in `out` (the rest of `out` is then undefined): a
// chunk of one Blosc step decodes only the blocks they touch (c-blosc2's getitem), every other coder
// the whole chunk. The checks of the stored bytes are DecodeChunk's.
std::string DecodeChunkRanges(const Coder &coder, const char *src, int64_t n, char *out,
                              const std::vector<std::pair<int64_t, int64_t>> &ranges);

// Sorts `ranges` (byte ranges) and merges those that overlap or touch.
void MergeRanges(std::vector<std::pair<int64_t, int64_t>> *ranges);

// Whether a chunk of `n` stored bytes by `coder` may be read in parts for `ranges` (a Blosc chunk of
// at least `min_stored` bytes that the ranges cover less than three quarters of): its reads then
// start with its header and block index (ReadStored), and announcing the whole chunk would read it
// all. Below 256 KiB the extra reads of the index cost more than they save.
constexpr int64_t kMinPartsBytes = int64_t(256) << 10;
bool MayReadInParts(const Coder &coder, int64_t n, const std::vector<std::pair<int64_t, int64_t>> &ranges,
                    int64_t min_stored = kMinPartsBytes);

// Reads bytes [lo, hi) of a stored chunk to at + lo, or throws.
using StoredReader = std::function<void(int64_t lo, int64_t hi)>;
// Reads several such ranges (disjoint, sorted), or throws: a store may read them at once (an object
// store's requests in flight together).
using StoredRangesReader = std::function<void(const std::vector<std::pair<int64_t, int64_t>> &ranges)>;

// What a chunk read in parts showed of its layout (its Blosc header and block index), kept to guess
// where the parts of the next chunk of the same array lie: chunks of one array by one coder have the
// same block size and compress alike, so their blocks start at about the same fractions of the
// chunk. A guess only decides what is fetched first; what is decoded is always checked against the
// chunk's own header and index.
struct PartsGuess {
  int64_t n = 0;  // the stored bytes of the chunk it was learnt from (0: nothing learnt)
  int32_t blocksize = 0;
  int ts = 0;
  bool memcpyed = false;
  int64_t index_end = 0;
  std::vector<int64_t> starts;  // the block index
};

// Reads the stored bytes of a chunk of `n` stored bytes that DecodeChunkRanges (or, without
// `ranges`, DecodeChunk) needs, each at its offset in `at`, through `read`. A chunk that
// MayReadInParts for `ranges` is read in parts: its header and block index, the stored bytes of the
// blocks the ranges touch, then a check that every stream of those blocks lies in what was read
// (streams that overlap or run past the next block's start are valid Blosc; then the rest of the
// chunk is read). Every other chunk is read whole. Returns whether it was read in parts (the bytes
// of `at` outside the parts read are then not the chunk's). `min_stored`: MayReadInParts' (tests
// read small chunks in parts too). `read_many`, when given, reads several ranges together (else
// one `read` after another).
// `guess` (an earlier chunk's layout, see PartsGuess): the header and index are read together with
// the parts the guess places (each widened by a margin), in one `read_many`, so that a store for
// which a request is a round trip takes one instead of two; what the guess missed is read after.
// `learnt`: set to this chunk's layout when it was read in parts. `trips`: set to the number of
// reads in turn it took (`read_many` counting one).
bool ReadStored(const Coder &coder, int64_t n, const std::vector<std::pair<int64_t, int64_t>> *ranges, char *at,
                const StoredReader &read, int64_t min_stored = kMinPartsBytes,
                const StoredRangesReader &read_many = nullptr, const PartsGuess *guess = nullptr,
                PartsGuess *learnt = nullptr, int *trips = nullptr);

// Fills `out` (coder.chunk_bytes) with a missing chunk's value.
void FillMissingChunk(const Coder &coder, char *out);

}  // namespace dali_mesh

#endif  // DALI_MESH_CODECS_CODECS_H_
