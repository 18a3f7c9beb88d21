#include "dtensor/dtensor/spec.h"

#include <algorithm>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"

namespace dt {

// Note [Shard math]
// Per tensor dim we keep the list of global indices a rank still holds, as ascending ranges
// (initially [0, n)). Mesh dims apply left to right; a shard placement on mesh dim i with k ranks
// keeps, of the current list (length m), the positions ShardPositions(p, m, k, coord[i]):
//   S(d)       the torch.chunk piece [r*c, min(m, (r+1)*c)), c = ceil(m/k)
//   S(d,unit=u) the torch.chunk piece of the m/u units, times u (Note [Unit shards])
//   _S(d,...)  per block of BlockSizes(m), the torch.chunk piece of that block, in block order
// and the new list is the old one restricted to those positions (SelectPositions). This is
// PyTorch's newest index-list algorithm, so it reproduces local-shape-examples.md exactly,
// including non-contiguous nested interleaved shards. Because each step selects positions of an
// ascending list in ascending order, lists stay ascending, which is what makes "the local tensor
// holds its indices in ascending order" true. Sizes alone (ShardShape) follow the same recursion
// without building ranges, which is what the executor needs per call.

RangeList ShardPositions(const Placement& p, int64_t n, int64_t k, int64_t r) {
  RangeList out;
  auto push = [&out](int64_t start, int64_t size) {
    if (size <= 0) return;
    if (!out.empty() && out.back().stop == start) {
      out.back().stop += size;
    } else {
      out.push_back({start, start + size});
    }
  };
  if (!p.is_any_shard() || k <= 1) {
    push(0, n);
    return out;
  }
  if (p.is_shard()) {
    const Chunk c = ChunkOf(n / p.unit(), k, r);
    push(c.offset * p.unit(), c.size * p.unit());
    return out;
  }
  int64_t base = 0;
  for (int64_t block : p.BlockSizes(n)) {
    const Chunk c = ChunkOf(block, k, r);
    push(base + c.offset, c.size);
    base += block;
  }
  return out;
}

int64_t ShardPieceSize(const Placement& p, int64_t n, int64_t k, int64_t r) {
  if (!p.is_any_shard() || k <= 1) return n;
  if (p.is_shard()) return ChunkOf(n / p.unit(), k, r).size * p.unit();
  int64_t size = 0;
  for (int64_t block : p.BlockSizes(n)) size += ChunkOf(block, k, r).size;
  return size;
}

RangeList SelectPositions(const RangeList& list, const RangeList& positions) {
  RangeList out;
  size_t li = 0;
  int64_t list_pos = 0;  // position of list[li].start
  for (const IndexRange& want : positions) {
    int64_t a = want.start;
    const int64_t b = want.stop;
    while (a < b && li < list.size()) {
      const int64_t len = list[li].size();
      if (a >= list_pos + len) {
        list_pos += len;
        ++li;
        continue;
      }
      const int64_t from = a - list_pos;
      const int64_t take = std::min(b, list_pos + len) - a;
      const int64_t start = list[li].start + from;
      if (!out.empty() && out.back().stop == start) {
        out.back().stop += take;
      } else {
        out.push_back({start, start + take});
      }
      a += take;
    }
  }
  return out;
}

namespace {
int Upto(int upto, size_t n) { return upto < 0 ? static_cast<int>(n) : upto; }
}  // namespace

RangeList ShardRangesAlong(IntSpan shape, IntSpan mesh_shape,
                           absl::Span<const Placement> placements, IntSpan coord, int dim,
                           int upto) {
  RangeList list;
  if (shape[dim] > 0) list.push_back({0, shape[dim]});
  const int end = Upto(upto, placements.size());
  for (int i = 0; i < end; ++i) {
    const Placement& p = placements[i];
    if (!p.is_any_shard(dim) || mesh_shape[i] <= 1) continue;
    list = SelectPositions(list, ShardPositions(p, RangesSize(list), mesh_shape[i], coord[i]));
  }
  return list;
}

DimRanges ShardRanges(IntSpan shape, IntSpan mesh_shape, absl::Span<const Placement> placements,
                      IntSpan coord, int upto) {
  DimRanges ranges(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    ranges[d] = ShardRangesAlong(shape, mesh_shape, placements, coord, static_cast<int>(d), upto);
  }
  return ranges;
}

Shape ShardShape(IntSpan shape, IntSpan mesh_shape, absl::Span<const Placement> placements,
                 IntSpan coord, int upto) {
  Shape out(shape.begin(), shape.end());
  const int end = Upto(upto, placements.size());
  for (int i = 0; i < end; ++i) {
    const Placement& p = placements[i];
    if (!p.is_any_shard() || mesh_shape[i] <= 1) continue;
    out[p.dim()] = ShardPieceSize(p, out[p.dim()], mesh_shape[i], coord[i]);
  }
  return out;
}

bool NeedsPacking(absl::Span<const Placement> shards, IntSpan shape) {
  if (shards.empty()) return false;
  for (const Placement& p : shards) {
    if (!p.is_shard()) return true;
  }
  for (int i = 0; i < shards.front().dim(); ++i) {
    if (shape[i] != 1) return true;
  }
  return false;
}

std::vector<int64_t> PossibleShardSizes(IntSpan shape, IntSpan mesh_shape,
                                        absl::Span<const Placement> placements, int dim,
                                        int upto) {
  std::vector<int64_t> sizes = {shape[dim]};
  const int end = Upto(upto, placements.size());
  for (int i = 0; i < end; ++i) {
    const Placement& p = placements[i];
    if (!p.is_any_shard(dim) || mesh_shape[i] <= 1) continue;
    std::vector<int64_t> next;
    for (int64_t n : sizes) {
      for (int64_t r = 0; r < mesh_shape[i]; ++r) next.push_back(ShardPieceSize(p, n, mesh_shape[i], r));
    }
    std::sort(next.begin(), next.end());
    next.erase(std::unique(next.begin(), next.end()), next.end());
    sizes = std::move(next);
  }
  return sizes;
}

std::string MeshDimName(absl::Span<const std::string> names, int i) {
  if (i < static_cast<int>(names.size()) && !names[i].empty()) return names[i];
  return absl::StrCat("d", i);
}

absl::StatusOr<Placements> NormalizePlacements(IntSpan shape, IntSpan mesh_shape,
                                               absl::Span<const std::string> mesh_names,
                                               absl::Span<const Placement> placements) {
  if (placements.size() != mesh_shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat("expected ", mesh_shape.size(),
                                                   " placements (one per mesh dim), got ",
                                                   placements.size()));
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("negative size ", shape[d], " in dim ", d));
    }
  }
  const int64_t ndim = static_cast<int64_t>(shape.size());
  Placements out(placements.begin(), placements.end());
  bool have_op = false;
  ReduceOp first_op = ReduceOp::kSum;
  int first_op_dim = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    Placement& p = out[i];
    if (p.is_any_shard()) {
      const int64_t d = p.dim() < 0 ? p.dim() + ndim : p.dim();
      if (d < 0 || d >= ndim) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shard dim ", p.dim(), " of ", p.ToString(), " on mesh dim ",
            MeshDimName(mesh_names, static_cast<int>(i)), " is out of range for a tensor of ",
            ndim, " dims ", ShapeToString(shape)));
      }
      if (d != p.dim()) p = p.WithDim(static_cast<int>(d));
    }
    if (p.is_partial()) {
      if (!have_op) {
        have_op = true;
        first_op = p.reduce_op();
        first_op_dim = static_cast<int>(i);
      } else if (p.reduce_op() != first_op) {
        if (!IsSumLike(first_op) || !IsSumLike(p.reduce_op())) {
          return absl::InvalidArgumentError(absl::StrCat(
              "mixed Partial ops ", Placement::Partial(first_op).ToString(), " (mesh dim ",
              MeshDimName(mesh_names, first_op_dim), ") and ", p.ToString(), " (mesh dim ",
              MeshDimName(mesh_names, static_cast<int>(i)),
              "): only sum and avg may be mixed, because other reductions do not commute"));
        }
      }
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    const Placement& p = out[i];
    if (p.unit() == 1) continue;
    for (int64_t n : PossibleShardSizes(shape, mesh_shape, out, p.dim(), static_cast<int>(i))) {
      if (n % p.unit() != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            p.ToString(), " on mesh dim ", MeshDimName(mesh_names, static_cast<int>(i)),
            " splits a dim of size ", n, " (tensor dim ", p.dim(), " of ", ShapeToString(shape),
            i > 0 ? " after the mesh dims to its left" : "", "), not a whole number of units of ",
            p.unit()));
      }
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    const Placement& p = out[i];
    if (!p.is_strided_shard() || p.blocks().empty()) continue;
    int64_t sum = 0;
    for (int64_t b : p.blocks()) sum += b;
    for (int64_t n : PossibleShardSizes(shape, mesh_shape, out, p.dim(), static_cast<int>(i))) {
      if (n != sum) {
        return absl::InvalidArgumentError(absl::StrCat(
            "blocks of ", p.ToString(), " on mesh dim ", MeshDimName(mesh_names, static_cast<int>(i)),
            " sum to ", sum, " but the dim they split has size ", n, " (tensor dim ", p.dim(),
            " of ", ShapeToString(shape), i > 0 ? " after the mesh dims to its left" : "", ")"));
      }
    }
  }
  return out;
}

