#pragma once
// A decoder's config and tensor names from a GGUF file (llama.cpp's convert_hf_to_gguf layout):
// the config from the ARCH.* metadata (ARCH = general.architecture, the gguf_architecture of a
// config class in loaders/hf_config.h: llama — Mistral is written as llama too —, qwen2, qwen3,
// phi3, qwen3moe, gemma, olmo2, gemma2, gemma3) and the tensors under their Hugging Face names.
//
//   GGUF key (ARCH.)           DecoderConfig field         notes
//   block_count                num_hidden_layers           required
//   embedding_length           hidden_size                 required
//   feed_forward_length        intermediate_size           required
//   attention.head_count       num_attention_heads         required
//   attention.head_count_kv    num_key_value_heads         default: head_count
//   attention.key_length       head_dim                    default: the class's (hidden / heads);
//                                                          value_length must equal it
//   rope.dimension_count       (must equal head_dim)       partial rotary is refused
//   context_length             max_position_embeddings     default 2048
//   attention.layer_norm_rms_epsilon  rms_norm_eps         default 1e-5 (llama.cpp's)
//   rope.freq_base             rope_theta                  default 10000
//   rope.scaling.type          rope_scaling                none, or linear with rope.scaling.factor
//   rope.scaling.original_context_length, rope.scaling.attn_factor, tensors rope_factors_short /
//   rope_factors_long          Phi-3's longrope            Note [GGUF longrope]
//   vocab_size                 vocab_size                  default: tokenizer.ggml.tokens' length
//   attention.sliding_window, attention.sliding_window_pattern, attn_logit_softcapping,
//   final_logit_softcapping (gemma2, gemma3), rope.freq_base_swa (gemma3)
//                              layer_windows, soft-caps,   Note [GGUF Gemma] in gguf_llama.cc,
//                              local_rope_theta            with query_pre_attn_scalar and
//                                                          Gemma's (1 + w) norms
//   hidden_act                 the class's default        (gelu_pytorch_tanh for the Gemmas)
//   expert_count (0), expert_used_count (0), attention.value_length: accepted; any other ARCH.* key
//   is refused by name, as is a rope_freqs.weight tensor (llama 3.1's frequency factors) and an
//   architecture no config class has. tie_word_embeddings: true when there is no output.weight;
//   biases as the class has them (Qwen2's q/k/v), else refused. bos/eos:
//   tokenizer.ggml.bos_token_id, eos_token_id (and eot_token_id when it differs: both stop
//   generation). dtype: f32 (weights are dequantized on read).
//
//   GGUF tensor                HF name
//   token_embd.weight          model.embed_tokens.weight
//   output_norm.weight         model.norm.weight
//   output.weight              lm_head.weight
//   blk.N.attn_norm.weight     model.layers.N.input_layernorm.weight
//   blk.N.ffn_norm.weight      model.layers.N.post_attention_layernorm.weight, or
//                              pre_feedforward_layernorm where the layer has a
//                              post_attention_norm (Gemma 2, 3; OLMo 2 has none)
//   blk.N.post_attention_norm  model.layers.N.post_attention_layernorm.weight (OLMo 2, Gemma 2, 3)
//   blk.N.post_ffw_norm        model.layers.N.post_feedforward_layernorm.weight
//   blk.N.attn_{q,k,v}.weight  model.layers.N.self_attn.{q,k,v}_proj.weight
//   blk.N.attn_{q,k}_norm      model.layers.N.self_attn.{q,k}_norm.weight (Qwen3, Gemma 3; OLMo 2's
//                              over the whole projection)
//   blk.N.attn_qkv.weight      model.layers.N.self_attn.qkv_proj.weight (Phi-3)
//   blk.N.attn_output.weight   model.layers.N.self_attn.o_proj.weight
//   blk.N.ffn_{gate,up,down}.weight  model.layers.N.mlp.{gate,up,down}_proj.weight; an ffn_up
//                              without an ffn_gate beside it is the fused mlp.gate_up_proj (Phi-3)
//   (biases likewise: .bias)   other tensors keep their GGUF name (the loader reports them unused)
//
// Note [GGUF Q/K row order]: for the llama architecture the converter reorders the rows of each
// head of Q (and K) from Hugging Face's half-split rotary layout to llama.cpp's interleaved-pair
// one: GGUF row h*hd + 2i + s holds HF row h*hd + s*hd/2 + i (s in {0, 1}, i < hd/2). dtensor
// keeps the HF layout and its RoPE, so a read of HF rows gathers the matching GGUF rows
// (permute_heads below); a colwise shard of whole heads still reads only its own heads' rows.
// The other architectures (qwen2, qwen3, phi3, qwen3moe, the Gemmas, olmo2) keep Hugging Face's
// order (llama.cpp rotates them NEOX-style).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dtensor/loaders/gguf.h"
#include "dtensor/loaders/hf_config.h"

namespace dt::loaders {

absl::StatusOr<DecoderConfig> DecoderConfigFromGguf(const GgufFile& file);
// The tensors of `file` DecoderConfigFromGguf reads into the config (Phi-3's longrope factors,
// Note [GGUF longrope]): the model uses them, though no parameter reads them (Note [Every tensor
// is used] in nn/load.h).
std::vector<std::string> GgufConfigTensors(const GgufFile& file);
// DecoderConfigFromGguf for a llama-architecture file only (others Unimplemented).
absl::StatusOr<DecoderConfig> LlamaConfigFromGguf(const GgufFile& file);

// One tensor of a GGUF under its Hugging Face name.
struct GgufTensorName {
  std::string hf_name;
  std::string gguf_name;
  int64_t permute_heads = 0;  // > 0: rows are in llama.cpp's rotary order over this many heads
  // The file holds the Hugging Face values plus this (Gemma's norms: Note [GGUF Gemma] in
  // gguf_llama.cc); a read subtracts it.
  double norm_offset = 0;
};

// Every tensor of the file, named as above.
absl::StatusOr<std::vector<GgufTensorName>> DecoderGgufTensorNames(const GgufFile& file);
// The name from when llama was the only architecture.
inline absl::StatusOr<std::vector<GgufTensorName>> LlamaGgufTensorNames(const GgufFile& file) {
  return DecoderGgufTensorNames(file);
}

// The GGUF row holding HF row `row` of a rotary projection of `heads` heads and `rows` rows.
int64_t GgufRotaryRow(int64_t row, int64_t rows, int64_t heads);

}  // namespace dt::loaders
