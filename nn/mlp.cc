#include "dtensor/nn/mlp.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"
#include "dtensor/nn/vops.h"
#include "dtensor/ops/local/ops.h"

namespace dt::nn {
namespace {

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

}  // namespace

const char* ActivationName(Activation a) {
  switch (a) {
    case Activation::kGeluTanh: return "gelu_tanh";
    case Activation::kGelu: return "gelu";
    case Activation::kSilu: return "silu";
    case Activation::kRelu: return "relu";
  }
  return "?";
}

absl::StatusOr<Activation> ParseActivation(absl::string_view name) {
  if (name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "gelu_fast" ||
      name == "gelu_tanh") {
    return Activation::kGeluTanh;
  }
  if (name == "gelu") return Activation::kGelu;
  if (name == "silu" || name == "swish") return Activation::kSilu;
  if (name == "relu") return Activation::kRelu;
  return absl::InvalidArgumentError(absl::StrCat(
      "activation '", name,
      "' is not supported; use one of gelu_new, gelu_pytorch_tanh, gelu_fast, gelu_tanh, gelu, "
      "silu, swish, relu"));
}

absl::StatusOr<Value> Activate(const Value& x, Activation a) {
  switch (a) {
    case Activation::kGeluTanh: return vops::Gelu(x, ops::GeluApproximation::kTanh);
    case Activation::kGelu: return vops::Gelu(x, ops::GeluApproximation::kNone);
    case Activation::kSilu: return vops::Silu(x);
    case Activation::kRelu: return vops::Relu(x);
  }
  return absl::InvalidArgumentError("unknown activation");
}

MLP::MLP(const MLPOptions& o) : Module("MLP"), options_(o) {
  AddModule<Linear>(o.up_name, o.hidden_size, o.intermediate_size, o.bias, o.dtype);
  AddModule<Linear>(o.down_name, o.intermediate_size, o.hidden_size, o.bias, o.dtype);
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
  DT_ASSIGN_OR_RETURN(Value h, FindChild(options_.up_name)->CallOne({x}));
  h = PlainLocal(h);
  DT_ASSIGN_OR_RETURN(h, Activate(h, options_.activation));
  DT_ASSIGN_OR_RETURN(Value y, FindChild(options_.down_name)->CallOne({h}));
  return Values{std::move(y)};
}

SwiGLUMLP::SwiGLUMLP(const SwiGLUOptions& o) : Module("SwiGLUMLP"), options_(o) {
  if (o.fused) {
    auto& gate_up =
        AddModule<Linear>("gate_up_proj", o.hidden_size, 2 * o.intermediate_size, o.bias, o.dtype);
    gate_up.set_packed_col_blocks({o.intermediate_size, o.intermediate_size});
  } else {
    AddModule<Linear>("gate_proj", o.hidden_size, o.intermediate_size, o.bias, o.dtype);
    AddModule<Linear>("up_proj", o.hidden_size, o.intermediate_size, o.bias, o.dtype);
  }
  AddModule<Linear>("down_proj", o.intermediate_size, o.hidden_size, o.bias, o.dtype);
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
    DT_ASSIGN_OR_RETURN(Value gu, FindChild("gate_up_proj")->CallOne({x}));
    DT_ASSIGN_OR_RETURN(std::vector<Value> halves, vops::Chunk(PlainLocal(gu), 2, -1));
    gate = std::move(halves[0]);
    up = std::move(halves[1]);
  } else {
    // This rank's columns of both (ValidateTensorParallel checked they are split alike), computed
    // on as plain pieces (Note [Local pieces remember their layout]).
    DT_ASSIGN_OR_RETURN(gate, FindChild("gate_proj")->CallOne({x}));
    DT_ASSIGN_OR_RETURN(up, FindChild("up_proj")->CallOne({x}));
    gate = PlainLocal(gate);
    up = PlainLocal(up);
  }
  DT_ASSIGN_OR_RETURN(Value act, Activate(gate, options_.activation));
  DT_ASSIGN_OR_RETURN(Value h, vops::Mul(act, up));
  DT_ASSIGN_OR_RETURN(Value y, FindChild("down_proj")->CallOne({h}));
  return Values{std::move(y)};
}

absl::StatusOr<Values> IdentityExpert::Forward(Values inputs) {
  DT_ASSIGN_OR_RETURN(Value x, SingleInput(*this, inputs));
  return Values{std::move(x)};
}

Experts::Experts(const ExpertsOptions& o) : Module("Experts"), options_(o) {
  RegisterParameter("gate_up_proj", {o.num_experts, 2 * o.intermediate_size, o.hidden_size},
                    o.dtype);
  RegisterParameter("down_proj", {o.num_experts, o.hidden_size, o.intermediate_size}, o.dtype);
  if (o.num_identity_experts > 0) AddModule<IdentityExpert>("identity");
}

