// dali_mesh: loading and executing byte-range read plans (see read_plan.h). Host only, DALI-free.
#include "kernels/read_plan.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <numeric>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "kernels/str_format.h"

namespace dali_mesh {

namespace {

constexpr char kMagic[9] = "DMPLAN08";
// the largest decoded chunk a plan may declare (a crafted plan must not make the reader allocate more)
constexpr int64_t kMaxChunkBytes = int64_t(1) << 34;
constexpr int kMaxPlanDims = 32;

[[noreturn]] void Fail(const std::string &msg) { throw std::runtime_error("read_windows: " + msg); }

// Cursor over the plan file's little-endian int64 words; every read is bounds-checked so that a
// corrupt or foreign file gives an error, never a wild pointer.
class Reader {
 public:
  Reader(const std::string &data, const std::string &path) : data_(data), path_(path) {}
  int64_t Int() {
    Need(8);
    int64_t v;
    std::memcpy(&v, data_.data() + pos_, 8);
    pos_ += 8;
    return v;
  }
  // A count of entries, each taking at least `each` bytes of what is left of the file: checked
  // before anything is allocated for them, so that a corrupt count cannot ask for terabytes.
  int64_t Count(int64_t limit, const char *what, int64_t each = 8) {
    int64_t n = Int();
    if (n < 0 || n > limit) Bad(std::string(what) + " count " + std::to_string(n) + " is out of range");
    if (each > 0 && n > static_cast<int64_t>(data_.size() - pos_) / each)
      Bad(std::string(what) + " count " + std::to_string(n) + " is more than the file holds");
    return n;
  }
  std::vector<int64_t> Ints(int64_t n) {
    Need(n * 8);
    std::vector<int64_t> v(n);
    if (n) std::memcpy(v.data(), data_.data() + pos_, n * 8);
    pos_ += n * 8;
    return v;
  }
  std::string Bytes() {
    int64_t n = Count(int64_t(1) << 30, "byte string", 1);
    Need((n + 7) / 8 * 8);
    std::string s(data_.data() + pos_, n);
    pos_ += (n + 7) / 8 * 8;
    return s;
  }
  bool AtEnd() const { return pos_ == data_.size(); }
  [[noreturn]] void Bad(const std::string &what) const {
    Fail(path_ + ": the plan file is corrupt (" + what + " at byte " + std::to_string(pos_) +
         "); it is written by dali_mesh.pipeline.native: rebuild the pipeline");
  }

