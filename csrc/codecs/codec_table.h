// dali_mesh: the codec table (codec_table.inc) in C++: the codec ids, what each codec is, and its
// decoder in this build. DALI-free, host only.
#ifndef DALI_MESH_CODECS_CODEC_TABLE_H_
#define DALI_MESH_CODECS_CODEC_TABLE_H_

#include <cstdint>
#include <string>

namespace dali_mesh {

// Codec ids as the plan file writes them: kCodecBlosc, kCodecZstd, ... (the table's first column).
enum CodecId : int64_t {
#define DM_CODEC(id, symbol, name, kind, library, cmake_libs, source) kCodec##symbol = id,
#include "codecs/codec_table.inc"
#undef DM_CODEC
};

// What a step of a coder does (the table's kind column).
enum class CodecKind {
  kDecompressor,  // stored bytes -> exactly the chunk's bytes; at most one per coder
  kChecksum,      // the last 4 bytes (little-endian) check the others: verified, then stripped
  kKeepsSize,     // a size-keeping step after the decompressor (HDF5 byte shuffle)
};

// A codec's decoder: each codec's file (csrc/codecs/<source>.cc) defines one, in a build that has
// its library.
struct CodecDecoder {
  // kDecompressor: the n stored bytes at `src` decoded into exactly `want` bytes at `out`;
  // kKeepsSize: n == want bytes transformed. Returns "" or why not (the caller names the chunk).
  std::string (*decode)(const char *src, int64_t n, char *out, int64_t want, int64_t arg) = nullptr;
  // kChecksum: "" when `stored` is the checksum of data[0..n), else why not.
  std::string (*verify)(const unsigned char *data, int64_t n, uint32_t stored) = nullptr;
  // whether a step's argument is in range (nullptr: any; detail::NoArgument: 0 only), and what
  // CheckCoder's message calls it
  bool (*arg_ok)(int64_t arg) = nullptr;
  const char *arg_name = "argument";
  const char *label = nullptr;  // how messages name it (nullptr: its name)
};

// One row of the table, with this build's decoder.
struct CodecInfo {
  int64_t id;
  const char *name;
  CodecKind kind;
  const char *library;          // "" for a step built in
  const CodecDecoder *decoder;  // nullptr: its library is not in this build
};

// Each codec's decoder, defined in its file: nullptr in a build without its library.
#define DM_CODEC(id, symbol, name, kind, library, cmake_libs, source) const CodecDecoder *symbol##Decoder();
#include "codecs/codec_table.inc"
#undef DM_CODEC

// How a codec's file registers its decoder (in namespace dali_mesh): DM_REGISTER_DECODER(Zstd,
// .decode = Zstd, ...) with CodecDecoder's fields, or DM_NO_DECODER(Zstd) in a build without its
// library.
#define DM_REGISTER_DECODER(symbol, ...)             \
  const CodecDecoder *symbol##Decoder() {            \
    static const CodecDecoder decoder{__VA_ARGS__};  \
    return &decoder;                                 \
  }
#define DM_NO_DECODER(symbol) \
  const CodecDecoder *symbol##Decoder() { return nullptr; }

// The row of codec `id`, or nullptr for an id the table does not have.
const CodecInfo *FindCodec(int64_t id);

// The table, in its order: n rows at the pointer returned.
const CodecInfo *CodecRows(int64_t *n);

// The table as JSON, a list of {"id", "name", "kind" ("decompressor", "checksum" or
// "keeps_size"), "library", "available"}: what dali_mesh._kernels.codec_table() reads.
std::string CodecTableJson();

}  // namespace dali_mesh

#endif  // DALI_MESH_CODECS_CODEC_TABLE_H_
