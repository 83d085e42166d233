// dali_mesh: the C entry points of the codecs (csrc/codecs/), in libdali_mesh_kernels.so and bound
// in dali_mesh/_kernels/codec_api.py: the codec table (the one list of codecs, which Python's CODECS come
// from), and a chunk decoded as the reader decodes it (the tests hold it to numcodecs and h5py).
//
// Functions that take `err` return a count or size (>= 0) on success, or -1 with a message in
// err[0..err_len).
#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "c_api/export.h"
#include "codecs/codecs.h"
#include "reader/fetch_plan.h"

using dali_mesh::c_api::Fail;

// The codec table (csrc/codecs/codec_table.inc) as JSON: [{"id", "name", "kind", "library",
// "available"}, ...] (CodecTableJson). Returns the text's length n; the text and a NUL are written
// to out[0..out_size) only when out_size > n (ask again with a buffer of n + 1).
DM_EXPORT int64_t dali_mesh_codec_table(char *out, int64_t out_size) {
  return dali_mesh::c_api::CopyText(dali_mesh::CodecTableJson(), out, out_size);
}

// Whether codec `id` (a CodecId of the table) is in this build: 1 yes, 0 no (its library was not found
// at build time). The planner asks before it plans a coded read.
DM_EXPORT int dali_mesh_codec_available(int64_t id) { return dali_mesh::CodecAvailable(id) ? 1 : 0; }

namespace {
// The coder of steps ids[k], args[k] (decode order) for chunks of `chunk_bytes`.
dali_mesh::Coder CoderOf(const int64_t *ids, const int64_t *args, int64_t n_steps, int64_t chunk_bytes) {
  dali_mesh::Coder coder;
  for (int64_t k = 0; k < n_steps; k++) coder.steps.push_back({ids[k], args[k]});
  coder.chunk_bytes = chunk_bytes;
  return coder;
}
}  // namespace

// Decodes the n stored bytes at `src` by the coder (steps ids[k], args[k] in decode order,
// chunk_bytes, a fill value) into out[0..chunk_bytes), as the reader decodes a chunk. Returns 0, or
// -1 with the reason in err (a coder that cannot run, a corrupt chunk).
DM_EXPORT int64_t dali_mesh_decode_chunk(const int64_t *ids, const int64_t *args, int64_t n_steps,
                                         int64_t chunk_bytes, const char *src, int64_t n, char *out,
                                         char *err, int64_t err_size) {
  try {
    const dali_mesh::Coder coder = CoderOf(ids, args, n_steps, chunk_bytes);
    std::string why = dali_mesh::CheckCoder(coder);
    if (why.empty()) why = dali_mesh::DecodeChunk(coder, src, n, out);
    if (!why.empty()) return Fail(why, err, err_size);
    return 0;
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_size);
  }
}

// As dali_mesh_decode_chunk, but only the byte ranges ranges[2k]..ranges[2k+1] (sorted, disjoint)
// of the chunk must be decoded, as the reader decodes a batch's ranges: its stored bytes are taken
// from `src` as a read does (ReadStored: a Blosc chunk in parts), into a buffer whose other bytes
// are `stale` (as a thread's reused buffer holds another chunk's), then DecodeChunkRanges writes the
// ranges' bytes at their offsets in out[0..chunk_bytes). `min_parts`: the smallest stored size read
// in parts (-1: the reader's). With `prev` (n_prev stored bytes of another chunk of the same coder),
// `prev` is read first for the same ranges and the layout it shows is the guess the read of `src`
// starts from (a BlockLayout: as a remote store's reads do). Returns 2 * (the reads in turn the chunk
// took, a read of several ranges counting one) + 1 when it was read in parts (+ 0 when whole), or -1
// with the reason.
DM_EXPORT int64_t dali_mesh_decode_chunk_ranges(const int64_t *ids, const int64_t *args, int64_t n_steps,
                                                int64_t chunk_bytes, const char *src, int64_t n,
                                                const int64_t *ranges, int64_t n_ranges, int stale,
                                                int64_t min_parts, const char *prev, int64_t n_prev, char *out,
                                                char *err, int64_t err_size) {
  try {
    const dali_mesh::Coder coder = CoderOf(ids, args, n_steps, chunk_bytes);
    std::vector<std::pair<int64_t, int64_t>> rs;
    for (int64_t k = 0; k < n_ranges; k++) {
      const int64_t lo = ranges[2 * k], hi = ranges[2 * k + 1];
      if (lo < 0 || hi <= lo || hi > chunk_bytes || (k && lo < rs.back().second))
        return Fail("ranges must be sorted, disjoint, non-empty and inside the chunk", err, err_size);
      rs.push_back({lo, hi});
    }
    std::string why = dali_mesh::CheckCoder(coder);
    if (!why.empty()) return Fail(why, err, err_size);
    const int64_t min_stored = min_parts < 0 ? dali_mesh::kMinPartsBytes : min_parts;
    // a read of `from`'s bytes into `to` as a store's reads land (one range, or several together)
    auto reads = [](const char *from, int64_t size, char *to) {
      auto one = [=](int64_t lo, int64_t hi) {
        if (lo < 0 || hi > size || lo > hi) throw std::runtime_error("a read outside the chunk");
        std::memcpy(to + lo, from + lo, hi - lo);
      };
      auto many = [=](const std::vector<std::pair<int64_t, int64_t>> &parts) {
        for (const auto &p : parts) one(p.first, p.second);
      };
      return std::make_pair(dali_mesh::StoredReader(one), dali_mesh::StoredRangesReader(many));
    };
    dali_mesh::BlockLayout guess;
    if (prev) {
      std::vector<char> before(n_prev, static_cast<char>(stale));
      const auto [one, many] = reads(prev, n_prev, before.data());
      dali_mesh::ReadStored(coder, n_prev, &rs, before.data(), one, min_stored, many, nullptr, &guess);
    }
    std::vector<char> stored(n, static_cast<char>(stale));
    const auto [one, many] = reads(src, n, stored.data());
    int trips = 0;
    const bool parts = dali_mesh::ReadStored(coder, n, &rs, stored.data(), one, min_stored, many,
                                             guess.n > 0 ? &guess : nullptr, nullptr, &trips);
    why = dali_mesh::DecodeChunkRanges(coder, stored.data(), n, out, rs);
    if (!why.empty()) return Fail(why, err, err_size);
    return 2 * int64_t{trips} + (parts ? 1 : 0);
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_size);
  }
}