 private:
  void Need(int64_t n) const {
    if (n < 0 || pos_ + static_cast<size_t>(n) > data_.size()) Bad("it ends early");
  }
  const std::string &data_;
  const std::string &path_;
  size_t pos_ = 8;
};

int64_t Prod(const std::vector<int64_t> &v, size_t b, size_t e) {
  int64_t p = 1;
  for (size_t i = b; i < e; i++) p *= v[i];
  return p;
}

void ReadPlanBody(Reader &r, ReadPlan *p) {
  p->ndim = static_cast<int>(r.Count(kMaxPlanDims, "ndim"));
  p->itemsize = r.Int();
  p->swap_unit = r.Int();
  const int64_t fortran = r.Int();
  if (fortran != 0 && fortran != 1) r.Bad("Fortran flag " + std::to_string(fortran));
  p->fortran = fortran == 1;
  const int64_t coded = r.Int();
  if (coded != 0 && coded != 1) r.Bad("coded flag " + std::to_string(coded));
  p->coded = coded == 1;
  // the transpose indexes shape[ndim - 1]; a 0- or 1-axis window is the same in both orders (the
  // planner writes the flag only for 2 axes or more)
  if (p->fortran && p->ndim < 2) r.Bad("Fortran order with " + std::to_string(p->ndim) + " axes");
  if (p->itemsize < 1 || p->itemsize > 16) r.Bad("itemsize " + std::to_string(p->itemsize));
  if (p->swap_unit < 0 || p->swap_unit > p->itemsize || (p->swap_unit && p->itemsize % p->swap_unit))
    r.Bad("byte swap unit " + std::to_string(p->swap_unit));
  p->shape = r.Ints(p->ndim);
  int64_t window_bytes = p->itemsize;
  for (int64_t s : p->shape) {
    if (s < 0) r.Bad("negative window extent");
    if (__builtin_mul_overflow(window_bytes, s, &window_bytes)) r.Bad("window size overflows");
  }
  const int64_t total = p->bytes();
  int64_t n_units = r.Count(int64_t(1) << 40, "unit", 48);
  int64_t n_groups = r.Count(n_units, "group", 0);
  p->file_off = r.Ints(n_units);
  p->dst_off = r.Ints(n_units);
  p->unit_bytes = r.Ints(n_units);
  p->unit_count = r.Ints(n_units);
  p->file_step = r.Ints(n_units);
  p->dst_step = r.Ints(n_units);
  p->group_begin = r.Ints(n_groups);
  p->group_end = r.Ints(n_groups);
  p->max_gap = 0;
  for (int64_t u = 0; u < n_units; u++) {
    // written so that no sum can overflow: offsets, sizes, counts and steps are any int64 in a
    // corrupt file. A unit's runs: count >= 1, steps of at least a run (one run: steps unused), the
    // last run's end inside the window and inside int64 file offsets
    const int64_t n = p->unit_count[u], bytes = p->unit_bytes[u];
    int64_t fspan = 0, dspan = 0;
    const bool runs_ok = n >= 1 && (n == 1 || (p->file_step[u] >= bytes && p->dst_step[u] >= bytes)) &&
                         !__builtin_mul_overflow(n - 1, n == 1 ? 0 : p->file_step[u], &fspan) &&
                         !__builtin_mul_overflow(n - 1, n == 1 ? 0 : p->dst_step[u], &dspan) &&
                         !__builtin_add_overflow(fspan, bytes, &fspan) && !__builtin_add_overflow(dspan, bytes, &dspan);
    if (!runs_ok || p->file_off[u] < 0 || bytes <= 0 || p->dst_off[u] < 0 || p->dst_off[u] > total ||
        dspan > total - p->dst_off[u] || p->file_off[u] > INT64_MAX - fspan)
      r.Bad("unit " + std::to_string(u) + " lies outside the window");
    if (n == 1) p->file_step[u] = p->dst_step[u] = 0;  // span() and the readers never step one run
    if (n > 1) p->max_gap = std::max(p->max_gap, p->file_step[u] - bytes);
    if (u && p->file_off[u] < p->file_end(u - 1)) {
      // units of one group must be sorted and disjoint; across groups this holds too
      r.Bad("units are not sorted by file offset");
    }
  }
  int64_t prev_end = 0;
  for (int64_t g = 0; g < n_groups; g++) {
    int64_t b = p->group_begin[g], e = p->group_end[g];
    if (b != prev_end || e <= b || e > n_units) r.Bad("group " + std::to_string(g));
    for (int64_t u = b + 1; u < e; u++) p->max_gap = std::max(p->max_gap, p->file_off[u] - p->file_end(u - 1));
    prev_end = e;
  }
  if (prev_end != n_units) r.Bad("groups do not cover the units");
  p->check_offset = r.Int();
  p->check = r.Bytes();
  if ((p->check_offset < 0 && p->check_offset != kCheckJson) ||
      p->check_offset > INT64_MAX - static_cast<int64_t>(p->check.size()))
    r.Bad("check offset " + std::to_string(p->check_offset));
  if (p->check_offset == kCheckJson) {  // compared in canonical form at every read (OpenFile)
    std::string canon;
    if (!CanonicalJson(p->check, &canon)) r.Bad("a metadata check that is not one JSON object");
    p->check = std::move(canon);
  }
  p->fill = r.Bytes();
  // a fill value is one item (DeviceFillParams reads itemsize bytes of it), or none
  if (!p->fill.empty() && static_cast<int64_t>(p->fill.size()) != p->itemsize) r.Bad("fill value size");
  p->copy_dst.resize(p->ndim);
  p->copy_src.resize(p->ndim);
  p->fills.resize(p->ndim);
  for (int a = 0; a < p->ndim; a++) {
    int64_t nc = r.Count(p->shape[a], "copy", 16);
    p->copy_dst[a] = r.Ints(nc);
    p->copy_src[a] = r.Ints(nc);
    int64_t nf = r.Count(p->shape[a], "fill");
    p->fills[a] = r.Ints(nf);
    auto in_axis = [&](int64_t v) { return v >= 0 && v < p->shape[a]; };
    for (int64_t k = 0; k < nc; k++)
      if (!in_axis(p->copy_dst[a][k]) || !in_axis(p->copy_src[a][k])) r.Bad("copy position");
    for (int64_t v : p->fills[a])
      if (!in_axis(v)) r.Bad("fill position");
    if (nf && static_cast<int64_t>(p->fill.size()) != p->itemsize) r.Bad("fill value size");
  }
}

std::string Errno(int e) { return std::strerror(e); }

void FillPattern(char *dst, int64_t nbytes, const char *value, int64_t itemsize) {
  if (nbytes <= 0) return;
  std::memcpy(dst, value, itemsize);
  int64_t done = itemsize;
  while (done < nbytes) {  // doubling copies: log2(n) memcpy calls
    int64_t n = std::min(done, nbytes - done);
    std::memcpy(dst + done, dst, n);
    done += n;
  }
}

template <int N>
void SwapBytes(char *p, int64_t n_values) {
  for (int64_t i = 0; i < n_values; i++, p += N) std::reverse(p, p + N);
}

// Swaps the values of units [b, e) of `plan` landed in `dst` when the plan says they are stored in
// the other byte order.
void SwapUnits(const ReadPlan &plan, int64_t b, int64_t e, char *dst) {
  if (plan.swap_unit <= 1) return;
  for (int64_t u = b; u < e; u++) {
    const int64_t n = plan.unit_bytes[u] / plan.swap_unit;
    for (int64_t j = 0; j < plan.unit_count[u]; j++) {
      char *p = dst + plan.dst_off[u] + j * plan.dst_step[u];
      switch (plan.swap_unit) {
        case 2: SwapBytes<2>(p, n); break;
        case 4: SwapBytes<4>(p, n); break;
        case 8: SwapBytes<8>(p, n); break;
        default:
          for (int64_t i = 0; i < n; i++) std::reverse(p + i * plan.swap_unit, p + (i + 1) * plan.swap_unit);
      }
    }
  }
}

template <int S>
void TransposeT(const char *stage, char *out, const std::vector<int64_t> &shape, int64_t itemsize) {
  // out (C order, `shape`) [i_0..i_{n-1}] = stage (C order, reversed shape) [i_{n-1}..i_0]: the
  // stage stride of out axis k is prod(shape[:k]) elements (out's Fortran strides)
  const int n = static_cast<int>(shape.size());
  const int64_t es = S ? S : itemsize;
  std::vector<int64_t> stride(n), idx(n, 0);
  int64_t st = 1;
  for (int k = 0; k < n; k++) {
    stride[k] = st;
    st *= shape[k];
  }
  const int64_t inner = shape[n - 1], inner_stride = stride[n - 1] * es;
  const int64_t rows = Prod(shape, 0, n - 1);
  for (int64_t r = 0; r < rows; r++) {
    int64_t off = 0;
    for (int k = 0; k < n - 1; k++) off += idx[k] * stride[k];
    const char *src = stage + off * es;
    for (int64_t i = 0; i < inner; i++, src += inner_stride, out += es) std::memcpy(out, src, es);
    for (int k = n - 2; k >= 0; k--) {  // odometer over the outer axes
      if (++idx[k] < shape[k]) break;
      idx[k] = 0;
    }
  }
}

}  // namespace

int64_t ReadPlan::volume() const { return Prod(shape, 0, shape.size()); }

uint64_t PlanChecksum(const char *words, size_t n_words) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n_words; i++) {
    uint64_t w;
    std::memcpy(&w, words + 8 * i, 8);
    sum += w * ((static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) | 1);
  }
  return sum;
}

