// dali_mesh: byte-range read plans, as the plan file holds them (written in Python by
// dali_mesh/plan/ and the formats' planners), and their loader. DALI-free, host only; the
// reader that executes them is csrc/reader/. A plan turns one file layout (shape, dtype, header,
// byte order, C/Fortran order) and one rank's window into
//   - units: (file offset, destination offset, bytes), each repeated `count` times at a file and a
//     destination step (a box's rows: a plan grows with the window's distinct runs, not its
//     elements), grouped into merged reads (one preadv each; the gaps between units of a group and
//     between a unit's runs land in a scratch buffer),
//   - a byte-swap flag (the units read are swapped in place, as soon as they are read),
//   - a finishing program: Fortran transpose, then per axis copies (reflect, symmetric, edge,
//     periodic halos wider than the domain) and constant fills, as dali_mesh.plan.window does.
// A plan set holds the distinct plans, the file table (store, key, version) and the items (one per
// sample id: its parts and finishing plan), and the coders and chunks of compressed reads. Errors
// are std::runtime_error whose text names the file and says what to do.
#ifndef DALI_MESH_PLAN_PLAN_H_
#define DALI_MESH_PLAN_PLAN_H_

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "codecs/codecs.h"
#include "plan/canonical_json.h"
#include "storage/byte_store.h"

namespace dali_mesh {

namespace detail {

// Throws std::runtime_error("read_windows: " + msg): the errors of the plan loader and the reader,
// as the read_windows operator reports them.
[[noreturn]] inline void Fail(const std::string &msg) { throw std::runtime_error("read_windows: " + msg); }

// The product of v[b..e) (1 when empty): a window's volume, the extents outside an axis.
inline int64_t Prod(const std::vector<int64_t> &v, size_t b, size_t e) {
  int64_t p = 1;
  for (size_t i = b; i < e; i++) p *= v[i];
  return p;
}

}  // namespace detail

// check_offset of a plan whose check is a JSON metadata file's canonical form (a Zarr array's
// .zarray or zarr.json): the file's size and raw bytes change with its attributes, which do not
// change how its chunks are read, so the check compares what does (see CanonicalJson).
constexpr int64_t kCheckJson = -1;

struct ReadPlan {
  int ndim = 0;
  int64_t itemsize = 0;
  int64_t swap_unit = 0;       // bytes of each value to reverse after reading (0: native order)
  bool fortran = false;        // units address a C-order staging of the reversed window shape
  // units read from a decoded chunk, not from a file: a part's `file` is then an index into the
  // plan set's chunk table and its `base` is added to the unit offsets inside the decoded chunk
  bool coded = false;
  std::vector<int64_t> shape;  // window shape (output, C order)
  std::vector<int64_t> file_off, dst_off, unit_bytes;  // sorted by file offset, spans disjoint
  // unit u is unit_count[u] runs of unit_bytes[u]: run j at file_off[u] + j * file_step[u] and
  // dst_off[u] + j * dst_step[u] (steps at least the run's bytes; a unit's runs are read in one call)
  std::vector<int64_t> unit_count, file_step, dst_step;
  std::vector<int64_t> group_begin, group_end;         // units [begin, end) read in one call
  int64_t check_offset = 0;    // where `check` lies in the file, or kCheckJson
  std::string check;           // bytes expected at check_offset (the .npy header, an HDF5
                               // dataset's object header), may be empty; with kCheckJson the
                               // canonical form (CanonicalJson) of the whole file (made so by
                               // LoadPlanSet)
  std::string fill;            // fill value in the output type's bytes (itemsize), may be empty
  // per axis: positions copied (dst <- src) and filled
  std::vector<std::vector<int64_t>> copy_dst, copy_src, fills;

