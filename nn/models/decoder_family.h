#pragma once
// The decoder families dtensor runs, each described by the switches in which its layers differ
// from Llama's. One model class (nn/models/causal_lm.h) is assembled from a family's description
// and the config its files give (loaders/hf_config.h for config.json, loaders/gguf_llama.h for
// GGUF).
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
//   deepseek_v2 multi-head latent attention (nn/latent_attention.h); layers   (none)
//               from first_k_dense_replace sparse, with shared experts; head_dim is
//               qk_rope_head_dim, RoPE on interleaved pairs
//   minicpm5_moe gated attention (q_gate_proj [q | gate] per head, stored as   128      (none)
//               q_proj: Note [Gated attention] in nn/attention.h), k/v unit_colwise; sparse
//               layers by mlp_layer_types with shared experts and DeepSeek-V3's sigmoid group
//               router
//   gemma       attention_bias; GeGLU (gelu_pytorch_tanh), embeddings times      256      gemma
//               √hidden (rounded to the embedding dtype), every RMSNorm (1 + w) in f32, tied
//   olmo2       attention_bias; post-norms (Note [Layer norms]), q_norm / k_norm  hidden/  olmo2
//               over the whole projection [nH·D] / [nKV·D], every RMSNorm scaled  heads
//               in f32; the q/k norms under tp: Note [A norm over a sharded dim] in nn/norm.h
//   gemma2      as gemma, with pre- and post-norms (Note [Layer norms]); the config's   256   gemma2
//               attention scale (query_pre_attn_scalar), soft-caps (attention scores,
//               final logits) and sliding windows per layer (layer_types), attended as
//               windows (nn::AttentionOptions: scale, softcap, window)
//   gemma3_text as gemma2 (soft-caps off by default), with per-head q_norm / k_norm    256   gemma3
//               ((1 + w)) and the sliding layers' own RoPE base (rope_local_base_freq,
//               default rope; the full layers' rope_theta with the config's scaling)
//   gpt_oss     attention_bias (true by default); learned sinks per head; sliding    64     (none)
//               windows per layer (layer_types: every other layer); YaRN RoPE; every
//               layer sparse: a router with a bias (mlp.router), experts stored [E, H, 2I]
//               with interleaved gate/up columns and biases, the clamped SwiGLU (Note
//               [gpt-oss experts] in nn/moe.h). MXFP4 checkpoints are refused
//               (quantization_config)
//
// Every family: decoder layers with residuals around attention and a gated MLP act(gate)·up
// (normalized as the family's LayerNorms say), rotate_half RoPE with the config's rope type, GQA,
// an optional tied lm_head.
//
// Note [Layer norms]
// Where a decoder layer normalizes (DecoderFamily::layer_norms), with transformers' names:
//   kPre         h + attn(input_layernorm(h)); then r + mlp(post_attention_layernorm(r))
//                (Llama and the others; post_attention_layernorm is the MLP's pre-norm)
//   kPost        h + post_attention_layernorm(attn(h)); then r + post_feedforward_layernorm(mlp(r))
//                (OLMo 2: no input norm; each sublayer's output normalized before the add)
//   kPreAndPost  h + post_attention_layernorm(attn(input_layernorm(h))); then
//                r + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(r))) (Gemma 2, 3) Sliding windows (Mistral's sliding_window, Qwen's use_sliding_window, Phi-3's
// sliding_window) are read into one number, the shortest window any layer uses: within it
// attention is full, and the model refuses a longer sequence (Note [Sliding windows] in
// loaders/hf_config.h).
//
// Tensor-parallel plans are transformers' `base_model_tp_plan` of each family under the causal
// LM's `model.` prefix, plus `lm_head: colwise_gather_output` (its `_tp_plan`), with one
// departure: Phi-3's fused projections are `packed_colwise` block shards (qkv_proj
// _S(0,[Hq·d, Hkv·d, Hkv·d]), gate_up_proj _S(0,[I, I])) and their consumers plain `rowwise`,
// instead of transformers' `colwise_gather_output` + `rowwise_split_input`, which gathers
// the whole projection output on every rank of every layer only to slice it again (Note
// [Packed blocks] in nn/styles.h says why a block shard gathers back to the checkpoint layout).
// (OLMo 2's q/k norms and the experts of the MoE families depart too: see their rows.) gpt-oss's
// transformers plan splits only the vocab (embed_tokens embedding_rowwise, lm_head); here its
// attention is split as every family's and its experts inside each rank's share (Note [gpt-oss
// experts] in nn/moe.h), computing the same logits with no rank holding the whole model.
//
// Note [Config classes and families]
// A decoder model_type has two descriptions. Its config class (loaders::DecoderConfigClass, the
// table in loaders/hf_config.cc) is a file format: which config.json fields transformers' config
// class reads and their defaults, how it writes them back, the GGUF architecture llama.cpp writes
// it as, how Hub checkpoints name its experts. The config struct (loaders::DecoderConfig) holds
// the values those files give and lives with its readers in loaders/, with what the values alone
// say (which layers are sparse, which projections have biases). Its family (DecoderFamily below)
// is what a model computes from them: the blocks it builds, how its router scores, its plans; the
// model reads the config, never the files. loaders/ knows no family (it is below nn/), nn/ runs
// what the families ask through its own options (nn/moe.h's RouterOptions, nn/attention.h's
// AttentionOptions), and both tables list the same model_types in the same order
// (DecoderFamilies.EveryConfigClassHasItsFamily).
//
// Note [Adding a family]
// A family that differs from Llama only in these switches is one row of the table in
// decoder_family.cc, its config class's row in loaders/hf_config.cc (new config.json fields
// read in hf_config_read.cc and written in hf_config_write.cc), its fixture
// (tools/reference/make_zoo_fixtures.py, or make_moe_fixtures.py for experts and latent
// attention) and its test rows (tests/models/zoo_test.cc, moe_test.cc). A family that needs a
// new kind of block adds the block (nn/), the switch that selects it here, the branch where the
// decoder layer builds its attention and MLP (MakeAttention / MakeMlp in nn/models/causal_lm.cc,
// which get the layer index for families whose layers differ: a MoE block (nn/moe.h) where the
// config makes the layer sparse (DecoderConfig::IsMoeLayer), latent attention
// (nn/latent_attention.h) where the family says so), its golden and its test.
//
// Note [MoE blocks]
// A sparse layer's MLP is transformers 5's block: a router `mlp.gate` (Linear [E, H], softmax over
// the experts, top-k) and the experts as two stacked tensors, `mlp.experts.gate_up_proj`
// [E, 2I, H] (rows gate | up per expert) and `mlp.experts.down_proj` [E, H, I]; DeepSeek adds
// `mlp.shared_experts` (a gated MLP every token goes through). Hub checkpoints store each expert's
// projections separately (Mixtral: block_sparse_moe.experts.{e}.w1 / w3 / w2 and
// block_sparse_moe.gate; the others: mlp.experts.{e}.gate_proj / up_proj / down_proj); they are
// fused on load as transformers 5 does (loaders/moe_checkpoint.h), each rank reading only its
// ranges of each expert tensor. Which layers are sparse is the config's (its class's fields,
// loaders::ExpertFields); how the router weighs the top k is the config's norm_topk_prob and
// routed_scaling_factor with the family's router switches:
//
//   family       which layers are sparse                 top-k weights
//   mixtral      all                                     softmax, renormalised over the k
//   qwen3_moe    (i + 1) % decoder_sparse_step == 0,     softmax, renormalised when
//                unless i is in mlp_only_layers          norm_topk_prob, in the input's dtype
//   deepseek_v2  i >= first_k_dense_replace              softmax in f32 (router weight f32),
//                                                        times routed_scaling_factor
//   gpt_oss      all                                     softmax over the k chosen logits
//                                                        (the renormalised top k of softmax),
//                                                        in the input's dtype
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

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dtensor/loaders/hf_config.h"
#include "dtensor/nn/moe.h"
#include "dtensor/nn/norm.h"

