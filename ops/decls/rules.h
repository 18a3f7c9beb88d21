#pragma once
// Internal: what the op declarations in ops/decls/<family>.cc share — message helpers, the common
// Partial candidates, and one `k<Op>Decl` per row of DT_DTENSOR_OPS (ops/strategy.h), which
// op_decls.cc gathers into the table in OpId order. See docs/ops.md, "Adding an op".
//
// The family files define their functions in this namespace rather than file-local ones, so that
// each row can follow its op's functions directly; their names (Infer<Op>, Cand<Op>, Run<Op>)
// are unique across the files.

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/ops/op_decl.h"
#include "dtensor/ops/view_math.h"

namespace dt::ops::internal::rules {

// The declarations, one per op (defined in the family files).
#define DT_OP_DECL_EXTERN_(name) extern const OpDecl k##name##Decl;
DT_DTENSOR_OPS(DT_OP_DECL_EXTERN_)
#undef DT_OP_DECL_EXTERN_

// ---- messages and checks on global specs -------------------------------------------------------

inline const DTensorSpec& In(const OpCall& call, int j) { return *call.inputs[j]; }
inline bool Has(const OpCall& call, int j) { return call.inputs[j] != nullptr; }
// "x f32[4, 6]"
std::string Arg(const OpCall& call, int j);
// InvalidArgument "<op>: <what>".
absl::Status Bad(const OpCall& call, absl::string_view what);
absl::Status NeedFloat(const OpCall& call, int j);
absl::Status NeedNotBool(const OpCall& call, int j);
absl::Status NeedSameDType(const OpCall& call, int a, int b);
// One output of this shape and dtype.
OutputMetas One(Shape shape, DType dtype);

// ---- candidates ---------------------------------------------------------------------------------

// Linearity: input j keeps its Partial placement on mesh dim i, every other input is replicated,
// and every output is Partial(out_op).
void AddPartialOf(const OpCall& call, int j, int i, int n_out, ReduceOp out_op,
                  DimOptions* options);
// The usual case: input j's Partial(sum|avg) passes through.
void AddLinearPartial(const OpCall& call, int j, int i, int n_out, DimOptions* options);
// Data movement: any Partial passes through; all present inputs must carry the same one.
void AddAnyPartial(const OpCall& call, int i, int n_out, DimOptions* options);
// Elementwise ops (the output's dims are the inputs' broadcast dims): R, and every common shard
// except along the dims in `whole`, which the op needs whole.
void AddElementwiseOptions(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options,
                           std::initializer_list<int> whole = {});
// A one-input op that only moves data, x's dims labelled `m.in[0]`, the output's `m.out[0]`: R,
// the shards it keeps, and any Partial.
void AddMoveOptions(const OpCall& call, LabelMap m, int i, DimOptions* options);
// Input j float when `float_only`, else anything but bool.
absl::Status NeedFloatOrNotBool(const OpCall& call, int j, bool float_only);
// max <-> min (a negated or negatively scaled Partial); others unchanged.
ReduceOp Swapped(ReduceOp op);

// ---- local runs ---------------------------------------------------------------------------------

// One local output (or the error).
LocalOutputs Out(Tensor t);
absl::StatusOr<LocalOutputs> Out(absl::StatusOr<Tensor> t);

// A row's `cuda`: "cuda::X", the row of DT_LOCAL_KERNELS (ops/local/kernels.h) that the local op
// reaches; otherwise why none is needed. tests/ops/op_decl_test.cc checks both.
inline constexpr const char* kMetadataOnly = "none: a view of the local piece (metadata only)";

}  // namespace dt::ops::internal::rules
