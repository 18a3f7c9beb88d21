#include "dtensor/nn/models/llama.h"

#include "dtensor/loaders/gguf_llama.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "dtensor/core/status.h"
#include "dtensor/nn/attention.h"
#include "dtensor/nn/init.h"
#include "dtensor/nn/linear.h"
#include "dtensor/nn/load.h"
#include "dtensor/nn/mlp.h"
#include "dtensor/nn/norm.h"
#include "dtensor/nn/vops.h"

namespace dt::nn {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

// ---- layers --------------------------------------------------------------------------------------

LlamaDecoderLayer::LlamaDecoderLayer(const loaders::LlamaConfig& c, DType dtype)
    : Module("LlamaDecoderLayer") {
  AddModule<RMSNorm>("input_layernorm", c.hidden_size, c.rms_norm_eps, dtype);
  AttentionOptions a;
  a.hidden_size = c.hidden_size;
  a.num_heads = c.num_attention_heads;
  a.num_kv_heads = c.num_key_value_heads;
  a.head_dim = c.head_dim;
  a.bias = c.attention_bias;
  a.causal = true;
  a.rotary_style = ops::RotaryStyle::kHalf;
  a.dtype = dtype;
  AddModule<Attention>("self_attn", a).EnableKVCache(true);
  AddModule<RMSNorm>("post_attention_layernorm", c.hidden_size, c.rms_norm_eps, dtype);
  SwiGLUOptions m;
  m.hidden_size = c.hidden_size;
  m.intermediate_size = c.intermediate_size;
  m.bias = c.mlp_bias;
  m.dtype = dtype;
  AddModule<SwiGLUMLP>("mlp", m);
}

absl::StatusOr<Values> LlamaDecoderLayer::Forward(Values inputs) {
  if (inputs.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat("LlamaDecoderLayer '", FullName(),
                                                   "' takes {h, cos, sin}, got ", inputs.size(),
                                                   " inputs"));
  }
  const Value& h = inputs[0];
  DT_ASSIGN_OR_RETURN(Value x, FindChild("input_layernorm")->CallOne({h}));
  DT_ASSIGN_OR_RETURN(Value a, FindChild("self_attn")->CallOne({x, inputs[1], inputs[2]}));
  DT_ASSIGN_OR_RETURN(Value r, vops::Add(h, a));
  DT_ASSIGN_OR_RETURN(x, FindChild("post_attention_layernorm")->CallOne({r}));
  DT_ASSIGN_OR_RETURN(Value m, FindChild("mlp")->CallOne({x}));
  DT_ASSIGN_OR_RETURN(Value out, vops::Add(r, m));
  return Values{std::move(out)};
}

LlamaModel::LlamaModel(const loaders::LlamaConfig& c, DType dtype) : Module("LlamaModel") {
  AddModule<Embedding>("embed_tokens", c.vocab_size, c.hidden_size, dtype);
  ModuleList& layers = AddModule<ModuleList>("layers");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers.Append(std::make_unique<LlamaDecoderLayer>(c, dtype));
  }
  AddModule<RMSNorm>("norm", c.hidden_size, c.rms_norm_eps, dtype);
  // The frequencies with the config's scaling applied, updated with the sequence length as
  // transformers does (dynamic, longrope; loaders/rope.h).
  auto schedule = std::make_shared<loaders::RopeSchedule>(loaders::LlamaRopeSpec(c));
  AddModule<RotaryEmbedding>(
      "rotary_emb",
      [schedule](int64_t seq_len) {
        const loaders::RopeTable& t = seq_len > 0 ? schedule->ForLength(seq_len) : schedule->current();
        return RotaryTable{t.inv_freq, t.attention_scaling};
      },
      absl::StrCat("theta=", c.rope_theta, c.rope_scaling.rope_type == "default" ? "" : ", ",
                   c.rope_scaling.rope_type == "default" ? "" : c.rope_scaling.rope_type),
      ops::RotaryStyle::kHalf);
}

