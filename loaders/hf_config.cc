#include "dtensor/loaders/hf_config.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dt::loaders {
namespace {

// One designated initializer per config class (fields in their declaration order; the rest keep
// LlamaConfig's defaults). The families these files are read for, in the same order, are
// nn/models/decoder_family.cc's rows.
std::vector<DecoderConfigClass> MakeClasses() {
  using SW = SlidingWindowFields;
  return {
      {.model_type = "llama", .architecture = "LlamaForCausalLM", .gguf_architecture = "llama",
       .attention_bias_field = true, .mlp_bias_field = true},
      {.model_type = "mistral", .architecture = "MistralForCausalLM", .gguf_architecture = "llama",
       .default_max_position_embeddings = 4096 * 32, .sliding_window = SW::kAll,
       .default_sliding_window = 4096},
      {.model_type = "qwen2", .architecture = "Qwen2ForCausalLM", .gguf_architecture = "qwen2",
       .qkv_bias = true, .default_max_position_embeddings = 32768,
       .sliding_window = SW::kFromLayer},
      {.model_type = "qwen3", .architecture = "Qwen3ForCausalLM", .gguf_architecture = "qwen3",
       .attention_bias_field = true, .default_head_dim = 128,
       .default_max_position_embeddings = 32768, .sliding_window = SW::kFromLayer},
      {.model_type = "phi3", .architecture = "Phi3ForCausalLM", .gguf_architecture = "phi3",
       .default_max_position_embeddings = 4096, .default_rms_norm_eps = 1e-5,
       .sliding_window = SW::kAll, .longrope_aliases = {"su", "yarn"}},
      {.model_type = "mixtral", .architecture = "MixtralForCausalLM", .gguf_architecture = "llama",
       .experts = ExpertFields::kLocalExperts, .moe_checkpoint_block = "block_sparse_moe",
       .expert_checkpoint_names = {"w1", "w3", "w2"},
       .default_max_position_embeddings = 4096 * 32, .default_rms_norm_eps = 1e-5,
       .default_rope_theta = 1e6, .sliding_window = SW::kAll},
      {.model_type = "qwen3_moe", .architecture = "Qwen3MoeForCausalLM",
       .gguf_architecture = "qwen3moe", .attention_bias_field = true, .default_head_dim = 128,
       .experts = ExpertFields::kSparseStep, .router = RouterFields::kNormTopkProb,
       .default_max_position_embeddings = 32768, .sliding_window = SW::kFromLayer},
      {.model_type = "deepseek_v2", .architecture = "DeepseekV2ForCausalLM",
       .attention_bias_field = true, .latent_attention_fields = true, .mlp_bias_field = true,
       .experts = ExpertFields::kFirstKDense, .router = RouterFields::kScalingFactor},
      {.model_type = "minicpm5_moe", .architecture = "MiniCPM5MoeForCausalLM",
       .attention_bias_field = true, .default_head_dim = 128,
       .experts = ExpertFields::kLayerTypes, .router = RouterFields::kGroups,
       .default_max_position_embeddings = 524288, .default_rope_theta = 5e6},
      {.model_type = "gemma", .architecture = "GemmaForCausalLM", .gguf_architecture = "gemma",
       .attention_bias_field = true,
       .default_head_dim = 256, .default_hidden_act = "gelu_pytorch_tanh",
       .activation_key = ActivationKey::kHiddenActGemma, .default_max_position_embeddings = 8192,
       .default_tie_word_embeddings = true},
      {.model_type = "olmo2", .architecture = "Olmo2ForCausalLM", .gguf_architecture = "olmo2",
       .attention_bias_field = true,
       .default_rms_norm_eps = 1e-5},
      {.model_type = "gemma2", .architecture = "Gemma2ForCausalLM", .gguf_architecture = "gemma2",
       .attention_bias_field = true,
       .default_head_dim = 256, .default_hidden_act = "gelu_pytorch_tanh",
       .activation_key = ActivationKey::kHiddenActivation,
       .default_max_position_embeddings = 8192, .sliding_window = SW::kLayerTypes, .default_sliding_window = 4096,
       .default_sliding_pattern = 2, .attention_scale_fields = true,
       .default_attn_logit_softcapping = 50, .default_final_logit_softcapping = 30,
       .default_tie_word_embeddings = true},
      {.model_type = "gemma3_text", .architecture = "Gemma3ForCausalLM",
       .gguf_architecture = "gemma3", .attention_bias_field = true, .default_head_dim = 256,
       .default_hidden_act = "gelu_pytorch_tanh",
       .activation_key = ActivationKey::kHiddenActivation,
       .default_max_position_embeddings = 131072, .default_rope_theta = 1e6,
       .sliding_window = SW::kLayerTypes, .default_sliding_window = 4096,
       .default_sliding_pattern = 6, .sliding_pattern_field = true, .local_rope_fields = true,
       .attention_scale_fields = true, .default_tie_word_embeddings = true},
      {.model_type = "gpt_oss", .architecture = "GptOssForCausalLM",
       .attention_bias_field = true, .default_attention_bias = true, .default_head_dim = 64,
       .experts = ExpertFields::kSwigluLimit, .default_max_position_embeddings = 131072,
       .default_rms_norm_eps = 1e-5, .default_rope_theta = 150000.0,
       .sliding_window = SW::kLayerTypes, .default_sliding_window = 128,
       .default_sliding_pattern = 2,
       .default_rope_parameters = R"({"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
           "beta_slow": 1.0, "truncate": false, "original_max_position_embeddings": 4096})"},
  };
}

}  // namespace

