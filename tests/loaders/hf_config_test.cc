// loaders/hf_config: Llama config.json in its v4 and v5 spellings, defaults, every error class, the
// rope frequencies against values computed by transformers (_compute_llama3_parameters); the other
// config classes, and the families read from them (nn/models/decoder_family.h: the parameter
// counts, the two tables, the router's groups).
#include "dtensor/loaders/hf_config.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "dtensor/loaders/small_file.h"
#include "dtensor/nn/models/decoder_family.h"
#include "dtensor/nn/moe.h"
#include "dtensor/tests/test_util.h"

namespace dt::loaders {
namespace {

using dt::testing::Contains;

// Llama-3.1-8B's config.json (v4 spelling).
constexpr char kLlama31[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

TEST(HfConfig, Llama31) {
  auto c = ParseLlamaConfig(kLlama31, "llama31");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rope_scaling.rope_type, "llama3");
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c->dtype, DType::kBF16);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(*c->bos_token_id, 128000);
  EXPECT_EQ(c->rms_norm_eps, 1e-5);
  // Llama-3.1-8B has 8.03B parameters.
  EXPECT_EQ(nn::NumParameters(*c), 8030261248);
}

TEST(HfConfig, V5SpellingAndDefaults) {
  auto c = ParseLlamaConfig(R"({
      "model_type": "llama", "vocab_size": 320, "hidden_size": 64, "intermediate_size": 200,
      "num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 16, "dtype": "bfloat16",
      "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
      "tie_word_embeddings": true, "attention_bias": true})",
                            "v5");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 8);  // defaults to the heads
  EXPECT_EQ(c->head_dim, 16);            // explicit, != hidden / heads
  EXPECT_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rope_scaling.rope_type, "default");
  EXPECT_EQ(c->dtype, DType::kBF16);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_FALSE(c->mlp_bias);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_EQ(c->dtype, DType::kBF16);
  // No dtype at all: f32; legacy "type" key; linear scaling; the class named by architectures.
  auto d = ParseLlamaConfig(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 10,
      "hidden_size": 8, "intermediate_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 2,
      "rope_scaling": {"type": "linear", "factor": 2.0}})",
                            "legacy");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->dtype, DType::kF32);
  EXPECT_EQ(d->rope_scaling.rope_type, "linear");
  EXPECT_EQ(d->head_dim, 4);
  const std::vector<float> inv = ComputeRope(LlamaRopeSpec(*d)).inv_freq;
  EXPECT_FLOAT_EQ(inv[0], 0.5f);
  EXPECT_FLOAT_EQ(inv[1], 0.005f);
}