absl::StatusOr<Values> LlamaModel::Forward(Values inputs) {
  if (inputs.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("LlamaModel takes {ids, positions}, got ", inputs.size(), " inputs"));
  }
  DT_ASSIGN_OR_RETURN(Value h, FindChild("embed_tokens")->CallOne({inputs[0]}));
  DT_ASSIGN_OR_RETURN(Values cs, FindChild("rotary_emb")->Call({inputs[1]}));
  // transformers hands cos and sin to attention in the model dtype.
  DT_ASSIGN_OR_RETURN(Value cos, vops::Cast(cs[0], h.dtype()));
  DT_ASSIGN_OR_RETURN(Value sin, vops::Cast(cs[1], h.dtype()));
  const ModuleList& layers = static_cast<const ModuleList&>(*FindChild("layers"));
  for (int64_t i = 0; i < layers.size(); ++i) {
    DT_ASSIGN_OR_RETURN(h, layers.at(i).CallOne({h, cos, sin}));
  }
  DT_ASSIGN_OR_RETURN(h, FindChild("norm")->CallOne({h}));
  return Values{std::move(h)};
}

// ---- LlamaForCausalLM ----------------------------------------------------------------------------

LlamaForCausalLM::LlamaForCausalLM(const loaders::LlamaConfig& config, DType dtype)
    : Module("LlamaForCausalLM"), config_(config), dtype_(dtype) {
  AddModule<LlamaModel>("model", config, dtype);
  AddModule<Linear>("lm_head", config.hidden_size, config.vocab_size, /*bias=*/false, dtype);
}

ParallelPlan LlamaForCausalLM::TPPlan(bool shard_embedding) {
  ParallelPlan plan = {
      {"model.layers.*.self_attn.q_proj", "colwise"},
      {"model.layers.*.self_attn.k_proj", "colwise"},
      {"model.layers.*.self_attn.v_proj", "colwise"},
      {"model.layers.*.self_attn.o_proj", "rowwise"},
      {"model.layers.*.mlp.gate_proj", "colwise"},
      {"model.layers.*.mlp.up_proj", "colwise"},
      {"model.layers.*.mlp.down_proj", "rowwise"},
      {"lm_head", "colwise_gather_output"},
  };
  if (shard_embedding) plan.emplace_back("model.embed_tokens", "embedding_rowwise");
  return plan;
}

TPConfig LlamaForCausalLM::tp_config() const {
  TPConfig t;
  t.num_attention_heads = config_.num_attention_heads;
  t.num_key_value_heads = config_.num_key_value_heads;
  t.intermediate_size = config_.intermediate_size;
  t.vocab_size = config_.vocab_size;
  return t;
}

absl::Status LlamaForCausalLM::Parallelize(const DeviceMesh& mesh, bool shard_embedding) {
  return Parallelize(mesh, TPPlan(shard_embedding));
}

absl::Status LlamaForCausalLM::Parallelize(const DeviceMesh& mesh, const ParallelPlan& plan) {
  ParallelizeOptions o;
  o.config = tp_config();
  o.uncovered_params = PlanCheck::kIgnore;  // norms and (by default) the embedding, on purpose
  DT_RETURN_IF_ERROR(ParallelizeModule(*this, mesh, plan, o));
  mesh_ = mesh;
  plan_ = plan;
  return absl::OkStatus();
}

absl::Status LlamaForCausalLM::ShardLoaded(const ParallelPlan& plan) {
  ParallelizeOptions o;
  o.config = tp_config();
  o.uncovered_params = PlanCheck::kIgnore;
  DT_RETURN_IF_ERROR(nn::ShardLoaded(*this, plan, o));
  plan_ = plan;
  return absl::OkStatus();
}

std::string LlamaForCausalLM::tp_plan() {
  absl::StatusOr<std::string> s = FormatPlan(*this, plan_);
  return s.ok() ? *s : std::string(s.status().message());
}