PlanSet LoadPlanSet(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Fail(path + ": cannot open the plan file (" + Errno(errno) + "); it is written by "
                "dali_mesh.pipeline.native.read_windows when the pipeline is defined: define it again");
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (data.size() < 8 || data.compare(0, 8, kMagic) != 0)
    Fail(path + ": not a dali_mesh plan file of this version (bad magic); it is written by "
         "dali_mesh.pipeline.native when the pipeline is defined: define it again");
  if (data.size() % 8 != 0 || data.size() < 16)
    Fail(path + ": the plan file is corrupt (" + std::to_string(data.size()) + " bytes, not whole "
         "words); it is written by dali_mesh.pipeline.native: rebuild the pipeline");
  {
    uint64_t want;
    std::memcpy(&want, data.data() + data.size() - 8, 8);
    if (PlanChecksum(data.data() + 8, data.size() / 8 - 2) != want)
      Fail(path + ": the plan file is corrupt (its checksum does not match its contents); it is "
           "written by dali_mesh.pipeline.native: rebuild the pipeline");
    data.resize(data.size() - 8);
  }
  Reader r(data, path);
  PlanSet set;
  set.source = path;
  int64_t n_stores = r.Count(int64_t(1) << 10, "store", 16);
  set.stores.resize(n_stores);
  for (auto &spec : set.stores) spec = r.Bytes();
  int64_t n_plans = r.Count(int64_t(1) << 32, "plan", 64);
  int64_t n_files = r.Count(int64_t(1) << 40, "file", 16);
  int64_t n_items = r.Count(int64_t(1) << 40, "item", 16);
  int64_t n_coders = r.Count(int64_t(1) << 20, "coder", 32);
  int64_t n_chunks = r.Count(int64_t(1) << 40, "chunk", 32);
  set.files.resize(n_files);
  for (auto &f : set.files) {
    f.store = r.Int();
    f.key = r.Bytes();
    f.size = r.Int();
    f.mtime_ns = r.Int();
    f.tag = r.Bytes();
    f.check_offset = r.Int();
    f.check = r.Bytes();
    if (f.store < 0 || f.store >= n_stores) r.Bad("store index " + std::to_string(f.store));
    f.byte_store = StoreOf(set.stores[f.store]);
    if (!f.byte_store)  // a store this build has none of: a plan of another build, or corrupt
      r.Bad("byte store \"" + ShownName(set.stores[f.store]) + "\" (this build reads: file)");
    // a NUL would make open() read another (shorter) path than the one named
    if (f.key.empty() || f.key.find('\0') != std::string::npos) r.Bad("file path");
    if (f.size < -1) r.Bad("expected file size " + std::to_string(f.size));
    if (f.mtime_ns < -1) r.Bad("expected modification time " + std::to_string(f.mtime_ns));
    if (f.check_offset < -1 || (f.check_offset < 0 && !f.check.empty()) || f.check.size() > (size_t(1) << 30))
      r.Bad("file check of " + std::to_string(f.check.size()) + " bytes at byte " + std::to_string(f.check_offset));
  }
  set.coders.resize(n_coders);
  for (auto &cd : set.coders) {
    int64_t n_steps = r.Count(16, "codec step", 16);
    std::vector<int64_t> ids = r.Ints(n_steps), args = r.Ints(n_steps);
    for (int64_t k = 0; k < n_steps; k++) cd.steps.push_back({ids[k], args[k]});
    cd.chunk_bytes = r.Int();
    cd.fill = r.Bytes();
    if (cd.chunk_bytes < 0 || cd.chunk_bytes > kMaxChunkBytes) r.Bad("chunk size " + std::to_string(cd.chunk_bytes));
    std::string why = CheckCoder(cd);
    // a codec missing from this build is refused when the pipeline is built (the planner asks
    // first, dali_mesh._kernels.codecs): here it is a plan from another build
    if (!why.empty()) r.Bad("a coder that cannot run: " + why);
  }
  set.chunks.resize(n_chunks);
  {
    std::vector<int64_t> w = r.Ints(4 * n_chunks);
    for (int64_t c = 0; c < n_chunks; c++) {
      PlanChunk &ch = set.chunks[c];
      ch.file = w[4 * c];
      ch.offset = w[4 * c + 1];
      ch.nbytes = w[4 * c + 2];
      ch.coder = w[4 * c + 3];
      if (ch.file < 0 || ch.file >= n_files || ch.coder < 0 || ch.coder >= n_coders || ch.offset < 0 ||
          ch.nbytes < -2 || (ch.nbytes > 0 && ch.offset > INT64_MAX - ch.nbytes))
        r.Bad("chunk " + std::to_string(c));
    }
  }
  set.plans.resize(n_plans);
  for (auto &p : set.plans) ReadPlanBody(r, &p);
  set.items.resize(n_items);
  for (auto &it : set.items) {
    it.finish = r.Int();
    int64_t n_parts = r.Count(int64_t(1) << 32, "part", 32);
    if (it.finish < 0 || it.finish >= n_plans) r.Bad("item's plan");
    it.part_begin = set.parts.size();
    for (int64_t k = 0; k < n_parts; k++) {
      PlanPart part;
      part.file = r.Int();
      part.plan = r.Int();
      part.base = r.Int();
      part.dst_base = r.Int();
      if (part.file < 0 || part.plan < 0 || part.plan >= n_plans || part.base < 0 || part.dst_base < 0 ||
          part.file >= (set.plans[part.plan].coded ? n_chunks : n_files))
        r.Bad("item part");
      // the part's window must lie inside the item's window, its reads inside int64 offsets
      const ReadPlan &pp = set.plans[part.plan], &fp = set.plans[it.finish];
      const int64_t file_end = pp.file_off.empty() ? 0 : pp.file_end(pp.file_off.size() - 1);
      if (part.dst_base > fp.bytes() || pp.bytes() > fp.bytes() - part.dst_base ||
          pp.itemsize != fp.itemsize || part.base > INT64_MAX - file_end)
        r.Bad("item part outside its window");
      // a coded part's units lie inside its decoded chunk
      if (pp.coded && part.base > set.coders[set.chunks[part.file].coder].chunk_bytes - file_end)
        r.Bad("item part outside its chunk");
      set.parts.push_back(part);
    }
    it.part_end = set.parts.size();
  }
  if (!r.AtEnd()) r.Bad("trailing bytes");
  return set;
}

