#pragma once
// Each public DTensor op's arguments turned into its OpCall — the one place an op's argument
// normalization lives (dims wrapped, a -1 size resolved, a permutation checked, the public name for
// messages). The calls read only the inputs' specs (global shape, dtype, placements; nullptr for an
// absent optional input), so one builder serves both entry points:
//
//   ops::Linear(DTensor x, ..) = internal::Apply(calls::Linear(&x.spec(), ...), DTensors)
//   ops::Linear(Value x, ..)   = the same call on the values' specs, run as a DTensor op or, for
//                                local tensors, by the declaration's own local kernel (ApplyLocal)
//
// Internal (dt::ops::internal::calls): users call the public ops of ops/ops.h, never these.
// The public ops are made from the rows of DT_OPS (ops/local/ops.h), each of which names its
// builder here; the builders of the rows of DT_DECLARED_OPS are made from the rows (below).

#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/status.h"
#include "dtensor/dtensor/spec.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/ops/strategy.h"

namespace dt::ops::internal::calls {

using Spec = const DTensorSpec*;

absl::StatusOr<OpCall> Matmul(Spec a, Spec b, bool trans_a, bool trans_b);
absl::StatusOr<OpCall> Linear(Spec x, Spec w, Spec bias);
absl::StatusOr<OpCall> Binary(ops::BinaryOp op, Spec a, Spec b);
absl::StatusOr<OpCall> BinaryScalar(ops::BinaryOp op, Spec x, double s);
absl::StatusOr<OpCall> Unary(ops::UnaryOp op, Spec x);
absl::StatusOr<OpCall> Gelu(Spec x, ops::GeluApproximation approx);
absl::StatusOr<OpCall> Cast(Spec x, DType dtype);
absl::StatusOr<OpCall> Modulate(Spec x, Spec scale, Spec shift);
absl::StatusOr<OpCall> GatedActivation(Spec gate, Spec up, ops::UnaryOp act);
absl::StatusOr<OpCall> Reduce(ops::Reduction op, Spec x, int64_t dim, bool keepdim);
absl::StatusOr<OpCall> Softmax(Spec x, int64_t dim, bool log);
absl::StatusOr<OpCall> RmsNorm(Spec x, Spec weight, double eps);
absl::StatusOr<OpCall> LayerNorm(Spec x, Spec weight, Spec bias, double eps);
absl::StatusOr<OpCall> Rotary(Spec x, Spec cos, Spec sin, ops::RotaryStyle style);
absl::StatusOr<OpCall> Attention(Spec q, Spec k, Spec v, const ops::AttentionOptions& options);
absl::StatusOr<OpCall> Embedding(Spec table, Spec ids);
// `name`: "View" or "Reshape" (the same op).
absl::StatusOr<OpCall> View(const char* name, Spec x, IntSpan shape);
absl::StatusOr<OpCall> Flatten(Spec x, int64_t start_dim, int64_t end_dim);
absl::StatusOr<OpCall> Permute(const char* name, Spec x, IntSpan dims);
absl::StatusOr<OpCall> Transpose(Spec x, int64_t dim0, int64_t dim1);
absl::StatusOr<OpCall> Unsqueeze(Spec x, int64_t dim);
absl::StatusOr<OpCall> Squeeze(Spec x, int64_t dim);
absl::StatusOr<OpCall> Cat(absl::Span<const Spec> tensors, int64_t dim);
absl::StatusOr<OpCall> Split(Spec x, absl::Span<const int64_t> sizes, int64_t dim);
absl::StatusOr<OpCall> Chunk(Spec x, int64_t chunks, int64_t dim);
absl::StatusOr<OpCall> TopK(Spec x, int64_t k, int64_t dim, bool largest);

// One per row of DT_DECLARED_OPS: OpCall{OpId::k<Name>, {its tensors}, <Name>Attrs{its attributes}}.
#define DT_CALLS_PARAM_In(n) , Spec n
#define DT_CALLS_PARAM_Opt(n) , Spec n
#define DT_CALLS_PARAM_Attr(type, n, ...) , type n
#define DT_CALLS_DECLARED_(name, params) \
  absl::StatusOr<OpCall> name(DT_ROW_LIST(DT_CALLS_PARAM_, params));
DT_DECLARED_OPS(DT_CALLS_DECLARED_)
#undef DT_CALLS_DECLARED_

// A row's builder as a function of the specs of its tensors, in order: for Linear,
// [&](Spec x, Spec w, Spec bias) -> absl::StatusOr<OpCall> { return calls::Linear(x, w, bias); }.
// The attributes the call names are the public op's parameters of those names, in the scope
// where this is written.
#define DT_ROW_BUILDER(params, call)                                                            \
  [&](DT_ROW_LIST(DT_ROW_BUILDER_SPEC_, params)) -> absl::StatusOr<::dt::ops::internal::OpCall> { \
    return ::dt::ops::internal::calls::call;                                                    \
  }
#define DT_ROW_BUILDER_SPEC_In(n) , ::dt::ops::internal::calls::Spec n
#define DT_ROW_BUILDER_SPEC_Opt(n) , ::dt::ops::internal::calls::Spec n
#define DT_ROW_BUILDER_SPEC_Attr(type, n, ...)

// f(specs[0], ..., specs[n - 1]) for an f of n Spec parameters (a DT_ROW_BUILDER).
template <typename R, typename C, typename... A>
constexpr size_t ArityOf(R (C::*)(A...) const) {
  return sizeof...(A);
}
template <typename F>
absl::StatusOr<OpCall> CallOnSpecs(absl::Span<const Spec> specs, const F& f) {
  constexpr size_t n = ArityOf(&F::operator());
  DT_CHECK(specs.size() == n, "a row's builder takes ", n, " specs, got ", specs.size());
  return [&]<size_t... i>(std::index_sequence<i...>) { return f(specs[i]...); }(
      std::make_index_sequence<n>{});
}

}  // namespace dt::ops::internal::calls
