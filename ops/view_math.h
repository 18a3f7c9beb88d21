#pragma once
// View math (pure): how a view regroups dims, and whether a sharded dim can stay sharded through it.
// Used by the View rule (ops/decls/shape_ops.cc); see PyTorch #179502 for what goes wrong without the check.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "dtensor/core/shape.h"
#include "dtensor/dtensor/placement.h"

namespace dt::ops::internal {

// View groups: the smallest runs of input dims and output dims with equal products (numel > 0),
// e.g. [2, 3, 4] -> [6, 4] gives ([0, 2) -> [0, 1)), ([2, 3) -> [1, 2)). Size-1 dims join the
// group they precede; trailing ones form groups with no dims on the other side.
//
//   in          out          groups (in dims -> out dims)   leads (in, out)  inner (in, out)
//   [2, 3, 4]   [6, 4]       [0, 2) -> [0, 1); [2] -> [1]   0, 0; 2, 1       3, 1; 1, 1
//   [1, 4]      [4, 1]       [0, 2) -> [0, 1); [] -> [1]    1, 0; -, -       1, 1
//   [6, 5]      [2, 15]      [0, 2) -> [0, 2)               0, 0             5, 15
struct ViewGroup {
  int in_begin = 0, in_end = 0;
  int out_begin = 0, out_end = 0;
  int in_lead = -1;   // the first input dim of size > 1 (the only one that may stay sharded)
  int out_lead = -1;  // the same for the output
  int64_t in_inner = 1;   // product of the input dims after in_lead in the group
  int64_t out_inner = 1;  // the same for the output
};
std::vector<ViewGroup> ViewGroups(IntSpan in, IntSpan out);

// OK when every rank's piece of a tensor of `in` laid out as `in_pl` holds the same elements, in
// the same order, as its piece of the view `out` laid out as `out_pl` (so a local reshape is exact);
// otherwise an error naming the first coordinate and dim that differ. Only a group's lead dims may
// be split: rows of the lead, scaled by the inner product, must be the same element runs on both
// sides, for every coordinate (uneven and nested shards included).
absl::Status ViewPiecesMatch(IntSpan in, IntSpan out, IntSpan mesh_shape,
                             absl::Span<const Placement> in_pl,
                             absl::Span<const Placement> out_pl);

}  // namespace dt::ops::internal