void FileVersions::Reset(size_t n_files) {
  std::lock_guard<std::mutex> lock(mutex_);
  seen_.resize(n_files);
  set_.assign(n_files, 0);
}

void FileVersions::Agree(int64_t index, const OpenFile &file) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (index < 0 || static_cast<size_t>(index) >= set_.size()) return;
  if (!set_[index]) {
    seen_[index] = file.version();
    set_[index] = 1;
  } else if (seen_[index] != file.version()) {
    Fail(file.path() + ": the file changed while this batch read it (its size, modification or change time "
         "differ between two reads of it): it was rewritten in place, and a window could mix two versions; "
         "write files to a new name and rename them over the old ones");
  }
}

void OpenFile::Open(const PlanFile &file, const ReadPlan &plan, const std::string &first_file) {
  Close();
  object_ = file.byte_store->Open(file.key);  // fails naming a missing file, a FIFO, a folder
  const std::string &path_ = object_->name();
  const std::string first_path = ShownName(first_file);
  const int64_t size = object_->size();
  if (file.size >= 0 && size != file.size) {
    if (size < file.size)
      Fail(path_ + ": the file is truncated: " + std::to_string(size) + " bytes, but its " +
           "layout (planned from " + first_path + ") needs " + std::to_string(file.size) +
           "; rewrite it");
    Fail(path_ + ": the file is " + std::to_string(size) + " bytes, but the plan (made from " +
         first_path + ") expects " + std::to_string(file.size) + ": it changed since " +
         "the plan was made, or its shape or dtype differs; define the pipeline again, or use " +
         "per-sample shapes");
  }

  if (plan.check_offset == kCheckJson) {
    // the whole metadata file, compared in canonical form (attributes may change, nothing else)
    constexpr int64_t kMaxJson = int64_t(1) << 30;
    if (size > kMaxJson)
      Fail(path_ + ": the metadata file is " + std::to_string(size) + " bytes (at most " +
           std::to_string(kMaxJson) + " are read); define the pipeline again");
    std::string text(size, '\0');
    int64_t got = object_->ReadAt(text.data(), size, 0);
    if (got < 0) Fail(path_ + ": read of the metadata failed (" + Errno(-got) + ")");
    text.resize(got);
    std::string canon;
    if (!CanonicalJson(text, &canon) || canon != plan.check)
      Fail(path_ + ": its metadata (shape, dtype, chunking, order, codecs or fill value) differs from "
           "the one planned for (" + first_path + "): the array changed since the plan was made, "
           "or differs from that one; define the pipeline again, or make every array the same");
  } else if (!plan.check.empty()) {
    std::string head(plan.check.size(), '\0');
    FlightGuard flight(path_, plan.check_offset, static_cast<int64_t>(head.size()));
    int64_t got = object_->ReadAt(head.data(), head.size(), plan.check_offset);
    if (got < 0) Fail(path_ + ": read of the header failed (" + Errno(-got) + ")");
    if (got != static_cast<int64_t>(head.size()) || head != plan.check)
      Fail(path_ + ": its header differs from the one planned for (" + first_path + ", " +
           std::to_string(plan.check.size()) + " bytes at byte " + std::to_string(plan.check_offset) +
           "): its shape, dtype, order or storage changed since the plan was made, or differs " +
           "from that file's; define the pipeline again, make every file the same, or use " +
           "per-sample shapes");
  }
  // last, so that a changed size or header is named as such: a file whose layout looks the same
  // but that was modified since the plan (an HDF5 file rewritten in place may hold, at the planned
  // address, another dataset with a byte-identical header)
  if ((file.mtime_ns >= 0 && object_->version().mtime_ns != file.mtime_ns) ||
      (!file.tag.empty() && object_->version().tag != file.tag)) {
      Fail(path_ + ": the file was modified since the plan was made (the plan holds where its data "
           "lay then: an HDF5 file rewritten in place may hold another dataset at the planned address, "
           "with a byte-identical header; a Zarr shard its chunks at other offsets); define the "
           "pipeline again");
  }
  if (file.check_offset >= 0) {  // a shard's index, as read when the plan was made
    std::string held(file.check.size(), '\0');
    FlightGuard flight(path_, file.check_offset, static_cast<int64_t>(held.size()));
    const int64_t got = object_->ReadAt(held.data(), held.size(), file.check_offset);
    if (got < 0) Fail(path_ + ": read of its index failed (" + Errno(-got) + ")");
    if (got != static_cast<int64_t>(held.size()) || held != file.check)
      Fail(path_ + ": its index (" + std::to_string(file.check.size()) + " bytes at byte " +
           std::to_string(file.check_offset) + ") differs from the one read when the plan was made: the shard "
           "was rewritten since (a copy or restore that kept its size and modification time); define the "
           "pipeline again");
  }
}

