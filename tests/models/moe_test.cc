// The mixture-of-experts families (Note [MoE blocks] in nn/models/decoder_family.h) against
// transformers: Mixtral and Qwen3-MoE tiny checkpoints (tools/reference/make_moe_fixtures.py),
// stored one tensor per expert as the Hub stores them and fused on load, at tp 1, 2 and 4 on
// threads: greedy tokens identical to transformers', logits within 1e-4 of their scale, each rank
// reading only its pieces of every expert; the plan's placements and its refusals.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/safetensors_writer.h"
#include "dtensor/mesh/comm_counter.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/init.h"
#include "dtensor/nn/models/causal_lm.h"
#include "dtensor/nn/moe.h"
#include "dtensor/nn/save.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/models/golden_checks.h"
#include "dtensor/tests/test_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace dt::nn::testing {
namespace {

using dt::testing::Contains;

std::string MoeFixture(const std::string& name) { return "moe/" + name + "-tiny"; }
std::string MoeDir(const std::string& name) { return FixtureDir(MoeFixture(name)); }

struct TpCase {
  const char* model;
  int tp;
};

class MoeTp : public ::testing::TestWithParam<TpCase> {};

TEST_P(MoeTp, MatchesTransformersAndReadsOnlyItsShards) {
  const TpCase c = GetParam();
  const Golden g = LoadGolden(MoeFixture(c.model));
  absl::Status s = World::RunThreads(c.tp, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {c.tp}, {"tp"}));
    LoadReport report;
    DT_ASSIGN_OR_RETURN(auto m, CausalLM::FromPretrained(MoeDir(c.model), mesh, {}, &report));
    DT_RETURN_IF_ERROR(MatchesGolden(*m, g, w.rank()));
    DT_RETURN_IF_ERROR(ReadsOnlyItsPieces(report, c.tp > 1));
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << c.model << " tp=" << c.tp << ": " << s;
}

INSTANTIATE_TEST_SUITE_P(Models, MoeTp,
                         ::testing::Values(TpCase{"mixtral", 1}, TpCase{"mixtral", 2},
                                           TpCase{"mixtral", 4}, TpCase{"qwen3_moe", 1},
                                           TpCase{"qwen3_moe", 2}, TpCase{"qwen3_moe", 4},
                                           TpCase{"deepseek_v2", 1}, TpCase{"deepseek_v2", 2},
                                           TpCase{"deepseek_v2", 4},
                                           TpCase{"deepseek_v2_lite", 1},
                                           TpCase{"deepseek_v2_lite", 2},
                                           TpCase{"deepseek_v2_lite", 4},
                                           TpCase{"minicpm5_moe", 1},
                                           TpCase{"minicpm5_moe", 2},
                                           TpCase{"minicpm5_moe", 4},
                                           TpCase{"minicpm5_moe", 8},
                                           // 2 KV heads: Note [KV heads past tp]
                                           TpCase{"mixtral_kv2", 2}, TpCase{"mixtral_kv2", 4},
                                           TpCase{"qwen3_moe_kv2", 4},
                                           // Note [gpt-oss experts]; 2 KV heads at tp 4
                                           TpCase{"gpt_oss", 1}, TpCase{"gpt_oss", 2},
                                           TpCase{"gpt_oss", 4}),
                         [](const auto& info) {
                           return absl::StrCat(info.param.model, "_tp", info.param.tp);
                         });

// Expert parallelism (nn/expert_parallel.h), both layouts (Note [Expert-parallel layouts] in
// nn/distributed.h): ep over the ranks tp splits the dense layers on (tp 0 below), each rank E / ep
// whole experts; or an (ep, tp) mesh, each rank's experts split over tp too. Tokens dispatched with
// all_to_all, or the ep_router plan.
struct EpCase {
  const char* model;
  int ep, tp;       // tp 0: ep and tp share the ep ranks
  bool all_reduce;  // the ep_router plan instead of ep_dispatch_experts
  // The ranks, and the pieces of each expert tensor (the experts split over every rank).
  int ranks() const { return tp == 0 ? ep : ep * tp; }
};

// `dir` (c.model's checkpoint) loaded on c.ranks() thread ranks laid out as `c` says: every rank
// computes transformers' logits and tokens and reads only its pieces; `more` checks its report.
absl::Status LoadsAsTransformers(
    const EpCase& c, const std::string& dir,
    const std::function<absl::Status(World&, const LoadReport&)>& more = nullptr) {
  const Golden g = LoadGolden(MoeFixture(c.model));
  return World::RunThreads(c.ranks(), [&](World& w) -> absl::Status {
    DistributedConfig dist;
    dist.ep_size = c.ep;
    dist.tp_size = c.tp;
    if (c.all_reduce) dist.ep_plan = std::string("all_reduce");
    LoadReport report;
    DT_ASSIGN_OR_RETURN(auto m,
                        CausalLM::FromPretrained(dir, w.shared_from_this(), dist, {}, &report));
    DT_RETURN_IF_ERROR(MatchesGolden(*m, g, w.rank()));
    DT_RETURN_IF_ERROR(ReadsOnlyItsPieces(report, c.ranks() > 1));
    return more ? more(w, report) : absl::OkStatus();
  });
}

class MoeEp : public ::testing::TestWithParam<EpCase> {};

TEST_P(MoeEp, MatchesTransformersAndReadsOnlyItsExperts) {
  const EpCase c = GetParam();
  const auto its_experts_only = [&](World& w, const LoadReport& report) -> absl::Status {
    // Its experts only: each expert tensor's piece is its share of it, and the rank read its
    // pieces and nothing more (within 1%). gpt-oss's down_proj_bias is whole over tp (Note
    // [gpt-oss experts] in nn/moe.h), split by ep only.
    int64_t share = 0;
    for (const LoadReport::Param& p : report.params) {
      const int pieces = absl::EndsWith(p.name, "down_proj_bias") ? c.ep : c.ranks();
      if (absl::StrContains(p.name, ".mlp.experts.")) {
        if (p.local_bytes * pieces != p.full_bytes) {
          return absl::InternalError(absl::StrCat(p.name, " (", p.spec, "): holds ", p.local_bytes,
                                                  " bytes of ", p.full_bytes));
        }
      }
      share += p.local_bytes;
    }
    if (report.stats.bytes_read() > share + share / 100) {
      return absl::InternalError(absl::StrCat("rank ", w.rank(), " read ",
                                              report.stats.bytes_read(), " bytes for a share of ",
                                              share));
    }
    return absl::OkStatus();
  };
  absl::Status s = LoadsAsTransformers(c, MoeDir(c.model), its_experts_only);
  ASSERT_TRUE(s.ok()) << c.model << " ep=" << c.ep << " tp=" << c.tp << ": " << s;
}

