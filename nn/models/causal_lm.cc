#include "dtensor/nn/models/causal_lm.h"

#include "dtensor/loaders/gguf_llama.h"
#include "dtensor/loaders/moe_checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"
#include "dtensor/nn/attention.h"
#include "dtensor/nn/expert_parallel.h"
#include "dtensor/nn/init.h"
#include "dtensor/nn/latent_attention.h"
#include "dtensor/nn/linear.h"
#include "dtensor/nn/load.h"
#include "dtensor/nn/mlp.h"
#include "dtensor/nn/moe.h"
#include "dtensor/nn/norm.h"
#include "dtensor/nn/models/uneven_heads.h"
#include "dtensor/ops/value_ops.h"

namespace dt::nn {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

// ---- layers --------------------------------------------------------------------------------------

namespace {

// The attention and the MLP a layer of the family has (Note [Adding a family] in
// nn/models/decoder_family.h: other kinds of blocks — experts, latent attention — branch here,
// with the layer index for families whose layers differ).
// transformers' yarn_apply_mscale: with YaRN's mscale_all_dim, latent attention scales its softmax
// by mscale² as well (DeepSeek's reference does; the rotary dims are scaled by the table already).
double LatentSoftmaxScale(const loaders::DecoderConfig& c) {
  double scale = 1.0 / std::sqrt(static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim));
  const loaders::RopeScaling& r = c.rope_scaling;
  if (r.rope_type != "default" && r.mscale_all_dim && *r.mscale_all_dim != 0 && r.factor > 1) {
    const double m = 0.1 * *r.mscale_all_dim * std::log(r.factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

std::unique_ptr<Module> MakeAttention(const loaders::DecoderConfig& c, int64_t layer,
                                      DType dtype) {
  const DecoderFamily& f = FamilyOf(c);
  if (f.latent_attention) {
    LatentAttentionOptions l;
    l.hidden_size = c.hidden_size;
    l.num_heads = c.num_attention_heads;
    l.q_lora_rank = c.q_lora_rank;
    l.kv_lora_rank = c.kv_lora_rank;
    l.qk_nope_head_dim = c.qk_nope_head_dim;
    l.qk_rope_head_dim = c.qk_rope_head_dim;
    l.v_head_dim = c.v_head_dim;
    l.bias = c.attention_bias;
    l.norm_eps = 1e-6;  // DeepseekV2RMSNorm's default: the config's rms_norm_eps is not passed
    l.softmax_scale = LatentSoftmaxScale(c);
    l.rotary_style = ops::RotaryStyle::kInterleaved;
    l.dtype = dtype;
    auto attention = std::make_unique<LatentAttention>(l);
    attention->EnableKVCache(true);
    return attention;
  }
  AttentionOptions a;
  a.hidden_size = c.hidden_size;
  a.num_heads = c.num_attention_heads;
  a.num_kv_heads = c.num_key_value_heads;
  a.head_dim = c.head_dim;
  a.bias = c.o_bias();
  a.qkv_bias = c.qkv_bias();
  a.qk_norm = f.qk_norm || f.qk_norm_whole;
  a.qk_norm_whole = f.qk_norm_whole;
  a.norm_form = f.norm_form;
  a.norm_eps = c.rms_norm_eps;
  a.fused_qkv = f.fused_qkv;
  if (f.gated_attention) {  // transformers' module name (the checkpoint's is q_proj)
    a.gated = true;
    a.q_name = "q_gate_proj";
  }
  a.causal = true;
  // Gemma 2's scores: its scale, soft-cap and the layer's window (loaders/hf_config.h).
  if (c.query_pre_attn_scalar > 0) a.scale = 1.0 / std::sqrt(c.query_pre_attn_scalar);
  if (c.attn_logit_softcapping > 0) a.softcap = c.attn_logit_softcapping;
  if (layer < static_cast<int64_t>(c.layer_windows.size()) && c.layer_windows[layer] > 0) {
    a.window = c.layer_windows[layer];
  }
  a.sinks = f.sinks;
  a.rotary_style = ops::RotaryStyle::kHalf;
  a.dtype = dtype;
  auto attention = std::make_unique<Attention>(a);
  attention->EnableKVCache(true);
  return attention;
}

std::unique_ptr<Module> MakeMlp(const loaders::DecoderConfig& c, int64_t layer, DType dtype) {
  const Activation act = ParseActivation(c.hidden_act).value_or(Activation::kSilu);  // ValidateConfig
  if (c.IsMoeLayer(layer)) {
    // Note [MoE blocks] in nn/models/decoder_family.h.
    const DecoderFamily& f = FamilyOf(c);
    MoeBlockOptions o;
    o.router.hidden_size = c.hidden_size;
    o.router.num_experts = c.num_experts;
    o.router.top_k = c.num_experts_per_tok;
    o.router.bias = f.router_bias;
    o.router_name = f.router_name;
    o.router.normalize = c.norm_topk_prob;
    o.router.scaling = c.routed_scaling_factor;
    o.router.f32_logits = f.router_f32;
    o.router.weights_in_input_dtype = f.router_weights_in_input_dtype;
    o.router.scoring = f.router_scoring;
    if (f.router_scoring == RouterScoring::kSigmoid) {
      o.router.num_groups = c.n_group;
      o.router.topk_groups = c.topk_group;
    }
    o.router.dtype = dtype;
    o.experts.num_experts = c.num_experts;
    o.experts.hidden_size = c.hidden_size;
    o.experts.intermediate_size = c.moe_intermediate_size;
    o.experts.activation = act;
    o.experts.layout = f.experts_layout;
    o.experts.swiglu_limit = c.swiglu_limit;
    o.experts.swiglu_alpha = c.swiglu_alpha;
    o.experts.dtype = dtype;
    o.shared_intermediate_size = c.n_shared_experts * c.moe_intermediate_size;
    o.shared_bias = c.mlp_bias;
    return std::make_unique<MoeBlock>(o);
  }
  SwiGLUOptions m;
  m.hidden_size = c.hidden_size;
  m.intermediate_size = c.intermediate_size;
  m.bias = c.mlp_bias;
  m.fused = FamilyOf(c).fused_gate_up;
  m.activation = act;
  m.dtype = dtype;
  return std::make_unique<SwiGLUMLP>(m);
}

}  // namespace

DecoderLayer::DecoderLayer(const loaders::DecoderConfig& c, int64_t index, DType dtype)
    : Module("DecoderLayer") {
  const DecoderFamily& f = FamilyOf(c);
  auto norm = [&](const char* name) {
    return &AddModule<RMSNorm>(name, c.hidden_size, c.rms_norm_eps, dtype, f.norm_form);
  };
  // Note [Layer norms] in nn/models/decoder_family.h, in transformers' registration order.
  if (f.layer_norms != LayerNorms::kPost) input_layernorm_ = norm("input_layernorm");
  self_attn_ = &RegisterModule("self_attn", MakeAttention(c, index, dtype));
  if (f.layer_norms == LayerNorms::kPre) {
    pre_mlp_norm_ = norm("post_attention_layernorm");
  } else {
    post_attention_norm_ = norm("post_attention_layernorm");
  }
  if (f.layer_norms == LayerNorms::kPreAndPost) pre_mlp_norm_ = norm("pre_feedforward_layernorm");
  mlp_ = &RegisterModule("mlp", MakeMlp(c, index, dtype));
  if (f.layer_norms != LayerNorms::kPre) post_mlp_norm_ = norm("post_feedforward_layernorm");
}

namespace {

// `norm` of x, or x itself where the layer has no such norm.
absl::StatusOr<Value> MaybeNorm(RMSNorm* norm, const Value& x) {
  if (norm == nullptr) return x;
  return norm->CallOne({x});
}

}  // namespace

absl::StatusOr<Values> DecoderLayer::Forward(Values inputs) {
  if (inputs.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat("DecoderLayer '", FullName(),
                                                   "' takes {h, cos, sin}, got ", inputs.size(),
                                                   " inputs"));
  }
  const Value& h = inputs[0];
  DT_ASSIGN_OR_RETURN(Value x, MaybeNorm(input_layernorm_, h));
  DT_ASSIGN_OR_RETURN(Value a, self_attn_->CallOne({x, inputs[1], inputs[2]}));
  DT_ASSIGN_OR_RETURN(a, MaybeNorm(post_attention_norm_, a));
  DT_ASSIGN_OR_RETURN(Value r, ops::Add(h, a));
  DT_ASSIGN_OR_RETURN(x, MaybeNorm(pre_mlp_norm_, r));
  DT_ASSIGN_OR_RETURN(Value m, mlp_->CallOne({x}));
  DT_ASSIGN_OR_RETURN(m, MaybeNorm(post_mlp_norm_, m));
  DT_ASSIGN_OR_RETURN(Value out, ops::Add(r, m));
  return Values{std::move(out)};
}

DecoderModel::DecoderModel(const loaders::DecoderConfig& c, DType dtype) : Module("DecoderModel") {
  embed_tokens_ = &AddModule<Embedding>("embed_tokens", c.vocab_size, c.hidden_size, dtype);
  layers_ = &AddModule<ModuleList>("layers");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers_->Append(std::make_unique<DecoderLayer>(c, i, dtype));
  }
  norm_ = &AddModule<RMSNorm>("norm", c.hidden_size, c.rms_norm_eps, dtype, FamilyOf(c).norm_form);
  if (FamilyOf(c).embed_scale) embed_scale_ = std::sqrt(static_cast<double>(c.hidden_size));
  // The frequencies with the config's scaling applied, updated with the sequence length as
  // transformers does (dynamic, longrope; loaders/rope.h).
  auto schedule = std::make_shared<loaders::RopeSchedule>(loaders::DecoderRopeSpec(c));
  rope_by_length_ = schedule->depends_on_length();
  rotary_emb_ = &AddModule<RotaryEmbedding>(
      "rotary_emb",
      [schedule](int64_t seq_len) {
        const loaders::RopeTable& t = seq_len > 0 ? schedule->ForLength(seq_len) : schedule->current();
        return RotaryTable{t.inv_freq, t.attention_scaling};
      },
      absl::StrCat("theta=", c.rope_theta, c.rope_scaling.rope_type == "default" ? "" : ", ",
                   c.rope_scaling.rope_type == "default" ? "" : c.rope_scaling.rope_type),
      FamilyOf(c).rotary_interleaved ? ops::RotaryStyle::kInterleaved : ops::RotaryStyle::kHalf);
  if (c.local_rope_theta > 0) {
    // Gemma 3: the sliding layers' table, default rope with their base (no file, as rotary_emb).
    auto local = std::make_shared<loaders::RopeTable>(loaders::ComputeRope(
        loaders::RopeSpec{loaders::RopeScaling{}, c.head_dim, c.local_rope_theta,
                          c.max_position_embeddings}));
    rotary_emb_local_ = &AddModule<RotaryEmbedding>(
        "rotary_emb_local",
        [local](int64_t) { return RotaryTable{local->inv_freq, local->attention_scaling}; },
        absl::StrCat("theta=", c.local_rope_theta), ops::RotaryStyle::kHalf);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      local_layers_.push_back(i < static_cast<int64_t>(c.layer_windows.size()) &&
                              c.layer_windows[i] > 0);
    }
  }
}

