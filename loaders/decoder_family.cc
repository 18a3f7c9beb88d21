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

// The table of the header comment, one designated initializer per family (fields in their
// declaration order; the rest keep Llama's defaults).
std::vector<DecoderFamily> MakeFamilies() {
  Plan qwen3_plan = LlamaPlan();
  // The norms act on each head's head_dim values, so they stay whole on every rank.
  qwen3_plan.insert(qwen3_plan.begin() + 3,
                    {{"model.layers.*.self_attn.q_norm", "replicated_with_grad_allreduce"},
                     {"model.layers.*.self_attn.k_norm", "replicated_with_grad_allreduce"}});
  // See the header: block shards instead of transformers' gather-then-slice.
  const Plan phi3_plan = {
      {"model.layers.*.self_attn.qkv_proj", "packed_colwise"},
      {"model.layers.*.self_attn.o_proj", "rowwise"},
      {"model.layers.*.mlp.gate_up_proj", "packed_colwise"},
      {"model.layers.*.mlp.down_proj", "rowwise"},
      {"lm_head", "colwise_gather_output"},
  };
  using SW = SlidingWindowFields;
  return {
      {.model_type = "llama", .architecture = "LlamaForCausalLM", .gguf_architecture = "llama",
       .attention_bias_field = true, .mlp_bias_field = true, .tp_plan = LlamaPlan()},
      {.model_type = "mistral", .architecture = "MistralForCausalLM", .gguf_architecture = "llama",
       .default_max_position_embeddings = 4096 * 32, .sliding_window = SW::kAll,
       .default_sliding_window = 4096, .tp_plan = LlamaPlan()},
      {.model_type = "qwen2", .architecture = "Qwen2ForCausalLM", .gguf_architecture = "qwen2",
       .qkv_bias = true, .default_max_position_embeddings = 32768, .sliding_window = SW::kQwen,
       .tp_plan = LlamaPlan()},
      {.model_type = "qwen3", .architecture = "Qwen3ForCausalLM", .gguf_architecture = "qwen3",
       .attention_bias_field = true, .qk_norm = true, .default_head_dim = 128,
       .default_max_position_embeddings = 32768, .sliding_window = SW::kQwen,
       .tp_plan = qwen3_plan},
      {.model_type = "phi3", .architecture = "Phi3ForCausalLM", .gguf_architecture = "phi3",
       .fused_qkv = true, .fused_gate_up = true, .default_max_position_embeddings = 4096,
       .default_rms_norm_eps = 1e-5, .sliding_window = SW::kAll,
       .longrope_aliases = {"su", "yarn"}, .tp_plan = phi3_plan},
  };
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
