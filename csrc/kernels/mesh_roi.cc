// dali_mesh: the window of one rank (see mesh_roi.h). Follows dali_mesh/partition.py line by line:
// shard_extent, Layout.domain and Layout.region.
#include "kernels/mesh_roi.h"

#include <algorithm>
#include <cstddef>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/index_math.h"
#include "kernels/str_format.h"

namespace dali_mesh {

namespace {

// ceil(a / b) for a >= 0, b >= 1, without forming a + b - 1 (a may be near 2**63).
int64_t CeilDivPos(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// The sizes mesh dim `md` gives (split_size_counts[md] entries of split_sizes), for messages.
// Call only after CheckExplicitSizes has passed the counts.
std::vector<int64_t> SizesOf(const MeshRoiArgs &a, size_t md) {
  size_t first = 0;
  for (size_t d = 0; d < md; d++) first += static_cast<size_t>(a.split_size_counts[d]);
  auto b = a.split_sizes.begin() + static_cast<std::ptrdiff_t>(first);
  return std::vector<int64_t>(b, b + a.split_size_counts[md]);
}

// Whether a later mesh dim than `md` shards the same axis (then `md` is an outer dim of a nest and
// gives no sizes: the innermost one lists all combined shards).
bool HasInnerDim(const MeshRoiArgs &a, size_t md) {
  for (size_t e = md + 1; e < a.shard_axes.size(); e++)
    if (a.shard_axes[e] == a.shard_axes[md]) return true;
  return false;
}

// The sample-independent checks of explicit sizes (Python's _check_explicit_groups): counts and
// sizes agree, sizes >= 0, the innermost mesh dim of each sharded axis lists one size per combined
// shard, other mesh dims none. The sums are checked per sample, against the domain.
std::string CheckExplicitSizes(const MeshRoiArgs &a) {
  const size_t m = a.mesh_shape.size();
  if (a.split_size_counts.empty() && a.split_sizes.empty())
    return "split \"explicit\" needs split_size_counts (one per mesh dim) and split_sizes (the "
           "shard sizes), e.g. from Layout.split_sizes_flat()";
  const std::string counts = "split_size_counts " + ListStr(a.split_size_counts);
  if (a.split_size_counts.size() != m)
    return counts + " needs one entry per mesh dim of mesh_shape " + ListStr(a.mesh_shape) +
           " (how many sizes each mesh dim gives, 0 for none)";
  size_t total = 0;
  for (int64_t c : a.split_size_counts) {
    if (c < 0 || static_cast<uint64_t>(c) > a.split_sizes.size() - total)
      return counts + " does not match the " + std::to_string(a.split_sizes.size()) +
             " entries of split_sizes: the counts are >= 0 and add up to its length";
    total += static_cast<size_t>(c);
  }
  if (total != a.split_sizes.size())
    return counts + " adds up to " + std::to_string(total) + " but split_sizes has " +
           std::to_string(a.split_sizes.size()) + " entries: give the counts of every list";
  for (size_t md = 0; md < m; md++) {
    const int64_t axis = a.shard_axes[md];
    const int64_t count = a.split_size_counts[md];
    const std::string dim = "mesh dim " + std::to_string(md);
    if (axis < 0) {
      if (count != 0)
        return dim + " shards no axis (shard_axes " + ListStr(a.shard_axes) + ") but " + counts +
               " gives it " + std::to_string(count) + " sizes; explicit sizes belong to sharding "
               "mesh dims";
      continue;
    }
    for (int64_t s : SizesOf(a, md))
      if (s < 0)
        return "split_sizes " + ListStr(SizesOf(a, md)) + " of " + dim + " has the negative size " +
               std::to_string(s) + ": sizes count cells and must be >= 0";
    if (HasInnerDim(a, md)) {
      if (count != 0)
        return dim + " is an outer mesh dim of the nest sharding axis " + std::to_string(axis) +
               " (shard_axes " + ListStr(a.shard_axes) + ") but " + counts + " gives it " +
               std::to_string(count) + " sizes: give the sizes of all combined shards on the "
               "innermost mesh dim of that axis (row-major, outer first)";
      continue;
    }
    // innermost: prod(mesh_shape) over the nest, capped (the count is at most split_sizes' length)
    std::vector<int64_t> nest;
    unsigned __int128 shards = 1;
    for (size_t e = 0; e <= md; e++) {
      if (a.shard_axes[e] != axis) continue;
      nest.push_back(static_cast<int64_t>(e));
      shards = std::min<unsigned __int128>(shards * static_cast<uint64_t>(a.mesh_shape[e]),
                                           static_cast<unsigned __int128>(INT64_MAX) + 1);
    }
    if (shards != static_cast<unsigned __int128>(count)) {
      std::string want = shards > static_cast<unsigned __int128>(INT64_MAX)
                             ? std::string("more than 2**63 - 1")
                             : std::to_string(static_cast<int64_t>(shards));
      std::string what = nest.size() == 1
                             ? dim + " has " + want + " ranks"
                             : "mesh dims " + ListStr(nest) + " make " + want +
                                   " combined shards of axis " + std::to_string(axis);
      return counts + " gives " + std::to_string(count) + " sizes " + ListStr(SizesOf(a, md)) +
             " for " + dim + " but " + what + ": give one size per shard";
    }
  }
  return "";
}

// A nonnegative 128-bit count as text (sums of sizes may pass 2**63 before they are refused).
std::string U128Str(unsigned __int128 v) {
  std::string s;
  do {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  } while (v != 0);
  return s;
}

}  // namespace

int ParseSplit(const std::string &name) {
  if (name == "chunk") return kSplitChunk;
  if (name == "physicsnemo") return kSplitPhysicsNemo;
  if (name == "even") return kSplitEven;
  if (name == "explicit") return kSplitExplicit;
  return -1;
}

// The products i * c and c * (k - 1) can exceed int64 for axes near 2**63 cells: they are formed in
// 128 bits; every result (an offset or size within [0, n]) fits int64.
void ShardExtent(int64_t n, int64_t k, int64_t i, int split, int64_t *offset, int64_t *size) {
  using i128 = __int128;
  if (split == kSplitChunk) {
    int64_t c = CeilDivPos(n, k);
    int64_t off = static_cast<int64_t>(std::min<i128>(i128(i) * c, n));
    *offset = off;
    *size = std::min(c, n - off);
  } else if (split == kSplitPhysicsNemo) {
    int64_t c = CeilDivPos(n, k);
    if (i128(n) - i128(c) * (k - 1) <= 0) c = n / k;
    int64_t off = static_cast<int64_t>(i128(i) * c);  // <= c * (k - 1) < n here
    *offset = off;
    *size = i == k - 1 ? n - off : c;
  } else {  // even
    int64_t q = n / k, r = n % k;
    *offset = i * q + std::min(i, r);
    *size = q + (i < r ? 1 : 0);
  }
}

std::string CheckMeshRoiArgs(const MeshRoiArgs &a) {
  const size_t m = a.mesh_shape.size();
  if (m == 0) return "mesh_shape is empty: a mesh has at least one dim";
  for (int64_t s : a.mesh_shape)
    if (s <= 0) return "mesh_shape " + ListStr(a.mesh_shape) + " has a size <= 0";
  if (a.coordinate.size() != m)
    return "coordinate " + ListStr(a.coordinate) + " needs one entry per mesh dim of mesh_shape " +
           ListStr(a.mesh_shape);
  for (size_t d = 0; d < m; d++)
    if (a.coordinate[d] < 0 || a.coordinate[d] >= a.mesh_shape[d])
      return "coordinate " + ListStr(a.coordinate) + " is out of range for mesh_shape " +
             ListStr(a.mesh_shape);
  if (a.shard_axes.size() != m)
    return "shard_axes " + ListStr(a.shard_axes) + " needs one entry per mesh dim of mesh_shape " +
           ListStr(a.mesh_shape) + " (the sample axis it shards, or -1)";
  for (int64_t ax : a.shard_axes)
    if (ax < -1)
      return "shard_axes " + ListStr(a.shard_axes) +
             ": entries are a sample axis (>= 0) or -1 (shards nothing)";
  if (a.split < kSplitChunk || a.split > kSplitExplicit) return "unknown split";
  if (a.split == kSplitExplicit) {
    std::string err = CheckExplicitSizes(a);
    if (!err.empty()) return err;
  } else if (!a.split_size_counts.empty() || !a.split_sizes.empty()) {
    return "split_sizes " + ListStr(a.split_sizes) + " (split_size_counts " +
           ListStr(a.split_size_counts) + ") given with a named split rule: explicit sizes need "
           "split \"explicit\"";
  }
  for (auto *h : {&a.halo_lo, &a.halo_hi})
    for (int64_t v : *h)
      if (v < 0) return "halo " + ListStr(*h) + " is negative: halos count cells and must be >= 0";
  if (a.boundary.empty()) return "boundary is empty";
  if (a.crop_start.size() != a.crop_stop.size())
    return "crop_start " + ListStr(a.crop_start) + " and crop_stop " + ListStr(a.crop_stop) +
           " differ in length";
  return "";
}

std::string ComputeMeshRoi(const int64_t *shape, int ndim, const MeshRoiArgs &a,
                           int64_t *window_start, int64_t *window_shape, int64_t *domain_start,
                           int64_t *domain_shape) {
  std::string err = CheckMeshRoiArgs(a);
  if (!err.empty()) return err;
  if (ndim <= 0) return "the sample shape is empty: a sample has at least one axis";
  for (int d = 0; d < ndim; d++)
    if (shape[d] <= 0)
      return "sample shape " + ShapeStr(shape, ndim) +
             " has a size <= 0: every axis needs at least one cell";
  auto per_axis = [ndim](const auto &v, const char *what, std::string *e) {
    if (!(v.size() == 1 || v.size() == static_cast<size_t>(ndim)))
      *e = std::string(what) + " " + ListStr(v) + " needs one value, or one per axis of the " +
           std::to_string(ndim) + "-dim sample";
  };
  per_axis(a.halo_lo, "halo_lo", &err);
  if (err.empty()) per_axis(a.halo_hi, "halo_hi", &err);
  if (err.empty()) per_axis(a.boundary, "boundary", &err);
  if (!err.empty()) return err;
  for (int64_t ax : a.shard_axes)
    if (ax >= ndim)
      return "shard_axes " + ListStr(a.shard_axes) + ": axis " + std::to_string(ax) +
             " is out of range for a sample of shape " + ShapeStr(shape, ndim);

  std::vector<int64_t> d0(ndim, 0), d1(shape, shape + ndim);
  if (!a.crop_start.empty()) {
    if (a.crop_start.size() != static_cast<size_t>(ndim))
      return "crop has " + std::to_string(a.crop_start.size()) + " entries for a sample of shape " +
             ShapeStr(shape, ndim);
    for (int d = 0; d < ndim; d++) {
      int64_t s = a.crop_start[d], e = a.crop_stop[d] == -1 ? shape[d] : a.crop_stop[d];
      if (!(0 <= s && s < e && e <= shape[d]))
        return "crop " + std::to_string(s) + ":" + std::to_string(e) + " of axis " +
               std::to_string(d) + " lies outside the sample (axis size " +
               std::to_string(shape[d]) + ") or is empty";
      d0[d] = s;
      d1[d] = e;
    }
  }
  std::vector<int64_t> start(d0), stop(d1);
  for (size_t md = 0; md < a.mesh_shape.size(); md++) {  // mesh-dim order: outer first
    int64_t axis = a.shard_axes[md];
    if (axis < 0) continue;
    if (a.split == kSplitExplicit) {
      if (HasInnerDim(a, md)) continue;  // the innermost mesh dim of the nest lists every shard
      // c: the combined shard index, row-major over the nested mesh dims (< count, fits int64)
      int64_t c = 0;
      for (size_t e = 0; e <= md; e++)
        if (a.shard_axes[e] == axis) c = c * a.mesh_shape[e] + a.coordinate[e];
      size_t first = 0;
      for (size_t e = 0; e < md; e++) first += static_cast<size_t>(a.split_size_counts[e]);
      const int64_t *sizes = a.split_sizes.data() + first;
      const int64_t count = a.split_size_counts[md];
      // 128 bits: each size is < 2**63, so neither sum overflows before it is compared
      unsigned __int128 total = 0, prefix = 0;
      for (int64_t j = 0; j < count; j++) {
        total += static_cast<uint64_t>(sizes[j]);
        if (j < c) prefix += static_cast<uint64_t>(sizes[j]);
      }
      const int64_t n = d1[axis] - d0[axis];
      if (total != static_cast<unsigned __int128>(n))
        return "split_sizes " + ListStr(SizesOf(a, md)) + " of mesh dim " + std::to_string(md) +
               " sum to " + U128Str(total) + " but axis " + std::to_string(axis) + " has " +
               std::to_string(n) + " cells" + (a.crop_start.empty() ? "" : " (its crop)") +
               " in the sample of shape " + ShapeStr(shape, ndim) +
               ": the sizes must tile the axis";
      start[axis] = d0[axis] + static_cast<int64_t>(prefix);  // prefix <= total == n
      stop[axis] = start[axis] + sizes[c];
      continue;
    }
    int64_t offset, size;
    ShardExtent(stop[axis] - start[axis], a.mesh_shape[md], a.coordinate[md], a.split, &offset,
                &size);
    start[axis] += offset;
    stop[axis] = start[axis] + size;
  }
  // where an empty shard sits, as dali_mesh.partition.Layout.region decides it: with the chunk split
  // (torch.chunk, DTensor) at the domain end, as torch's DTensor offsets; with physicsnemo or explicit
  // sizes (PhysicsNeMo ShardTensor's) at the running sum of the sizes before it, as ShardTensor.offsets()
  bool empty = false;
  for (int d = 0; d < ndim; d++) {
    if (stop[d] == start[d]) {
      if (a.split == kSplitChunk) start[d] = stop[d] = d1[d];
      empty = true;
    }
  }
  for (int d = 0; d < ndim; d++) {
    int64_t w0 = start[d], w1 = stop[d];
    if (!empty) {  // an empty owned region gets no halo: its window is its owned region
      const int64_t lo = a.halo_lo[a.halo_lo.size() == 1 ? 0 : d];
      const int64_t hi = a.halo_hi[a.halo_hi.size() == 1 ? 0 : d];
      if (__builtin_sub_overflow(w0, lo, &w0) || __builtin_add_overflow(w1, hi, &w1))
        return "halo " + std::to_string(lo) + "/" + std::to_string(hi) + " around cells " +
               std::to_string(start[d]) + ":" + std::to_string(stop[d]) + " of axis " +
               std::to_string(d) + " reaches beyond the int64 range; use smaller halos";
      if (a.boundary[a.boundary.size() == 1 ? 0 : d] == kTrim) {
        w0 = std::max(w0, d0[d]);
        w1 = std::min(w1, d1[d]);
      }
    }
    int64_t extent;
    if (__builtin_sub_overflow(w1, w0, &extent))
      return "the window " + std::to_string(w0) + ":" + std::to_string(w1) + " of axis " +
             std::to_string(d) + " has more than 2**63 - 1 cells; use smaller halos";
    window_start[d] = w0;
    window_shape[d] = extent;
    if (domain_start) domain_start[d] = d0[d];
    if (domain_shape) domain_shape[d] = d1[d] - d0[d];
  }
  return "";
}

}  // namespace dali_mesh