absl::StatusOr<Values> DecoderModel::Forward(Values inputs) {
  if (inputs.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecoderModel takes {ids, positions}, got ", inputs.size(), " inputs"));
  }
  DT_ASSIGN_OR_RETURN(Values cs, rotary_emb_->Call({inputs[1]}));
  DT_ASSIGN_OR_RETURN(Value h, RunLayers(inputs[0], cs[0], cs[1], inputs[1]));
  DT_ASSIGN_OR_RETURN(h, norm_->CallOne({h}));
  return Values{std::move(h)};
}

namespace {

// cos and sin as the layers take them: in the model dtype (as transformers hands them to
// attention), [B, S, D] -> [B, 1, S, D] once, not in each layer's attention (which takes either).
absl::Status ForLayers(DType dtype, Value* cos, Value* sin) {
  DT_ASSIGN_OR_RETURN(*cos, ops::Cast(*cos, dtype));
  DT_ASSIGN_OR_RETURN(*sin, ops::Cast(*sin, dtype));
  if (cos->dim() == 3) {
    DT_ASSIGN_OR_RETURN(*cos, ops::Unsqueeze(*cos, 1));
    DT_ASSIGN_OR_RETURN(*sin, ops::Unsqueeze(*sin, 1));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Value> DecoderModel::RunLayers(const Value& ids, Value cos, Value sin,
                                              const Value& positions) {
  DT_ASSIGN_OR_RETURN(Value h, embed_tokens_->CallOne({ids}));
  if (embed_scale_) {
    // Gemma: the scale rounded to the embeddings' dtype, then the product in it (transformers'
    // embed_scale.to(weight.dtype)).
    DT_ASSIGN_OR_RETURN(Tensor scale, Tensor::FromVector<float>({1}, {static_cast<float>(*embed_scale_)}));
    DT_ASSIGN_OR_RETURN(scale, ops::Cast(scale, h.dtype()));
    DT_ASSIGN_OR_RETURN(scale, ops::Cast(scale, DType::kF32));
    DT_ASSIGN_OR_RETURN(h, ops::Mul(h, static_cast<double>(scale.data<float>()[0])));
  }
  DT_RETURN_IF_ERROR(ForLayers(h.dtype(), &cos, &sin));
  Value cos_local, sin_local;
  if (rotary_emb_local_ != nullptr) {
    DT_ASSIGN_OR_RETURN(Values cs, rotary_emb_local_->Call({positions}));
    cos_local = cs[0];
    sin_local = cs[1];
    DT_RETURN_IF_ERROR(ForLayers(h.dtype(), &cos_local, &sin_local));
  }
  for (int64_t i = 0; i < layers_->size(); ++i) {
    const bool local = i < static_cast<int64_t>(local_layers_.size()) && local_layers_[i];
    DT_ASSIGN_OR_RETURN(h, layers_->at(i).CallOne({h, local ? cos_local : cos,
                                                   local ? sin_local : sin}));
  }
  return h;
}

absl::StatusOr<Value> DecoderModel::StepHidden(const Tensor& ids, const Tensor& positions,
                                               absl::Span<const int64_t> segments) {
  // One table for every token when it does not depend on the length; else each sequence's, as
  // its own forward would pick (a prefill chunk picks by the chunk's end, as transformers' does).
  if (!rope_by_length_ || segments.size() <= 1) {
    DT_ASSIGN_OR_RETURN(Values cs, rotary_emb_->Call({Value(positions)}));
    return RunLayers(Value(ids), cs[0], cs[1], Value(positions));
  }
  std::vector<Tensor> cos, sin;
  int64_t at = 0;
  for (const int64_t n : segments) {
    DT_ASSIGN_OR_RETURN(Tensor part, positions.Narrow(0, at, n));
    DT_ASSIGN_OR_RETURN(Values cs, rotary_emb_->Call({Value(part)}));
    cos.push_back(cs[0].local());
    sin.push_back(cs[1].local());
    at += n;
  }
  DT_ASSIGN_OR_RETURN(Tensor c, ops::Cat(cos, 0));
  DT_ASSIGN_OR_RETURN(Tensor s, ops::Cat(sin, 0));
  return RunLayers(Value(ids), Value(std::move(c)), Value(std::move(s)), Value(positions));
}

// ---- CausalLM ------------------------------------------------------------------------------------

CausalLM::CausalLM(const loaders::DecoderConfig& config, DType dtype)
    : Module(config.config_class().architecture), config_(config), dtype_(dtype) {
  model_ = &AddModule<DecoderModel>("model", config, dtype);
  lm_head_ =
      &AddModule<Linear>("lm_head", config.hidden_size, config.vocab_size, /*bias=*/false, dtype);
}

CausalLM::~CausalLM() = default;

absl::Status CausalLM::ValidateConfig(const loaders::DecoderConfig& config) {
  DT_RETURN_IF_ERROR(FindDecoderFamily(config.model_type).status());
  absl::StatusOr<Activation> act = ParseActivation(config.hidden_act);
  if (!act.ok()) {
    return absl::UnimplementedError(absl::StrCat(config.config_class().architecture,
                                                 ": hidden_act \"", config.hidden_act, "\": ",
                                                 act.status().message()));
  }
  return absl::OkStatus();
}

ParallelPlan CausalLM::TPPlan(const loaders::DecoderConfig& config, bool shard_embedding,
                              bool replicate_kv) {
  const DecoderFamily& f = FamilyOf(config);
  ParallelPlan plan;
  // Latent attention builds q_proj or q_a_proj / q_b_proj, as the config says: the other's rule
  // would match nothing.
  const std::string unbuilt_q = !f.latent_attention   ? ""
                                : config.q_lora_rank > 0 ? ".self_attn.q_proj"
                                                         : ".self_attn.q_b_proj";
  auto add = [&](const std::vector<std::pair<std::string, std::string>>& entries) {
    for (const auto& [key, style] : entries) {
      if (!unbuilt_q.empty() && absl::EndsWith(key, unbuilt_q)) continue;
      const bool kv =
          absl::EndsWith(key, ".self_attn.k_proj") || absl::EndsWith(key, ".self_attn.v_proj");
      plan.emplace_back(key, replicate_kv && kv ? "replicate" : style);
    }
  };
  add(f.tp_plan);
  // The dense MLP's rules where a layer is dense, the experts' where one is sparse, so that no
  // rule of the plan matches nothing (Note [Plan checks]).
  if (config.HasDenseLayers()) add(f.mlp_plan);
  if (config.HasMoeLayers()) add(f.moe_plan);
  if (shard_embedding) plan.emplace_back("model.embed_tokens", "embedding_rowwise");
  return plan;
}

// Note [KV heads past tp]
// transformers' plans split k_proj / v_proj colwise, so a tp that does not divide the KV heads
// (Mixtral- and Qwen3-MoE-shaped models with 2 KV heads at tp 4, or at ep 4 where the dense layers
// split over the same ranks) would leave a rank a fraction of a head. The default plan instead
// splits them unit_colwise there (Note [Unit meshes] in nn/styles.h): G = gcd(KV heads, tp) groups
// of whole KV heads, each held by the tp / G consecutive ranks whose query heads use it, and each
// rank computes and caches only the KV heads its query heads use (Note [Replicated KV heads] in
// nn/attention.cc). When tp is a multiple of the KV heads this is vLLM's replication: KV head h on
// ranks h·tp/kv .. (h+1)·tp/kv - 1, one KV head per rank in the KV cache (paged or not). Where tp
// divides the KV heads the plan stays colwise (the same pieces: G = tp). The load report says
// which (LoadReport::notes).
ParallelPlan CausalLM::FitKVHeads(ParallelPlan plan, const loaders::DecoderConfig& config,
                                  int64_t tp) {
  if (tp <= 1 || config.num_key_value_heads % tp == 0) return plan;
  for (auto& [key, style] : plan) {
    const bool kv =
        absl::EndsWith(key, ".self_attn.k_proj") || absl::EndsWith(key, ".self_attn.v_proj");
    if (kv && style.name == "colwise") style = PlanEntry("unit_colwise");
  }
  return plan;
}

ParallelPlan CausalLM::EPPlan(const loaders::DecoderConfig& config, bool all_reduce) {
  ParallelPlan plan;
  if (!config.HasMoeLayers()) return plan;
  const DecoderFamily& f = FamilyOf(config);
  for (const auto& [key, style] : all_reduce ? f.ep_all_reduce_plan : f.ep_plan) {
    plan.emplace_back(key, style);
  }
  return plan;
}

ParallelPlan CausalLM::TPPlan(bool shard_embedding) {
  return TPPlan(loaders::DecoderConfig(), shard_embedding);
}

ParallelizeOptions CausalLM::parallelize_options() const {
  ParallelizeOptions o;
  o.uncovered_params = PlanCheck::kIgnore;  // norms and (by default) the embedding, on purpose
  return o;
}

absl::Status CausalLM::Parallelize(const DeviceMesh& mesh, bool shard_embedding) {
  const int64_t tp = mesh.ndim() == 2 ? mesh.Size(1) : mesh.Size();
  return Parallelize(mesh, FitKVHeads(TPPlan(config_, shard_embedding), config_, tp),
                     mesh.ndim() == 2 ? EPPlan(config_) : ParallelPlan());
}

absl::Status CausalLM::Parallelize(const DeviceMesh& mesh, const ParallelPlan& plan,
                                   const ParallelPlan& ep_plan) {
  DT_RETURN_IF_ERROR(ValidateConfig(config_));
  if (mesh.ndim() == 2 || !ep_plan.empty()) {
    DT_RETURN_IF_ERROR(
        ParallelizeModuleWithEP(*this, mesh, plan, ep_plan, parallelize_options()));
  } else {
    DT_RETURN_IF_ERROR(ParallelizeModule(*this, mesh, plan, parallelize_options()));
  }
  mesh_ = mesh;
  return absl::OkStatus();
}

absl::Status CausalLM::ShardLoaded(const ParallelPlan& plan) {
  return nn::ShardLoaded(*this, plan, parallelize_options());
}

std::string CausalLM::tp_plan() { return FormatPlacements(*this); }

namespace {

// The name a gated family's checkpoints give q_gate_proj (Note [Gated attention] in
// nn/attention.h): transformers renames self_attn.q_proj on load and back on save.
std::string HubName(const loaders::DecoderConfig& config, absl::string_view name) {
  constexpr absl::string_view kModule = ".self_attn.q_gate_proj.";
  const size_t at = name.find(kModule);
  if (!FamilyOf(config).gated_attention || at == absl::string_view::npos) return std::string(name);
  return absl::StrCat(name.substr(0, at), ".self_attn.q_proj.", name.substr(at + kModule.size()));
}

}  // namespace

std::string CausalLM::CheckpointName(absl::string_view name) const {
  if (config_.tie_word_embeddings && name == "lm_head.weight") return "model.embed_tokens.weight";
  return HubName(config_, name);
}

SaveOptions CausalLM::save_options() const {
  SaveOptions o;
  const bool tied = config_.tie_word_embeddings;
  o.checkpoint_name = [tied, config = config_](const std::string& name) {
    return tied && name == "lm_head.weight" ? std::string() : HubName(config, name);
  };
  o.files["config.json"] = loaders::DecoderConfigToJson(config_);
  return o;
}

absl::Status CausalLM::CheckCheckpoint(const loaders::Checkpoint& checkpoint,
                                       PlanCheck unused) const {
  return nn::CheckCheckpoint(
      *this, checkpoint, type_name(), unused,
      [this](absl::string_view name) { return CheckpointName(name); },
      checkpoint.gguf() != nullptr ? loaders::GgufConfigTensors(*checkpoint.gguf())
                                   : std::vector<std::string>());
}

absl::Status CausalLM::LoadWeights(const loaders::Checkpoint& checkpoint,
                                   const CausalLMLoadOptions& options, LoadReport* report) {
  loaders::ReadOptions ro;
  ro.zero_copy = options.zero_copy;
  // On the mesh's first rank: a progress bar on a terminal when loading takes over a second.
  return LoadCheckpoint(*this, checkpoint, ro, LeadsPlacedMesh(*this), report,
                        [this](absl::string_view name) { return CheckpointName(name); });
}

namespace {

// What the load report says of the KV heads when `plan` keeps them whole per rank at a tp that
// does not divide them (Note [KV heads past tp]); nullopt otherwise.
std::optional<std::string> KVHeadsNote(const ParallelPlan& plan,
                                       const loaders::DecoderConfig& c, int64_t tp) {
  const int64_t kv = c.num_key_value_heads;
  if (tp <= 1 || kv % tp == 0) return std::nullopt;
  for (const auto& [key, style] : plan) {
    if (!absl::EndsWith(key, ".self_attn.k_proj")) continue;
    if (style.name == "unit_colwise") {
      const int64_t g = std::gcd(kv, tp);
      return absl::StrCat(kv, " KV heads on ", tp, " ranks: k_proj / v_proj unit_colwise, ",
                          kv / g, " KV head", kv / g == 1 ? "" : "s", " per rank, each held by ",
                          tp / g, " ranks (the ranks whose query heads use it: ",
                          "Note [KV heads past tp])");
    }
    if (style.name == "replicate") {
      return absl::StrCat(kv, " KV heads on ", tp, " ranks: k_proj / v_proj replicated, each ",
                          "rank computing every KV head and keeping those its query heads use");
    }
  }
  return std::nullopt;
}

}  // namespace

namespace {

// CausalLM::SetKVCacheDType's checks of `kv` for a model computing in `compute` on `device`.
absl::Status CheckKVCacheDType(std::optional<DType> kv, DType compute, Device device) {
  if (!kv.has_value() || *kv == compute) return absl::OkStatus();
  if (!IsFloating(*kv)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the KV cache's dtype must be f32, bf16 or f16, got ", DTypeName(*kv)));
  }
  if (!device.is_cpu()) {
    return absl::UnimplementedError(absl::StrCat(
        "a KV cache of another dtype (", DTypeName(*kv), ") than the compute dtype (",
        DTypeName(compute), ") is CPU only; the model is on ", device.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CausalLM>> CausalLM::FromPretrained(
    const std::string& dir, const DeviceMesh& mesh, const CausalLMLoadOptions& options,
    LoadReport* report) {
  // A GGUF's config is in its header: read it from the checkpoint opened once.
  DT_ASSIGN_OR_RETURN(loaders::Checkpoint checkpoint, loaders::Checkpoint::Open(dir));
  DT_ASSIGN_OR_RETURN(loaders::DecoderConfig config,
                      checkpoint.gguf() != nullptr ? loaders::DecoderConfigFromGguf(*checkpoint.gguf())
                                                   : loaders::LoadDecoderConfig(dir));
  DT_RETURN_IF_ERROR(ValidateConfig(config));
  const std::string name = config.config_class().architecture;
  const DType dtype = options.dtype.value_or(config.dtype);
  if (!IsFloating(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": compute dtype must be f32, bf16 or f16, got ", DTypeName(dtype)));
  }
  DT_RETURN_IF_ERROR(CheckKVCacheDType(options.kv_dtype, dtype, mesh.device()));
  // The config decides how many modules are built: its sizes against the checkpoint's headers
  // first (Note [Config against checkpoint] in nn/load.h).
  DT_RETURN_IF_ERROR(CheckBlockCount(checkpoint, "model.layers.", "num_hidden_layers",
                                     config.num_hidden_layers));
  // Experts stored one tensor per expert (or GGUF's stacks) read as transformers 5's stacks.
  DT_RETURN_IF_ERROR(loaders::AddMoeComposites(checkpoint, config));
  absl::StatusOr<const loaders::TensorInfo*> embed = checkpoint.Info("model.embed_tokens.weight");
  if (embed.ok() && (*embed)->shape != Shape{config.vocab_size, config.hidden_size}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config vocab_size ", config.vocab_size, " and hidden_size ", config.hidden_size,
        " do not match checkpoint '", checkpoint.path(), "': model.embed_tokens.weight is ",
        ShapeToString((*embed)->shape)));
  }
  auto model = std::make_unique<CausalLM>(config, dtype);
  PretrainedLoad how;
  how.model = name;
  const int64_t tp = mesh.ndim() == 2 ? mesh.Size(1) : mesh.Size();
  how.plan = options.plan.value_or(FitKVHeads(
      FitUnevenHeads(TPPlan(config, options.shard_embedding, options.replicate_kv), config,
                     options.uneven_heads ? tp : 1),
      config, tp));
  if (mesh.ndim() == 2 || (options.ep_plan && !options.ep_plan->empty())) {
    how.ep_plan = options.ep_plan.value_or(EPPlan(config));
    if (how.ep_plan.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": expert parallelism over ", mesh.ToString(), " needs experts; ",
          config.model_type, " ", config.HasMoeLayers() ? "has no expert-parallel plan"
                                                        : "has no sparse layer"));
    }
  }
  how.parallelize = model->parallelize_options();
  how.parallelize.unused_rules = options.unused_rules;
  how.load_whole = options.load_whole;
  how.unused_tensors = options.unused_tensors;
  how.read.zero_copy = options.zero_copy;
  how.keep_quantized = options.keep_quantized;
  how.quantized_misfit = options.quantized_misfit;
  how.compute = dtype;
  CausalLM* m = model.get();
  how.source = [m](absl::string_view param) { return m->CheckpointName(param); };
  if (checkpoint.gguf() != nullptr) {
    how.config_tensors = loaders::GgufConfigTensors(*checkpoint.gguf());
  }
  DT_RETURN_IF_ERROR(LoadPretrained(*model, mesh, checkpoint, how, report));
  model->mesh_ = mesh;
  DT_RETURN_IF_ERROR(model->SetKVCacheDType(options.kv_dtype));
  if (report != nullptr) {
    if (std::optional<std::string> kv = KVHeadsNote(how.plan, config, tp)) {
      report->notes.push_back(*std::move(kv));
    }
    if (std::optional<std::string> heads = UnevenHeadsNote(how.plan, config, tp)) {
      report->notes.push_back(*std::move(heads));
    }
  }
  return model;
}

absl::StatusOr<std::unique_ptr<CausalLM>> CausalLM::FromPretrained(
    const std::string& dir, const std::shared_ptr<World>& world, const DistributedConfig& dist,
    CausalLMLoadOptions options, LoadReport* report) {
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, ModelMesh(world, dist));
  return FromPretrained(dir, mesh, dist, std::move(options), report);
}

absl::StatusOr<std::unique_ptr<CausalLM>> CausalLM::FromPretrained(
    const std::string& dir, const DeviceMesh& mesh, const DistributedConfig& dist,
    CausalLMLoadOptions options, LoadReport* report) {
  DT_ASSIGN_OR_RETURN(DeviceMesh on, ModelMesh(mesh, dist));
  options.unused_rules = dist.unmatched_keys;
  const bool ep = dist.ep_size > 1;
  if (!options.plan || (ep && !options.ep_plan)) {
    DT_ASSIGN_OR_RETURN(const loaders::DecoderConfig config, loaders::LoadDecoderConfig(dir));
    if (!options.plan) {
      const int64_t tp = on.ndim() == 2 ? on.Size(1) : on.Size();
      DT_ASSIGN_OR_RETURN(
          options.plan,
          EffectivePlan(dist, FitKVHeads(FitUnevenHeads(TPPlan(config, options.shard_embedding,
                                                               options.replicate_kv),
                                                        config, options.uneven_heads ? tp : 1),
                                         config, tp)));
    }
    if (ep && !options.ep_plan) {
      DT_ASSIGN_OR_RETURN(options.ep_plan,
                          EffectiveEPPlan(dist, EPPlan(config), EPPlan(config, true)));
      if (options.ep_plan->empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            config.config_class().architecture, ": ep_size ", dist.ep_size, " needs experts; ",
            config.model_type, " has no sparse layer"));
      }
    }
  }
  return FromPretrained(dir, on, options, report);
}

