#pragma once
// Rotary position embeddings and multi-head attention with grouped-query heads and a KV cache.
//
//   RotaryEmbedding  {positions i64 [S] or [B, S]} -> {cos [..., D], sin [..., D]}
//                    inv_freq[i] = theta^(-2i/D) (f32, a buffer), or a table function of the
//                    sequence length the positions reach (max + 1: dynamic NTK, longrope) with
//                    a factor cos and sin are multiplied by (yarn, longrope; loaders/rope.h);
//                    angle = position · inv_freq;
//                    kHalf (Llama, rotate_half) repeats the D/2 angles as [a | a], kInterleaved
//                    (Flux2 pairs) as [a0, a0, a1, a1, ...]. Positions given as a DTensor must be
//                    replicated and give replicated DTensors.
//   Attention        {x [B, S, H], cos, sin} -> {o_proj(SDPA(rope(q), rope(k), v)) [B, S, H]}
//                    children q_proj [nH·D, H], k_proj / v_proj [nKV·D, H], o_proj [H, nH·D];
//                    or, with fused_qkv, one qkv_proj [(nH + 2·nKV)·D, H] whose rows are
//                    q | k | v (GPT-2's c_attn), declared as packed blocks [nH·D, nKV·D, nKV·D].
//                    Child names are options (GPT-2: qkv_name "c_attn", o_name "c_proj").
//                    With qk_norm, children q_norm / k_norm (RMSNorm [D]) normalize each head's
//                    q and k before rotary (Qwen3), or with qk_norm_whole the whole projections
//                    (RMSNorm [nH·D] and [nKV·D], OLMo 2).
//                    cos/sin may be absent ({x} or Value()) for no rotary (learned or no
//                    positions). Heads are split with (-1, head_dim), so the forward is the same
//                    on every rank whatever number of heads it holds (diffusers' TP-agnostic
//                    processors).
//
// Plans (names as constructed): q_proj, k_proj, v_proj colwise and o_proj rowwise; fused:
// qkv_proj packed_colwise (the blocks come from the module, so each rank gets its q, k and v
// heads; plain colwise is refused) and o_proj rowwise. One all_reduce per call. k_proj / v_proj
// may be unit_colwise (transformers' MiniCPM5-MoE plan): split into gcd(num_kv_heads, tp) groups
// of whole heads when tp does not divide them (Note [Unit meshes] in nn/styles.h); q_proj with
// unit_colwise pairs with o_proj unit_rowwise. The projections declare head_dim as their unit.
//
// Note [Gated attention]
// With `gated` (Qwen3-Next's and MiniCPM5-MoE's attention), the q projection's rows hold each
// head's query and then its gate, [q_h | gate_h] for h = 0 .. nH-1 (2 · nH · D rows, the layout
// transformers views as (-1, 2·D) and chunks in two), and the attention output is multiplied by
// sigmoid(gate) before o_proj. A colwise split keeps each head's q and gate on one rank (the unit
// is 2·D rows), so the gate needs no communication. Not with fused_qkv.
//
// Options per layer (AttentionOptions: scale, softcap, window, sinks; ops::AttentionOptions): a
// Gemma 2 layer sets scale = query_pre_attn_scalar^-0.5, softcap and, on its sliding layers,
// window; gpt-oss sets sinks, a parameter [num_heads] of which each rank uses its own heads' (the
// parameter replicated, or sharded by a plan with the heads: Shard(0)). An additive mask
// [B or 1, 1, S, keys] (keys: the cached ones and S) may follow as a fourth input,
// {x, cos, sin, mask}, added to every head's scores; not with a paged step.
//
// KV cache: EnableKVCache() keeps K and V (after rotary, a KVCache) and appends every call's keys
// after the previous ones; with `causal`, query i of a call attends to keys j <= cache_len + i
// (the mask is bottom-right aligned). ResetKVCache() forgets them. Under tensor parallelism the
// cache holds this rank's heads only. SetKVCacheDType(f16) keeps them in f16 (rounded as they are
// written; CPU only when it is not the compute dtype): a decode step reads half the bytes of an
// f32 cache, as llama.cpp's default f16 cache does (Note [A KV cache of its own dtype] in
// ops/local/attention.cc).
//
// With q_proj sharded and k_proj / v_proj replicated, each rank computes and caches only the KV
// heads its query heads use (Note [Replicated KV heads]), so tp may exceed the KV heads (vLLM's
// replicated KV heads): SmolLM2's 9 query / 3 KV heads run at tp = 9.
//
// Tensor-parallel validation (before any weight is read): when the plan shards q_proj, tp must
// divide num_heads; when it shards k_proj or v_proj, tp must divide num_kv_heads — transformers
// does not check the latter and fails mid-forward (#48307):
//   "Attention 'layers.0.self_attn': tensor parallel size 8 does not divide num_kv_heads 4
//    (k_proj.weight sharded): each rank would hold a fraction of a KV head"
// and the projections must be placed consistently: k_proj and v_proj alike, q_proj sharded when
// they are, o_proj sharded exactly when q_proj is; anything else names the two placements:
//   "Attention 'layers.0.self_attn': q_proj.weight is [R] but k_proj.weight is [S(0)]: ..."

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dtensor/core/dtype.h"
#include "dtensor/nn/linear.h"
#include "dtensor/nn/module.h"
#include "dtensor/nn/norm.h"
#include "dtensor/ops/local/ops.h"

