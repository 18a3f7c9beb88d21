#include "dtensor/loaders/hf_config.h"

#include <algorithm>

namespace dt::loaders {

const DecoderFamily& DecoderConfig::family() const {
  absl::StatusOr<const DecoderFamily*> f = FindDecoderFamily(model_type);
  return f.ok() ? **f : DecoderFamilies().front();
}

bool DecoderConfig::IsMoeLayer(int64_t layer) const {
  switch (family().moe_layers) {
    case MoeLayers::kNone:
      return false;
    case MoeLayers::kAll:
      return true;
    case MoeLayers::kSparseStep:
      return std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) ==
                 mlp_only_layers.end() &&
             (layer + 1) % decoder_sparse_step == 0;
    case MoeLayers::kAfterDense:
      return layer >= first_k_dense_replace;
    case MoeLayers::kLayerTypes:
      if (mlp_sparse.empty()) return layer >= first_k_dense_replace;
      return layer >= 0 && layer < static_cast<int64_t>(mlp_sparse.size()) && mlp_sparse[layer];
  }
  return false;
}

// Closed forms (a config may claim 10^9 layers before the checkpoint refutes it: Note [Config
// against checkpoint] in nn/load.h).
bool DecoderConfig::HasMoeLayers() const {
  const int64_t l = num_hidden_layers;
  switch (family().moe_layers) {
    case MoeLayers::kNone:
      return false;
    case MoeLayers::kAll:
      return l > 0;
    case MoeLayers::kAfterDense:
      return first_k_dense_replace < l;
    case MoeLayers::kLayerTypes:
      if (mlp_sparse.empty()) return first_k_dense_replace < l;
      return std::find(mlp_sparse.begin(), mlp_sparse.end(), true) != mlp_sparse.end();
    case MoeLayers::kSparseStep:
      // The sparse candidates are step - 1, 2·step - 1, ...; mlp_only_layers removes finitely many.
      for (int64_t i = decoder_sparse_step - 1; i < l; i += decoder_sparse_step) {
        if (IsMoeLayer(i)) return true;
      }
      return false;
  }
  return false;
}

bool DecoderConfig::HasDenseLayers() const {
  const int64_t l = num_hidden_layers;
  switch (family().moe_layers) {
    case MoeLayers::kNone:
      return l > 0;
    case MoeLayers::kAll:
      return false;
    case MoeLayers::kAfterDense:
      return first_k_dense_replace > 0 && l > 0;
    case MoeLayers::kLayerTypes:
      if (mlp_sparse.empty()) return first_k_dense_replace > 0 && l > 0;
      return std::find(mlp_sparse.begin(), mlp_sparse.end(), false) != mlp_sparse.end();
    case MoeLayers::kSparseStep:
      return l > 0 && (decoder_sparse_step > 1 || !mlp_only_layers.empty());
  }
  return false;
}

int64_t DecoderConfig::NumParameters() const {
  const int64_t h = hidden_size, q = num_attention_heads * head_dim,
                kv = num_key_value_heads * head_dim, i = intermediate_size;
  int64_t attention = h * q + 2 * h * kv + q * h;
  if (family().latent_attention) {
    const int64_t heads = num_attention_heads, qk = qk_nope_head_dim + qk_rope_head_dim;
    attention = (q_lora_rank > 0 ? h * q_lora_rank + q_lora_rank + q_lora_rank * heads * qk
                                 : h * heads * qk) +
                h * (kv_lora_rank + qk_rope_head_dim) + kv_lora_rank +
                kv_lora_rank * heads * (qk_nope_head_dim + v_head_dim) + heads * v_head_dim * h;
    if (attention_bias) attention += (q_lora_rank > 0 ? q_lora_rank : 0) + kv_lora_rank +
                                     qk_rope_head_dim + h;
  } else {
    if (family().gated_attention) attention += h * q + (qkv_bias() ? q : 0);  // the gate rows
    if (qkv_bias()) attention += q + 2 * kv;
    if (o_bias()) attention += h;
    if (family().qk_norm) attention += 2 * head_dim;
  }
  const int64_t dense = 3 * h * i + (mlp_bias ? 2 * i + h : 0);
  const int64_t shared = n_shared_experts * moe_intermediate_size;
  const int64_t router_bias =
      family().topk_weights == TopKWeights::kSigmoidGroups ? num_experts : 0;
  const int64_t sparse = num_experts * h + router_bias + num_experts * 3 * h * moe_intermediate_size +
                         (shared > 0 ? 3 * h * shared + (mlp_bias ? 2 * shared + h : 0) : 0);
  int64_t layers = 0;
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    layers += attention + 2 * h + (IsMoeLayer(l) ? sparse : dense);
  }
  return vocab_size * h * (tie_word_embeddings ? 1 : 2) + layers + h;
}

RopeSpec DecoderRopeSpec(const DecoderConfig& c) {
  return RopeSpec{c.rope_scaling, c.head_dim, c.rope_theta, c.max_position_embeddings};
}

}  // namespace dt::loaders
