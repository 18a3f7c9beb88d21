#include "dtensor/ops/value_ops.h"

#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/dispatch.h"
#include "dtensor/ops/dtensor_ops.h"
#include "dtensor/ops/op_calls.h"

// Every op here is the call its builder (ops/op_calls.h) makes from the operands' specs, run by
// Run: through internal::Apply on DTensors, through internal::ApplyLocal (the declaration's own
// local kernel) on local tensors. Nothing here calls a kernel by hand, so the two modes cannot
// drift.

namespace dt::ops {
namespace {

struct Operand {
  const char* name;
  const Value* value;
  bool optional = false;  // an undefined value means "none"
};

// True: every defined operand is a DTensor; false: every one is local. Mixed kinds and a call with
// no defined operand are errors.
absl::StatusOr<bool> UseDTensors(absl::string_view op, absl::Span<const Operand> operands) {
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

// A local tensor's spec: the whole tensor on a one-rank mesh of its own (what an op's builder and
// `infer` read: shape and dtype).
DTensorSpec LocalSpec(const Tensor& t) {
  static const DeviceMesh* const kLocal = new DeviceMesh(DeviceMesh::Abstract({1}, {"local"}).value());
  return DTensorSpec::FromValidated(*kLocal, {Placement::Replicate()}, t.shape(), t.dtype());
}

using Builder =
    absl::FunctionRef<absl::StatusOr<internal::OpCall>(absl::Span<const DTensorSpec* const>)>;

// Note [Local pieces remember their layout] (ops/value.h): local operands of which some are pieces
// run as the DTensor op does — pieces as their global tensors, the other local operands as
// replicated on the pieces' mesh, redistributed where the op's strategy needs it — and the
// outputs come back as pieces (plain local values when replicated).
absl::StatusOr<std::vector<Value>> RunOnPieces(const char* op, absl::Span<const Operand> operands,
                                               Builder build) {
  static const DTensor* const kUndefined = new DTensor();
  const Value* first = nullptr;
  for (const Operand& o : operands) {
    if (first == nullptr && o.value->piece_of() != nullptr) first = o.value;
  }
  const DeviceMesh& mesh = first->piece_of()->mesh();
  const size_t n = operands.size();
  std::vector<DTensor> held(n);
  std::vector<const DTensor*> inputs(n, nullptr);
  std::vector<const DTensorSpec*> specs(n, nullptr);
  for (size_t j = 0; j < n; ++j) {
    const Value& v = *operands[j].value;
    if (!v.defined()) {
      if (!operands[j].optional) inputs[j] = kUndefined;
      continue;
    }
    if (const DTensor* whole = v.piece_of()) {
      if (!(whole->mesh() == mesh)) {
        return absl::InvalidArgumentError(absl::StrCat(op, ": ", first->Describe(), " and ",
                                                       v.Describe(), " are on different meshes"));
      }
      held[j] = *whole;
    } else {
      DT_ASSIGN_OR_RETURN(held[j], DTensor::FromLocal(v.local(), mesh,
                                                      Placements(mesh.ndim(), Placement::Replicate())));
    }
    inputs[j] = &held[j];
    specs[j] = &held[j].spec();
  }
  DT_ASSIGN_OR_RETURN(const internal::OpCall call, build(specs));
  DT_ASSIGN_OR_RETURN(internal::Outputs outs, internal::Apply(call, inputs));
  std::vector<Value> out;
  for (DTensor& d : outs) out.push_back(Value::Piece(std::move(d), first->source()));
  return out;
}

absl::StatusOr<std::vector<Value>> Run(const char* op, absl::Span<const Operand> operands,
                                       Builder build) {
  DT_ASSIGN_OR_RETURN(const bool distributed, UseDTensors(op, operands));
  if (!distributed) {
    for (const Operand& o : operands) {
      if (o.value->piece_of() != nullptr) return RunOnPieces(op, operands, build);
    }
  }
  const size_t n = operands.size();
  std::vector<const DTensorSpec*> specs(n, nullptr);
  std::vector<Value> out;
  if (distributed) {
    static const DTensor* const kUndefined = new DTensor();
    std::vector<const DTensor*> inputs(n, nullptr);
    for (size_t j = 0; j < n; ++j) {
      const Value& v = *operands[j].value;
      if (v.defined()) specs[j] = &v.dtensor().spec();
      if (v.defined() || !operands[j].optional) inputs[j] = v.defined() ? &v.dtensor() : kUndefined;
    }
    DT_ASSIGN_OR_RETURN(const internal::OpCall call, build(specs));
    DT_ASSIGN_OR_RETURN(internal::Outputs outs, internal::Apply(call, inputs));
    for (DTensor& d : outs) out.emplace_back(std::move(d));
    return out;
  }
  static const Tensor* const kUndefined = new Tensor();
  std::vector<DTensorSpec> local_specs;
  local_specs.reserve(n);
  std::vector<const Tensor*> inputs(n, nullptr);
  for (size_t j = 0; j < n; ++j) {
    const Value& v = *operands[j].value;
    if (v.defined()) {
      local_specs.push_back(LocalSpec(v.local()));
      specs[j] = &local_specs.back();
    }
    if (v.defined() || !operands[j].optional) inputs[j] = v.defined() ? &v.local() : kUndefined;
  }
  DT_ASSIGN_OR_RETURN(const internal::OpCall call, build(specs));
  DT_ASSIGN_OR_RETURN(internal::LocalOutputs outs, internal::ApplyLocal(call, inputs));
  for (Tensor& t : outs) out.emplace_back(std::move(t));
  return out;
}

absl::StatusOr<Value> Run1(const char* op, std::initializer_list<Operand> operands, Builder build) {
  DT_ASSIGN_OR_RETURN(std::vector<Value> out,
                      Run(op, absl::MakeConstSpan(operands.begin(), operands.size()), build));
  return std::move(out[0]);
}

using S = absl::Span<const DTensorSpec* const>;

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
  DT_ASSIGN_OR_RETURN(DTensor r, DTensor::FromLocal(side.local(), d.mesh(), replicated));
  return Value(std::move(r));
}

absl::StatusOr<Value> Linear(const Value& x, const Value& w, const Value& bias) {
  return Run1("Linear", {{"x", &x}, {"w", &w}, {"bias", &bias, true}},
              [](S s) { return internal::calls::Linear(s[0], s[1], s[2]); });
}

absl::StatusOr<Value> Matmul(const Value& a, const Value& b, bool trans_a, bool trans_b) {
  return Run1("Matmul", {{"a", &a}, {"b", &b}},
              [&](S s) { return internal::calls::Matmul(s[0], s[1], trans_a, trans_b); });
}

absl::StatusOr<Value> Embedding(const Value& table, const Value& ids) {
  return Run1("Embedding", {{"table", &table}, {"ids", &ids}},
              [](S s) { return internal::calls::Embedding(s[0], s[1]); });
}

absl::StatusOr<Value> RmsNorm(const Value& x, const Value& weight, double eps) {
  return Run1("RmsNorm", {{"x", &x}, {"weight", &weight, true}},
              [&](S s) { return internal::calls::RmsNorm(s[0], s[1], eps); });
}

absl::StatusOr<Value> LayerNorm(const Value& x, const Value& weight, const Value& bias,
                                double eps) {
  return Run1("LayerNorm", {{"x", &x}, {"weight", &weight, true}, {"bias", &bias, true}},
              [&](S s) { return internal::calls::LayerNorm(s[0], s[1], s[2], eps); });
}

absl::StatusOr<Value> Add(const Value& a, const Value& b) {
  return Run1("Add", {{"a", &a}, {"b", &b}},
              [](S s) { return internal::calls::Binary(ops::BinaryOp::kAdd, s[0], s[1]); });
}

absl::StatusOr<Value> Sub(const Value& a, const Value& b) {
  return Run1("Sub", {{"a", &a}, {"b", &b}},
              [](S s) { return internal::calls::Binary(ops::BinaryOp::kSub, s[0], s[1]); });
}

absl::StatusOr<Value> Mul(const Value& a, const Value& b) {
  return Run1("Mul", {{"a", &a}, {"b", &b}},
              [](S s) { return internal::calls::Binary(ops::BinaryOp::kMul, s[0], s[1]); });
}

absl::StatusOr<Value> Mul(const Value& x, double v) {
  return Run1("Mul", {{"x", &x}},
              [&](S s) { return internal::calls::BinaryScalar(ops::BinaryOp::kMul, s[0], v); });
}

absl::StatusOr<Value> Div(const Value& x, double v) {
  return Run1("Div", {{"x", &x}},
              [&](S s) { return internal::calls::BinaryScalar(ops::BinaryOp::kDiv, s[0], v); });
}

absl::StatusOr<Value> Gelu(const Value& x, ops::GeluApproximation approx) {
  return Run1("Gelu", {{"x", &x}}, [&](S s) { return internal::calls::Gelu(s[0], approx); });
}

#define DT_UNARY_FUNCTION_(name, formula)                                                 \
  absl::StatusOr<Value> name(const Value& x) {                                            \
    return Run1(#name, {{"x", &x}},                                                       \
                [](S s) { return internal::calls::Unary(ops::UnaryOp::k##name, s[0]); }); \
  }
DT_UNARY_OPS(DT_UNARY_FUNCTION_)
#undef DT_UNARY_FUNCTION_

absl::StatusOr<Value> Cast(const Value& x, DType dtype) {
  return Run1("Cast", {{"x", &x}}, [&](S s) { return internal::calls::Cast(s[0], dtype); });
}

absl::StatusOr<Value> Modulate(const Value& x, const Value& scale, const Value& shift) {
  return Run1("Modulate", {{"x", &x}, {"scale", &scale}, {"shift", &shift}},
              [](S s) { return internal::calls::Modulate(s[0], s[1], s[2]); });
}

absl::StatusOr<Value> GatedActivation(const Value& gate, const Value& up, ops::UnaryOp act) {
  return Run1("GatedActivation", {{"gate", &gate}, {"up", &up}},
              [&](S s) { return internal::calls::GatedActivation(s[0], s[1], act); });
}

absl::StatusOr<Value> ApplyRotary(const Value& x, const Value& cos, const Value& sin,
                                  ops::RotaryStyle style) {
  return Run1("ApplyRotary", {{"x", &x}, {"cos", &cos}, {"sin", &sin}},
              [&](S s) { return internal::calls::Rotary(s[0], s[1], s[2], style); });
}

absl::StatusOr<Value> ScaledDotProductAttention(const Value& q, const Value& k, const Value& v,
                                                const ops::AttentionOptions& options) {
  return Run1("ScaledDotProductAttention", {{"q", &q}, {"k", &k}, {"v", &v}},
              [&](S s) { return internal::calls::Attention(s[0], s[1], s[2], options); });
}

// Note [Plain local views skip the dispatch]
// A view of a plain local tensor (not a DTensor, not a piece: no layout to carry) is the tensor's
// own view, which is what the op's local run computes after its shape rules. Decode of a Llama
// layer makes eight of them (its heads split and joined), 240 of SmolLM2's 580 ops a token, each
// paying the dispatch's specs and rules for nothing. So a float plain local view is taken
// directly; when that fails, the op runs as before and gives its own error.
namespace {
bool PlainFloatLocal(const Value& x) {
  return x.defined() && x.is_local() && x.piece_of() == nullptr && IsFloating(x.local().dtype());
}
}  // namespace

absl::StatusOr<Value> Reshape(const Value& x, IntSpan shape) {
  if (PlainFloatLocal(x)) {
    if (absl::StatusOr<Tensor> t = x.local().Reshape(shape); t.ok()) return Value(*std::move(t));
  }
  return Run1("Reshape", {{"x", &x}},
              [&](S s) { return internal::calls::View("Reshape", s[0], shape); });
}

absl::StatusOr<Value> Transpose(const Value& x, int64_t dim0, int64_t dim1) {
  if (PlainFloatLocal(x) && dim0 >= 0 && dim1 >= 0) {
    if (absl::StatusOr<Tensor> t = x.local().Transpose(dim0, dim1); t.ok()) return Value(*std::move(t));
  }
  return Run1("Transpose", {{"x", &x}},
              [&](S s) { return internal::calls::Transpose(s[0], dim0, dim1); });
}

absl::StatusOr<Value> Unsqueeze(const Value& x, int64_t dim) {
  if (PlainFloatLocal(x) && dim >= 0) {
    if (absl::StatusOr<Tensor> t = x.local().Unsqueeze(dim); t.ok()) return Value(*std::move(t));
  }
  return Run1("Unsqueeze", {{"x", &x}}, [&](S s) { return internal::calls::Unsqueeze(s[0], dim); });
}

absl::StatusOr<Value> Cat(absl::Span<const Value> xs, int64_t dim) {
  if (xs.empty()) return absl::InvalidArgumentError("Cat: no tensors given");
  std::vector<std::string> names;
  names.reserve(xs.size());
  std::vector<Operand> operands;
  for (size_t j = 0; j < xs.size(); ++j) {
    names.push_back(absl::StrCat("tensors[", j, "]"));
    operands.push_back({names.back().c_str(), &xs[j]});
  }
  DT_ASSIGN_OR_RETURN(std::vector<Value> out,
                      Run("Cat", operands, [&](S s) { return internal::calls::Cat(s, dim); }));
  return std::move(out[0]);
}

absl::StatusOr<std::vector<Value>> Split(const Value& x, absl::Span<const int64_t> sizes,
                                         int64_t dim) {
  const Operand xo[] = {{"x", &x}};
  return Run("Split", xo, [&](S s) { return internal::calls::Split(s[0], sizes, dim); });
}

absl::StatusOr<std::vector<Value>> Chunk(const Value& x, int64_t chunks, int64_t dim) {
  const Operand xo[] = {{"x", &x}};
  return Run("Chunk", xo, [&](S s) { return internal::calls::Chunk(s[0], chunks, dim); });
}

}  // namespace dt::ops
