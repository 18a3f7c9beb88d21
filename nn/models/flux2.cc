#include "dtensor/nn/models/flux2.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/nn/init.h"
#include "dtensor/nn/linear.h"
#include "dtensor/nn/norm.h"
#include "dtensor/nn/styles.h"
#include "dtensor/ops/value_ops.h"
#include "dtensor/ops/local/ops.h"

namespace dt::nn {
namespace {

absl::Status Arity(const Module& m, const Values& inputs, size_t want, absl::string_view what) {
  if (inputs.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(m.type_name(), " '", m.FullName(), "' takes {",
                                                   what, "}, got ", inputs.size(), " inputs"));
  }
  return absl::OkStatus();
}

// mod [B, k·D] -> k views [B, 1, D] (diffusers' Flux2Modulation.split: shift, scale, gate, ...).
absl::StatusOr<std::vector<Value>> SplitModulation(const Value& mod, int64_t k) {
  DT_ASSIGN_OR_RETURN(Value m, ops::Unsqueeze(mod, 1));
  return ops::Chunk(m, k, -1);
}

// x + gate · y
absl::StatusOr<Value> GatedResidual(const Value& x, const Value& gate, const Value& y) {
  DT_ASSIGN_OR_RETURN(Value g, ops::Mul(gate, y));
  return ops::Add(x, g);
}

// [B, S, n·hd] -> [B, S, n, hd] (n is whatever this rank holds).
absl::StatusOr<Value> Unflatten(const Value& x, int64_t head_dim) {
  return ops::Reshape(x, {x.shape()[0], x.shape()[1], -1, head_dim});
}

// q, k, v [B, S, n, hd] (after the q/k norms) -> attention [B, S, n·hd]: heads to dim 1, RoPE with
// cos/sin [S, hd], SDPA with f32 softmax, heads back.
absl::StatusOr<Value> RopeAttention(Value q, Value k, Value v, const Value& cos, const Value& sin) {
  DT_ASSIGN_OR_RETURN(q, ops::Transpose(q, 1, 2));
  DT_ASSIGN_OR_RETURN(k, ops::Transpose(k, 1, 2));
  DT_ASSIGN_OR_RETURN(v, ops::Transpose(v, 1, 2));
  DT_ASSIGN_OR_RETURN(Value c, ops::AsKindOf(cos, q));
  DT_ASSIGN_OR_RETURN(Value s, ops::AsKindOf(sin, q));
  DT_ASSIGN_OR_RETURN(q, ops::ApplyRotary(q, c, s, ops::RotaryStyle::kInterleaved));
  DT_ASSIGN_OR_RETURN(k, ops::ApplyRotary(k, c, s, ops::RotaryStyle::kInterleaved));
  DT_ASSIGN_OR_RETURN(Value a, ops::ScaledDotProductAttention(q, k, v, ops::AttentionOptions{}));
  DT_ASSIGN_OR_RETURN(a, ops::Transpose(a, 1, 2));
  return ops::Reshape(a, {a.shape()[0], a.shape()[1], -1});
}

// silu(x[..., :half]) · x[..., half:] (diffusers' Flux2SwiGLU).
absl::StatusOr<Value> SwiGLU(const Value& x) {
  DT_ASSIGN_OR_RETURN(std::vector<Value> gu, ops::Chunk(x, 2, -1));
  DT_ASSIGN_OR_RETURN(Value g, ops::Silu(gu[0]));
  return ops::Mul(g, gu[1]);
}

absl::Status HeadsDivide(const TPValidationContext& ctx, absl::string_view type, int64_t heads,
                         absl::string_view projection) {
  if (ctx.IsSharded(projection) && heads % ctx.tp_size() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        type, " '", ctx.module_name(), "': tensor parallel size ", ctx.tp_size(),
        " does not divide num_attention_heads ", heads, " (", projection,
        " sharded): each rank would hold a fraction of a head"));
  }
  return absl::OkStatus();
}