absl::Status CausalLM::SetKVCacheDType(std::optional<DType> dtype) {
  DT_RETURN_IF_ERROR(CheckKVCacheDType(dtype, dtype_, mesh_ ? mesh_->device() : Device()));
  for (auto& [name, m] : NamedModules()) {
    if (auto* a = dynamic_cast<Attention*>(m)) a->SetKVCacheDType(dtype);
    if (auto* l = dynamic_cast<LatentAttention*>(m)) l->SetKVCacheDType(dtype);
  }
  kv_dtype_ = dtype;
  past_ = 0;
  return absl::OkStatus();
}

int64_t CausalLM::kv_cache_bytes() {
  int64_t n = 0;
  for (const auto& [name, m] : NamedModules()) {
    if (const auto* a = dynamic_cast<const Attention*>(m)) n += a->kv_cache_bytes();
    if (const auto* l = dynamic_cast<const LatentAttention*>(m)) n += l->kv_cache_bytes();
  }
  return n;
}

void CausalLM::ResetCache(int64_t reserve) {
  for (auto& [name, m] : NamedModules()) {
    if (auto* a = dynamic_cast<Attention*>(m)) a->ResetKVCache(reserve);
    if (auto* l = dynamic_cast<LatentAttention*>(m)) l->ResetKVCache(reserve);
  }
  past_ = 0;
}

