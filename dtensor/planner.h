#pragma once
// PlanRedistribute: the pure planner that turns one layout of a tensor into another as a sequence
// of collectives, each over one mesh dim (or one flattened group of mesh dims). It needs no
// communicator and no device, so it runs on abstract meshes of any size (the CLI plans for 8192
// ranks) and is property-tested exhaustively. The executor (dtensor/executor.h) runs plans.
//
// One step changes the placement of one mesh dim (PyTorch's transition table):
//
//   from -> to          collective       bytes sent per rank (k ranks, L logical bytes, piece p)
//   S(d) -> R           all_gather       (k-1) p            uneven: all_gather_v, no padding
//   P    -> R           all_reduce       2 (k-1)/k L        avg: sum, then divide
//   P    -> S(d)        reduce_scatter   (k-1) p            uneven: reduce_scatter_v
//   R    -> S(d)        local            0                  a view when contiguous
//   R    -> P           local            0                  internal: sum divides by k
//   S(i) -> S(j)        all_to_all       (k-1)/k p          one all_to_all_v on every backend
//   _S <-> S, R, P, _S  as the S rows, mapping indices through the blocks (Note [Interleaved shards])
//   S -> P, P(a) -> P(b), across meshes: errors
//   anything on a mesh dim of size 1: nothing (the layout is the same)
//
// See Note [Planning] in planner.cc for legality, the greedy and min-cost planners and merging.
//
// Example: f32 [18, 2] on mesh (4, 2), [S(0), S(0)] -> [R, R] (innermost first)
//   step  mesh dims  from  to  collective  bytes
//   0     1          S(0)  R   all_gather  24
//   1     0          S(0)  R   all_gather  120
// With 13 rows the nested chunks (2,2,2,2,2,2,1,0) equal one flat chunk over the 8 ranks, so the
// two merge into one all_gather on the flattened group:
//   0     0+1        S(0)  R   all_gather  112

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "dtensor/dtensor/cost_model.h"
#include "dtensor/dtensor/placement.h"
#include "dtensor/dtensor/spec.h"

namespace dt {

struct PlanStep {
  // One mesh dim, or several (ascending) merged into one collective on their flattened group.
  absl::InlinedVector<int, 2> mesh_dims;
  Placements from, to;  // per entry of mesh_dims
  StepKind collective = StepKind::kLocal;
  int64_t group_size = 1;  // ranks in the group (product of the mesh dims' sizes)
  // Pricing only: the largest logical tensor a group splits (mesh dims left of it applied, rank
  // 0's coordinates). The executor derives each rank's own shapes from the spec, never from this.
  Shape cost_shape;
  int64_t bytes = 0;       // bytes each rank sends (largest over ranks)
  bool crosses_hosts = false;  // some group holds ranks of two hosts (CostModel::ranks_per_host)
  double cost_us = 0;          // predicted time on the link the group uses

  std::string ToString() const;  // "all_gather on d1: S(0) -> R"
};

struct RedistributePlan {
  Placements src, dst;
  std::vector<PlanStep> steps;
  // states[i] is the placement list before steps[i]; states.back() == dst.
  std::vector<Placements> states;
  double cost_us = 0;
  const char* strategy = "none";  // "none" (empty plan), "greedy" or "search"

  bool empty() const { return steps.empty(); }
  int num_collectives() const;  // steps that communicate
  // "[S(0), S(0)] -all_gather(d1)-> [S(0), R] -all_gather(d0)-> [R, R]".
  std::string ToString() const;
};

struct PlannerOptions {
  enum class Strategy : uint8_t {
    kBest,    // greedy and min-cost search; the cheaper, never with more collectives than greedy
    kGreedy,  // PyTorch's greedy order; where it gets stuck (interleaved shards), the search
    kSearch,  // min-cost search only
  };
  Strategy strategy = Strategy::kBest;
  bool merge = true;  // merge consecutive collectives of one kind onto flattened groups
  CostModel cost;     // prices steps; with ranks_per_host, on intra- or inter-host links
  // Replicate -> Partial is planned (a local step) only when allowed: internal use, as in PyTorch
  // (sharding rules and styles produce Partial values; users do not ask for them). Checked before
  // planning, so a refused request never reaches the plan cache.
  bool allow_partial = false;
};

// Plans src -> dst. Errors (InvalidArgument, naming both specs): different meshes, shapes or
// dtypes; Shard -> Partial; Partial(a) -> Partial(b) with a != b; Replicate -> Partial unless
// options.allow_partial.
absl::StatusOr<RedistributePlan> PlanRedistribute(const DTensorSpec& src, const DTensorSpec& dst,
                                                  const PlannerOptions& options = {});

}  // namespace dt
