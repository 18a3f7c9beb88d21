// The mixture-of-experts families (Mixtral, Qwen3-MoE, DeepSeek-V2, MiniCPM5-MoE, gpt-oss) with
// one process per rank, under dtrun (DT_BACKEND=shm): on n
// ranks, tensor parallel at tp = n, expert parallel at ep = n (on the same ranks as tp: Note
// [Expert-parallel layouts] in nn/distributed.h), and on 4 ranks ep 2 x tp 2 (each dim
// its own communicator) — transformers' logits and greedy tokens (tools/reference/
// make_moe_fixtures.py), each rank reading only its pieces of its experts.
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/models/causal_lm.h"
#include "dtensor/tests/models/golden_checks.h"
#include "dtensor/tests/test_world.h"
#include "gtest/gtest.h"

namespace dt::nn::testing {
namespace {

struct Layout {
  const char* model;
  int ep;  // 0: the world size; tp is the rest
};

class MoeMultiprocess : public dt::testing::OnTheWorld<Layout> {};

TEST_P(MoeMultiprocess, MatchesTransformers) {
  const Layout l = GetParam();
  const int n = world.size(), ep = l.ep == 0 ? n : l.ep;
  if (ep > 1 && (n % ep != 0 || ep % (n / ep) != 0 || (l.ep != 0 && ep == n))) {
    GTEST_SKIP() << "ep " << ep << " on " << n << " ranks (or the same as ep = n)";
  }
  const std::string fixture = std::string("moe/") + l.model + "-tiny";
  const Golden g = LoadGolden(fixture);
  DistributedConfig dist;
  dist.ep_size = ep;
  LoadReport report;
  auto model = CausalLM::FromPretrained(FixtureDir(fixture), world.shared_from_this(), dist, {},
                                        &report);
  ASSERT_TRUE(model.ok()) << "rank " << world.rank() << ": " << model.status();
  absl::Status s = MatchesGolden(**model, g, world.rank());
  EXPECT_TRUE(s.ok()) << s;
  s = ReadsOnlyItsPieces(report, world.size() > 1);
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Layouts, MoeMultiprocess,
                         ::testing::Values(Layout{"mixtral", 1}, Layout{"mixtral", 0},
                                           Layout{"mixtral", 2}, Layout{"qwen3_moe", 1},
                                           Layout{"qwen3_moe", 0}, Layout{"qwen3_moe", 2},
                                           Layout{"deepseek_v2", 1}, Layout{"deepseek_v2", 0},
                                           Layout{"deepseek_v2", 2},
                                           Layout{"minicpm5_moe", 1},
                                           Layout{"minicpm5_moe", 0},
                                           Layout{"minicpm5_moe", 2},
                                           // 2 KV heads: Note [KV heads past tp] at 4 ranks
                                           Layout{"mixtral_kv2", 1},
                                           Layout{"qwen3_moe_kv2", 0},
                                           // Note [gpt-oss experts]: 2 KV heads, sinks, windows
                                           Layout{"gpt_oss", 1}, Layout{"gpt_oss", 0},
                                           Layout{"gpt_oss", 2}),
                         [](const auto& info) {
                           return absl::StrCat(info.param.model, info.param.ep == 1 ? "_tp"
                                                                 : info.param.ep == 0 ? "_ep"
                                                                                      : "_ep2");
                         });

}  // namespace
}  // namespace dt::nn::testing