// ---- non-finite values --------------------------------------------------------------------------

namespace {

constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
constexpr const char* kKinds[] = {"NaN", "+inf", "-inf"};

// The kind (0: NaN, 1: +inf, 2: -inf) of the first non-finite element of `t` (any dtype, device
// and strides; integers are finite), read as f32.
absl::StatusOr<std::optional<int>> NonFiniteKind(const Tensor& t) {
  if (!t.defined() || t.numel() == 0 || !(IsFloating(t.dtype()) || IsQuantized(t.dtype()))) {
    return std::nullopt;
  }
  Tensor f = t;
  if (!f.device().is_cpu()) {
    DT_ASSIGN_OR_RETURN(f, f.To(kCPU));
  }
  if (f.dtype() != DType::kF32) {
    DT_ASSIGN_OR_RETURN(f, f.To(DType::kF32));
  }
  DT_ASSIGN_OR_RETURN(f, f.Contiguous());
  const float* p = f.data<float>();
  for (int64_t i = 0, n = f.numel(); i < n; ++i) {
    if (!std::isfinite(p[i])) return std::isnan(p[i]) ? 0 : p[i] > 0 ? 1 : 2;
  }
  return std::nullopt;
}

// Whether a parameter's piece holds a non-finite value, read a block of rows at a time so that a
// large (or quantized) weight is never converted whole.
absl::StatusOr<bool> HoldsNonFinite(const Tensor& t) {
  if (t.dim() < 2) {
    DT_ASSIGN_OR_RETURN(std::optional<int> kind, NonFiniteKind(t));
    return kind.has_value();
  }
  const int64_t rows = t.size(0);
  const int64_t per_row = std::max<int64_t>(1, t.numel() / std::max<int64_t>(1, rows));
  const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 20) / per_row);
  for (int64_t r = 0; r < rows; r += chunk) {
    DT_ASSIGN_OR_RETURN(Tensor part, t.Narrow(0, r, std::min(chunk, rows - r)));
    DT_ASSIGN_OR_RETURN(std::optional<int> kind, NonFiniteKind(part));
    if (kind) return true;
  }
  return false;
}

}  // namespace

