#pragma once
// Hugging Face `config.json` of the decoder models, in transformers' v4 and v5 spellings, read
// and written as the model_type's config class does (DecoderConfigClass below; the classes are
// the table in hf_config.cc). What the values mean to a model is nn/models/decoder_family.h's:
// See Note [Config classes and families] there.
//
//   field                        required  default / notes
//   model_type                   one of    one of the config classes, else an error listing
//   architectures                the two   them; architectures: every entry the class's model
//                                          class ("LlamaForCausalLM"), which alone names the
//                                          class. Disagreeing, or both absent: an error naming
//                                          them (Note [Which model a config describes] in
//                                          hf_config_read.cc)
//   vocab_size                   yes
//   hidden_size                  yes
//   intermediate_size            yes
//   num_hidden_layers            yes
//   num_attention_heads          yes       hidden_size % heads == 0 unless head_dim is given
//   num_key_value_heads          no        num_attention_heads; must divide it (GQA)
//   head_dim                     no        the class's (default_head_dim; else hidden_size /
//                                          heads); even
//   max_position_embeddings      no        the class's (default_max_position_embeddings)
//   rms_norm_eps                 no        the class's (default_rms_norm_eps)
//   rope_theta                   no        the class's (v5: rope_parameters.rope_theta)
//   rope_scaling | rope_parameters no      null -> default; rope_type (legacy key "type"):
//                                          default, linear, dynamic, yarn, longrope, llama3
//                                          with their parameters (loaders/rope.h); a key the
//                                          type does not take is an error. Both given and
//                                          different, or a top-level rope_theta that differs
//                                          from rope_parameters.rope_theta: an error naming both.
//                                          The class's longrope_aliases read as longrope
//   original_max_position_embeddings no    top level (Phi-3 style): longrope/yarn/llama3's value
//   hidden_act                   no        the class's ("silu"; Gemma "gelu_pytorch_tanh", which
//                                          its "gelu" means too; Gemma 2 reads hidden_activation;
//                                          both keys given must agree: ActivationKey);
//                                          the model accepts the gated MLP's activations
//                                          (nn/mlp.h ParseActivation) and refuses the others
//   attention_bias               no        the class's (false; gpt-oss true); read where the class
//                                          has it (q/k/v/o biases)
//   mlp_bias                     no        false; read where the class has it
//   sliding_window, use_sliding_window, max_window_layers, layer_types
//                                no        as the class reads them (SlidingWindowFields): the
//                                          shortest window a layer uses, see Note [Sliding windows];
//                                          Gemma 2: a window per layer, attended as such
//   query_pre_attn_scalar, attn_logit_softcapping, final_logit_softcapping
//                                no        Gemma 2's (256, 50, 30; null: none), Gemma 3's (256,
//                                          none, none)
//   rope_local_base_freq, sliding_window_pattern
//                                no        Gemma 3's sliding layers' RoPE base (10000; v5:
//                                          rope_parameters.sliding_attention, the full layers'
//                                          in rope_parameters.full_attention) and their pattern
//                                          (6: every sixth layer full) without layer_types
//   swiglu_limit, swiglu_alpha   no        gpt-oss's (7, 1.702): its experts' clamped SwiGLU
//   tie_word_embeddings          no        the class's (false; Gemma true); true: no
//                                          lm_head.weight, it is embed_tokens
//   torch_dtype | dtype          no        "float32"; float32, bfloat16, float16
//   bos_token_id, eos_token_id   no        unset; eos may be a list (Llama-3.1)
//
// A class with experts reads their fields as ExpertFields and RouterFields say (Note [MoE blocks]
// in nn/models/decoder_family.h), and one with latent attention fields q_lora_rank (null:
// q_proj), kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim (the RoPE head_dim), v_head_dim, with
// num_key_value_heads equal to the heads. Training-only fields (router_aux_loss_coef,
// router_jitter_noise, output_router_logits) change nothing at inference and are ignored.
//
// Fields that change the computation and that the class does not read are refused by name
// (Unimplemented), never ignored: other families' (Gemma 2's attn_logit_softcapping,
// final_logit_softcapping and query_pre_attn_scalar on a class other than Gemma 2/3's, layer_types
// with sliding layers and a sliding_window where the class has none; gpt-oss's swiglu_limit;
// experts and latent attention where the class has none), features of a supported family dtensor does not compute (partial_rotary_factor), and
// quantization_config: the table in Note [Fields no family implements] (hf_config_read.cc), with
// each field's family in the message. Errors are InvalidArgument naming the file and the field
// with its value:
//   "config 'tiny/config.json': num_key_value_heads 3 must divide num_attention_heads 8"
//
// Note [Sliding windows]
// transformers masks key j from query i when i - j >= window (masking_utils'
// sliding_window_overlay), so a sequence of at most `window` tokens attends exactly as full
// attention does. dtensor has no sliding-window kernel: DecoderConfig keeps the shortest window of
// any layer, and the model refuses (naming it) a forward whose positions would reach past it,
// rather than compute full attention where the checkpoint expects a window.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "dtensor/core/dtype.h"
#include "dtensor/loaders/rope.h"

