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
#include "dtensor/ops/strategy.h"

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

}  // namespace dt::dops