void ReadGroups(const OpenFile &file, const ReadPlan &plan, int64_t base, int64_t g0, int64_t g1,
                char *dst, std::vector<char> *scratch) {
  // gaps land in a scratch of at most 1 MiB (a larger gap takes several buffers of it): a plan's
  // gaps are a few KiB (merged reads), and a crafted plan's gap of terabytes must not become an
  // allocation of that size
  constexpr int64_t kMaxScratch = int64_t(1) << 20;
  const int64_t scratch_bytes = std::max<int64_t>(1, std::min(plan.max_gap, kMaxScratch));
  if (static_cast<int64_t>(scratch->size()) < scratch_bytes) scratch->resize(scratch_bytes);
  constexpr int kIovMax = 1024;  // buffers per request (the object splits by its own limit)
  if (g0 >= g1) return;
  // one registration for the task's reads (not one per group: a mutex and an allocation each), its
  // range from the first group's first byte to the last group's last
  const int64_t last = plan.group_end[g1 - 1] - 1;
  FlightGuard flight(file.path(), base + plan.file_off[plan.group_begin[g0]],
                     plan.file_end(last) - plan.file_off[plan.group_begin[g0]]);
  std::vector<struct iovec> iov;
  iov.reserve(kIovMax);
  int64_t offset = 0;
  // the group's buffers in file order (runs, and the gaps before them into the scratch), read a
  // batch of at most kIovMax at a time: a unit of many runs never becomes one vector of them all
  auto push = [&](char *p, int64_t n) {
    if (iov.size() == static_cast<size_t>(kIovMax)) {
      const int64_t n = std::accumulate(iov.begin(), iov.end(), int64_t(0),
                                        [](int64_t a, const struct iovec &v) { return a + int64_t(v.iov_len); });
      file.object().ReadVector(&iov, offset);
      offset += n;
      iov.clear();
    }
    iov.push_back({p, static_cast<size_t>(n)});
  };
  for (int64_t g = g0; g < g1; g++) {
    const int64_t b = plan.group_begin[g], e = plan.group_end[g];
    offset = base + plan.file_off[b];
    iov.clear();
    int64_t at = plan.file_off[b];  // the file byte read next
    for (int64_t u = b; u < e; u++) {
      for (int64_t j = 0; j < plan.unit_count[u]; j++) {
        const int64_t run = plan.file_off[u] + j * plan.file_step[u];
        for (int64_t gap = run - at; gap > 0; gap -= scratch_bytes) push(scratch->data(), std::min(gap, scratch_bytes));
        push(dst + plan.dst_off[u] + j * plan.dst_step[u], plan.unit_bytes[u]);
        at = run + plan.unit_bytes[u];
      }
    }
    file.object().ReadVector(&iov, offset);
    SwapUnits(plan, b, e, dst);  // the file holds the other byte order: swap what was just read
  }
}

void CopyUnits(const ReadPlan &plan, const char *src, char *dst) {
  const int64_t n = plan.file_off.size();
  for (int64_t u = 0; u < n; u++) {
    const char *s = src + plan.file_off[u];
    char *d = dst + plan.dst_off[u];
    const int64_t bytes = plan.unit_bytes[u], fs = plan.file_step[u], ds = plan.dst_step[u];
    for (int64_t j = 0; j < plan.unit_count[u]; j++, s += fs, d += ds) std::memcpy(d, s, bytes);
  }
  SwapUnits(plan, 0, n, dst);
}

bool TakesWholeChunk(const ReadPlan &plan, int64_t base, int64_t chunk_bytes) {
  return plan.coded && base == 0 && plan.file_off.size() == 1 && plan.file_off[0] == 0 &&
         plan.unit_count[0] == 1 && plan.unit_bytes[0] == chunk_bytes;
}

void SwapPlanUnits(const ReadPlan &plan, char *dst) { SwapUnits(plan, 0, plan.file_off.size(), dst); }

void AddUnitRanges(const ReadPlan &plan, int64_t base, std::vector<std::pair<int64_t, int64_t>> *ranges) {
  for (size_t u = 0; u < plan.file_off.size(); u++)
    ranges->push_back({base + plan.file_off[u], base + plan.file_end(u)});
}

char *PlaceLike(std::vector<char> *buffer, int64_t n, int64_t offset) {
  constexpr int64_t kPage = 4096;
  if (static_cast<int64_t>(buffer->size()) < n + kPage) buffer->resize(n + kPage);
  const auto start = reinterpret_cast<uintptr_t>(buffer->data());
  return buffer->data() + ((static_cast<uintptr_t>(offset) - start) & (kPage - 1));
}

