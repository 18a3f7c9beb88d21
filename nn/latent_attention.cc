#include "dtensor/nn/latent_attention.h"

#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/nn/linear.h"
#include "dtensor/nn/norm.h"

namespace dt::nn {

LatentAttention::LatentAttention(const LatentAttentionOptions& o)
    : Module("LatentAttention"), options_(o) {
  const int64_t qk = o.qk_nope_head_dim + o.qk_rope_head_dim;
  if (o.q_lora_rank > 0) {
    q_a_proj_ = &AddModule<Linear>("q_a_proj", o.hidden_size, o.q_lora_rank, o.bias, o.dtype);
    q_a_layernorm_ = &AddModule<RMSNorm>("q_a_layernorm", o.q_lora_rank, o.norm_eps, o.dtype);
    q_b_proj_ =
        &AddModule<Linear>("q_b_proj", o.q_lora_rank, o.num_heads * qk, /*bias=*/false, o.dtype);
  } else {
    q_proj_ =
        &AddModule<Linear>("q_proj", o.hidden_size, o.num_heads * qk, /*bias=*/false, o.dtype);
  }
  kv_a_proj_with_mqa_ = &AddModule<Linear>(
      "kv_a_proj_with_mqa", o.hidden_size, o.kv_lora_rank + o.qk_rope_head_dim, o.bias, o.dtype);
  kv_a_layernorm_ = &AddModule<RMSNorm>("kv_a_layernorm", o.kv_lora_rank, o.norm_eps, o.dtype);
  kv_b_proj_ = &AddModule<Linear>("kv_b_proj", o.kv_lora_rank,
                                  o.num_heads * (o.qk_nope_head_dim + o.v_head_dim),
                                  /*bias=*/false, o.dtype);
  o_proj_ =
      &AddModule<Linear>("o_proj", o.num_heads * o.v_head_dim, o.hidden_size, o.bias, o.dtype);
}

std::string LatentAttention::ExtraRepr() const {
  const LatentAttentionOptions& o = options_;
  return absl::StrCat("hidden=", o.hidden_size, ", heads=", o.num_heads,
                      o.q_lora_rank > 0 ? absl::StrCat(", q_lora_rank=", o.q_lora_rank) : "",
                      ", kv_lora_rank=", o.kv_lora_rank, ", qk_nope=", o.qk_nope_head_dim,
                      ", qk_rope=", o.qk_rope_head_dim, ", v=", o.v_head_dim,
                      o.bias ? ", bias" : "");
}

absl::Status LatentAttention::ValidateTensorParallel(const TPValidationContext& ctx) const {
  const LatentAttentionOptions& o = options_;
  const std::string q = o.q_lora_rank > 0 ? "q_b_proj" : "q_proj";
  const std::string name = absl::StrCat("LatentAttention '", ctx.module_name(), "'");
  auto placement = [&](const std::string& p) { return ctx.PlannedPlacement(p + ".weight").ToString(); };
  for (const char* whole : {"kv_a_proj_with_mqa", "q_a_proj"}) {
    if (ctx.IsSharded(absl::StrCat(whole, ".weight"))) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": ", whole, ".weight is [", placement(whole), "], but its output feeds an RMSNorm",
          std::string(whole) == "kv_a_proj_with_mqa"
              ? " and the RoPE key every head shares, so every rank needs it whole; plan it "
                "'mla_kv_a_proj' (replicated)"
              : ", so every rank needs it whole; leave it replicated"));
    }
  }
  const bool q_heads = ctx.OutputSharded(q), kv_heads = ctx.OutputSharded("kv_b_proj");
  if (q_heads != kv_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": ", q, ".weight is [", placement(q), "] but kv_b_proj.weight is [",
        placement("kv_b_proj"), "]: queries and keys must split their heads alike"));
  }
  if (q_heads && o.num_heads % ctx.tp_size() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": tensor parallel size ", ctx.tp_size(), " does not divide num_heads ", o.num_heads,
        " (", q, ".weight and kv_b_proj.weight sharded): each rank would hold a fraction of a "
        "head"));
  }
  if (q_heads && !ctx.IsSharded("o_proj.weight")) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": ", q, ".weight is [", placement(q), "] but o_proj.weight is [",
        placement("o_proj"), "]: the attention output holds this rank's heads, which only a "
        "rowwise o_proj takes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> LatentAttention::Heads(const Value& y, int64_t b, int64_t s,
                                              int64_t d) const {
  // This rank's heads (a colwise output's piece), [B, S, h·d] -> [B, h, S, d].
  DT_ASSIGN_OR_RETURN(Tensor t, WholeTensor(PlainLocal(y)));
  DT_ASSIGN_OR_RETURN(t, t.Reshape({b, s, -1, d}));
  return t.Transpose(1, 2);
}