INSTANTIATE_TEST_SUITE_P(
    Models, MoeEp,
    ::testing::Values(EpCase{"mixtral", 2, 0, false}, EpCase{"mixtral", 4, 0, false},
                      EpCase{"mixtral", 2, 1, false}, EpCase{"mixtral", 2, 2, false},
                      EpCase{"mixtral", 2, 0, true}, EpCase{"mixtral", 2, 2, true},
                      EpCase{"qwen3_moe", 2, 0, false}, EpCase{"qwen3_moe", 4, 0, false},
                      EpCase{"qwen3_moe", 2, 2, false}, EpCase{"qwen3_moe", 4, 0, true},
                      EpCase{"deepseek_v2", 2, 0, false}, EpCase{"deepseek_v2", 4, 0, false},
                      EpCase{"deepseek_v2", 4, 1, false}, EpCase{"deepseek_v2", 2, 2, false},
                      EpCase{"deepseek_v2", 2, 2, true}, EpCase{"deepseek_v2_lite", 2, 0, false},
                      EpCase{"deepseek_v2_lite", 4, 0, false},
                      EpCase{"minicpm5_moe", 2, 0, false}, EpCase{"minicpm5_moe", 4, 0, false},
                      EpCase{"minicpm5_moe", 2, 2, false}, EpCase{"minicpm5_moe", 4, 0, true},
                      // 2 KV heads on the 4 ranks ep shares with tp (Note [KV heads past tp])
                      EpCase{"mixtral_kv2", 4, 0, false}, EpCase{"qwen3_moe_kv2", 4, 0, false},
                      EpCase{"qwen3_moe_kv2", 4, 0, true}, EpCase{"mixtral_kv2", 2, 2, false},
                      // gpt-oss: the experts' biases with them (transformers' ep plan)
                      EpCase{"gpt_oss", 2, 0, false}, EpCase{"gpt_oss", 4, 0, false},
                      EpCase{"gpt_oss", 2, 2, false}, EpCase{"gpt_oss", 2, 0, true},
                      EpCase{"gpt_oss", 2, 2, true}),
    [](const auto& info) {
      return absl::StrCat(info.param.model, "_ep", info.param.ep,
                          info.param.tp == 0 ? "_shared" : absl::StrCat("_x_tp", info.param.tp),
                          info.param.all_reduce ? "_all_reduce" : "");
    });