// Note [Non-finite values] (causal_lm.h): the modules watched, in the order a forward calls each
// of them once, and the first of their outputs in this forward that was not finite.
struct FiniteWatch {
  struct Watched {
    std::string name;  // path from the CausalLM
    Module* module;
    HookId hook;
  };
  std::vector<Watched> watched;
  int64_t first = kNone;  // 3 · index in `watched` + kind (NonFiniteKind)
};

void CausalLM::set_check_finite(bool on) {
  if (on == check_finite()) return;
  if (!on) {
    for (const FiniteWatch::Watched& w : watch_->watched) w.module->RemoveHook(w.hook);
    watch_.reset();
    return;
  }
  std::vector<std::string> names = {"model.embed_tokens", "model.rotary_emb"};
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const std::string layer = absl::StrCat("model.layers.", i);
    for (const char* child : {"input_layernorm", "self_attn", "post_attention_layernorm", "mlp"}) {
      names.push_back(absl::StrCat(layer, ".", child));
    }
    names.push_back(layer);  // its output: h + attention + MLP
  }
  names.push_back("model.norm");
  names.push_back("lm_head");
  std::map<std::string, Module*> modules;
  for (const auto& [name, m] : NamedModules()) modules[name] = m;
  watch_ = std::make_unique<FiniteWatch>();
  for (const std::string& name : names) {
    Module* m = modules.at(name);
    FiniteWatch* w = watch_.get();
    const int64_t index = static_cast<int64_t>(w->watched.size());
    // Records only: failing here would fail this rank alone (CheckWatched decides for all).
    const HookId hook = m->RegisterForwardHook(
        [w, index](Module&, const Values&, Values& outputs) -> absl::Status {
          if (w->first != kNone) return absl::OkStatus();
          for (const Value& v : outputs) {
            DT_ASSIGN_OR_RETURN(std::optional<int> kind, NonFiniteKind(v.local()));
            if (kind) {
              w->first = 3 * index + *kind;
              break;
            }
          }
          return absl::OkStatus();
        });
    w->watched.push_back({name, m, hook});
  }
}

