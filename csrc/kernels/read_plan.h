// dali_mesh: byte-range read plans (made in Python by dali_mesh/io/read_plan.py and the formats' planners) and their executor,
// DALI-free. A plan turns one file layout (shape, dtype, header, byte order, C/Fortran order) and
// one rank's window into
//   - units: (file offset, destination offset, bytes), each repeated `count` times at a file and a
//     destination step (a box's rows: a plan grows with the window's distinct runs, not its
//     elements), grouped into merged reads (one preadv each; the gaps between units of a group and
//     between a unit's runs land in a scratch buffer),
//   - a byte-swap flag (the units read are swapped in place, as soon as they are read),
//   - a finishing program: Fortran transpose, then per axis copies (reflect, symmetric, edge,
//     periodic halos wider than the domain) and constant fills, as dali_mesh.io._plan does.
// A plan set holds the distinct plans, the file table (path, expected size) and the items (one per
// sample id: its parts and finishing plan). Errors are std::runtime_error
// whose text names the file and says what to do.
#ifndef DALI_MESH_READ_PLAN_H_
#define DALI_MESH_READ_PLAN_H_

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <memory>

#include "kernels/codecs.h"
#include "kernels/slice_args.h"
#include "storage/byte_store.h"
#include "storage/reads_in_flight.h"

namespace dali_mesh {

// check_offset of a plan whose check is a JSON metadata file's canonical form (a Zarr array's
// .zarray or zarr.json): the file's size and raw bytes change with its attributes, which do not
// change how its chunks are read, so the check compares what does (see CanonicalJson).
constexpr int64_t kCheckJson = -1;

// A JSON object's canonical form for the "file changed since the plan" check: whitespace outside
// strings dropped, the top-level members sorted by their key (as written, quotes included), the
// members "attributes" and "dimension_names" left out (Zarr v3 keeps user attributes and axis names
// in zarr.json; neither changes the bytes of a chunk). Values are kept as written. Returns false
// when `text` is not one JSON object (as far as this scan can tell). The only implementation: the
// Python planner calls it through dali_mesh._kernels.canonical_json.
bool CanonicalJson(const std::string &text, std::string *out);

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

// Loads a plan file written by dali_mesh.io.read_plan (format "DMPLAN07": little-endian int64 words, the
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

// A plan file's object opened in its store and checked against the plan (its size, modification
// time, tag, check bytes and the plan's header or metadata check). Closes on destruction.
class OpenFile {
 public:
  void Open(const PlanFile &file, const ReadPlan &plan, const std::string &first_path);
  // Fails naming the file when it is not as it was opened (device, inode, size, modification or
  // change time; an object's tag): it was rewritten in place while it was read, and what was read
  // may mix two versions (Linux 6.13+ gives a write right after a stat a fine-grained time, so it is
  // seen).
  void CheckUnchanged() const { object_->CheckUnchanged(); }
  void Close() { object_.reset(); }
  const StoredObject &object() const { return *object_; }
  const ObjectVersion &version() const { return object_->version(); }
  int64_t size() const { return object_->size(); }  // the object's size when it was opened
  const std::string &path() const { return object_->name(); }  // as messages show it

 private:
  std::unique_ptr<StoredObject> object_;
};

// The version of each file a batch reads, as the first of its reads found it (OpenFile::identity):
// a window read in several tasks (each opening the file) must come from one version of the file,
// so every later open of it in the batch must find the same. Thread-safe.
class FileVersions {
 public:
  void Reset(size_t n_files);
  // Fails naming the file when `file` (plan file `index`) is not the version the batch's first open
  // of it found.
  void Agree(int64_t index, const OpenFile &file);