// The collectives of one sparse layer, per rank: dispatch two all_to_alls (rows out, results
// back) and two all_gathers (the counts, the token chunks); fewer tokens than ep ranks one
// all_reduce over ep instead (Note [Fewer tokens than ranks]); on (ep, tp) with tp > 1 the experts'
// all_reduce over tp; the ep_router plan one all_reduce over ep for any batch (tp 0: ep and tp
// share the ranks).
TEST(MoeEpCollectives, PerSparseLayer) {
  struct Case {
    int ep, tp;
    bool all_reduce;
    int64_t tokens;
    const char* want;
  };
  for (const Case& c : std::vector<Case>{{2, 0, false, 5, "all_gather=2 all_to_all=2"},
                                         {2, 0, false, 2, "all_gather=2 all_to_all=2"},
                                         {2, 0, false, 1, "all_reduce=1"},
                                         {4, 0, false, 4, "all_gather=2 all_to_all=2"},
                                         {4, 0, false, 3, "all_reduce=1"},
                                         {2, 2, false, 1, "all_reduce=2"},
                                         {2, 1, false, 5, "all_gather=2 all_to_all=2"},
                                         {2, 2, false, 5, "all_gather=2 all_reduce=1 all_to_all=2"},
                                         {2, 0, true, 5, "all_reduce=1"},
                                         {2, 2, true, 5, "all_reduce=2"}}) {
    const int ranks = c.tp == 0 ? c.ep : c.ep * c.tp;
    absl::Status s = World::RunThreads(ranks, [&](World& w) -> absl::Status {
      DistributedConfig dist;
      dist.ep_size = c.ep;
      dist.tp_size = c.tp;
      if (c.all_reduce) dist.ep_plan = std::string("all_reduce");
      DT_ASSIGN_OR_RETURN(auto m,
                          CausalLM::FromPretrained(MoeDir("mixtral"), w.shared_from_this(), dist));
      Module* layer = m->GetSubmodule("model.layers.0.mlp").value();
      DT_ASSIGN_OR_RETURN(Tensor h, Tensor::Randn({1, c.tokens, 64}, 7));
      CommCounter counter;
      DT_ASSIGN_OR_RETURN(Value y, layer->CallOne({Value(h)}));
      if (counter.counts().ToString() != c.want) {
        return absl::InternalError(absl::StrCat("rank ", w.rank(), ": a sparse layer ran ",
                                                counter.counts().ToString(), ", want ", c.want));
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << "ep=" << c.ep << " tp=" << c.tp << " all_reduce=" << c.all_reduce
                        << " tokens=" << c.tokens << ": " << s;
  }
}

TEST(MoeEpRefusals, BeforeAnyRead) {
  struct Refusal {
    const char* model;
    int world, ep, tp;
    const char* error;
  };
  for (const Refusal& r : std::vector<Refusal>{
           {"mixtral", 3, 3, 1, "Cannot evenly shard 4 experts across 3 expert-parallel ranks"},
           {"mixtral", 8, 2, 4, "ep_size 2 must be a multiple of tp_size 4"},
           {"mixtral", 4, 2, 1, "ep_size 2 x tp_size 1 = 2 ranks, but there are 4"},
           {"qwen3_moe", 3, 2, 0, "ep_size 2 does not divide the 3 ranks"}}) {
    std::vector<double> seconds(r.world, -1);
    absl::Status s = World::RunThreads(r.world, [&](World& w) -> absl::Status {
      DistributedConfig dist;
      dist.ep_size = r.ep;
      dist.tp_size = r.tp;
      LoadReport report;
      report.seconds = -1;
      absl::Status st =
          CausalLM::FromPretrained(MoeDir(r.model), w.shared_from_this(), dist, {}, &report)
              .status();
      seconds[w.rank()] = report.seconds;
      return st;
    });
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << r.error;
    EXPECT_TRUE(Contains(s, r.error)) << s;
    for (double v : seconds) EXPECT_EQ(v, -1) << r.error << ": read weights";
  }
  // A dense family has no experts to split.
  absl::Status dense = World::RunThreads(2, [&](World& w) -> absl::Status {
    DistributedConfig dist;
    dist.ep_size = 2;
    return CausalLM::FromPretrained(FixtureDir("zoo/qwen3-tiny"), w.shared_from_this(), dist)
        .status();
  });
  EXPECT_TRUE(
      Contains(dense, "Qwen3ForCausalLM: ep_size 2 needs experts; qwen3 has no sparse layer"))
      << dense;
}

// The same weights as llama.cpp's converter lays them out (Note [GGUF experts] in
// loaders/gguf_llama.cc: Mixtral as architecture llama with experts and permuted Q/K rows,
// Qwen3-MoE as qwen3moe; experts stacked as ffn_{gate,up,down}_exps) load to transformers' logits
// and tokens, split by tp or by ep as the safetensors are, each rank reading only its experts.
class MoeGguf : public ::testing::TestWithParam<EpCase> {};

TEST_P(MoeGguf, LoadsToTheSameLogits) {
  const EpCase c = GetParam();
  absl::Status s = LoadsAsTransformers(c, FixtureDir(MoeFixture(c.model) + ".gguf"));
  ASSERT_TRUE(s.ok()) << c.model << " ep=" << c.ep << " tp=" << c.tp << ": " << s;
}

INSTANTIATE_TEST_SUITE_P(Models, MoeGguf,
                         ::testing::Values(EpCase{"mixtral", 1, 1, false},
                                           EpCase{"mixtral", 1, 2, false},
                                           EpCase{"mixtral", 2, 0, false},
                                           EpCase{"qwen3_moe", 1, 1, false},
                                           EpCase{"qwen3_moe", 1, 4, false},
                                           EpCase{"qwen3_moe", 2, 2, false}),
                         [](const auto& info) {
                           const EpCase& c = info.param;
                           if (c.ep == 1) return absl::StrCat(c.model, "_tp", c.tp);
                           return absl::StrCat(c.model, "_ep", c.ep,
                                               c.tp == 0 ? "_shared" : absl::StrCat("_x_tp", c.tp));
                         });

TEST(MoeGgufConfig, FamiliesFromTheirArchitectures) {
  const loaders::DecoderConfig mixtral =
      loaders::LoadDecoderConfig(FixtureDir(MoeFixture("mixtral") + ".gguf")).value();
  EXPECT_EQ(mixtral.model_type, "mixtral");  // llama with experts
  EXPECT_EQ(mixtral.num_experts, 4);
  EXPECT_EQ(mixtral.num_experts_per_tok, 2);
  EXPECT_EQ(mixtral.moe_intermediate_size, 64);
  const loaders::DecoderConfig qwen =
      loaders::LoadDecoderConfig(FixtureDir(MoeFixture("qwen3_moe") + ".gguf")).value();
  EXPECT_EQ(qwen.model_type, "qwen3_moe");
  EXPECT_EQ(qwen.moe_intermediate_size, 32);
  EXPECT_EQ(qwen.intermediate_size, 128);
  EXPECT_TRUE(qwen.norm_topk_prob);  // llama.cpp's qwen3moe renormalises
  EXPECT_EQ(qwen.head_dim, 16);
}

TEST(MoeConfig, SparseLayersAsTheFamilySays) {
  const loaders::DecoderConfig mixtral = loaders::LoadDecoderConfig(MoeDir("mixtral")).value();
  EXPECT_EQ(mixtral.num_experts, 4);
  EXPECT_EQ(mixtral.num_experts_per_tok, 2);
  EXPECT_EQ(mixtral.moe_intermediate_size, 64);
  EXPECT_TRUE(mixtral.norm_topk_prob);
  EXPECT_TRUE(mixtral.IsMoeLayer(0) && mixtral.IsMoeLayer(1));
  const loaders::DecoderConfig qwen = loaders::LoadDecoderConfig(MoeDir("qwen3_moe")).value();
  EXPECT_EQ(qwen.num_experts, 8);
  EXPECT_EQ(qwen.moe_intermediate_size, 32);
  EXPECT_TRUE(qwen.norm_topk_prob);
  EXPECT_TRUE(qwen.IsMoeLayer(0) && qwen.IsMoeLayer(1));
  EXPECT_FALSE(qwen.HasDenseLayers());
  // transformers' rule: sparse when (i + 1) % decoder_sparse_step == 0 and i not in mlp_only_layers.
  loaders::DecoderConfig step = qwen;
  step.decoder_sparse_step = 2;
  step.num_hidden_layers = 5;
  step.mlp_only_layers = {3};
  EXPECT_FALSE(step.IsMoeLayer(0));
  EXPECT_TRUE(step.IsMoeLayer(1));
  EXPECT_FALSE(step.IsMoeLayer(2));
  EXPECT_FALSE(step.IsMoeLayer(3));  // mlp_only_layers
  EXPECT_TRUE(step.HasMoeLayers() && step.HasDenseLayers());
  step.mlp_only_layers = {1, 3};
  EXPECT_FALSE(step.HasMoeLayers());
  EXPECT_EQ(loaders::ParseDecoderConfig(loaders::DecoderConfigToJson(step), "again").value(), step);
  // The config written back reads as the same config.
  const loaders::DecoderConfig again =
      loaders::ParseDecoderConfig(loaders::DecoderConfigToJson(qwen), "again").value();
  EXPECT_EQ(again, qwen);
  EXPECT_EQ(loaders::ParseDecoderConfig(loaders::DecoderConfigToJson(mixtral), "again").value(),
            mixtral);
  const loaders::DecoderConfig ds = loaders::LoadDecoderConfig(MoeDir("deepseek_v2")).value();
  EXPECT_EQ(ds.head_dim, 8);  // qk_rope_head_dim: the RoPE tables' size
  EXPECT_EQ(ds.q_lora_rank, 48);
  EXPECT_EQ(ds.kv_lora_rank, 32);
  EXPECT_EQ(ds.n_shared_experts, 1);
  EXPECT_EQ(ds.routed_scaling_factor, 1.5);
  EXPECT_FALSE(ds.IsMoeLayer(0));  // first_k_dense_replace 1
  EXPECT_TRUE(ds.IsMoeLayer(1) && ds.IsMoeLayer(2));
  EXPECT_EQ(loaders::ParseDecoderConfig(loaders::DecoderConfigToJson(ds), "again").value(), ds);
  const loaders::DecoderConfig lite =
      loaders::LoadDecoderConfig(MoeDir("deepseek_v2_lite")).value();
  EXPECT_EQ(lite.q_lora_rank, 0);  // null: a plain q_proj
  EXPECT_EQ(loaders::ParseDecoderConfig(loaders::DecoderConfigToJson(lite), "again").value(), lite);
  const loaders::DecoderConfig mc = loaders::LoadDecoderConfig(MoeDir("minicpm5_moe")).value();
  EXPECT_FALSE(mc.IsMoeLayer(0));  // mlp_layer_types dense, sparse, sparse
  EXPECT_TRUE(mc.IsMoeLayer(1) && mc.IsMoeLayer(2));
  EXPECT_TRUE(mc.HasMoeLayers() && mc.HasDenseLayers());
  EXPECT_EQ(mc.n_group, 2);
  EXPECT_EQ(mc.topk_group, 1);
  EXPECT_TRUE(mc.norm_topk_prob);
  EXPECT_EQ(mc.routed_scaling_factor, 2.5);
  EXPECT_EQ(mc.head_dim, 16);
  EXPECT_EQ(mc.rope_theta, 5e6);
  EXPECT_EQ(loaders::ParseDecoderConfig(loaders::DecoderConfigToJson(mc), "again").value(), mc);
  // Without mlp_layer_types: first_k_dense_replace (transformers' default 1) dense layers.
  const loaders::DecoderConfig bare = loaders::ParseDecoderConfig(R"({"model_type": "minicpm5_moe",
      "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 3,
      "num_attention_heads": 2, "n_routed_experts": 4, "num_experts_per_tok": 2})", "c").value();
  EXPECT_FALSE(bare.IsMoeLayer(0));
  EXPECT_TRUE(bare.IsMoeLayer(1) && bare.IsMoeLayer(2));
  EXPECT_EQ(bare.head_dim, 128);
  EXPECT_EQ(bare.n_shared_experts, 1);
  EXPECT_EQ(bare.routed_scaling_factor, 3.66);
  EXPECT_EQ(loaders::ParseDecoderConfig(loaders::DecoderConfigToJson(bare), "again").value(), bare);
}

// openai/gpt-oss-20b's config.json (transformers 4.55's spelling, its extra keys
// experts_per_token and initial_context_length unread, as transformers leaves them): refused as
// shipped, for its MXFP4 experts; without quantization_config (the bf16 re-releases) read as
// transformers reads it. Its parameters by hand: per layer attention 26,550,144 (q/k/v/o with
// biases, 64 sinks), router 92,192, experts 32 x 24,891,840 (with biases), norms 5,760; x 24,
// plus two 201,088 x 2,880 embeddings and the final norm: 20,914,757,184 ("21B").
TEST(MoeConfig, GptOss20bAsOpenAIShipsIt) {
  std::string layer_types;
  for (int i = 0; i < 24; ++i) {
    absl::StrAppend(&layer_types, i ? ", " : "",
                    i % 2 ? "\"full_attention\"" : "\"sliding_attention\"");
  }
  const std::string fields = absl::StrCat(R"({"architectures": ["GptOssForCausalLM"],
      "attention_bias": true, "attention_dropout": 0.0, "eos_token_id": 200002,
      "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
      "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 2880,
      "layer_types": [)", layer_types, R"(], "max_position_embeddings": 131072,
      "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4,
      "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32,
      "output_router_logits": false, "pad_token_id": 199999, "rms_norm_eps": 1e-05,
      "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
      "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
      "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
      "swiglu_limit": 7.0, "tie_word_embeddings": false, "transformers_version": "4.55.0.dev0",
      "use_cache": true, "vocab_size": 201088)");
  const absl::Status shipped = loaders::ParseDecoderConfig(
      fields + R"(, "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn",
      "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}})",
      "gpt-oss-20b/config.json").status();
  EXPECT_TRUE(Contains(shipped, "\"quantization_config\" with quant_method \"mxfp4\"")) << shipped;
  const loaders::DecoderConfig c = loaders::ParseDecoderConfig(fields + "}", "c").value();
  EXPECT_EQ(c.num_experts, 32);
  EXPECT_EQ(c.num_experts_per_tok, 4);
  EXPECT_EQ(c.moe_intermediate_size, 2880);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.layer_windows[0], 128);
  EXPECT_EQ(c.layer_windows[1], 0);
  EXPECT_EQ(c.rope_scaling.rope_type, "yarn");
  EXPECT_EQ(c.rope_scaling.factor, 32);
  EXPECT_EQ(c.swiglu_limit, 7);
  EXPECT_EQ(c.swiglu_alpha, 1.702);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{200002});
  EXPECT_EQ(NumParameters(c), int64_t{20914757184});
}

