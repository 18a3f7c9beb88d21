#include "dtensor/nn/style_registry.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "dtensor/core/status.h"
#include "dtensor/nn/expert_parallel.h"
#include "dtensor/nn/styles.h"

namespace dt::nn {
namespace {

struct Entry {
  std::string name;
  std::string alias_of;
  std::shared_ptr<const TensorParallelLayer> style;
};

class Registry {
 public:
  Registry() {
    const Placement r = Placement::Replicate();
    Add("colwise", std::make_shared<ColwiseParallel>());
    Add("colwise_gather_output", std::make_shared<ColwiseParallel>(r, r));
    AddAlias("colwise_rep", "colwise_gather_output");
    Add("rowwise", std::make_shared<RowwiseParallel>());
    Add("rowwise_split_input", std::make_shared<RowwiseParallel>(r, r));
    AddAlias("rowwise_rep", "rowwise_split_input");
    Add("packed_colwise", std::make_shared<PackedColwiseParallel>());
    Add("packed_rowwise", std::make_shared<PackedRowwiseParallel>());
    Add("embedding_rowwise", std::make_shared<EmbeddingParallel>(0));
    Add("embedding_colwise", std::make_shared<EmbeddingParallel>(1));
    Add("sequence_parallel", std::make_shared<SequenceParallel>());
    Add("all_reduce", std::make_shared<AllReduceParallel>());
    Add("replicate", std::make_shared<ReplicateParallel>());
    Add("local_params", std::make_shared<LocalParamsParallel>());
    // Note [Inference only] (nn/styles.h): replication under transformers' names.
    const std::string no_grad = "none (inference only: no gradients)";
    Add("replicated_with_grad_allreduce",
        std::make_shared<ReplicateParallel>(
            StyleInfo{"R", "R", "unchanged", "unchanged", no_grad}));
    Add("moe_tp_experts", std::make_shared<MoEExpertsParallel>());
    Add("moe_identity_expert", std::make_shared<MoEIdentityParallel>());
    // Note [Unit meshes] (nn/styles.h): heads kept whole when tp does not divide them.
    Add("unit_colwise", std::make_shared<UnitParallel>(/*col=*/true));
    Add("unit_rowwise", std::make_shared<UnitParallel>(/*col=*/false));
    // Note [Uneven heads] (nn/styles.h): whole heads, torch.chunk over them (9 on 2 ranks: 5 + 4).
    Add("uneven_colwise", std::make_shared<ColwiseParallel>(r, Placement::Shard(-1), true, true));
    Add("uneven_rowwise", std::make_shared<RowwiseParallel>(Placement::Shard(-1), r, true, true));
    Add("mla_kv_a_proj", std::make_shared<ReplicateParallel>(
                             StyleInfo{"R", "R", "unchanged", "unchanged (whole)", no_grad}));
    // Expert parallelism (nn/expert_parallel.h): used on the ep dim of an (ep, tp) mesh.
    Add("grouped_gemm", std::make_shared<GroupedGemmParallel>());
    Add("ep_router", std::make_shared<RouterParallel>());
    Add("ep_dispatch_experts", std::make_shared<EpDispatchExpertsParallel>());
  }

  void Add(const std::string& name, std::shared_ptr<const TensorParallelLayer> style,
           const std::string& alias_of = "") {
    absl::MutexLock lock(&mu_);
    for (Entry& e : entries_) {
      if (e.name == name) {
        e.style = std::move(style);
        e.alias_of = alias_of;
        return;
      }
    }
    entries_.push_back({name, alias_of, std::move(style)});
  }

  bool AddAlias(const std::string& alias, const std::string& target) {
    auto style = Find(target);
    if (style == nullptr) return false;
    Add(alias, std::move(style), target);
    return true;
  }

  std::shared_ptr<const TensorParallelLayer> Find(absl::string_view name) {
    absl::MutexLock lock(&mu_);
    for (const Entry& e : entries_) {
      if (e.name == name) return e.style;
    }
    return nullptr;
  }

  std::vector<Entry> Entries() {
    absl::MutexLock lock(&mu_);
    return entries_;
  }

 private:
  absl::Mutex mu_;
  std::vector<Entry> entries_;
};

Registry& TheRegistry() {
  static Registry* const registry = new Registry();
  return *registry;
}

absl::Status CheckName(const std::string& name) {
  if (name.empty() ||
      std::any_of(name.begin(), name.end(), [](char c) { return absl::ascii_isspace(c); })) {
    return absl::InvalidArgumentError(
        absl::StrCat("style name '", name, "' must be non-empty and contain no whitespace"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RegisterStyle(const std::string& name,
                           std::shared_ptr<const TensorParallelLayer> style) {
  DT_RETURN_IF_ERROR(CheckName(name));
  if (style == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("RegisterStyle('", name, "'): null style"));
  }
  TheRegistry().Add(name, std::move(style));
  return absl::OkStatus();
}

absl::Status RegisterStyleAlias(const std::string& alias, const std::string& target) {
  DT_RETURN_IF_ERROR(CheckName(alias));
  if (!TheRegistry().AddAlias(alias, target)) {
    return absl::NotFoundError(
        absl::StrCat("RegisterStyleAlias('", alias, "'): no style '", target, "'"));
  }
  return absl::OkStatus();
}

std::shared_ptr<const TensorParallelLayer> FindStyle(absl::string_view name) {
  return TheRegistry().Find(name);
}

std::vector<std::string> StyleNames() {
  std::vector<std::string> names;
  for (const Entry& e : TheRegistry().Entries()) names.push_back(e.name);
  return names;
}

std::vector<StyleRow> ListStyles() {
  std::vector<StyleRow> rows;
  for (const Entry& e : TheRegistry().Entries()) {
    rows.push_back({e.name, e.alias_of, e.style->Info()});
  }
  return rows;
}

std::string FormatStylesTable() {
  std::vector<std::vector<std::string>> cells = {
      {"style", "weight", "bias (1-D)", "input", "output", "collective"}};
  for (const StyleRow& r : ListStyles()) {
    const std::string name =
        r.alias_of.empty() ? r.name : absl::StrCat(r.name, " (= ", r.alias_of, ")");
    cells.push_back(
        {name, r.info.weight, r.info.bias, r.info.input, r.info.output, r.info.collective});
  }
  std::vector<size_t> width(cells[0].size(), 0);
  for (const auto& row : cells) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (size_t r = 0; r < cells.size(); ++r) {
    std::string line;
    for (size_t i = 0; i < cells[r].size(); ++i) {
      absl::StrAppend(&line, cells[r][i]);
      if (i + 1 < cells[r].size()) line.append(width[i] - cells[r][i].size() + 2, ' ');
    }
    absl::StrAppend(&out, line, "\n");
    if (r == 0) {
      size_t total = 0;
      for (size_t i = 0; i < width.size(); ++i) total += width[i] + (i + 1 < width.size() ? 2 : 0);
      absl::StrAppend(&out, std::string(total, '-'), "\n");
    }
  }
  absl::StrAppend(&out,
                  "\n'local': the output is this rank's piece as a plain tensor (use_local_output)."
                  "\n_S(d,...): interleaved block shard of a packed weight (gathers back to the "
                  "checkpoint layout).\nInference only: replicated_with_grad_allreduce keeps the "
                  "forward replicated and synchronizes no gradients.\n");
  return out;
}

}  // namespace dt::nn