// ---- DTensorSpec -------------------------------------------------------------------------------

absl::StatusOr<DTensorSpec> DTensorSpec::Create(DeviceMesh mesh,
                                                absl::Span<const Placement> placements,
                                                IntSpan shape, DType dtype) {
  auto normalized = NormalizePlacements(shape, mesh.shape(), mesh.names(), placements);
  if (!normalized.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid spec ", DTypeName(dtype), ShapeToString(shape), " ",
        PlacementsToString(placements), " on ", mesh.ToString(), ": ",
        normalized.status().message()));
  }
  return FromValidated(std::move(mesh), *std::move(normalized), Shape(shape.begin(), shape.end()),
                       dtype);
}

DTensorSpec DTensorSpec::FromValidated(DeviceMesh mesh, Placements placements, Shape shape,
                                       DType dtype) {
  DTensorSpec s;
  s.mesh_ = std::move(mesh);
  s.placements_ = std::move(placements);
  s.shape_ = std::move(shape);
  s.dtype_ = dtype;
  s.hash_ = absl::HashOf(absl::MakeConstSpan(s.mesh_.shape()), absl::MakeConstSpan(s.placements_),
                         absl::MakeConstSpan(s.shape_), static_cast<int>(dtype));
  return s;
}

absl::StatusOr<DTensorSpec> DTensorSpec::WithPlacements(
    absl::Span<const Placement> placements) const {
  return Create(mesh_, placements, shape_, dtype_);
}