namespace {

// Note [Config against checkpoint]
// The config decides how many modules are built, so its sizes are checked against the checkpoint's
// headers before any module exists: a config.json claiming 10^9 layers is refused in
// microseconds instead of allocating for hours. Layers: the model.layers.N indices present must be
// exactly 0..L-1; the embedding must be [vocab_size, hidden_size].
absl::Status CheckConfigAgainstCheckpoint(const loaders::LlamaConfig& c,
                                          const loaders::Checkpoint& checkpoint) {
  int64_t layers = 0;
  std::set<int64_t> seen;
  for (const std::string& name : checkpoint.names()) {
    absl::string_view rest = name;
    if (!absl::ConsumePrefix(&rest, "model.layers.")) continue;
    int64_t i = 0;
    if (absl::SimpleAtoi(rest.substr(0, rest.find('.')), &i) && i >= 0) seen.insert(i);
  }
  layers = static_cast<int64_t>(seen.size());
  const bool dense = seen.empty() || (*seen.begin() == 0 && *seen.rbegin() == layers - 1);
  if (!dense || layers != c.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config num_hidden_layers ", c.num_hidden_layers, " does not match checkpoint '",
        checkpoint.path(), "', which holds ", layers, " layers",
        dense ? "" : " (with gaps in model.layers.N)"));
  }
  absl::StatusOr<const loaders::TensorInfo*> embed = checkpoint.Info("model.embed_tokens.weight");
  if (embed.ok() && (*embed)->shape != Shape{c.vocab_size, c.hidden_size}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config vocab_size ", c.vocab_size, " and hidden_size ", c.hidden_size,
        " do not match checkpoint '", checkpoint.path(), "': model.embed_tokens.weight is ",
        ShapeToString((*embed)->shape)));
  }
  return absl::OkStatus();
}

}  // namespace

std::string LlamaForCausalLM::CheckpointName(absl::string_view name) const {
  if (config_.tie_word_embeddings && name == "lm_head.weight") return "model.embed_tokens.weight";
  return std::string(name);
}

SaveOptions LlamaForCausalLM::save_options() const {
  SaveOptions o;
  const bool tied = config_.tie_word_embeddings;
  o.checkpoint_name = [tied](const std::string& name) {
    return tied && name == "lm_head.weight" ? std::string() : name;
  };
  o.files["config.json"] = loaders::LlamaConfigToJson(config_);
  return o;
}

absl::Status LlamaForCausalLM::CheckCheckpoint(const loaders::Checkpoint& checkpoint,
                                               bool warn) const {
  return nn::CheckCheckpoint(*this, checkpoint, "LlamaForCausalLM", warn,
                             [this](absl::string_view name) { return CheckpointName(name); });
}

absl::Status LlamaForCausalLM::LoadWeights(const loaders::Checkpoint& checkpoint,
                                           const LlamaLoadOptions& options,
                                           LlamaLoadReport* report) {
  loaders::ReadOptions ro;
  ro.zero_copy = options.zero_copy;
  // On the mesh's first rank: a progress bar on a terminal when loading takes over a second.
  const bool lead = !mesh_.has_value() || mesh_->my_rank() == mesh_->ranks()[0];
  return LoadCheckpoint(*this, checkpoint, ro, lead, report,
                        [this](absl::string_view name) { return CheckpointName(name); });
}