TEST(HfConfig, Errors) {
  const std::string sizes = R"("vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
                               "num_hidden_layers": 1)";
  const std::string base = R"("model_type": "llama", )" + sizes;
  struct Case {
    std::string json;
    const char* error;
  } cases[] = {
      {"{", "not valid JSON (1 bytes): "},
      {"", "is empty (0 bytes); expected a JSON object"},
      {"{\"a", "not valid JSON (3 bytes): [json.exception.parse_error.101]"},
      // JSON has no infinity, and a number too large for a double is no number (every float
      // field is checked finite and > 0 besides: Reader::PositiveNumber).
      {"{" + base + R"(, "num_attention_heads": 2, "rope_theta": 1e999})",
       "number overflow parsing '1e999'"},
      {"[]", "must be a JSON object"},
      {"{" + base + "}", "missing required field \"num_attention_heads\""},
      {R"({"model_type": "llama", "hidden_size": 8})", "missing required field \"vocab_size\""},
      {"{" + base + R"(, "num_attention_heads": 3})", "hidden_size 8 is not a multiple of"},
      {"{" + base + R"(, "num_attention_heads": 0})", "\"num_attention_heads\" must be a positive"},
      {"{" + base + R"(, "num_attention_heads": "2"})", "must be a positive integer, got \"2\""},
      {"{" + base + R"(, "num_attention_heads": 4, "num_key_value_heads": 3})",
       "num_key_value_heads 3 must divide num_attention_heads 4"},
      {"{" + base + R"(, "num_attention_heads": 2, "head_dim": 3})", "head_dim 3 must be even"},
      {"{" + base + R"(, "num_attention_heads": 2, "rms_norm_eps": -1})",
       "\"rms_norm_eps\" must be a positive number"},
      {"{" + base + R"(, "num_attention_heads": 2, "torch_dtype": "int8"})",
       "torch_dtype \"int8\" is not supported"},
      {"{" + sizes + R"(, "num_attention_heads": 2, "model_type": "gpt_neox"})",
       "model_type \"gpt_neox\" is not supported (supported: llama, mistral, qwen2, qwen3, phi3, "
       "mixtral, qwen3_moe, deepseek_v2, minicpm5_moe, gemma, olmo2, gemma2, gemma3_text, "
       "gpt_oss)"},
      {"{" + base + R"(, "num_attention_heads": 2, "tie_word_embeddings": "yes"})",
       "must be true or false"},
      {"{" + base + R"(, "num_attention_heads": 2, "rope_scaling": {"rope_type": "llama3"}})",
       "needs \"factor\""},
      {"{" + base + R"(, "num_attention_heads": 2, "rope_scaling": {"rope_type": "llama3",
          "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1}})",
       "low_freq_factor 4 must be below high_freq_factor 1"},
      {"{" + base + R"(, "num_attention_heads": 2, "rope_scaling": 5})", "must be an object"},
      // Contradicting fields name both.
      {"{" + base + R"(, "num_attention_heads": 2, "rope_parameters": {"rope_type": "linear", "factor": 2},
          "rope_scaling": {"rope_type": "linear", "factor": 4}})",
       "\"rope_parameters\" {\"factor\":2,\"rope_type\":\"linear\"} and \"rope_scaling\" {\"factor\":4,\"rope_type\":\"linear\"} disagree"},
      {"{" + base + R"(, "num_attention_heads": 2, "rope_theta": 10000,
          "rope_parameters": {"rope_type": "default", "rope_theta": 500000}})",
       "\"rope_theta\" 10000 and \"rope_parameters.rope_theta\" 500000 disagree"},
      {"{" + base + R"(, "num_attention_heads": 2, "rope_scaling": {"rope_type": "dynamic"}})",
       "\"rope_scaling\" of rope_type dynamic needs \"factor\""},
      {"{" + base + R"(, "num_attention_heads": 2, "rope_scaling": {"rope_type": "longrope",
          "short_factor": [1, 1], "long_factor": [1]}})",
       "\"rope_scaling.long_factor\" must be a list of 2 numbers (head_dim / 2), got [1]"},
      {"{" + base + R"(, "num_attention_heads": 2, "rope_scaling": {"rope_type": "yarn", "factor": 4,
          "beta_fast": 1, "beta_slow": 8}})",
       "yarn rope: beta_fast 1 must not be below beta_slow 8"},
      {"{" + base + R"(, "num_attention_heads": 2, "eos_token_id": "x"})", "eos_token_id"},
  };
  for (const Case& c : cases) {
    auto r = ParseLlamaConfig(c.json, "cfg.json");
    EXPECT_TRUE(Contains(r.status(), c.error)) << c.json;
    EXPECT_TRUE(Contains(r.status(), "cfg.json")) << c.json;
  }
  auto mrope = ParseLlamaConfig("{" + base + R"(, "num_attention_heads": 2,
      "rope_scaling": {"rope_type": "mrope", "factor": 4}})",
                                "y");
  EXPECT_EQ(mrope.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(Contains(mrope.status(), "config 'y': rope_type \"mrope\" is not supported"));
  // A parameter the type does not take is refused, not ignored.
  auto extra = ParseLlamaConfig("{" + base + R"(, "num_attention_heads": 2,
      "rope_scaling": {"rope_type": "linear", "factor": 4, "mscale": 1.0}})",
                                "x");
  EXPECT_EQ(extra.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(Contains(extra.status(), "\"rope_scaling.mscale\" is not a parameter of rope_type linear"));
  // The activation is the model's to accept or refuse (nn/models/causal_lm.h ValidateConfig).
  auto gelu = ParseLlamaConfig("{" + base + R"(, "num_attention_heads": 2, "hidden_act": "gelu"})",
                               "g");
  ASSERT_TRUE(gelu.ok()) << gelu.status();
  EXPECT_EQ(gelu->hidden_act, "gelu");
  EXPECT_EQ(LoadLlamaConfig("/nonexistent/dir").status().code(), absl::StatusCode::kNotFound);
}

TEST(HfConfig, Llama3RopeMatchesTransformers) {
  // transformers 5.24 _compute_llama3_parameters for head_dim 8, theta 10000, factor 8,
  // low 1, high 4, original 64: the three bands (kept, smoothed, divided by the factor).
  LlamaConfig c;
  c.hidden_size = 64;
  c.num_attention_heads = 8;
  c.head_dim = 8;
  c.rope_theta = 10000;
  c.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 64};
  const std::vector<float> inv = ComputeRope(LlamaRopeSpec(c)).inv_freq;
  ASSERT_EQ(inv.size(), 4u);
  const float want[] = {1.0f, 0.0130422562f, 0.00125f, 0.000125f};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(inv[i], want[i], 1e-6 * want[i]) << i;
}

