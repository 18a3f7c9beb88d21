#pragma once
// DTensorSpec: the layout of one global tensor over a DeviceMesh — mesh, one placement per mesh
// dim, global shape and dtype — and the shard math that says which elements each rank holds.
//
// Shard math (PyTorch's newest compute_local_shape_and_global_offset, see Note [Shard math]):
// mesh dims apply left to right; each keeps a sub-list of the indices the previous ones left, so
// nested sharding of one tensor dim over several mesh dims splits left to right.
//
//   global (13, 2), mesh (4, 2), [S(0), S(0)]
//   rank    0     1     2     3     4       5       6     7
//   rows    0-1   2-3   4-5   6-7   8-9     10-11   12    -       (rank 7 empty, offset 13)
//
//   global (9, 1), mesh (4,), [_S(0,2)]: rank 0 rows {0,1,5}, 1 {2,3,6}, 2 {4,7}, 3 {8}
//
// A rank's piece is described per tensor dim by ascending, disjoint [start, stop) ranges of global
// indices (Ranges); interleaved shards are not contiguous. The local tensor holds those indices in
// ascending order. Offset is the first index, or the dim size when the piece is empty (PyTorch's
// convention, so that empty shards never collide with real ones). Unsharded dims have one range
// [0, n) and offset 0. Replicate and Partial mesh dims do not change the piece.
//
// Validation (Create) reports, naming the spec: the wrong number of placements for the mesh, a shard
// dim out of range, a negative size, mixed Partial ops other than sum with avg, a block list
// whose sum differs from the size of the dim it splits, and a unit shard of a dim that is not a
// whole number of its units.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dtensor/core/dtype.h"
#include "dtensor/core/ranges.h"
#include "dtensor/core/shape.h"
#include "dtensor/dtensor/placement.h"
#include "dtensor/mesh/device_mesh.h"

namespace dt {

// ---- pure shard math on plain shapes (no mesh object, no communicator) ---------------------------

// Positions in [0, n) held by rank r when shard placement `p` splits a logical dim of n over k.
RangeList ShardPositions(const Placement& p, int64_t n, int64_t k, int64_t r);
// Size of that piece (same as RangesSize(ShardPositions(...)), without building ranges).
int64_t ShardPieceSize(const Placement& p, int64_t n, int64_t k, int64_t r);
// The elements of `list` at `positions`: list [0,4),[8,12), positions [2,6) -> [2,4),[8,10).
RangeList SelectPositions(const RangeList& list, const RangeList& positions);

// Global index ranges held at mesh coordinate `coord` after applying mesh dims [0, upto) (all by
// default). Placements must be valid for the shapes (see DTensorSpec::Create).
DimRanges ShardRanges(IntSpan shape, IntSpan mesh_shape, absl::Span<const Placement> placements,
                      IntSpan coord, int upto = -1);
// The same along tensor dim `dim` only (ShardRanges(...)[dim] without the other dims).
RangeList ShardRangesAlong(IntSpan shape, IntSpan mesh_shape,
                           absl::Span<const Placement> placements, IntSpan coord, int dim,
                           int upto = -1);
// Sizes only: the shape of the piece at `coord` after mesh dims [0, upto). Coordinate 0 holds the
// largest piece any rank holds (every dim maximized: torch.chunk's first chunks are the longest).
Shape ShardShape(IntSpan shape, IntSpan mesh_shape, absl::Span<const Placement> placements,
                 IntSpan coord, int upto = -1);
// Whether a collective over the pieces that `shards` (the placements of a group's mesh dims, all
// sharding one tensor dim, nested in order) cut from a tensor of `shape` needs a packed buffer:
// false only when all are plain Shard(d) and every dim before d has size 1, so that the pieces are
// contiguous slabs of the tensor in group-rank order. The executor packs all_gather and
// reduce_scatter buffers exactly then, and the planner prices the copy (also that of a local
// R -> S slice) by it, so cost and execution cannot drift.
bool NeedsPacking(absl::Span<const Placement> shards, IntSpan shape);
// Every distinct size tensor dim `dim` can have after mesh dims [0, upto), over all coordinates.
std::vector<int64_t> PossibleShardSizes(IntSpan shape, IntSpan mesh_shape,
                                        absl::Span<const Placement> placements, int dim,
                                        int upto = -1);

// Validates and normalizes placements for a tensor of `shape` on a mesh of `mesh_shape` (negative
// shard dims wrapped). `what` names the spec in messages, e.g. "[S(0), R] on mesh(dp=2, tp=4)".
absl::StatusOr<Placements> NormalizePlacements(IntSpan shape, IntSpan mesh_shape,
                                               absl::Span<const std::string> mesh_names,
                                               absl::Span<const Placement> placements);

// Name of mesh dim i: its name, else "d<i>".
std::string MeshDimName(absl::Span<const std::string> names, int i);

// ---- DTensorSpec -------------------------------------------------------------------------------

class DTensorSpec {
 public:
  DTensorSpec() = default;
  static absl::StatusOr<DTensorSpec> Create(DeviceMesh mesh, absl::Span<const Placement> placements,
                                            IntSpan shape, DType dtype);

  const DeviceMesh& mesh() const { return mesh_; }
  const Placements& placements() const { return placements_; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  // Number of mesh dims (of size > 1) that shard the tensor.
  int64_t NumShards() const;

  // Shard math for any coordinate of the mesh.
  Shape LocalShape(IntSpan coord) const;
  Shape Offset(IntSpan coord) const;
  int64_t Offset(IntSpan coord, int dim) const;  // Offset(coord)[dim] without the other dims
  DimRanges Ranges(IntSpan coord) const;

  // The same for this rank; a rank outside the mesh holds nothing (shape [0], no ranges).
  bool is_member() const { return mesh_.Coordinate().has_value(); }
  Shape LocalShape() const;
  Shape Offset() const;
  DimRanges Ranges() const;

  // The same mesh, shape and dtype with other placements, validated.
  absl::StatusOr<DTensorSpec> WithPlacements(absl::Span<const Placement> placements) const;

  // "[S(0), R] on mesh(dp=2, tp=4)".
  std::string ToString() const;
  // "f32[13, 2] [S(0), R] on mesh(dp=2, tp=4)".
  std::string Describe() const;
  size_t hash() const { return hash_; }
  friend bool operator==(const DTensorSpec& a, const DTensorSpec& b);
  friend bool operator!=(const DTensorSpec& a, const DTensorSpec& b) { return !(a == b); }
  template <typename H>
  friend H AbslHashValue(H h, const DTensorSpec& s) {
    return H::combine(std::move(h), s.hash_);
  }

  // Internal: builds a spec from placements already validated for this mesh and shape.
  static DTensorSpec FromValidated(DeviceMesh mesh, Placements placements, Shape shape, DType dtype);

 private:
  DeviceMesh mesh_;
  Placements placements_;
  Shape shape_;
  DType dtype_ = DType::kF32;
  size_t hash_ = 0;
};

}  // namespace dt
