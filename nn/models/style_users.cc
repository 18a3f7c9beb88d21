#include "dtensor/nn/models/style_users.h"

#include <algorithm>
#include <typeinfo>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/nn/models/decoder_family.h"
#include "dtensor/nn/models/flux2.h"
#include "dtensor/nn/style_registry.h"

namespace dt::nn {
namespace {

void Add(std::map<std::string, std::vector<std::string>>& users, const std::string& style,
         const std::string& model) {
  std::vector<std::string>& v = users[style];
  if (std::find(v.begin(), v.end(), model) == v.end()) v.push_back(model);
}

// A plan entry's registry name; a configured style object (PackedColwiseParallel({1, 1})) by the
// first registered style of its class.
std::string RegisteredName(const PlanEntry& entry) {
  if (entry.style == nullptr) return entry.name;
  for (const StyleRow& row : ListStyles()) {
    const auto style = FindStyle(row.name);
    if (row.alias_of.empty() && style != nullptr && typeid(*style) == typeid(*entry.style)) {
      return row.name;
    }
  }
  return entry.Label();
}

}  // namespace

std::map<std::string, std::vector<std::string>> BuiltInStyleUsers() {
  std::map<std::string, std::vector<std::string>> users;
  for (const DecoderFamily& f : DecoderFamilies()) {
    for (const auto* plan : {&f.tp_plan, &f.mlp_plan, &f.moe_plan}) {
      for (const auto& [key, style] : *plan) Add(users, style, f.model_type);
    }
    for (const auto* plan : {&f.ep_plan, &f.ep_all_reduce_plan}) {
      for (const auto& [key, style] : *plan) Add(users, style, f.model_type + " (ep)");
    }
  }
  for (const auto& [key, entry] : Flux2Transformer2DModel::TPPlan()) {
    Add(users, RegisteredName(entry), "flux2");
  }
  return users;
}

std::string FormatStyleUsers() {
  // Styles no built-in plan names, with the program that runs one (ctest in brackets).
  static const std::map<std::string, std::string> examples = {
      {"moe_identity_expert",
       "examples/custom_moe.cc: LongCat-Flash's zero experts (nn_custom_moe_np4)"},
      {"embedding_rowwise", "examples/custom_gpt2.cc (nn_custom_gpt2_np4); CausalLM --shard-embedding"},
      {"replicate", "examples/custom_gpt2.cc (nn_custom_gpt2_np4); CausalLM --replicate-kv"},
      {"uneven_colwise", "CausalLM --uneven-heads (models_uneven_heads_test)"},
      {"uneven_rowwise", "CausalLM --uneven-heads (models_uneven_heads_test)"},
      {"unit_rowwise",
       "no transformers 5.25 model; tests/nn/style_cases.cc attention_unit_query_heads "
       "(nn_styles_gloo_np4)"},
  };
  const std::map<std::string, std::vector<std::string>> users = BuiltInStyleUsers();
  std::vector<std::string> names = StyleNames();
  size_t width = 0;
  for (const std::string& n : names) width = std::max(width, n.size());
  std::string out = "Used by the built-in models' plans ((ep): expert parallel):\n";
  for (const std::string& n : names) {
    auto it = users.find(n);
    std::string used = it == users.end() ? "-" : absl::StrJoin(it->second, " ");
    if (auto e = examples.find(n); e != examples.end()) {
      absl::StrAppend(&used, it == users.end() ? " " : "; ", e->second);
    }
    absl::StrAppend(&out, n, std::string(width - n.size() + 2, ' '), used, "\n");
  }
  return out;
}

}  // namespace dt::nn
