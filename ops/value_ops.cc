#include "dtensor/ops/value_ops.h"

#include <type_traits>
#include <utility>
#include <vector>

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

// The declaration of an op run on whole tensors (nullptr: an absent optional one), as Run does for
// local values; its one output.
[[maybe_unused]] absl::StatusOr<Tensor> RunTensors(absl::Span<const Tensor* const> tensors,
                                                   Builder build) {
  std::vector<DTensorSpec> local_specs;
  local_specs.reserve(tensors.size());
  std::vector<const DTensorSpec*> specs(tensors.size(), nullptr);
  for (size_t j = 0; j < tensors.size(); ++j) {
    if (tensors[j] == nullptr || !tensors[j]->defined()) continue;
    local_specs.push_back(LocalSpec(*tensors[j]));
    specs[j] = &local_specs.back();
  }
  DT_ASSIGN_OR_RETURN(const internal::OpCall call, build(specs));
  DT_ASSIGN_OR_RETURN(internal::LocalOutputs outs, internal::ApplyLocal(call, tensors));
  return std::move(outs[0]);
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
  DT_ASSIGN_OR_RETURN(DTensor r, DTensor::FromLocal(side.local(), d.mesh(), replicated));
  return Value(std::move(r));
}

// Name(params) { return the outputs of Run(builder, the operands); }
#define DT_VALUE_PARAM_In(n) , const Value& n
#define DT_VALUE_PARAM_Opt(n) , const Value& n
#define DT_VALUE_PARAM_Attr(type, n, ...) , type n
#define DT_VALUE_OPERAND_In(n) , Operand{#n, &n}
#define DT_VALUE_OPERAND_Opt(n) , Operand{#n, &n, true}
#define DT_VALUE_OPERAND_Attr(type, n, ...)
#define DT_VALUE_OP_(name, params, call, ...)                                                    \
  absl::StatusOr<DT_ROW_RESULT(Value, __VA_ARGS__)> name(DT_ROW_LIST(DT_VALUE_PARAM_, params)) { \
    const Operand operands[] = {DT_ROW_LIST(DT_VALUE_OPERAND_, params)};                         \
    return internal::OutputsAs<DT_ROW_RESULT(Value, __VA_ARGS__)>(                               \
        Run(#name, operands, [&](S specs) {                                                      \
          return internal::calls::CallOnSpecs(specs, DT_ROW_BUILDER(params, call));              \
        }));                                                                                     \
  }
#define DT_VALUE_NAME_In(n) , n
#define DT_VALUE_NAME_Opt(n) , n
#define DT_VALUE_NAME_Attr(type, n, ...) , n
#define DT_VALUE_DECLARED_OP_(name, params) \
  DT_VALUE_OP_(name, params, name(DT_ROW_LIST(DT_VALUE_NAME_, params)))
DT_OPS(DT_VALUE_OP_)
DT_DECLARED_OPS(DT_VALUE_DECLARED_OP_)

// The Tensor overloads of DT_DECLARED_OPS: Name(params) { return RunLocal(builder, the tensors); }
#define DT_TENSOR_PARAM_In(n) , const Tensor& n
#define DT_TENSOR_PARAM_Opt(n) , const Tensor& n
#define DT_TENSOR_PARAM_Attr(type, n, ...) , type n
#define DT_TENSOR_INPUT_In(n) , &n
#define DT_TENSOR_INPUT_Opt(n) , n.defined() ? &n : nullptr
#define DT_TENSOR_INPUT_Attr(type, n, ...)
#define DT_TENSOR_DECLARED_OP_(name, params)                                                    \
  absl::StatusOr<Tensor> name(DT_ROW_LIST(DT_TENSOR_PARAM_, params)) {                          \
    const Tensor* const inputs[] = {DT_ROW_LIST(DT_TENSOR_INPUT_, params)};                     \
    return RunTensors(inputs, [&](S specs) {                                                    \
      return internal::calls::CallOnSpecs(                                                      \
          specs, DT_ROW_BUILDER(params, name(DT_ROW_LIST(DT_VALUE_NAME_, params))));            \
    });                                                                                         \
  }
DT_DECLARED_OPS(DT_TENSOR_DECLARED_OP_)

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

}  // namespace dt::ops
