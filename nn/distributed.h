#pragma once
// One entry point for every model: DistributedConfig, the tensor-parallel mesh it implies, the
// effective plan as text, and sharding a model that was loaded whole.
//
//   auto world = World::FromEnv().value();
//   auto model = CausalLM::FromPretrained(dir, world, {.tp_size = 0, .tp_plan = "auto"});
//   std::cout << model.value()->tp_plan();      // rule -> style, the parameters it placed and how
//
// tp_size 0 means "every rank the mesh has beyond its other dims" — the world size for a World (as
// transformers derives tp from WORLD_SIZE), or the size of the mesh's "tp" dim for an n-D mesh
// (which must name one). tp_plan "auto" is the model's own plan (SupportsTPPlan: M::TPPlan());
// a ParallelPlan replaces it, with the same key matching and validation.
//
// ShardLoaded is diffusers' enable_parallelism: a model whose parameters hold their full values
// (loaded with every parameter Replicate on the tensor-parallel mesh) is sharded in place by a
// plan; every rank keeps a compact copy of its own piece and drops the full tensor, one parameter
// at a time, so the peak is the whole model once. The result is the model load-time sharding
// builds (same placements, same forwards), only slower to reach and heavier at its peak —
// bench/load measures both.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "absl/status/statusor.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/module.h"
#include "dtensor/nn/plan.h"

namespace dt::nn {

struct DistributedConfig {
  int64_t tp_size = 0;  // 0: derived (see the file comment)
  // "auto" (the model's plan) or an explicit {key, style} list.
  std::variant<std::string, ParallelPlan> tp_plan = std::string("auto");
  // Expert parallelism (nn/expert_parallel.h): > 1 splits the experts over ep_size ranks, in one
  // of two layouts (Note [Expert-parallel layouts]); ep_size must be a multiple of tp_size, as
  // transformers requires.
  int64_t ep_size = 1;
  // "auto" (the model's ep_plan: tokens dispatched with all_to_all), "all_reduce" (its
  // ep_all_reduce_plan: ep_router) or an explicit {key, style} list.
  std::variant<std::string, ParallelPlan> ep_plan = std::string("auto");
  // Plan rules that match no layer: a warning (transformers' behaviour) or, with kError, an
  // InvalidArgument before anything is placed (Note [Unmatched keys] in nn/module.h).
  PlanCheck unmatched_keys = PlanCheck::kWarn;
};

// Models with their own plan: `M::TPPlan()` returns a ParallelPlan.
template <typename M>
concept SupportsTPPlan = requires {
  { M::TPPlan() } -> std::convertible_to<ParallelPlan>;
};

// The 1-D tensor-parallel mesh over all of `world` (tp_size must be 0 or the world size: other
// parallel dims need an n-D mesh).
absl::StatusOr<DeviceMesh> TensorParallelMesh(const std::shared_ptr<World>& world,
                                              const DistributedConfig& config);
// The "tp" dim of an n-D mesh (a 1-D mesh is its own tp dim whatever its name); tp_size must be 0
// or that dim's size.
absl::StatusOr<DeviceMesh> TensorParallelMesh(const DeviceMesh& mesh,
                                              const DistributedConfig& config);

// Note [Expert-parallel layouts]
//   ep and tp share the ranks    ep_size = tp_size = the ranks (tp_size 0 derives it): one 1-D
//                                mesh; the dense layers split by the tp plan, the experts whole,
//                                E / ep per rank (the ep plan's rules replace the tp plan's for
//                                the experts, as in transformers, whose default this is)
//   ep x tp                      ep_size · tp_size = the ranks (tp_size 0: ranks / ep_size): a
//                                2-D mesh (ep, tp), each dim its own communicator; the dense
//                                layers split over tp and replicated over ep, each rank's E / ep
//                                experts split over tp too (1 / (ep·tp) of them per rank)
// The mesh a model is laid over: TensorParallelMesh when ep_size is 1; the 1-D mesh over the world
// or the 2-D mesh (ep, tp) above (of an n-D mesh: its tp dim, or its ep and tp dims).
// InvalidArgument naming the sizes when they do not fit:
//   "DistributedConfig: ep_size 2 must be a multiple of tp_size 4 (transformers' rule)"
absl::StatusOr<DeviceMesh> ModelMesh(const std::shared_ptr<World>& world,
                                     const DistributedConfig& config);
absl::StatusOr<DeviceMesh> ModelMesh(const DeviceMesh& mesh, const DistributedConfig& config);

// The plan to apply: `model_plan` for "auto", else the config's list; InvalidArgument for any
// other string.
absl::StatusOr<ParallelPlan> EffectivePlan(const DistributedConfig& config,
                                           const ParallelPlan& model_plan);
// The expert-parallel plan: `model_plan` for "auto", `all_reduce_plan` for "all_reduce" (when the
// model has one), else the config's list.
absl::StatusOr<ParallelPlan> EffectiveEPPlan(const DistributedConfig& config,
                                             const ParallelPlan& model_plan,
                                             const ParallelPlan& all_reduce_plan);

// What `plan` would do to `module`: "key -> style: param, param, ..." per rule, then the
// parameters no rule covers (replicated). Places nothing.
absl::StatusOr<std::string> FormatPlan(Module& module, const ParallelPlan& plan);
// What the parameters are: one line per rule that placed some (Parameter::plan_rule) and
// parameter name with numeric components as `*`, with their placements, whichever entry point
// placed them (ParallelizeModule, a model's FromPretrained, ShardLoaded):
//   model.layers.*.self_attn.q_proj -> colwise: model.layers.*.self_attn.q_proj.weight [S(0)] (4)
//   replicated (no rule): model.embed_tokens.weight, model.layers.*.input_layernorm.weight, ...
// then parameters placed without a rule and not replicated, and those not placed at all.
std::string FormatPlacements(const Module& module);

// The mesh the module's parameters are placed on (its first placed parameter's), nullopt when none
// is placed; and whether this rank leads it (the mesh's first rank, or no mesh: the one that
// prints progress bars and warnings).
std::optional<DeviceMesh> PlacedMesh(const Module& module);
bool LeadsPlacedMesh(const Module& module);

// See the file comment. Every parameter must be materialized on one 1-D mesh.
absl::Status ShardLoaded(Module& module, const ParallelPlan& plan,
                         const ParallelizeOptions& options = {});

}  // namespace dt::nn
