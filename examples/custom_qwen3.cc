// A Qwen3-style decoder of your own on the public API (docs/nn.md, "Load an HF checkpoint into
// your own model"): library layers (Attention with per-head q/k norms, SwiGLUMLP, RMSNorm),
// transformers' names and Qwen3's base_model_tp_plan, the checkpoint read shard by shard, greedy
// decoding (no KV cache, for brevity):  dtrun --nproc-per-node 2 custom_qwen3 DIR 1,15,27
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "check_example.h"  // ParseNoFlags, beside this file
#include "dtensor/loaders/checkpoint.h"
#include "dtensor/loaders/hf_config.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/distributed.h"
#include "dtensor/nn/load.h"
#include "dtensor/nn/nn.h"

namespace nn = dt::nn;
namespace ops = dt::ops;
using Config = dt::loaders::DecoderConfig;

// h + attn(norm(h)), then + mlp(norm(.)).
class Layer : public nn::Module {
 public:
  // The children, kept as the typed references AddModule returns (registered in declaration
  // order, transformers' order): the forward calls them directly, no lookup by name.
  explicit Layer(const Config& c)
      : Module("Layer"),
        input_layernorm_(AddModule<nn::RMSNorm>("input_layernorm", c.hidden_size, c.rms_norm_eps)),
        self_attn_(AddModule<nn::Attention>(
            "self_attn", nn::AttentionOptions{.hidden_size = c.hidden_size,
                                              .num_heads = c.num_attention_heads,
                                              .num_kv_heads = c.num_key_value_heads,
                                              .head_dim = c.head_dim,
                                              .qk_norm = true,
                                              .norm_eps = c.rms_norm_eps})),
        post_attention_layernorm_(
            AddModule<nn::RMSNorm>("post_attention_layernorm", c.hidden_size, c.rms_norm_eps)),
        mlp_(AddModule<nn::SwiGLUMLP>(
            "mlp", nn::SwiGLUOptions{.hidden_size = c.hidden_size,
                                     .intermediate_size = c.intermediate_size})) {}

 protected:
  absl::StatusOr<dt::Values> Forward(dt::Values in) override {  // {h, cos, sin}
    DT_ASSIGN_OR_RETURN(dt::Value x, input_layernorm_.CallOne({in[0]}));
    DT_ASSIGN_OR_RETURN(x, self_attn_.CallOne({x, in[1], in[2]}));
    DT_ASSIGN_OR_RETURN(dt::Value h, ops::Add(in[0], x));
    DT_ASSIGN_OR_RETURN(x, post_attention_layernorm_.CallOne({h}));
    DT_ASSIGN_OR_RETURN(x, mlp_.CallOne({x}));
    DT_ASSIGN_OR_RETURN(h, ops::Add(h, x));
    return dt::Values{h};
  }

 private:
  nn::RMSNorm& input_layernorm_;
  nn::Attention& self_attn_;
  nn::RMSNorm& post_attention_layernorm_;
  nn::SwiGLUMLP& mlp_;
};

// {ids [1, S]} -> {hidden [1, S, H]}: Qwen3Model.
class Model : public nn::Module {
 public:
  explicit Model(const Config& c)
      : Module("Model"),
        embed_tokens_(AddModule<nn::Embedding>("embed_tokens", c.vocab_size, c.hidden_size)),
        layers_(AddModule<nn::ModuleList>("layers")),
        norm_(AddModule<nn::RMSNorm>("norm", c.hidden_size, c.rms_norm_eps)),
        rotary_emb_(AddModule<nn::RotaryEmbedding>("rotary_emb", c.head_dim, c.rope_theta)) {
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers_.Append(std::make_unique<Layer>(c));
  }

 protected:
  absl::StatusOr<dt::Values> Forward(dt::Values in) override {
    DT_ASSIGN_OR_RETURN(dt::Tensor pos,
                        dt::Tensor::Arange(0, in[0].shape()[1], 1, dt::DType::kI64));
    DT_ASSIGN_OR_RETURN(dt::Values cs, rotary_emb_.Call({dt::Value(pos)}));
    DT_ASSIGN_OR_RETURN(dt::Value h, embed_tokens_.CallOne({in[0]}));
    for (int64_t i = 0; i < layers_.size(); ++i) {
      DT_ASSIGN_OR_RETURN(h, layers_.at(i).CallOne({h, cs[0], cs[1]}));
    }
    return norm_.Call({h});
  }

 private:
  nn::Embedding& embed_tokens_;
  nn::ModuleList& layers_;
  nn::RMSNorm& norm_;
  nn::RotaryEmbedding& rotary_emb_;
};