namespace dt::nn {

// What a forward of RotaryEmbedding uses: D/2 inverse frequencies and the factor cos and sin are
// multiplied by.
struct RotaryTable {
  std::vector<float> inv_freq;
  float attention_scaling = 1.0f;
};
// Called by every forward with the sequence length its positions reach (max position + 1); may
// keep state (transformers' dynamic_rope_update). Every rank calls it with the same lengths.
using RotaryTableFn = std::function<RotaryTable(int64_t seq_len)>;

class RotaryEmbedding : public Module {
 public:
  RotaryEmbedding(int64_t head_dim, double theta = 10000.0,
                  ops::RotaryStyle style = ops::RotaryStyle::kHalf);
  // A table of its own (scaled frequencies: llama3, linear); head_dim = 2 * inv_freq.size().
  // `scaling` names it in ExtraRepr.
  RotaryEmbedding(std::vector<float> inv_freq, std::string scaling,
                  ops::RotaryStyle style = ops::RotaryStyle::kHalf);
  // A table that depends on the sequence length; `table(0)` gives the initial one.
  RotaryEmbedding(RotaryTableFn table, std::string scaling,
                  ops::RotaryStyle style = ops::RotaryStyle::kHalf);
  int64_t head_dim() const { return head_dim_; }
  std::string ExtraRepr() const override;

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  int64_t head_dim_;
  std::string table_;  // "theta=10000" or the scaling's name, for ExtraRepr
  ops::RotaryStyle style_;
  RotaryTableFn table_fn_;  // unset: the inv_freq buffer, scaling 1
};

// The keys and values of the positions seen so far, [B, h, S, D] each, for one attention layer.
// Local K/V (what the tensor-parallel styles hand on) go into buffers with spare room along the
// sequence, doubled when full, so a generation of T tokens copies O(T) cache rows rather than
// O(T²) as a concatenation per step would; the cached part is a view. DTensor K/V are
// concatenated.
class KVCache {
 public:
  // How keys are rotated (ops::ApplyRotary's arguments other than x).
  struct KeyRotary {
    Value cos, sin;
    ops::RotaryStyle style = ops::RotaryStyle::kHalf;
  };
  // Appends *k, *v after the cached positions and replaces them with all of them. With
  // `rotary`, *k is given unrotated and rotated as it is written (Note [Keys are rotated into
  // the cache] in attention.cc).
  absl::Status Append(Value* k, Value* v, const KeyRotary* rotary = nullptr);
  // Forgets the positions. The local buffers, when next made, hold at least `reserve` positions
  // (Note [KV buffers are reserved]).
  void Reset(int64_t reserve = 0);
  int64_t length() const { return k_.defined() ? k_.shape()[2] : 0; }
  // The bytes this rank holds for it (the buffers' whole capacity).
  int64_t bytes() const;
  // The dtype keys and values are kept in (rounded to it as they are written: Note [A KV cache of
  // its own dtype] in ops/local/attention.cc); nullopt: the dtype they come in. Forgets the
  // positions.
  void SetDType(std::optional<DType> dtype);

 private:
  Value k_, v_;                 // the filled part of the buffers below, or DTensors
  Tensor buffer_k_, buffer_v_;  // [B, h, capacity, D] for local K/V
  int64_t reserve_ = 0;
  std::optional<DType> dtype_;
};

// One step of a batch of sequences over paged KV caches (Note [Paged KV cache] in attention.cc):
// the step's tokens, rows of one activation [1, T, H], grouped by sequence, and where each
// sequence's positions lie. Made by the serving engine (nn/models/engine.cc) on every rank alike
// and read by every attention layer of the step (SetPagedStep).
struct PagedStep {
  int64_t page_tokens = 16;  // positions per page (P)
  int64_t pool_pages = 0;    // pages in each layer's pool
  Tensor query_starts;       // i64 [S + 1]: sequence i's tokens are rows [starts[i], starts[i+1])
  Tensor kv_lengths;         // i64 [S]: its positions after this step (cached + new)
  Tensor page_table;         // i32 [S, max_pages]: its pages, in position order
  Tensor slots;              // i64 [T]: where token t's key and value go, page · P + row
};

// One attention layer's pages on this rank: keys [N, h, P, D] and values [N, h, P, Dv] for the
// KV heads this rank computes, made at the first step (when h is known) and kept until Release.
class PagedKVCache {
 public:
  // Writes the step's new keys k [1, h, T, D] (rotated) and values v [1, h, T, Dv] into their
  // slots, then the queries q [1, hq, T, D] attend over their sequences' pages into out
  // [hq, T, Dv] (ops::PagedAttentionInto with `options`).
  absl::Status Attend(const PagedStep& step, const Tensor& q, const Tensor& k, const Tensor& v,
                      const ops::PagedAttentionOptions& options, const Tensor& out);
  void Release();
  int64_t bytes() const;
  // The pages' dtype, as KVCache::SetDType. Releases the pages.
  void SetDType(std::optional<DType> dtype);

