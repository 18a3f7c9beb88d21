#include "dtensor/nn/mlp.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/name_table.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/value_ops.h"
#include "dtensor/ops/local/ops.h"

namespace dt::nn {

absl::Status CheckIntermediate(const Module& m, const TPValidationContext& ctx,
                               absl::Span<const std::string> projections, int64_t intermediate) {
  std::vector<std::string> sharded;
  for (const std::string& p : projections) {
    if (ctx.IsSharded(p)) sharded.push_back(p);
  }
  if (sharded.empty() || intermediate % ctx.tp_size() == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(m.type_name(), " '", ctx.module_name(), "': tensor parallel size ",
                   ctx.tp_size(), " does not divide intermediate_size ", intermediate, " (",
                   absl::StrJoin(sharded, ", "), " sharded)"));
}

namespace {

// A projection whose output is this rank's columns feeds a consumer that must take them (rowwise).
absl::Status CheckSplitConsumed(const Module& m, const TPValidationContext& ctx,
                                const std::string& producer, const std::string& consumer) {
  if (!ctx.OutputSharded(producer) || ctx.IsSharded(consumer + ".weight")) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      m.type_name(), " '", ctx.module_name(), "': ", producer, "'s output is this rank's columns (",
      producer, ".weight [", ctx.PlannedPlacement(producer + ".weight").ToString(), "]) but ",
      consumer, ".weight is [", ctx.PlannedPlacement(consumer + ".weight").ToString(),
      "]: only a rowwise ", consumer, " takes them"));
}

// Each activation under its own name first (ActivationName), then the other names configs give
// it (transformers' ACT2FN keys), all of which ParseActivation takes.
constexpr std::pair<const char*, Activation> kActivationNames[] = {
    {"gelu_tanh", Activation::kGeluTanh}, {"gelu", Activation::kGelu},
    {"silu", Activation::kSilu},          {"relu", Activation::kRelu},
    {"gelu_new", Activation::kGeluTanh},  {"gelu_pytorch_tanh", Activation::kGeluTanh},
    {"gelu_fast", Activation::kGeluTanh}, {"swish", Activation::kSilu},
};

}  // namespace

const char* ActivationName(Activation a) { return NameIn(kActivationNames, a); }

absl::StatusOr<Activation> ParseActivation(absl::string_view name) {
  if (std::optional<Activation> a = ValueIn(kActivationNames, name)) return *a;
  return absl::InvalidArgumentError(absl::StrCat(
      "activation '", name,
      "' is not supported; use one of gelu_new, gelu_pytorch_tanh, gelu_fast, gelu_tanh, gelu, "
      "silu, swish, relu"));
}

namespace {

// The op of `a` (ops::GatedActivation takes it).
ops::UnaryOp ActivationOp(Activation a) {
  switch (a) {
    case Activation::kGeluTanh: return ops::UnaryOp::kGeluTanh;
    case Activation::kGelu: return ops::UnaryOp::kGeluErf;
    case Activation::kSilu: return ops::UnaryOp::kSilu;
    case Activation::kRelu: return ops::UnaryOp::kRelu;
  }
  return ops::UnaryOp::kSilu;
}

}  // namespace

absl::StatusOr<Value> Activate(const Value& x, Activation a) {
  switch (a) {
    case Activation::kGeluTanh: return ops::Gelu(x, ops::GeluApproximation::kTanh);
    case Activation::kGelu: return ops::Gelu(x, ops::GeluApproximation::kNone);
    case Activation::kSilu: return ops::Silu(x);
    case Activation::kRelu: return ops::Relu(x);
  }
  return absl::InvalidArgumentError("unknown activation");
}

MLP::MLP(const MLPOptions& o) : Module("MLP"), options_(o) {
  up_ = &AddModule<Linear>(o.up_name, o.hidden_size, o.intermediate_size, o.bias, o.dtype);
  down_ = &AddModule<Linear>(o.down_name, o.intermediate_size, o.hidden_size, o.bias, o.dtype);
}

std::string MLP::ExtraRepr() const {
  return absl::StrCat("hidden=", options_.hidden_size, ", intermediate=",
                      options_.intermediate_size, ", ", ActivationName(options_.activation),
                      options_.bias ? ", bias" : "");
}

