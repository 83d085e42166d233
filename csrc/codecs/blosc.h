// dali_mesh: Blosc1 chunks (numcodecs Blosc, Zarr v3 blosc) as c-blosc2 decodes them, internal to
// csrc/codecs/: the header checks and the whole-chunk decode (blosc.cc), which the reads and
// decodes of a chunk's blocks (codecs.cc: the layout of a read in parts, DecodeChunkRanges) build on.
#ifndef DALI_MESH_CODECS_BLOSC_H_
#define DALI_MESH_CODECS_BLOSC_H_

#ifdef DALI_MESH_HAVE_BLOSC2
#include <blosc2.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dali_mesh::detail {

// This thread's c-blosc2 decompression context (one Blosc thread: DALI's threads decode chunks in
// parallel), or nullptr when c-blosc2 could not make one.
blosc2_context *BloscContext();

// Whether c-blosc1 splits a (not leftover) block of a chunk with header `h` into type-size streams:
// the header's "don't split" flag (0x10) clear, and, the rule from before that flag existed, type size
// <= 16 and block size / type size >= 128 (c-blosc 1.x blosc_d). numcodecs, which writes and reads
// Zarr's Blosc chunks, decodes by c-blosc1. c-blosc2 splits whenever the flag is clear: chunks that
// c-blosc wrote since it sets the flag agree, older ones may not (AsBlosc1 then sets the flag).
bool BloscSplits(const unsigned char *h, int32_t blocksize);

// The checks of a Blosc1 chunk's header before it is decoded (sizes, versions, flags, compressor);
// "" or why not. `*blocksize_out`: the header's block size, `*stored_typesize`: its type size (the
// item size the chunk was shuffled with: numcodecs writes the array's, Zarr v3's BloscCodec may
// write 1 for any dtype; c-blosc2 and numcodecs decode either, so any type size is taken).
std::string BloscHeader(const char *src, int64_t n, int64_t want, int32_t *blocksize_out, int *stored_typesize);

// `src` as c-blosc2 must see it to decode what c-blosc1 decodes: `src` itself, or (an old chunk whose
// split rules differ, see BloscSplits) a copy whose header says "don't split": in `room` (n bytes the
// caller holds) when given, else in `copy`.
const char *AsBlosc1(const char *src, int64_t n, int32_t blocksize, std::vector<char> *copy, char *room = nullptr);

// The whole chunk of `n` stored bytes at `src` decoded into exactly `want` bytes at `out`; "" or why not.
// `room`: n bytes for AsBlosc1's copy (else a buffer of the calling thread's, kept).
std::string Blosc(const char *src, int64_t n, char *out, int64_t want, char *room = nullptr);

}  // namespace dali_mesh::detail

#endif  // DALI_MESH_HAVE_BLOSC2

#endif  // DALI_MESH_CODECS_BLOSC_H_