namespace dt::nn {

// Note [Layer norms].
enum class LayerNorms : uint8_t { kPre, kPost, kPreAndPost };

struct DecoderFamily {
  std::string model_type;  // its config class's (loaders/hf_config.h)

  // ---- attention
  bool qk_norm = false;             // RMSNorm over head_dim on q and k before RoPE (Qwen3)
  bool fused_qkv = false;           // one qkv_proj whose rows are [Q | K | V] (Phi-3)
  bool latent_attention = false;    // DeepSeek's MLA (nn/latent_attention.h)
  // q_gate_proj [q | gate] per head and a sigmoid gate on the output (Note [Gated attention] in
  // nn/attention.h); checkpoints store it as self_attn.q_proj (transformers renames on load).
  bool gated_attention = false;
  bool rotary_interleaved = false;  // RoPE on pairs (x[2j], x[2j+1]) instead of rotate_half
  // q_norm / k_norm over the whole projection, [nH·D] and [nKV·D], before the heads are split
  // (OLMo 2; with qk_norm they are per head, Qwen3's).
  bool qk_norm_whole = false;
  bool sinks = false;  // learned sink logits per head, self_attn.sinks [nH] (gpt-oss)
  // ---- the layer and the model around it
  LayerNorms layer_norms = LayerNorms::kPre;  // Note [Layer norms]
  RMSNormForm norm_form = RMSNormForm::kRoundThenScale;  // every RMSNorm's (nn/norm.h)
  bool embed_scale = false;  // embeddings times √hidden_size in their dtype (Gemma)
  // ---- MLP
  bool fused_gate_up = false;  // one gate_up_proj whose rows are [gate | up] (Phi-3)
  // ---- a sparse layer's router (Note [MoE blocks]); normalize and scaling are the config's
  RouterScoring router_scoring = RouterScoring::kSoftmax;
  bool router_f32 = false;                     // weight and logits in f32 (DeepSeek)
  bool router_weights_in_input_dtype = false;  // the top-k weights in x's dtype (Qwen3-MoE)
  std::string router_name = "gate";            // the router's module (gpt-oss: mlp.router)
  bool router_bias = false;                    // a bias on its logits (gpt-oss)
  // How the experts are stored (nn/moe.h; gpt-oss: Note [gpt-oss experts]); their GLU is the
  // config's (swiglu_limit)
  ExpertsLayout experts_layout = ExpertsLayout::kGateUpRows;
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
};

// Every family, in the order of the file comment's table (and of loaders' config classes).
const std::vector<DecoderFamily>& DecoderFamilies();
// "llama, mistral, qwen2, qwen3, phi3, mixtral, qwen3_moe, deepseek_v2, minicpm5_moe, gemma,
// olmo2, gemma2, gemma3_text, gpt_oss".
std::string DecoderFamilyNames();
// The family of a config.json "model_type"; InvalidArgument listing the supported ones.
absl::StatusOr<const DecoderFamily*> FindDecoderFamily(absl::string_view model_type);
// The family of `config` (Llama's when its model_type is not one).
const DecoderFamily& FamilyOf(const loaders::DecoderConfig& config);

// Parameters of the family's model for `config` (embeddings and lm_head included, lm_head once
// when tied).
int64_t NumParameters(const loaders::DecoderConfig& config);

}  // namespace dt::nn