// q, k and v of one attention must be split alike: their heads are paired rank by rank.
absl::Status ShardedAlike(const TPValidationContext& ctx, absl::string_view type,
                          std::initializer_list<const char*> params) {
  const Placement first = ctx.PlannedPlacement(*params.begin());
  for (const char* p : params) {
    if (ctx.PlannedPlacement(p).is_any_shard() != first.is_any_shard()) {
      return absl::InvalidArgumentError(absl::StrCat(
          type, " '", ctx.module_name(), "': the plan shards ", *params.begin(), " and ", p,
          " differently (", first.ToString(), " vs ", ctx.PlannedPlacement(p).ToString(),
          "); the heads of q, k and v (and of both streams) are paired rank by rank, so they "
          "must be split alike"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

// ---- embeddings and modulation -------------------------------------------------------------------

TimestepEmbedding::TimestepEmbedding(int64_t in_channels, int64_t dim, DType dtype)
    : Module("TimestepEmbedding") {
  linear_1_ = &AddModule<Linear>("linear_1", in_channels, dim, /*bias=*/false, dtype);
  linear_2_ = &AddModule<Linear>("linear_2", dim, dim, /*bias=*/false, dtype);
}

absl::StatusOr<Values> TimestepEmbedding::Forward(Values inputs) {
  DT_ASSIGN_OR_RETURN(Value x, SingleInput(*this, inputs));
  DT_ASSIGN_OR_RETURN(x, linear_1_->CallOne({x}));
  DT_ASSIGN_OR_RETURN(x, ops::Silu(x));
  DT_ASSIGN_OR_RETURN(x, linear_2_->CallOne({x}));
  return Values{std::move(x)};
}

Flux2TimestepGuidanceEmbeddings::Flux2TimestepGuidanceEmbeddings(int64_t channels, int64_t dim,
                                                                 bool guidance, DType dtype)
    : Module("Flux2TimestepGuidanceEmbeddings"), channels_(channels), dtype_(dtype) {
  timestep_embedder_ = &AddModule<TimestepEmbedding>("timestep_embedder", channels, dim, dtype);
  if (guidance) guidance_embedder_ = &AddModule<TimestepEmbedding>("guidance_embedder", channels, dim, dtype);
}

absl::StatusOr<Values> Flux2TimestepGuidanceEmbeddings::Forward(Values inputs) {
  DT_RETURN_IF_ERROR(Arity(*this, inputs, 2, "t, guidance (or undefined)"));
  auto embed = [&](const Value& t, TimestepEmbedding& embedder) -> absl::StatusOr<Value> {
    DT_ASSIGN_OR_RETURN(Tensor proj, Flux2TimestepProjection(t.local(), channels_));
    DT_ASSIGN_OR_RETURN(proj, ops::Cast(proj, dtype_));
    DT_ASSIGN_OR_RETURN(Value p, ops::AsKindOf(Value(proj), t));
    return embedder.CallOne({p});
  };
  DT_ASSIGN_OR_RETURN(Value temb, embed(inputs[0], *timestep_embedder_));
  if (inputs[1].defined() && guidance_embedder_ != nullptr) {
    DT_ASSIGN_OR_RETURN(Value g, embed(inputs[1], *guidance_embedder_));
    DT_ASSIGN_OR_RETURN(temb, ops::Add(temb, g));
  }
  return Values{std::move(temb)};
}

Flux2Modulation::Flux2Modulation(int64_t dim, int64_t sets, DType dtype)
    : Module("Flux2Modulation") {
  linear_ = &AddModule<Linear>("linear", dim, dim * 3 * sets, /*bias=*/false, dtype);
}

absl::StatusOr<Values> Flux2Modulation::Forward(Values inputs) {
  DT_ASSIGN_OR_RETURN(Value x, SingleInput(*this, inputs));
  DT_ASSIGN_OR_RETURN(x, ops::Silu(x));
  DT_ASSIGN_OR_RETURN(x, linear_->CallOne({x}));
  return Values{std::move(x)};
}

AdaLayerNormContinuous::AdaLayerNormContinuous(int64_t dim, double eps, DType dtype)
    : Module("AdaLayerNormContinuous") {
  linear_ = &AddModule<Linear>("linear", dim, 2 * dim, /*bias=*/false, dtype);
  norm_ = &AddModule<LayerNorm>("norm", dim, eps, /*elementwise_affine=*/false, /*bias=*/false, dtype);
}

absl::StatusOr<Values> AdaLayerNormContinuous::Forward(Values inputs) {
  DT_RETURN_IF_ERROR(Arity(*this, inputs, 2, "x, temb"));
  DT_ASSIGN_OR_RETURN(Value e, ops::Silu(inputs[1]));
  DT_ASSIGN_OR_RETURN(e, linear_->CallOne({e}));
  DT_ASSIGN_OR_RETURN(std::vector<Value> scale_shift, SplitModulation(e, 2));  // scale first
  DT_ASSIGN_OR_RETURN(Value x, norm_->CallOne({inputs[0]}));
  DT_ASSIGN_OR_RETURN(x, ops::Modulate(x, scale_shift[0], scale_shift[1]));
  return Values{std::move(x)};
}

// ---- double stream -------------------------------------------------------------------------------

Flux2Attention::Flux2Attention(const Flux2AttentionOptions& o)
    : Module("Flux2Attention"), options_(o) {
  auto linear = [&](const char* name) { return &AddModule<Linear>(name, o.dim, o.dim, /*bias=*/false, o.dtype); };
  auto norm = [&](const char* name) { return &AddModule<RMSNorm>(name, o.head_dim, o.eps, o.dtype); };
  to_q_ = linear("to_q");
  to_k_ = linear("to_k");
  to_v_ = linear("to_v");
  norm_q_ = norm("norm_q");
  norm_k_ = norm("norm_k");
  to_out_ = &AddModule<ModuleList>("to_out").Append(std::make_unique<Linear>(o.dim, o.dim, /*bias=*/false, o.dtype));
  norm_added_q_ = norm("norm_added_q");
  norm_added_k_ = norm("norm_added_k");
  add_q_proj_ = linear("add_q_proj");
  add_k_proj_ = linear("add_k_proj");
  add_v_proj_ = linear("add_v_proj");
  to_add_out_ = linear("to_add_out");
}

absl::Status Flux2Attention::ValidateTensorParallel(const TPValidationContext& ctx) const {
  DT_RETURN_IF_ERROR(ShardedAlike(ctx, type_name(),
                                  {"to_q.weight", "to_k.weight", "to_v.weight",
                                   "add_q_proj.weight", "add_k_proj.weight", "add_v_proj.weight"}));
  return HeadsDivide(ctx, type_name(), options_.heads, "to_q.weight");
}

absl::StatusOr<Values> Flux2Attention::Forward(Values inputs) {
  DT_RETURN_IF_ERROR(Arity(*this, inputs, 4, "x, c, cos, sin"));
  const int64_t hd = options_.head_dim;
  // to_<p>(x) -> [B, S, n, hd], normed when `norm` is given.
  auto project = [&](const Value& in, Linear* proj, RMSNorm* norm) -> absl::StatusOr<Value> {
    DT_ASSIGN_OR_RETURN(Value y, proj->CallOne({in}));
    // This rank's heads as a plain piece (Note [Local pieces remember their layout]).
    DT_ASSIGN_OR_RETURN(y, Unflatten(PlainLocal(y), hd));
    if (norm != nullptr) {
      DT_ASSIGN_OR_RETURN(y, norm->CallOne({y}));
    }
    return y;
  };
  DT_ASSIGN_OR_RETURN(Value q, project(inputs[0], to_q_, norm_q_));
  DT_ASSIGN_OR_RETURN(Value k, project(inputs[0], to_k_, norm_k_));
  DT_ASSIGN_OR_RETURN(Value v, project(inputs[0], to_v_, nullptr));
  DT_ASSIGN_OR_RETURN(Value cq, project(inputs[1], add_q_proj_, norm_added_q_));
  DT_ASSIGN_OR_RETURN(Value ck, project(inputs[1], add_k_proj_, norm_added_k_));
  DT_ASSIGN_OR_RETURN(Value cv, project(inputs[1], add_v_proj_, nullptr));
  // Text tokens first, as the rotary tables are.
  DT_ASSIGN_OR_RETURN(q, ops::Cat({cq, q}, 1));
  DT_ASSIGN_OR_RETURN(k, ops::Cat({ck, k}, 1));
  DT_ASSIGN_OR_RETURN(v, ops::Cat({cv, v}, 1));
  DT_ASSIGN_OR_RETURN(Value a, RopeAttention(q, k, v, inputs[2], inputs[3]));
  const int64_t st = inputs[1].shape()[1], si = inputs[0].shape()[1];
  DT_ASSIGN_OR_RETURN(std::vector<Value> parts, ops::Split(a, {st, si}, 1));
  DT_ASSIGN_OR_RETURN(Value x, to_out_->CallOne({parts[1]}));
  DT_ASSIGN_OR_RETURN(Value c, to_add_out_->CallOne({parts[0]}));
  return Values{std::move(x), std::move(c)};
}

Flux2FeedForward::Flux2FeedForward(int64_t dim, int64_t hidden, DType dtype)
    : Module("Flux2FeedForward") {
  linear_in_ = &AddModule<Linear>("linear_in", dim, 2 * hidden, /*bias=*/false, dtype);
  linear_in_->set_packed_col_blocks({hidden, hidden});
  linear_out_ = &AddModule<Linear>("linear_out", hidden, dim, /*bias=*/false, dtype);
}

absl::StatusOr<Values> Flux2FeedForward::Forward(Values inputs) {
  DT_ASSIGN_OR_RETURN(Value x, SingleInput(*this, inputs));
  DT_ASSIGN_OR_RETURN(x, linear_in_->CallOne({x}));
  DT_ASSIGN_OR_RETURN(x, SwiGLU(PlainLocal(x)));
  DT_ASSIGN_OR_RETURN(x, linear_out_->CallOne({x}));
  return Values{std::move(x)};
}

Flux2TransformerBlock::Flux2TransformerBlock(const Flux2AttentionOptions& o)
    : Module("Flux2TransformerBlock") {
  auto norm = [&](const char* name) {
    return &AddModule<LayerNorm>(name, o.dim, o.eps, /*elementwise_affine=*/false, /*bias=*/false, o.dtype);
  };
  norm1_ = norm("norm1");
  norm1_context_ = norm("norm1_context");
  attn_ = &AddModule<Flux2Attention>("attn", o);
  norm2_ = norm("norm2");
  norm2_context_ = norm("norm2_context");
  ff_ = &AddModule<Flux2FeedForward>("ff", o.dim, o.mlp_hidden_dim, o.dtype);
  ff_context_ = &AddModule<Flux2FeedForward>("ff_context", o.dim, o.mlp_hidden_dim, o.dtype);
}

absl::StatusOr<Values> Flux2TransformerBlock::Forward(Values inputs) {
  DT_RETURN_IF_ERROR(Arity(*this, inputs, 6, "x, c, mod_img, mod_txt, cos, sin"));
  Value x = inputs[0], c = inputs[1];
  // (shift, scale, gate) for attention, then for the feed-forward.
  DT_ASSIGN_OR_RETURN(std::vector<Value> mi, SplitModulation(inputs[2], 6));
  DT_ASSIGN_OR_RETURN(std::vector<Value> mt, SplitModulation(inputs[3], 6));
  auto modulate = [&](LayerNorm* norm, const Value& h, const Value& shift,
                      const Value& scale) -> absl::StatusOr<Value> {
    DT_ASSIGN_OR_RETURN(Value n, norm->CallOne({h}));
    return ops::Modulate(n, scale, shift);
  };
  DT_ASSIGN_OR_RETURN(Value xn, modulate(norm1_, x, mi[0], mi[1]));
  DT_ASSIGN_OR_RETURN(Value cn, modulate(norm1_context_, c, mt[0], mt[1]));
  DT_ASSIGN_OR_RETURN(Values a, attn_->Call({xn, cn, inputs[4], inputs[5]}));
  DT_ASSIGN_OR_RETURN(x, GatedResidual(x, mi[2], a[0]));
  DT_ASSIGN_OR_RETURN(c, GatedResidual(c, mt[2], a[1]));
  DT_ASSIGN_OR_RETURN(xn, modulate(norm2_, x, mi[3], mi[4]));
  DT_ASSIGN_OR_RETURN(Value f, ff_->CallOne({xn}));
  DT_ASSIGN_OR_RETURN(x, GatedResidual(x, mi[5], f));
  DT_ASSIGN_OR_RETURN(cn, modulate(norm2_context_, c, mt[3], mt[4]));
  DT_ASSIGN_OR_RETURN(Value fc, ff_context_->CallOne({cn}));
  DT_ASSIGN_OR_RETURN(c, GatedResidual(c, mt[5], fc));
  return Values{std::move(x), std::move(c)};
}

// ---- single stream -------------------------------------------------------------------------------

Flux2ParallelSelfAttention::Flux2ParallelSelfAttention(const Flux2AttentionOptions& o)
    : Module("Flux2ParallelSelfAttention"), options_(o) {
  const int64_t d = o.dim, m = o.mlp_hidden_dim;
  to_qkv_mlp_proj_ = &AddModule<Linear>("to_qkv_mlp_proj", d, 3 * d + 2 * m, /*bias=*/false, o.dtype);
  to_qkv_mlp_proj_->set_packed_col_blocks({d, d, d, m, m});
  norm_q_ = &AddModule<RMSNorm>("norm_q", o.head_dim, o.eps, o.dtype);
  norm_k_ = &AddModule<RMSNorm>("norm_k", o.head_dim, o.eps, o.dtype);
  to_out_ = &AddModule<Linear>("to_out", d + m, d, /*bias=*/false, o.dtype);
  to_out_->set_packed_row_blocks({d, m});
}

absl::Status Flux2ParallelSelfAttention::ValidateTensorParallel(
    const TPValidationContext& ctx) const {
  if (ctx.IsSharded("to_qkv_mlp_proj.weight") != ctx.IsSharded("to_out.weight")) {
    return absl::InvalidArgumentError(absl::StrCat(
        type_name(), " '", ctx.module_name(), "': the plan shards only one of to_qkv_mlp_proj "
        "and to_out; the attention and MLP outputs of this rank feed to_out's matching columns, "
        "so both or neither must be sharded"));
  }
  return HeadsDivide(ctx, type_name(), options_.heads, "to_qkv_mlp_proj.weight");
}

absl::StatusOr<Values> Flux2ParallelSelfAttention::Forward(Values inputs) {
  DT_RETURN_IF_ERROR(Arity(*this, inputs, 3, "h, cos, sin"));
  DT_ASSIGN_OR_RETURN(Value p, to_qkv_mlp_proj_->CallOne({inputs[0]}));
  p = PlainLocal(p);  // this rank's slices of each block (Note [Local pieces remember their layout])
  // This rank's [Q|K|V|gate|up] slices: split by the global ratio 3D : 2M.
  const int64_t qkv = 3 * options_.dim, mlp = 2 * options_.mlp_hidden_dim;
  const int64_t width = p.shape().back(), local_qkv = width * qkv / (qkv + mlp);
  DT_ASSIGN_OR_RETURN(std::vector<Value> parts, ops::Split(p, {local_qkv, width - local_qkv}, -1));
  DT_ASSIGN_OR_RETURN(std::vector<Value> qkv_parts, ops::Chunk(parts[0], 3, -1));
  const int64_t hd = options_.head_dim;
  DT_ASSIGN_OR_RETURN(Value q, Unflatten(qkv_parts[0], hd));
  DT_ASSIGN_OR_RETURN(Value k, Unflatten(qkv_parts[1], hd));
  DT_ASSIGN_OR_RETURN(Value v, Unflatten(qkv_parts[2], hd));
  DT_ASSIGN_OR_RETURN(q, norm_q_->CallOne({q}));
  DT_ASSIGN_OR_RETURN(k, norm_k_->CallOne({k}));
  DT_ASSIGN_OR_RETURN(Value a, RopeAttention(q, k, v, inputs[1], inputs[2]));
  DT_ASSIGN_OR_RETURN(Value m, SwiGLU(parts[1]));
  DT_ASSIGN_OR_RETURN(Value am, ops::Cat({a, m}, -1));
  DT_ASSIGN_OR_RETURN(Value y, to_out_->CallOne({am}));
  return Values{std::move(y)};
}

Flux2SingleTransformerBlock::Flux2SingleTransformerBlock(const Flux2AttentionOptions& o)
    : Module("Flux2SingleTransformerBlock") {
  norm_ = &AddModule<LayerNorm>("norm", o.dim, o.eps, /*elementwise_affine=*/false, /*bias=*/false, o.dtype);
  attn_ = &AddModule<Flux2ParallelSelfAttention>("attn", o);
}

absl::StatusOr<Values> Flux2SingleTransformerBlock::Forward(Values inputs) {
  DT_RETURN_IF_ERROR(Arity(*this, inputs, 4, "h, mod, cos, sin"));
  DT_ASSIGN_OR_RETURN(std::vector<Value> mod, SplitModulation(inputs[1], 3));
  DT_ASSIGN_OR_RETURN(Value n, norm_->CallOne({inputs[0]}));
  DT_ASSIGN_OR_RETURN(n, ops::Modulate(n, mod[1], mod[0]));
  DT_ASSIGN_OR_RETURN(Value a, attn_->CallOne({n, inputs[2], inputs[3]}));
  DT_ASSIGN_OR_RETURN(Value h, GatedResidual(inputs[0], mod[2], a));
  return Values{std::move(h)};
}

// ---- the model -----------------------------------------------------------------------------------

Flux2Transformer2DModel::Flux2Transformer2DModel(const loaders::Flux2Config& c, DType dtype)
    : Module("Flux2Transformer2DModel"), config_(c), dtype_(dtype) {
  const int64_t d = c.inner_dim();
  time_guidance_embed_ = &AddModule<Flux2TimestepGuidanceEmbeddings>(
      "time_guidance_embed", c.timestep_guidance_channels, d, c.guidance_embeds, dtype);
  double_stream_modulation_img_ = &AddModule<Flux2Modulation>("double_stream_modulation_img", d, 2, dtype);
  double_stream_modulation_txt_ = &AddModule<Flux2Modulation>("double_stream_modulation_txt", d, 2, dtype);
  single_stream_modulation_ = &AddModule<Flux2Modulation>("single_stream_modulation", d, 1, dtype);
  x_embedder_ = &AddModule<Linear>("x_embedder", c.in_channels, d, /*bias=*/false, dtype);
  context_embedder_ = &AddModule<Linear>("context_embedder", c.joint_attention_dim, d, /*bias=*/false, dtype);
  Flux2AttentionOptions o;
  o.dim = d;
  o.heads = c.num_attention_heads;
  o.head_dim = c.attention_head_dim;
  o.mlp_hidden_dim = c.mlp_hidden_dim();
  o.eps = c.eps;
  o.dtype = dtype;
  transformer_blocks_ = &AddModule<ModuleList>("transformer_blocks");
  for (int64_t i = 0; i < c.num_layers; ++i) {
    transformer_blocks_->Append(std::make_unique<Flux2TransformerBlock>(o));
  }
  single_transformer_blocks_ = &AddModule<ModuleList>("single_transformer_blocks");
  for (int64_t i = 0; i < c.num_single_layers; ++i) {
    single_transformer_blocks_->Append(std::make_unique<Flux2SingleTransformerBlock>(o));
  }
  norm_out_ = &AddModule<AdaLayerNormContinuous>("norm_out", d, c.eps, dtype);
  proj_out_ = &AddModule<Linear>("proj_out", d, c.patch_size * c.patch_size * c.out_channels, /*bias=*/false,
                                 dtype);
}

ParallelPlan Flux2Transformer2DModel::TPPlan(const loaders::Flux2Config& config) {
  using Blocks = std::vector<int64_t>;
  ParallelPlan plan;
  if (config.num_layers > 0) {
    plan = {
        {"transformer_blocks.*.attn.to_q", "colwise"},
        {"transformer_blocks.*.attn.to_k", "colwise"},
        {"transformer_blocks.*.attn.to_v", "colwise"},
        {"transformer_blocks.*.attn.to_out.0", "rowwise"},
        {"transformer_blocks.*.attn.add_q_proj", "colwise"},
        {"transformer_blocks.*.attn.add_k_proj", "colwise"},
        {"transformer_blocks.*.attn.add_v_proj", "colwise"},
        {"transformer_blocks.*.attn.to_add_out", "rowwise"},
        {"transformer_blocks.*.ff.linear_in", std::make_shared<PackedColwiseParallel>(Blocks{1, 1})},
        {"transformer_blocks.*.ff.linear_out", "rowwise"},
        {"transformer_blocks.*.ff_context.linear_in",
         std::make_shared<PackedColwiseParallel>(Blocks{1, 1})},
        {"transformer_blocks.*.ff_context.linear_out", "rowwise"},
    };
  }
  if (config.num_single_layers > 0) {
    plan.emplace_back("single_transformer_blocks.*.attn.to_qkv_mlp_proj",
                      std::make_shared<PackedColwiseParallel>());
    plan.emplace_back("single_transformer_blocks.*.attn.to_out",
                      std::make_shared<PackedRowwiseParallel>());
  }
  return plan;
}

ParallelPlan Flux2Transformer2DModel::TPPlan() { return TPPlan(loaders::Flux2Config()); }

TPConfig Flux2Transformer2DModel::tp_config() const {
  TPConfig t;
  t.num_attention_heads = config_.num_attention_heads;
  const int64_t d = config_.inner_dim(), m = config_.mlp_hidden_dim();
  if (config_.num_layers > 0) {
    t.packed_blocks.push_back({"transformer_blocks.*.ff.linear_in [gate|up]", {m, m}});
  }
  if (config_.num_single_layers > 0) {
    t.packed_blocks.push_back(
        {"single_transformer_blocks.*.attn.to_qkv_mlp_proj [Q|K|V|gate|up]", {d, d, d, m, m}});
    t.packed_blocks.push_back({"single_transformer_blocks.*.attn.to_out [attn|mlp]", {d, m}});
  }
  return t;
}

ParallelizeOptions Flux2Transformer2DModel::parallelize_options() const {
  ParallelizeOptions o;
  o.config = tp_config();
  o.uncovered_params = PlanCheck::kIgnore;  // modulations, embedders, norms: replicated on purpose
  o.unused_rules = PlanCheck::kError;       // the plan must match exactly
  return o;
}

absl::Status Flux2Transformer2DModel::Parallelize(const DeviceMesh& mesh, const ParallelPlan& plan) {
  return ParallelizeModule(*this, mesh, plan, parallelize_options());
}

absl::Status Flux2Transformer2DModel::ShardLoaded(const ParallelPlan& plan) {
  return nn::ShardLoaded(*this, plan, parallelize_options());
}

std::string Flux2Transformer2DModel::tp_plan() { return FormatPlacements(*this); }

std::optional<DeviceMesh> Flux2Transformer2DModel::mesh() const { return PlacedMesh(*this); }

absl::Status Flux2Transformer2DModel::CheckFusedLayouts(
    const loaders::Checkpoint& checkpoint) const {
  // The fused projections first, with the layout they must have (a generic shape mismatch would
  // not say why 3·D + 2·M).
  const int64_t d = config_.inner_dim(), m = config_.mlp_hidden_dim();
  for (int64_t i = 0; i < config_.num_single_layers; ++i) {
    const std::string prefix = absl::StrCat("single_transformer_blocks.", i, ".attn.");
    for (auto [name, rows, cols, layout] :
         {std::tuple<const char*, int64_t, int64_t, std::string>{
              "to_qkv_mlp_proj.weight", 3 * d + 2 * m, d,
              absl::StrCat("[Q|K|V|gate|up] = 3·", d, " + 2·", m, " rows")},
          {"to_out.weight", d, d + m, absl::StrCat("[attn|mlp] = ", d, " + ", m, " columns")}}) {
      absl::StatusOr<const loaders::TensorInfo*> info = checkpoint.Info(prefix + name);
      if (!info.ok()) continue;  // reported below with the parameter it belongs to
      if ((*info)->shape != Shape{rows, cols}) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", prefix, name, "' is ", ShapeToString((*info)->shape), "; Flux2 with D=", d,
            " and M=int(D*mlp_ratio)=", m, " packs it as ", ShapeToString(Shape{rows, cols}),
            ": ", layout, " (does config.json's mlp_ratio ", config_.mlp_ratio,
            " match the checkpoint?)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Flux2Transformer2DModel::CheckCheckpoint(const loaders::Checkpoint& checkpoint,
                                                      PlanCheck unused) const {
  DT_RETURN_IF_ERROR(CheckFusedLayouts(checkpoint));
  return nn::CheckCheckpoint(*this, checkpoint, "Flux2Transformer2DModel", unused);
}

absl::Status Flux2Transformer2DModel::LoadWeights(const loaders::Checkpoint& checkpoint,
                                                  const Flux2LoadOptions& options,
                                                  LoadReport* report) {
  loaders::ReadOptions ro;
  ro.zero_copy = options.zero_copy;
  return LoadCheckpoint(*this, checkpoint, ro, LeadsPlacedMesh(*this), report);
}

SaveOptions Flux2Transformer2DModel::save_options() const {
  SaveOptions o;
  o.file_stem = "diffusion_pytorch_model";
  o.files["config.json"] = loaders::Flux2ConfigToJson(config_);
  return o;
}

absl::StatusOr<std::unique_ptr<Flux2Transformer2DModel>> Flux2Transformer2DModel::FromPretrained(
    const std::string& dir, const DeviceMesh& mesh, const Flux2LoadOptions& options,
    LoadReport* report) {
  if (!IsFloating(options.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Flux2Transformer2DModel: compute dtype must be f32, bf16 or f16, got ",
        DTypeName(options.dtype)));
  }
  DT_ASSIGN_OR_RETURN(const std::string tdir, loaders::Flux2TransformerDir(dir));
  DT_ASSIGN_OR_RETURN(loaders::Flux2Config config, loaders::LoadFlux2Config(tdir));
  DT_ASSIGN_OR_RETURN(loaders::Checkpoint checkpoint, loaders::Checkpoint::Open(tdir));
  // Nothing below reads a weight until every check passed (Note [One loading path] in nn/load.h).
  DT_RETURN_IF_ERROR(CheckBlockCount(checkpoint, "transformer_blocks.", "num_layers",
                                     config.num_layers));
  DT_RETURN_IF_ERROR(CheckBlockCount(checkpoint, "single_transformer_blocks.",
                                     "num_single_layers", config.num_single_layers));
  auto model = std::make_unique<Flux2Transformer2DModel>(config, options.dtype);
  PretrainedLoad how;
  how.model = "Flux2Transformer2DModel";
  how.plan = options.plan.value_or(TPPlan(config));
  how.parallelize = model->parallelize_options();
  how.load_whole = options.load_whole;
  how.unused_tensors = options.unused_tensors;
  how.read.zero_copy = options.zero_copy;
  const Flux2Transformer2DModel* m = model.get();
  how.check = [m](const loaders::Checkpoint& c) { return m->CheckFusedLayouts(c); };
  DT_RETURN_IF_ERROR(LoadPretrained(*model, mesh, checkpoint, how, report));
  return model;
}

absl::StatusOr<std::unique_ptr<Flux2Transformer2DModel>> Flux2Transformer2DModel::FromPretrained(
    const std::string& dir, const std::shared_ptr<World>& world, const DistributedConfig& dist,
    Flux2LoadOptions options, LoadReport* report) {
  DT_ASSIGN_OR_RETURN(DeviceMesh tp, TensorParallelMesh(world, dist));
  if (!options.plan) {
    DT_ASSIGN_OR_RETURN(const loaders::Flux2Config config, loaders::LoadFlux2Config(dir));
    DT_ASSIGN_OR_RETURN(options.plan, EffectivePlan(dist, TPPlan(config)));
  }
  return FromPretrained(dir, tp, options, report);
}

absl::StatusOr<Tensor> Flux2Transformer2DModel::Run(const Flux2Inputs& in) {
  DT_ASSIGN_OR_RETURN(Values out, Call({Value(in.hidden_states), Value(in.encoder_hidden_states),
                                        Value(in.timestep), Value(in.guidance), Value(in.img_ids),
                                        Value(in.txt_ids)}));
  return WholeTensor(out[0]);
}

absl::StatusOr<Values> Flux2Transformer2DModel::Forward(Values inputs) {
  DT_RETURN_IF_ERROR(Arity(*this, inputs, 6,
                           "hidden_states, encoder_hidden_states, timestep, guidance, img_ids, "
                           "txt_ids"));
  const loaders::Flux2Config& c = config_;
  auto fail = [&](absl::string_view name, const Value& v, absl::string_view want) {
    return absl::InvalidArgumentError(absl::StrCat("Flux2Transformer2DModel: ", name, " must be ",
                                                   want, ", got ", v.Describe()));
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].is_dtensor()) {
      return absl::InvalidArgumentError(
          "Flux2Transformer2DModel takes plain tensors (the same on every rank), not DTensors");
    }
  }
  const Value& hs = inputs[0];
  const Value& ehs = inputs[1];
  if (!hs.defined() || hs.dim() != 3 || hs.shape()[2] != c.in_channels || hs.shape()[1] == 0) {
    return fail("hidden_states", hs, absl::StrCat("[B, S_img > 0, ", c.in_channels, "]"));
  }
  const int64_t b = hs.shape()[0], si = hs.shape()[1];
  if (!ehs.defined() || ehs.dim() != 3 || ehs.shape()[0] != b ||
      ehs.shape()[2] != c.joint_attention_dim) {
    return fail("encoder_hidden_states", ehs,
                absl::StrCat("[", b, ", S_txt, ", c.joint_attention_dim, "]"));
  }
  const int64_t st = ehs.shape()[1];
  auto check_vector = [&](absl::string_view name, const Value& v) -> absl::Status {
    if (v.dim() != 1 || v.shape()[0] != b || !IsFloating(v.dtype())) {
      return fail(name, v, absl::StrCat("a float [", b, "]"));
    }
    return absl::OkStatus();
  };
  DT_RETURN_IF_ERROR(check_vector("timestep", inputs[2]));
  // Note [Guidance is required]: diffusers skips the guidance embedding when guidance is None,
  // even for a guidance-distilled model (FLUX.2-dev), and returns an output the model was never
  // trained to give. A guidance model without guidance is refused here; guidance given to a model
  // without the embedder is ignored, as diffusers does (the klein pipelines pass it anyway).
  if (c.guidance_embeds && !inputs[3].defined()) {
    return absl::InvalidArgumentError(
        "Flux2Transformer2DModel: this model embeds guidance (config guidance_embeds: true), so "
        "guidance [B] is required (the pipeline's guidance_scale, e.g. 4.0)");
  }
  if (inputs[3].defined()) DT_RETURN_IF_ERROR(check_vector("guidance", inputs[3]));
  const int64_t axes = static_cast<int64_t>(c.axes_dims_rope.size());
  // ids [S, A] or [B, S, A] (diffusers uses batch 0).
  auto ids_of = [&](absl::string_view name, const Value& v, int64_t s) -> absl::StatusOr<Tensor> {
    if (!v.defined() || (v.dim() != 2 && v.dim() != 3) || v.shape()[v.dim() - 2] != s ||
        v.shape().back() != axes) {
      return fail(name, v, absl::StrCat("[", s, ", ", axes, "] or [B, ", s, ", ", axes, "]"));
    }
    return v.dim() == 3 ? v.local().Select(0, 0) : v.local();
  };
  DT_ASSIGN_OR_RETURN(Tensor img_ids, ids_of("img_ids", inputs[4], si));
  DT_ASSIGN_OR_RETURN(Tensor txt_ids, ids_of("txt_ids", inputs[5], st));

  // Timestep and guidance: cast to the model dtype, then × 1000 in it (diffusers' order).
  auto scaled = [&](const Value& v) -> absl::StatusOr<Value> {
    if (!v.defined()) return Value();
    DT_ASSIGN_OR_RETURN(Tensor t, ops::Cast(v.local(), dtype_));
    DT_ASSIGN_OR_RETURN(t, ops::Mul(t, 1000.0));
    DT_ASSIGN_OR_RETURN(t, ops::Cast(t, DType::kF32));
    return Value(t);
  };
  DT_ASSIGN_OR_RETURN(Value t, scaled(inputs[2]));
  DT_ASSIGN_OR_RETURN(Value g, scaled(inputs[3]));
  DT_ASSIGN_OR_RETURN(Value temb, time_guidance_embed_->CallOne({t, g}));
  DT_ASSIGN_OR_RETURN(Value mod_img, double_stream_modulation_img_->CallOne({temb}));
  DT_ASSIGN_OR_RETURN(Value mod_txt, double_stream_modulation_txt_->CallOne({temb}));
  DT_ASSIGN_OR_RETURN(Value mod_single, single_stream_modulation_->CallOne({temb}));

  DT_ASSIGN_OR_RETURN(Tensor x_in, ops::Cast(hs.local(), dtype_));
  DT_ASSIGN_OR_RETURN(Tensor c_in, ops::Cast(ehs.local(), dtype_));
  DT_ASSIGN_OR_RETURN(Value x, x_embedder_->CallOne({Value(x_in)}));
  DT_ASSIGN_OR_RETURN(Value ctx, context_embedder_->CallOne({Value(c_in)}));

  // Rotary tables, text tokens first; applied in f32 to q and k of the model dtype.
  DT_ASSIGN_OR_RETURN(Tensor ids, ops::Cat({txt_ids.dtype() == img_ids.dtype()
                                                ? txt_ids
                                                : ops::Cast(txt_ids, img_ids.dtype()).value(),
                                            img_ids},
                                           0));
  DT_ASSIGN_OR_RETURN(auto cs, Flux2RotaryTables(ids, c.axes_dims_rope, c.rope_theta));
  const Value cos(cs.first), sin(cs.second);

  for (int64_t i = 0; i < transformer_blocks_->size(); ++i) {
    DT_ASSIGN_OR_RETURN(Values xc, transformer_blocks_->at(i).Call({x, ctx, mod_img, mod_txt, cos, sin}));
    x = std::move(xc[0]);
    ctx = std::move(xc[1]);
  }
  DT_ASSIGN_OR_RETURN(Value h, ops::Cat({ctx, x}, 1));
  for (int64_t i = 0; i < single_transformer_blocks_->size(); ++i) {
    DT_ASSIGN_OR_RETURN(h, single_transformer_blocks_->at(i).CallOne({h, mod_single, cos, sin}));
  }
  DT_ASSIGN_OR_RETURN(std::vector<Value> parts, ops::Split(h, {st, si}, 1));
  DT_ASSIGN_OR_RETURN(Value y, norm_out_->CallOne({parts[1], temb}));
  DT_ASSIGN_OR_RETURN(y, proj_out_->CallOne({y}));
  return Values{std::move(y)};
}

// ---- pipeline pieces -----------------------------------------------------------------------------

absl::StatusOr<std::pair<Tensor, Tensor>> Flux2RotaryTables(const Tensor& ids,
                                                            const std::vector<int64_t>& axes_dims,
                                                            double theta) {
  if (!ids.defined() || ids.dim() != 2 || ids.size(1) != static_cast<int64_t>(axes_dims.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Flux2RotaryTables: ids must be [S, ", axes_dims.size(), "], got ",
        ids.defined() ? ids.Describe() : "undefined"));
  }
  const int64_t s = ids.size(0);
  int64_t width = 0;
  for (int64_t d : axes_dims) width += d;
  // diffusers converts ids to f32 first (ids.float()), then multiplies by f64 frequencies.
  DT_ASSIGN_OR_RETURN(Tensor pos_t, ops::Cast(ids, DType::kF32));
  const std::vector<float> pos = pos_t.ToVector<float>();
  std::vector<float> cos(static_cast<size_t>(s * width)), sin(cos.size());
  int64_t col = 0;
  for (size_t axis = 0; axis < axes_dims.size(); ++axis) {
    const int64_t d = axes_dims[axis];
    for (int64_t j = 0; j < d / 2; ++j) {
      const double inv = 1.0 / std::pow(theta, static_cast<double>(2 * j) / static_cast<double>(d));
      for (int64_t r = 0; r < s; ++r) {
        const double a = static_cast<double>(pos[r * axes_dims.size() + axis]) * inv;
        const float ca = static_cast<float>(std::cos(a)), sa = static_cast<float>(std::sin(a));
        const size_t at = static_cast<size_t>(r * width + col + 2 * j);
        cos[at] = cos[at + 1] = ca;
        sin[at] = sin[at + 1] = sa;
      }
    }
    col += d;
  }
  DT_ASSIGN_OR_RETURN(Tensor c, Tensor::FromVector<float>({s, width}, cos));
  DT_ASSIGN_OR_RETURN(Tensor sn, Tensor::FromVector<float>({s, width}, sin));
  return std::make_pair(std::move(c), std::move(sn));
}

absl::StatusOr<Tensor> Flux2TimestepProjection(const Tensor& t, int64_t channels) {
  if (!t.defined() || t.dim() != 1 || channels <= 0 || channels % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Flux2TimestepProjection: t must be [B] and channels even, got ",
        t.defined() ? t.Describe() : "undefined", " and ", channels));
  }
  const int64_t half = channels / 2, b = t.size(0);
  // In f32 as diffusers' get_timestep_embedding: exponent = -ln(10000) · k / half.
  const float log_period = static_cast<float>(-std::log(10000.0));
  std::vector<float> freq(static_cast<size_t>(half));
  for (int64_t k = 0; k < half; ++k) {
    freq[k] = std::exp(log_period * static_cast<float>(k) / static_cast<float>(half));
  }
  const std::vector<float> tv = t.ToVector<float>();
  std::vector<float> out(static_cast<size_t>(b * channels));
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t k = 0; k < half; ++k) {
      const float a = tv[i] * freq[k];
      out[i * channels + k] = std::cos(a);
      out[i * channels + half + k] = std::sin(a);
    }
  }
  return Tensor::FromVector<float>({b, channels}, out);
}

absl::StatusOr<Tensor> Flux2LatentIds(int64_t height, int64_t width) {
  if (height <= 0 || width <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("Flux2LatentIds: the latent grid ", height,
                                                   " x ", width, " is empty"));
  }
  std::vector<int64_t> ids;
  ids.reserve(static_cast<size_t>(height * width * 4));
  for (int64_t r = 0; r < height; ++r) {
    for (int64_t c = 0; c < width; ++c) ids.insert(ids.end(), {0, r, c, 0});
  }
  return Tensor::FromVector<int64_t>({height * width, 4}, ids);
}

absl::StatusOr<Tensor> Flux2TextIds(int64_t length) {
  if (length <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("Flux2TextIds: length ", length, " <= 0"));
  }
  std::vector<int64_t> ids;
  for (int64_t l = 0; l < length; ++l) ids.insert(ids.end(), {0, 0, 0, l});
  return Tensor::FromVector<int64_t>({length, 4}, ids);
}

}  // namespace dt::nn
