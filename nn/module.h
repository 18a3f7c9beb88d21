#pragma once
// Module: a tree of named parameters (nn/parameter.h), buffers and child modules with a forward
// over Values (ops/value.h) — PyTorch's nn.Module, for inference.
//
//   root (LlamaModel)
//   ├── embed_tokens (Embedding)            embed_tokens.weight
//   ├── layers (ModuleList)
//   │   ├── 0 (DecoderLayer)
//   │   │   └── self_attn (Attention)
//   │   │       └── q_proj (Linear)        layers.0.self_attn.q_proj.weight
//   │   └── 1 ...
//   └── norm (RMSNorm)                      norm.weight
//
// Names are dotted paths from the module they are asked of; ModuleList children are named by
// their index. NamedParameters() lists a module's own parameters before its children's, in
// registration order (PyTorch's order).
//
// Calling a module (Call) runs, in order: the forward pre-hooks (they may rewrite the inputs), the
// forward — the one a tensor-parallel style installed (TensorParallelLayer::InstallForward), else
// the module's own Forward — and the forward hooks (they may rewrite the outputs). Hooks see what
// the caller passed and what the caller gets, around whatever a style does (as PyTorch's hooks
// wrap transformers' replaced forward). The root of a tree (no parent) returns no pieces of the
// layers below it: an output that is this rank's piece of a sharded tensor (a 'colwise'
// lm_head's) is gathered whole, with a warning naming the layer (Note [Local pieces remember their
// layout] in ops/value.h). A root that is itself the styled layer hands on its piece.
//
// Note [Local values]
// A module's forward reads its parameters through ParamValue(): in DTensor mode that is the
// parameter's DTensor, in local mode its local piece (a plain Tensor). A module runs in local mode
// when a style asks for it (ShouldUseLocalTensors -> ContextAroundForward) or when any of its
// inputs is a local tensor: a module fed this rank's pieces computes on this rank's pieces, as a
// module with plain-tensor parameters does in transformers. For a parameter no rule covers
// (Replicate) the local piece is the whole parameter, so replicated modules (norms, rotary) work
// on local activations unchanged. A sharded parameter is handed out in local mode only when a
// style asked for it: a module that merely received local inputs gets FailedPrecondition instead
// of silently computing a partial result. Ops never mix the two kinds (ops/value_ops.h), so a
// forgotten conversion is an error naming both operands, not a silent wrong layout.
//
// Note [Errors name the module]
// Call is the one place every forward goes through, so it is where an error learns where it
// happened: a failing status from a pre-hook, a style's hooks, the forward or a forward hook leaves
// the innermost Call prefixed with that module's path from the root ("h.0.mlp.c_proj: FromLocal
// ...", the type name for the root). An enclosing Call sees that the message already starts with
// the path of a module at or below its own and leaves it alone, so the path appears once (no
// status payload: it would print again in Status::ToString). A module's own code never adds the
// path; styles and layers may still name the module in their own words.
//
// Note [Unmatched keys]
// A plan rule whose key matches nothing (a misspelled "layers.*.mlp.gate_prj") leaves the layer it
// meant replicated, and the first sign is often a shape error far from the plan. ParallelizeModule
// records such keys on the module it parallelized (unmatched_plan_keys), and an error that leaves
// any Call below it ends with "(the TP plan's rules [...] matched no layer: a misspelled key
// leaves its layer replicated)". DistributedConfig::unmatched_keys makes them an error instead.
//
// Modules are not thread-safe: every rank (thread or process) builds and owns its own tree.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dtensor/core/dtype.h"
#include "dtensor/core/shape.h"
#include "dtensor/dtensor/placement.h"
#include "dtensor/nn/parameter.h"
#include "dtensor/ops/value.h"