// What the families refuse rather than compute differently.
TEST(MoeConfig, RefusesWhatItDoesNotImplement) {
  const std::string ds = R"({"model_type": "deepseek_v2", "vocab_size": 8, "hidden_size": 8,
      "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
      "num_experts_per_tok": 1, "n_routed_experts": 2, "qk_rope_head_dim": 2)";
  EXPECT_TRUE(Contains(loaders::ParseDecoderConfig(ds + R"(, "norm_topk_prob": true})", "c").status(),
                       "\"norm_topk_prob\": true is ambiguous for deepseek_v2"));
  EXPECT_TRUE(Contains(
      loaders::ParseDecoderConfig(ds + R"(, "topk_method": "group_limited_greedy"})", "c").status(),
      "\"topk_method\": \"group_limited_greedy\" is not implemented"));
  EXPECT_TRUE(Contains(
      loaders::ParseDecoderConfig(ds + R"(, "num_key_value_heads": 1})", "c").status(),
      "num_key_value_heads 1 must equal num_attention_heads 2 for latent attention"));
  EXPECT_TRUE(loaders::ParseDecoderConfig(ds + "}", "c").ok());
  const std::string mc = R"({"model_type": "minicpm5_moe", "vocab_size": 8, "hidden_size": 8,
      "intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
      "n_routed_experts": 8, "num_experts_per_tok": 2)";
  EXPECT_TRUE(loaders::ParseDecoderConfig(mc + "}", "c").ok());
  EXPECT_TRUE(Contains(
      loaders::ParseDecoderConfig(mc + R"(, "use_gated_attention": false})", "c").status(),
      "\"use_gated_attention\": false is not a MiniCPM5-MoE checkpoint"));
  EXPECT_TRUE(Contains(
      loaders::ParseDecoderConfig(mc + R"(, "mlp_layer_types": ["dense"]})", "c").status(),
      "\"mlp_layer_types\" must list 2 layer types"));
  EXPECT_TRUE(Contains(
      loaders::ParseDecoderConfig(mc + R"(, "mlp_layer_types": ["dense", "moe"]})", "c").status(),
      "\"mlp_layer_types\" entry \"moe\" is not \"dense\" or \"sparse\""));
  for (const char* groups : {R"("n_group": 3)", R"("n_group": 8)",
                             R"("n_group": 2, "topk_group": 3)"}) {
    EXPECT_TRUE(Contains(loaders::ParseDecoderConfig(mc + ", " + groups + "}", "c").status(),
                         "do not fit 8 experts and num_experts_per_tok 2"))
        << groups;
  }
  // Experts on a family without them are refused, as before.
  EXPECT_TRUE(Contains(loaders::ParseDecoderConfig(R"({"model_type": "qwen3", "vocab_size": 8,
      "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
      "num_attention_heads": 2, "num_experts": 4})", "c").status(),
                       "\"num_experts\": 4 (experts) is not implemented by dtensor's qwen3"));
}