 private:
  Tensor k_, v_;
  std::optional<DType> dtype_;
};

struct AttentionOptions {
  int64_t hidden_size = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // 0: num_heads (no GQA)
  int64_t head_dim = 0;      // 0: hidden_size / num_heads
  bool bias = false;         // q/k/v/o biases (Llama's attention_bias)
  bool qkv_bias = false;     // q/k/v biases only, o_proj without (Qwen2)
  bool qk_norm = false;      // q_norm / k_norm over head_dim before rotary (Qwen3)
  // With qk_norm: the norms over the whole projection, q_norm [nH·D] and k_norm [nKV·D], before
  // the heads are split (OLMo 2); a colwise piece sums its squares across the ranks (Note [A norm
  // over a sharded dim] in nn/norm.h). Not with fused_qkv or gated.
  bool qk_norm_whole = false;
  RMSNormForm norm_form = RMSNormForm::kRoundThenScale;  // the q/k norms' form
  double norm_eps = 1e-6;    // their eps
  bool causal = true;
  ops::RotaryStyle rotary_style = ops::RotaryStyle::kHalf;
  DType dtype = DType::kF32;
  bool fused_qkv = false;  // one qkv projection instead of q/k/v (see the file comment)
  // Note [Gated attention]: q_proj's rows are [q | gate] per head (2 · num_heads · head_dim),
  // and the attention output is multiplied by sigmoid(gate) before o_proj (Qwen3-Next,
  // MiniCPM5-MoE, whose module is named q_gate_proj: set q_name).
  bool gated = false;
  std::string q_name = "q_proj";
  std::string k_name = "k_proj";
  std::string v_name = "v_proj";
  std::string o_name = "o_proj";
  std::string qkv_name = "qkv_proj";  // with fused_qkv
  // Per layer (Note [Attention options] in ops/local/cpu/attention.cc; see the file comment):
  std::optional<double> scale;    // default head_dim^-0.5; Gemma: query_pre_attn_scalar^-0.5
  std::optional<double> softcap;  // attention logit soft-capping (Gemma 2), > 0
  std::optional<int64_t> window;  // sliding window (Gemma 2/3, gpt-oss), >= 1; needs causal
  bool sinks = false;             // a parameter "sinks" [num_heads] (gpt-oss)
};

class Attention : public Module {
 public:
  explicit Attention(const AttentionOptions& options);
  const AttentionOptions& options() const { return options_; }  // 0 fields resolved

  void EnableKVCache(bool on = true) { use_cache_ = on; }
  void ResetKVCache(int64_t reserve = 0);  // KVCache::Reset
  // The dtype of the KV cache and of the pages (KVCache::SetDType); forgets both.
  void SetKVCacheDType(std::optional<DType> dtype);
  // While set, forwards run the serving engine's step: x [1, T, H] holds the tokens of several
  // sequences, cos and sin are per token, and keys and values go to this layer's pages instead of
  // the KV cache (Note [Paged KV cache]). Null: the KV cache as above. `step` must outlive its use.
  void SetPagedStep(const PagedStep* step) { paged_step_ = step; }
  PagedKVCache& paged_kv() { return paged_; }
  // Keys held in the cache (0 when empty or disabled).
  int64_t kv_cache_length() const;
  // The bytes this rank holds for the cache (KVCache::bytes).
  int64_t kv_cache_bytes() const { return cache_.bytes(); }

  std::string ExtraRepr() const override;
  absl::Status ValidateTensorParallel(const TPValidationContext& ctx) const override;

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  absl::Status CheckHeads() const;
  // [B, S, h·D] -> [B, h, S, D]
  absl::StatusOr<Value> Heads(const Value& y, int64_t b, int64_t s) const;
  // See Note [Replicated KV heads] in attention.cc.
  absl::Status PickKVHeads(const Value& q, Value* k, Value* v) const;
  // A projection's output as heads [B, h, S, D] (normalized by `norm` when not null).
  absl::StatusOr<Value> Project(const Value& y, int64_t b, int64_t s, RMSNorm* norm);
  // The first of the `local` of `all` heads this rank holds of projection l, from where its
  // weight's placement cuts them (Note [Replicated KV heads]).
  absl::StatusOr<int64_t> FirstHead(const Linear* l, int64_t local, int64_t all,
                                    absl::string_view what) const;
  // The sinks of this rank's `n` query heads, f32 [n]; undefined without sinks.
  absl::StatusOr<Tensor> LocalSinks(int64_t n);

  AttentionOptions options_;
  // The children the forward calls, as built: qkv_ with fused_qkv, else q_, k_ and v_; the norms
  // with qk_norm.
  Linear *qkv_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *o_ = nullptr;
  RMSNorm *q_norm_ = nullptr, *k_norm_ = nullptr;
  bool use_cache_ = false;
  KVCache cache_;
  const PagedStep* paged_step_ = nullptr;
  PagedKVCache paged_;
};

}  // namespace dt::nn