TEST(HfConfig, OversizedAndUnreadableFilesAreErrorsNamingThem) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("dt_hf_config_", ::getpid());
  fs::create_directories(dir);
  const std::string file = (dir / "config.json").string();
  {
    // Valid JSON, then whitespace past the 16 MiB limit: read whole, it would parse.
    std::ofstream out(file, std::ios::binary);
    out << kLlama31 << std::string((16 << 20) + 1, ' ');
  }
  absl::StatusOr<LlamaConfig> big = LoadLlamaConfig(dir.string());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(big.status(), absl::StrCat("'", file, "' is larger than 16777216 bytes")));
  absl::StatusOr<std::string> small = ReadSmallFile(file, 4);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(small.status(), "is larger than 4 bytes"));
  // A directory opens but cannot be read (EISDIR).
  absl::StatusOr<std::string> unreadable = ReadSmallFile(dir.string(), 100);
  EXPECT_EQ(unreadable.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(Contains(unreadable.status(), absl::StrCat("cannot read '", dir.string(), "'")));
  EXPECT_TRUE(Contains(LoadLlamaConfig("/nonexistent/config.json").status(),
                       "/nonexistent/config.json"));
  fs::remove_all(dir);
}

TEST(HfConfig, JsonRoundTrip) {
  auto c = ParseLlamaConfig(kLlama31, "llama31").value();
  auto back = ParseLlamaConfig(LlamaConfigToJson(c), "roundtrip");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->Summary(), c.Summary());
  EXPECT_EQ(*back, c);  // every field: Summary() leaves some out
  EXPECT_EQ(back->eos_token_ids, c.eos_token_ids);
  EXPECT_EQ(back->rope_scaling.original_max_position_embeddings, 8192);
}

// ---- the other config classes and their families (nn/models/decoder_family.h) -------------------

constexpr char kSizes[] = R"("vocab_size": 16, "hidden_size": 16, "intermediate_size": 8,
    "num_hidden_layers": 4, "num_attention_heads": 4)";

absl::StatusOr<DecoderConfig> Parse(const std::string& model_type, const std::string& extra) {
  return ParseDecoderConfig(absl::StrCat("{\"model_type\": \"", model_type, "\", ", kSizes,
                                         extra.empty() ? "" : ", ", extra, "}"),
                            model_type + ".json");
}

TEST(DecoderFamilies, DefaultsAndSwitchesFollowEachConfigClass) {
  // transformers' defaults: Mistral's sliding window 4096 (null: none), Qwen3's head_dim 128,
  // Phi-3's eps 1e-5 and max positions 4096.
  DecoderConfig m = Parse("mistral", "").value();
  EXPECT_EQ(m.sliding_window, 4096);
  EXPECT_EQ(m.max_position_embeddings, 131072);
  EXPECT_EQ(m.config_class().architecture, "MistralForCausalLM");
  EXPECT_EQ(Parse("mistral", R"("sliding_window": null)").value().sliding_window, 0);
  DecoderConfig q3 = Parse("qwen3", R"("attention_bias": true)").value();
  EXPECT_EQ(q3.head_dim, 128);
  EXPECT_TRUE(q3.qkv_bias() && q3.o_bias());
  DecoderConfig q2 = Parse("qwen2", R"("attention_bias": true, "mlp_bias": true)").value();
  EXPECT_EQ(q2.head_dim, 4);
  EXPECT_TRUE(q2.qkv_bias());  // always, whatever the config says
  EXPECT_FALSE(q2.o_bias());   // never: Qwen2Config has no attention_bias
  EXPECT_FALSE(q2.mlp_bias);
  DecoderConfig phi = Parse("phi3", "").value();
  EXPECT_EQ(phi.rms_norm_eps, 1e-5);
  EXPECT_EQ(phi.max_position_embeddings, 4096);
  EXPECT_TRUE(nn::FamilyOf(phi).fused_qkv && nn::FamilyOf(phi).fused_gate_up);
  // Phi-3 reads the legacy "su" as longrope (transformers' Phi3Config).
  DecoderConfig su = Parse("phi3", R"("rope_scaling": {"type": "su", "short_factor": [1, 1],
      "long_factor": [2, 2]}, "original_max_position_embeddings": 64)").value();
  EXPECT_EQ(su.rope_scaling.rope_type, "longrope");
  EXPECT_EQ(su.rope_scaling.original_max_position_embeddings, 64);
  // Parameters count the family's extra weights: Qwen3's q/k norms, Qwen2's q/k/v biases.
  EXPECT_EQ(nn::NumParameters(q3) -
                nn::NumParameters(
                    Parse("llama", R"("head_dim": 128, "attention_bias": true)").value()),
            4 * 2 * 128);
  EXPECT_EQ(Parse("llama", "").value().Summary().substr(0, 6), "llama:");
  EXPECT_EQ(q3.Summary().substr(0, 6), "qwen3:");
}

