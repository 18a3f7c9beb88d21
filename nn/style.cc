#include "dtensor/nn/style.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"

namespace dt::nn {

absl::Status TensorParallelLayer::ValidateParam(const Module&, const Parameter&,
                                                const DeviceMesh&) const {
  return absl::OkStatus();
}

absl::StatusOr<Placement> TensorParallelLayer::ParamPlacement(const Module&,
                                                              const Parameter&) const {
  return Placement::Replicate();
}

absl::Status TensorParallelLayer::ShardParam(Module& module, Parameter& param,
                                             const DeviceMesh& mesh) const {
  DT_ASSIGN_OR_RETURN(Placement p, ParamPlacement(module, param));
  return param.Place(mesh, {p});
}

int64_t TensorParallelLayer::ParamPieces(const Module& module, const Parameter& param,
                                         int64_t tp) const {
  absl::StatusOr<Placement> p = ParamPlacement(module, param);
  return p.ok() && p->is_any_shard() ? tp : 1;
}

absl::StatusOr<Values> TensorParallelLayer::TransformInputsPreForward(Module&, Values inputs,
                                                                      const DeviceMesh&) const {
  return inputs;
}

ForwardContext TensorParallelLayer::ContextAroundForward(Module& module, const DeviceMesh&) const {
  if (!ShouldUseLocalTensors(module)) return ForwardContext();
  const bool previous = module.local_mode();
  module.set_local_mode(true);
  Module* m = &module;
  return ForwardContext([m, previous] { m->set_local_mode(previous); });
}

absl::StatusOr<Values> TensorParallelLayer::TransformOutputPostForward(Module&, Values outputs,
                                                                       const DeviceMesh&) const {
  return outputs;
}

absl::Status TensorParallelLayer::InstallForward(Module& module, const DeviceMesh& mesh) const {
  std::shared_ptr<const TensorParallelLayer> self = weak_from_this().lock();
  if (self == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "InstallForward on '", module.FullName(),
        "': the style must be owned by a std::shared_ptr (std::make_shared<MyStyle>(...))"));
  }
  ForwardFn inner = module.installed_forward();  // Note [Composed forwards]
  module.SetForward([self, mesh, inner](Module& m, Values inputs) -> absl::StatusOr<Values> {
    DT_ASSIGN_OR_RETURN(Values in, self->TransformInputsPreForward(m, std::move(inputs), mesh));
    absl::StatusOr<Values> out;
    {
      ForwardContext context = self->ContextAroundForward(m, mesh);
      out = inner ? inner(m, std::move(in)) : m.RunForward(std::move(in));
    }
    if (!out.ok()) return std::move(out).status();
    if (inner) {
      for (Value& v : *out) {
        if (v.piece_of() != nullptr && !(v.piece_of()->mesh() == mesh)) v = PlainLocal(v);
      }
    }
    return self->TransformOutputPostForward(m, *std::move(out), mesh);
  });
  return absl::OkStatus();
}

bool ShardedOn(const Parameter& param, const DeviceMesh& mesh) {
  if (!param.placed()) return false;
  const DTensorSpec& spec = param.spec();
  if (spec.mesh() == mesh) return spec.NumShards() > 0;
  // A parameter on a larger mesh: its placement on the dim `mesh` is (by name).
  for (int d = 0; d < spec.mesh().ndim(); ++d) {
    if (mesh.ndim() == 1 && spec.mesh().names()[d] == mesh.names()[0]) {
      return !spec.placements()[d].is_replicate();
    }
  }
  return false;
}

Placement ResolveDim(const Placement& p, int ndim) {
  if (!p.is_any_shard() || p.dim() >= 0) return p;
  return p.WithDim(p.dim() + ndim);
}

absl::StatusOr<DTensor> AsDTensor(const Value& v, const DeviceMesh& mesh, const Placement& declared,
                                  const std::optional<Shape>& global) {
  const DTensor* whole = v.is_dtensor() ? &v.dtensor() : v.piece_of();
  if (whole != nullptr) {
    if (!(whole->mesh() == mesh)) {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", v.Describe(), " is not on the style's ", mesh.ToString()));
    }
    return *whole;
  }
  if (!v.defined()) return absl::InvalidArgumentError("input is undefined");
  FromLocalOptions options;
  options.shape = global;
  return DTensor::FromLocal(v.local(), mesh, {ResolveDim(declared, v.dim())}, options);
}

absl::StatusOr<DTensor> RedistributeTo(const DTensor& x, const Placement& target) {
  const Placement t = ResolveDim(target, static_cast<int>(x.shape().size()));
  if (x.placements().size() == 1 && x.placements()[0] == t) return x;
  RedistributeOptions options;
  options.planner.allow_partial = t.is_partial();
  return x.Redistribute({t}, options);
}

Value Handoff(DTensor x, bool use_local_output, const Module& module) {
  if (!use_local_output) return Value(std::move(x));
  return Value::Piece(std::move(x), module.FullName());
}

absl::StatusOr<Value> ReducePartial(const Value& v, const DeviceMesh& mesh,
                                    const Placement& target, bool use_local_output,
                                    const Module& module) {
  DT_ASSIGN_OR_RETURN(DTensor y, AsDTensor(v, mesh, Placement::Partial()));
  DT_ASSIGN_OR_RETURN(y, RedistributeTo(y, target));
  return Handoff(std::move(y), use_local_output, module);
}

}  // namespace dt::nn
