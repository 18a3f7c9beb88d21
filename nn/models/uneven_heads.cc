#include "dtensor/nn/models/uneven_heads.h"

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "dtensor/dtensor/placement.h"

namespace dt::nn {
namespace {

// Note [Uneven heads at any tp]
// transformers' plans split q_proj colwise, which needs tp to divide the query heads: SmolLM2's 9
// run at tp 1, 3 and 9 only. With uneven_heads, a tp that does not divide them splits q_proj and
// o_proj in whole heads as torch.chunk over the heads (uneven_colwise / uneven_rowwise, Note
// [Uneven heads] in nn/styles.h, placements S(0,unit=head_dim) / S(1,unit=head_dim): Note [Unit
// shards] in dtensor/placement.h): 9 heads at tp 2 are 5 + 4.
//
// The KV heads must follow the query heads, not be split on their own: query head h uses KV head
// h / g (g = heads / KV heads), so rank 0's heads 0-4 use KV heads 0 and 1 and rank 1's heads 5-8
// use KV heads 1 and 2. A torch.chunk of the 3 KV heads (2 + 1) would leave rank 1 without KV
// head 1, and no placement holds the overlapping pieces 0-1 and 1-2. So:
//   - where g · chunk(KV heads, tp) is chunk(heads, tp) on every rank (each rank's query heads
//     are whole groups, and exactly those of its KV heads: MHA, or 14 / 7 heads at tp 4, 4 + 4 +
//     4 + 2 over 2 + 2 + 2 + 1), k_proj and v_proj are uneven_colwise too, each rank computing
//     and caching its own KV heads;
//   - otherwise they are replicated: every rank computes every KV head and Attention keeps those
//     its query heads use (Note [Replicated KV heads] in nn/attention.cc; where the query split
//     cuts a group it keeps one KV head per query head, so SmolLM2 at tp 2 caches 5 and 4 KV
//     heads per rank instead of 2 and 2).
// torch.chunk gives the first ranks ceil(heads / tp) heads and may leave the last ones none (9
// heads at tp 4: 3, 3, 3, 0); such a tp is left to the plan's usual check (an idle rank would run
// attention over no heads), as is a tp that divides the heads (uneven_heads changes nothing).
// The MLP and the vocabulary are split as before and must still divide by tp. The price is the
// imbalance: the rank with the most heads sets the pace of attention, which the load report
// states (UnevenHeadsNote).

bool EndsIn(const std::string& key, absl::string_view proj) {
  return absl::EndsWith(key, absl::StrCat(".self_attn.", proj));
}

// Heads per rank as torch.chunk gives them.
std::vector<int64_t> ChunkSizes(int64_t n, int64_t tp) {
  std::vector<int64_t> out;
  for (int64_t r = 0; r < tp; ++r) out.push_back(ChunkOf(n, tp, r).size);
  return out;
}

// Whether every rank's query heads are exactly the query heads of its chunk of the KV heads.
bool KVFollowsQueries(int64_t heads, int64_t kv, int64_t tp) {
  const int64_t g = heads / kv;
  for (int64_t r = 0; r < tp; ++r) {
    const Chunk q = ChunkOf(heads, tp, r), k = ChunkOf(kv, tp, r);
    if (q.size != g * k.size || (q.size > 0 && q.offset != g * k.offset)) return false;
  }
  return true;
}

bool Applies(const loaders::DecoderConfig& c, int64_t tp) {
  const int64_t heads = c.num_attention_heads;
  return tp > 1 && heads > 0 && heads % tp != 0 && ChunkOf(heads, tp, tp - 1).size > 0;
}

}  // namespace

ParallelPlan FitUnevenHeads(ParallelPlan plan, const loaders::DecoderConfig& config, int64_t tp) {
  if (!Applies(config, tp)) return plan;
  const bool kv_follows =
      KVFollowsQueries(config.num_attention_heads, config.num_key_value_heads, tp);
  for (auto& [key, style] : plan) {
    if (EndsIn(key, "q_proj") && style.name == "colwise") style = PlanEntry("uneven_colwise");
    if (EndsIn(key, "o_proj") && style.name == "rowwise") style = PlanEntry("uneven_rowwise");
    if ((EndsIn(key, "k_proj") || EndsIn(key, "v_proj")) && style.name == "colwise") {
      style = PlanEntry(kv_follows ? "uneven_colwise" : "replicate");
    }
  }
  return plan;
}

std::optional<std::string> UnevenHeadsNote(const ParallelPlan& plan,
                                           const loaders::DecoderConfig& config, int64_t tp) {
  std::string kv_style;
  bool uneven = false;
  for (const auto& [key, style] : plan) {
    if (EndsIn(key, "q_proj") && style.name == "uneven_colwise") uneven = true;
    if (EndsIn(key, "k_proj")) kv_style = style.name;
  }
  if (!uneven) return std::nullopt;
  const int64_t heads = config.num_attention_heads, kv = config.num_key_value_heads;
  const std::vector<int64_t> sizes = ChunkSizes(heads, tp);
  const int64_t most = sizes.front(), least = sizes.back();
  std::string note = absl::StrCat(
      heads, " query heads on ", tp, " ranks split unevenly (uneven_heads): ",
      absl::StrJoin(sizes, " + "), " heads per rank; attention load imbalance ", most, " / ", least,
      " (the ranks with ", most, " heads set the pace: ",
      absl::StrFormat("%.0f", 100.0 * (most * tp - heads) / heads),
      "% more attention time than an even split); ");
  if (kv_style == "uneven_colwise") {
    absl::StrAppend(&note, "k_proj / v_proj uneven_colwise, ",
                    absl::StrJoin(ChunkSizes(kv, tp), " + "), " KV heads following them");
  } else {
    absl::StrAppend(&note, "k_proj / v_proj ", kv_style, ", a KV head serving query heads on two ",
                    "ranks");
  }
  absl::StrAppend(&note, " (Note [Uneven heads at any tp])");
  return note;
}

}  // namespace dt::nn