TEST(DecoderFamilies, QwenSlidingWindowsAndLayerTypes) {
  EXPECT_EQ(Parse("qwen2", R"("sliding_window": 64)").value().sliding_window, 0);  // not used
  DecoderConfig q = Parse("qwen2", R"("use_sliding_window": true, "sliding_window": 64,
      "max_window_layers": 2)").value();
  EXPECT_EQ(q.sliding_window, 64);
  EXPECT_EQ(q.sliding_from, 2);
  // max_window_layers beyond the layers: no layer slides.
  EXPECT_EQ(Parse("qwen2", R"("use_sliding_window": true, "sliding_window": 64,
      "max_window_layers": 28)").value().sliding_window, 0);
  DecoderConfig t = Parse("qwen3", R"("use_sliding_window": true, "sliding_window": 32,
      "layer_types": ["full_attention", "sliding_attention", "sliding_attention",
                      "sliding_attention"])").value();
  EXPECT_EQ(t.sliding_window, 32);
  EXPECT_EQ(t.sliding_from, 1);
  EXPECT_TRUE(Contains(Parse("qwen3", R"("use_sliding_window": true, "layer_types":
      ["sliding_attention", "full_attention", "sliding_attention", "full_attention"])").status(),
                       "alternates full and sliding attention"));
  EXPECT_TRUE(Contains(Parse("qwen3", R"("layer_types": ["full_attention"])").status(),
                       "\"layer_types\" must list 4 layer types"));
  // Written back as the family's config class reads it.
  for (const DecoderConfig& c : {q, t, Parse("mistral", R"("sliding_window": 100)").value(),
                                 Parse("phi3", "").value()}) {
    auto back = ParseDecoderConfig(DecoderConfigToJson(c), "written");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, c) << c.model_type;
  }
}

// Gemma2Config's defaults: every other layer slides (from layer 0) over 4096 positions, scale
// 256^-1/2, soft-caps 50 and 30; layer_types and nulls as given; written back as read.
TEST(DecoderFamilies, Gemma2WindowsAndScales) {
  const DecoderConfig d = Parse("gemma2", "").value();
  EXPECT_EQ(d.layer_windows, (std::vector<int64_t>{4096, 0, 4096, 0}));
  EXPECT_EQ(d.sliding_window, 0);  // attended as windows, never refused past them
  EXPECT_EQ(d.query_pre_attn_scalar, 256);
  EXPECT_EQ(d.attn_logit_softcapping, 50);
  EXPECT_EQ(d.final_logit_softcapping, 30);
  EXPECT_EQ(d.hidden_act, "gelu_pytorch_tanh");
  EXPECT_TRUE(d.tie_word_embeddings);
  const DecoderConfig g = Parse("gemma2", R"("sliding_window": 8, "layer_types": ["full_attention",
      "sliding_attention", "sliding_attention", "full_attention"], "attn_logit_softcapping": null,
      "final_logit_softcapping": 10.0, "query_pre_attn_scalar": 24,
      "hidden_activation": "gelu")").value();
  EXPECT_EQ(g.layer_windows, (std::vector<int64_t>{0, 8, 8, 0}));
  EXPECT_EQ(g.attn_logit_softcapping, 0);
  EXPECT_EQ(g.final_logit_softcapping, 10);
  EXPECT_EQ(g.hidden_act, "gelu");  // Gemma 2 reads hidden_activation as it is
  EXPECT_EQ(Parse("gemma2", R"("sliding_window": null)").value().layer_windows,
            (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_TRUE(Contains(Parse("gemma2", R"("layer_types": ["chunked_attention", "full_attention",
      "full_attention", "full_attention"])").status(), "layer_types[0] \"chunked_attention\" is "
      "not supported"));
  for (const DecoderConfig& c : {d, g}) {
    auto back = ParseDecoderConfig(DecoderConfigToJson(c), "written");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, c);
  }
}

// Gemma3TextConfig: every sixth layer full (sliding_window_pattern), the sliding layers' RoPE base
// from rope_local_base_freq (v4) or rope_parameters.sliding_attention (v5), the full layers' rope
// (with its scaling) from the rest; soft-caps off.
TEST(DecoderFamilies, Gemma3LocalRopeAndPattern) {
  const DecoderConfig d = Parse("gemma3_text", R"("sliding_window_pattern": 2,
      "rope_scaling": {"rope_type": "linear", "factor": 8.0})").value();
  EXPECT_EQ(d.layer_windows, (std::vector<int64_t>{4096, 0, 4096, 0}));
  EXPECT_EQ(d.local_rope_theta, 10000);
  EXPECT_EQ(d.rope_theta, 1e6);
  EXPECT_EQ(d.rope_scaling.rope_type, "linear");
  EXPECT_EQ(d.attn_logit_softcapping, 0);
  EXPECT_EQ(d.final_logit_softcapping, 0);
  EXPECT_EQ(Parse("gemma3_text", "").value().layer_windows,
            (std::vector<int64_t>{4096, 4096, 4096, 4096}));  // 4 layers, the sixth is full
  const DecoderConfig v5 = Parse("gemma3_text", R"("rope_parameters": {"full_attention":
      {"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}, "sliding_attention":
      {"rope_type": "default", "rope_theta": 20000.0}})").value();
  EXPECT_EQ(v5.local_rope_theta, 20000);
  EXPECT_EQ(v5.rope_theta, 500000);
  EXPECT_EQ(v5.rope_scaling.factor, 2.0);
  EXPECT_TRUE(Contains(Parse("gemma3_text", R"("rope_parameters": {"sliding_attention":
      {"rope_type": "linear", "factor": 2.0}})").status(),
                       "\"rope_parameters.sliding_attention.factor\" 2.0"));
  EXPECT_TRUE(Contains(Parse("gemma3_text", R"("rope_local_base_freq": 10.0, "rope_parameters":
      {"sliding_attention": {"rope_theta": 20.0}})").status(), "disagree"));
  for (const DecoderConfig& c : {d, v5}) {
    auto back = ParseDecoderConfig(DecoderConfigToJson(c), "written");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, c);
  }
}

