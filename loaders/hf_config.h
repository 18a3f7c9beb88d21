#pragma once
// Hugging Face `config.json` for Llama (transformers' LlamaConfig, v4 and v5 spellings).
//
//   field                        required  default / notes
//   vocab_size                   yes
//   hidden_size                  yes
//   intermediate_size            yes
//   num_hidden_layers            yes
//   num_attention_heads          yes       hidden_size % heads == 0 unless head_dim is given
//   num_key_value_heads          no        num_attention_heads; must divide it (GQA)
//   head_dim                     no        hidden_size / num_attention_heads; even (rotary)
//   max_position_embeddings      no        2048
//   rms_norm_eps                 no        1e-6
//   rope_theta                   no        10000 (v5: rope_parameters.rope_theta)
//   rope_scaling | rope_parameters no      null -> default; rope_type (legacy key "type"):
//                                          default, linear, dynamic, yarn, longrope, llama3
//                                          with their parameters (loaders/rope.h); a key the
//                                          type does not take is an error. Both given and
//                                          different, or a top-level rope_theta that differs
//                                          from rope_parameters.rope_theta: an error naming both
//   original_max_position_embeddings no    top level (Phi-3 style): longrope/yarn/llama3's value
//   hidden_act                   no        "silu" (the only one supported)
//   attention_bias, mlp_bias     no        false
//   tie_word_embeddings          no        false (true: no lm_head.weight; it is embed_tokens)
//   torch_dtype | dtype          no        "float32"; float32, bfloat16, float16
//   model_type                   no        "llama" when present
//   bos_token_id, eos_token_id   no        unset; eos may be a list (Llama-3.1)
//
// Errors are InvalidArgument naming the file and the field with its value:
//   "config 'tiny/config.json': num_key_value_heads 3 must divide num_attention_heads 8"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dtensor/core/dtype.h"
#include "dtensor/loaders/rope.h"

namespace dt::loaders {

struct LlamaConfig {
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
  DType dtype = DType::kF32;  // torch_dtype
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;

  bool operator==(const LlamaConfig&) const = default;

  // Parameters of the whole model (embeddings and lm_head included, lm_head once when tied).
  int64_t NumParameters() const;
  // "llama: L=4 H=64 I=172 heads=8/4 head_dim=8 V=384 rope=llama3(x8) f32 untied".
  std::string Summary() const;
};

// `what` names the source in messages (usually the path).
absl::StatusOr<LlamaConfig> ParseLlamaConfig(absl::string_view json, absl::string_view what);
// `path`: config.json or the directory holding it, or a GGUF file (loaders/gguf_llama.h).
absl::StatusOr<LlamaConfig> LoadLlamaConfig(const std::string& path);
// The config as transformers writes it (v4 spelling: torch_dtype, rope_theta, rope_scaling),
// readable by LlamaConfig.from_pretrained and by ParseLlamaConfig.
std::string LlamaConfigToJson(const LlamaConfig& config);

// The config's rope numbers (loaders/rope.h: ComputeRope, RopeSchedule).
RopeSpec LlamaRopeSpec(const LlamaConfig& config);

}  // namespace dt::loaders