// `model` loaded on `ranks` thread ranks with `dist`: its tp_plan() holds every line of `want` and
// none of `absent`; `check` looks at the model too.
void ExpectPlan(const std::string& model, int ranks, const DistributedConfig& dist,
                const std::vector<std::string>& want, const std::vector<std::string>& absent,
                const std::function<void(CausalLM&)>& check) {
  absl::Status s = World::RunThreads(ranks, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(auto m,
                        CausalLM::FromPretrained(MoeDir(model), w.shared_from_this(), dist));
    const std::string plan = m->tp_plan();
    for (const std::string& line : want) {
      EXPECT_TRUE(absl::StrContains(plan, line)) << line << "\n" << plan;
    }
    for (const std::string& line : absent) EXPECT_FALSE(absl::StrContains(plan, line)) << plan;
    check(*m);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

// Each rank holds matching gate and up rows of every expert (block shards), down_proj by columns,
// the router and the norms whole.
TEST(MoePlan, ExpertsAreBlockShardsAndTheRouterIsReplicated) {
  ExpectPlan("qwen3_moe", 2, {},
             {"model.layers.*.mlp.experts.gate_up_proj -> packed_colwise: "
              "model.layers.*.mlp.experts.gate_up_proj [_S(1,[32,32])] (2)",
              "model.layers.*.mlp.experts.down_proj -> rowwise: "
              "model.layers.*.mlp.experts.down_proj [S(2)] (2)",
              "model.layers.*.mlp.gate.weight"},
             {}, [](CausalLM& m) { EXPECT_EQ(m.type_name(), "Qwen3MoeForCausalLM"); });
}

// qwen3_moe at ep 2 on `ranks` ranks: the expert rules `gate_up` and `down` (after "<param> ->"),
// the attention split by heads, and the style the experts module ends up with.
void ExpectEpPlan(int ranks, const std::string& gate_up, const std::string& down,
                  const std::vector<std::string>& absent, const std::string& experts_style) {
  DistributedConfig dist;
  dist.ep_size = 2;
  ExpectPlan("qwen3_moe", ranks, dist,
             {"model.layers.*.mlp.experts.gate_up_proj -> " + gate_up,
              "model.layers.*.mlp.experts.down_proj -> " + down,
              "model.layers.*.self_attn.q_proj -> colwise: model.layers.*.self_attn.q_proj.weight "
              "[S(0)] (2)"},
             absent, [&](CausalLM& m) {
               EXPECT_EQ(m.GetSubmodule("model.layers.0.mlp.experts").value()->tp_style(),
                         experts_style);
             });
}

// On (ep, tp) the experts are [S(0), block shards] on the 2-D mesh; the rest stays on tp.
TEST(MoePlan, ExpertParallelPlacements) {
  ExpectEpPlan(4,
               "packed_colwise + grouped_gemm: "
               "model.layers.*.mlp.experts.gate_up_proj [S(0), _S(1,[32,32])] (2)",
               "rowwise + grouped_gemm: model.layers.*.mlp.experts.down_proj [S(0), S(2)] (2)", {},
               "moe_tp_experts + ep_dispatch_experts");
}

// ep and tp on the same ranks: the experts whole, [S(0)] by grouped_gemm alone (its rules replace
// the tensor-parallel ones), the attention split by heads.
TEST(MoePlan, ExpertParallelOnTheTensorParallelRanks) {
  ExpectEpPlan(2, "grouped_gemm: model.layers.*.mlp.experts.gate_up_proj [S(0)] (2)",
               "grouped_gemm: model.layers.*.mlp.experts.down_proj [S(0)] (2)", {"packed_colwise"},
               "ep_dispatch_experts");
}

// DeepSeek's latent attention: heads split by q_b_proj and kv_b_proj, kv_a_proj_with_mqa whole.
TEST(MoePlan, LatentAttentionPlacements) {
  ExpectPlan("deepseek_v2", 2, {},
             {"model.layers.*.self_attn.q_b_proj -> colwise: "
              "model.layers.*.self_attn.q_b_proj.weight [S(0)] (3)",
              "model.layers.*.self_attn.kv_a_proj_with_mqa -> mla_kv_a_proj: "
              "model.layers.*.self_attn.kv_a_proj_with_mqa.weight [R] (3)",
              "model.layers.*.mlp.shared_experts.down_proj -> rowwise: "
              "model.layers.*.mlp.shared_experts.down_proj.weight [S(1)] (2)",
              "model.layers.*.mlp.gate_proj -> colwise: "
              "model.layers.*.mlp.gate_proj.weight [S(0)]"},
             {"self_attn.q_proj"},
             [](CausalLM& m) { EXPECT_EQ(m.type_name(), "DeepseekV2ForCausalLM"); });
}

// MiniCPM5-MoE's 2 KV heads at tp 4 (Note [Unit meshes] in nn/styles.h): k_proj and v_proj
// unit_colwise, [S(0), R] on a (2, 2) view of the tp ranks, so ranks 0 and 1 hold head 0 and ranks
// 2 and 3 head 1; the gated queries colwise, 2 of the 8 heads (with their gates) per rank.
TEST(MoePlan, UnitColwiseKeepsWholeKVHeads) {
  DistributedConfig dist;
  ExpectPlan("minicpm5_moe", 4, dist,
             {"model.layers.*.self_attn.k_proj -> unit_colwise: "
              "model.layers.*.self_attn.k_proj.weight [S(0), R] (3)",
              "model.layers.*.self_attn.v_proj -> unit_colwise: "
              "model.layers.*.self_attn.v_proj.weight [S(0), R] (3)",
              "model.layers.*.self_attn.q_gate_proj -> colwise: "
              "model.layers.*.self_attn.q_gate_proj.weight [S(0)] (3)",
              "model.layers.*.mlp.gate.e_score_correction_bias"},
             {}, [](CausalLM& m) {
               EXPECT_EQ(m.type_name(), "MiniCPM5MoeForCausalLM");
               const Parameter* k =
                   m.GetParameter("model.layers.0.self_attn.k_proj.weight").value();
               EXPECT_EQ(k->spec().mesh().ToString(), "mesh(tp=2, unit_replicate=2)");
               EXPECT_EQ(k->value().ToLocal().shape(), (Shape{16, 64}));
               const int rank = k->spec().mesh().my_rank();
               EXPECT_EQ(k->spec().Offset()[0], rank < 2 ? 0 : 16);
               const Parameter* q =
                   m.GetParameter("model.layers.0.self_attn.q_gate_proj.weight").value();
               EXPECT_EQ(q->value().ToLocal().shape(), (Shape{64, 64}));
             });
}

// gpt-oss at tp 4 (Note [gpt-oss experts] in nn/moe.h): gate_up_proj [E, H, 2I] split along its
// interleaved columns, 8 (gate, up) pairs per rank starting at an even column, its bias alike,
// down_proj along its I rows, down_proj_bias, the router and the sinks whole; the vocab split
// as transformers' plan splits it.
TEST(MoePlan, GptOssExpertsSplitTheirColumnsInPairs) {
  ExpectPlan("gpt_oss", 4, {},
             {"model.layers.*.mlp.experts.gate_up_proj -> rowwise: "
              "model.layers.*.mlp.experts.gate_up_proj [S(2)] (4)",
              "model.layers.*.mlp.experts.gate_up_proj_bias -> rowwise: "
              "model.layers.*.mlp.experts.gate_up_proj_bias [S(1)] (4)",
              "model.layers.*.mlp.experts.down_proj -> colwise: "
              "model.layers.*.mlp.experts.down_proj [S(1)] (4)",
              "model.embed_tokens -> embedding_rowwise: model.embed_tokens.weight [S(0)]",
              "model.layers.*.mlp.router.weight", "model.layers.*.mlp.experts.down_proj_bias",
              "model.layers.*.self_attn.sinks"},
             {}, [](CausalLM& m) {
               EXPECT_EQ(m.type_name(), "GptOssForCausalLM");
               const Parameter* gu =
                   m.GetParameter("model.layers.0.mlp.experts.gate_up_proj").value();
               EXPECT_EQ(gu->value().ToLocal().shape(), (Shape{4, 64, 16}));
               EXPECT_EQ(gu->spec().Offset()[2], 16 * gu->spec().mesh().my_rank());
             });
}

// Note [gpt-oss experts]: the clamped SwiGLU on transformers' own inputs in bf16, f16 and f32
// (tests/fixtures/moe/gpt_oss_glu.json, GptOssExperts._apply_gate): in bf16 and f16 equal value
// for value, so every rounding step is transformers'; in f32 within a few ulps (torch's sigmoid
// is its own vectorized exp, not the C library's). An expert whose gate_up_proj is the identity
// hands each row's interleaved (gate, up) pairs to the GLU unchanged, and its down_proj copies
// the I outputs into the first I of the H columns.
TEST(GptOssExperts, ClampedSwiGLURoundsAsTransformers) {
  std::ifstream in(FixtureDir("moe") + "/gpt_oss_glu.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  const int64_t rows = j["rows"], inter = j["intermediate"], h = 2 * inter;
  for (const auto& [key, dtype] : {std::pair{"bf16", DType::kBF16}, std::pair{"f16", DType::kF16},
                                   std::pair{"f32", DType::kF32}}) {
    const std::vector<double> x_values = j[key]["x"], want = j[key]["y"];
    int64_t clamped = 0;
    for (double v : x_values) clamped += std::abs(v) > j["limit"].get<double>();
    EXPECT_GT(clamped, rows * h / 8) << key << ": the clamps must bite";
    absl::Status s = World::RunThreads(1, [&](World& w) -> absl::Status {
      DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {1}, {"tp"}));
      Experts m(ExpertsOptions{.num_experts = 1,
                               .hidden_size = h,
                               .intermediate_size = inter,
                               .layout = ExpertsLayout::kInterleavedColumns,
                               .swiglu_limit = j["limit"],
                               .swiglu_alpha = j["alpha"],
                               .dtype = dtype});
      DT_RETURN_IF_ERROR(ReplicateModule(m, mesh));
      DT_RETURN_IF_ERROR(LoadFullTensors(
          m, [&](absl::string_view name, const Parameter& p) -> absl::StatusOr<Tensor> {
            std::vector<double> v(Numel(p.shape()), 0.0);  // the biases zero
            if (name == "gate_up_proj") {  // [1, H, 2I], H = 2I
              for (int64_t c = 0; c < h; ++c) v[c * h + c] = 1;
            } else if (name == "down_proj") {  // [1, I, H]
              for (int64_t c = 0; c < inter; ++c) v[c * h + c] = 1;
            }
            DT_ASSIGN_OR_RETURN(Tensor t, Tensor::FromDoubles(p.shape(), v));
            return ops::Cast(t, p.dtype());
          }));
      DT_ASSIGN_OR_RETURN(Tensor x, Tensor::FromDoubles({rows, h}, x_values));
      DT_ASSIGN_OR_RETURN(x, ops::Cast(x, dtype));
      DT_ASSIGN_OR_RETURN(Tensor ids, Tensor::Zeros({rows, 1}, DType::kI64));
      DT_ASSIGN_OR_RETURN(Tensor ones, Tensor::Ones({rows, 1}, DType::kF32));
      DT_ASSIGN_OR_RETURN(Value y, m.CallOne({Value(x), Value(ids), Value(ones)}));
      const std::vector<double> got = PlainLocal(y).local().ToDoubles();
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < h; ++c) {
          const double expected = c < inter ? want[r * inter + c] : 0.0;
          const double ulps = dtype == DType::kF32 ? 4e-7 * std::abs(expected) + 1e-12 : 0.0;
          if (!(std::abs(got[r * h + c] - expected) <= ulps)) {
            return absl::InternalError(absl::StrCat(key, ": row ", r, " column ", c, " is ",
                                                    got[r * h + c], ", transformers gives ",
                                                    expected));
          }
        }
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << s;
  }
}

// The MoE fixture `family` loaded at tp 4 on thread ranks and saved gathered (SaveGathered) into
// a fresh temporary directory, returned; "" (with a test failure) if that failed.
std::string SavedFromTp4(const std::string& family) {
  const std::string out = (std::filesystem::temp_directory_path() /
                           absl::StrCat("dt_", family, "_save_", ::getpid()))
                              .string();
  std::filesystem::remove_all(out);
  const absl::Status s = World::RunThreads(4, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {4}, {"tp"}));
    DT_ASSIGN_OR_RETURN(auto m, CausalLM::FromPretrained(MoeDir(family), mesh));
    return SaveGathered(*m, out, m->save_options());
  });
  EXPECT_TRUE(s.ok()) << s;
  return s.ok() ? out : "";
}

