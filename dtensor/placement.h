#pragma once
// Placement: how one mesh dim lays out a global tensor (PyTorch DTensor semantics).
//
//   text                 meaning on a mesh dim of k ranks (tensor dim d of logical size n)
//   R                    Replicate: every rank holds the whole logical tensor
//   S(d)                 Shard: torch.chunk(n, k) along d; chunk c = ceil(n/k), rank r holds
//                        [r*c, min(n, (r+1)*c)); at most one short shard, later ones empty
//   S(d,unit=u)          Shard in whole units of u (n a multiple of u): torch.chunk of the n/u
//                        units over the k ranks, each unit's u elements kept together
//   P(op)                Partial: every rank holds a full-shape term; the value is the reduction
//                        (sum, avg, min, max, prod) of the terms over the mesh dim
//   _S(d,sf)             Interleaved shard: cut d into sf blocks with torch.chunk(n, sf), chunk
//                        every block over the k ranks, and give rank r the concatenation of its
//                        chunk of every block, in block order (PyTorch's _StridedShard)
//   _S(d,[b0,b1,...])    The same with explicit block sizes b0+b1+... == n (fused weights, e.g.
//                        Flux2's fused projection _S(0,[6144,6144,6144,18432,18432]))
//
// Example: 10 rows on k=2 ranks
//   S(0)          r0 rows 0-4           r1 rows 5-9
//   S(0,unit=2)   r0 rows 0-5           r1 rows 6-9     (5 units of 2: 3 + 2)
//   _S(0,2)       r0 rows 0-2, 5-7      r1 rows 3-4, 8-9
//   _S(0,[4,6])   r0 rows 0-1, 4-6      r1 rows 2-3, 7-9
//
// See Note [Interleaved shards] for why block lists are a placement of their own, and Note [Unit
// shards] for units.
//
// Placements are small immutable values (block lists are shared), compare structurally and hash
// cheaply. Parsing accepts the canonical forms above plus PyTorch's long names (`Shard(0)`,
// `Replicate()`, `Partial(sum)`, `Partial()`, `P` = P(sum), `_StridedShard(0, sf=2)`); printing
// always gives the canonical form. A negative shard dim counts from the end and is normalized when
// a DTensorSpec is created.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "dtensor/core/reduce_op.h"

namespace dt {

// Note [Interleaved shards]
// A fused weight packs several logical matrices along one dim, e.g. Flux2's single-stream
// projection rows [q(D) | k(D) | v(D) | mlp_in(M) | mlp_gate(M)]. Tensor parallelism must give each
// rank its slice of every block (heads of q, k, v and columns of both MLP halves), so a rank's shard
// is a concatenation of non-adjacent pieces. diffusers labels such shards `Shard(0)`, so gathering
// them returns the blocks permuted. Here the placement says what the shard is: `_S(d, blocks)`
// (or `_S(d, sf)` for sf equal torch.chunk blocks), and every transition (gather, reduce-scatter,
// all-to-all, local split) maps rows through the block structure, so `FullTensor()` returns the
// checkpoint layout. Block sizes need not be divisible by k: each block is chunked with torch.chunk
// semantics. With nested sharding the blocks describe the logical tensor the mesh dim sees (after
// the mesh dims to its left), so they must sum to that size on every rank.

// Note [Unit shards]
// Tensor parallelism over attention heads cuts a projection's rows [heads * head_dim] into whole
// heads. When tp divides the heads, S(d) does; when it does not (SmolLM2's 9 heads at tp 2), the
// uneven S(d) is torch.chunk over the rows (288 + 288 rows: 4.5 heads each), and an interleaved
// _S(d,[...]) chunks every block over all ranks, so neither gives rank 0 heads 0-4 and rank 1
// heads 5-8 (320 + 256 rows) in general. S(d,unit=u) is that layout: torch.chunk over units of u
// elements, i.e. exactly the S(d) of the same tensor viewed with the units as a dim of their own
// ([heads, head_dim] instead of [heads * head_dim]). It is a Shard (is_shard(): every piece is one
// contiguous run in rank order, so packing, local slicing and the attention's head bookkeeping
// treat it as they treat S(d)); only the piece sizes differ, and they come from ShardPositions /
// ShardPieceSize like every other placement's, so the planner, the executor and the local-shape
// functions need no case of their own. Unit 1 is plain S(d). A unit is a property of the layout,
// not of the sizes: S(0,unit=64) and S(0) are different placements even where their pieces
// coincide (tp dividing the units), and Redistribute between them is an ordinary shard-to-shard
// step. Op rules propagate a unit shard along a dim whose size is unchanged (elementwise, matmul)
// and fall back to plain shards where they cut or join the dim (concat, split, reshape).

enum class PlacementKind : uint8_t { kReplicate, kShard, kStridedShard, kPartial };

class Placement {
 public:
  // Replicate by default.
  Placement() = default;
  static Placement Replicate() { return Placement(); }
  static Placement Shard(int dim);
  // S(dim,unit=unit) (Note [Unit shards]); unit 1 is Shard(dim). unit must be >= 1.
  static Placement Shard(int dim, int64_t unit);
  static Placement Partial(ReduceOp op = ReduceOp::kSum);
  // _S(dim, split_factor); split_factor 1 is plain Shard(dim). split_factor must be >= 1 (the
  // parser reports a bad value; in code it is an internal invariant).
  static Placement StridedShard(int dim, int64_t split_factor);
  // _S(dim, [blocks...]); every block >= 0, at least one block.
  static Placement BlockShard(int dim, std::vector<int64_t> blocks);