// GptOssConfig's defaults: q/k/v/o biases, head_dim 64, every other layer sliding over 128
// positions, YaRN x32 over 4096 positions on theta 150000, 128 experts top 4 with the clamped
// SwiGLU (7, 1.702), renormalised (softmax over the chosen logits); written back as read.
TEST(DecoderFamilies, GptOssDefaultsAndRoundTrip) {
  const DecoderConfig d = Parse("gpt_oss", "").value();
  EXPECT_TRUE(d.attention_bias && d.qkv_bias() && d.o_bias());
  EXPECT_EQ(d.head_dim, 64);
  EXPECT_EQ(d.layer_windows, (std::vector<int64_t>{128, 0, 128, 0}));
  EXPECT_EQ(d.rope_theta, 150000);
  EXPECT_EQ(d.rope_scaling.rope_type, "yarn");
  EXPECT_EQ(d.rope_scaling.factor, 32);
  EXPECT_EQ(d.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_FALSE(d.rope_scaling.truncate);
  EXPECT_EQ(d.num_experts, 128);
  EXPECT_EQ(d.num_experts_per_tok, 4);
  EXPECT_EQ(d.moe_intermediate_size, 8);  // intermediate_size: each expert's
  EXPECT_TRUE(d.norm_topk_prob);
  EXPECT_EQ(d.swiglu_limit, 7);
  EXPECT_EQ(d.swiglu_alpha, 1.702);
  EXPECT_EQ(d.rms_norm_eps, 1e-5);
  EXPECT_TRUE(d.IsMoeLayer(0) && d.IsMoeLayer(3));
  EXPECT_EQ(d.config_class().architecture, "GptOssForCausalLM");
  const nn::DecoderFamily& f = nn::FamilyOf(d);
  EXPECT_TRUE(f.sinks && f.router_bias);
  EXPECT_EQ(f.router_name, "router");
  const DecoderConfig g = Parse("gpt_oss", R"("attention_bias": false, "sliding_window": 6,
      "num_local_experts": 4, "num_experts_per_tok": 2, "swiglu_limit": 1.5,
      "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0})").value();
  EXPECT_FALSE(g.attention_bias);
  EXPECT_EQ(g.layer_windows, (std::vector<int64_t>{6, 0, 6, 0}));
  EXPECT_EQ(g.rope_scaling.rope_type, "default");
  EXPECT_EQ(g.swiglu_limit, 1.5);
  // Parameters: the sinks (4 heads), router biases, the experts' biases, per layer.
  DecoderConfig plain = g;
  plain.model_type = "mixtral";
  EXPECT_EQ(nn::NumParameters(g) - nn::NumParameters(plain), 4 * (4 + 4 + 4 * (2 * 8 + 16)));
  for (const DecoderConfig& c : {d, g}) {
    auto back = ParseDecoderConfig(DecoderConfigToJson(c), "written");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, c);
  }
}