void ReadChunk(const PlanSet &set, int64_t c, const ReadPlan &check_plan, const std::string &first_path,
               std::vector<char> *stored, char *decoded, const std::vector<std::pair<int64_t, int64_t>> *ranges) {
  const PlanChunk &ch = set.chunks[c];
  const Coder &coder = set.coders[ch.coder];
  const PlanFile &pf = set.files[ch.file];
  if (ch.nbytes == -2) {
    // an inner chunk a shard's index lists as never written: the shard file must still be the one
    // whose index was read (its size and modification time are checked), then the fill value
    OpenFile file;
    file.Open(pf, check_plan, first_path);
    FillMissingChunk(coder, decoded);
    return;
  }
  if (ch.nbytes < 0) {
    // never written when planned: it must still be missing (a chunk written since is data the plan
    // does not know, not fill values)
    if (pf.byte_store->Exists(pf.key))
      Fail(ShownName(pf.key) + ": this chunk was missing when the plan was made (it reads as the fill value) but "
           "exists now: the array changed since; define the pipeline again");
    FillMissingChunk(coder, decoded);
    return;
  }
  OpenFile file;
  file.Open(pf, check_plan, first_path);
  const int64_t size = file.size();
  const std::string where = file.path() + ": chunk of " + std::to_string(ch.nbytes) + " bytes at byte " +
                            std::to_string(ch.offset);
  if (ch.offset > size || ch.nbytes > size - ch.offset)
    Fail(where + " runs past the end of the file (" + std::to_string(size) + " bytes): the file is "
         "truncated or changed since the plan was made");
  char *const at = PlaceLike(stored, ch.nbytes, ch.offset);
  auto read_at = [&](int64_t lo, int64_t hi) {  // the chunk's stored bytes [lo, hi), at their offsets
    if (lo >= hi) return;
    FlightGuard flight(file.path(), ch.offset + lo, hi - lo);
    const int64_t got = file.object().ReadAt(at + lo, hi - lo, ch.offset + lo);
    if (got == -ECANCELED)
      Fail(where + ": read cancelled: the pipeline was stopped after an error");
    if (got < 0) Fail(where + ": read failed (" + Errno(-got) + ")");
    if (got != hi - lo) Fail(where + ": the file was truncated while reading");
  };
  // a Blosc chunk whose blocks this batch needs only some of (a band of a whole field): its header
  // and block index, then those blocks' stored bytes (about a quarter of the chunk); others whole
  ReadStored(coder, ch.nbytes, ranges, at, read_at);
  file.CheckUnchanged();
  const std::string why = ranges ? DecodeChunkRanges(coder, at, ch.nbytes, decoded, *ranges)
                                 : DecodeChunk(coder, at, ch.nbytes, decoded);
  if (!why.empty()) Fail(where + " cannot be decoded: " + why + "; the file is corrupt");
}

void PrefetchRange(const PlanFile &file, int64_t offset, int64_t nbytes) {
  if (nbytes <= 0) return;
  file.byte_store->Prefetch(file.key, {{offset, nbytes}});
}

void FinishWindow(const ReadPlan &plan, char *staging, char *out, bool boundary) {
  const int64_t vol = plan.volume();
  if (vol == 0) return;
  const int64_t es = plan.itemsize;
  if (plan.fortran && staging != out) {
    switch (es) {
      case 1: TransposeT<1>(staging, out, plan.shape, es); break;
      case 2: TransposeT<2>(staging, out, plan.shape, es); break;
      case 4: TransposeT<4>(staging, out, plan.shape, es); break;
      case 8: TransposeT<8>(staging, out, plan.shape, es); break;
      default: TransposeT<0>(staging, out, plan.shape, es);
    }
  } else if (staging != out) {
    std::memcpy(out, staging, vol * es);
  }
  if (!boundary) return;
  // axis by axis, copies then fills (as dali_mesh.io._plan.WindowPlan.finish): a slab copied along
  // axis a may carry not-yet-valid cells of later axes, which their own passes overwrite
  for (int a = 0; a < plan.ndim; a++) {
    const int64_t outer = Prod(plan.shape, 0, a), n_a = plan.shape[a];
    const int64_t inner = Prod(plan.shape, a + 1, plan.shape.size()) * es;
    const auto &cd = plan.copy_dst[a], &cs = plan.copy_src[a], &fl = plan.fills[a];
    for (int64_t o = 0; o < outer; o++) {
      char *slab = out + o * n_a * inner;
      for (size_t k = 0; k < cd.size(); k++)
        std::memcpy(slab + cd[k] * inner, slab + cs[k] * inner, inner);
      for (int64_t p : fl) FillPattern(slab + p * inner, inner, plan.fill.data(), es);
    }
  }
}

void NormalizeWindow(const ReadPlan &plan, char *out, int channel_axis, const std::vector<float> &mean,
                     const std::vector<float> &stddev) {
  const int64_t outer = Prod(plan.shape, 0, channel_axis), nc = plan.shape[channel_axis];
  const int64_t inner = Prod(plan.shape, channel_axis + 1, plan.shape.size());
  float *x = reinterpret_cast<float *>(out);
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t c = 0; c < nc; c++) {
      const float m = mean[c], sd = stddev[c];
      float *p = x + (o * nc + c) * inner;
      for (int64_t k = 0; k < inner; k++) p[k] = (p[k] - m) / sd;
    }
  }
}