absl::StatusOr<std::unique_ptr<LlamaForCausalLM>> LlamaForCausalLM::FromPretrained(
    const std::string& dir, const DeviceMesh& mesh, const LlamaLoadOptions& options,
    LlamaLoadReport* report) {
  // A GGUF's config is in its header: read it from the checkpoint opened once.
  DT_ASSIGN_OR_RETURN(loaders::Checkpoint checkpoint, loaders::Checkpoint::Open(dir));
  DT_ASSIGN_OR_RETURN(loaders::LlamaConfig config,
                      checkpoint.gguf() != nullptr ? loaders::LlamaConfigFromGguf(*checkpoint.gguf())
                                                   : loaders::LoadLlamaConfig(dir));
  const DType dtype = options.dtype.value_or(config.dtype);
  if (!IsFloating(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LlamaForCausalLM: compute dtype must be f32, bf16 or f16, got ",
                     DTypeName(dtype)));
  }
  // Nothing below reads a weight until every check passed: the config against the checkpoint's
  // headers (Note [Config against checkpoint]), the plan against the config and the mesh, then the
  // checkpoint's names and shapes.
  DT_RETURN_IF_ERROR(CheckConfigAgainstCheckpoint(config, checkpoint));
  auto model = std::make_unique<LlamaForCausalLM>(config, dtype);
  const ParallelPlan plan = options.plan.value_or(TPPlan(options.shard_embedding));
  const bool quantized = options.keep_quantized && !options.load_whole;
  if (quantized) {
    DT_RETURN_IF_ERROR(KeepQuantized(*model, checkpoint, [&](absl::string_view name) {
                         return model->CheckpointName(name);
                       }).status());
  }
  if (options.load_whole) {
    DT_RETURN_IF_ERROR(ReplicateModule(*model, mesh));
    model->mesh_ = mesh;
  } else {
    DT_RETURN_IF_ERROR(model->Parallelize(mesh, plan));
  }
  if (quantized) DT_RETURN_IF_ERROR(FitQuantized(*model, options.quantized_misfit, dtype, report));
  DT_RETURN_IF_ERROR(model->CheckCheckpoint(checkpoint, options.warn && mesh.my_rank() ==
                                                             mesh.ranks().front()));
  DT_RETURN_IF_ERROR(model->LoadWeights(checkpoint, options, report));
  if (options.load_whole) DT_RETURN_IF_ERROR(model->ShardLoaded(plan));
  return model;
}

absl::StatusOr<std::unique_ptr<LlamaForCausalLM>> LlamaForCausalLM::FromPretrained(
    const std::string& dir, const std::shared_ptr<World>& world, const DistributedConfig& dist,
    LlamaLoadOptions options, LlamaLoadReport* report) {
  DT_ASSIGN_OR_RETURN(DeviceMesh tp, TensorParallelMesh(world, dist));
  DT_ASSIGN_OR_RETURN(options.plan, EffectivePlan(dist, TPPlan(options.shard_embedding)));
  return FromPretrained(dir, tp, options, report);
}

absl::StatusOr<std::unique_ptr<LlamaForCausalLM>> LlamaForCausalLM::FromPretrained(
    const std::string& dir, const DeviceMesh& mesh, const DistributedConfig& dist,
    LlamaLoadOptions options, LlamaLoadReport* report) {
  DT_ASSIGN_OR_RETURN(DeviceMesh tp, TensorParallelMesh(mesh, dist));
  DT_ASSIGN_OR_RETURN(options.plan, EffectivePlan(dist, TPPlan(options.shard_embedding)));
  return FromPretrained(dir, tp, options, report);
}

void LlamaForCausalLM::ResetCache() {
  for (auto& [name, m] : NamedModules()) {
    if (auto* a = dynamic_cast<Attention*>(m)) a->ResetKVCache();
  }
  past_ = 0;
}

absl::StatusOr<Tensor> LlamaForCausalLM::Logits(const Tensor& ids_in, bool last_only) {
  if (!ids_in.defined() || ids_in.dim() != 2 || ids_in.size(1) == 0 ||
      (ids_in.dtype() != DType::kI64 && ids_in.dtype() != DType::kI32)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LlamaForCausalLM: ids must be i64 or i32 [B, S] with S > 0, got ",
        ids_in.defined() ? ids_in.Describe() : "undefined"));
  }
  DT_ASSIGN_OR_RETURN(Tensor ids, ops::Cast(ids_in, DType::kI64));
  for (int64_t id : ids.ToVector<int64_t>()) {
    if (id < 0 || id >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("LlamaForCausalLM: token id ", id,
                                                     " is outside the vocab [0, ",
                                                     config_.vocab_size, ")"));
    }
  }
  const int64_t s = ids.size(1);
  DT_ASSIGN_OR_RETURN(Tensor positions,
                      Tensor::Arange(static_cast<double>(past_), static_cast<double>(past_ + s),
                                     1.0, DType::kI64));
  DT_ASSIGN_OR_RETURN(Value h, FindChild("model")->CallOne({Value(ids), Value(positions)}));
  past_ += s;
  if (last_only && s > 1) {
    DT_ASSIGN_OR_RETURN(Tensor last, h.local().Narrow(1, s - 1, 1));
    h = Value(last);
  }
  DT_ASSIGN_OR_RETURN(Value logits, FindChild("lm_head")->CallOne({h}));
  if (logits.is_dtensor()) {
    DT_ASSIGN_OR_RETURN(Tensor full, logits.dtensor().FullTensor());
    return full;
  }
  return logits.local();
}