TEST(DecoderFamilies, FieldsNoFamilyImplementsAreRefused) {
  for (const auto& [extra, error] : std::vector<std::pair<std::string, std::string>>{
           {R"("partial_rotary_factor": 0.5)",
            "\"partial_rotary_factor\": 0.5 (partial rotary embeddings (Phi-4-mini, StableLM)) is "
            "not implemented by dtensor's phi3; refusing to ignore it"},
           {R"("quantization_config": {"quant_method": "awq"})", "\"quantization_config\""},
           {R"("num_local_experts": 8)", "\"num_local_experts\": 8"},
           {R"("final_logit_softcapping": 30.0)", "\"final_logit_softcapping\""}}) {
    auto c = Parse("phi3", extra);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << extra;
    EXPECT_TRUE(Contains(c.status(), error)) << extra;
  }
  // Off values are accepted.
  EXPECT_TRUE(Parse("phi3", R"("partial_rotary_factor": 1.0, "quantization_config": null,
      "num_local_experts": 0)").ok());
}

// ---- which model a config describes, and what it may not carry (issue 47) ---------------------

// google/gemma-2b's config.json: nothing in it but "architectures" and "model_type" says Gemma (its
// (1 + w) norms and scaled embeddings are in no field).
constexpr char kGemma[] = R"("attention_bias": false, "bos_token_id": 2, "eos_token_id": 1,
    "head_dim": 256, "hidden_act": "gelu", "hidden_size": 2048, "intermediate_size": 16384,
    "max_position_embeddings": 8192, "num_attention_heads": 8, "num_hidden_layers": 18,
    "num_key_value_heads": 1, "pad_token_id": 0, "rms_norm_eps": 1e-06, "rope_scaling": null,
    "rope_theta": 10000.0, "torch_dtype": "bfloat16", "vocab_size": 256000)";

TEST(WhichModel, ModelTypeAndArchitecturesMustAgree) {
  // Note [Which model a config describes]: a Gemma checkpoint relabelled "llama", or whose
  // model_type is gone, ran as Llama with wrong tokens; both are refused naming what they say.
  struct Case {
    std::string fields, error;
  } cases[] = {
      {R"("model_type": "llama", "architectures": ["GemmaForCausalLM"])",
       "\"model_type\" \"llama\" and \"architectures\" [\"GemmaForCausalLM\"] disagree: a llama "
       "checkpoint is LlamaForCausalLM, not GemmaForCausalLM, which is model_type \"gemma\"'s; "
       "refusing to guess"},
      {R"("architectures": ["Gemma3ForConditionalGeneration"])",
       "has no \"model_type\", and \"architectures\" [\"Gemma3ForConditionalGeneration\"] is "
       "not a model dtensor "
       "runs (supported: LlamaForCausalLM, MistralForCausalLM, "},
      {"\"tie_word_embeddings\": true",
       "has neither \"model_type\" nor \"architectures\", so which model it describes is unknown"},
      {R"("model_type": "llama", "architectures": ["MistralForCausalLM"])",
       "not MistralForCausalLM, which is model_type \"mistral\"'s"},
      {R"("model_type": "qwen2", "architectures": ["Qwen2ForCausalLM", "LlamaForCausalLM"])",
       "a qwen2 checkpoint is Qwen2ForCausalLM, not LlamaForCausalLM, which is model_type "
       "\"llama\"'s"},
      {R"("model_type": "llama", "architectures": "LlamaForCausalLM")",
       "\"architectures\" must be a list of model class names, got \"LlamaForCausalLM\""},
      {R"("model_type": "llama", "architectures": [])", "\"architectures\" must be a list"},
  };
  for (const Case& c : cases) {
    auto r = ParseDecoderConfig(absl::StrCat("{", c.fields, ", ", kGemma, "}"), "gemma.json");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.fields;
    EXPECT_TRUE(Contains(r.status(), "config 'gemma.json': ")) << r.status();
    EXPECT_TRUE(Contains(r.status(), c.error)) << c.fields << ": " << r.status();
  }
  // Either alone names the class; both agreeing, too; null is absent.
  for (const auto& [fields, model_type] : std::vector<std::pair<std::string, std::string>>{
           {R"("architectures": ["LlamaForCausalLM"])", "llama"},
           {R"("architectures": ["MistralForCausalLM"], "model_type": null)", "mistral"},
           {R"("model_type": "qwen2", "architectures": null)", "qwen2"},
           {R"("model_type": "phi3", "architectures": ["Phi3ForCausalLM"])", "phi3"}}) {
    auto r = ParseDecoderConfig(absl::StrCat("{", fields, ", ", kGemma, "}"), "c");
    ASSERT_TRUE(r.ok()) << fields << ": " << r.status();
    EXPECT_EQ(r->model_type, model_type) << fields;
  }
}

