// nn/distributed on Llama: FromPretrained(dir, world or mesh, DistributedConfig), the printed
// plan, loading whole then sharding (identical results to load-time sharding, more bytes read),
// and config sizes checked against the checkpoint before any module is built.
#include "dtensor/nn/distributed.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "dtensor/core/status.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/models/llama.h"
#include "dtensor/tests/models/llama_util.h"
#include "gtest/gtest.h"

namespace dt::nn::testing {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<Tensor> PromptLogits(LlamaForCausalLM& m, const std::vector<int64_t>& prompt) {
  DT_ASSIGN_OR_RETURN(Tensor ids, Tensor::FromVector<int64_t>(
                                      {1, static_cast<int64_t>(prompt.size())}, prompt));
  return m.Logits(ids);
}

TEST(DistributedConfig, WorldAndDerivedTpSize) {
  const Golden g = LoadGolden("llama-tiny");
  absl::Status s = World::RunThreads(4, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(auto m, LlamaForCausalLM::FromPretrained(
                                    FixtureDir("llama-tiny"), w.shared_from_this(), {}));
    DT_ASSIGN_OR_RETURN(Tensor logits, PromptLogits(*m, g.prompt));
    EXPECT_LE(MaxAbsDiff(logits, g.f32.prompt_logits), 1e-4);
    const std::string plan = m->tp_plan();
    EXPECT_TRUE(absl::StrContains(plan, "model.layers.*.self_attn.q_proj -> colwise: "
                                        "model.layers.*.self_attn.q_proj.weight [S(0)] (4)\n"))
        << plan;
    EXPECT_TRUE(absl::StrContains(plan, "model.layers.*.self_attn.o_proj -> rowwise: "
                                        "model.layers.*.self_attn.o_proj.weight [S(1)] (4)\n"))
        << plan;
    EXPECT_TRUE(absl::StrContains(plan, "lm_head -> colwise_gather_output: lm_head.weight [S(0)]\n"))
        << plan;
    EXPECT_TRUE(absl::StrContains(plan, "replicated (no rule): model.embed_tokens.weight")) << plan;
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

TEST(DistributedConfig, TwoDMeshUsesItsTpDim) {
  absl::Status s = World::RunThreads(4, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {2, 2}, {"dp", "tp"}));
    DT_ASSIGN_OR_RETURN(auto m, LlamaForCausalLM::FromPretrained(FixtureDir("llama-tiny"), mesh,
                                                                 DistributedConfig{}));
    EXPECT_EQ(m->NamedParameters()[0].second->spec().mesh().Size(), 2);
    DT_ASSIGN_OR_RETURN(DeviceMesh flat, InitDeviceMesh(w.shared_from_this(), {2, 2}, {"a", "b"}));
    auto bad = LlamaForCausalLM::FromPretrained(FixtureDir("llama-tiny"), flat, DistributedConfig{});
    EXPECT_TRUE(absl::StrContains(bad.status().message(), "has no 'tp' dim")) << bad.status();
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

TEST(DistributedConfig, RefusesAMismatchedTpSizeAndUnknownPlanNames) {
  absl::Status s = World::RunThreads(2, [&](World& w) -> absl::Status {
    auto a = LlamaForCausalLM::FromPretrained(FixtureDir("llama-tiny"), w.shared_from_this(),
                                              DistributedConfig{.tp_size = 4});
    EXPECT_TRUE(absl::StrContains(a.status().message(), "tp_size 4 does not match the world of 2"))
        << a.status();
    auto b = LlamaForCausalLM::FromPretrained(FixtureDir("llama-tiny"), w.shared_from_this(),
                                              DistributedConfig{.tp_plan = std::string("fast")});
    EXPECT_TRUE(absl::StrContains(b.status().message(), "tp_plan 'fast' is not known"))
        << b.status();
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

TEST(DistributedConfig, UserPlanReplacesTheModelsPlan) {
  absl::Status s = World::RunThreads(2, [&](World& w) -> absl::Status {
    DistributedConfig dist;
    dist.tp_plan = ParallelPlan{{"model.layers.*.mlp.gate_proj", "colwise"},
                                {"model.layers.*.mlp.up_proj", "colwise"},
                                {"model.layers.*.mlp.down_proj", "rowwise"}};
    DT_ASSIGN_OR_RETURN(auto m, LlamaForCausalLM::FromPretrained(FixtureDir("llama-tiny"),
                                                                 w.shared_from_this(), dist));
    DT_ASSIGN_OR_RETURN(Parameter * q, m->GetParameter("model.layers.0.self_attn.q_proj.weight"));
    DT_ASSIGN_OR_RETURN(Parameter * up, m->GetParameter("model.layers.0.mlp.up_proj.weight"));
    EXPECT_EQ(PlacementsToString(q->spec().placements()), "[R]");
    EXPECT_EQ(PlacementsToString(up->spec().placements()), "[S(0)]");
    const Golden g = LoadGolden("llama-tiny");
    DT_ASSIGN_OR_RETURN(Tensor logits, PromptLogits(*m, g.prompt));
    EXPECT_LE(MaxAbsDiff(logits, g.f32.prompt_logits), 1e-4);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

// Note [Unmatched keys]: a misspelled key is a warning by default (the layer it meant stays
// replicated), an error before anything is read with DistributedConfig::unmatched_keys.
TEST(DistributedConfig, UnmatchedKeysCanBeAnError) {
  absl::Status s = World::RunThreads(2, [&](World& w) -> absl::Status {
    DistributedConfig dist;
    ParallelPlan plan = LlamaForCausalLM::TPPlan();
    plan.emplace_back("model.layers.*.mlp.gate_prj", "colwise");
    dist.tp_plan = plan;
    dist.unmatched_keys = PlanCheck::kError;
    LoadReport report;
    report.seconds = -1;
    auto m = LlamaForCausalLM::FromPretrained(FixtureDir("llama-tiny"), w.shared_from_this(), dist,
                                              {}, &report);
    EXPECT_TRUE(absl::StrContains(m.status().message(),
                                  "LlamaForCausalLM: The following TP rules were not applied on any "
                                  "of the layers: [model.layers.*.mlp.gate_prj]"))
        << m.status();
    EXPECT_EQ(report.seconds, -1) << "weights were read";
    dist.unmatched_keys = PlanCheck::kWarn;
    return LlamaForCausalLM::FromPretrained(FixtureDir("llama-tiny"), w.shared_from_this(), dist)
        .status();
  });
  ASSERT_TRUE(s.ok()) << s;
}

TEST(ShardLoaded, SameModelAsLoadTimeShardingAfterReadingEverything) {
  const Golden g = LoadGolden("llama-tiny");
  for (int tp : {2, 4}) {
    absl::Status s = World::RunThreads(tp, [&](World& w) -> absl::Status {
      LlamaLoadReport sharded_report, whole_report;
      DT_ASSIGN_OR_RETURN(auto sharded,
                          LlamaForCausalLM::FromPretrained(FixtureDir("llama-tiny"),
                                                           w.shared_from_this(), {}, {},
                                                           &sharded_report));
      LlamaLoadOptions o;
      o.load_whole = true;
      DT_ASSIGN_OR_RETURN(auto whole,
                          LlamaForCausalLM::FromPretrained(FixtureDir("llama-tiny"),
                                                           w.shared_from_this(), {}, o,
                                                           &whole_report));
      for (const auto& [name, p] : sharded->NamedParameters()) {
        DT_ASSIGN_OR_RETURN(Parameter * q, whole->GetParameter(name));
        EXPECT_EQ(p->spec().placements(), q->spec().placements()) << name;
        const Tensor& local = q->value().ToLocal();
        EXPECT_EQ(local.storage().nbytes(), local.nbytes()) << name << ": the full tensor is kept";
      }
      DT_ASSIGN_OR_RETURN(Tensor a, PromptLogits(*sharded, g.prompt));
      DT_ASSIGN_OR_RETURN(Tensor b, PromptLogits(*whole, g.prompt));
      EXPECT_EQ(MaxAbsDiff(b, a.ToVector<float>()), 0.0) << "tp=" << tp;
      // Whole reads every byte; sharded reads its own share plus the replicated parameters.
      EXPECT_EQ(whole_report.stats.bytes_read(), whole_report.full_bytes);
      EXPECT_LT(sharded_report.stats.bytes_read(), whole_report.stats.bytes_read());
      return absl::OkStatus();
    });
    ASSERT_TRUE(s.ok()) << s;
  }
}

// A config whose num_hidden_layers is absurd is refused against the checkpoint at once.
TEST(ConfigAgainstCheckpoint, HugeLayerCountIsRefusedQuickly) {
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("dt_layers_", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy(FixtureDir("llama-tiny") + "/model.safetensors", dir / "model.safetensors");
  std::ifstream in(FixtureDir("llama-tiny") + "/config.json");
  std::string config((std::istreambuf_iterator<char>(in)), {});
  config = absl::StrReplaceAll(config, {{"\"num_hidden_layers\": 4", "\"num_hidden_layers\": 1000000000"}});
  { std::ofstream(dir / "config.json") << config; }
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = World::RunThreads(1, [&](World& w) -> absl::Status {
    return LlamaForCausalLM::FromPretrained(dir.string(), w.shared_from_this(), {}).status();
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_TRUE(absl::StrContains(s.message(), "num_hidden_layers 1000000000 does not match")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "holds 4 model.layers.N blocks")) << s;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dt::nn::testing
