// Llama tensor parallelism with one process per rank: run under dtrun (DT_BACKEND=gloo or shm). Every
// rank loads only its shards of tests/fixtures/llama-tiny and must reproduce transformers' logits
// and greedy continuation; the loader's peak per rank stays under (full/tp + replicated) x 1.2.
#include "dtensor/core/status.h"
#include "gtest/gtest.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/models/llama.h"
#include "dtensor/tests/models/golden_checks.h"
#include "dtensor/tests/models/llama_util.h"
#include "dtensor/tests/test_world.h"

namespace dt::nn::testing {
namespace {

class LlamaMultiprocess : public dt::testing::OnTheWorld<const char*> {};

TEST_P(LlamaMultiprocess, MatchesTransformers) {
  const Golden g = LoadGolden(GetParam());
  auto mesh = InitDeviceMesh(world.shared_from_this(), {world.size()}, {"tp"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  LlamaLoadOptions o;
  o.dtype = DType::kF32;
  LlamaLoadReport report;
  auto model = LlamaForCausalLM::FromPretrained(FixtureDir(GetParam()), *mesh, o, &report);
  ASSERT_TRUE(model.ok()) << "rank " << world.rank() << ": " << model.status();
  auto ids = Tensor::FromVector<int64_t>({1, static_cast<int64_t>(g.prompt.size())}, g.prompt);
  auto logits = (*model)->Logits(*ids);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_LE(MaxAbsDiff(*logits, g.f32.prompt_logits), 1e-4) << "rank " << world.rank();
  GenerateOptions go;
  go.max_new_tokens = static_cast<int64_t>(g.f32.greedy_tokens.size());
  auto r = (*model)->Generate(g.prompt, go);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens, g.f32.greedy_tokens) << "rank " << world.rank();
  const absl::Status bound = WithinLoadBound(report, world.size(), world.rank());
  EXPECT_TRUE(bound.ok()) << bound;
  for (const LlamaLoadReport::Param& p : report.params) {
    if (world.size() > 1 && p.sharded) {
      EXPECT_LT(p.read_bytes, p.full_bytes) << p.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LlamaMultiprocess,
                         ::testing::Values("llama-tiny", "llama-tiny-tied-bf16"), FixtureParamName);

}  // namespace
}  // namespace dt::nn::testing
