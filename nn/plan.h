#pragma once
// Plans: ParallelizeModule(module, mesh, plan) lays a module tree out over a 1-D tensor-parallel
// mesh by naming a style per layer, as transformers' `tp_plan` and diffusers' `_tp_plan` do.
//
//   using Blocks = std::vector<int64_t>;
//   ParallelizeModule(model, tp_mesh, {
//       {"layers.*.self_attn.q_proj", "colwise"},  {"layers.*.self_attn.o_proj", "rowwise"},
//       {"layers.*.mlp.gate_up_proj", "packed_colwise"},
//       {"lm_head", "colwise_gather_output"},
//       {"blocks.*.ff.linear_in", std::make_shared<PackedColwiseParallel>(Blocks{1, 1})}});
//
// Matching (Note [Plan matching]): a key is a dotted path; each `*` stands for one ModuleList
// index (a purely numeric path component), as many as the key has (transformers v4's MoE plans:
// "layers.*.mlp.experts.*.gate_proj"). For each parameter the lookup order is: its own name
// exactly, its own name by a wildcard key, its module's name exactly, its module's name by a
// wildcard key — so an exact key beats a wildcard and a parameter's key beats its module's; of
// two wildcard keys the one with fewer `*` wins. A module's key (exact, then wildcard) also installs the style's forward on
// that module; a parameter key only places the parameter. A module key covers the module's own
// parameters, not its children's. The key "" is the root.
//
//   key                          layers.3.mlp.up_proj.weight        layers.3.mlp.up_proj (forward)
//   layers.*.mlp.up_proj         yes (module, wildcard)             yes
//   layers.3.mlp.up_proj         yes, and beats the line above      yes, and beats it
//   layers.*.mlp.up_proj.weight  yes, beats both module keys        -
//   layers.*proj                 never (a `*` is a whole component)  -
//
// Order of work (nothing is placed or read until every check passed):
//   1. the mesh is 1-D; every style name is registered, else
//      InvalidArgument "Unsupported tensor parallel style 'foo' for layer 'layers.*.mlp.up_proj'.
//      Supported styles are [colwise, ...]"; two wildcard keys with as many `*` matching one name
//      are ambiguous.
//   2. options.config (TPConfig) against the mesh size.
//   3. every module: ValidateTensorParallel (heads, KV heads, intermediate size, consistent
//      placements) against the placements the plan will give; every covered parameter:
//      style->ValidateParam.
//   4. the plan checks (Note [Plan checks]), each a warning (nn/log.h, group rank 0 only), an
//      error or nothing as ParallelizeOptions says: "The following TP rules were not applied on
//      any of the layers: [...]" and, once for all parameters no rule covers (they stay
//      replicated), "The following layers were not sharded by the TP plan: [...]".
//   5. ShardParam for covered parameters (placeholders; materialized parameters are cut locally),
//      Replicate for the others; InstallForward for modules with a rule. Each parameter records
//      the rule that placed it (Parameter::plan_rule, what FormatPlacements prints) and the
//      module the rules that matched nothing (Module::unmatched_plan_keys: Note [Unmatched keys]).
// Call it once per tree, on every rank of the mesh, with the same plan.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/module.h"
#include "dtensor/nn/style.h"

