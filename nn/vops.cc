#include "dtensor/nn/vops.h"

#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/dtensor_ops.h"

namespace dt::nn::vops {
namespace {

struct Operand {
  const char* name;
  const Value* value;
};

// True: every defined operand is a DTensor; false: every one is local. Mixed kinds and a call with
// no defined operand are errors.
absl::StatusOr<bool> UseDTensors(absl::string_view op, std::initializer_list<Operand> operands) {
  const Operand* first = nullptr;
  for (const Operand& o : operands) {
    if (!o.value->defined()) continue;
    if (first == nullptr) {
      first = &o;
      continue;
    }
    if (o.value->is_dtensor() != first->value->is_dtensor()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": ", first->name, " is ", first->value->Describe(), " but ", o.name, " is ",
          o.value->Describe(),
          "; a module reads its parameters' local pieces only in local mode (Note [Local values] "
          "in nn/module.h)"));
    }
  }
  if (first == nullptr) return absl::InvalidArgumentError(absl::StrCat(op, ": no operand given"));
  return first->value->is_dtensor();
}

const DTensor& D(const Value& v) {
  static const DTensor* const kNone = new DTensor();
  return v.is_dtensor() ? v.dtensor() : *kNone;
}

const Tensor& L(const Value& v) {
  static const Tensor* const kNone = new Tensor();
  return v.defined() ? v.local() : *kNone;
}

template <typename T>
absl::StatusOr<Value> Wrap(absl::StatusOr<T> r) {
  if (!r.ok()) return std::move(r).status();
  return Value(*std::move(r));
}

template <typename T>
absl::StatusOr<std::vector<Value>> WrapAll(absl::StatusOr<std::vector<T>> r) {
  if (!r.ok()) return std::move(r).status();
  std::vector<Value> out;
  out.reserve(r->size());
  for (T& t : *r) out.emplace_back(std::move(t));
  return out;
}

}  // namespace

absl::StatusOr<Value> AsKindOf(const Value& side, const Value& like) {
  if (!side.defined() || side.is_dtensor() == like.is_dtensor()) return side;
  if (side.is_dtensor()) {
    for (const Placement& p : side.dtensor().placements()) {
      if (!p.is_replicate()) {
        return absl::InvalidArgumentError(
            absl::StrCat("AsKindOf: the side input must be replicated, got ", side.Describe()));
      }
    }
    return Value(side.local());
  }
  const DTensor& d = like.dtensor();
  Placements replicated(d.mesh().ndim(), Placement::Replicate());
  return Wrap(DTensor::FromLocal(side.local(), d.mesh(), replicated));
}

absl::StatusOr<Value> Linear(const Value& x, const Value& w, const Value& bias) {
  DT_ASSIGN_OR_RETURN(bool d, UseDTensors("Linear", {{"x", &x}, {"w", &w}, {"bias", &bias}}));
  if (d) return Wrap(dops::Linear(D(x), D(w), D(bias)));
  return Wrap(ops::Linear(L(x), L(w), L(bias)));
}

absl::StatusOr<Value> Matmul(const Value& a, const Value& b, bool trans_a, bool trans_b) {
  DT_ASSIGN_OR_RETURN(bool d, UseDTensors("Matmul", {{"a", &a}, {"b", &b}}));
  if (d) return Wrap(dops::Matmul(D(a), D(b), trans_a, trans_b));
  return Wrap(ops::Matmul(L(a), L(b), trans_a, trans_b));
}

absl::StatusOr<Value> Embedding(const Value& table, const Value& ids) {
  DT_ASSIGN_OR_RETURN(bool d, UseDTensors("Embedding", {{"table", &table}, {"ids", &ids}}));
  if (d) return Wrap(dops::Embedding(D(table), D(ids)));
  return Wrap(ops::Embedding(L(table), L(ids)));
}

