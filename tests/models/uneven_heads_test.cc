// Note [Uneven heads at any tp] (nn/models/uneven_heads.cc): the Qwen2 tiny fixture has SmolLM2's
// 9 query / 3 KV heads; with uneven_heads it runs at tp 2 as 5 + 4 query heads (k/v replicated:
// KV head 1 serves query heads on both ranks) and matches transformers' golden — greedy tokens
// identical, logits within 1e-4 of their scale — with each rank holding exactly its whole heads
// and the load report stating the imbalance.
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/models/causal_lm.h"
#include "dtensor/nn/models/uneven_heads.h"
#include "dtensor/tests/models/golden_checks.h"
#include "dtensor/tests/test_util.h"
#include "gtest/gtest.h"

namespace dt::nn::testing {
namespace {

using dt::testing::Contains;

const char kQwen2[] = "zoo/qwen2-tiny";

TEST(UnevenHeads, NineHeadsOnTwoRanksMatchTransformers) {
  const Golden g = LoadGolden(kQwen2);
  CausalLMLoadOptions o;
  o.uneven_heads = true;
  absl::Status s = World::RunThreads(2, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {2}, {"tp"}));
    LoadReport report;
    DT_ASSIGN_OR_RETURN(auto m, CausalLM::FromPretrained(FixtureDir(kQwen2), mesh, o, &report));
    DT_RETURN_IF_ERROR(MatchesGolden(*m, g, w.rank()));
    // Rank 0 holds query heads 0-4, rank 1 heads 5-8, whole (head_dim rows each), in q_proj's
    // rows, its bias and o_proj's columns.
    const int64_t d = m->config().head_dim;
    const int64_t first = w.rank() == 0 ? 0 : 5, heads = w.rank() == 0 ? 5 : 4;
    for (const auto& [name, dim] : std::vector<std::pair<std::string, int>>{
             {"model.layers.0.self_attn.q_proj.weight", 0},
             {"model.layers.1.self_attn.q_proj.bias", 0},
             {"model.layers.1.self_attn.o_proj.weight", 1}}) {
      DT_ASSIGN_OR_RETURN(Parameter * p, m->GetParameter(name));
      if (p->spec().LocalShape()[dim] != heads * d || p->spec().Offset()[dim] != first * d ||
          p->spec().placements()[0] != Placement::Shard(dim, d)) {
        return absl::InternalError(absl::StrCat("rank ", w.rank(), ": ", name, " is ",
                                                p->Describe()));
      }
    }
    DT_ASSIGN_OR_RETURN(Parameter * k, m->GetParameter("model.layers.0.self_attn.k_proj.weight"));
    if (!k->spec().placements()[0].is_replicate()) {
      return absl::InternalError(absl::StrCat("k_proj is ", k->Describe()));
    }
    const std::string want =
        "9 query heads on 2 ranks split unevenly (uneven_heads): 5 + 4 heads per rank; "
        "attention load imbalance 5 / 4 (the ranks with 5 heads set the pace: 11% more attention "
        "time than an even split); k_proj / v_proj replicate, a KV head serving query heads on two "
        "ranks";
    bool said = false;
    for (const std::string& n : report.notes) said = said || absl::StartsWith(n, want);
    if (!said) {
      return absl::InternalError(absl::StrCat("notes: [", absl::StrJoin(report.notes, "; "), "]"));
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

// Without the option the plan refuses tp 2 as before; with it, a tp at which torch.chunk would
// leave a rank without heads (9 at tp 4: 3, 3, 3, 0) is refused the same way, before any read.
TEST(UnevenHeads, OptInAndIdleRanksAreRefused) {
  for (const auto& [tp, uneven] : std::vector<std::pair<int, bool>>{{2, false}, {4, true}}) {
    CausalLMLoadOptions o;
    o.uneven_heads = uneven;
    absl::Status s = World::RunThreads(tp, [&](World& w) -> absl::Status {
      DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {tp}, {"tp"}));
      return CausalLM::FromPretrained(FixtureDir(kQwen2), mesh, o).status();
    });
    EXPECT_TRUE(
        Contains(s, absl::StrCat("tensor parallel size ", tp, " does not divide num_heads 9")))
        << "tp " << tp << ": " << s;
  }
}

// Which plan each head count gets: the KV heads follow the query split exactly (uneven_colwise)
// only where every rank's query heads are the groups of its chunk of the KV heads; a tp that
// divides the heads, or leaves a rank none, keeps the plan.
TEST(UnevenHeads, KVHeadsFollowTheQuerySplitOrAreReplicated) {
  auto styles = [](int64_t heads, int64_t kv, int64_t tp) {
    loaders::DecoderConfig c;
    c.num_attention_heads = heads;
    c.num_key_value_heads = kv;
    const ParallelPlan plan = FitUnevenHeads({{"model.layers.*.self_attn.q_proj", "colwise"},
                                              {"model.layers.*.self_attn.k_proj", "colwise"},
                                              {"model.layers.*.self_attn.o_proj", "rowwise"}},
                                             c, tp);
    std::string out = absl::StrCat(plan[0].second.name, " ", plan[1].second.name, " ",
                                   plan[2].second.name);
    if (std::optional<std::string> note = UnevenHeadsNote(plan, c, tp)) {
      absl::StrAppend(&out, " | ", *note);
    }
    return out;
  };
  EXPECT_EQ(styles(9, 9, 2),  // MHA: the KV heads split as the query heads do
            "uneven_colwise uneven_colwise uneven_rowwise | 9 query heads on 2 ranks split "
            "unevenly (uneven_heads): 5 + 4 heads per rank; attention load imbalance 5 / 4 (the "
            "ranks with 5 heads set the pace: 11% more attention time than an even split); "
            "k_proj / v_proj uneven_colwise, 5 + 4 KV heads following them (Note [Uneven heads "
            "at any tp])");
  EXPECT_TRUE(absl::StartsWith(styles(14, 7, 4), "uneven_colwise uneven_colwise uneven_rowwise"));
  EXPECT_TRUE(absl::StartsWith(styles(9, 3, 2), "uneven_colwise replicate uneven_rowwise"));
  EXPECT_TRUE(absl::StartsWith(styles(10, 5, 4), "uneven_colwise replicate uneven_rowwise"));
  EXPECT_EQ(styles(9, 3, 3), "colwise colwise rowwise");  // even
  EXPECT_EQ(styles(9, 3, 4), "colwise colwise rowwise");  // 3 + 3 + 3 + 0
  EXPECT_EQ(styles(9, 3, 1), "colwise colwise rowwise");
}

}  // namespace
}  // namespace dt::nn::testing
