#pragma once
// TensorParallelLayer: a tensor-parallel style — how one module's parameters are laid out over a
// 1-D tensor-parallel mesh and how its inputs and outputs move around its forward. The hook set is
// transformers G3's (distributed/tensor_parallel.py), and every hook is written only through
// placements, DTensor ops and Redistribute: no style calls a collective itself.
//
//   hook                         when                       default
//   ValidateParam                plan time, before any      OK
//                                weight is read
//   ParamPlacement               plan time                  Replicate
//   ShardParam                   plan time, after every     param.Place(mesh, {ParamPlacement})
//                                validation passed          (a placeholder: nothing is read)
//   TransformInputsPreForward    each call                  inputs unchanged
//   ContextAroundForward         each call, around the      local mode while the forward runs
//                                module's own forward       when ShouldUseLocalTensors
//   TransformOutputPostForward   each call                  outputs unchanged
//   ShouldUseLocalTensors        each call                  false
//   InstallForward               plan time                  module.SetForward(pre -> ctx ->
//                                                           forward -> post), wrapping a forward
//                                                           already installed (Note [Composed
//                                                           forwards])
//
// ParamPlacement is the one addition to transformers' set: it states, without side effects, where
// ShardParam will put a parameter, so that a module's own validation (heads, KV heads,
// intermediate size: Module::ValidateTensorParallel) can look at the whole plan before anything is
// placed. A custom style overrides ParamPlacement and keeps the default ShardParam, or overrides
// both consistently.
//
// Note [Composed forwards]
// A module may get a style from two plans on two meshes: the experts of a MoE layer are
// moe_tp_experts on the tensor-parallel mesh and ep_dispatch_experts (or all_reduce) on the
// expert-parallel one (nn/expert_parallel.h). As transformers wraps whatever `module.forward` is
// when it installs a style, InstallForward wraps the forward already installed: the second style's
// hooks run outside the first's. What the inner forward hands on as a piece of a DTensor on
// another mesh is handed to the outer style as a plain local tensor (its mesh means nothing to the
// outer one), so an outer reduction annotates it on its own mesh.
//
// Styles are immutable once registered and shared by every rank (threads included); per-module
// state lives on the module (Linear::packed_col_blocks, ...).

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dtensor/dtensor/dtensor.h"
#include "dtensor/dtensor/placement.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/module.h"
#include "dtensor/nn/parameter.h"
#include "dtensor/ops/value.h"

namespace dt::nn {

// Undoes what ContextAroundForward set up when it goes out of scope (a C++ context manager).
class ForwardContext {
 public:
  ForwardContext() = default;
  explicit ForwardContext(std::function<void()> on_exit) : on_exit_(std::move(on_exit)) {}
  ForwardContext(ForwardContext&& o) noexcept : on_exit_(std::exchange(o.on_exit_, nullptr)) {}
  ForwardContext& operator=(ForwardContext&&) = delete;
  ~ForwardContext() {
    if (on_exit_) on_exit_();
  }

 private:
  std::function<void()> on_exit_;
};

// One row of `dtensor styles`: what a style does, in canonical placement text.
struct StyleInfo {
  std::string weight;      // "S(0)", "_S(0,[blocks])", "R", "-"
  std::string bias;        // 1-D parameters
  std::string input;       // "R", "S(-1)", "ids R", "unchanged"
  std::string output;      // "S(-1) local", "P(sum) -> R local"
  std::string collective;  // forward communication: "none", "all_reduce", "all_gather"
};

class TensorParallelLayer : public std::enable_shared_from_this<TensorParallelLayer> {
 public:
  virtual ~TensorParallelLayer() = default;

  virtual StyleInfo Info() const = 0;
  // True when the module's output leaves the style as this rank's shard of its last dim
  // (colwise, packed_colwise), so that what consumes it must take a shard (a rowwise layer, an
  // attention holding its heads). Default false.
  virtual bool ShardsOutput() const { return false; }