  PlacementKind kind() const { return kind_; }
  bool is_replicate() const { return kind_ == PlacementKind::kReplicate; }
  bool is_partial() const { return kind_ == PlacementKind::kPartial; }
  // Shard(d), in units or not: one contiguous piece per rank.
  bool is_shard() const { return kind_ == PlacementKind::kShard; }
  bool is_strided_shard() const { return kind_ == PlacementKind::kStridedShard; }
  // Shard or interleaved shard: the mesh dim splits a tensor dim.
  bool is_any_shard() const { return is_shard() || is_strided_shard(); }
  bool is_any_shard(int dim) const { return is_any_shard() && dim_ == dim; }

  int dim() const { return dim_; }              // shard dim (any shard kind)
  ReduceOp reduce_op() const { return op_; }    // partial only
  // The unit of S(d,unit=u); 1 for every other placement.
  int64_t unit() const { return unit_; }
  // Explicit blocks of _S(d,[...]); empty otherwise.
  absl::Span<const int64_t> blocks() const;
  // The block sizes this placement cuts a logical dim of size n into (torch.chunk(n, sf) or the
  // explicit list; one block [n] for Shard).
  absl::InlinedVector<int64_t, 8> BlockSizes(int64_t n) const;

  // The same placement with its shard dim replaced (normalizing negative dims).
  Placement WithDim(int dim) const;

  std::string ToString() const;  // canonical text
  size_t Hash() const;
  friend bool operator==(const Placement& a, const Placement& b);
  friend bool operator!=(const Placement& a, const Placement& b) { return !(a == b); }
  template <typename H>
  friend H AbslHashValue(H h, const Placement& p) {
    return H::combine(std::move(h), p.Hash());
  }

 private:
  PlacementKind kind_ = PlacementKind::kReplicate;
  ReduceOp op_ = ReduceOp::kSum;
  int dim_ = 0;
  int64_t sf_ = 0;
  int64_t unit_ = 1;
  std::shared_ptr<const std::vector<int64_t>> blocks_;
};

using Placements = absl::InlinedVector<Placement, 4>;

// "S(0)", "S(0,unit=64)", "R", "P(avg)", "_S(0,2)", "_S(1,[2,2,4])", and the long forms listed
// above.
absl::StatusOr<Placement> ParsePlacement(absl::string_view text);
// A comma-separated list, optionally in brackets: "S(0),R" or "[S(0), _S(0,[3,5])]".
absl::StatusOr<Placements> ParsePlacements(absl::string_view text);
// "[S(0), R]".
std::string PlacementsToString(absl::Span<const Placement> placements);
// "S(0),R" — the compact form used on command lines.
std::string PlacementsToCompactString(absl::Span<const Placement> placements);

// Sum or avg: the reductions that linear ops commute with and that may be mixed or merged (avg is
// reduced as a sum, then divided).
inline bool IsSumLike(ReduceOp op) { return op == ReduceOp::kSum || op == ReduceOp::kAvg; }

// torch.chunk of n elements into k parts: part r has `size` elements at `offset`; an empty part's
// offset is n (PyTorch's convention for empty shards).
struct Chunk {
  int64_t offset = 0;
  int64_t size = 0;
};
Chunk ChunkOf(int64_t n, int64_t k, int64_t r);

}  // namespace dt