absl::Status MLP::ValidateTensorParallel(const TPValidationContext& ctx) const {
  DT_RETURN_IF_ERROR(CheckIntermediate(
      *this, ctx, {options_.up_name + ".weight", options_.down_name + ".weight"},
      options_.intermediate_size));
  return CheckSplitConsumed(*this, ctx, options_.up_name, options_.down_name);
}

absl::StatusOr<Values> MLP::Forward(Values inputs) {
  DT_ASSIGN_OR_RETURN(Value x, SingleInput(*this, inputs));
  // This rank's columns, computed on as a plain piece (Note [Local pieces remember their layout]).
  DT_ASSIGN_OR_RETURN(Value h, up_->CallOne({x}));
  h = PlainLocal(h);
  DT_ASSIGN_OR_RETURN(h, Activate(h, options_.activation));
  DT_ASSIGN_OR_RETURN(Value y, down_->CallOne({h}));
  return Values{std::move(y)};
}

SwiGLUMLP::SwiGLUMLP(const SwiGLUOptions& o) : Module("SwiGLUMLP"), options_(o) {
  if (o.fused) {
    gate_up_ =
        &AddModule<Linear>("gate_up_proj", o.hidden_size, 2 * o.intermediate_size, o.bias, o.dtype);
    gate_up_->set_packed_col_blocks({o.intermediate_size, o.intermediate_size});
  } else {
    gate_ = &AddModule<Linear>("gate_proj", o.hidden_size, o.intermediate_size, o.bias, o.dtype);
    up_ = &AddModule<Linear>("up_proj", o.hidden_size, o.intermediate_size, o.bias, o.dtype);
  }
  down_ = &AddModule<Linear>("down_proj", o.intermediate_size, o.hidden_size, o.bias, o.dtype);
}

std::string SwiGLUMLP::ExtraRepr() const {
  return absl::StrCat("hidden=", options_.hidden_size,
                      ", intermediate=", options_.intermediate_size,
                      options_.fused ? ", fused" : "",
                      options_.activation == Activation::kSilu
                          ? ""
                          : absl::StrCat(", ", ActivationName(options_.activation)));
}

absl::Status SwiGLUMLP::ValidateTensorParallel(const TPValidationContext& ctx) const {
  const std::vector<std::string> projections =
      options_.fused
          ? std::vector<std::string>{"gate_up_proj.weight", "down_proj.weight"}
          : std::vector<std::string>{"gate_proj.weight", "up_proj.weight", "down_proj.weight"};
  DT_RETURN_IF_ERROR(CheckIntermediate(*this, ctx, projections, options_.intermediate_size));
  if (!options_.fused && ctx.OutputSharded("gate_proj") != ctx.OutputSharded("up_proj")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SwiGLUMLP '", ctx.module_name(), "': gate_proj.weight is [",
        ctx.PlannedPlacement("gate_proj.weight").ToString(), "] but up_proj.weight is [",
        ctx.PlannedPlacement("up_proj.weight").ToString(),
        "]: their outputs are multiplied element by element, so both must be colwise (or "
        "neither)"));
  }
  return CheckSplitConsumed(*this, ctx, options_.fused ? "gate_up_proj" : "gate_proj", "down_proj");
}

absl::StatusOr<Values> SwiGLUMLP::Forward(Values inputs) {
  DT_ASSIGN_OR_RETURN(Value x, SingleInput(*this, inputs));
  Value gate, up;
  if (options_.fused) {
    DT_ASSIGN_OR_RETURN(Value gu, gate_up_->CallOne({x}));
    DT_ASSIGN_OR_RETURN(std::vector<Value> halves, ops::Chunk(PlainLocal(gu), 2, -1));
    gate = std::move(halves[0]);
    up = std::move(halves[1]);
  } else {
    // This rank's columns of both (ValidateTensorParallel checked they are split alike), computed
    // on as plain pieces (Note [Local pieces remember their layout]).
    DT_ASSIGN_OR_RETURN(std::vector<Value> y, CallLinears({gate_, up_}, x));
    gate = PlainLocal(y[0]);
    up = PlainLocal(y[1]);
  }
  // act(gate) * up in one pass, the packed halves read where they lie.
  DT_ASSIGN_OR_RETURN(Value h, ops::GatedActivation(gate, up, ActivationOp(options_.activation)));
  DT_ASSIGN_OR_RETURN(Value y, down_->CallOne({h}));
  return Values{std::move(y)};
}

}  // namespace dt::nn