// GemmaConfig's reading: hidden_act "gelu" is the tanh approximation, the embeddings are tied
// unless the config says otherwise, and transformers 4's hidden_activation must agree.
TEST(WhichModel, GemmaReadsItsActivationAndTying) {
  auto gemma = ParseDecoderConfig(absl::StrCat("{\"model_type\": \"gemma\", ", kGemma, "}"), "g");
  ASSERT_TRUE(gemma.ok()) << gemma.status();
  EXPECT_EQ(gemma->hidden_act, "gelu_pytorch_tanh");
  EXPECT_TRUE(gemma->tie_word_embeddings);
  EXPECT_EQ(gemma->head_dim, 256);
  auto agreeing = ParseDecoderConfig(
      absl::StrCat("{\"model_type\": \"gemma\", \"hidden_activation\": \"gelu_pytorch_tanh\", ",
                   kGemma, "}"),
      "g");
  EXPECT_TRUE(agreeing.ok()) << agreeing.status();
  auto other = ParseDecoderConfig(
      absl::StrCat("{\"model_type\": \"gemma\", \"hidden_activation\": \"silu\", ", kGemma, "}"),
      "g");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(Contains(other.status(), "\"hidden_activation\" \"silu\" and \"hidden_act\" "
                                       "\"gelu_pytorch_tanh\" (as gemma reads it) disagree"))
      << other.status();
  // OLMo 2 keeps Llama's silu and untied defaults with its own eps.
  auto olmo = ParseDecoderConfig(
      R"({"model_type": "olmo2", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
          "num_hidden_layers": 1, "num_attention_heads": 2})",
      "o");
  ASSERT_TRUE(olmo.ok()) << olmo.status();
  EXPECT_EQ(olmo->hidden_act, "silu");
  EXPECT_FALSE(olmo->tie_word_embeddings);
  EXPECT_EQ(olmo->rms_norm_eps, 1e-5);
}

// google/gemma-2-2b's config.json (v4 spelling, with v5's layer_types added), relabelled "llama"
// without its architectures and with its soft-caps nulled, as the issue's user did: every field
// left that Llama does not compute is refused in turn, naming it and whose feature it is.
TEST(WhichModel, ARelabelledGemma2IsRefusedByItsFields) {
  nlohmann::json c = nlohmann::json::parse(absl::StrCat("{", kGemma, "}"));
  c["model_type"] = "llama";
  c["hidden_size"] = 2304;
  c["num_hidden_layers"] = 4;
  c["attn_logit_softcapping"] = nullptr;
  c["final_logit_softcapping"] = nullptr;
  c["query_pre_attn_scalar"] = 256;
  c["hidden_activation"] = "gelu_pytorch_tanh";
  c["sliding_window"] = 4096;
  c["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention",
                      "full_attention"};
  const std::vector<std::pair<std::string, std::string>> refusals = {
      {"query_pre_attn_scalar", "\"query_pre_attn_scalar\": 256 (Gemma 2's attention scale)"},
      {"layer_types", "\"layer_types\": [\"sliding_attention\",\"full_attention\","},
      {"sliding_window", "\"sliding_window\": 4096 (sliding-window attention)"},
      {"hidden_activation", "\"hidden_activation\": \"gelu_pytorch_tanh\" (Gemma's MLP activation)"},
  };
  for (const auto& [field, error] : refusals) {
    auto r = ParseDecoderConfig(c.dump(), "gemma2.json");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << field;
    EXPECT_TRUE(Contains(r.status(), error)) << r.status();
    EXPECT_TRUE(Contains(r.status(), "is not implemented by dtensor's llama; refusing to ignore"))
        << r.status();
    c.erase(field);
  }
  // What is left says Llama: the checkpoint's tensors are the next guard (Note [Every tensor is
  // used] in nn/load.h: Gemma 2's post_feedforward_layernorm is no Llama weight).
  EXPECT_TRUE(ParseDecoderConfig(c.dump(), "gemma2.json").ok());
}

// Each class refuses the fields of the families it is not, and reads its own (Note [Fields no
// family implements]).
TEST(WhichModel, EachClassRefusesWhatItDoesNotRead) {
  struct Field {
    std::string json;
    std::vector<std::string> read_by;  // model_types that read it
  };
  const std::vector<Field> fields = {
      {R"("attn_logit_softcapping": 50.0)", {"gemma2", "gemma3_text"}},
      {R"("final_logit_softcapping": 30.0)", {"gemma2", "gemma3_text"}},
      {R"("query_pre_attn_scalar": 256)", {"gemma2", "gemma3_text"}},
      {R"("hidden_activation": "gelu_pytorch_tanh")",
       {"gemma", "gemma2", "gemma3_text"}},
      {R"("use_bidirectional_attention": true)", {}},
      {R"("rope_local_base_freq": 10000.0)", {"gemma3_text"}},
      {R"("sliding_window_pattern": 6)", {"gemma3_text"}},
      {R"("swiglu_limit": 7.0)", {"gpt_oss"}},
      {R"("attention_chunk_size": 8192)", {}},
      {R"("logit_scale": 0.0625)", {}},
      {R"("sliding_window": 64)",
       {"mistral", "qwen2", "qwen3", "phi3", "mixtral", "qwen3_moe", "gemma2", "gemma3_text",
        "gpt_oss"}},
      {R"("use_sliding_window": true)", {"qwen2", "qwen3", "qwen3_moe"}},
      {R"("use_gated_attention": true)", {"minicpm5_moe"}},
      {R"("decoder_sparse_step": 2)", {"qwen3_moe"}},
  };
  for (const DecoderConfigClass& cls : DecoderConfigClasses()) {
    for (const Field& f : fields) {
      const std::string key = f.json.substr(1, f.json.find('"', 1) - 1);
      auto r = Parse(cls.model_type, f.json);
      const bool read = std::find(f.read_by.begin(), f.read_by.end(), cls.model_type) !=
                        f.read_by.end();
      if (read) {
        EXPECT_FALSE(Contains(r.status(), "\"" + key + "\"")) << cls.model_type << ": " << r.status();
        continue;
      }
      EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << cls.model_type << " " << key;
      EXPECT_TRUE(Contains(r.status(), absl::StrCat("\"", key, "\": ")))
          << cls.model_type << ": " << r.status();
    }
    // Off values are accepted everywhere.
    auto off = Parse(cls.model_type, R"("attn_logit_softcapping": null,
        "final_logit_softcapping": null, "use_bidirectional_attention": false,
        "hidden_activation": null, "logit_scale": 1.0, "layer_types":
        ["full_attention", "full_attention", "full_attention", "full_attention"])");
    EXPECT_FALSE(off.status().code() == absl::StatusCode::kUnimplemented)
        << cls.model_type << ": " << off.status();
  }
}