namespace dt::nn {

// A plan value: a registered style name, or a configured style object.
struct PlanEntry {
  PlanEntry(const char* style_name) : name(style_name) {}             // NOLINT: implicit
  PlanEntry(std::string style_name) : name(std::move(style_name)) {}  // NOLINT: implicit
  template <typename S>
  PlanEntry(std::shared_ptr<S> s) : style(std::move(s)) {}  // NOLINT: implicit
  std::string name;                                         // empty for a style object
  std::shared_ptr<const TensorParallelLayer> style;
  // "colwise", or the object's type for messages.
  std::string Label() const;
};
using ParallelPlan = std::vector<std::pair<std::string, PlanEntry>>;

// A model's numbers, checked against the tensor-parallel size before anything else (0 = skip).
// Models set them from their config; modules also check what they know themselves (Attention,
// SwiGLUMLP, Experts), so this is the early, whole-model form of the same checks.
struct TPConfig {
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;  // set when the vocab is gathered (lm_head colwise_gather_output)
  // Packed projections: name -> absolute block sizes (each must divide on its own).
  std::vector<std::pair<std::string, std::vector<int64_t>>> packed_blocks;
};
// InvalidArgument naming the field, both numbers and the consequence.
absl::Status ValidateTPConfig(const TPConfig& config, int64_t tp_size);

// What ParallelizeModule does with a finding of its plan checks (Note [Plan checks]).
enum class PlanCheck {
  kIgnore,
  kWarn,   // a warning through nn/log.h, from group rank 0 only
  kError,  // InvalidArgument before anything is placed
};

// Note [Plan checks]
// Two findings, two switches, because they mean different things:
//   unused_rules      a rule that matches no parameter and no module. Almost always a typo in a
//                     key (the layer it meant stays replicated and the numbers stay plausible),
//                     so it is reported by default; models whose plans must match exactly (Flux2)
//                     make it an error.
//   uncovered_params  parameters no rule covers; they stay replicated. Often on purpose (norms,
//                     small embeddings): say so with a `replicate` rule, which covers them and
//                     keeps this check useful for the rest, or switch it off.
struct ParallelizeOptions {
  std::optional<TPConfig> config;
  // "The following TP rules were not applied on any of the layers: [...]"
  PlanCheck unused_rules = PlanCheck::kWarn;
  // "The following layers were not sharded by the TP plan: [...] (they stay replicated)"
  PlanCheck uncovered_params = PlanCheck::kWarn;
};

absl::Status ParallelizeModule(Module& module, const DeviceMesh& mesh, const ParallelPlan& plan,
                               const ParallelizeOptions& options = {});
// Steps 1-4 of ParallelizeModule: every check (and the plan checks' warnings), nothing placed.
absl::Status ValidatePlan(Module& module, const DeviceMesh& mesh, const ParallelPlan& plan,
                          const ParallelizeOptions& options = {});
// One style for the whole module (PyTorch's parallelize_module(module, mesh, style)).
absl::Status ParallelizeModule(Module& module, const DeviceMesh& mesh,
                               std::shared_ptr<const TensorParallelLayer> style);
// The unparallelized module on `mesh`: every parameter placed Replicate, no forward installed.
absl::Status ReplicateModule(Module& module, const DeviceMesh& mesh);
// Expert parallelism (its styles: nn/expert_parallel.h). Lays `module` out over `mesh`: a 2-D
// mesh whose dims are named "ep" and "tp" (`tp_plan` on the tp dim exactly as ParallelizeModule,
// then `ep_plan` on the ep dim), or a 1-D mesh both share (`tp_plan` without the keys `ep_plan`
// names, then `ep_plan`). Every check of both plans runs before anything is placed (so experts
// that ep does not divide are refused before any read); on (ep, tp) a parameter the ep plan
// shards is placed on the 2-D mesh as [ep placement, tp placement]; modules with a rule in both
// plans run both forwards, the ep style's outside (Note [Composed forwards] in nn/style.h). Plan
// checks as options says, for both plans.
absl::Status ParallelizeModuleWithEP(Module& module, const DeviceMesh& mesh,
                                     const ParallelPlan& tp_plan, const ParallelPlan& ep_plan,
                                     const ParallelizeOptions& options = {});

// ---- plan matching, exposed for tests and tools -------------------------------------------------

// True when `key` names `name`: equal, or equal with each `*` of the key standing for a numeric
// component of `name`.
bool PlanKeyMatches(absl::string_view key, absl::string_view name);
// Every numeric path component replaced by `*`: "layers.3.mlp.w1" -> "layers.*.mlp.w1".
std::string WildcardName(absl::string_view name);

struct PlanResolution {
  struct Param {
    std::string name;  // dotted from the root
    Parameter* param = nullptr;
    Module* module = nullptr;
    std::string key;  // the rule that covers it; "" when none
    std::string style_label;
    std::shared_ptr<const TensorParallelLayer> style;
  };
  struct Forward {
    std::string name;
    Module* module = nullptr;
    std::string key;
    std::string style_label;
    std::shared_ptr<const TensorParallelLayer> style;
  };
  std::vector<Param> params;      // every parameter of the tree
  std::vector<Forward> forwards;  // modules with a rule
  std::vector<std::string> unused_rules;
  std::vector<std::string> uncovered;  // WildcardName of uncovered parameters, deduplicated
};
// Steps 1 and the matching of ParallelizeModule; nothing is validated against sizes or placed.
absl::StatusOr<PlanResolution> ResolvePlan(Module& module, const ParallelPlan& plan);

}  // namespace dt::nn
