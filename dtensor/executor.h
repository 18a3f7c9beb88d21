#pragma once
// The redistribute executor: runs a RedistributePlan (dtensor/planner.h) on this rank's local
// tensor, one collective per step over the communicator of the step's mesh dim (or flattened
// group). What it issues is counted by mesh/comm_counter.h like every other collective.
//
//   step            this rank does                                         extra local copies
//   all_gather      all_gather (all_gather_v when pieces differ)           none for S(d) with only
//                   into the group tensor; pieces placed by their ranges   size-1 dims before d
//   reduce_scatter  reduce_scatter(_v) of the group tensor, packed rank-   none for such S(d)
//                   major by the pieces' ranges
//   all_reduce      all_reduce of a copy (in place when the input is ours) one (the copy)
//   all_to_all      one all_to_all_views: the block for peer g is my piece none: strided views of
//                   intersected with g's new piece                         both local tensors (Note
//                                                                          [Shard to shard in one pass])
//   local           R -> S view/slice, R -> _S gather of rows, R -> P      as needed
//
// Uneven pieces use the V collectives with exact counts rather than padding, so no byte moves that
// is not data. Partial avg is reduced as sum and divided locally by the number of averaged ranks
// (every backend gets it right; PyTorch issue #162338 reports wrong AVG on gloo).
// See Note [Partial from Replicate] for R -> P.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dtensor/core/tensor.h"
#include "dtensor/dtensor/planner.h"
#include "dtensor/dtensor/spec.h"

namespace dt {

struct ExecuteOptions {
  // The input's storage may be overwritten (the caller gave up its only reference): the first
  // all_reduce then runs in place instead of on a copy.
  bool may_modify_input = false;
};

// Runs `plan` (planned for `src`) on `local`, this rank's piece of `src`. Every member of the mesh
// must call it with the same plan. Returns this rank's piece of the destination layout; a rank
// outside the mesh gets an empty tensor and communicates nothing. The result may share storage with
// `local` (e.g. R -> S(0) is a view).
absl::StatusOr<Tensor> ExecutePlan(const RedistributePlan& plan, const DTensorSpec& src,
                                   Tensor local, const ExecuteOptions& options = {});

// Replicate -> Partial(op) on a mesh dim of k ranks for group rank `group_rank`: the term this rank
// holds (see Note [Partial from Replicate]). May return `x` itself.
absl::StatusOr<Tensor> PartitionReplicated(const Tensor& x, ReduceOp op, int64_t k,
                                           int64_t group_rank);

// The pieces a group of ranks holds of one tensor dim, laid out in a flat buffer one after the
// other in group-rank order: all_gather's output, reduce_scatter's input, Distribute's scatter.
struct PieceLayout {
  Shape shape;                    // the tensor the group jointly holds
  int dim = 0;                    // the dim the pieces split
  std::vector<RangeList> pieces;  // group rank g's positions along `dim`
  std::vector<int64_t> counts;    // elements of g's segment
  int64_t total = 0;              // elements of the buffer
  bool even = true;               // all counts equal: the plain (not _v) collectives suffice
};
PieceLayout MakePieceLayout(IntSpan shape, int dim, std::vector<RangeList> pieces);
// Copies every piece of `full` (of layout.shape) into its segment of the flat `buffer`
// (layout.total elements), and back.
absl::Status PackPieces(const Tensor& full, const PieceLayout& layout, const Tensor& buffer);
absl::Status UnpackPieces(const Tensor& buffer, const PieceLayout& layout, const Tensor& full);

}  // namespace dt
