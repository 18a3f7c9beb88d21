#include "dtensor/nn/distributed.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"

namespace dt::nn {
namespace {

absl::Status CheckSize(const DistributedConfig& config, int64_t size, absl::string_view what) {
  if (config.tp_size < 0 || (config.tp_size != 0 && config.tp_size != size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DistributedConfig: tp_size ", config.tp_size, " does not match ", what, " of ", size,
        " ranks (0 derives it; other parallel dims need an n-D mesh with a 'tp' dim)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DeviceMesh> TensorParallelMesh(const std::shared_ptr<World>& world,
                                              const DistributedConfig& config) {
  DT_RETURN_IF_ERROR(CheckSize(config, world->size(), "the world"));
  return InitDeviceMesh(world, {world->size()}, {"tp"});
}

absl::StatusOr<DeviceMesh> TensorParallelMesh(const DeviceMesh& mesh,
                                              const DistributedConfig& config) {
  if (mesh.ndim() == 1) {
    DT_RETURN_IF_ERROR(CheckSize(config, mesh.Size(), "the mesh"));
    return mesh;
  }
  absl::StatusOr<DeviceMesh> tp = mesh["tp"];
  if (!tp.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DistributedConfig: the mesh ", mesh.ToString(),
        " has no 'tp' dim; name the tensor-parallel dim 'tp' (InitDeviceMesh(world, shape, names))"));
  }
  DT_RETURN_IF_ERROR(CheckSize(config, tp->Size(), "the mesh's tp dim"));
  return tp;
}

namespace {

// Note [Expert-parallel layouts] (distributed.h): whether ep and tp share the ranks, and tp.
struct EpLayout {
  int64_t tp = 1;
  bool shared = false;
};
absl::StatusOr<EpLayout> ExpertLayout(const DistributedConfig& config, int64_t ranks) {
  const int64_t ep = config.ep_size;
  if (ep < 1 || ranks % ep != 0) {
    return absl::InvalidArgumentError(absl::StrCat("DistributedConfig: ep_size ", ep,
                                                   " does not divide the ", ranks, " ranks"));
  }
  if (ep == ranks && (config.tp_size == 0 || config.tp_size == ranks)) {
    return EpLayout{ranks, true};  // transformers' ep_size == tp_size: one group for both
  }
  const int64_t tp = config.tp_size > 0 ? config.tp_size : ranks / ep;
  if (config.tp_size < 0 || ep * tp != ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DistributedConfig: ep_size ", ep, " x tp_size ", tp, " = ", ep * tp,
        " ranks, but there are ", ranks, " (ep and tp share the ranks only when both are ", ranks,
        ")"));
  }
  if (ep % tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DistributedConfig: ep_size ", ep, " must be a multiple of tp_size ", tp,
                     " (transformers' rule)"));
  }
  return EpLayout{tp, false};
}

}  // namespace

absl::StatusOr<DeviceMesh> ModelMesh(const std::shared_ptr<World>& world,
                                     const DistributedConfig& config) {
  if (config.ep_size == 1) return TensorParallelMesh(world, config);
  DT_ASSIGN_OR_RETURN(const EpLayout layout, ExpertLayout(config, world->size()));
  if (layout.shared) return InitDeviceMesh(world, {world->size()}, {"tp"});
  return InitDeviceMesh(world, {config.ep_size, layout.tp}, {"ep", "tp"});
}

absl::StatusOr<DeviceMesh> ModelMesh(const DeviceMesh& mesh, const DistributedConfig& config) {
  if (config.ep_size == 1) return TensorParallelMesh(mesh, config);
  if (mesh.DimIndex("ep").ok()) {
    DT_ASSIGN_OR_RETURN(DeviceMesh ep_tp, mesh.Slice(std::vector<std::string>{"ep", "tp"}));
    if (ep_tp.Size(0) != config.ep_size) {
      return absl::InvalidArgumentError(absl::StrCat("DistributedConfig: ep_size ",
                                                     config.ep_size,
                                                     " does not match the mesh's ep dim of ",
                                                     ep_tp.Size(0), " ranks"));
    }
    DT_ASSIGN_OR_RETURN(const EpLayout layout, ExpertLayout(config, ep_tp.Size()));
    if (layout.shared) return TensorParallelMesh(mesh, config);
    return ep_tp;
  }
  // No ep dim: ep and tp share the tp dim.
  DT_ASSIGN_OR_RETURN(DeviceMesh tp, TensorParallelMesh(mesh, DistributedConfig{}));
  DT_ASSIGN_OR_RETURN(const EpLayout layout, ExpertLayout(config, tp.Size()));
  if (!layout.shared) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DistributedConfig: ep_size ", config.ep_size, " with tp_size ", config.tp_size,
        " needs a mesh with dims 'ep' and 'tp', got ", mesh.ToString()));
  }
  return tp;
}

absl::StatusOr<ParallelPlan> EffectiveEPPlan(const DistributedConfig& config,
                                             const ParallelPlan& model_plan,
                                             const ParallelPlan& all_reduce_plan) {
  if (const auto* plan = std::get_if<ParallelPlan>(&config.ep_plan)) return *plan;
  const std::string& name = std::get<std::string>(config.ep_plan);
  if (name == "auto") return model_plan;
  if (name == "all_reduce" && !all_reduce_plan.empty()) return all_reduce_plan;
  return absl::InvalidArgumentError(absl::StrCat(
      "DistributedConfig: ep_plan '", name,
      "' is not known: use \"auto\", \"all_reduce\" or a {key, style} list"));
}

