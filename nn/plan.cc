#include "dtensor/nn/plan.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <typeinfo>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "dtensor/core/status.h"
#include "dtensor/nn/log.h"
#include "dtensor/nn/style_registry.h"

namespace dt::nn {
namespace {

bool IsNumeric(absl::string_view s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return absl::ascii_isdigit(c); });
}

std::string Demangle(const char* name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d != nullptr ? d : name;
  std::free(d);
  return out;
}

// Note [Plan matching]
// transformers v4 normalized a name's numeric components to `*` and looked the result up exactly,
// so a v4 MoE plan names per-expert layers with two stars ("layers.*.mlp.experts.*.gate_proj");
// diffusers expands one `*` over a ModuleList. Here each `*` of a key stands for one numeric
// component, as many as the key has, so every v4 key matches what it matched there; a key may
// also fix some indices ("blocks.*.experts.3.w" next to "blocks.*.experts.*.w"). Exact keys win
// over wildcards, and of two wildcard keys that match a name the one with fewer `*` (the more
// specific) wins; two with as many are ambiguous, an error that asks for an exact key.
class Matcher {
 public:
  explicit Matcher(const ParallelPlan& plan) : plan_(plan) {
    for (int i = 0; i < static_cast<int>(plan.size()); ++i) {
      const int stars = static_cast<int>(std::count(plan[i].first.begin(), plan[i].first.end(), '*'));
      if (stars == 0) {
        exact_[plan[i].first] = i;
      } else {
        wildcard_.emplace_back(i, stars);
      }
    }
  }

  // The index of the rule for `name`, -1 when none.
  absl::StatusOr<int> Lookup(const std::string& name) const {
    if (auto it = exact_.find(name); it != exact_.end()) return it->second;
    int found = -1, found_stars = 0;
    bool tie = false;
    int tied = -1;
    for (const auto& [i, stars] : wildcard_) {
      if (!PlanKeyMatches(plan_[i].first, name)) continue;
      if (found < 0 || stars < found_stars) {
        found = i;
        found_stars = stars;
        tie = false;
      } else if (stars == found_stars) {
        tie = true;
        tied = i;
      }
    }
    if (tie) {
      return absl::InvalidArgumentError(absl::StrCat("plan keys '", plan_[found].first, "' and '",
                                                     plan_[tied].first, "' both match '", name,
                                                     "'; add an exact key for it"));
    }
    return found;
  }

 private:
  const ParallelPlan& plan_;
  absl::flat_hash_map<std::string, int> exact_;
  std::vector<std::pair<int, int>> wildcard_;  // rule index, number of `*`
};

// The placements the plan will give, for modules' own validation.
class PlanContext : public TPValidationContext {
 public:
  PlanContext(const PlanResolution& r, int64_t tp) : tp_(tp) {
    for (const auto& p : r.params) params_[p.name] = &p;
    for (const auto& f : r.forwards) forwards_[f.name] = &f;
  }
  void set_module(std::string name) { module_ = std::move(name); }

  int64_t tp_size() const override { return tp_; }
  const std::string& module_name() const override { return module_; }
  Placement PlannedPlacement(absl::string_view path) const override {
    auto it = params_.find(JoinName(module_, path));
    if (it == params_.end() || it->second->style == nullptr) return Placement::Replicate();
    auto p = it->second->style->ParamPlacement(*it->second->module, *it->second->param);
    return p.ok() ? *p : Placement::Replicate();
  }
  int64_t PlannedPieces(absl::string_view path) const override {
    auto it = params_.find(JoinName(module_, path));
    if (it == params_.end() || it->second->style == nullptr) return 1;
    return it->second->style->ParamPieces(*it->second->module, *it->second->param, tp_);
  }
  bool OutputSharded(absl::string_view path) const override {
    auto it = forwards_.find(JoinName(module_, path));
    return it != forwards_.end() && it->second->style->ShardsOutput();
  }

 private:
  int64_t tp_;
  std::string module_;
  absl::flat_hash_map<std::string, const PlanResolution::Param*> params_;
  absl::flat_hash_map<std::string, const PlanResolution::Forward*> forwards_;
};

absl::Status CheckDivides(absl::string_view field, int64_t n, int64_t tp,
                          absl::string_view consequence) {
  if (n == 0 || n % tp == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("tensor parallel size ", tp, " does not divide ",
                                                 field, " ", n, ": ", consequence));
}

}  // namespace

