// The decoder zoo with one process per rank: run under dtrun (DT_BACKEND=shm or gloo). Every family
// whose query heads the world size divides loads only its shards (with the default plan: each KV
// head whole on the ranks that use it when the KV heads do not divide, Note [KV heads past tp])
// and must reproduce transformers' logits and greedy continuation
// (tools/reference/make_zoo_fixtures.py); the others skip, except Qwen2 (SmolLM2's 9 / 3 heads)
// on 2 ranks, which runs with uneven_heads as 5 + 4 query heads (Note [Uneven heads at any
// tp]).
#include <cmath>

#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/models/causal_lm.h"
#include "dtensor/tests/models/llama_util.h"
#include "dtensor/tests/test_world.h"
#include "gtest/gtest.h"

namespace dt::nn::testing {
namespace {

class ZooMultiprocess : public dt::testing::OnTheWorld<const char*> {};

TEST_P(ZooMultiprocess, MatchesTransformers) {
  const std::string fixture = std::string("zoo/") + GetParam() + "-tiny";
  const loaders::DecoderConfig c = loaders::LoadDecoderConfig(FixtureDir(fixture)).value();
  const int tp = world.size();
  CausalLMLoadOptions o;
  o.uneven_heads = std::string(GetParam()) == "qwen2" && tp == 2;
  if (c.num_attention_heads % tp != 0 && !o.uneven_heads) {
    GTEST_SKIP() << GetParam() << ": " << c.num_attention_heads << " heads on " << tp << " ranks";
  }
  const Golden g = LoadGolden(fixture);
  auto mesh = InitDeviceMesh(world.shared_from_this(), {tp}, {"tp"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  LoadReport report;
  auto model = CausalLM::FromPretrained(FixtureDir(fixture), *mesh, o, &report);
  ASSERT_TRUE(model.ok()) << "rank " << world.rank() << ": " << model.status();
  auto ids = Tensor::FromVector<int64_t>({1, static_cast<int64_t>(g.prompt.size())}, g.prompt);
  auto logits = (*model)->Logits(*ids);
  ASSERT_TRUE(logits.ok()) << logits.status();
  double scale = 0;
  for (float v : g.f32.prompt_logits) scale = std::max(scale, double(std::fabs(v)));
  EXPECT_LE(MaxAbsDiff(*logits, g.f32.prompt_logits), 1e-4 * scale) << "rank " << world.rank();
  GenerateOptions go;
  go.max_new_tokens = static_cast<int64_t>(g.f32.greedy_tokens.size());
  auto r = (*model)->Generate(g.prompt, go);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens, g.f32.greedy_tokens) << "rank " << world.rank();
  for (const LoadReport::Param& p : report.params) {
    if (tp > 1 && p.sharded) {
      EXPECT_LT(p.read_bytes, p.full_bytes) << p.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ZooMultiprocess,
                         ::testing::Values("mistral", "qwen2", "qwen3", "phi3", "gemma", "olmo2",
                                           "gemma2", "gemma3_text"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace dt::nn::testing