  int64_t volume() const;
  int64_t bytes() const { return volume() * itemsize; }
  // unit u's file bytes from its first run's first byte to its last run's end
  int64_t span(int64_t u) const { return (unit_count[u] - 1) * file_step[u] + unit_bytes[u]; }
  int64_t file_end(int64_t u) const { return file_off[u] + span(u); }
  int64_t max_gap = 0;  // largest gap inside a group (the scratch size, up to 1 MiB: see ReadGroups)
};

// An object read by the plans: (store, key, version) and a check.
struct PlanFile {
  int64_t store = 0;                 // index in PlanSet::stores
  const ByteStore *byte_store = nullptr;  // that store (resolved when the plan is loaded)
  std::string key;                   // the object's key in it (a file's path)
  int64_t size = -1;                 // -1: not checked
  // the file's modification time (ns) when planned, -1: not checked. Set for HDF5 files: a file
  // rewritten in place with its datasets in another order can hold, at the planned address, a
  // byte-identical object header of another dataset, so any rewrite is refused there
  int64_t mtime_ns = -1;
  std::string tag;                   // an object store's ETag or generation when planned ("": none)
  // bytes the file must hold at check_offset at every read (-1: none): a Zarr shard's index, so that
  // a shard rewritten at the same size with its modification time put back (cp -p, a restore) is
  // refused rather than read through the index of its former version
  int64_t check_offset = -1;
  std::string check;
};

// A compressed chunk: `nbytes` stored bytes at `offset` of file `file`, decoded by coder `coder`
// (PlanSet::coders). nbytes -1: the chunk was never written (Zarr: its file is missing, and must
// still be missing when read); -2: an inner chunk that its shard's index (read when planned) lists
// as never written (the shard file is checked as any file); both read as the coder's fill value.
struct PlanChunk {
  int64_t file = 0, offset = 0, nbytes = 0, coder = 0;
};

// One read into a sample's window: the units of `plan` from `file`, at `base` added to every file
// offset. A sample of one file has one part; a Zarr sample has one per chunk file touched. With a
// coded plan, `file` is a chunk (PlanSet::chunks) and `base` an offset into its decoded bytes.
struct PlanPart {
  int64_t file = 0, plan = 0, base = 0;
  int64_t dst_base = 0;  // bytes into the item's window where this part's window starts (a step)
};

// A sample id: its parts [part_begin, part_end), then the finishing program of plan `finish`
// (which also gives the window shape; a part's window lies inside it, at its dst_base: one step of
// a forecast's stacked steps, or the whole window).
struct PlanItem {
  int64_t finish = 0, part_begin = 0, part_end = 0;
};

struct PlanSet {
  std::string source;  // the plan file it was loaded from (for messages)
  std::vector<std::string> stores;  // the byte stores' specs ("file": this machine's files)
  std::vector<ReadPlan> plans;
  std::vector<PlanFile> files;
  std::vector<PlanPart> parts;
  std::vector<PlanItem> items;
  std::vector<Coder> coders;
  std::vector<PlanChunk> chunks;
};

// Loads a plan file written by dali_mesh.plan (format "DMPLAN08": little-endian int64 words, the
// last one a checksum of the others, so that a corrupt file is refused rather than read from).
// A plan's JSON check (check_offset kCheckJson) is put in canonical form here, so that a writer may
// give the metadata file's bytes as they are (CanonicalJson is idempotent: a check written in
// canonical form stays as it is); one that is not a JSON object makes the plan file corrupt.
PlanSet LoadPlanSet(const std::string &path);

// The plan file's checksum (its last word) of the `n_words` little-endian words after the magic:
// sum of word_i * k_i mod 2^64, k_i odd, so that any change of one word changes the sum
// (dali_mesh._kernels.plan_checksum binds it for the Python writer). Not cryptographic: it catches corruption, not
// forgery (the plan directory is the user's own).
uint64_t PlanChecksum(const char *words, size_t n_words);

}  // namespace dali_mesh

#endif  // DALI_MESH_PLAN_PLAN_H_