// Saved from tp 4 (KV heads unit_colwise, each held by two ranks, gathered once) under the Hub's
// names (q_gate_proj as self_attn.q_proj, as transformers writes it), the checkpoint reloads at
// tp 2 to transformers' logits and tokens.
TEST(MoeSave, GatedUnitSplitModelSavesTheHubLayout) {
  const std::string out = SavedFromTp4("minicpm5_moe");
  ASSERT_FALSE(out.empty());
  auto saved = loaders::Checkpoint::Open(out);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_TRUE(saved->Info("model.layers.0.self_attn.q_proj.weight").ok());
  EXPECT_FALSE(saved->Info("model.layers.0.self_attn.q_gate_proj.weight").ok());
  EXPECT_TRUE(saved->Info("model.layers.1.mlp.gate.e_score_correction_bias").ok());
  const Golden g = LoadGolden(MoeFixture("minicpm5_moe"));
  absl::Status s = World::RunThreads(2, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {2}, {"tp"}));
    DT_ASSIGN_OR_RETURN(auto m, CausalLM::FromPretrained(out, mesh));
    return MatchesGolden(*m, g, w.rank());
  });
  EXPECT_TRUE(s.ok()) << s;
  std::filesystem::remove_all(out);
}

// gpt-oss saved from tp 4 (gate_up_proj's interleaved columns in four ranges of whole pairs,
// down_proj by rows, down_proj_bias whole) gathers back to the checkpoint's layout: the saved
// file holds the fixture's tensors bit for bit and reloads on one rank to transformers' logits.
TEST(MoeSave, GptOssFromTp4IsTheCheckpoint) {
  const std::string out = SavedFromTp4("gpt_oss");
  ASSERT_FALSE(out.empty());
  auto saved = loaders::Checkpoint::Open(out);
  auto fixture = loaders::Checkpoint::Open(MoeDir("gpt_oss"));
  ASSERT_TRUE(saved.ok() && fixture.ok()) << saved.status() << fixture.status();
  EXPECT_EQ(saved->names().size(), fixture->names().size());
  for (const std::string& name : fixture->names()) {
    auto a = saved->Read(name);
    ASSERT_TRUE(a.ok()) << name << ": " << a.status();
    EXPECT_EQ(a->ToDoubles(), fixture->Read(name)->ToDoubles()) << name;
  }
  absl::Status s = World::RunThreads(1, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {1}, {"tp"}));
    DT_ASSIGN_OR_RETURN(auto m, CausalLM::FromPretrained(out, mesh));
    return MatchesGolden(*m, LoadGolden(MoeFixture("gpt_oss")), w.rank());
  });
  EXPECT_TRUE(s.ok()) << s;
  std::filesystem::remove_all(out);
}

