#include "dtensor/ops/dtensor_ops.h"

#include <utility>

#include "dtensor/core/status.h"
#include "dtensor/ops/dispatch.h"
#include "dtensor/ops/op_calls.h"

// Every function here is its builder (ops/op_calls.h) applied to the DTensors' specs, then
// internal::Apply (ops/dispatch.h).

namespace dt::ops {
namespace {

using internal::OpCall;
using internal::Outputs;
using Inputs = std::initializer_list<const DTensor*>;

absl::StatusOr<Outputs> ApplyAll(const absl::StatusOr<OpCall>& call, Inputs inputs) {
  if (!call.ok()) return call.status();
  return internal::Apply(*call, absl::MakeConstSpan(inputs.begin(), inputs.size()));
}
absl::StatusOr<DTensor> Apply1(const absl::StatusOr<OpCall>& call, Inputs inputs) {
  DT_ASSIGN_OR_RETURN(Outputs outs, ApplyAll(call, inputs));
  return std::move(outs[0]);
}
absl::StatusOr<std::vector<DTensor>> ApplyVector(const absl::StatusOr<OpCall>& call,
                                                 Inputs inputs) {
  DT_ASSIGN_OR_RETURN(Outputs outs, ApplyAll(call, inputs));
  return std::vector<DTensor>(std::make_move_iterator(outs.begin()),
                              std::make_move_iterator(outs.end()));
}

const DTensorSpec* S(const DTensor& x) { return x.defined() ? &x.spec() : nullptr; }
const DTensor* Opt(const DTensor& x) { return x.defined() ? &x : nullptr; }

}  // namespace

// ---- GEMM ----------------------------------------------------------------------------------------

absl::StatusOr<DTensor> Matmul(const DTensor& a, const DTensor& b, bool trans_a, bool trans_b) {
  return Apply1(internal::calls::Matmul(S(a), S(b), trans_a, trans_b), {&a, &b});
}

absl::StatusOr<DTensor> Linear(const DTensor& x, const DTensor& w, const DTensor& bias) {
  return Apply1(internal::calls::Linear(S(x), S(w), S(bias)), {&x, &w, Opt(bias)});
}

// ---- pointwise -----------------------------------------------------------------------------------

absl::StatusOr<DTensor> Binary(ops::BinaryOp op, const DTensor& a, const DTensor& b) {
  return Apply1(internal::calls::Binary(op, S(a), S(b)), {&a, &b});
}
absl::StatusOr<DTensor> Add(const DTensor& a, const DTensor& b) {
  return Binary(ops::BinaryOp::kAdd, a, b);
}
absl::StatusOr<DTensor> Sub(const DTensor& a, const DTensor& b) {
  return Binary(ops::BinaryOp::kSub, a, b);
}
absl::StatusOr<DTensor> Mul(const DTensor& a, const DTensor& b) {
  return Binary(ops::BinaryOp::kMul, a, b);
}
absl::StatusOr<DTensor> Div(const DTensor& a, const DTensor& b) {
  return Binary(ops::BinaryOp::kDiv, a, b);
}

absl::StatusOr<DTensor> Binary(ops::BinaryOp op, const DTensor& x, double s) {
  return Apply1(internal::calls::BinaryScalar(op, S(x), s), {&x});
}
absl::StatusOr<DTensor> Add(const DTensor& x, double s) { return Binary(ops::BinaryOp::kAdd, x, s); }
absl::StatusOr<DTensor> Sub(const DTensor& x, double s) { return Binary(ops::BinaryOp::kSub, x, s); }
absl::StatusOr<DTensor> Mul(const DTensor& x, double s) { return Binary(ops::BinaryOp::kMul, x, s); }
absl::StatusOr<DTensor> Div(const DTensor& x, double s) { return Binary(ops::BinaryOp::kDiv, x, s); }

absl::StatusOr<DTensor> Unary(ops::UnaryOp op, const DTensor& x) {
  return Apply1(internal::calls::Unary(op, S(x)), {&x});
}
absl::StatusOr<DTensor> Neg(const DTensor& x) { return Unary(ops::UnaryOp::kNeg, x); }
absl::StatusOr<DTensor> Gelu(const DTensor& x, ops::GeluApproximation approx) {
  return Apply1(internal::calls::Gelu(S(x), approx), {&x});
}
#define DT_UNARY_FUNCTION_(name, formula) \
  absl::StatusOr<DTensor> name(const DTensor& x) { return Unary(ops::UnaryOp::k##name, x); }
DT_UNARY_OPS(DT_UNARY_FUNCTION_)
#undef DT_UNARY_FUNCTION_

absl::StatusOr<DTensor> Cast(const DTensor& x, DType dtype) {
  return Apply1(internal::calls::Cast(S(x), dtype), {&x});
}

absl::StatusOr<DTensor> Modulate(const DTensor& x, const DTensor& scale, const DTensor& shift) {
  return Apply1(internal::calls::Modulate(S(x), S(scale), S(shift)), {&x, &scale, &shift});
}

absl::StatusOr<DTensor> GatedActivation(const DTensor& gate, const DTensor& up, ops::UnaryOp act) {
  return Apply1(internal::calls::GatedActivation(S(gate), S(up), act), {&gate, &up});
}

// ---- reductions ----------------------------------------------------------------------------------

absl::StatusOr<DTensor> Reduce(ops::Reduction op, const DTensor& x, int64_t dim, bool keepdim) {
  return Apply1(internal::calls::Reduce(op, S(x), dim, keepdim), {&x});
}
absl::StatusOr<DTensor> Sum(const DTensor& x, int64_t dim, bool keepdim) {
  return Reduce(ops::Reduction::kSum, x, dim, keepdim);
}
absl::StatusOr<DTensor> Mean(const DTensor& x, int64_t dim, bool keepdim) {
  return Reduce(ops::Reduction::kMean, x, dim, keepdim);
}
absl::StatusOr<DTensor> Max(const DTensor& x, int64_t dim, bool keepdim) {
  return Reduce(ops::Reduction::kMax, x, dim, keepdim);
}
absl::StatusOr<DTensor> Argmax(const DTensor& x, int64_t dim, bool keepdim) {
  return Reduce(ops::Reduction::kArgmax, x, dim, keepdim);
}

// ---- normalisation, rotary, attention, lookup ----------------------------------------------------

absl::StatusOr<DTensor> Softmax(const DTensor& x, int64_t dim) {
  return Apply1(internal::calls::Softmax(S(x), dim, false), {&x});
}
absl::StatusOr<DTensor> LogSoftmax(const DTensor& x, int64_t dim) {
  return Apply1(internal::calls::Softmax(S(x), dim, true), {&x});
}

absl::StatusOr<DTensor> RmsNorm(const DTensor& x, const DTensor& weight, double eps) {
  return Apply1(internal::calls::RmsNorm(S(x), S(weight), eps), {&x, Opt(weight)});
}

absl::StatusOr<DTensor> LayerNorm(const DTensor& x, const DTensor& weight, const DTensor& bias,
                                  double eps) {
  return Apply1(internal::calls::LayerNorm(S(x), S(weight), S(bias), eps),
                {&x, Opt(weight), Opt(bias)});
}

absl::StatusOr<DTensor> ApplyRotary(const DTensor& x, const DTensor& cos, const DTensor& sin,
                                    ops::RotaryStyle style) {
  return Apply1(internal::calls::Rotary(S(x), S(cos), S(sin), style), {&x, &cos, &sin});
}

absl::StatusOr<DTensor> ScaledDotProductAttention(const DTensor& q, const DTensor& k,
                                                  const DTensor& v,
                                                  const ops::AttentionOptions& options) {
  return Apply1(internal::calls::Attention(S(q), S(k), S(v), options), {&q, &k, &v});
}

absl::StatusOr<DTensor> Embedding(const DTensor& table, const DTensor& ids) {
  return Apply1(internal::calls::Embedding(S(table), S(ids)), {&table, &ids});
}

// ---- shape ops -----------------------------------------------------------------------------------

absl::StatusOr<DTensor> View(const DTensor& x, IntSpan shape) {
  return Apply1(internal::calls::View("View", S(x), shape), {&x});
}
absl::StatusOr<DTensor> Reshape(const DTensor& x, IntSpan shape) {
  return Apply1(internal::calls::View("Reshape", S(x), shape), {&x});
}
absl::StatusOr<DTensor> Flatten(const DTensor& x, int64_t start_dim, int64_t end_dim) {
  return Apply1(internal::calls::Flatten(S(x), start_dim, end_dim), {&x});
}
absl::StatusOr<DTensor> Transpose(const DTensor& x, int64_t dim0, int64_t dim1) {
  return Apply1(internal::calls::Transpose(S(x), dim0, dim1), {&x});
}
absl::StatusOr<DTensor> Permute(const DTensor& x, IntSpan dims) {
  return Apply1(internal::calls::Permute("Permute", S(x), dims), {&x});
}
absl::StatusOr<DTensor> Unsqueeze(const DTensor& x, int64_t dim) {
  return Apply1(internal::calls::Unsqueeze(S(x), dim), {&x});
}
absl::StatusOr<DTensor> Squeeze(const DTensor& x, int64_t dim) {
  return Apply1(internal::calls::Squeeze(S(x), dim), {&x});
}

absl::StatusOr<DTensor> Cat(absl::Span<const DTensor> tensors, int64_t dim) {
  std::vector<const DTensorSpec*> specs;
  std::vector<const DTensor*> ptrs;
  for (const DTensor& t : tensors) {
    specs.push_back(S(t));
    ptrs.push_back(&t);
  }
  DT_ASSIGN_OR_RETURN(const OpCall call, internal::calls::Cat(specs, dim));
  DT_ASSIGN_OR_RETURN(Outputs outs, internal::Apply(call, ptrs));
  return std::move(outs[0]);
}

absl::StatusOr<std::vector<DTensor>> Split(const DTensor& x, absl::Span<const int64_t> sizes,
                                           int64_t dim) {
  return ApplyVector(internal::calls::Split(S(x), sizes, dim), {&x});
}

absl::StatusOr<std::vector<DTensor>> Chunk(const DTensor& x, int64_t chunks, int64_t dim) {
  return ApplyVector(internal::calls::Chunk(S(x), chunks, dim), {&x});
}

absl::StatusOr<TopKOf<DTensor>> TopK(const DTensor& x, int64_t k, int64_t dim, bool largest) {
  DT_ASSIGN_OR_RETURN(Outputs outs, ApplyAll(internal::calls::TopK(S(x), k, dim, largest), {&x}));
  return TopKOf<DTensor>{std::move(outs[0]), std::move(outs[1])};
}

}  // namespace dt::ops