std::string Experts::ExtraRepr() const {
  return absl::StrCat("experts=", options_.num_experts, ", hidden=", options_.hidden_size,
                      ", intermediate=", options_.intermediate_size,
                      ", identity_experts=", options_.num_identity_experts);
}

std::vector<int64_t> Experts::PackedBlocks(const Parameter& param, bool col) const {
  if (!col || param.name() != "gate_up_proj") return {};
  return {options_.intermediate_size, options_.intermediate_size};
}

absl::Status Experts::ValidateTensorParallel(const TPValidationContext& ctx) const {
  const std::vector<std::string> projections = {"gate_up_proj", "down_proj"};
  return CheckIntermediate(*this, ctx, projections, options_.intermediate_size);
}

absl::StatusOr<Values> Experts::Forward(Values inputs) {
  const std::string name = absl::StrCat("Experts '", FullName(), "'");
  if (inputs.size() != 2 || !inputs[0].defined() || !inputs[1].defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " takes {x [N, H], routing [N, E]}, got ", inputs.size(), " inputs"));
  }
  // DTensor inputs: replicated, computed on their (whole) local pieces.
  std::optional<DeviceMesh> mesh;
  for (const Value& v : inputs) {
    if (!v.is_dtensor()) continue;
    for (const Placement& p : v.dtensor().placements()) {
      if (!p.is_replicate()) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": DTensor inputs must be replicated, got ", v.Describe()));
      }
    }
    mesh = v.dtensor().mesh();
  }
  if (!local_mode_requested()) {
    for (const auto& p : parameters()) {
      if (p->placed() && p->spec().NumShards() > 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            name, ": parameter '", p->name(), "' is sharded (", p->Describe(),
            ") but the forward is not in local mode; plan the module as 'moe_tp_experts'"));
      }
    }
  }
  const Tensor x = inputs[0].local();
  const Tensor routing = inputs[1].local();
  const int64_t e_total = options_.num_experts + options_.num_identity_experts;
  if (x.dim() != 2 || routing.dim() != 2 || routing.size(0) != x.size(0) ||
      routing.size(1) != e_total) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": expected x [N, ", options_.hidden_size,
                                                   "] and routing [N, ", e_total, "], got ",
                                                   x.Describe(), " and ", routing.Describe()));
  }
  DT_ASSIGN_OR_RETURN(Tensor gate_up, LocalParam("gate_up_proj"));  // [E, 2I/tp, H]
  DT_ASSIGN_OR_RETURN(Tensor down, LocalParam("down_proj"));        // [E, H, I/tp]
  DT_ASSIGN_OR_RETURN(Tensor y,
                      Tensor::Zeros({x.size(0), options_.hidden_size}, x.dtype(), x.device()));
  for (int64_t e = 0; e < options_.num_experts; ++e) {
    DT_ASSIGN_OR_RETURN(Tensor w_gu, gate_up.Select(0, e));
    DT_ASSIGN_OR_RETURN(Tensor gu, ops::Linear(x, w_gu));
    DT_ASSIGN_OR_RETURN(std::vector<Tensor> halves, ops::Chunk(gu, 2, -1));
    DT_ASSIGN_OR_RETURN(Tensor act, ops::Silu(halves[0]));
    DT_ASSIGN_OR_RETURN(Tensor h, ops::Mul(act, halves[1]));
    DT_ASSIGN_OR_RETURN(Tensor w_down, down.Select(0, e));
    DT_ASSIGN_OR_RETURN(Tensor out, ops::Linear(h, w_down));
    DT_ASSIGN_OR_RETURN(Tensor weight, routing.Narrow(1, e, 1));
    DT_ASSIGN_OR_RETURN(Tensor scaled, ops::Mul(out, weight));
    DT_ASSIGN_OR_RETURN(y, ops::Add(y, scaled));
  }
  if (options_.num_identity_experts > 0) {
    DT_ASSIGN_OR_RETURN(Value id, FindChild("identity")->CallOne({Value(x)}));
    for (int64_t j = 0; j < options_.num_identity_experts; ++j) {
      DT_ASSIGN_OR_RETURN(Tensor weight, routing.Narrow(1, options_.num_experts + j, 1));
      DT_ASSIGN_OR_RETURN(Tensor scaled, ops::Mul(id.local(), weight));
      DT_ASSIGN_OR_RETURN(y, ops::Add(y, scaled));
    }
  }
  if (mesh) {
    Placements replicated(mesh->ndim(), Placement::Replicate());
    DT_ASSIGN_OR_RETURN(DTensor out, DTensor::FromLocal(y, *mesh, replicated));
    return Values{Value(std::move(out))};
  }
  return Values{Value(std::move(y))};
}

}  // namespace dt::nn