absl::StatusOr<Value> RmsNorm(const Value& x, const Value& weight, double eps) {
  DT_ASSIGN_OR_RETURN(bool d, UseDTensors("RmsNorm", {{"x", &x}, {"weight", &weight}}));
  if (d) return Wrap(dops::RmsNorm(D(x), D(weight), eps));
  return Wrap(ops::RmsNorm(L(x), L(weight), eps));
}

absl::StatusOr<Value> LayerNorm(const Value& x, const Value& weight, const Value& bias,
                                double eps) {
  DT_ASSIGN_OR_RETURN(bool d,
                      UseDTensors("LayerNorm", {{"x", &x}, {"weight", &weight}, {"bias", &bias}}));
  if (d) return Wrap(dops::LayerNorm(D(x), D(weight), D(bias), eps));
  return Wrap(ops::LayerNorm(L(x), L(weight), L(bias), eps));
}

absl::StatusOr<Value> Add(const Value& a, const Value& b) {
  DT_ASSIGN_OR_RETURN(bool d, UseDTensors("Add", {{"a", &a}, {"b", &b}}));
  if (d) return Wrap(dops::Add(D(a), D(b)));
  return Wrap(ops::Add(L(a), L(b)));
}

absl::StatusOr<Value> Sub(const Value& a, const Value& b) {
  DT_ASSIGN_OR_RETURN(bool d, UseDTensors("Sub", {{"a", &a}, {"b", &b}}));
  if (d) return Wrap(dops::Sub(D(a), D(b)));
  return Wrap(ops::Sub(L(a), L(b)));
}

absl::StatusOr<Value> Mul(const Value& a, const Value& b) {
  DT_ASSIGN_OR_RETURN(bool d, UseDTensors("Mul", {{"a", &a}, {"b", &b}}));
  if (d) return Wrap(dops::Mul(D(a), D(b)));
  return Wrap(ops::Mul(L(a), L(b)));
}

absl::StatusOr<Value> Mul(const Value& x, double s) {
  DT_ASSIGN_OR_RETURN(bool d, UseDTensors("Mul", {{"x", &x}}));
  if (d) return Wrap(dops::Mul(D(x), s));
  return Wrap(ops::Mul(L(x), s));
}

absl::StatusOr<Value> Div(const Value& x, double s) {
  DT_ASSIGN_OR_RETURN(bool d, UseDTensors("Div", {{"x", &x}}));
  if (d) return Wrap(dops::Div(D(x), s));
  return Wrap(ops::Div(L(x), s));
}

absl::StatusOr<Value> Silu(const Value& x) {
  DT_ASSIGN_OR_RETURN(bool d, UseDTensors("Silu", {{"x", &x}}));
  if (d) return Wrap(dops::Silu(D(x)));
  return Wrap(ops::Silu(L(x)));
}

absl::StatusOr<Value> Gelu(const Value& x, ops::GeluApproximation approx) {
  DT_ASSIGN_OR_RETURN(bool d, UseDTensors("Gelu", {{"x", &x}}));
  if (d) return Wrap(dops::Gelu(D(x), approx));
  return Wrap(ops::Gelu(L(x), approx));
}

absl::StatusOr<Value> Relu(const Value& x) {
  DT_ASSIGN_OR_RETURN(bool d, UseDTensors("Relu", {{"x", &x}}));
  if (d) return Wrap(dops::Relu(D(x)));
  return Wrap(ops::Relu(L(x)));
}

absl::StatusOr<Value> Cast(const Value& x, DType dtype) {
  DT_ASSIGN_OR_RETURN(bool d, UseDTensors("Cast", {{"x", &x}}));
  if (d) return Wrap(dops::Cast(D(x), dtype));
  return Wrap(ops::Cast(L(x), dtype));
}

absl::StatusOr<Value> Modulate(const Value& x, const Value& scale, const Value& shift) {
  DT_ASSIGN_OR_RETURN(bool d,
                      UseDTensors("Modulate", {{"x", &x}, {"scale", &scale}, {"shift", &shift}}));
  if (d) return Wrap(dops::Modulate(D(x), D(scale), D(shift)));
  return Wrap(ops::Modulate(L(x), L(scale), L(shift)));
}

