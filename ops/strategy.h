#pragma once
// Internal vocabulary of the op declarations (ops/op_decl.h) and the dispatcher (ops/dispatch.h): an
// op call as the rules see it, per-mesh-dim candidate placements, and whole-mesh strategies.
//
// A rule never sees local tensors: it works on global specs and attributes only, so strategy
// choice is the same on every rank and can be cached (See Note [Sharding propagation]).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "dtensor/core/dtype.h"
#include "dtensor/core/shape.h"
#include "dtensor/dtensor/placement.h"
#include "dtensor/dtensor/spec.h"
#include "dtensor/ops/op_attrs.h"

namespace dt::ops::internal {

// Every op with its own rule, once: its OpId k<Name> and its declaration rules::k<Name>Decl
// (ops/decls/<family>.cc; op_decls.cc gathers them in this order). Transpose is a Permute, Flatten
// and Reshape are a View, Chunk is a Split and the tensor-scalar forms of Add/Sub/Mul/Div are
// kBinaryScalar. The rows of DT_DECLARED_OPS (ops/local/ops.h) come last.
#define DT_DTENSOR_OPS(X)                                                                     \
  X(Matmul) X(Linear) X(Binary) X(BinaryScalar) X(Unary) X(Cast) X(Reduce) X(Softmax)          \
  X(RmsNorm) X(LayerNorm) X(Rotary) X(Attention) X(Embedding) X(View) X(Permute) X(Unsqueeze)  \
  X(Squeeze) X(Cat) X(Split) X(TopK) X(Modulate) X(GatedActivation)                            \
  DT_ROW_CALL_EACH(X, DT_DECLARED_OPS(DT_DECLARED_OP_ID_))
#define DT_DECLARED_OP_ID_(name, params) , (name)

#define DT_OP_ID_(name) k##name,
enum class OpId : uint8_t { DT_DTENSOR_OPS(DT_OP_ID_) };
#undef DT_OP_ID_

// One op application: the inputs' global specs (nullptr for an absent optional input) and attrs.
struct OpCall {
  OpId op;
  absl::InlinedVector<const DTensorSpec*, 4> inputs;
  Attrs attrs;                 // the alternative the op's declaration names (ops/op_decl.h)
  const char* name = nullptr;  // the public name ("Add", "Transpose"); the rule's name when null

  template <typename A>
  const A& Attr() const {
    return std::get<A>(attrs);
  }

  int num_inputs() const { return static_cast<int>(inputs.size()); }
  const DTensorSpec& first() const;  // the first present input
};

struct OutputMeta {
  Shape shape;
  DType dtype = DType::kF32;
};
using OutputMetas = absl::InlinedVector<OutputMeta, 2>;

// A candidate for one mesh dim: the placement of every input (R for an absent one) and output.
struct DimOption {
  absl::InlinedVector<Placement, 4> in;
  absl::InlinedVector<Placement, 2> out;
};
using DimOptions = std::vector<DimOption>;

// A candidate for the whole mesh: placement lists per input (empty for an absent one) and output.
struct Strategy {
  absl::InlinedVector<Placements, 4> inputs;
  absl::InlinedVector<Placements, 2> outputs;
};

// ---- helpers shared by the rules -----------------------------------------------------------------

// All-Replicate for `n_in` inputs and `n_out` outputs.
DimOption ReplicateOption(int n_in, int n_out);
// The Partial op input `j` carries on mesh dim `i`, if any.
std::optional<ReduceOp> PartialOf(const OpCall& call, int j, int i);

// Labels describe the einsum-like ops: every dim of every input and output gets a label (or -1:
// never sharded). Dims with one label have one size. Per mesh dim, AddShardOptions adds for each
// label the option "shard it everywhere it occurs": inputs without the label stay R, outputs with it
// are sharded, outputs without it get the label's reduction (kSum -> P(sum), kMax -> P(max)).
// kMasked is kSum for the masked lookup of a vocab-sharded table (contiguous shards only).
// Shard kinds: plain Shard, plus every interleaved shard _S(...) an input carries on that mesh dim
// for that label (so packed weights stay packed), except for kMasked.
enum class LabelKind : uint8_t { kFree, kSum, kMax, kMasked };
struct LabelMap {
  absl::InlinedVector<absl::InlinedVector<int, 6>, 4> in;   // per input (empty for absent)
  absl::InlinedVector<absl::InlinedVector<int, 6>, 2> out;  // per output
  absl::InlinedVector<LabelKind, 8> kinds;                   // per label

  int AddLabel(LabelKind kind) {
    kinds.push_back(kind);
    return static_cast<int>(kinds.size()) - 1;
  }
};
void AddShardOptions(const OpCall& call, const LabelMap& labels, int mesh_dim, DimOptions* options);

// Calls fn(coord) for every coordinate of a mesh of `mesh_shape` (row-major) until it returns an
// error, which it returns. The whole-strategy checks use it to see every rank at once.
template <typename Fn>
absl::Status ForEachCoord(IntSpan mesh_shape, Fn fn) {
  std::vector<int64_t> c(mesh_shape.size(), 0);
  for (;;) {
    absl::Status st = fn(IntSpan(c));
    if (!st.ok()) return st;
    int d = static_cast<int>(mesh_shape.size()) - 1;
    while (d >= 0 && ++c[d] == mesh_shape[d]) c[d--] = 0;
    if (d < 0) return absl::OkStatus();
  }
}
// "(1, 0)".
std::string CoordString(IntSpan c);
// "rank 5 (1, 1)": the global rank at coordinate `c` of `mesh`, for messages.
std::string RankAt(const DeviceMesh& mesh, IntSpan c);

// Identity labels for an op whose output has the shape of input 0 and whose other inputs broadcast
// to it (numpy rules: aligned from the right; a size-1 dim broadcast to a larger one is -1).
// Dims listed in `whole` (of the output) are -1 everywhere.
LabelMap BroadcastLabels(const OpCall& call, IntSpan out_shape, int n_out,
                         absl::Span<const int> whole = {});

}  // namespace dt::ops::internal
