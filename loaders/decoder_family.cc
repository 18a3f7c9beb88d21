#include "dtensor/loaders/decoder_family.h"

#include "absl/strings/str_cat.h"

namespace dt::loaders {
namespace {

using Plan = std::vector<std::pair<std::string, std::string>>;

// transformers' base_model_tp_plan shared by Llama, Mistral and Qwen2 (under "model."), plus the
// causal LM's lm_head.
Plan LlamaPlan() {
  return {
      {"model.layers.*.self_attn.q_proj", "colwise"},
      {"model.layers.*.self_attn.k_proj", "colwise"},
      {"model.layers.*.self_attn.v_proj", "colwise"},
      {"model.layers.*.self_attn.o_proj", "rowwise"},
      {"model.layers.*.mlp.gate_proj", "colwise"},
      {"model.layers.*.mlp.up_proj", "colwise"},
      {"model.layers.*.mlp.down_proj", "rowwise"},
      {"lm_head", "colwise_gather_output"},
  };
}

std::vector<DecoderFamily> MakeFamilies() {
  std::vector<DecoderFamily> f;
  {
    DecoderFamily llama;
    llama.model_type = "llama";
    llama.architecture = "LlamaForCausalLM";
    llama.gguf_architecture = "llama";
    llama.attention_bias_field = true;
    llama.mlp_bias_field = true;
    llama.tp_plan = LlamaPlan();
    f.push_back(llama);
  }
  {
    DecoderFamily mistral;
    mistral.model_type = "mistral";
    mistral.architecture = "MistralForCausalLM";
    mistral.gguf_architecture = "llama";
    mistral.default_max_position_embeddings = 4096 * 32;
    mistral.sliding_window = SlidingWindowFields::kAll;
    mistral.default_sliding_window = 4096;
    mistral.tp_plan = LlamaPlan();
    f.push_back(mistral);
  }
  {
    DecoderFamily qwen2;
    qwen2.model_type = "qwen2";
    qwen2.architecture = "Qwen2ForCausalLM";
    qwen2.gguf_architecture = "qwen2";
    qwen2.qkv_bias = true;
    qwen2.default_max_position_embeddings = 32768;
    qwen2.sliding_window = SlidingWindowFields::kQwen;
    qwen2.tp_plan = LlamaPlan();
    f.push_back(qwen2);
  }
  {
    DecoderFamily qwen3;
    qwen3.model_type = "qwen3";
    qwen3.architecture = "Qwen3ForCausalLM";
    qwen3.gguf_architecture = "qwen3";
    qwen3.attention_bias_field = true;
    qwen3.qk_norm = true;
    qwen3.default_head_dim = 128;
    qwen3.default_max_position_embeddings = 32768;
    qwen3.sliding_window = SlidingWindowFields::kQwen;
    qwen3.tp_plan = LlamaPlan();
    // The norms act on each head's head_dim values, so they stay whole on every rank.
    qwen3.tp_plan.insert(qwen3.tp_plan.begin() + 3,
                         {{"model.layers.*.self_attn.q_norm", "replicated_with_grad_allreduce"},
                          {"model.layers.*.self_attn.k_norm", "replicated_with_grad_allreduce"}});
    f.push_back(qwen3);
  }
  {
    DecoderFamily phi3;
    phi3.model_type = "phi3";
    phi3.architecture = "Phi3ForCausalLM";
    phi3.gguf_architecture = "phi3";
    phi3.fused_qkv = true;
    phi3.fused_gate_up = true;
    phi3.default_max_position_embeddings = 4096;
    phi3.default_rms_norm_eps = 1e-5;
    phi3.sliding_window = SlidingWindowFields::kAll;
    phi3.longrope_aliases = {"su", "yarn"};
    // See the header: block shards instead of transformers' gather-then-slice.
    phi3.tp_plan = {
        {"model.layers.*.self_attn.qkv_proj", "packed_colwise"},
        {"model.layers.*.self_attn.o_proj", "rowwise"},
        {"model.layers.*.mlp.gate_up_proj", "packed_colwise"},
        {"model.layers.*.mlp.down_proj", "rowwise"},
        {"lm_head", "colwise_gather_output"},
    };
    f.push_back(phi3);
  }
  return f;
}

}  // namespace

const std::vector<DecoderFamily>& DecoderFamilies() {
  static const std::vector<DecoderFamily>* const families =
      new std::vector<DecoderFamily>(MakeFamilies());
  return *families;
}

std::string DecoderFamilyNames() {
  std::string out;
  for (const DecoderFamily& f : DecoderFamilies()) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", f.model_type);
  }
  return out;
}

absl::StatusOr<const DecoderFamily*> FindDecoderFamily(absl::string_view model_type) {
  for (const DecoderFamily& f : DecoderFamilies()) {
    if (f.model_type == model_type) return &f;
  }
  return absl::InvalidArgumentError(absl::StrCat("model_type \"", model_type,
                                                 "\" is not supported (supported: ",
                                                 DecoderFamilyNames(), ")"));
}

absl::StatusOr<const DecoderFamily*> FindGgufDecoderFamily(absl::string_view arch) {
  std::string names;
  for (const DecoderFamily& f : DecoderFamilies()) {
    if (f.gguf_architecture == arch) return &f;  // the first: llama before mistral
    if (names.find(f.gguf_architecture) == std::string::npos) {
      absl::StrAppend(&names, names.empty() ? "" : ", ", f.gguf_architecture);
    }
  }
  return absl::UnimplementedError(absl::StrCat("architecture '", arch,
                                               "' is not supported (supported: ", names, ")"));
}

}  // namespace dt::loaders