namespace dt::nn {

class Module;

using HookId = int64_t;
// May rewrite the inputs before the forward.
using ForwardPreHook = std::function<absl::Status(Module& module, Values& inputs)>;
// May rewrite the outputs after the forward; `inputs` are what the pre-hooks produced.
using ForwardHook =
    std::function<absl::Status(Module& module, const Values& inputs, Values& outputs)>;
// A replacement forward (TensorParallelLayer::InstallForward).
using ForwardFn = std::function<absl::StatusOr<Values>(Module& module, Values inputs)>;

// What a module's tensor-parallel validation may ask about the plan being applied
// (ParallelizeModule implements it). Paths are dotted and relative to the module validated.
class TPValidationContext {
 public:
  virtual ~TPValidationContext() = default;
  // Size of the tensor-parallel mesh.
  virtual int64_t tp_size() const = 0;
  // The module's path from the root of ParallelizeModule ("" for the root).
  virtual const std::string& module_name() const = 0;
  // The placement the plan gives parameter `path`; Replicate when no rule covers it or when there
  // is no such parameter.
  virtual Placement PlannedPlacement(absl::string_view path) const = 0;
  bool IsSharded(absl::string_view path) const { return PlannedPlacement(path).is_any_shard(); }
  // How many different pieces of parameter `path` the tp ranks hold: tp_size() for a shard, 1 for
  // a replicated one, gcd(units, tp) under the unit styles (Note [Unit meshes] in nn/styles.h,
  // where ranks share a piece). What a head count must be divisible by.
  virtual int64_t PlannedPieces(absl::string_view path) const = 0;
  // True when the plan gives module `path` a style whose output is this rank's shard of the
  // output features (colwise, packed_colwise: TensorParallelLayer::ShardsOutput); false for a
  // gathered output, another style or no rule.
  virtual bool OutputSharded(absl::string_view path) const = 0;
};

class Module {
 public:
  explicit Module(std::string type_name);
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& type_name() const { return type_name_; }  // "Linear"
  const std::string& name() const { return name_; }            // in its parent: "q_proj"
  Module* parent() const { return parent_; }
  // Dotted path from the root of the tree: "layers.0.self_attn.q_proj" ("" for the root).
  std::string FullName() const;

  // ---- tree ------------------------------------------------------------------------------------

  // Registration happens in constructors; a repeated name is a programming error (checked).
  Parameter& RegisterParameter(std::string name, Shape shape, DType dtype);
  template <typename M>
  M& RegisterModule(std::string name, std::unique_ptr<M> module) {
    M& ref = *module;
    AdoptChild(std::move(name), std::move(module));
    return ref;
  }
  template <typename M, typename... Args>
  M& AddModule(std::string name, Args&&... args) {
    return RegisterModule(std::move(name), std::make_unique<M>(std::forward<Args>(args)...));
  }
  // Buffers: non-parameter state (rotary tables, ...); set or replace.
  void SetBuffer(std::string name, Value value);

  // Direct members; nullptr when absent.
  Parameter* FindParameter(absl::string_view name) const;
  Module* FindChild(absl::string_view name) const;
  const Value* FindBuffer(absl::string_view name) const;
  // Dotted lookups below this module; NotFound naming the first missing component.
  absl::StatusOr<Module*> GetSubmodule(absl::string_view path) const;  // "" is this module
  absl::StatusOr<Parameter*> GetParameter(absl::string_view path) const;

  const std::vector<std::unique_ptr<Parameter>>& parameters() const { return params_; }
  const std::vector<std::pair<std::string, std::unique_ptr<Module>>>& children() const {
    return children_;
  }
  // Recursive, dotted relative to this module.
  std::vector<std::pair<std::string, Parameter*>> NamedParameters() const;
  std::vector<std::pair<std::string, Module*>> NamedModules();  // this module first, as ""
  std::vector<std::pair<std::string, const Value*>> NamedBuffers() const;

  // ---- forward ---------------------------------------------------------------------------------

  // pre-hooks -> installed forward or RunForward -> hooks (see the file comment).
  absl::StatusOr<Values> Call(Values inputs);
  // Call for modules with exactly one output.
  absl::StatusOr<Value> CallOne(Values inputs);

  HookId RegisterForwardPreHook(ForwardPreHook hook);
  HookId RegisterForwardHook(ForwardHook hook);
  // False when no hook has this id.
  bool RemoveHook(HookId id);
  // True when a pre-hook or hook is registered.
  bool has_hooks() const { return !pre_hooks_.empty() || !hooks_.empty(); }

  // Replaces the forward Call runs (nullptr restores the module's own).
  void SetForward(ForwardFn fn) { installed_forward_ = std::move(fn); }
  // The installed forward (empty when none): what a second style wraps (Note [Composed forwards]
  // in nn/style.h).
  const ForwardFn& installed_forward() const { return installed_forward_; }
  // The module's own Forward under Note [Local values] (no hooks, no installed forward).
  absl::StatusOr<Values> RunForward(Values inputs);

  // Local mode (Note [Local values]): requested by a style (set_local_mode, from
  // ContextAroundForward for one forward) or implied by local inputs for the current forward.
  bool local_mode() const { return local_mode_ || local_inputs_; }
  bool local_mode_requested() const { return local_mode_; }
  void set_local_mode(bool on) { local_mode_ = on; }

