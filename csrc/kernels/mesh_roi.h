// dali_mesh: the window of one rank, C++ twin of Python's Layout.region (dali_mesh/partition.py).
// DALI-free; tests hold the two together on many random cases.
#ifndef DALI_MESH_MESH_ROI_H_
#define DALI_MESH_MESH_ROI_H_

#include <cstdint>
#include <string>
#include <vector>

namespace dali_mesh {

// kSplitExplicit: the sizes of every shard are given (MeshRoiArgs::split_sizes), as Python's
// Layout(split={mesh dim: [sizes...]}).
enum Split : int { kSplitChunk = 0, kSplitPhysicsNemo = 1, kSplitEven = 2, kSplitExplicit = 3 };

int ParseSplit(const std::string &name);  // -1 when unknown

struct MeshRoiArgs {
  std::vector<int64_t> mesh_shape;   // ranks per mesh dim
  std::vector<int64_t> coordinate;   // this rank, per mesh dim
  std::vector<int64_t> shard_axes;   // per mesh dim: the sample axis it shards (>= 0), or -1
  std::vector<int64_t> halo_lo;      // one value for all axes, or one per axis
  std::vector<int64_t> halo_hi;
  std::vector<int> boundary;         // one rule for all axes, or one per axis (Boundary values)
  int split = kSplitChunk;
  // split == kSplitExplicit only (Layout.split_sizes_flat()): per mesh dim, how many sizes it gives
  // (0, or on the innermost mesh dim sharding an axis the prod(k) combined shards of that axis, in
  // row-major order over the nested dims, outer first); split_sizes all lists in mesh-dim order.
  std::vector<int64_t> split_size_counts;
  std::vector<int64_t> split_sizes;
  std::vector<int64_t> crop_start;   // empty, or one per axis: the domain box
  std::vector<int64_t> crop_stop;    // -1: to the end of the axis
};

// (offset, size) of shard i of k of an axis of n cells.
void ShardExtent(int64_t n, int64_t k, int64_t i, int split, int64_t *offset, int64_t *size);

// Window of the rank for a sample of `shape` (ndim values): window_start (sample coordinates, may
// lie outside the domain) and window_shape; domain_start/domain_shape (may be null) get the domain.
// Returns "" or an error message naming the value.
std::string ComputeMeshRoi(const int64_t *shape, int ndim, const MeshRoiArgs &args,
                           int64_t *window_start, int64_t *window_shape,
                           int64_t *domain_start = nullptr, int64_t *domain_shape = nullptr);

// Checks the sample-independent arguments; "" when valid.
std::string CheckMeshRoiArgs(const MeshRoiArgs &args);

}  // namespace dali_mesh

#endif  // DALI_MESH_MESH_ROI_H_
