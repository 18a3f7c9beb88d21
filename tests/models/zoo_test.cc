// The decoder zoo (nn/models/causal_lm.h) against transformers: Mistral, Qwen2, Qwen3, Phi-3,
// Gemma, OLMo 2, Gemma 2 and Gemma 3 (text) tiny checkpoints (tools/reference/make_zoo_fixtures.py),
// from safetensors and from GGUF, at every tp their heads allow, on
// threads: greedy tokens identical to transformers', logits within 1e-4 of their scale, each rank
// reading only its shards; every tp the heads refuse refused before any read, naming heads and
// tp; the sliding window refused beyond its length.
#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/models/causal_lm.h"
#include "dtensor/tests/models/golden_checks.h"
#include "dtensor/tests/test_util.h"
#include "gtest/gtest.h"

namespace dt::nn::testing {
namespace {

using dt::testing::Contains;

std::string ZooDir(const std::string& family) { return FixtureDir("zoo/" + family + "-tiny"); }

struct ZooCase {
  const char* family;
  int tp;
  bool replicate_kv;  // tp exceeds (or does not divide) the KV heads
};

class Zoo : public ::testing::TestWithParam<ZooCase> {};

TEST_P(Zoo, MatchesTransformersAndReadsOnlyItsShards) {
  const ZooCase c = GetParam();
  const Golden g = LoadGolden(std::string("zoo/") + c.family + "-tiny");
  CausalLMLoadOptions o;
  o.replicate_kv = c.replicate_kv;
  absl::Status s = World::RunThreads(c.tp, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {c.tp}, {"tp"}));
    LoadReport report;
    DT_ASSIGN_OR_RETURN(auto m, CausalLM::FromPretrained(ZooDir(c.family), mesh, o, &report));
    DT_RETURN_IF_ERROR(MatchesGolden(*m, g, w.rank()));
    DT_RETURN_IF_ERROR(ReadsOnlyItsPieces(report, c.tp > 1));
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(
    Families, Zoo,
    ::testing::Values(ZooCase{"mistral", 1, false}, ZooCase{"mistral", 2, false},
                      ZooCase{"mistral", 4, true},  // 2 KV heads
                      ZooCase{"mistral", 4, false},  // the default plan: unit_colwise k/v
                      ZooCase{"qwen2", 1, false}, ZooCase{"qwen2", 3, false},
                      ZooCase{"qwen2", 9, true},  // SmolLM2's 9 / 3 heads at tp = 9
                      ZooCase{"qwen2", 9, false},  // the default plan: one KV head per rank
                      ZooCase{"qwen3", 1, false}, ZooCase{"qwen3", 2, false},
                      ZooCase{"qwen3", 4, false}, ZooCase{"phi3", 1, false},
                      ZooCase{"phi3", 2, false}, ZooCase{"phi3", 4, false},
                      ZooCase{"gemma", 1, false},
                      ZooCase{"gemma", 2, true},  // one KV head (multi-query)
                      ZooCase{"gemma", 4, true}, ZooCase{"olmo2", 1, false},
                      // q_norm and k_norm over heads split across the ranks
                      ZooCase{"olmo2", 2, false},
                      ZooCase{"olmo2", 4, true},  // q_norm split 4 ways, k_norm whole
                      ZooCase{"gemma2", 1, false}, ZooCase{"gemma2", 2, false},
                      ZooCase{"gemma2", 4, true}, ZooCase{"gemma3_text", 1, false},
                      ZooCase{"gemma3_text", 2, false}, ZooCase{"gemma3_text", 4, true}),
    [](const auto& info) {
      return absl::StrCat(info.param.family, "_tp", info.param.tp,
                          info.param.replicate_kv ? "_replicated_kv" : "");
    });

// Note [KV heads past tp]: at a tp the KV heads do not divide, the default plan holds each KV
// head whole on the ranks whose query heads use it (vLLM's replication: Mistral's 2 KV heads on
// 4 ranks, KV head h on ranks 2h and 2h + 1), one KV head per rank, and the load report says so.
TEST(ZooKVHeads, DefaultPlanReplicatesEachKVHeadOnTheRanksThatUseIt) {
  absl::Status s = World::RunThreads(4, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {4}, {"tp"}));
    LoadReport report;
    DT_ASSIGN_OR_RETURN(auto m, CausalLM::FromPretrained(ZooDir("mistral"), mesh, {}, &report));
    const std::string want =
        "2 KV heads on 4 ranks: k_proj / v_proj unit_colwise, 1 KV head per rank, each held by 2 "
        "ranks";
    if (report.notes.size() != 1 || !absl::StartsWith(report.notes[0], want)) {
      return absl::InternalError(absl::StrCat("notes: [", absl::StrJoin(report.notes, "; "), "]"));
    }
    for (const char* name : {"model.layers.0.self_attn.k_proj.weight",
                             "model.layers.1.self_attn.v_proj.weight"}) {
      DT_ASSIGN_OR_RETURN(Parameter * p, m->GetParameter(name));
      const int64_t head_dim = m->config().head_dim;
      const Shape local = p->spec().LocalShape();
      if (local[0] != head_dim || p->spec().Offset()[0] != w.rank() / 2 * head_dim) {
        return absl::InternalError(absl::StrCat("rank ", w.rank(), ": ", name, " holds rows ",
                                                p->spec().Offset()[0], " + ", local[0]));
      }
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

// The same weights as llama.cpp lays them out (make_zoo_fixtures.py writes them with the gguf
// package: Mistral as architecture llama with permuted Q/K rows, Phi-3's fused projections and
// longrope factors; Gemma, OLMo 2, Gemma 2 and 3 with llama.cpp's own convert_hf_to_gguf.py,
// whose files llama.cpp itself computes the goldens from) load to transformers' logits and
// tokens, sharded as the safetensors are. `golden`: the checkpoint the GGUF was converted from
// when it is not the family's fixture (zoo/<family>-gguf-tiny, a variant whose config the GGUF
// says in full: Note [GGUF Gemma] in loaders/gguf_llama.cc; OLMo 2's without attention biases).
struct ZooGgufCase {
  const char* family;
  int tp;
  bool replicate_kv = false;
  const char* golden = nullptr;  // nullptr: zoo/<family>-tiny
};

class ZooGguf : public ::testing::TestWithParam<ZooGgufCase> {};

TEST_P(ZooGguf, LoadsToTheSameLogits) {
  const ZooGgufCase c = GetParam();
  const Golden g = LoadGolden(c.golden != nullptr ? std::string(c.golden)
                                                  : std::string("zoo/") + c.family + "-tiny");
  CausalLMLoadOptions o;
  o.replicate_kv = c.replicate_kv;
  absl::Status s = World::RunThreads(c.tp, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {c.tp}, {"tp"}));
    LoadReport report;
    DT_ASSIGN_OR_RETURN(auto m, CausalLM::FromPretrained(ZooDir(c.family) + ".gguf", mesh, o,
                                                         &report));
    DT_ASSIGN_OR_RETURN(Tensor logits, PromptLogits(*m, g.prompt));
    const double diff = MaxAbsDiff(logits, g.f32.prompt_logits);
    if (diff > Tolerance(g.f32.prompt_logits)) {
      return absl::InternalError(absl::StrCat("GGUF logits differ from transformers' by ", diff));
    }
    GenerateOptions go;
    go.max_new_tokens = static_cast<int64_t>(g.f32.greedy_tokens.size());
    DT_ASSIGN_OR_RETURN(GenerateResult r, m->Generate(g.prompt, go));
    if (r.tokens != g.f32.greedy_tokens) return absl::InternalError("GGUF greedy tokens differ");
    for (const LoadReport::Param& p : report.params) {
      if (c.tp > 1 && p.sharded && p.read_bytes >= p.full_bytes) {
        return absl::InternalError(absl::StrCat(p.name, " was read whole"));
      }
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << c.family << " tp=" << c.tp << ": " << s;
}

constexpr const char* kOlmo2Variant = "zoo/olmo2-gguf-tiny";
constexpr const char* kGemma2Variant = "zoo/gemma2-gguf-tiny";
constexpr const char* kGemma3Variant = "zoo/gemma3_text-gguf-tiny";

INSTANTIATE_TEST_SUITE_P(
    Families, ZooGguf,
    ::testing::Values(ZooGgufCase{"mistral", 1}, ZooGgufCase{"mistral", 2},
                      ZooGgufCase{"qwen2", 1}, ZooGgufCase{"qwen2", 3}, ZooGgufCase{"qwen3", 1},
                      ZooGgufCase{"qwen3", 4}, ZooGgufCase{"phi3", 1}, ZooGgufCase{"phi3", 2},
                      // norms stored as 1 + w; one KV head
                      ZooGgufCase{"gemma", 1}, ZooGgufCase{"gemma", 2, true},
                      ZooGgufCase{"gemma", 4, true},
                      // post-norms, q/k norms over the whole projection
                      ZooGgufCase{"olmo2", 1, false, kOlmo2Variant},
                      ZooGgufCase{"olmo2", 2, false, kOlmo2Variant},
                      ZooGgufCase{"olmo2", 4, true, kOlmo2Variant},
                      // soft-caps and the window from the metadata, pre- and post-norms
                      ZooGgufCase{"gemma2", 1, false, kGemma2Variant},
                      ZooGgufCase{"gemma2", 2, false, kGemma2Variant},
                      ZooGgufCase{"gemma2", 4, true, kGemma2Variant},
                      // llama.cpp's default pattern, rope.freq_base_swa, linear scaling
                      ZooGgufCase{"gemma3_text", 1, false, kGemma3Variant},
                      ZooGgufCase{"gemma3_text", 2, false, kGemma3Variant},
                      ZooGgufCase{"gemma3_text", 4, true, kGemma3Variant}),
    [](const auto& info) {
      return absl::StrCat(info.param.family, "_tp", info.param.tp,
                          info.param.replicate_kv ? "_replicated_kv" : "");
    });

TEST(ZooGgufConfig, FamiliesFromTheirArchitectures) {
  auto config = [](const std::string& family) {
    return loaders::LoadDecoderConfig(ZooDir(family) + ".gguf").value();
  };
  EXPECT_EQ(config("mistral").model_type, "llama");  // llama.cpp writes Mistral as llama
  EXPECT_EQ(config("qwen2").model_type, "qwen2");
  EXPECT_TRUE(config("qwen2").qkv_bias());
  EXPECT_TRUE(config("qwen2").tie_word_embeddings);
  EXPECT_EQ(config("qwen3").head_dim, 16);
  const loaders::DecoderConfig phi = config("phi3");
  const loaders::DecoderConfig st = loaders::LoadDecoderConfig(ZooDir("phi3")).value();
  EXPECT_EQ(phi.rope_scaling.rope_type, "longrope");
  EXPECT_EQ(phi.rope_scaling.original_max_position_embeddings, 24);
  ASSERT_EQ(phi.rope_scaling.long_factor.size(), st.rope_scaling.long_factor.size());
  for (size_t i = 0; i < st.rope_scaling.long_factor.size(); ++i) {
    EXPECT_FLOAT_EQ(phi.rope_scaling.long_factor[i], st.rope_scaling.long_factor[i]);
    EXPECT_FLOAT_EQ(phi.rope_scaling.short_factor[i], st.rope_scaling.short_factor[i]);
  }
}

// What llama.cpp's converter wrote for the Gemmas and OLMo 2 reads back as the config.json it
// converted (Note [GGUF Gemma]), but for what a GGUF holds otherwise: eps as f32, the special
// tokens from the vocabulary (the converter adds CodeGemma's end of turn, id 107, to every
// Gemma 1).
TEST(ZooGgufConfig, ConvertedFilesSayTheirConfigJson) {
  for (auto [family, json_dir] : std::vector<std::pair<std::string, std::string>>{
           {"gemma", ZooDir("gemma")},
           {"olmo2", FixtureDir(kOlmo2Variant)},
           {"gemma2", FixtureDir(kGemma2Variant)},
           {"gemma3_text", FixtureDir(kGemma3Variant)}}) {
    SCOPED_TRACE(family);
    absl::StatusOr<loaders::DecoderConfig> gguf = loaders::LoadDecoderConfig(ZooDir(family) + ".gguf");
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    loaders::DecoderConfig want = loaders::LoadDecoderConfig(json_dir).value();
    EXPECT_NEAR(gguf->rms_norm_eps, want.rms_norm_eps, 1e-12);
    want.rms_norm_eps = gguf->rms_norm_eps;
    const std::vector<int64_t> eos = family == "gemma" ? std::vector<int64_t>{2, 107}
                                                       : std::vector<int64_t>{2};
    EXPECT_EQ(gguf->eos_token_ids, eos);
    want.eos_token_ids = gguf->eos_token_ids;
    want.bos_token_id = gguf->bos_token_id;
    // Linear scaling uses no original context (the JSON reader keeps the config's length there).
    want.rope_scaling.original_max_position_embeddings =
        gguf->rope_scaling.original_max_position_embeddings;
    EXPECT_EQ(*gguf, want) << gguf->Summary();
  }
  const loaders::DecoderConfig g3 = loaders::LoadDecoderConfig(ZooDir("gemma3_text") + ".gguf").value();
  EXPECT_EQ(g3.layer_windows, (std::vector<int64_t>{5, 5, 5, 5, 5, 0}));
  EXPECT_EQ(g3.local_rope_theta, 10000);
  EXPECT_EQ(g3.rope_scaling.rope_type, "linear");
  EXPECT_EQ(g3.query_pre_attn_scalar, 16);
  const loaders::DecoderConfig g2 = loaders::LoadDecoderConfig(ZooDir("gemma2") + ".gguf").value();
  EXPECT_EQ(g2.layer_windows, (std::vector<int64_t>{6, 0, 6}));
  EXPECT_EQ(g2.attn_logit_softcapping, 5);
  EXPECT_EQ(g2.final_logit_softcapping, 8);
}

// Every tp the heads refuse is refused before any weight is read, naming the heads and the tp.
TEST(ZooRefusals, TpThatHeadsDoNotAllowBeforeAnyRead) {
  struct Refusal {
    const char* family;
    int tp;
    const char* error;
  };
  for (const Refusal& r : std::vector<Refusal>{
           {"qwen2", 2, "tensor parallel size 2 does not divide num_heads 9"},
           {"qwen2", 4, "tensor parallel size 4 does not divide num_heads 9"},
           {"qwen3", 3, "tensor parallel size 3 does not divide num_heads 8"},
           {"phi3", 3, "tensor parallel size 3 does not divide num_heads 8"},
           {"phi3", 8, "tensor parallel size 8 does not divide num_kv_heads 4 (qkv_proj.weight"},
           {"olmo2", 3, "tensor parallel size 3 does not divide num_heads 4"},
           {"gemma2", 3, "tensor parallel size 3 does not divide num_heads 4"},
           {"gemma3_text", 3, "tensor parallel size 3 does not divide num_heads 4"}}) {
    std::vector<double> seconds(r.tp, -1);  // LoadCheckpoint resets the report when it starts
    absl::Status s = World::RunThreads(r.tp, [&](World& w) -> absl::Status {
      DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {r.tp}, {"tp"}));
      LoadReport report;
      report.seconds = -1;
      absl::Status st = CausalLM::FromPretrained(ZooDir(r.family), mesh, {}, &report).status();
      seconds[w.rank()] = report.seconds;
      return st;
    });
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << r.family << " tp=" << r.tp;
    EXPECT_TRUE(Contains(s, r.error)) << r.family << " tp=" << r.tp;
    for (double v : seconds) EXPECT_EQ(v, -1) << r.family << " tp=" << r.tp << ": read weights";
  }
  // transformers' plan (k_proj / v_proj colwise) given by hand is refused where the KV heads do
  // not divide, saying how to run it.
  absl::Status kv = World::RunThreads(9, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {9}, {"tp"}));
    DT_ASSIGN_OR_RETURN(loaders::DecoderConfig config, loaders::LoadDecoderConfig(ZooDir("qwen2")));
    CausalLMLoadOptions o;
    o.plan = CausalLM::TPPlan(config);
    return CausalLM::FromPretrained(ZooDir("qwen2"), mesh, o).status();
  });
  EXPECT_TRUE(Contains(kv, "tensor parallel size 9 does not divide num_kv_heads 3")) << kv;
  EXPECT_TRUE(Contains(kv, "a plan that replicates k_proj and v_proj, or splits them unit_colwise (whole heads on every rank), runs it"));
}

