#pragma once
// The opt-in uneven head split of the causal LMs (CausalLMLoadOptions::uneven_heads, generate's
// and `dtensor serve`'s --uneven-heads): Note [Uneven heads at any tp] in uneven_heads.cc.

#include <cstdint>
#include <optional>
#include <string>

#include "dtensor/loaders/hf_config.h"
#include "dtensor/nn/plan.h"

namespace dt::nn {

// `plan` with q_proj / o_proj uneven_colwise / uneven_rowwise and k_proj / v_proj following them
// (uneven_colwise, or replicated where a KV head serves query heads on two ranks) when tp does
// not divide the query heads and torch.chunk over them gives every rank at least one; `plan`
// unchanged otherwise.
ParallelPlan FitUnevenHeads(ParallelPlan plan, const loaders::DecoderConfig& config, int64_t tp);

// What the load report says of an uneven split in `plan`: the heads per rank and the imbalance;
// nullopt when the plan splits no heads unevenly.
std::optional<std::string> UnevenHeadsNote(const ParallelPlan& plan,
                                           const loaders::DecoderConfig& config, int64_t tp);

}  // namespace dt::nn
