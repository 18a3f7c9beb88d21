#pragma once
// The decoder families dtensor runs, each described by the switches in which its layers differ
// from Llama's. One model class (nn/models/causal_lm.h) is assembled from a family's description;
// loaders/hf_config.h reads the family's config.json and loaders/gguf_decoder.h its GGUF files.
//
//   model_type  biases              q/k norm   fused projections        head_dim    GGUF arch
//   llama       attention_bias (q/k/v/o), mlp_bias                      hidden/heads  llama
//   mistral     none                                                    hidden/heads  llama
//   qwen2       q/k/v always, o none                                    hidden/heads  qwen2
//   qwen3       attention_bias (q/k/v/o)  q_norm, k_norm                128          qwen3
//   phi3        none                           qkv_proj [Q|K|V],        hidden/heads  phi3
//                                              gate_up_proj [gate|up]
//   mixtral     none; every layer a sparse MoE block (Note [MoE blocks])  hidden/heads  llama
//                                                                                     + experts
//   qwen3_moe   as qwen3; sparse layers by decoder_sparse_step / mlp_only_layers       qwen3moe
//   deepseek_v2 multi-head latent attention (nn/latent_attention.h);                  (none)
//               layers from first_k_dense_replace sparse, with
//               shared experts; head_dim is qk_rope_head_dim, RoPE on interleaved pairs
//   minicpm5_moe gated attention (q_gate_proj [q | gate] per head, stored as   128      (none)
//               q_proj: Note
//               [Gated attention] in nn/attention.h), k/v unit_colwise; sparse layers by
//               mlp_layer_types with shared experts and DeepSeek-V3's sigmoid group router
//
// Every family: pre-norm decoder layers (RMSNorm -> attention -> residual, RMSNorm -> gated MLP
// act(gate)·up -> residual), rotate_half RoPE with the config's rope type, GQA, an optional tied
// lm_head. Sliding windows (Mistral's sliding_window, Qwen's use_sliding_window, Phi-3's
// sliding_window) are read into one number, the shortest window any layer uses: within it
// attention is full, and the model refuses a longer sequence (Note [Sliding windows]).
//
// Tensor-parallel plans are transformers' `base_model_tp_plan` of each family under the causal
// LM's `model.` prefix, plus `lm_head: colwise_gather_output` (its `_tp_plan`), with one
// departure: Phi-3's fused projections are `packed_colwise` block shards (qkv_proj
// _S(0,[Hq·d, Hkv·d, Hkv·d]), gate_up_proj _S(0,[I, I])) and their consumers plain `rowwise`,
// instead of transformers' `colwise_gather_output` + `rowwise_split_input`, which gathers
// the whole projection output on every rank of every layer only to slice it again (Note
// [Packed blocks] in nn/styles.h says why a block shard gathers back to the checkpoint layout).
//
// Note [Adding a family]
// A family that differs from Llama only in these switches is one row of the table in
// decoder_family.cc plus its fixture (tools/reference/make_zoo_fixtures.py, or
// make_moe_fixtures.py for experts and latent attention) and its test rows
// (tests/models/zoo_test.cc, moe_test.cc). Other kinds of blocks branch where the decoder layer
// builds its attention and MLP (MakeAttention / MakeMlp in nn/models/causal_lm.cc), which get the
// layer index for families whose layers differ: a MoE block (nn/moe.h) where the config makes the
// layer sparse (DecoderConfig::IsMoeLayer), latent attention (nn/latent_attention.h) where the
// family says so.
//
// Note [MoE blocks]
// A sparse layer's MLP is transformers 5's block: a router `mlp.gate` (Linear [E, H], softmax over
// the experts, top-k) and the experts as two stacked tensors, `mlp.experts.gate_up_proj`
// [E, 2I, H] (rows gate | up per expert) and `mlp.experts.down_proj` [E, H, I]; DeepSeek adds
// `mlp.shared_experts` (a gated MLP every token goes through). Hub checkpoints store each expert's
// projections separately (Mixtral: block_sparse_moe.experts.{e}.w1 / w3 / w2 and
// block_sparse_moe.gate; the others: mlp.experts.{e}.gate_proj / up_proj / down_proj); they are
// fused on load as transformers 5 does (loaders/moe_checkpoint.h), each rank reading only its
// ranges of each expert tensor. The family's switches say how the router weighs the top k:
//
//   family       which layers are sparse                 top-k weights
//   mixtral      all                                     softmax, renormalised over the k
//   qwen3_moe    (i + 1) % decoder_sparse_step == 0,     softmax, renormalised when
//                unless i is in mlp_only_layers          norm_topk_prob
//   deepseek_v2  i >= first_k_dense_replace              softmax in f32 (router weight f32),
//                                                        times routed_scaling_factor
//   minicpm5_moe mlp_layer_types[i] == "sparse" (else    sigmoid scores chosen with
//                i >= first_k_dense_replace, default 1)  e_score_correction_bias among the
//                                                        topk_group best of n_group groups,
//                                                        renormalised when norm_topk_prob,
//                                                        times routed_scaling_factor (Note
//                                                        [Sigmoid group routing] in nn/moe.h)
//
// Plans: the attention's as the dense family's, and transformers' expert entries
// (gate_up_proj packed_colwise: each rank holds matching gate and up rows of every expert;
// down_proj rowwise; the experts module moe_tp_experts: one all_reduce of the partial sum), the
// router and the norms replicated. transformers 5.25 itself leaves the experts out of these
// families' TP plans, so every rank would hold every expert; here no rank holds a piece of an
// expert that is not its own. Expert parallelism (ep_plan, DistributedConfig::ep_size) shards the
// expert dim instead (or as well, on an (ep, tp) mesh): nn/expert_parallel.h.

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dt::loaders {

// How a family reads sliding-window fields from config.json (transformers' semantics).
enum class SlidingWindowFields {
  kNone,     // the family has none (Llama: a sliding_window key is not read by transformers)
  kAll,      // sliding_window (int or null) applies to every layer (Mistral, Phi-3)
  kQwen,     // use_sliding_window, sliding_window, max_window_layers, layer_types (Qwen2, Qwen3)
};

// Which decoder layers have a sparse mixture-of-experts MLP (Note [MoE blocks]).
enum class MoeLayers : uint8_t {
  kNone,        // every layer dense
  kAll,         // Mixtral
  kSparseStep,  // Qwen3-MoE: decoder_sparse_step, mlp_only_layers
  kAfterDense,  // DeepSeek-V2: first_k_dense_replace
  kLayerTypes,  // MiniCPM5-MoE: mlp_layer_types ("dense" / "sparse"), else first_k_dense_replace
};

// How the router turns the top-k softmax probabilities into the experts' weights.
enum class TopKWeights : uint8_t {
  kNormalized,  // divided by their sum (Mixtral)
  kConfig,      // divided by their sum when norm_topk_prob (Qwen3-MoE)
  kScaled,      // times routed_scaling_factor (DeepSeek-V2)
  kSigmoidGroups,  // DeepSeek-V3's router (Note [Sigmoid group routing] in nn/moe.h)
};

// Whether `experts` in `groups` groups, the `topk_groups` best of them eligible, can give `top_k`:
// the groups divide the experts and hold 2 or more each (a group's score is its two best), and
// the eligible groups hold top_k experts or more. The one rule both the config reader and the
// router (nn/moe.cc) check; each words its own refusal.
constexpr bool SigmoidGroupsFit(int64_t experts, int64_t groups, int64_t topk_groups,
                                int64_t top_k) {
  return groups > 0 && topk_groups > 0 && experts % groups == 0 && experts / groups >= 2 &&
         topk_groups <= groups && top_k <= topk_groups * (experts / groups);
}

struct DecoderFamily {
  std::string model_type;         // config.json's "model_type": "qwen3"
  std::string architecture;       // transformers' class, written to config.json: "Qwen3ForCausalLM"
  std::string gguf_architecture;  // llama.cpp's general.architecture ("llama" for Mistral too);
                                  // empty: no GGUF reader

  // ---- attention
  bool attention_bias_field = false;  // config "attention_bias" gives q/k/v/o biases
  bool qkv_bias = false;              // q/k/v biases whatever the config says (Qwen2); no o bias
  bool qk_norm = false;               // RMSNorm over head_dim on q and k before RoPE (Qwen3)
  bool fused_qkv = false;             // one qkv_proj whose rows are [Q | K | V] (Phi-3)
  bool latent_attention = false;      // DeepSeek's MLA (nn/latent_attention.h)
  // q_gate_proj [q | gate] per head and a sigmoid gate on the output (Note [Gated attention] in
  // nn/attention.h); checkpoints store it as self_attn.q_proj (transformers renames on load).
  bool gated_attention = false;
  bool rotary_interleaved = false;    // RoPE on pairs (x[2j], x[2j+1]) instead of rotate_half
  int64_t default_head_dim = 0;       // when config.json has none; 0: hidden_size / heads
  // ---- MLP
  bool mlp_bias_field = false;  // config "mlp_bias" gives gate/up/down biases (Llama, DeepSeek)
  bool fused_gate_up = false;   // one gate_up_proj whose rows are [gate | up] (Phi-3)
  // ---- mixture of experts (Note [MoE blocks])
  MoeLayers moe_layers = MoeLayers::kNone;
  TopKWeights topk_weights = TopKWeights::kNormalized;
  bool router_f32 = false;      // the router's weight and logits in f32 (DeepSeek)
  bool shared_experts = false;  // n_shared_experts experts every token uses (DeepSeek)
  // Hub checkpoint names under model.layers.{i}.: the block ("block_sparse_moe.gate.weight",
  // "block_sparse_moe.experts.{e}.w1.weight") and each expert's gate, up and down projections.
  std::string moe_checkpoint_block = "mlp";
  std::array<std::string, 3> expert_checkpoint_names = {"gate_proj", "up_proj", "down_proj"};
  // ---- config.json
  int64_t default_max_position_embeddings = 2048;
  double default_rms_norm_eps = 1e-6;
  double default_rope_theta = 10000.0;
  SlidingWindowFields sliding_window = SlidingWindowFields::kNone;
  int64_t default_sliding_window = 0;  // kAll when the key is absent (Mistral: 4096); 0: none
  // rope_type names transformers maps to longrope for this family (Phi-3: "su", "yarn").
  std::vector<std::string> longrope_aliases;
  // The plan (see the file comment): {key, style name}, keys from the causal LM's root. tp_plan:
  // attention, the vocab and what every layer has; mlp_plan: a dense layer's MLP (used when a
  // layer is dense); moe_plan: a sparse layer's block (used when a layer is sparse); ep_plan:
  // expert parallelism (nn/expert_parallel.h: transformers' base_model_ep_plan) and
  // ep_all_reduce_plan, its alternative that masks the router instead of moving tokens.
  std::vector<std::pair<std::string, std::string>> tp_plan;
  std::vector<std::pair<std::string, std::string>> mlp_plan;
  std::vector<std::pair<std::string, std::string>> moe_plan;
  std::vector<std::pair<std::string, std::string>> ep_plan;
  std::vector<std::pair<std::string, std::string>> ep_all_reduce_plan;

  bool moe() const { return moe_layers != MoeLayers::kNone; }
};

// Every family, in the order of the file comment's table.
const std::vector<DecoderFamily>& DecoderFamilies();
// "llama, mistral, qwen2, qwen3, phi3, mixtral, qwen3_moe, deepseek_v2, minicpm5_moe".
std::string DecoderFamilyNames();
// The family of a config.json "model_type"; InvalidArgument listing the supported ones.
absl::StatusOr<const DecoderFamily*> FindDecoderFamily(absl::string_view model_type);
// The family a GGUF's general.architecture names ("llama" is Llama: llama.cpp also writes Mistral
// as llama, with nothing that differs, and Mixtral as llama with experts: `experts` picks the
// first family of the architecture with or without a MoE block); Unimplemented listing the
// supported architectures.
absl::StatusOr<const DecoderFamily*> FindGgufDecoderFamily(absl::string_view arch,
                                                           bool experts = false);

}  // namespace dt::loaders
