#include "dtensor/nn/models/decoder_family.h"

#include "absl/strings/str_cat.h"

namespace dt::nn {
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
// declaration order; the rest keep Llama's defaults). Its config class is the row of the same
// model_type in loaders/hf_config.cc (Note [Config classes and families]).
std::vector<DecoderFamily> MakeFamilies() {
  Plan qwen3_plan = AttentionPlan();
  // The norms act on each head's head_dim values, so they stay whole on every rank.
  qwen3_plan.insert(qwen3_plan.begin() + 3,
                    {{"model.layers.*.self_attn.q_norm", "replicated_with_grad_allreduce"},
                     {"model.layers.*.self_attn.k_norm", "replicated_with_grad_allreduce"}});
  // See the file comment of the header: block shards instead of transformers' gather-then-slice.
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
  // gpt-oss: transformers 5.25's plan splits the vocab (embed_tokens embedding_rowwise, lm_head
  // colwise_gather_output) and leaves attention and experts whole; here the attention is split
  // as every family's and the experts inside each rank's share (Note [gpt-oss experts] in
  // nn/moe.h: their x · W layout makes gate_up_proj rowwise and down_proj colwise). The sinks
  // stay whole (each rank reads its heads').
  Plan gpt_oss_plan = AttentionPlan();
  gpt_oss_plan.insert(gpt_oss_plan.begin(), {"model.embed_tokens", "embedding_rowwise"});
  const Plan gpt_oss_moe = {
      {"model.layers.*.mlp.experts.gate_up_proj", "rowwise"},
      {"model.layers.*.mlp.experts.gate_up_proj_bias", "rowwise"},
      {"model.layers.*.mlp.experts.down_proj", "colwise"},
      {"model.layers.*.mlp.experts", "moe_tp_experts"},
  };
  // transformers' base_model_ep_plan for gpt-oss: the biases go with their experts.
  const Plan gpt_oss_ep = {
      {"model.layers.*.mlp.experts.gate_up_proj", "grouped_gemm"},
      {"model.layers.*.mlp.experts.gate_up_proj_bias", "grouped_gemm"},
      {"model.layers.*.mlp.experts.down_proj", "grouped_gemm"},
      {"model.layers.*.mlp.experts.down_proj_bias", "grouped_gemm"},
      {"model.layers.*.mlp.experts", "ep_dispatch_experts"},
  };
  const Plan gpt_oss_ep_all_reduce = {
      {"model.layers.*.mlp.router", "ep_router"},
      {"model.layers.*.mlp.experts.gate_up_proj", "grouped_gemm"},
      {"model.layers.*.mlp.experts.gate_up_proj_bias", "grouped_gemm"},
      {"model.layers.*.mlp.experts.down_proj", "grouped_gemm"},
      {"model.layers.*.mlp.experts.down_proj_bias", "grouped_gemm"},
      {"model.layers.*.mlp.experts", "moe_tp_experts"},
  };
  return {
      {.model_type = "llama", .tp_plan = AttentionPlan(), .mlp_plan = MlpPlan()},
      {.model_type = "mistral", .tp_plan = AttentionPlan(), .mlp_plan = MlpPlan()},
      {.model_type = "qwen2", .tp_plan = AttentionPlan(), .mlp_plan = MlpPlan()},
      {.model_type = "qwen3", .qk_norm = true, .tp_plan = qwen3_plan, .mlp_plan = MlpPlan()},
      {.model_type = "phi3", .fused_qkv = true, .fused_gate_up = true, .tp_plan = phi3_plan,
       .mlp_plan = phi3_mlp},
      {.model_type = "mixtral", .tp_plan = AttentionPlan(), .moe_plan = ExpertsPlan(),
       .ep_plan = EpPlan(), .ep_all_reduce_plan = EpAllReducePlan()},
      {.model_type = "qwen3_moe", .qk_norm = true, .router_weights_in_input_dtype = true,
       .tp_plan = qwen3_plan, .mlp_plan = MlpPlan(), .moe_plan = ExpertsPlan(),
       .ep_plan = EpPlan(), .ep_all_reduce_plan = EpAllReducePlan()},
      {.model_type = "deepseek_v2", .latent_attention = true, .rotary_interleaved = true,
       .router_f32 = true, .tp_plan = deepseek_plan, .mlp_plan = MlpPlan(),
       .moe_plan = deepseek_moe, .ep_plan = EpPlan(), .ep_all_reduce_plan = EpAllReducePlan()},
      {.model_type = "minicpm5_moe", .gated_attention = true,
       .router_scoring = RouterScoring::kSigmoid, .router_f32 = true, .tp_plan = minicpm5_plan,
       .mlp_plan = MlpPlan(), .moe_plan = deepseek_moe, .ep_plan = EpPlan(),
       .ep_all_reduce_plan = EpAllReducePlan()},
      {.model_type = "gemma", .norm_form = RMSNormForm::kOnePlusWeight, .embed_scale = true,
       .tp_plan = AttentionPlan(), .mlp_plan = MlpPlan()},
      // transformers' OLMo 2 plan gathers q, k and v (colwise_gather_output) for its norms over
      // the whole projection; here they stay split and the norms sum their squares across the
      // ranks (Note [A norm over a sharded dim] in nn/norm.h).
      {.model_type = "olmo2", .qk_norm_whole = true, .layer_norms = LayerNorms::kPost,
       .norm_form = RMSNormForm::kScaleThenRound, .tp_plan = AttentionPlan(),
       .mlp_plan = MlpPlan()},
      // Its scores' scale, soft-cap and windows are the config's (MakeAttention).
      {.model_type = "gemma2", .layer_norms = LayerNorms::kPreAndPost,
       .norm_form = RMSNormForm::kOnePlusWeight, .embed_scale = true, .tp_plan = AttentionPlan(),
       .mlp_plan = MlpPlan()},
      // As Gemma 2 with Qwen3's per-head q/k norms (in the (1 + w) form); the sliding layers'
      // RoPE base is the config's (DecoderModel's rotary_emb_local).
      {.model_type = "gemma3_text", .qk_norm = true, .layer_norms = LayerNorms::kPreAndPost,
       .norm_form = RMSNormForm::kOnePlusWeight, .embed_scale = true, .tp_plan = qwen3_plan,
       .mlp_plan = MlpPlan()},
      // Its router's top-k weights are a softmax in the logits' dtype (GptOssTopKRouter).
      {.model_type = "gpt_oss", .sinks = true, .router_weights_in_input_dtype = true,
       .router_name = "router", .router_bias = true,
       .experts_layout = ExpertsLayout::kInterleavedColumns, .tp_plan = gpt_oss_plan,
       .moe_plan = gpt_oss_moe, .ep_plan = gpt_oss_ep,
       .ep_all_reduce_plan = gpt_oss_ep_all_reduce},
  };
}

}  // namespace