absl::StatusOr<CommPtr> CausalLM::MeshComm() {
  const std::optional<DeviceMesh> m = mesh_ ? mesh_ : PlacedMesh(*this);
  if (!m || m->Size() <= 1) return CommPtr();
  std::vector<int> dims(m->ndim());
  for (int d = 0; d < m->ndim(); ++d) dims[d] = d;
  return m->Comm(dims);
}

absl::Status CausalLM::CheckWatched() {
  int64_t first = watch_->first;
  watch_->first = kNone;
  DT_ASSIGN_OR_RETURN(CommPtr comm, MeshComm());
  if (comm) {
    DT_ASSIGN_OR_RETURN(Tensor t, Tensor::FromVector<int64_t>({1}, {first}));
    DT_RETURN_IF_ERROR(comm->AllReduce(t, ReduceOp::kMin));
    first = t.data<int64_t>()[0];
  }
  if (first == kNone) return absl::OkStatus();
  const FiniteWatch::Watched& bad = watch_->watched[first / 3];
  // Which of its parameters hold non-finite values: each rank reads its pieces, the ranks agree
  // (max) so that every rank names the same ones.
  const std::vector<std::pair<std::string, Parameter*>> params = bad.module->NamedParameters();
  std::vector<int64_t> flags(params.size(), 0);
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].second->materialized()) continue;
    DT_ASSIGN_OR_RETURN(bool non_finite, HoldsNonFinite(params[i].second->value().ToLocal()));
    flags[i] = non_finite ? 1 : 0;
  }
  if (comm && !flags.empty()) {
    DT_ASSIGN_OR_RETURN(Tensor t, Tensor::FromVector<int64_t>({static_cast<int64_t>(flags.size())},
                                                              flags));
    DT_RETURN_IF_ERROR(comm->AllReduce(t, ReduceOp::kMax));
    flags = t.ToVector<int64_t>();
  }
  std::vector<std::string> holders;
  for (size_t i = 0; i < params.size(); ++i) {
    if (flags[i] != 0) holders.push_back(absl::StrCat(bad.name, ".", params[i].first));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      bad.name, ": its output holds ", kKinds[first % 3],
      " (the first layer output of this forward that is not finite); ",
      holders.empty() ? "its parameters are finite"
                      : absl::StrCat("non-finite values in ", absl::StrJoin(holders, ", "))));
}

// ---- forward and generation ---------------------------------------------------------------------

namespace {

// Gemma 2's final_logit_softcapping on the gathered logits (none where the config has none).
absl::StatusOr<Tensor> SoftCapLogits(const Tensor& logits, double cap) {
  if (!(cap > 0)) return logits;
  return ops::SoftCap(logits, cap);
}

}  // namespace

