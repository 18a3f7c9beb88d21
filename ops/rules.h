#pragma once
// The sharding rules, one row per op in one table (rules.cc, kRules): the op's name, the names of
// its inputs (for messages), its output shapes and dtypes (which also validate the call), its
// candidate placements per mesh dim, and an optional whole-strategy check for what one mesh dim
// cannot see (nested shards, uneven pieces, GQA head ranges). The dispatcher (ops/dispatch.h)
// combines candidates over mesh dims and picks the cheapest. See the table in ops/dtensor_ops.h.

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ops/strategy.h"

namespace dt::dops {

struct OpRule {
  OpId op;
  const char* name;
  // Names of the inputs, e.g. {"x", "w", "bias"}; ops with a variable number of inputs (Cat) use
  // {"tensors"} and print "tensors[i]".
  std::vector<const char*> input_names;
  // Validates the call on global shapes and dtypes; returns the outputs' shapes and dtypes.
  absl::StatusOr<OutputMetas> (*infer)(const OpCall& call);
  // Appends the candidates for mesh dim `mesh_dim`.
  void (*candidates)(const OpCall& call, const OutputMetas& outs, int mesh_dim,
                     DimOptions* options);
  // Optional: OK when a complete strategy is exact for every rank; an error says why not.
  absl::Status (*check)(const OpCall& call, const OutputMetas& outs, const Strategy& s);
  // Optional: errors on inputs no strategy may silently fix (GQA-inconsistent head shards).
  absl::Status (*precheck)(const OpCall& call);
};

// The rule of `op` (every OpId has one).
const OpRule& RuleOf(OpId op);

// The op's name in messages: call.name, else the rule's.
const char* OpName(const OpCall& call);
// "x", "w", "tensors[2]": input j's name in messages.
std::string InputName(const OpCall& call, int j);
// "x [S(0)], w [S(1)] on mesh(tp=4)": the inputs' placements for messages.
std::string DescribeInputs(const OpCall& call);

// ---- view math (pure; used by the View rule and its tests) ---------------------------------------

// View groups: the smallest runs of input dims and output dims with equal products (numel > 0),
// e.g. [2, 3, 4] -> [6, 4] gives ([0, 2) -> [0, 1)), ([2, 3) -> [1, 2)). Size-1 dims join the
// group they precede; trailing ones form groups with no dims on the other side.
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
// otherwise an error naming the first rank and dim that differ.
absl::Status ViewPiecesMatch(IntSpan in, IntSpan out, IntSpan mesh_shape,
                             absl::Span<const Placement> in_pl,
                             absl::Span<const Placement> out_pl);

}  // namespace dt::dops