// One all_reduce per sparse layer at tp > 1: the experts' partial sums, reduced once.
TEST(MoeCollectives, OneAllReducePerSparseLayer) {
  const Golden g = LoadGolden(MoeFixture("mixtral"));
  absl::Status s = World::RunThreads(2, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {2}, {"tp"}));
    DT_ASSIGN_OR_RETURN(auto m, CausalLM::FromPretrained(MoeDir("mixtral"), mesh));
    Module* layer = m->GetSubmodule("model.layers.0.mlp").value();
    DT_ASSIGN_OR_RETURN(Tensor h, Tensor::Randn({1, 5, 64}, 7));
    CommCounter counter;
    DT_ASSIGN_OR_RETURN(Value y, layer->CallOne({Value(h)}));
    if (counter.counts().ToString() != "all_reduce=1") {
      return absl::InternalError(absl::StrCat("a sparse layer ran ", counter.counts().ToString()));
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

// The MoE fixture `family` loaded on tp thread ranks with its experts planned gate_up_proj
// `gate_up_style`, down_proj rowwise, over tp: the load's status, or an error of its own if any
// weight was read (a refusal must come before the reads).
absl::Status LoadWithExpertPlan(const std::string& family, int tp, const std::string& gate_up_style) {
  return World::RunThreads(tp, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {tp}, {"tp"}));
    CausalLMLoadOptions o;
    o.plan = ParallelPlan{{"model.layers.*.mlp.experts.gate_up_proj", gate_up_style},
                          {"model.layers.*.mlp.experts.down_proj", "rowwise"},
                          {"model.layers.*.mlp.experts", "moe_tp_experts"}};
    LoadReport report;
    report.seconds = -1;
    absl::Status st = CausalLM::FromPretrained(MoeDir(family), mesh, o, &report).status();
    if (report.seconds != -1) return absl::InternalError("weights were read");
    return st;
  });
}

