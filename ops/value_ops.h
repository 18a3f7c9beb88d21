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

// One overload per row of DT_OPS and DT_DECLARED_OPS (ops/local/ops.h, where each op is described),
// Value for Tensor: Linear(x, w, bias = Value()), Add(a, b), Mul(x, s), Silu(x), RmsNorm(x,
// weight = Value(), eps = 1e-6), Split(x, sizes, dim) -> std::vector<Value>, ...; Embedding(table,
// ids) is the plain lookup (index offset 0), a vocab-sharded table needs the DTensor form (masked
// lookup).
#define DT_VALUE_PARAM_In(n) , const Value& n
#define DT_VALUE_PARAM_Opt(n) , const Value& n = Value()
#define DT_VALUE_PARAM_Attr(type, n, ...) , type n __VA_OPT__(= __VA_ARGS__)
#define DT_VALUE_OP_(name, params, call, ...) \
  absl::StatusOr<DT_ROW_RESULT(Value, __VA_ARGS__)> name(DT_ROW_LIST(DT_VALUE_PARAM_, params));
#define DT_VALUE_DECLARED_OP_(name, params) DT_VALUE_OP_(name, params, )
DT_OPS(DT_VALUE_OP_)
DT_DECLARED_OPS(DT_VALUE_DECLARED_OP_)
#undef DT_VALUE_DECLARED_OP_
#undef DT_VALUE_OP_
#undef DT_VALUE_PARAM_In
#undef DT_VALUE_PARAM_Opt
#undef DT_VALUE_PARAM_Attr

// The Tensor overloads of the rows of DT_DECLARED_OPS: the op's declaration run on the whole
// tensors (internal::ApplyLocal), as the Value overload runs it on local values.
#define DT_TENSOR_PARAM_In(n) , const Tensor& n
#define DT_TENSOR_PARAM_Opt(n) , const Tensor& n = Tensor()
#define DT_TENSOR_PARAM_Attr(type, n, ...) , type n __VA_OPT__(= __VA_ARGS__)
#define DT_TENSOR_DECLARED_OP_(name, params) \
  absl::StatusOr<Tensor> name(DT_ROW_LIST(DT_TENSOR_PARAM_, params));
DT_DECLARED_OPS(DT_TENSOR_DECLARED_OP_)
#undef DT_TENSOR_DECLARED_OP_
#undef DT_TENSOR_PARAM_In
#undef DT_TENSOR_PARAM_Opt
#undef DT_TENSOR_PARAM_Attr

// Shape ops: the Value forms of DT_LAYOUT_OPS (ops/dtensor_ops.h) that layers use, each written by
// hand (Note [Plain local views skip the dispatch] in value_ops.cc), and Cat.
absl::StatusOr<Value> Reshape(const Value& x, IntSpan shape);
absl::StatusOr<Value> Transpose(const Value& x, int64_t dim0, int64_t dim1);
absl::StatusOr<Value> Unsqueeze(const Value& x, int64_t dim);
absl::StatusOr<Value> Cat(absl::Span<const Value> xs, int64_t dim);

}  // namespace dt::ops