absl::StatusOr<Tensor> CausalLM::Logits(const Tensor& ids_in, bool last_only) {
  if (!ids_in.defined() || ids_in.dim() != 2 || ids_in.size(1) == 0 ||
      (ids_in.dtype() != DType::kI64 && ids_in.dtype() != DType::kI32)) {
    return absl::InvalidArgumentError(absl::StrCat(
        type_name(), ": ids must be i64 or i32 [B, S] with S > 0, got ",
        ids_in.defined() ? ids_in.Describe() : "undefined"));
  }
  DT_ASSIGN_OR_RETURN(Tensor ids, ops::Cast(ids_in, DType::kI64));
  for (int64_t id : ids.ToVector<int64_t>()) {
    if (id < 0 || id >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(type_name(), ": token id ", id,
                                                     " is outside the vocab [0, ",
                                                     config_.vocab_size, ")"));
    }
  }
  const int64_t s = ids.size(1);
  if (past_ + s > context_length()) {
    // Note [The context limit].
    return absl::OutOfRangeError(absl::StrCat(
        type_name(), ": positions up to ", past_ + s, " (", past_, " cached + ", s,
        " new) exceed the model's context of ", context_length(),
        " tokens (max_position_embeddings)"));
  }
  if (config_.sliding_window > 0 && past_ + s > config_.sliding_window) {
    // Note [Sliding windows] (loaders/hf_config.h).
    return absl::UnimplementedError(absl::StrCat(
        type_name(), ": positions up to ", past_ + s, " (", past_, " cached + ", s,
        " new) exceed the config's sliding_window ", config_.sliding_window,
        "; within the window attention is full, beyond it dtensor has no sliding-window "
        "attention"));
  }
  DT_ASSIGN_OR_RETURN(Tensor positions,
                      Tensor::Arange(static_cast<double>(past_), static_cast<double>(past_ + s),
                                     1.0, DType::kI64));
  if (watch_) watch_->first = kNone;
  DT_ASSIGN_OR_RETURN(Value h, model_->CallOne({Value(ids), Value(positions)}));
  past_ += s;
  if (last_only && s > 1) {
    DT_ASSIGN_OR_RETURN(Tensor last, h.local().Narrow(1, s - 1, 1));
    h = Value(last);
  }
  DT_ASSIGN_OR_RETURN(Value logits, lm_head_->CallOne({h}));
  if (watch_) DT_RETURN_IF_ERROR(CheckWatched());
  // Every rank gets the whole vocab, whatever lm_head's style (a plain 'colwise' hands on a piece:
  // Note [Local pieces remember their layout]).
  DT_ASSIGN_OR_RETURN(Tensor whole, WholeTensor(logits));
  return SoftCapLogits(whole, config_.final_logit_softcapping);
}

absl::StatusOr<Values> CausalLM::Forward(Values inputs) {
  DT_ASSIGN_OR_RETURN(Value ids, SingleInput(*this, inputs));
  DT_ASSIGN_OR_RETURN(Tensor logits, Logits(ids.local(), /*last_only=*/false));
  return Values{Value(std::move(logits))};
}

int64_t CausalLM::position_limit() const {
  const int64_t window = config_.sliding_window;
  return window > 0 ? std::min(context_length(), window) : context_length();
}

// Note [Paged layers are found once]
// The engine sets its step on every attention layer twice per step; walking the module tree for
// them (NamedModules builds every dotted name, dynamic_cast tries every module) cost 0.1-0.7 ms
// a step on SmolLM2, which a decode step of 5 ms cannot afford. The tree is fixed once the model
// is built and laid out, so the layers are found at the first call and kept.
void CausalLM::FindPagedLayers() {
  if (!paged_layers_.empty() || !paged_latent_layers_.empty()) return;
  for (const auto& [name, m] : NamedModules()) {
    if (auto* a = dynamic_cast<Attention*>(m)) paged_layers_.push_back(a);
    if (auto* l = dynamic_cast<LatentAttention*>(m)) paged_latent_layers_.push_back(l);
  }
}

void CausalLM::SetPagedStep(const PagedStep* step) {
  FindPagedLayers();
  for (Attention* a : paged_layers_) a->SetPagedStep(step);
  for (LatentAttention* l : paged_latent_layers_) l->SetPagedStep(step);
}

void CausalLM::ReleasePagedKV() {
  FindPagedLayers();
  for (Attention* a : paged_layers_) a->paged_kv().Release();
  for (LatentAttention* l : paged_latent_layers_) l->paged_kv().Release();
}

int64_t CausalLM::PagedKVBytesPerPosition() const {
  const loaders::DecoderConfig& c = config_;
  int64_t tp = 1;
  if (mesh_) tp = mesh_->ndim() == 2 ? mesh_->Size(1) : mesh_->Size();
  const bool latent = FamilyOf(c).latent_attention;
  const int64_t heads = latent ? c.num_attention_heads : c.num_key_value_heads;
  const int64_t width = latent ? c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim
                               : 2 * c.head_dim;
  return c.num_hidden_layers * std::max<int64_t>(1, (heads + tp - 1) / tp) * width *
         DTypeSize(kv_cache_dtype());
}

absl::StatusOr<Tensor> CausalLM::StepLogits(const BatchStep& step) {
  const int64_t t = static_cast<int64_t>(step.ids.size());
  int64_t total = 0;
  for (const int64_t n : step.segments) total += n;
  if (t == 0 || static_cast<int64_t>(step.positions.size()) != t || total != t) {
    return absl::InvalidArgumentError(absl::StrCat(
        type_name(), ": a step needs T > 0 ids with a position each and segments summing to T, got ",
        t, " ids, ", step.positions.size(), " positions, segments summing to ", total));
  }
  for (const int64_t p : step.positions) {
    if (p < 0 || p >= position_limit()) {  // Note [The context limit]
      return absl::OutOfRangeError(absl::StrCat(type_name(), ": position ", p,
                                                " is outside the positions [0, ", position_limit(),
                                                ") a sequence may reach"));
    }
  }
  for (const int64_t r : step.logit_rows) {
    if (r < 0 || r >= t) {
      return absl::InvalidArgumentError(
          absl::StrCat(type_name(), ": logit row ", r, " is outside the step's ", t, " rows"));
    }
  }
  DT_ASSIGN_OR_RETURN(Tensor ids, Tensor::FromVector<int64_t>({1, t}, step.ids));
  DT_ASSIGN_OR_RETURN(Tensor positions, Tensor::FromVector<int64_t>({t}, step.positions));
  if (watch_) watch_->first = kNone;
  SetPagedStep(&step.paged);
  absl::StatusOr<Value> hidden = model_->StepHidden(ids, positions, step.segments);
  SetPagedStep(nullptr);
  DT_RETURN_IF_ERROR(hidden.status());
  const int64_t rows = static_cast<int64_t>(step.logit_rows.size());
  if (rows == 0) {
    if (watch_) DT_RETURN_IF_ERROR(CheckWatched());
    return Tensor::Empty({0, config_.vocab_size}, dtype_);
  }
  // The final norm and lm_head on the rows that sample only.
  std::vector<Tensor> picked;
  for (const int64_t r : step.logit_rows) {
    DT_ASSIGN_OR_RETURN(Tensor row, hidden->local().Narrow(1, r, 1));
    picked.push_back(std::move(row));
  }
  DT_ASSIGN_OR_RETURN(Tensor h, rows == 1 ? picked[0] : ops::Cat(picked, 1));
  DT_ASSIGN_OR_RETURN(Value normed, model_->norm().CallOne({Value(h)}));
  DT_ASSIGN_OR_RETURN(Value logits, lm_head_->CallOne({normed}));
  if (watch_) DT_RETURN_IF_ERROR(CheckWatched());
  DT_ASSIGN_OR_RETURN(Tensor whole, WholeTensor(logits));
  DT_ASSIGN_OR_RETURN(whole, SoftCapLogits(whole, config_.final_logit_softcapping));
  return whole.Reshape({rows, -1});
}