absl::StatusOr<Values> LlamaForCausalLM::Forward(Values inputs) {
  DT_ASSIGN_OR_RETURN(Value ids, SingleInput(*this, inputs));
  DT_ASSIGN_OR_RETURN(Tensor logits, Logits(ids.local(), /*last_only=*/false));
  return Values{Value(std::move(logits))};
}

// Note [Agreeing on tokens]
// Every rank holds the gathered logits, and with this runtime's backends they are bitwise equal
// on every rank (all_gather copies bytes; each all_reduce hands every member the same sum). Still,
// a rank that picked a different token would silently feed the others' KV caches garbage, and an
// MPI all_reduce is not required to be bitwise identical across ranks. So every rank computes the
// pick (errors, e.g. NaN logits, then fail on every rank alike) and group rank 0's token is
// broadcast: one 8-byte broadcast per token, a few microseconds against a forward.
absl::StatusOr<int64_t> LlamaForCausalLM::PickToken(const Tensor& logits,
                                                    const SamplingOptions& sampling,
                                                    int64_t step) {
  DT_ASSIGN_OR_RETURN(Tensor f, ops::Cast(logits, DType::kF32));
  DT_ASSIGN_OR_RETURN(f, f.Contiguous());
  const float* p = f.data<float>();
  DT_ASSIGN_OR_RETURN(int64_t token,
                      SampleToken(absl::MakeConstSpan(p + f.numel() - config_.vocab_size,
                                                      config_.vocab_size),
                                  sampling, step));
  if (mesh_ && mesh_->Size() > 1) {
    DT_ASSIGN_OR_RETURN(CommPtr comm, mesh_->Comm(0));
    DT_ASSIGN_OR_RETURN(Tensor t, Tensor::FromVector<int64_t>({1}, {token}));
    DT_RETURN_IF_ERROR(comm->Broadcast(t, 0));
    token = t.data<int64_t>()[0];
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

absl::StatusOr<GenerateResult> LlamaForCausalLM::Generate(const std::vector<int64_t>& prompt,
                                                          const GenerateOptions& options) {
  if (prompt.empty()) return absl::InvalidArgumentError("Generate: the prompt is empty");
  if (options.max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Generate: max_new_tokens must be >= 0, got ", options.max_new_tokens));
  }
  ResetCache();
  GenerateResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  if (options.max_new_tokens == 0) return result;
  const auto t0 = std::chrono::steady_clock::now();
  DT_ASSIGN_OR_RETURN(Tensor ids,
                      Tensor::FromVector<int64_t>({1, result.prompt_tokens}, prompt));
  DT_ASSIGN_OR_RETURN(Tensor logits, Logits(ids, /*last_only=*/true));
  DT_ASSIGN_OR_RETURN(int64_t token, PickToken(logits, options.sampling, 0));
  result.prefill_seconds = Seconds(t0);
  result.tokens.push_back(token);
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
  auto stop = [&](int64_t t) {
    return std::find(options.stop_token_ids.begin(), options.stop_token_ids.end(), t) !=
           options.stop_token_ids.end();
  };
  const auto t1 = std::chrono::steady_clock::now();
  while (static_cast<int64_t>(result.tokens.size()) < options.max_new_tokens && !stop(token)) {
    DT_ASSIGN_OR_RETURN(Tensor next, Tensor::FromVector<int64_t>({1, 1}, {token}));
    DT_ASSIGN_OR_RETURN(logits, Logits(next, /*last_only=*/true));
    DT_ASSIGN_OR_RETURN(token, PickToken(logits, options.sampling,
                                         static_cast<int64_t>(result.tokens.size())));
    result.tokens.push_back(token);
    result.decode_seconds = Seconds(t1);
    report();
  }
  return result;
}

}  // namespace dt::nn