absl::StatusOr<ParallelPlan> EffectivePlan(const DistributedConfig& config,
                                           const ParallelPlan& model_plan) {
  if (const auto* plan = std::get_if<ParallelPlan>(&config.tp_plan)) return *plan;
  const std::string& name = std::get<std::string>(config.tp_plan);
  if (name == "auto") return model_plan;
  return absl::InvalidArgumentError(absl::StrCat(
      "DistributedConfig: tp_plan '", name, "' is not known: use \"auto\" or a {key, style} list"));
}

absl::StatusOr<std::string> FormatPlan(Module& module, const ParallelPlan& plan) {
  DT_ASSIGN_OR_RETURN(PlanResolution r, ResolvePlan(module, plan));
  std::string out;
  for (const auto& [key, style] : plan) {
    std::vector<std::string> matched;
    for (const auto& p : r.params) {
      if (p.key == key) matched.push_back(p.name);
    }
    absl::StrAppend(&out, key, " -> ", style.Label(), ": ");
    if (matched.empty()) {
      absl::StrAppend(&out, "(matches no parameter)\n");
    } else if (matched.size() <= 3) {
      absl::StrAppend(&out, absl::StrJoin(matched, ", "), "\n");
    } else {
      absl::StrAppend(&out, matched.front(), ", ... ", matched.back(), " (", matched.size(),
                      " parameters)\n");
    }
  }
  if (!r.uncovered.empty()) {
    absl::StrAppend(&out, "replicated (no rule): ", absl::StrJoin(r.uncovered, ", "), "\n");
  }
  return out;
}

std::optional<DeviceMesh> PlacedMesh(const Module& module) {
  // Depth first without building names: models call it once per generated token.
  for (const auto& p : module.parameters()) {
    if (p->placed()) return p->spec().mesh();
  }
  for (const auto& [name, child] : module.children()) {
    if (std::optional<DeviceMesh> m = PlacedMesh(*child)) return m;
  }
  return std::nullopt;
}

bool LeadsPlacedMesh(const Module& module) {
  const std::optional<DeviceMesh> m = PlacedMesh(module);
  return !m.has_value() || m->my_rank() == m->ranks().front();
}

std::string FormatPlacements(const Module& module) {
  // Groups in first-seen order: (rule, wildcard name, placements) -> count.
  struct Group {
    std::string rule, name, placements;
    int64_t count = 0;
  };
  std::vector<Group> groups;
  std::vector<std::string> replicated, unplaced;
  auto add_name = [](std::vector<std::string>& list, const std::string& name) {
    if (std::find(list.begin(), list.end(), name) == list.end()) list.push_back(name);
  };
  for (const auto& [name, p] : module.NamedParameters()) {
    const std::string wild = WildcardName(name);
    if (!p->placed()) {
      add_name(unplaced, wild);
      continue;
    }
    const std::string placements = PlacementsToString(p->spec().placements());
    bool all_replicated = true;
    for (const Placement& pl : p->spec().placements()) all_replicated &= pl.is_replicate();
    if (p->plan_rule().empty() && all_replicated) {
      add_name(replicated, wild);
      continue;
    }
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
      return g.rule == p->plan_rule() && g.name == wild && g.placements == placements;
    });
    if (it == groups.end()) it = groups.insert(groups.end(), Group{p->plan_rule(), wild, placements});
    ++it->count;
  }
  std::string out;
  for (const Group& g : groups) {
    absl::StrAppend(&out, g.rule.empty() ? "placed without a rule" : g.rule, ": ", g.name, " ",
                    g.placements, g.count > 1 ? absl::StrCat(" (", g.count, ")") : "", "\n");
  }
  if (!replicated.empty()) {
    absl::StrAppend(&out, "replicated (no rule): ", absl::StrJoin(replicated, ", "), "\n");
  }
  if (!unplaced.empty()) {
    absl::StrAppend(&out, "not placed: ", absl::StrJoin(unplaced, ", "), "\n");
  }
  return out;
}

absl::Status ShardLoaded(Module& module, const ParallelPlan& plan,
                         const ParallelizeOptions& options) {
  const DeviceMesh* mesh = nullptr;
  for (const auto& [name, p] : module.NamedParameters()) {
    if (!p->materialized()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ShardLoaded: parameter '", name, "' holds no value (load the model whole first)"));
    }
    if (mesh == nullptr) mesh = &p->value().mesh();
  }
  if (mesh == nullptr) return absl::InvalidArgumentError("ShardLoaded: the model has no parameters");
  const DeviceMesh on = *mesh;
  // Placing a materialized parameter redistributes it (Replicate -> Shard cuts the piece locally,
  // no communication); validation runs first, before anything moves.
  DT_RETURN_IF_ERROR(ParallelizeModule(module, on, plan, options));
  // A piece cut from the full tensor still shares its storage: copy it out so the full is freed.
  for (const auto& [name, p] : module.NamedParameters()) {
    const Tensor& local = p->value().ToLocal();
    if (local.storage().nbytes() > local.nbytes()) {
      DT_ASSIGN_OR_RETURN(Tensor compact, local.Clone());
      DT_RETURN_IF_ERROR(p->Set(DTensor(p->value().spec(), std::move(compact))));
    }
  }
  return absl::OkStatus();
}

}  // namespace dt::nn