const std::vector<DecoderFamily>& DecoderFamilies() {
  static const std::vector<DecoderFamily>* const families =
      new std::vector<DecoderFamily>(MakeFamilies());
  return *families;
}

std::string DecoderFamilyNames() { return loaders::ModelTypesOf(DecoderFamilies()); }

absl::StatusOr<const DecoderFamily*> FindDecoderFamily(absl::string_view model_type) {
  return loaders::FindModelType(DecoderFamilies(), model_type);
}

const DecoderFamily& FamilyOf(const loaders::DecoderConfig& config) {
  absl::StatusOr<const DecoderFamily*> f = FindDecoderFamily(config.model_type);
  return f.ok() ? **f : DecoderFamilies().front();
}

int64_t NumParameters(const loaders::DecoderConfig& c) {
  const DecoderFamily& f = FamilyOf(c);
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim, i = c.intermediate_size;
  int64_t attention = h * q + 2 * h * kv + q * h;
  if (f.latent_attention) {
    const int64_t heads = c.num_attention_heads, qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
    const int64_t q_lora = c.q_lora_rank, kv_lora = c.kv_lora_rank;
    attention = (q_lora > 0 ? h * q_lora + q_lora + q_lora * heads * qk : h * heads * qk) +
                h * (kv_lora + c.qk_rope_head_dim) + kv_lora +
                kv_lora * heads * (c.qk_nope_head_dim + c.v_head_dim) + heads * c.v_head_dim * h;
    if (c.attention_bias) attention += (q_lora > 0 ? q_lora : 0) + kv_lora + c.qk_rope_head_dim + h;
  } else {
    if (f.gated_attention) attention += h * q + (c.qkv_bias() ? q : 0);  // the gate rows
    if (c.qkv_bias()) attention += q + 2 * kv;
    if (c.o_bias()) attention += h;
    if (f.qk_norm) attention += 2 * c.head_dim;
    if (f.qk_norm_whole) attention += q + kv;
    if (f.sinks) attention += c.num_attention_heads;
  }
  const int64_t dense = 3 * h * i + (c.mlp_bias ? 2 * i + h : 0);
  const int64_t shared = c.n_shared_experts * c.moe_intermediate_size;
  const int64_t router_bias =
      f.router_scoring == RouterScoring::kSigmoid || f.router_bias ? c.num_experts : 0;
  const int64_t expert_biases = f.experts_layout == ExpertsLayout::kInterleavedColumns
                                    ? c.num_experts * (2 * c.moe_intermediate_size + h)
                                    : 0;
  const int64_t sparse = c.num_experts * h + router_bias + expert_biases +
                         c.num_experts * 3 * h * c.moe_intermediate_size +
                         (shared > 0 ? 3 * h * shared + (c.mlp_bias ? 2 * shared + h : 0) : 0);
  const int64_t norms = (f.layer_norms == LayerNorms::kPreAndPost ? 4 : 2) * h;
  int64_t layers = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    layers += attention + norms + (c.IsMoeLayer(l) ? sparse : dense);
  }
  return c.vocab_size * h * (c.tie_word_embeddings ? 1 : 2) + layers + h;
}

}  // namespace dt::nn