std::string DeviceFillProgram(const ReadPlan &plan, SliceSample *sample) {
  const int nd = plan.ndim;
  if (nd < 1 || nd > kMaxDims) return std::to_string(nd) + " axes (the GPU kernel takes 1.." +
                                      std::to_string(kMaxDims) + ")";
  if (plan.volume() == 0) return "an empty window";
  SliceSample s;
  s.ndim = nd;
  int64_t stride = 1;
  for (int a = nd - 1; a >= 0; a--) {
    s.in_stride[a] = stride;
    stride *= plan.shape[a];
  }
  s.in_offset = 0;
  for (int a = 0; a < nd; a++) {
    const int64_t n = plan.shape[a];
    // 0: read, 1: copied, 2: filled; each position once
    std::vector<uint8_t> mark(n, 0);
    for (int64_t p : plan.copy_dst[a]) {
      if (mark[p]) return "axis " + std::to_string(a) + " copies a position twice";
      mark[p] = 1;
    }
    for (int64_t p : plan.fills[a]) {
      if (mark[p]) return "axis " + std::to_string(a) + " copies and fills one position";
      mark[p] = 2;
    }
    int64_t lo = 0;
    while (lo < n && mark[lo]) lo++;
    int64_t hi = lo;
    while (hi < n && !mark[hi]) hi++;
    if (lo == n) return "axis " + std::to_string(a) + " has no cell read";
    for (int64_t p = hi; p < n; p++)
      if (!mark[p]) return "the cells read on axis " + std::to_string(a) + " are not one range";
    const bool copies = !plan.copy_dst[a].empty(), fills = !plan.fills[a].empty();
    if (copies && fills) return "axis " + std::to_string(a) + " has copies and fills";
    uint8_t mode = kConstant;
    if (copies) {
      bool found = false;
      for (uint8_t m : {kReflect, kSymmetric, kEdge, kPeriodic}) {
        bool ok = true;
        for (size_t k = 0; ok && k < plan.copy_dst[a].size(); k++)
          ok = BoundaryIndex(plan.copy_dst[a][k] - lo, hi - lo, m) + lo == plan.copy_src[a][k];
        if (ok) {
          mode = m;
          found = true;
          break;
        }
      }
      if (!found) return "axis " + std::to_string(a) + "'s copies follow no boundary rule of the read cells";
    }
    s.in_extent[a] = hi - lo;
    s.in_offset += lo * s.in_stride[a];
    s.start[a] = -lo;
    s.out_extent[a] = n;
    s.step[a] = 1;
    s.boundary[a] = mode;
  }
  *sample = s;
  return "";
}

SliceParams DeviceFillParams(const ReadPlan &plan, int dtype) {
  SliceParams params;
  params.in_type = params.out_type = dtype;
  if (plan.fill.empty()) return params;
  const char *f = plan.fill.data();
  auto get = [&](auto zero) {
    decltype(zero) v;
    std::memcpy(&v, f, sizeof(v));
    return v;
  };
  switch (dtype) {
    case kInt8: params.SetFillInt(get(int8_t())); break;
    case kInt16: params.SetFillInt(get(int16_t())); break;
    case kInt32: params.SetFillInt(get(int32_t())); break;
    case kInt64: params.SetFillInt(get(int64_t())); break;
    case kUInt8: case kBool: params.SetFillUInt(get(uint8_t())); break;
    case kUInt16: params.SetFillUInt(get(uint16_t())); break;
    case kUInt32: params.SetFillUInt(get(uint32_t())); break;
    case kUInt64: params.SetFillUInt(get(uint64_t())); break;
    case kFloat16: params.SetFill(HalfToFloat(get(uint16_t()))); break;
    case kFloat32: params.SetFill(get(float())); break;
    case kFloat64: params.SetFill(get(double())); break;
    default: break;
  }
  return params;
}

void SplitLargeGroups(ReadPlan *plan, int64_t max_bytes) {
  const int64_t n_groups = plan->group_begin.size();
  if (max_bytes <= 0 || n_groups == 0) return;
  // pieces of a unit: whole items (a byte swap and a transpose never see half an item)
  const int64_t piece = std::max<int64_t>(1, max_bytes / plan->itemsize) * plan->itemsize;
  bool needed = false;
  for (int64_t g = 0; g < n_groups && !needed; g++) {
    const int64_t b = plan->group_begin[g], e = plan->group_end[g];
    needed = plan->file_end(e - 1) - plan->file_off[b] > max_bytes;
  }
  if (!needed) return;
  std::vector<int64_t> fo, dof, ub, cnt, fst, dst, gb, ge;
  auto add = [&](int64_t f, int64_t d, int64_t b, int64_t n, int64_t fs, int64_t ds) {
    fo.push_back(f);
    dof.push_back(d);
    ub.push_back(b);
    cnt.push_back(n);
    fst.push_back(n > 1 ? fs : 0);
    dst.push_back(n > 1 ? ds : 0);
  };
  for (int64_t g = 0; g < n_groups; g++) {
    int64_t start = -1;  // file offset where the group being built starts
    gb.push_back(fo.size());
    // closes the group being built (when it holds a unit) if `need` bytes from `off` would take it
    // past max_bytes; returns the room left from `off`
    auto room_at = [&](int64_t off, int64_t need) {
      if (start < 0) start = off;
      if (start + max_bytes - off < need && static_cast<int64_t>(fo.size()) > gb.back()) {
        ge.push_back(fo.size());
        gb.push_back(fo.size());
        start = off;
      }
      return start + max_bytes - off;
    };
    for (int64_t u = plan->group_begin[g]; u < plan->group_end[g]; u++) {
      const int64_t bytes = plan->unit_bytes[u], n = plan->unit_count[u];
      if (n > 1 && bytes <= max_bytes) {
        // runs of a repeated unit: as many per unit as fit in the group's room, at least one
        for (int64_t j = 0; j < n;) {
          const int64_t off = plan->file_off[u] + j * plan->file_step[u];
          const int64_t room = room_at(off, bytes);
          const int64_t take = std::min(n - j, room < bytes ? 1 : 1 + (room - bytes) / plan->file_step[u]);
          add(off, plan->dst_off[u] + j * plan->dst_step[u], bytes, take, plan->file_step[u], plan->dst_step[u]);
          j += take;
        }
        continue;
      }
      for (int64_t j = 0; j < n; j++) {  // runs larger than max_bytes: each in pieces of whole items
        const int64_t run = plan->file_off[u] + j * plan->file_step[u], run_dst = plan->dst_off[u] + j * plan->dst_step[u];
        for (int64_t done = 0; done < bytes;) {
          const int64_t off = run + done;
          // close the group when this unit (or piece) would take it past max_bytes
          const int64_t room = std::max(room_at(off, plan->itemsize), plan->itemsize);
          const int64_t left = bytes - done;
          int64_t take = left;
          if (take > room) take = std::max<int64_t>(plan->itemsize, room / plan->itemsize * plan->itemsize);
          take = std::min({take, left, std::max<int64_t>(piece, plan->itemsize)});
          add(off, run_dst + done, take, 1, 0, 0);
          done += take;
        }
      }
    }
    ge.push_back(fo.size());
  }
  plan->file_off = std::move(fo);
  plan->dst_off = std::move(dof);
  plan->unit_bytes = std::move(ub);
  plan->unit_count = std::move(cnt);
  plan->file_step = std::move(fst);
  plan->dst_step = std::move(dst);
  plan->group_begin = std::move(gb);
  plan->group_end = std::move(ge);
}