// A tp the experts' intermediate size (or the heads) does not allow is refused before any read.
TEST(MoeRefusals, TpThatTheExpertsDoNotAllow) {
  const absl::Status s = LoadWithExpertPlan("mixtral", 3, "packed_colwise");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "Experts 'model.layers.0.mlp.experts': tensor parallel size 3 does not divide "
                       "intermediate_size 64 (gate_up_proj, down_proj sharded)")) << s;
}

// gpt-oss as OpenAI ships it (experts in MXFP4) is refused by name: its config's
// quantization_config, and, without it, the checkpoint's _blocks / _scales tensors.
TEST(MoeRefusals, GptOssInMxfp4) {
  const std::string bare = R"({"model_type": "gpt_oss", "vocab_size": 8, "hidden_size": 8,
      "intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2)";
  absl::Status config = loaders::ParseDecoderConfig(
      bare + R"(, "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn",
      "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}})",
      "gpt-oss-20b/config.json").status();
  EXPECT_EQ(config.code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(Contains(config, "gpt-oss-20b/config.json")) << config;
  EXPECT_TRUE(Contains(config, "\"quantization_config\" with quant_method \"mxfp4\"")) << config;
  const std::string dir = ::testing::TempDir() + "/gpt_oss_mxfp4";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(MoeDir("gpt_oss") + "/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  auto fixture = loaders::Checkpoint::Open(MoeDir("gpt_oss"));
  ASSERT_TRUE(fixture.ok()) << fixture.status();
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& name : fixture->names()) {
    const bool expert = absl::StrContains(name, "mlp.experts.") && !absl::EndsWith(name, "bias");
    if (!expert) {
      tensors.emplace_back(name, fixture->Read(name).value());
      continue;
    }
    // MXFP4's layout: 16 bytes of 32 4-bit values per block, one u8 scale per block.
    tensors.emplace_back(name + "_blocks", Tensor::Zeros({4, 64, 1, 16}, DType::kU8).value());
    tensors.emplace_back(name + "_scales", Tensor::Zeros({4, 64, 1}, DType::kU8).value());
  }
  ASSERT_TRUE(loaders::WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  absl::Status s = World::RunThreads(1, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {1}, {"tp"}));
    return CausalLM::FromPretrained(dir, mesh).status();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_TRUE(Contains(s, "stores layer 0's experts in MXFP4")) << s;
  EXPECT_TRUE(Contains(s, dir)) << s;
}

// Mixtral's expert plan on gpt-oss's [E, H, 2I] experts would split the hidden dim: refused
// before any read, naming the placement (Note [gpt-oss experts]).
TEST(MoeRefusals, GptOssExpertsSplitAlongTheWrongDim) {
  const absl::Status s = LoadWithExpertPlan("gpt_oss", 2, "colwise");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Contains(s, "Experts 'model.layers.0.mlp.experts': gate_up_proj is planned S(1) but "
                          "its intermediate dim is 2")) << s;
}

// A config whose experts contradict the checkpoint is refused naming both.
TEST(MoeRefusals, ExpertsMissingFromTheCheckpoint) {
  const std::string dir = ::testing::TempDir() + "/moe_missing";
  std::filesystem::create_directories(dir);
  loaders::DecoderConfig c = loaders::LoadDecoderConfig(MoeDir("mixtral")).value();
  c.num_experts = 5;  // the file has 4
  {
    std::ofstream(dir + "/config.json") << loaders::DecoderConfigToJson(c);
  }
  std::filesystem::copy_file(MoeDir("mixtral") + "/model.safetensors", dir + "/model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  absl::Status s = World::RunThreads(1, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {1}, {"tp"}));
    return CausalLM::FromPretrained(dir, mesh).status();
  });
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s, "block_sparse_moe.experts.4.w1.weight")) << s;
}

}  // namespace
}  // namespace dt::nn::testing