std::string PlanEntry::Label() const {
  if (!name.empty()) return name;
  if (style == nullptr) return "<null style>";
  return Demangle(typeid(*style).name());
}

bool PlanKeyMatches(absl::string_view key, absl::string_view name) {
  if (key == name) return true;
  const std::vector<absl::string_view> k = absl::StrSplit(key, '.');
  const std::vector<absl::string_view> n = absl::StrSplit(name, '.');
  if (k.size() != n.size()) return false;
  int stars = 0;
  for (size_t i = 0; i < k.size(); ++i) {
    if (k[i] == "*") {
      if (!IsNumeric(n[i])) return false;
      ++stars;
    } else if (k[i] != n[i]) {
      return false;
    }
  }
  return stars >= 1;
}

std::string WildcardName(absl::string_view name) {
  std::vector<std::string> parts = absl::StrSplit(name, '.');
  for (std::string& p : parts) {
    if (IsNumeric(p)) p = "*";
  }
  return absl::StrJoin(parts, ".");
}

absl::Status ValidateTPConfig(const TPConfig& c, int64_t tp) {
  if (tp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel size must be >= 1, got ", tp));
  }
  DT_RETURN_IF_ERROR(CheckDivides("num_attention_heads", c.num_attention_heads, tp,
                                  "each rank would hold a fraction of a query head"));
  DT_RETURN_IF_ERROR(CheckDivides(
      "num_key_value_heads", c.num_key_value_heads, tp,
      "each rank would hold a fraction of a KV head (transformers does not check this and fails "
      "mid-forward: #48307); use a tensor parallel size that divides it"));
  DT_RETURN_IF_ERROR(CheckDivides("intermediate_size", c.intermediate_size, tp,
                                  "the MLP projections would be split unevenly"));
  DT_RETURN_IF_ERROR(
      CheckDivides("vocab_size", c.vocab_size, tp, "the gathered logits need equal vocab shards"));
  for (const auto& [name, blocks] : c.packed_blocks) {
    for (size_t i = 0; i < blocks.size(); ++i) {
      DT_RETURN_IF_ERROR(CheckDivides(
          absl::StrCat("packed block ", i, " of '", name, "' [", absl::StrJoin(blocks, ", "), "]:"),
          blocks[i], tp, "every packed block must be divisible on its own"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PlanResolution> ResolvePlan(Module& module, const ParallelPlan& plan) {
  std::vector<std::shared_ptr<const TensorParallelLayer>> styles;
  std::set<std::string> seen;
  for (const auto& [key, entry] : plan) {
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(absl::StrCat("plan key '", key, "' is given twice"));
    }
    std::shared_ptr<const TensorParallelLayer> style = entry.style;
    if (style == nullptr) style = FindStyle(entry.name);
    if (style == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("Unsupported tensor parallel style '", entry.name, "' for layer '", key,
                       "'. Supported styles are [",
                       absl::StrJoin(StyleNames(), ", "), "]"));
    }
    styles.push_back(std::move(style));
  }

  const Matcher matcher(plan);
  PlanResolution r;
  std::vector<bool> used(plan.size(), false);
  std::set<std::string> uncovered_seen;
  for (auto& [mname, m] : module.NamedModules()) {
    DT_ASSIGN_OR_RETURN(const int mkey, matcher.Lookup(mname));
    if (mkey >= 0) {
      used[mkey] = true;
      r.forwards.push_back({mname, m, plan[mkey].first, plan[mkey].second.Label(), styles[mkey]});
    }
    for (const auto& p : m->parameters()) {
      const std::string name = JoinName(mname, p->name());
      DT_ASSIGN_OR_RETURN(int key, matcher.Lookup(name));
      if (key < 0) key = mkey;
      PlanResolution::Param entry{name, p.get(), m, "", "", nullptr};
      if (key >= 0) {
        used[key] = true;
        entry.key = plan[key].first;
        entry.style_label = plan[key].second.Label();
        entry.style = styles[key];
      } else if (uncovered_seen.insert(WildcardName(name)).second) {
        r.uncovered.push_back(WildcardName(name));
      }
      r.params.push_back(std::move(entry));
    }
  }
  for (size_t i = 0; i < plan.size(); ++i) {
    if (!used[i]) r.unused_rules.push_back(plan[i].first);
  }
  return r;
}

namespace {

// Steps 1-4 of ParallelizeModule (plan.h): every check, nothing placed.
absl::StatusOr<PlanResolution> CheckPlan(Module& module, const DeviceMesh& mesh,
                                         const ParallelPlan& plan,
                                         const ParallelizeOptions& options) {
  if (mesh.ndim() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ParallelizeModule needs a 1-D tensor-parallel mesh (slice it: mesh[\"tp\"]), got ",
        mesh.ToString()));
  }
  const int64_t tp = mesh.Size();
  DT_ASSIGN_OR_RETURN(PlanResolution r, ResolvePlan(module, plan));
  if (options.config) DT_RETURN_IF_ERROR(ValidateTPConfig(*options.config, tp));

  // Every check before anything is placed or read: where each style puts its parameters (a
  // block list that does not fit), the modules' checks (they name heads and sizes: "does not
  // divide num_heads 8"), then the styles' (a packed block's size).
  for (const auto& p : r.params) {
    if (p.style != nullptr) DT_RETURN_IF_ERROR(p.style->ParamPlacement(*p.module, *p.param).status());
  }
  PlanContext context(r, tp);
  for (auto& [mname, m] : module.NamedModules()) {
    context.set_module(mname);
    DT_RETURN_IF_ERROR(m->ValidateTensorParallel(context));
  }
  for (const auto& p : r.params) {
    if (p.style != nullptr) DT_RETURN_IF_ERROR(p.style->ValidateParam(*p.module, *p.param, mesh));
  }

  // Note [Plan checks]
  const auto& coord = mesh.Coordinate();
  const bool reporter = coord && (*coord)[0] == 0;
  auto check = [&](PlanCheck what, bool found, const std::string& message) -> absl::Status {
    if (!found || what == PlanCheck::kIgnore) return absl::OkStatus();
    if (what == PlanCheck::kError) {
      return absl::InvalidArgumentError(absl::StrCat(module.type_name(), ": ", message));
    }
    if (reporter) LogWarning(message);
    return absl::OkStatus();
  };
  DT_RETURN_IF_ERROR(check(
      options.unused_rules, !r.unused_rules.empty(),
      absl::StrCat("The following TP rules were not applied on any of the layers: [",
                   absl::StrJoin(r.unused_rules, ", "), "]")));
  DT_RETURN_IF_ERROR(check(
      options.uncovered_params, !r.uncovered.empty(),
      absl::StrCat("The following layers were not sharded by the TP plan: [",
                   absl::StrJoin(r.uncovered, ", "),
                   "] (they stay replicated; a 'replicate' rule says that is on purpose)")));
  return r;
}

}  // namespace

absl::Status ValidatePlan(Module& module, const DeviceMesh& mesh, const ParallelPlan& plan,
                          const ParallelizeOptions& options) {
  return CheckPlan(module, mesh, plan, options).status();
}

absl::Status ParallelizeModule(Module& module, const DeviceMesh& mesh, const ParallelPlan& plan,
                               const ParallelizeOptions& options) {
  DT_ASSIGN_OR_RETURN(PlanResolution r, CheckPlan(module, mesh, plan, options));
  for (const auto& p : r.params) {
    if (p.style != nullptr) {
      DT_RETURN_IF_ERROR(p.style->ShardParam(*p.module, *p.param, mesh));
      p.param->set_plan_rule(absl::StrCat(p.key, " -> ", p.style_label));
    } else {
      DT_RETURN_IF_ERROR(p.param->Place(mesh, {Placement::Replicate()}));
      p.param->set_plan_rule("");
    }
  }
  for (const auto& f : r.forwards) {
    DT_RETURN_IF_ERROR(f.style->InstallForward(*f.module, mesh));
    f.module->set_tp_style(f.style_label);
  }
  module.set_unmatched_plan_keys(r.unused_rules);
  return absl::OkStatus();
}

absl::Status ParallelizeModule(Module& module, const DeviceMesh& mesh,
                               std::shared_ptr<const TensorParallelLayer> style) {
  return ParallelizeModule(module, mesh, ParallelPlan{{"", PlanEntry(std::move(style))}});
}

absl::Status ReplicateModule(Module& module, const DeviceMesh& mesh) {
  const Placements replicated(mesh.ndim(), Placement::Replicate());
  for (auto& [name, p] : module.NamedParameters()) {
    DT_RETURN_IF_ERROR(p->Place(mesh, replicated));
    p->set_plan_rule("");
  }
  return absl::OkStatus();
}

absl::Status ParallelizeModuleWithEP(Module& module, const DeviceMesh& mesh,
                                     const ParallelPlan& tp_plan, const ParallelPlan& ep_plan,
                                     const ParallelizeOptions& options) {
  const bool shared = mesh.ndim() == 1;
  if (!shared && (mesh.ndim() != 2 || !mesh.DimIndex("ep").ok() || !mesh.DimIndex("tp").ok())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ParallelizeModuleWithEP needs a 1-D mesh or a 2-D mesh with dims 'ep' and 'tp', got ",
        mesh.ToString()));
  }
  DT_ASSIGN_OR_RETURN(const DeviceMesh ep, shared ? mesh : mesh["ep"]);
  DT_ASSIGN_OR_RETURN(const DeviceMesh tp, shared ? mesh : mesh["tp"]);
  // On one dim the expert-parallel rules replace the tensor-parallel ones of the same keys.
  ParallelPlan tp_rules;
  for (const auto& rule : tp_plan) {
    const bool replaced =
        shared && std::any_of(ep_plan.begin(), ep_plan.end(),
                              [&](const auto& e) { return e.first == rule.first; });
    if (!replaced) tp_rules.push_back(rule);
  }
  // Every check of both plans before anything is placed.
  DT_ASSIGN_OR_RETURN(PlanResolution r, ResolvePlan(module, ep_plan));
  for (const auto& p : r.params) {
    if (p.style == nullptr) continue;
    DT_RETURN_IF_ERROR(p.style->ParamPlacement(*p.module, *p.param).status());
    DT_RETURN_IF_ERROR(p.style->ValidateParam(*p.module, *p.param, ep));
  }
  if (!r.unused_rules.empty() && options.unused_rules != PlanCheck::kIgnore) {
    const std::string message =
        absl::StrCat("The following EP rules were not applied on any of the layers: [",
                     absl::StrJoin(r.unused_rules, ", "), "]");
    if (options.unused_rules == PlanCheck::kError) {
      return absl::InvalidArgumentError(absl::StrCat(module.type_name(), ": ", message));
    }
    if (mesh.my_rank() == mesh.ranks().front()) LogWarning(message);
  }
  ParallelizeOptions quiet = options;
  quiet.unused_rules = quiet.uncovered_params = PlanCheck::kIgnore;
  DT_RETURN_IF_ERROR(ValidatePlan(module, tp, tp_rules, quiet));
  // The tensor-parallel plan on the tp dim (warnings once, from the ranks of ep coordinate 0).
  ParallelizeOptions tp_options = options;
  if (!shared && mesh.Coordinate() && (*mesh.Coordinate())[0] != 0) tp_options = quiet;
  DT_RETURN_IF_ERROR(ParallelizeModule(module, tp, tp_rules, tp_options));
  // The expert-parallel plan on the ep dim: [ep, tp] placements for what it shards.
  for (const auto& p : r.params) {
    if (p.style == nullptr) continue;
    DT_ASSIGN_OR_RETURN(const Placement on_ep, p.style->ParamPlacement(*p.module, *p.param));
    if (on_ep.is_replicate()) continue;
    if (shared) {
      DT_RETURN_IF_ERROR(p.param->Place(mesh, {on_ep}));
      p.param->set_plan_rule(absl::StrCat(p.key, " -> ", p.style_label));
      continue;
    }
    const Placement on_tp = p.param->spec().placements()[0];
    DT_RETURN_IF_ERROR(p.param->Place(mesh, {on_ep, on_tp}));
    const std::string tp_rule = p.param->plan_rule();
    const std::string prefix = absl::StrCat(p.key, " -> ");
    p.param->set_plan_rule(tp_rule.rfind(prefix, 0) == 0
                               ? absl::StrCat(tp_rule, " + ", p.style_label)
                               : absl::StrCat(tp_rule, tp_rule.empty() ? "" : "; ", p.key, " -> ",
                                              p.style_label));
  }
  for (const auto& f : r.forwards) {
    DT_RETURN_IF_ERROR(f.style->InstallForward(*f.module, ep));
    const std::string tp_style = f.module->tp_style();
    f.module->set_tp_style(tp_style.empty() ? f.style_label
                                            : absl::StrCat(tp_style, " + ", f.style_label));
  }
  std::vector<std::string> unmatched = module.unmatched_plan_keys();
  unmatched.insert(unmatched.end(), r.unused_rules.begin(), r.unused_rules.end());
  module.set_unmatched_plan_keys(std::move(unmatched));
  return absl::OkStatus();
}

}  // namespace dt::nn
