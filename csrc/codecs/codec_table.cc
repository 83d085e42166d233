// dali_mesh: the codec table's rows (codec_table.inc) with this build's decoders.
#include "codecs/codec_table.h"

#include <string>

namespace dali_mesh {

namespace {

const CodecInfo *Rows(int64_t *n) {
  // built at first use: each decoder is its file's function (a static initialiser of another file
  // may not have run yet)
  static const CodecInfo kRows[] = {
#define DM_CODEC(id, symbol, name, kind, library, cmake_libs, source) \
  {id, name, CodecKind::k##kind, library, symbol##Decoder()},
#include "codecs/codec_table.inc"
#undef DM_CODEC
  };
  *n = static_cast<int64_t>(sizeof(kRows) / sizeof(kRows[0]));
  return kRows;
}

const char *KindName(CodecKind kind) {
  switch (kind) {
    case CodecKind::kDecompressor: return "decompressor";
    case CodecKind::kChecksum: return "checksum";
    case CodecKind::kKeepsSize: return "keeps_size";
  }
  return "";
}

}  // namespace

const CodecInfo *CodecRows(int64_t *n) { return Rows(n); }

const CodecInfo *FindCodec(int64_t id) {
  int64_t n = 0;
  const CodecInfo *rows = Rows(&n);
  for (int64_t k = 0; k < n; k++)
    if (rows[k].id == id) return &rows[k];
  return nullptr;
}

std::string CodecTableJson() {
  int64_t n = 0;
  const CodecInfo *rows = Rows(&n);
  // names and libraries are plain ASCII without quotes or backslashes (the table's own text)
  std::string s = "[";
  for (int64_t k = 0; k < n; k++) {
    const CodecInfo &c = rows[k];
    if (k) s += ',';
    s += "{\"id\":" + std::to_string(c.id) + ",\"name\":\"" + c.name + "\",\"kind\":\"" + KindName(c.kind) +
         "\",\"library\":\"" + c.library + "\",\"available\":" + (c.decoder ? "true" : "false") + "}";
  }
  return s + "]";
}

}  // namespace dali_mesh