// The ranks agree on the token or the error (Note [Agreeing on tokens] in sampling.cc).
absl::StatusOr<int64_t> CausalLM::PickToken(const Tensor& logits, const SamplingOptions& sampling,
                                            int64_t step) {
  DT_ASSIGN_OR_RETURN(Tensor f, ops::Cast(logits, DType::kF32));
  DT_ASSIGN_OR_RETURN(f, f.Contiguous());
  const float* p = f.data<float>();
  DT_ASSIGN_OR_RETURN(CommPtr comm, MeshComm());
  absl::StatusOr<int64_t> token = AgreeOnToken(
      absl::MakeConstSpan(p + f.numel() - config_.vocab_size, config_.vocab_size), sampling,
      step, comm.get());
  if (absl::IsInvalidArgument(token.status()) && !check_finite()) {  // non-finite logits
    return absl::InvalidArgumentError(
        absl::StrCat(token.status().message(),
                     "; generate --check-finite (CausalLM::set_check_finite) names the first "
                     "layer whose output is not finite"));
  }
  return token;
}

double GenerateResult::prefill_tokens_per_second() const {
  return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0;
}
double GenerateResult::decode_tokens_per_second() const {
  const int64_t steps = static_cast<int64_t>(tokens.size()) - 1;
  return decode_seconds > 0 && steps > 0 ? steps / decode_seconds : 0;
}

absl::StatusOr<PromptTruncation> ParsePromptTruncation(absl::string_view name) {
  if (name == "none") return PromptTruncation::kNone;
  if (name == "left") return PromptTruncation::kLeft;
  if (name == "right") return PromptTruncation::kRight;
  return absl::InvalidArgumentError(
      absl::StrCat("prompt truncation must be none, left or right, got '", name, "'"));
}

absl::StatusOr<std::vector<int64_t>> FitPromptToContext(const std::vector<int64_t>& prompt,
                                                        int64_t max_new_tokens, int64_t context,
                                                        PromptTruncation truncate) {
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (truncate == PromptTruncation::kNone) {
    if (n <= context) return prompt;
    return absl::OutOfRangeError(absl::StrCat(
        "the prompt has ", n, " tokens, more than the model's context of ", context,
        " (max_position_embeddings): shorten it or truncate it (GenerateOptions::truncate, "
        "generate --truncate left|right)"));
  }
  // Room for the new tokens, but a prompt of at least half the context (one token at least).
  const int64_t keep = std::min(
      n, std::max(context - std::max<int64_t>(max_new_tokens, 0), (context + 1) / 2));
  if (keep == n) return prompt;
  return truncate == PromptTruncation::kLeft
             ? std::vector<int64_t>(prompt.end() - keep, prompt.end())
             : std::vector<int64_t>(prompt.begin(), prompt.begin() + keep);
}

absl::StatusOr<GenerateResult> CausalLM::Generate(const std::vector<int64_t>& prompt_in,
                                                  const GenerateOptions& options) {
  // Everything that can be refused is refused before any work, alike on every rank.
  if (prompt_in.empty()) return absl::InvalidArgumentError("Generate: the prompt is empty");
  if (options.max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Generate: max_new_tokens must be >= 0, got ", options.max_new_tokens));
  }
  if (absl::Status s = options.sampling.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("Generate: ", s.message()));
  }
  for (size_t i = 0; i < prompt_in.size(); ++i) {
    if (prompt_in[i] < 0 || prompt_in[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Generate: prompt position ", i, ": token id ", prompt_in[i],
          " is outside the vocab [0, ", config_.vocab_size, ")"));
    }
  }
  absl::StatusOr<std::vector<int64_t>> fitted = FitPromptToContext(
      prompt_in, options.max_new_tokens, context_length(), options.truncate);
  if (!fitted.ok()) {
    return absl::Status(fitted.status().code(),
                        absl::StrCat("Generate: ", fitted.status().message()));
  }
  const std::vector<int64_t>& prompt = *fitted;
  GenerateResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  result.truncated_tokens = static_cast<int64_t>(prompt_in.size()) - result.prompt_tokens;
  // Note [The context limit]: prompt + new tokens <= the context.
  const int64_t max_new =
      std::min(options.max_new_tokens, context_length() - result.prompt_tokens);
  // Note [KV buffers are reserved] (nn/attention.cc).
  constexpr int64_t kMaxReserve = 4096;
  ResetCache(result.prompt_tokens + std::min(max_new, kMaxReserve));
  auto stop = [&](int64_t t) {
    return std::find(options.stop_token_ids.begin(), options.stop_token_ids.end(), t) !=
           options.stop_token_ids.end();
  };
  auto stop_reason = [&] {
    const int64_t n = static_cast<int64_t>(result.tokens.size());
    if (n > 0 && stop(result.tokens.back())) return StopReason::kStopToken;
    return n == options.max_new_tokens ? StopReason::kMaxNewTokens : StopReason::kContext;
  };
  // Errors of a step name it (step 0 is the prefill).
  auto at = [](int64_t step, const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("Generate: step ", step, ": ", s.message()));
  };
  if (max_new == 0) {
    result.stop = stop_reason();
    return result;
  }
  const auto t0 = std::chrono::steady_clock::now();
  DT_ASSIGN_OR_RETURN(Tensor ids,
                      Tensor::FromVector<int64_t>({1, result.prompt_tokens}, prompt));
  absl::StatusOr<Tensor> logits = Logits(ids, /*last_only=*/true);
  if (!logits.ok()) return at(0, logits.status());
  absl::StatusOr<int64_t> token = PickToken(*logits, options.sampling, 0);
  if (!token.ok()) return at(0, token.status());
  result.prefill_seconds = Seconds(t0);
  result.tokens.push_back(*token);
  GenerateProgress progress;
  progress.prefill_seconds = result.prefill_seconds;
  auto report = [&] {
    if (!options.on_progress) return;
    progress.step = static_cast<int64_t>(result.tokens.size());
    progress.token = result.tokens.back();
    progress.decode_seconds = result.decode_seconds;
    options.on_progress(progress);
  };
  report();
  const auto t1 = std::chrono::steady_clock::now();
  while (static_cast<int64_t>(result.tokens.size()) < max_new && !stop(*token)) {
    const int64_t step = static_cast<int64_t>(result.tokens.size());
    DT_ASSIGN_OR_RETURN(Tensor next, Tensor::FromVector<int64_t>({1, 1}, {*token}));
    logits = Logits(next, /*last_only=*/true);
    if (!logits.ok()) return at(step, logits.status());
    token = PickToken(*logits, options.sampling, step);
    if (!token.ok()) return at(step, token.status());
    result.tokens.push_back(*token);
    result.decode_seconds = Seconds(t1);
    report();
  }
  result.stop = stop_reason();
  return result;
}

}  // namespace dt::nn