 private:
  std::mutex mutex_;
  std::vector<ObjectVersion> seen_;
  std::vector<uint8_t> set_;
};

// Reads units' groups [g0, g1) of `plan` from `file` at `base` into `dst` (the staging buffer: the
// output itself for C-order files) and byte-swaps them if the plan says so. `scratch` is grown to
// the largest gap.
void ReadGroups(const OpenFile &file, const ReadPlan &plan, int64_t base, int64_t g0, int64_t g1,
                char *dst, std::vector<char> *scratch);

// Room for `n` bytes in `buffer` (grown to n + 4096) at an address that equals `offset` modulo the
// page size: where a read of the file bytes at `offset` should land. The kernel copies a read out
// of the page cache with `rep movsb`, which this project's AMD EPYC VMs run 4-7x slower when the
// destination lies 1-31 bytes after the source modulo 4096 (pread of warm Blosc chunks: 1.3-1.7
// against 6-12 GB/s; a std::vector's malloc'd data often starts 16 bytes into a page, so the chunk
// reads took that path); glibc's memmove avoids such short distances, the kernel's copy does not.
char *PlaceLike(std::vector<char> *buffer, int64_t n, int64_t offset);

// Reads chunk `c` of `set` (its file opened and checked by `check_plan` as a part's file is) and
// decodes it into `decoded` (its coder's chunk_bytes); a missing chunk is filled with the coder's
// fill value once its file is seen to be still missing. `stored` is grown to the stored size and a
// page (the stored bytes are read to PlaceLike's address).
// Errors name the file, the chunk's bytes and the reason (a corrupt stream, a size or checksum
// that does not match).
// With `ranges` (sorted, disjoint byte ranges of the decoded chunk: what its parts copy out), only
// those must be decoded (DecodeChunkRanges: a Blosc chunk decodes only the blocks they touch).
void ReadChunk(const PlanSet &set, int64_t c, const ReadPlan &check_plan, const std::string &first_path,
               std::vector<char> *stored, char *decoded,
               const std::vector<std::pair<int64_t, int64_t>> *ranges = nullptr);

// Adds to `ranges` the bytes of a decoded chunk that the units of the coded plan `plan` at `base`
// copy (one range per unit: its first run to its last run's end).
void AddUnitRanges(const ReadPlan &plan, int64_t base, std::vector<std::pair<int64_t, int64_t>> *ranges);


// Copies the units of the coded plan `plan` from the decoded chunk at `src` (the part's base
// added) into `dst` and byte-swaps them if the plan says so.
void CopyUnits(const ReadPlan &plan, const char *src, char *dst);

// Whether the coded plan `plan`, at `base` in a decoded chunk of `chunk_bytes`, takes the whole
// chunk as one unit: the chunk may then be decoded straight into the window (no scratch, no copy).
bool TakesWholeChunk(const ReadPlan &plan, int64_t base, int64_t chunk_bytes);

// Byte-swaps the units of `plan` in `dst` (its window) if the plan says so.
void SwapPlanUnits(const ReadPlan &plan, char *dst);

// Announces `nbytes` at `offset` of `file` to its store, as PrefetchPath.
void PrefetchRange(const PlanFile &file, int64_t offset, int64_t nbytes);

// Fortran transpose (staging -> out; staging == out for C order), then (with `boundary`) the
// copies and fills.
void FinishWindow(const ReadPlan &plan, char *staging, char *out, bool boundary = true);

// Per-channel normalisation of a finished float32 window `out` of `plan`, in place:
// x = (x - mean[c]) / stddev[c], c the index on `channel_axis` (its extent is mean's size), the
// arithmetic as the strided-slice kernel's (float32). Every cell, the boundary's too (a constant
// cell becomes (fill - mean[c]) / stddev[c]): the window of the normalised sample padded as the
// unnormalised one was, as normalising the whole window after the read gives it.
void NormalizeWindow(const ReadPlan &plan, char *out, int channel_axis, const std::vector<float> &mean,
                     const std::vector<float> &stddev);

// The boundary program of `plan` (its copies and fills) as one strided slice of the cells it reads,
// as the GPU strided-slice kernel runs it (device-side halo fills). Per axis the cells read are a
// range [lo, hi) of the window, and every other position is a constant fill, or a copy from
// BoundaryIndex(position - lo, hi - lo, mode) + lo for one mode: then `sample` takes the window
// (C order, element strides) as its input with that range as its domain, start -lo, the window's
// extents as its output, and the modes. The host program copies axis by axis; the slice computes
// every cell at once from the cells read: the same cells, since each axis's copies read only cells
// read along that axis. Returns "" or why not (chained copies, a copy and a fill on one axis, no
// cell read on an axis, more than kMaxDims axes, an empty window): the host then finishes.
std::string DeviceFillProgram(const ReadPlan &plan, SliceSample *sample);

// The fill value of `plan` (type `dtype`, a DType) as strided-slice parameters (a copy: in and out
// types `dtype`).
SliceParams DeviceFillParams(const ReadPlan &plan, int dtype);

// Splits every group of `plan` that spans more than `max_bytes` of the file into groups of at most
// about `max_bytes` (units larger than that into pieces of whole items), so that one large
// contiguous window is read by several threads. The bytes read and where they land are unchanged.
void SplitLargeGroups(ReadPlan *plan, int64_t max_bytes);

// Announces every group of `plan` at `base` of `file` to its store (the POSIX store: the kernel
// starts reading them, POSIX_FADV_WILLNEED): cold, the ranges of all files of a batch are then in
// flight at once. Errors are left to the read, which reports them.
void PrefetchPath(const PlanFile &file, const ReadPlan &plan, int64_t base);

// Splits a plan's groups into tasks of about `task_bytes` bytes each: [g_begin, g_end) pairs.
std::vector<std::pair<int64_t, int64_t>> SplitGroups(const ReadPlan &plan, int64_t task_bytes);

}  // namespace dali_mesh

#endif  // DALI_MESH_READ_PLAN_H_