const std::vector<DecoderConfigClass>& DecoderConfigClasses() {
  static const std::vector<DecoderConfigClass>* const classes =
      new std::vector<DecoderConfigClass>(MakeClasses());
  return *classes;
}

std::string DecoderModelTypes() { return ModelTypesOf(DecoderConfigClasses()); }

absl::StatusOr<const DecoderConfigClass*> FindDecoderConfigClass(absl::string_view model_type) {
  return FindModelType(DecoderConfigClasses(), model_type);
}

absl::StatusOr<const DecoderConfigClass*> FindGgufConfigClass(absl::string_view arch,
                                                              bool experts) {
  std::string names;
  for (const DecoderConfigClass& c : DecoderConfigClasses()) {
    if (c.gguf_architecture.empty()) continue;
    // The first: llama before mistral; mixtral for llama with experts.
    if (c.gguf_architecture == arch && (c.experts != ExpertFields::kNone) == experts) return &c;
    if (names.find(c.gguf_architecture) == std::string::npos) {
      absl::StrAppend(&names, names.empty() ? "" : ", ", c.gguf_architecture);
    }
  }
  return absl::UnimplementedError(absl::StrCat("architecture '", arch,
                                               "' is not supported (supported: ", names, ")"));
}

const DecoderConfigClass& DecoderConfig::config_class() const {
  absl::StatusOr<const DecoderConfigClass*> c = FindDecoderConfigClass(model_type);
  return c.ok() ? **c : DecoderConfigClasses().front();
}

namespace {

// decoder_sparse_step as a divisor (a config built by hand may leave it 0).
int64_t SparseStep(const DecoderConfig& c) { return std::max<int64_t>(c.decoder_sparse_step, 1); }

}  // namespace

bool DecoderConfig::IsMoeLayer(int64_t layer) const {
  if (num_experts == 0 || layer < 0) return false;
  if (!mlp_sparse.empty()) {
    return layer < static_cast<int64_t>(mlp_sparse.size()) && mlp_sparse[layer];
  }
  return layer >= first_k_dense_replace && (layer + 1) % SparseStep(*this) == 0 &&
         std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) ==
             mlp_only_layers.end();
}

bool DecoderConfig::HasMoeLayers() const {
  const int64_t l = num_hidden_layers;
  if (num_experts == 0) return false;
  if (!mlp_sparse.empty()) {
    return std::find(mlp_sparse.begin(), mlp_sparse.end(), true) != mlp_sparse.end();
  }
  // The candidates from first_k_dense_replace on are every step-th layer; mlp_only_layers removes
  // finitely many of them.
  const int64_t first = std::max<int64_t>(first_k_dense_replace, 0), step = SparseStep(*this);
  if (first >= l || step - 1 - first % step >= l - first) return false;
  for (int64_t i = first + (step - 1 - first % step);; i += step) {
    if (IsMoeLayer(i)) return true;
    if (l - i <= step) return false;  // the next candidate is past the last layer
  }
}

bool DecoderConfig::HasDenseLayers() const {
  const int64_t l = num_hidden_layers;
  if (num_experts == 0) return l > 0;
  if (!mlp_sparse.empty()) {
    return std::find(mlp_sparse.begin(), mlp_sparse.end(), false) != mlp_sparse.end();
  }
  return l > 0 &&
         (first_k_dense_replace > 0 || SparseStep(*this) > 1 || !mlp_only_layers.empty());
}

RopeSpec DecoderRopeSpec(const DecoderConfig& c) {
  return RopeSpec{c.rope_scaling, c.head_dim, c.rope_theta, c.max_position_embeddings};
}

}  // namespace dt::loaders
