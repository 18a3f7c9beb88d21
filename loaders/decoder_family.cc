#include "dtensor/loaders/decoder_family.h"

#include "absl/strings/str_cat.h"

namespace dt::loaders {
namespace {

using Plan = std::vector<std::pair<std::string, std::string>>;

// transformers' base_model_tp_plan shared by Llama, Mistral and Qwen2 (under "model."), plus the
// causal LM's lm_head: the attention and the vocab (tp_plan), the dense MLP (mlp_plan).
Plan AttentionPlan() {
  return {
      {"model.layers.*.self_attn.q_proj", "colwise"},
      {"model.layers.*.self_attn.k_proj", "colwise"},
      {"model.layers.*.self_attn.v_proj", "colwise"},
      {"model.layers.*.self_attn.o_proj", "rowwise"},
      {"lm_head", "colwise_gather_output"},
  };
}
Plan MlpPlan() {
  return {
      {"model.layers.*.mlp.gate_proj", "colwise"},
      {"model.layers.*.mlp.up_proj", "colwise"},
      {"model.layers.*.mlp.down_proj", "rowwise"},
  };
}
// Note [MoE blocks]: the experts inside each rank's share, one all_reduce per block.
Plan ExpertsPlan() {
  return {
      {"model.layers.*.mlp.experts.gate_up_proj", "packed_colwise"},
      {"model.layers.*.mlp.experts.down_proj", "rowwise"},
      {"model.layers.*.mlp.experts", "moe_tp_experts"},
  };
}
// transformers' base_model_ep_plan: whole experts per rank, tokens sent to them (all_to_all).
Plan EpPlan() {
  return {
      {"model.layers.*.mlp.experts.gate_up_proj", "grouped_gemm"},
      {"model.layers.*.mlp.experts.down_proj", "grouped_gemm"},
      {"model.layers.*.mlp.experts", "ep_dispatch_experts"},
  };
}
// The alternative (transformers' AllReduceEP, spelled with the v4 plans' ep_router): every rank
// runs its own experts on every token the router sends there, the router's other picks masked,
// and moe_tp_experts (on the ep mesh) runs them on their local pieces and sums the partial outputs
// with one all_reduce.
Plan EpAllReducePlan() {
  return {
      {"model.layers.*.mlp.gate", "ep_router"},
      {"model.layers.*.mlp.experts.gate_up_proj", "grouped_gemm"},
      {"model.layers.*.mlp.experts.down_proj", "grouped_gemm"},
      {"model.layers.*.mlp.experts", "moe_tp_experts"},
  };
}

// The table of the header comment, one designated initializer per family (fields in their
// declaration order; the rest keep Llama's defaults).
std::vector<DecoderFamily> MakeFamilies() {
  Plan qwen3_plan = AttentionPlan();
  // The norms act on each head's head_dim values, so they stay whole on every rank.
  qwen3_plan.insert(qwen3_plan.begin() + 3,
                    {{"model.layers.*.self_attn.q_norm", "replicated_with_grad_allreduce"},
                     {"model.layers.*.self_attn.k_norm", "replicated_with_grad_allreduce"}});
  // See the header: block shards instead of transformers' gather-then-slice.
  const Plan phi3_plan = {
      {"model.layers.*.self_attn.qkv_proj", "packed_colwise"},
      {"model.layers.*.self_attn.o_proj", "rowwise"},
      {"lm_head", "colwise_gather_output"},
  };
  const Plan phi3_mlp = {
      {"model.layers.*.mlp.gate_up_proj", "packed_colwise"},
      {"model.layers.*.mlp.down_proj", "rowwise"},
  };
  // transformers' DeepSeek-V2 plan: latent attention (nn/latent_attention.h) with its heads split
  // by q_proj / q_b_proj and kv_b_proj (CausalLM::TPPlan keeps the q projection the config
  // builds), the shared experts as a gated MLP beside the routed ones.
  const Plan deepseek_plan = {
      {"model.layers.*.self_attn.q_proj", "colwise"},
      {"model.layers.*.self_attn.q_b_proj", "colwise"},
      {"model.layers.*.self_attn.kv_a_proj_with_mqa", "mla_kv_a_proj"},
      {"model.layers.*.self_attn.kv_b_proj", "colwise"},
      {"model.layers.*.self_attn.o_proj", "rowwise"},
      {"lm_head", "colwise_gather_output"},
  };
  Plan deepseek_moe = ExpertsPlan();
  deepseek_moe.insert(deepseek_moe.end(),
                      {{"model.layers.*.mlp.shared_experts.gate_proj", "colwise"},
                       {"model.layers.*.mlp.shared_experts.up_proj", "colwise"},
                       {"model.layers.*.mlp.shared_experts.down_proj", "rowwise"}});
  // transformers' MiniCPM5-MoE plan: the query heads (each with its gate) colwise, the two KV
  // heads unit_colwise (Note [Unit meshes] in nn/styles.h: whole heads on every rank at any tp);
  // its experts as DeepSeek's.
  const Plan minicpm5_plan = {
      {"model.layers.*.self_attn.q_gate_proj", "colwise"},
      {"model.layers.*.self_attn.k_proj", "unit_colwise"},
      {"model.layers.*.self_attn.v_proj", "unit_colwise"},
      {"model.layers.*.self_attn.o_proj", "rowwise"},
      {"lm_head", "colwise_gather_output"},
  };
  using SW = SlidingWindowFields;
  return {
      {.model_type = "llama", .architecture = "LlamaForCausalLM", .gguf_architecture = "llama",
       .attention_bias_field = true, .mlp_bias_field = true, .tp_plan = AttentionPlan(),
       .mlp_plan = MlpPlan()},
      {.model_type = "mistral", .architecture = "MistralForCausalLM", .gguf_architecture = "llama",
       .default_max_position_embeddings = 4096 * 32, .sliding_window = SW::kAll,
       .default_sliding_window = 4096, .tp_plan = AttentionPlan(), .mlp_plan = MlpPlan()},
      {.model_type = "qwen2", .architecture = "Qwen2ForCausalLM", .gguf_architecture = "qwen2",
       .qkv_bias = true, .default_max_position_embeddings = 32768, .sliding_window = SW::kQwen,
       .tp_plan = AttentionPlan(), .mlp_plan = MlpPlan()},
      {.model_type = "qwen3", .architecture = "Qwen3ForCausalLM", .gguf_architecture = "qwen3",
       .attention_bias_field = true, .qk_norm = true, .default_head_dim = 128,
       .default_max_position_embeddings = 32768, .sliding_window = SW::kQwen,
       .tp_plan = qwen3_plan, .mlp_plan = MlpPlan()},
      {.model_type = "phi3", .architecture = "Phi3ForCausalLM", .gguf_architecture = "phi3",
       .fused_qkv = true, .fused_gate_up = true, .default_max_position_embeddings = 4096,
       .default_rms_norm_eps = 1e-5, .sliding_window = SW::kAll,
       .longrope_aliases = {"su", "yarn"}, .tp_plan = phi3_plan, .mlp_plan = phi3_mlp},
      {.model_type = "mixtral", .architecture = "MixtralForCausalLM", .gguf_architecture = "llama",
       .moe_layers = MoeLayers::kAll, .moe_checkpoint_block = "block_sparse_moe",
       .expert_checkpoint_names = {"w1", "w3", "w2"},
       .default_max_position_embeddings = 4096 * 32, .default_rms_norm_eps = 1e-5,
       .default_rope_theta = 1e6, .sliding_window = SW::kAll, .tp_plan = AttentionPlan(),
       .moe_plan = ExpertsPlan(),
       .ep_plan = EpPlan(), .ep_all_reduce_plan = EpAllReducePlan()},
      {.model_type = "qwen3_moe", .architecture = "Qwen3MoeForCausalLM",
       .gguf_architecture = "qwen3moe", .attention_bias_field = true, .qk_norm = true,
       .default_head_dim = 128, .moe_layers = MoeLayers::kSparseStep,
       .topk_weights = TopKWeights::kConfig, .default_max_position_embeddings = 32768,
       .sliding_window = SW::kQwen, .tp_plan = qwen3_plan, .mlp_plan = MlpPlan(),
       .moe_plan = ExpertsPlan(), .ep_plan = EpPlan(), .ep_all_reduce_plan = EpAllReducePlan()},
      {.model_type = "deepseek_v2", .architecture = "DeepseekV2ForCausalLM",
       .attention_bias_field = true, .latent_attention = true, .rotary_interleaved = true,
       .mlp_bias_field = true, .moe_layers = MoeLayers::kAfterDense,
       .topk_weights = TopKWeights::kScaled, .router_f32 = true, .shared_experts = true,
       .tp_plan = deepseek_plan, .mlp_plan = MlpPlan(), .moe_plan = deepseek_moe,
       .ep_plan = EpPlan(), .ep_all_reduce_plan = EpAllReducePlan()},
      {.model_type = "minicpm5_moe", .architecture = "MiniCPM5MoeForCausalLM",
       .attention_bias_field = true, .gated_attention = true, .default_head_dim = 128,
       .moe_layers = MoeLayers::kLayerTypes, .topk_weights = TopKWeights::kSigmoidGroups,
       .router_f32 = true, .shared_experts = true, .default_max_position_embeddings = 524288,
       .default_rope_theta = 5e6, .tp_plan = minicpm5_plan, .mlp_plan = MlpPlan(),
       .moe_plan = deepseek_moe, .ep_plan = EpPlan(), .ep_all_reduce_plan = EpAllReducePlan()},
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

absl::StatusOr<const DecoderFamily*> FindGgufDecoderFamily(absl::string_view arch,
                                                           bool experts) {
  std::string names;
  for (const DecoderFamily& f : DecoderFamilies()) {
    if (f.gguf_architecture.empty()) continue;
    // The first: llama before mistral; mixtral for llama with experts.
    if (f.gguf_architecture == arch && f.moe() == experts) return &f;
    if (names.find(f.gguf_architecture) == std::string::npos) {
      absl::StrAppend(&names, names.empty() ? "" : ", ", f.gguf_architecture);
    }
  }
  return absl::UnimplementedError(absl::StrCat("architecture '", arch,
                                               "' is not supported (supported: ", names, ")"));
}

}  // namespace dt::loaders
