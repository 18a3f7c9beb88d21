#pragma once
// dt::ops on Values (ops/value.h), the third overload of each public op beside the Tensor one
// (ops/local/ops.h) and the DTensor one (ops/dtensor_ops.h); ops/ops.h includes all three. The
// layers' forward code is written once against these and runs either on DTensors (sharding
// propagation, redistribution when needed) or on local tensors (this rank's pieces, no
// communication). Both modes run the op's one declaration (ops/op_decl.h) through the same call
// builder (ops/op_calls.h):
//
//   operands                       runs                                          result
//   all DTensors                   internal::Apply (strategy, then the local run) DTensor
//   all local tensors              internal::ApplyLocal (the declaration's run)   local tensor
//   a DTensor and a local tensor   -                     InvalidArgument (as PyTorch refuses to mix
//                                                        torch.Tensor and DTensor)
//
// Local operands of which some are pieces (a colwise output handed on as a local tensor, Note
// [Local pieces remember their layout] in ops/value.h) run as the DTensor op: an op that needs the
// whole sharded dim gets it gathered or reduced, and the outputs are pieces again.
//
// Undefined optional operands (Value()) are ignored. Messages name the op and both operands:
//   "Linear: x is local f32[2, 4] cpu but w is DTensor(f32[8, 4] [S(0)] on mesh(tp=2), ...); a
//    module reads its parameters' local pieces only in local mode (Note [Local values])"

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dtensor/core/dtype.h"
#include "dtensor/core/shape.h"
#include "dtensor/ops/value.h"
#include "dtensor/ops/local/ops.h"

namespace dt::ops {

// A replicated side input (rotary tables, masks) in the kind of `like`: its local tensor when
// `like` is local, a replicated DTensor on like's mesh when `like` is a DTensor. A DTensor `side`
// must be replicated.
absl::StatusOr<Value> AsKindOf(const Value& side, const Value& like);

absl::StatusOr<Value> Linear(const Value& x, const Value& w, const Value& bias = Value());
absl::StatusOr<Value> Matmul(const Value& a, const Value& b, bool trans_a = false,
                             bool trans_b = false);
// Plain lookup (index offset 0); a vocab-sharded table needs the DTensor form (masked lookup).
absl::StatusOr<Value> Embedding(const Value& table, const Value& ids);
absl::StatusOr<Value> RmsNorm(const Value& x, const Value& weight, double eps);
absl::StatusOr<Value> LayerNorm(const Value& x, const Value& weight, const Value& bias, double eps);

absl::StatusOr<Value> Add(const Value& a, const Value& b);
absl::StatusOr<Value> Sub(const Value& a, const Value& b);
absl::StatusOr<Value> Mul(const Value& a, const Value& b);
absl::StatusOr<Value> Mul(const Value& x, double s);
absl::StatusOr<Value> Div(const Value& x, double s);
absl::StatusOr<Value> Gelu(const Value& x, ops::GeluApproximation approx);
// One per row of DT_UNARY_OPS (ops/local/ops.h): Silu(x), Relu(x), ...
#define DT_UNARY_FUNCTION_(name, formula) absl::StatusOr<Value> name(const Value& x);
DT_UNARY_OPS(DT_UNARY_FUNCTION_)
#undef DT_UNARY_FUNCTION_
absl::StatusOr<Value> Cast(const Value& x, DType dtype);
absl::StatusOr<Value> Modulate(const Value& x, const Value& scale, const Value& shift);
absl::StatusOr<Value> GatedActivation(const Value& gate, const Value& up, ops::UnaryOp act);

absl::StatusOr<Value> ApplyRotary(const Value& x, const Value& cos, const Value& sin,
                                  ops::RotaryStyle style);
absl::StatusOr<Value> ScaledDotProductAttention(const Value& q, const Value& k, const Value& v,
                                                const ops::AttentionOptions& options);

absl::StatusOr<Value> Reshape(const Value& x, IntSpan shape);
absl::StatusOr<Value> Transpose(const Value& x, int64_t dim0, int64_t dim1);
absl::StatusOr<Value> Unsqueeze(const Value& x, int64_t dim);
absl::StatusOr<Value> Cat(absl::Span<const Value> xs, int64_t dim);
absl::StatusOr<std::vector<Value>> Split(const Value& x, absl::Span<const int64_t> sizes,
                                         int64_t dim);
absl::StatusOr<std::vector<Value>> Chunk(const Value& x, int64_t chunks, int64_t dim);

}  // namespace dt::ops