namespace dt::loaders {

// How a config class reads sliding-window fields (transformers' semantics).
enum class SlidingWindowFields : uint8_t {
  kNone,       // none (LlamaConfig: a sliding_window key is not read by transformers)
  kAll,        // sliding_window (int or null) applies to every layer (MistralConfig, Phi3Config)
  kFromLayer,  // with use_sliding_window, sliding_window from max_window_layers (or the first
               // sliding_attention of layer_types) on (Qwen2Config)
  kLayerTypes,  // sliding_window (default_sliding_window; null: none) on the layers layer_types
                // calls sliding_attention, by default every layer i with (i + 1) %
                // default_sliding_pattern != 0 (Gemma2Config: pattern 2); attended as windows
                // (DecoderConfig::layer_windows), not refused past them
};

// Which key names the MLP's activation (DecoderConfig::hidden_act).
enum class ActivationKey : uint8_t {
  kHiddenAct,         // hidden_act (hidden_activation refused)
  kHiddenActGemma,    // hidden_act, its "gelu" the tanh approximation (GemmaConfig: the first
                      // releases' spelling); a hidden_activation (transformers 4's) must agree
  kHiddenActivation,  // hidden_activation (Gemma2Config); a hidden_act must agree
};

// Which fields give a class's experts and its sparse layers (the rule they follow is
// DecoderConfig::IsMoeLayer's); defaults in parentheses.
enum class ExpertFields : uint8_t {
  kNone,          // no experts
  kLocalExperts,  // num_local_experts (8), num_experts_per_tok (2); every layer sparse, each
                  // expert intermediate_size wide (MixtralConfig)
  kSparseStep,    // num_experts (v5: num_local_experts; 128), num_experts_per_tok (8),
                  // moe_intermediate_size (768), decoder_sparse_step (1), mlp_only_layers
                  // (Qwen3MoeConfig)
  kFirstKDense,   // n_routed_experts (64), num_experts_per_tok (required), moe_intermediate_size
                  // (1407), first_k_dense_replace (0), n_shared_experts (2) (DeepseekV2Config)
  kSwigluLimit,   // num_local_experts (128), num_experts_per_tok (4), swiglu_limit (7) and
                  // swiglu_alpha (1.702) of the experts' clamped SwiGLU; every layer sparse, each
                  // expert intermediate_size wide (GptOssConfig)
  kLayerTypes,    // n_routed_experts (160), num_experts_per_tok (16), moe_intermediate_size
                  // (512), n_shared_experts (1), mlp_layer_types ("dense" / "sparse" per layer;
                  // else first_k_dense_replace, 1), use_gated_attention (must not be false)
                  // (MiniCPM5MoeConfig)
};

// Which fields weigh the router's top k (DecoderConfig::norm_topk_prob, routed_scaling_factor,
// n_group, topk_group).
enum class RouterFields : uint8_t {
  kNone,           // none: the weights are renormalised (norm_topk_prob true)
  kNormTopkProb,   // norm_topk_prob (false)
  kScalingFactor,  // routed_scaling_factor (1), topk_method ("greedy" only); norm_topk_prob true
                   // is refused (transformers ignores it, DeepSeek's own code renormalises)
  kGroups,         // norm_topk_prob (true), routed_scaling_factor (3.66), n_group and topk_group
                   // (1): the groups must divide the experts, hold 2 or more each, and the
                   // topk_group best at least num_experts_per_tok experts
};

// One model_type's files: what its config class reads from config.json and writes back, which
// GGUF architecture llama.cpp writes it as, and how Hub checkpoints name its experts. Nothing here
// says what a model computes (Note [Config classes and families] in nn/models/decoder_family.h).
struct DecoderConfigClass {
  std::string model_type;         // config.json's "model_type": "qwen3"
  std::string architecture;       // written to config.json's "architectures": "Qwen3ForCausalLM"
  std::string gguf_architecture;  // llama.cpp's general.architecture; empty: no GGUF reader
  // ---- attention
  bool attention_bias_field = false;     // "attention_bias" gives q/k/v/o biases
  bool default_attention_bias = false;   // its value when absent (GptOssConfig: true)
  bool qkv_bias = false;                 // the checkpoints hold q/k/v biases whatever the config
                                         // says, and no o bias (the class has no attention_bias)
  bool latent_attention_fields = false;  // q_lora_rank, kv_lora_rank, ...; head_dim is
                                         // qk_rope_head_dim
  int64_t default_head_dim = 0;          // 0: hidden_size / heads
  // ---- MLP
  bool mlp_bias_field = false;  // "mlp_bias" gives gate/up/down biases
  std::string default_hidden_act = "silu";
  ActivationKey activation_key = ActivationKey::kHiddenAct;
  ExpertFields experts = ExpertFields::kNone;
  RouterFields router = RouterFields::kNone;
  // Hub checkpoint names under model.layers.{i}.: the block ("block_sparse_moe.gate.weight",
  // "block_sparse_moe.experts.{e}.w1.weight") and each expert's gate, up and down projections.
  std::string moe_checkpoint_block = "mlp";
  std::array<std::string, 3> expert_checkpoint_names = {"gate_proj", "up_proj", "down_proj"};
  // ---- the other defaults
  int64_t default_max_position_embeddings = 2048;
  double default_rms_norm_eps = 1e-6;
  double default_rope_theta = 10000.0;
  SlidingWindowFields sliding_window = SlidingWindowFields::kNone;
  int64_t default_sliding_window = 0;  // kAll, kLayerTypes when the key is absent; 0: none
  int64_t default_sliding_pattern = 0;  // kLayerTypes without layer_types
  bool sliding_pattern_field = false;   // sliding_window_pattern gives it (Gemma3TextConfig)
  // The sliding layers' own RoPE (default type): rope_local_base_freq, or v5's rope_parameters
  // {"full_attention": {...}, "sliding_attention": {...}} (Gemma3TextConfig)
  bool local_rope_fields = false;
  double default_local_rope_theta = 10000;
  // query_pre_attn_scalar (the softmax scale is its -1/2 power), attn_logit_softcapping and
  // final_logit_softcapping (null or 0: none) with these defaults (Gemma2Config)
  bool attention_scale_fields = false;
  double default_query_pre_attn_scalar = 256;
  double default_attn_logit_softcapping = 0;
  double default_final_logit_softcapping = 0;
  bool default_tie_word_embeddings = false;
  // The rope_parameters a config without rope_parameters / rope_scaling has (JSON; empty: the
  // default type with rope_theta). GptOssConfig: YaRN x32 over 4096 positions.
  std::string default_rope_parameters;
  // rope_type names the class reads as longrope (Phi3Config: "su", "yarn").
  std::vector<std::string> longrope_aliases;
};

// A table of rows keyed by their `model_type` (the config classes here, nn/models' families):
// "a, b, c", and the row of one (InvalidArgument listing them).
template <class Row>
std::string ModelTypesOf(const std::vector<Row>& rows) {
  std::string out;
  for (const Row& r : rows) absl::StrAppend(&out, out.empty() ? "" : ", ", r.model_type);
  return out;
}
template <class Row>
absl::StatusOr<const Row*> FindModelType(const std::vector<Row>& rows, absl::string_view model_type) {
  for (const Row& r : rows) {
    if (r.model_type == model_type) return &r;
  }
  return absl::InvalidArgumentError(absl::StrCat("model_type \"", model_type, "\" is not supported (supported: ",
                                                 ModelTypesOf(rows), ")"));
}

// Every config class, in hf_config.cc's order.
const std::vector<DecoderConfigClass>& DecoderConfigClasses();
// "llama, mistral, qwen2, qwen3, phi3, mixtral, qwen3_moe, deepseek_v2, minicpm5_moe, gemma,
// olmo2, gemma2, gemma3_text, gpt_oss".
std::string DecoderModelTypes();
// The class of a config.json "model_type"; InvalidArgument listing the supported ones.
absl::StatusOr<const DecoderConfigClass*> FindDecoderConfigClass(absl::string_view model_type);
// The class a GGUF's general.architecture names: the first of the architecture with (`experts`)
// or without experts, since llama.cpp writes Mistral as llama, with nothing that differs, and
// Mixtral as llama with experts; Unimplemented listing the supported architectures.
absl::StatusOr<const DecoderConfigClass*> FindGgufConfigClass(absl::string_view arch,
                                                              bool experts = false);

// The values of a config.json (or of a GGUF's metadata), as its class reads them.
struct DecoderConfig {
  std::string model_type = "llama";  // a DecoderConfigClass's
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  std::string hidden_act = "silu";
  bool attention_bias = false;
  bool mlp_bias = false;
  bool tie_word_embeddings = false;
  // The shortest sliding window of any layer (Note [Sliding windows]); 0: every layer attends to
  // the whole sequence. sliding_from: the first layer that slides (Qwen's max_window_layers).
  int64_t sliding_window = 0;
  int64_t sliding_from = 0;
  // Attended windows per layer (0: full), for classes whose windows dtensor computes
  // (SlidingWindowFields::kLayerTypes); empty otherwise.
  std::vector<int64_t> layer_windows;
  // Gemma 2's attention (DecoderConfigClass::attention_scale_fields); 0: none / 1/sqrt(head_dim).
  double query_pre_attn_scalar = 0;
  // The RoPE base of the sliding layers (default rope type; Gemma 3); 0: every layer rope_theta's.
  double local_rope_theta = 0;
  double attn_logit_softcapping = 0;
  double final_logit_softcapping = 0;
  DType dtype = DType::kF32;  // torch_dtype
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  // ---- mixture of experts (0 experts: every layer dense)
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  int64_t first_k_dense_replace = 0;
  int64_t n_shared_experts = 0;
  std::vector<bool> mlp_sparse;  // mlp_layer_types == "sparse" per layer; empty: from
                                 // first_k_dense_replace, decoder_sparse_step, mlp_only_layers
  int64_t n_group = 1;           // Note [Sigmoid group routing] in nn/moe.h
  int64_t topk_group = 1;
  // The experts' clamped SwiGLU (ExpertFields::kSwigluLimit; Note [gpt-oss experts] in
  // nn/moe.h); 0: the family's act(gate) · up.
  double swiglu_limit = 0;
  double swiglu_alpha = 0;
  // ---- latent attention; head_dim is qk_rope_head_dim
  int64_t q_lora_rank = 0;  // 0: a plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  bool operator==(const DecoderConfig&) const = default;