void PrefetchPath(const PlanFile &file, const ReadPlan &plan, int64_t base) {
  if (plan.group_begin.empty()) return;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  ranges.reserve(plan.group_begin.size());
  for (size_t g = 0; g < plan.group_begin.size(); g++) {
    const int64_t b = plan.group_begin[g], e = plan.group_end[g];
    int64_t lo, hi;
    // a crafted plan or chunk index may put a group near 2**63: never overflow (the store announces
    // only what lies inside the object; the read itself reports the rest)
    if (__builtin_add_overflow(base, plan.file_off[b], &lo) || __builtin_add_overflow(base, plan.file_end(e - 1), &hi))
      continue;
    lo = std::max<int64_t>(lo, 0);
    if (hi > lo) ranges.emplace_back(lo, hi - lo);
  }
  file.byte_store->Prefetch(file.key, ranges);
}

bool CanonicalJson(const std::string &text, std::string *out) {
  // 1: whitespace outside strings dropped
  std::string s;
  s.reserve(text.size());
  bool in_str = false;
  for (size_t i = 0; i < text.size(); i++) {
    const char c = text[i];
    if (in_str) {
      s += c;
      if (c == '\\') {
        if (++i >= text.size()) return false;
        s += text[i];
      } else if (c == '"') {
        in_str = false;
      }
    } else if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
      s += c;
      if (c == '"') in_str = true;
    }
  }
  if (in_str || s.size() < 2 || s.front() != '{' || s.back() != '}') return false;
  // 2: the top-level members "key":value, split at the commas outside strings and brackets
  std::vector<std::pair<std::string, std::string>> members;
  const size_t end = s.size() - 1;  // the closing brace
  size_t i = 1;
  while (i < end) {
    if (s[i] != '"') return false;
    size_t k = i + 1;
    while (k < end && s[k] != '"') k += s[k] == '\\' ? 2 : 1;
    if (k >= end || s[k + 1] != ':') return false;
    std::string key = s.substr(i, k + 1 - i);
    const size_t v = k + 2;
    int depth = 0;
    bool str = false;
    for (i = v; i < end; i++) {
      const char c = s[i];
      if (str) {
        if (c == '\\') i++;
        else if (c == '"') str = false;
      } else if (c == '"') {
        str = true;
      } else if (c == '{' || c == '[') {
        depth++;
      } else if (c == '}' || c == ']') {
        if (--depth < 0) return false;
      } else if (c == ',' && depth == 0) {
        break;
      }
    }
    if (str || depth != 0 || i == v || i > end) return false;
    members.emplace_back(std::move(key), s.substr(v, i - v));
    if (i < end && ++i == end) return false;  // a comma before the closing brace
  }
  std::sort(members.begin(), members.end());
  out->assign("{");
  bool first = true;
  for (const auto &m : members) {
    if (m.first == "\"attributes\"" || m.first == "\"dimension_names\"") continue;
    if (!first) *out += ',';
    first = false;
    *out += m.first;
    *out += ':';
    *out += m.second;
  }
  *out += '}';
  return true;
}

std::vector<std::pair<int64_t, int64_t>> SplitGroups(const ReadPlan &plan, int64_t task_bytes) {
  std::vector<std::pair<int64_t, int64_t>> tasks;
  const int64_t n = plan.group_begin.size();
  int64_t start = 0, acc = 0;
  for (int64_t g = 0; g < n; g++) {
    const int64_t b = plan.group_begin[g], e = plan.group_end[g];
    acc += plan.file_end(e - 1) - plan.file_off[b];
    if (acc >= task_bytes) {
      tasks.emplace_back(start, g + 1);
      start = g + 1;
      acc = 0;
    }
  }
  if (start < n) tasks.emplace_back(start, n);
  return tasks;
}

}  // namespace dali_mesh
