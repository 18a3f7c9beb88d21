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
// decoder_family.cc plus its fixture (tools/reference/make_zoo_fixtures.py) and its test rows
// (tests/models/zoo_test.cc). A family with another kind of block (mixture-of-experts MLPs,
// multi-head latent attention) adds its switches here and its branch where the decoder layer
// builds its attention and MLP (MakeAttention / MakeMlp in nn/models/causal_lm.cc), which get the
// layer index for families whose layers differ.

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

struct DecoderFamily {
  std::string model_type;         // config.json's "model_type": "qwen3"
  std::string architecture;       // transformers' class, written to config.json: "Qwen3ForCausalLM"
  std::string gguf_architecture;  // llama.cpp's general.architecture ("llama" for Mistral too)

  // ---- attention
  bool attention_bias_field = false;  // config "attention_bias" gives q/k/v/o biases
  bool qkv_bias = false;              // q/k/v biases whatever the config says (Qwen2); no o bias
  bool qk_norm = false;               // RMSNorm over head_dim on q and k before RoPE (Qwen3)
  bool fused_qkv = false;             // one qkv_proj whose rows are [Q | K | V] (Phi-3)
  int64_t default_head_dim = 0;       // when config.json has none; 0: hidden_size / heads
  // ---- MLP
  bool mlp_bias_field = false;  // config "mlp_bias" gives gate/up/down biases (Llama)
  bool fused_gate_up = false;   // one gate_up_proj whose rows are [gate | up] (Phi-3)
  // ---- config.json
  int64_t default_max_position_embeddings = 2048;
  double default_rms_norm_eps = 1e-6;
  SlidingWindowFields sliding_window = SlidingWindowFields::kNone;
  int64_t default_sliding_window = 0;  // kAll when the key is absent (Mistral: 4096); 0: none
  // rope_type names transformers maps to longrope for this family (Phi-3: "su", "yarn").
  std::vector<std::string> longrope_aliases;
  // The plan (see the file comment): {key, style name}, keys from the causal LM's root.
  std::vector<std::pair<std::string, std::string>> tp_plan;
};

// Every family, in the order of the file comment's table.
const std::vector<DecoderFamily>& DecoderFamilies();
// "llama, mistral, qwen2, qwen3, phi3".
std::string DecoderFamilyNames();
// The family of a config.json "model_type"; InvalidArgument listing the supported ones.
absl::StatusOr<const DecoderFamily*> FindDecoderFamily(absl::string_view model_type);
// The family a GGUF's general.architecture names ("llama" is Llama: llama.cpp also writes Mistral
// as llama, with nothing that differs); Unimplemented listing the supported architectures.
absl::StatusOr<const DecoderFamily*> FindGgufDecoderFamily(absl::string_view arch);

}  // namespace dt::loaders