// NumParameters (nn/models/decoder_family.h) counts what transformers saved for every family's
// norms, q/k norms and tying.
TEST(ZooParameters, NumParametersCountsTheCheckpoint) {
  for (const char* family : {"mistral", "qwen2", "qwen3", "phi3", "gemma", "olmo2", "gemma2",
                             "gemma3_text"}) {
    const loaders::Checkpoint ck = loaders::Checkpoint::Open(ZooDir(family)).value();
    int64_t saved = 0;
    for (const std::string& name : ck.names()) saved += Numel(ck.Info(name).value()->shape);
    EXPECT_EQ(NumParameters(loaders::LoadDecoderConfig(ZooDir(family)).value()), saved) << family;
  }
}

// Note [Sliding windows]: Mistral's window is 48 here; within it attention is full (the tests
// above), beyond it the model refuses.
TEST(ZooSlidingWindow, ALongerSequenceIsRefused) {
  const Golden g = LoadGolden("zoo/mistral-tiny");
  absl::Status s = World::RunThreads(1, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {1}, {"tp"}));
    DT_ASSIGN_OR_RETURN(auto m, CausalLM::FromPretrained(ZooDir("mistral"), mesh));
    EXPECT_EQ(m->config().sliding_window, 48);
    GenerateOptions go;
    go.max_new_tokens = 39;  // 10 prompt + 38 fed back = 48 positions: the whole window
    DT_RETURN_IF_ERROR(m->Generate(g.prompt, go).status());
    go.max_new_tokens = 40;
    absl::Status over = m->Generate(g.prompt, go).status();
    EXPECT_EQ(over.code(), absl::StatusCode::kUnimplemented);
    EXPECT_TRUE(Contains(over, "positions up to 49 (48 cached + 1 new) exceed the config's "
                               "sliding_window 48"));
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

