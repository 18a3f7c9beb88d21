// The serving engine (nn/models/engine.h) with one process per rank, under dtrun: every request's
// tokens equal CausalLM::Generate's for it alone (greedy and sampled, joining and leaving at
// different steps) on the f32 and GGUF Qwen2 fixtures (9 query heads: tp 3) — ctest
// models_engine_shm_np3; and a rank that dies mid-run makes Step fail on every live rank within
// the collective timeout, and on every Step after — models_engine_dead_rank_np3 (gloo, a 4 s
// timeout).
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/models/causal_lm.h"
#include "dtensor/nn/models/engine.h"
#include "dtensor/tests/models/engine_util.h"
#include "dtensor/tests/models/llama_util.h"
#include "dtensor/tests/test_world.h"
#include "gtest/gtest.h"

namespace dt::nn::testing {
namespace {

absl::StatusOr<std::unique_ptr<CausalLM>> Load(World& world, const std::string& fixture) {
  CausalLMLoadOptions o;
  o.keep_quantized = true;
  o.unused_tensors = PlanCheck::kIgnore;
  return CausalLM::FromPretrained(FixtureDir(fixture), world.shared_from_this(), DistributedConfig(), o);
}

class EngineMultiprocess : public dt::testing::OnTheWorld<const char*> {};

TEST_P(EngineMultiprocess, EachRequestAsAlone) {
  absl::StatusOr<std::unique_ptr<CausalLM>> model = Load(world, GetParam());
  ASSERT_TRUE(model.ok()) << "rank " << world.rank() << ": " << model.status();
  const std::vector<TimedRequest> requests = MixedRequests((*model)->config().vocab_size);
  std::vector<Outcome> alone;
  for (const TimedRequest& r : requests) {
    absl::StatusOr<Outcome> o = RunAlone(**model, r.request);
    ASSERT_TRUE(o.ok()) << o.status();
    alone.push_back(*o);
  }
  absl::StatusOr<std::unique_ptr<Engine>> engine = MakeBatchingEngine(**model, SmallOptions());
  ASSERT_TRUE(engine.ok()) << engine.status();
  RunLog log;
  absl::StatusOr<std::vector<Outcome>> got = RunEngine(**engine, world.rank() == 0, requests, &log);
  ASSERT_TRUE(got.ok()) << "rank " << world.rank() << ": " << got.status();
  if (world.rank() != 0) return;
  // f32 weights: every token's margin is far above the batched forward's rounding on this fixture
  // (tests/models/engine_test.cc measures it at tp 3 on threads), so every token is alone's.
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ((*got)[i], alone[i]) << "request " << i << ": " << Describe((*got)[i]) << " vs "
                                   << Describe(alone[i]);
  }
  EXPECT_EQ(log.max_running, 3);
  EXPECT_EQ((*engine)->stats().kv_pages_used, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineMultiprocess,
                         ::testing::Values("zoo/qwen2-tiny", "zoo/qwen2-tiny.gguf"),
                         [](const auto& info) {
                           return std::string(info.param).find(".gguf") != std::string::npos
                                      ? std::string("gguf")
                                      : std::string("safetensors");
                         });

// The last rank leaves (exits) before its sixth step; the others must see Step fail within the
// collective timeout (DT_TIMEOUT_MS) and keep failing after, never hang.
TEST(EngineDeadRank, StepFailsOnEveryLiveRank) {
  World& world = dt::testing::TheWorld();
  absl::StatusOr<std::unique_ptr<CausalLM>> model = Load(world, "zoo/qwen2-tiny");
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<std::unique_ptr<Engine>> engine = MakeBatchingEngine(**model, SmallOptions());
  ASSERT_TRUE(engine.ok()) << engine.status();
  const int64_t vocab = (*model)->config().vocab_size;
  if (world.rank() == 0) {
    for (int64_t i = 0; i < 3; ++i) {
      EngineRequest r;
      r.prompt = Prompt(6 + i, vocab, i);
      r.max_new_tokens = 100;
      ASSERT_TRUE((*engine)->Submit(r).ok());
    }
  }
  constexpr int kDeathStep = 5;
  for (int step = 0; step < kDeathStep; ++step) {
    ASSERT_TRUE((*engine)->Step().ok()) << "rank " << world.rank() << " step " << step;
  }
  if (world.rank() == world.size() - 1) ::_exit(0);  // gone without a word
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status failed;
  for (int step = kDeathStep; step < 1000 && failed.ok(); ++step) failed = (*engine)->Step().status();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(failed.ok()) << "rank " << world.rank() << ": Step never failed";
  EXPECT_LT(seconds, world.timeout().count() / 1000.0 + 10) << failed;
  std::printf("rank %d: Step failed %.1f s after the last rank left: %s\n", world.rank(), seconds,
              failed.ToString().c_str());
  EXPECT_FALSE((*engine)->Step().ok());  // and from then on
  if (world.rank() == 0) {
    EngineRequest r;
    r.prompt = {1, 2};
    EXPECT_EQ((*engine)->Submit(r).status().code(), absl::StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace dt::nn::testing