absl::StatusOr<Value> ApplyRotary(const Value& x, const Value& cos, const Value& sin,
                                  ops::RotaryStyle style) {
  DT_ASSIGN_OR_RETURN(bool d,
                      UseDTensors("ApplyRotary", {{"x", &x}, {"cos", &cos}, {"sin", &sin}}));
  if (d) return Wrap(dops::ApplyRotary(D(x), D(cos), D(sin), style));
  return Wrap(ops::ApplyRotary(L(x), L(cos), L(sin), style));
}

absl::StatusOr<Value> ScaledDotProductAttention(const Value& q, const Value& k, const Value& v,
                                                const ops::AttentionOptions& options) {
  DT_ASSIGN_OR_RETURN(bool d,
                      UseDTensors("ScaledDotProductAttention", {{"q", &q}, {"k", &k}, {"v", &v}}));
  if (d) return Wrap(dops::ScaledDotProductAttention(D(q), D(k), D(v), options));
  return Wrap(ops::ScaledDotProductAttention(L(q), L(k), L(v), options));
}

absl::StatusOr<Value> Reshape(const Value& x, IntSpan shape) {
  DT_ASSIGN_OR_RETURN(bool d, UseDTensors("Reshape", {{"x", &x}}));
  if (d) return Wrap(dops::Reshape(D(x), shape));
  return Wrap(L(x).Reshape(shape));
}

absl::StatusOr<Value> Transpose(const Value& x, int64_t dim0, int64_t dim1) {
  DT_ASSIGN_OR_RETURN(bool d, UseDTensors("Transpose", {{"x", &x}}));
  if (d) return Wrap(dops::Transpose(D(x), dim0, dim1));
  return Wrap(L(x).Transpose(dim0, dim1));
}

absl::StatusOr<Value> Unsqueeze(const Value& x, int64_t dim) {
  DT_ASSIGN_OR_RETURN(bool d, UseDTensors("Unsqueeze", {{"x", &x}}));
  if (d) return Wrap(dops::Unsqueeze(D(x), dim));
  return Wrap(L(x).Unsqueeze(dim));
}

absl::StatusOr<Value> Cat(absl::Span<const Value> xs, int64_t dim) {
  if (xs.empty()) return absl::InvalidArgumentError("Cat: no tensors given");
  for (size_t i = 1; i < xs.size(); ++i) {
    DT_RETURN_IF_ERROR(
        UseDTensors("Cat", {{"tensors[0]", &xs[0]}, {"tensors[i]", &xs[i]}}).status());
  }
  if (xs[0].is_dtensor()) {
    std::vector<DTensor> ds;
    for (const Value& v : xs) ds.push_back(v.dtensor());
    return Wrap(dops::Cat(ds, dim));
  }
  std::vector<Tensor> ts;
  for (const Value& v : xs) ts.push_back(v.local());
  return Wrap(ops::Cat(ts, dim));
}

absl::StatusOr<std::vector<Value>> Split(const Value& x, absl::Span<const int64_t> sizes,
                                         int64_t dim) {
  DT_ASSIGN_OR_RETURN(bool d, UseDTensors("Split", {{"x", &x}}));
  if (d) return WrapAll(dops::Split(D(x), sizes, dim));
  return WrapAll(ops::Split(L(x), sizes, dim));
}

absl::StatusOr<std::vector<Value>> Chunk(const Value& x, int64_t chunks, int64_t dim) {
  DT_ASSIGN_OR_RETURN(bool d, UseDTensors("Chunk", {{"x", &x}}));
  if (d) return WrapAll(dops::Chunk(D(x), chunks, dim));
  return WrapAll(ops::Chunk(L(x), chunks, dim));
}

}  // namespace dt::nn::vops
