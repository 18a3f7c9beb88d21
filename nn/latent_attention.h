#pragma once
// DeepSeek-V2's multi-head latent attention (MLA), transformers' DeepseekV2Attention.
//
//   LatentAttention  {x [B, S, H], cos, sin} -> {o_proj(SDPA(q, k, v)) [B, S, H]}
//
//   q       q_proj(x), or with q_lora_rank r: q_b_proj(q_a_layernorm(q_a_proj(x)))
//           [B, S, nH·(d_nope + d_rope)] -> per head [q_nope | q_pe]
//   latent  kv_a_proj_with_mqa(x) [B, S, kv_lora_rank + d_rope], split into the compressed KV
//           c [kv_lora_rank] and one RoPE key k_pe [d_rope] shared by every head
//   k, v    kv_b_proj(kv_a_layernorm(c)) [B, S, nH·(d_nope + d_v)] -> per head [k_nope | v];
//           k = [k_nope | k_pe] (k_pe the same for every head)
//   RoPE    on q_pe and k_pe only, on interleaved pairs (x[2j], x[2j+1]) as transformers'
//           complex multiply (cos, sin: [S, d_rope] from the model's RotaryEmbedding, kInterleaved)
//   SDPA    causal, scale 1/sqrt(d_nope + d_rope) unless given (times YaRN's mscale² when the
//           rope is yarn with mscale_all_dim: transformers' yarn_apply_mscale)
//
// Parameters (names as transformers'): q_proj [nH·(d_nope+d_rope), H] or q_a_proj [r, H]
// (+ bias with `bias`), q_a_layernorm [r], q_b_proj [nH·(d_nope+d_rope), r];
// kv_a_proj_with_mqa [kv_lora_rank + d_rope, H] (+ bias), kv_a_layernorm [kv_lora_rank],
// kv_b_proj [nH·(d_nope + d_v), kv_lora_rank], o_proj [H, nH·d_v] (+ bias).
//
// Plan (transformers'): q_proj / q_b_proj colwise and kv_b_proj colwise (heads split, each rank
// its nH / T heads), o_proj rowwise (one all_reduce), kv_a_proj_with_mqa mla_kv_a_proj (whole on
// every rank: the latent and the shared RoPE key feed every head), q_a_proj and the norms
// replicated. T must divide nH; q and kv_b_proj must split alike and o_proj with them; a sharded
// kv_a_proj_with_mqa or q_a_proj is refused (the norm after it needs the whole row).
//
// Note [Latent attention cache]
// transformers caches the compressed latent c and k_pe (kv_lora_rank + d_rope numbers per token)
// and expands every cached position through kv_b_proj again at each step. Here the cache holds
// what attention reads, this rank's heads of k and v after the expansion (a KVCache), so a decode
// step expands only the new token: the same numbers (each position's expansion is a row of its
// own), more memory per token (nH/T · (d_nope + d_rope + d_v) numbers), far less compute per
// step. Folding kv_b_proj into the query and the output (DeepSeek's weight absorption) would keep
// the small cache and is not implemented.

#include <cstdint>
#include <string>

#include "dtensor/core/dtype.h"
#include "dtensor/nn/attention.h"
#include "dtensor/nn/module.h"
#include "dtensor/ops/local/ops.h"

namespace dt::nn {

struct LatentAttentionOptions {
  int64_t hidden_size = 0;
  int64_t num_heads = 0;
  int64_t q_lora_rank = 0;  // 0: a plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool bias = false;          // q_a_proj, kv_a_proj_with_mqa and o_proj biases (attention_bias)
  double norm_eps = 1e-6;     // q_a_layernorm, kv_a_layernorm
  double softmax_scale = 0;   // 0: 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)
  ops::RotaryStyle rotary_style = ops::RotaryStyle::kInterleaved;
  DType dtype = DType::kF32;
};

class LatentAttention : public Module {
 public:
  explicit LatentAttention(const LatentAttentionOptions& options);
  const LatentAttentionOptions& options() const { return options_; }

  void EnableKVCache(bool on = true) { use_cache_ = on; }
  void ResetKVCache(int64_t reserve = 0) { cache_.Reset(reserve); }
  // Attention::SetKVCacheDType.
  void SetKVCacheDType(std::optional<DType> dtype) {
    cache_.SetDType(dtype);
    paged_.SetDType(dtype);
  }
  int64_t kv_cache_length() const { return use_cache_ ? cache_.length() : 0; }
  int64_t kv_cache_bytes() const { return cache_.bytes(); }  // KVCache::bytes
  // The serving engine's step (Attention::SetPagedStep, Note [Paged KV cache] in attention.cc):
  // the expanded keys and values of Note [Latent attention cache] go to this layer's pages.
  void SetPagedStep(const PagedStep* step) { paged_step_ = step; }
  PagedKVCache& paged_kv() { return paged_; }

  std::string ExtraRepr() const override;
  absl::Status ValidateTensorParallel(const TPValidationContext& ctx) const override;

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  // A projection's output as this rank's heads [B, h, S, d].
  absl::StatusOr<Tensor> Heads(const Value& y, int64_t b, int64_t s, int64_t d) const;

  LatentAttentionOptions options_;
  bool use_cache_ = false;
  KVCache cache_;
  const PagedStep* paged_step_ = nullptr;
  PagedKVCache paged_;
  // The children the forward calls, as built: q_a_proj_, q_a_layernorm_ and q_b_proj_ with a
  // q_lora_rank, else q_proj_.
  Linear *q_a_proj_ = nullptr, *q_b_proj_ = nullptr, *q_proj_ = nullptr;
  RMSNorm* q_a_layernorm_ = nullptr;
  Linear* kv_a_proj_with_mqa_;
  RMSNorm* kv_a_layernorm_;
  Linear *kv_b_proj_, *o_proj_;
};

}  // namespace dt::nn
