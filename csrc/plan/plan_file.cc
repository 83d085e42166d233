// dali_mesh: loading a plan file (see plan.h): every word bounds-checked, every count, offset and
// index checked before it is used, the checksum first. Host only, DALI-free.
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "plan/plan.h"
#include "plan/plan_fields.h"

namespace dali_mesh {

namespace {

constexpr char kMagic[9] = "DMPLAN08";
// the largest decoded chunk a plan may declare (a crafted plan must not make the reader allocate more)
constexpr int64_t kMaxChunkBytes = int64_t(1) << 34;
constexpr int kMaxPlanDims = 32;

using detail::Fail;
using detail::Prod;

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
  // One field of a list of plan_fields.h: a word, a byte string, or an array of `n` words.
  void Read(int64_t *v) { *v = Int(); }
  void Read(std::string *s) { *s = Bytes(); }
  void Read(std::vector<int64_t> *v, int64_t n) { *v = Ints(n); }
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

void ReadPlanBody(Reader &r, ReadPlan *p) {
  const auto read = [&r](const char *, auto &v) { r.Read(&v); };
  p->ndim = static_cast<int>(r.Count(kMaxPlanDims, "ndim"));
  ForEachField(*p, kReadPlanSizeFields, read);
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
  ForEachField(*p, kReadPlanUnitFields, [&r, n_units](const char *, std::vector<int64_t> &v) { r.Read(&v, n_units); });
  ForEachField(*p, kReadPlanGroupFields,
               [&r, n_groups](const char *, std::vector<int64_t> &v) { r.Read(&v, n_groups); });
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
  ForEachField(*p, kReadPlanCheckFields, read);
  if ((p->check_offset < 0 && p->check_offset != kCheckJson) ||
      p->check_offset > INT64_MAX - static_cast<int64_t>(p->check.size()))
    r.Bad("check offset " + std::to_string(p->check_offset));
  if (p->check_offset == kCheckJson) {  // compared in canonical form at every read (OpenFile)
    std::string canon;
    if (!CanonicalJson(p->check, &canon)) r.Bad("a metadata check that is not one JSON object");
    p->check = std::move(canon);
  }
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
  if (!in) Fail(path + ": cannot open the plan file (" + std::strerror(errno) + "); it is written by "
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
  const auto read = [&r](const char *, auto &v) { r.Read(&v); };
  for (auto &f : set.files) {
    ForEachField(f, kPlanFileFields, read);
    if (f.store < 0 || f.store >= n_stores) r.Bad("store index " + std::to_string(f.store));
    f.byte_store = StoreOf(set.stores[f.store]);
    if (!f.byte_store)  // a store this build has none of: a plan of another build, or corrupt
      r.Bad(WhyNoStore(set.stores[f.store]));
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
  for (int64_t c = 0; c < n_chunks; c++) {
    PlanChunk &ch = set.chunks[c];
    ForEachField(ch, kPlanChunkFields, read);
    if (ch.file < 0 || ch.file >= n_files || ch.coder < 0 || ch.coder >= n_coders || ch.offset < 0 ||
        ch.nbytes < -2 || (ch.nbytes > 0 && ch.offset > INT64_MAX - ch.nbytes))
      r.Bad("chunk " + std::to_string(c));
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
      ForEachField(part, kPlanPartFields, read);
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

}  // namespace dali_mesh