// {ids [1, S]} -> {logits [1, S, V]}: Qwen3ForCausalLM, children named as its parameters.
class Qwen3 : public nn::Module {
 public:
  explicit Qwen3(const Config& c)
      : Module("Qwen3"),
        model_(AddModule<Model>("model", c)),
        lm_head_(AddModule<nn::Linear>("lm_head", c.hidden_size, c.vocab_size)) {}

  static nn::ParallelPlan Plan() {  // transformers' Qwen3 plan under "model."
    const std::string l = "model.layers.*.";
    return {{l + "self_attn.q_proj", "colwise"},   {l + "self_attn.k_proj", "colwise"},
            {l + "self_attn.v_proj", "colwise"},   {l + "self_attn.o_proj", "rowwise"},
            {l + "self_attn.q_norm", "replicated_with_grad_allreduce"},
            {l + "self_attn.k_norm", "replicated_with_grad_allreduce"},
            {l + "mlp.gate_proj", "colwise"},      {l + "mlp.up_proj", "colwise"},
            {l + "mlp.down_proj", "rowwise"},      {"lm_head", "colwise_gather_output"}};
  }

 protected:
  absl::StatusOr<dt::Values> Forward(dt::Values in) override {
    DT_ASSIGN_OR_RETURN(dt::Value h, model_.CallOne({in[0]}));
    return lm_head_.Call({h});
  }

 private:
  Model& model_;
  nn::Linear& lm_head_;
};

absl::Status Run(const std::string& dir, std::vector<int64_t> ids) {
  DT_ASSIGN_OR_RETURN(std::shared_ptr<dt::World> world, dt::World::FromEnv());
  DT_ASSIGN_OR_RETURN(dt::DeviceMesh tp, nn::TensorParallelMesh(world, {}));
  DT_ASSIGN_OR_RETURN(Config config, dt::loaders::LoadDecoderConfig(dir));
  Qwen3 model(config);
  DT_RETURN_IF_ERROR(nn::ParallelizeModule(model, tp, Qwen3::Plan()));  // checks, then places
  DT_ASSIGN_OR_RETURN(dt::loaders::Checkpoint ckpt, dt::loaders::Checkpoint::Open(dir));
  // A tied lm_head is read from the embedding's rows (SourceNameFn).
  auto source = [&](absl::string_view p) {
    const bool tied = config.tie_word_embeddings && p == "lm_head.weight";
    return std::string(tied ? "model.embed_tokens.weight" : p);
  };
  const bool lead = world->rank() == 0;
  DT_RETURN_IF_ERROR(nn::CheckCheckpoint(model, ckpt, "Qwen3", nn::PlanCheck::kError, source));
  DT_RETURN_IF_ERROR(nn::LoadCheckpoint(model, ckpt, {}, lead, nullptr, source));
  if (lead) std::printf("%s", nn::FormatPlacements(model).c_str());
  for (int step = 0; step < 8; ++step) {  // greedy: the whole sequence again at every step
    const int64_t n = static_cast<int64_t>(ids.size());
    DT_ASSIGN_OR_RETURN(dt::Tensor t, dt::Tensor::FromVector<int64_t>({1, n}, ids));
    DT_ASSIGN_OR_RETURN(dt::Value logits, model.CallOne({dt::Value(t)}));  // whole vocab
    const std::vector<float> v = logits.local().Select(1, n - 1).value().ToVector<float>();
    ids.push_back(std::max_element(v.begin(), v.end()) - v.begin());
  }
  if (lead) std::printf("custom_qwen3 tp=%d: greedy [%s]\n", world->size(),
                        absl::StrJoin(ids.end() - 8, ids.end(), ",").c_str());
  return absl::OkStatus();
}

int main(int argc, char** argv) {
  if (std::optional<int> exit = dt::examples::ParseNoFlags(
          argc, argv, "custom_qwen3",
          "usage: custom_qwen3 DIR [IDS]\n"
          "greedy decoding with a Qwen3-style model of your own from the HF checkpoint DIR, from the\n"
          "comma-separated token ids IDS (default 1,15,27); under dtrun for tensor parallelism",
          2)) {
    return *exit;
  }
  std::vector<int64_t> ids;
  for (absl::string_view p : absl::StrSplit(argc > 2 ? argv[2] : "1,15,27", ',')) {
    int64_t id = 0;
    if (absl::SimpleAtoi(p, &id)) ids.push_back(id);
  }
  const absl::Status s =
      argc > 1 ? Run(argv[1], ids) : absl::InvalidArgumentError("usage: custom_qwen3 DIR [ids]");
  if (!s.ok()) std::fprintf(stderr, "custom_qwen3: %s\n", s.ToString().c_str());
  return s.ok() ? 0 : 1;
}