// Note [Config classes and families]: one family per config class, in the same order.
TEST(DecoderFamilies, EveryConfigClassHasItsFamily) {
  const std::vector<DecoderConfigClass>& classes = DecoderConfigClasses();
  const std::vector<nn::DecoderFamily>& families = nn::DecoderFamilies();
  ASSERT_EQ(classes.size(), families.size()) << DecoderModelTypes() << " / "
                                             << nn::DecoderFamilyNames();
  for (size_t i = 0; i < classes.size(); ++i) {
    EXPECT_EQ(classes[i].model_type, families[i].model_type) << i;
  }
  EXPECT_EQ(DecoderModelTypes(), nn::DecoderFamilyNames());
  // The same refusal from both, naming every model_type.
  EXPECT_EQ(FindDecoderConfigClass("gpt2").status(), nn::FindDecoderFamily("gpt2").status());
  // A family with experts reads them from its config class's fields, and only such a family
  // plans them.
  for (size_t i = 0; i < classes.size(); ++i) {
    EXPECT_EQ(classes[i].experts != ExpertFields::kNone, !families[i].moe_plan.empty())
        << classes[i].model_type;
  }
}

// The reader refuses a config's n_group / topk_group exactly where the router would
// (nn::SigmoidGroupsFit): one rule, stated in the config's words and in the router's.
RC_GTEST_PROP(DecoderFamilies, GroupsAsTheRouterSays, ()) {
  const int64_t experts = *rc::gen::inRange<int64_t>(2, 41);
  const int64_t top_k = *rc::gen::inRange<int64_t>(1, experts + 1);
  const int64_t groups = *rc::gen::inRange<int64_t>(1, experts + 2);
  const int64_t best = *rc::gen::inRange<int64_t>(1, groups + 2);
  const absl::StatusOr<DecoderConfig> c = Parse(
      "minicpm5_moe", absl::StrCat(R"("n_routed_experts": )", experts,
                                   R"(, "num_experts_per_tok": )", top_k, R"(, "n_group": )",
                                   groups, R"(, "topk_group": )", best));
  RC_ASSERT(c.ok() == nn::SigmoidGroupsFit(experts, groups, best, top_k));
  if (!c.ok()) RC_ASSERT(Contains(c.status(), "do not fit"));
}

// DecoderConfig::HasMoeLayers / HasDenseLayers are closed forms (a config may claim 10^9 layers):
// they say what IsMoeLayer says of every layer, for each way the classes spell the sparse layers.
RC_GTEST_PROP(DecoderConfigLayers, ClosedFormsAgreeWithEveryLayer, ()) {
  DecoderConfig c;
  c.num_hidden_layers = *rc::gen::inRange<int64_t>(0, 13);
  c.num_experts = *rc::gen::element<int64_t>(0, 4);
  const int64_t l = c.num_hidden_layers;
  if (*rc::gen::arbitrary<bool>() && l > 0) {  // mlp_layer_types
    for (int64_t i = 0; i < l; ++i) c.mlp_sparse.push_back(*rc::gen::arbitrary<bool>());
  } else {
    c.first_k_dense_replace = *rc::gen::inRange<int64_t>(0, l + 3);
    c.decoder_sparse_step = *rc::gen::inRange<int64_t>(1, 6);
    for (int64_t i = 0; i < l; ++i) {
      if (*rc::gen::inRange(0, 4) == 0) c.mlp_only_layers.push_back(i);
    }
  }
  bool sparse = false, dense = false;
  for (int64_t i = 0; i < l; ++i) (c.IsMoeLayer(i) ? sparse : dense) = true;
  RC_ASSERT(c.HasMoeLayers() == sparse);
  RC_ASSERT(c.HasDenseLayers() == dense);
}

}  // namespace
}  // namespace dt::loaders
