#pragma once
// The style registry: plan names -> configured styles (transformers' ALL_PARALLEL_STYLES, which
// users extend with ParallelInterface.register). Process-wide and thread-safe; built-ins are
// registered on first use, users add or replace names at run time.
//
//   RegisterStyle("colwise_custom", std::make_shared<ColwiseParallel>());
//   ParallelizeModule(model, tp_mesh, {{"layers.*.mlp.up_proj", "colwise_custom"}});
//
// Built-in names (nn/styles.h):
//   colwise, colwise_gather_output (alias colwise_rep), rowwise, rowwise_split_input (alias
//   rowwise_rep), packed_colwise, packed_rowwise, embedding_rowwise, embedding_colwise,
//   sequence_parallel, all_reduce, replicate, local_params, replicated_with_grad_allreduce,
//   moe_tp_experts, moe_identity_expert, unit_colwise, unit_rowwise, uneven_colwise,
//   uneven_rowwise, mla_kv_a_proj; and expert parallelism's (nn/expert_parallel.h) grouped_gemm,
//   ep_router, ep_dispatch_experts.
//
// `dtensor styles` prints FormatStylesTable().

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dtensor/nn/style.h"

namespace dt::nn {

// Adds or replaces `name` (non-empty, no whitespace) -> `style` (non-null).
absl::Status RegisterStyle(const std::string& name,
                           std::shared_ptr<const TensorParallelLayer> style);
// Registers `alias` as another name of the style registered under `target`.
absl::Status RegisterStyleAlias(const std::string& alias, const std::string& target);
// nullptr when `name` is not registered.
std::shared_ptr<const TensorParallelLayer> FindStyle(absl::string_view name);
// Registered names, in registration order.
std::vector<std::string> StyleNames();

struct StyleRow {
  std::string name;
  std::string alias_of;  // "" unless an alias
  StyleInfo info;
};
std::vector<StyleRow> ListStyles();

// The table `dtensor styles` prints: one row per name (weight, bias, input, output, collective).
std::string FormatStylesTable();

}  // namespace dt::nn