// transformers' own Phi-3 plan (gather the fused outputs, split them again) computes the same.
TEST(ZooPlans, TransformersPhi3PlanAlsoMatches) {
  const Golden g = LoadGolden("zoo/phi3-tiny");
  absl::Status s = World::RunThreads(2, [&](World& w) -> absl::Status {
    DistributedConfig dist;
    dist.tp_plan = ParallelPlan{
        {"model.layers.*.self_attn.qkv_proj", "colwise_gather_output"},
        {"model.layers.*.self_attn.o_proj", "rowwise_split_input"},
        {"model.layers.*.mlp.gate_up_proj", "colwise_gather_output"},
        {"model.layers.*.mlp.down_proj", "rowwise_split_input"},
        {"lm_head", "colwise_gather_output"}};
    DT_ASSIGN_OR_RETURN(auto m, CausalLM::FromPretrained(ZooDir("phi3"), w.shared_from_this(), dist));
    DT_ASSIGN_OR_RETURN(Tensor logits, PromptLogits(*m, g.prompt));
    EXPECT_LE(MaxAbsDiff(logits, g.f32.prompt_logits), Tolerance(g.f32.prompt_logits));
    // tp_plan() reports the plan applied: plain row shards of the fused weight.
    EXPECT_TRUE(absl::StrContains(m->tp_plan(), "qkv_proj.weight [S(0)]")) << m->tp_plan();
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

TEST(ZooPlans, Phi3DefaultPlanIsBlockShards) {
  absl::Status s = World::RunThreads(2, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {2}, {"tp"}));
    DT_ASSIGN_OR_RETURN(auto m, CausalLM::FromPretrained(ZooDir("phi3"), mesh));
    const std::string plan = m->tp_plan();
    EXPECT_TRUE(absl::StrContains(plan, "model.layers.*.self_attn.qkv_proj -> packed_colwise: "
                                        "model.layers.*.self_attn.qkv_proj.weight "
                                        "[_S(0,[64,32,32])] (2)"))
        << plan;
    EXPECT_TRUE(absl::StrContains(plan, "model.layers.*.mlp.gate_up_proj.weight "
                                        "[_S(0,[96,96])] (2)"))
        << plan;
    EXPECT_EQ(m->type_name(), "Phi3ForCausalLM");
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace dt::nn::testing