  // Parameter `name`'s value for the forward: its DTensor, or its local piece in local mode.
  // FailedPrecondition when it is not materialized (naming it and its spec), or when it is sharded
  // and local mode was not requested by a style (Note [Local values]).
  absl::StatusOr<Value> ParamValue(absl::string_view name) const;
  // The local piece whatever the mode.
  absl::StatusOr<Tensor> LocalParam(absl::string_view name) const;

  // ---- tensor parallelism
  // ------------------------------------------------------------------------

  // Checks the plan against what the module knows (heads, KV heads, intermediate size) before any
  // weight is read; InvalidArgument naming the module and both numbers. Default: children that
  // are sibling projections (q_proj / k_proj / v_proj, gate_proj / up_proj, ...) split alike
  // (Note [Mixed projections] in module.cc).
  virtual absl::Status ValidateTensorParallel(const TPValidationContext& ctx) const;
  // The blocks this module declares for its packed parameter `param` (Note [Packed blocks] in
  // nn/styles.h): absolute sizes along the output rows (`col`, what packed_colwise cuts) or the
  // input columns (what packed_rowwise cuts); empty when `param` is not packed. packed_* styles
  // refuse a parameter with no blocks from here or the plan, and colwise / rowwise refuse one
  // with blocks (nn/styles.h). Linear answers with its set_packed_*_blocks; default: none.
  virtual std::vector<int64_t> PackedBlocks(const Parameter& param, bool col) const;
  // The size of the units (attention heads: head_dim rows of q/k/v, head_dim columns of o) that
  // unit_colwise (`col`: along the output rows) and unit_rowwise (along the input columns) keep
  // whole on each rank (Note [Unit meshes] in nn/styles.h); 0 when the module declares none, which
  // those styles refuse. Linear answers with its set_*_unit; default: none.
  virtual int64_t ShardUnit(const Parameter& param, bool col) const;
  // The style ParallelizeModule installed on this module ("" when none), for printing.
  const std::string& tp_style() const { return tp_style_; }
  void set_tp_style(std::string name) { tp_style_ = std::move(name); }

  // Plan rules that matched no layer when ParallelizeModule last ran on this module (Note
  // [Unmatched keys]).
  const std::vector<std::string>& unmatched_plan_keys() const { return unmatched_plan_keys_; }
  void set_unmatched_plan_keys(std::vector<std::string> keys) {
    unmatched_plan_keys_ = std::move(keys);
  }

  // PyTorch-like tree: "Linear(in=8, out=4) [colwise]" with a line per parameter and child.
  std::string ToString() const;
  // One-line description of this module's configuration ("in=8, out=4"); default empty.
  virtual std::string ExtraRepr() const { return ""; }

 protected:
  // The computation. Inputs and outputs are positional; see each module for its list.
  virtual absl::StatusOr<Values> Forward(Values inputs) = 0;

 private:
  void AdoptChild(std::string name, std::unique_ptr<Module> child);
  // The root's outputs that are pieces a layer below it made, gathered whole (Note [Local pieces
  // remember their layout] in ops/value.h), with a warning the first time.
  absl::Status GatherPieces(Values& outputs);
  absl::StatusOr<const Parameter*> MaterializedParam(absl::string_view name) const;
  void AppendTree(std::string* out, const std::string& indent) const;

  std::string type_name_;
  std::string name_;
  Module* parent_ = nullptr;
  std::vector<std::unique_ptr<Parameter>> params_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
  std::vector<std::pair<std::string, Value>> buffers_;
  std::vector<std::pair<HookId, ForwardPreHook>> pre_hooks_;
  std::vector<std::pair<HookId, ForwardHook>> hooks_;
  HookId next_hook_id_ = 1;
  ForwardFn installed_forward_;
  bool local_mode_ = false;
  bool local_inputs_ = false;
  std::string tp_style_;
  std::vector<std::string> unmatched_plan_keys_;
  bool warned_gather_ = false;
};

// ModuleList: children named "0", "1", ... (the `*` of plan keys). It has no forward of its own:
// the owner iterates it.
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  template <typename M>
  M& Append(std::unique_ptr<M> module) {
    return RegisterModule(std::to_string(size()), std::move(module));
  }
  int64_t size() const { return static_cast<int64_t>(children().size()); }
  Module& at(int64_t i) const { return *children()[i].second; }

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;
};

// "prefix.name"; either part may be empty ("" + "w" -> "w", "layers.0" + "" -> "layers.0").
std::string JoinName(absl::string_view prefix, absl::string_view name);

// The single input a one-input module expects; InvalidArgument naming the module otherwise.
absl::StatusOr<Value> SingleInput(const Module& module, const Values& inputs);

}  // namespace dt::nn