absl::StatusOr<Values> LatentAttention::Forward(Values inputs) {
  const std::string name = absl::StrCat("LatentAttention '", FullName(), "'");
  if (inputs.size() != 3 || !inputs[0].defined() || inputs[0].dim() != 3 ||
      !inputs[1].defined() || !inputs[2].defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " takes {x [B, S, H], cos, sin}, got ", inputs.size(), " inputs"));
  }
  const LatentAttentionOptions& o = options_;
  DT_ASSIGN_OR_RETURN(const Tensor x, WholeTensor(inputs[0]));
  DT_ASSIGN_OR_RETURN(Tensor cos, WholeTensor(inputs[1]));
  DT_ASSIGN_OR_RETURN(Tensor sin, WholeTensor(inputs[2]));
  const int64_t b = x.size(0), s = x.size(1), rope = o.qk_rope_head_dim;
  const int64_t qk = o.qk_nope_head_dim + rope;
  // Queries: [B, h, S, d_nope + d_rope].
  Value qv;
  if (o.q_lora_rank > 0) {
    DT_ASSIGN_OR_RETURN(Value qa, q_a_proj_->CallOne({Value(x)}));
    DT_ASSIGN_OR_RETURN(qa, q_a_layernorm_->CallOne({qa}));
    DT_ASSIGN_OR_RETURN(qv, q_b_proj_->CallOne({qa}));
  } else {
    DT_ASSIGN_OR_RETURN(qv, q_proj_->CallOne({Value(x)}));
  }
  DT_ASSIGN_OR_RETURN(Tensor q, Heads(qv, b, s, qk));
  DT_ASSIGN_OR_RETURN(std::vector<Tensor> q_parts, ops::Split(q, {o.qk_nope_head_dim, rope}, -1));
  // The latent and the shared RoPE key.
  DT_ASSIGN_OR_RETURN(Value latent_v, kv_a_proj_with_mqa_->CallOne({Value(x)}));
  DT_ASSIGN_OR_RETURN(Tensor latent, WholeTensor(latent_v));
  DT_ASSIGN_OR_RETURN(std::vector<Tensor> kv_parts, ops::Split(latent, {o.kv_lora_rank, rope}, -1));
  DT_ASSIGN_OR_RETURN(Value c, kv_a_layernorm_->CallOne({Value(kv_parts[0])}));
  DT_ASSIGN_OR_RETURN(Value kv_v, kv_b_proj_->CallOne({c}));
  DT_ASSIGN_OR_RETURN(Tensor kv, Heads(kv_v, b, s, o.qk_nope_head_dim + o.v_head_dim));
  DT_ASSIGN_OR_RETURN(std::vector<Tensor> k_parts,
                      ops::Split(kv, {o.qk_nope_head_dim, o.v_head_dim}, -1));
  const int64_t heads = kv.size(1);
  // RoPE on q_pe and the shared k_pe [B, 1, S, d_rope].
  if (cos.dim() == 3) {  // [B, S, d] -> [B, 1, S, d]
    DT_ASSIGN_OR_RETURN(cos, cos.Unsqueeze(1));
    DT_ASSIGN_OR_RETURN(sin, sin.Unsqueeze(1));
  }
  DT_ASSIGN_OR_RETURN(Tensor k_pe, kv_parts[1].Reshape({b, 1, s, rope}));
  DT_ASSIGN_OR_RETURN(Tensor q_pe, ops::ApplyRotary(q_parts[1], cos, sin, o.rotary_style));
  DT_ASSIGN_OR_RETURN(k_pe, ops::ApplyRotary(k_pe, cos, sin, o.rotary_style));
  DT_ASSIGN_OR_RETURN(k_pe, k_pe.Expand({b, heads, s, rope}));
  DT_ASSIGN_OR_RETURN(Tensor query, ops::Cat({q_parts[0], q_pe}, -1));
  DT_ASSIGN_OR_RETURN(Tensor key, ops::Cat({k_parts[0], k_pe}, -1));
  const double scale =
      o.softmax_scale > 0 ? o.softmax_scale : 1.0 / std::sqrt(static_cast<double>(qk));
  Tensor a;
  if (paged_step_ != nullptr) {  // Note [Paged KV cache] in attention.cc
    if (b != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": a paged step takes x [1, T, H], got ", x.Describe()));
    }
    DT_ASSIGN_OR_RETURN(Tensor rows, Tensor::Empty({1, s, heads, o.v_head_dim}, x.dtype(),
                                                   x.device()));
    DT_ASSIGN_OR_RETURN(Tensor out, rows.Transpose(1, 2));
    DT_ASSIGN_OR_RETURN(out, out.Select(0, 0));
    DT_RETURN_IF_ERROR(
        paged_.Attend(*paged_step_, query, key, k_parts[1], {.scale = scale}, out));
    DT_ASSIGN_OR_RETURN(a, rows.View({1, s, -1}));
  } else {
    Value k(key), v(k_parts[1]);
    if (use_cache_) DT_RETURN_IF_ERROR(cache_.Append(&k, &v));  // Note [Latent attention cache]
    ops::AttentionOptions attn;
    attn.causal = true;
    attn.scale = scale;
    DT_ASSIGN_OR_RETURN(a, ops::ScaledDotProductAttention(query, k.local(), v.local(), attn));
    DT_ASSIGN_OR_RETURN(a, a.Transpose(1, 2));
    DT_ASSIGN_OR_RETURN(a, a.Reshape({b, s, -1}));
  }
  DT_ASSIGN_OR_RETURN(Value y, o_proj_->CallOne({Value(a)}));
  return Values{std::move(y)};
}

}  // namespace dt::nn