int64_t DTensorSpec::NumShards() const {
  int64_t n = 0;
  for (int i = 0; i < static_cast<int>(placements_.size()); ++i) {
    if (placements_[i].is_any_shard() && mesh_.Size(i) > 1) ++n;
  }
  return n;
}

Shape DTensorSpec::LocalShape(IntSpan coord) const {
  return ShardShape(shape_, mesh_.shape(), placements_, coord);
}

Shape DTensorSpec::Offset(IntSpan coord) const {
  Shape off(shape_.size());
  for (int d = 0; d < ndim(); ++d) off[d] = Offset(coord, d);
  return off;
}

int64_t DTensorSpec::Offset(IntSpan coord, int dim) const {
  const RangeList r = ShardRangesAlong(shape_, mesh_.shape(), placements_, coord, dim);
  return r.empty() ? shape_[dim] : r.front().start;
}

DimRanges DTensorSpec::Ranges(IntSpan coord) const {
  return ShardRanges(shape_, mesh_.shape(), placements_, coord);
}

Shape DTensorSpec::LocalShape() const {
  const auto& c = mesh_.Coordinate();
  if (!c) return Shape{0};
  return LocalShape(*c);
}

Shape DTensorSpec::Offset() const {
  const auto& c = mesh_.Coordinate();
  if (!c) return Shape{};
  return Offset(*c);
}

DimRanges DTensorSpec::Ranges() const {
  const auto& c = mesh_.Coordinate();
  if (!c) return DimRanges{};
  return Ranges(*c);
}

std::string DTensorSpec::ToString() const {
  return absl::StrCat(PlacementsToString(placements_), " on ", mesh_.ToString());
}

std::string DTensorSpec::Describe() const {
  return absl::StrCat(DTypeName(dtype_), ShapeToString(shape_), " ", ToString());
}

bool operator==(const DTensorSpec& a, const DTensorSpec& b) {
  return a.hash_ == b.hash_ && a.dtype_ == b.dtype_ && a.shape_ == b.shape_ &&
         a.placements_ == b.placements_ && a.mesh_ == b.mesh_;
}

}  // namespace dt
