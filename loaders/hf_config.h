#pragma once
// Hugging Face `config.json` of the decoder families (loaders/decoder_family.h: Llama, Mistral,
// Qwen2, Qwen3, Phi-3), in transformers' v4 and v5 spellings.
//
//   field                        required  default / notes
//   model_type                   no        "llama"; one of the families, else an error listing them
//   vocab_size                   yes
//   hidden_size                  yes
//   intermediate_size            yes
//   num_hidden_layers            yes
//   num_attention_heads          yes       hidden_size % heads == 0 unless head_dim is given
//   num_key_value_heads          no        num_attention_heads; must divide it (GQA)
//   head_dim                     no        the family's (hidden_size / heads; Qwen3: 128); even
//   max_position_embeddings      no        the family's (Llama 2048, Mistral 131072, Qwen 32768,
//                                          Phi-3 4096)
//   rms_norm_eps                 no        the family's (1e-6; Phi-3 1e-5)
//   rope_theta                   no        10000 (v5: rope_parameters.rope_theta)
//   rope_scaling | rope_parameters no      null -> default; rope_type (legacy key "type"):
//                                          default, linear, dynamic, yarn, longrope, llama3
//                                          with their parameters (loaders/rope.h); a key the
//                                          type does not take is an error. Both given and
//                                          different, or a top-level rope_theta that differs
//                                          from rope_parameters.rope_theta: an error naming both.
//                                          Phi-3 reads "su" and "yarn" as longrope (transformers)
//   original_max_position_embeddings no    top level (Phi-3 style): longrope/yarn/llama3's value
//   hidden_act                   no        "silu"; the model accepts the gated MLP's activations
//                                          (nn/mlp.h ParseActivation) and refuses the others
//   attention_bias               no        false; Llama and Qwen3 (q/k/v/o); Qwen2 always has
//                                          q/k/v biases; the others have none
//   mlp_bias                     no        false; Llama only
//   sliding_window, use_sliding_window, max_window_layers, layer_types
//                                no        by family (decoder_family.h): the shortest window a
//                                          layer uses, see Note [Sliding windows]
//   tie_word_embeddings          no        false (true: no lm_head.weight; it is embed_tokens)
//   torch_dtype | dtype          no        "float32"; float32, bfloat16, float16
//   bos_token_id, eos_token_id   no        unset; eos may be a list (Llama-3.1)
//
// Mixture-of-experts families (decoder_family.h, Note [MoE blocks]) read their experts:
//   num_local_experts (Mixtral) | num_experts (Qwen3-MoE; num_local_experts as v5 writes it)
//                | n_routed_experts (DeepSeek)          the routed experts E (required, >= 2)
//   num_experts_per_tok          Mixtral 2, Qwen3-MoE 8, DeepSeek required; <= E
//   moe_intermediate_size        each expert's size (Mixtral: intermediate_size)
//   norm_topk_prob               Qwen3-MoE (false); DeepSeek-V2 refuses true (transformers ignores
//                                it, DeepSeek's own code renormalises: ambiguous)
//   decoder_sparse_step, mlp_only_layers   Qwen3-MoE (1, [])
//   first_k_dense_replace, n_shared_experts, routed_scaling_factor, topk_method ("greedy")
//                                DeepSeek (0, required, 1.0); n_group / topk_group need
//                                group_limited_greedy, which is refused
//   mlp_layer_types ("dense" / "sparse" per layer; else first_k_dense_replace, 1),
//   n_routed_experts (160), num_experts_per_tok (16), moe_intermediate_size (512),
//   n_shared_experts (1), norm_topk_prob (true), routed_scaling_factor (3.66), n_group and
//   topk_group (1; groups must divide the experts, hold 2 or more each, and the topk_group best
//   at least num_experts_per_tok experts)
//                                MiniCPM5-MoE; use_gated_attention false is refused (its
//                                attention is always gated, as transformers says)
// and DeepSeek's latent attention q_lora_rank (null: q_proj), kv_lora_rank, qk_nope_head_dim,
// qk_rope_head_dim (the RoPE head_dim), v_head_dim; num_key_value_heads must equal the heads.
// Training-only fields (router_aux_loss_coef, router_jitter_noise, output_router_logits) change
// nothing at inference and are ignored.
//
// Fields that change the computation and that the family does not implement (partial rotary,
// logit soft-capping, experts, latent attention, quantization_config, ...) are refused by name
// (Unimplemented), never ignored. Errors are InvalidArgument naming the file and the field with
// its value:
//   "config 'tiny/config.json': num_key_value_heads 3 must divide num_attention_heads 8"
//
// Note [Sliding windows]
// transformers masks key j from query i when i - j >= window (masking_utils'
// sliding_window_overlay), so a sequence of at most `window` tokens attends exactly as full
// attention does. dtensor has no sliding-window kernel: DecoderConfig keeps the shortest window of
// any layer, and the model refuses (naming it) a forward whose positions would reach past it,
// rather than compute full attention where the checkpoint expects a window.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dtensor/core/dtype.h"
#include "dtensor/loaders/decoder_family.h"
#include "dtensor/loaders/rope.h"

namespace dt::loaders {

struct DecoderConfig {
  std::string model_type = "llama";  // a DecoderFamily's
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
  std::vector<bool> mlp_sparse;  // mlp_layer_types == "sparse" per layer (MiniCPM5-MoE); empty:
                                 // from first_k_dense_replace
  int64_t n_group = 1;           // Note [Sigmoid group routing] in nn/moe.h
  int64_t topk_group = 1;
  // ---- latent attention (DeepSeek); head_dim is qk_rope_head_dim
  int64_t q_lora_rank = 0;  // 0: a plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  bool operator==(const DecoderConfig&) const = default;

  // The family of model_type (FindDecoderFamily; Llama's when model_type is not one).
  const DecoderFamily& family() const;
  // Which projections have biases, by family and config (decoder_family.h).
  bool qkv_bias() const { return attention_bias || family().qkv_bias; }
  bool o_bias() const { return attention_bias; }
  // Whether layer `layer` has a sparse MoE block (Note [MoE blocks] in decoder_family.h).
  bool IsMoeLayer(int64_t layer) const;
  // Whether any layer is sparse / dense.
  bool HasMoeLayers() const;
  bool HasDenseLayers() const;
  // Parameters of the whole model (embeddings and lm_head included, lm_head once when tied).
  int64_t NumParameters() const;
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
// The config as transformers writes it for its family (v4 spelling: torch_dtype, rope_theta,
// rope_scaling), readable by the family's config class and by ParseDecoderConfig.
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