  virtual absl::Status ValidateParam(const Module& module, const Parameter& param,
                                     const DeviceMesh& mesh) const;
  virtual absl::StatusOr<Placement> ParamPlacement(const Module& module,
                                                   const Parameter& param) const;
  virtual absl::Status ShardParam(Module& module, Parameter& param, const DeviceMesh& mesh) const;
  // How many different pieces of `param` the `tp` ranks hold (TPValidationContext::PlannedPieces):
  // default tp when ParamPlacement shards it, else 1.
  virtual int64_t ParamPieces(const Module& module, const Parameter& param, int64_t tp) const;

  virtual bool ShouldUseLocalTensors(const Module& module) const { return false; }
  virtual absl::StatusOr<Values> TransformInputsPreForward(Module& module, Values inputs,
                                                           const DeviceMesh& mesh) const;
  virtual ForwardContext ContextAroundForward(Module& module, const DeviceMesh& mesh) const;
  virtual absl::StatusOr<Values> TransformOutputPostForward(Module& module, Values outputs,
                                                            const DeviceMesh& mesh) const;
  virtual absl::Status InstallForward(Module& module, const DeviceMesh& mesh) const;
};

// The override sets a style declares (nn/styles.h): DT_STYLE_PARAM_HOOKS for a style that
// places its parameters (ValidateParam, ParamPlacement), DT_STYLE_FORWARD_HOOKS for one that
// transforms its module's inputs and outputs (TransformInputsPreForward,
// TransformOutputPostForward).
#define DT_STYLE_PARAM_HOOKS                                                               \
  absl::Status ValidateParam(const Module& module, const Parameter& param,                 \
                             const DeviceMesh& mesh) const override;                       \
  absl::StatusOr<Placement> ParamPlacement(const Module& module, const Parameter& param)   \
      const override
#define DT_STYLE_FORWARD_HOOKS                                                             \
  absl::StatusOr<Values> TransformInputsPreForward(Module& module, Values inputs,          \
                                                   const DeviceMesh& mesh) const override; \
  absl::StatusOr<Values> TransformOutputPostForward(Module& module, Values outputs,        \
                                                    const DeviceMesh& mesh) const override

// ---- helpers for writing styles ----------------------------------------------------------------

// Whether `param` is split over the 1-D `mesh`: on that mesh, or on a larger mesh whose dim of the
// same name splits it (experts on an (ep, tp) mesh are split over tp by their tp rules).
bool ShardedOn(const Parameter& param, const DeviceMesh& mesh);

// `p` with a negative shard dim resolved for a tensor of `ndim` dims.
Placement ResolveDim(const Placement& p, int ndim);

// A value as a DTensor on `mesh`: a piece is its global tensor; another local tensor is annotated
// with `declared` (DTensor::FromLocal, no communication) and the global shape `global` when given
// (else the even-split assumption of PyTorch); a DTensor is returned unchanged (it must live on
// `mesh`).
absl::StatusOr<DTensor> AsDTensor(const Value& v, const DeviceMesh& mesh, const Placement& declared,
                                  const std::optional<Shape>& global = std::nullopt);

// `x` redistributed to `target` on its 1-D mesh (no-op when it is there already). Replicate ->
// Partial is allowed: it is how a style says "divide by the mesh size" (PyTorch's partition rule).
absl::StatusOr<DTensor> RedistributeTo(const DTensor& x, const Placement& target);

// What a style hands on: the DTensor, or with use_local_output this rank's piece, which remembers
// the layout and `module` (Value::Piece, Note [Local pieces remember their layout]).
Value Handoff(DTensor x, bool use_local_output, const Module& module);

// A forward's partial-sum output `v` (a local tensor is annotated Partial) redistributed to
// `target` (Replicate: all_reduce, Shard: reduce_scatter) and handed on (Handoff).
absl::StatusOr<Value> ReducePartial(const Value& v, const DeviceMesh& mesh,
                                    const Placement& target, bool use_local_output,
                                    const Module& module);

}  // namespace dt::nn