  // The class of model_type (FindDecoderConfigClass; Llama's when model_type is not one).
  const DecoderConfigClass& config_class() const;
  // Which attention projections the checkpoint holds biases for, by class and config.
  bool qkv_bias() const { return attention_bias || config_class().qkv_bias; }
  bool o_bias() const { return attention_bias; }
  // Whether layer `layer` has a sparse MoE block, as the fields every class spells say it: with
  // experts, mlp_sparse[layer] when the list is given, else layer >= first_k_dense_replace, (layer
  // + 1) % decoder_sparse_step == 0 and layer not in mlp_only_layers (each class reads only its
  // own of these; the others keep their defaults, which select every layer).
  bool IsMoeLayer(int64_t layer) const;
  // Whether any layer is sparse / dense (closed forms: a config may claim 10^9 layers before the
  // checkpoint refutes it, Note [Config against checkpoint] in nn/load.h).
  bool HasMoeLayers() const;
  bool HasDenseLayers() const;
  // "qwen3: L=4 H=64 I=172 heads=8/4 head_dim=8 V=384 rope=llama3(x8) f32 untied".
  std::string Summary() const;
};
// The name the config had when Llama was the only family; the same type.
using LlamaConfig = DecoderConfig;

// ---- reading (hf_config_read.cc)
// `what` names the source in messages (usually the path).
absl::StatusOr<DecoderConfig> ParseDecoderConfig(absl::string_view json, absl::string_view what);
// `path`: config.json or the directory holding it, or a GGUF file (by its magic or a .gguf name:
// loaders/gguf_llama.h).
absl::StatusOr<DecoderConfig> LoadDecoderConfig(const std::string& path);

// ---- writing (hf_config_write.cc)
// The config as transformers writes it for its class (v4 spelling: torch_dtype, rope_theta,
// rope_scaling), readable by the class and by ParseDecoderConfig.
std::string DecoderConfigToJson(const DecoderConfig& config);

// The config's rope numbers (loaders/rope.h: ComputeRope, RopeSchedule).
RopeSpec DecoderRopeSpec(const DecoderConfig& config);

// The names from before the other families (issue 31), kept for existing callers.
inline absl::StatusOr<DecoderConfig> ParseLlamaConfig(absl::string_view json,
                                                      absl::string_view what) {
  return ParseDecoderConfig(json, what);
}
inline absl::StatusOr<DecoderConfig> LoadLlamaConfig(const std::string& path) {
  return LoadDecoderConfig(path);
}
inline std::string LlamaConfigToJson(const DecoderConfig& config) {
  return DecoderConfigToJson(config);
}
inline RopeSpec LlamaRopeSpec(const DecoderConfig& config) { return DecoderRopeSpec(config); }

}  // namespace dt::loaders
