#include "dtensor/loaders/hf_config.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace dt::loaders {

std::string DecoderConfig::Summary() const {
  std::string rope = rope_scaling.rope_type;
  if (rope != "default" && (rope != "longrope" || rope_scaling.has_factor)) {
    absl::StrAppend(&rope, "(x", rope_scaling.factor, ")");
  }
  const std::string experts =
      num_experts > 0 ? absl::StrCat(" experts=", num_experts, "x", moe_intermediate_size, " top",
                                     num_experts_per_tok,
                                     n_shared_experts > 0
                                         ? absl::StrCat("+", n_shared_experts, " shared")
                                         : "")
                      : "";
  return absl::StrCat(model_type, ": L=", num_hidden_layers, " H=", hidden_size,
                      " I=", intermediate_size, experts, " heads=", num_attention_heads, "/",
                      num_key_value_heads, " head_dim=", head_dim, " V=", vocab_size,
                      " rope=", rope, " theta=", rope_theta, " ", DTypeName(dtype),
                      tie_word_embeddings ? " tied" : " untied");
}

std::string DecoderConfigToJson(const DecoderConfig& c) {
  const DecoderConfigClass& cls = c.config_class();
  nlohmann::ordered_json j;
  j["architectures"] = {cls.architecture};
  j["model_type"] = cls.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  const RopeScaling& s = c.rope_scaling;
  if (s.rope_type == "default" && cls.default_rope_parameters.empty()) {
    j["rope_scaling"] = nullptr;
  } else if (s.rope_type == "default") {  // null would read as the class's own (GptOssConfig)
    j["rope_scaling"] = {{"rope_type", "default"}};
  } else {
    nlohmann::ordered_json r;
    r["rope_type"] = s.rope_type;
    if (s.rope_type != "longrope" || s.has_factor) r["factor"] = s.factor;
    if (s.rope_type == "llama3") {
      r["low_freq_factor"] = s.low_freq_factor;
      r["high_freq_factor"] = s.high_freq_factor;
    }
    if (s.rope_type == "llama3" || s.rope_type == "yarn" || s.rope_type == "longrope") {
      r["original_max_position_embeddings"] = s.original_max_position_embeddings;
    }
    if (s.attention_factor) r["attention_factor"] = *s.attention_factor;
    if (s.beta_fast) r["beta_fast"] = *s.beta_fast;
    if (s.beta_slow) r["beta_slow"] = *s.beta_slow;
    if (s.mscale) r["mscale"] = *s.mscale;
    if (s.mscale_all_dim) r["mscale_all_dim"] = *s.mscale_all_dim;
    if (s.rope_type == "yarn" && !s.truncate) r["truncate"] = false;
    if (s.rope_type == "longrope") {
      r["short_factor"] = s.short_factor;
      r["long_factor"] = s.long_factor;
    }
    j["rope_scaling"] = r;
  }
  j[cls.activation_key == ActivationKey::kHiddenActivation ? "hidden_activation" : "hidden_act"] =
      c.hidden_act;
  if (cls.attention_bias_field) j["attention_bias"] = c.attention_bias;
  if (cls.mlp_bias_field) j["mlp_bias"] = c.mlp_bias;
  switch (cls.sliding_window) {
    case SlidingWindowFields::kNone:
      break;
    case SlidingWindowFields::kAll:
      if (c.sliding_window > 0) {
        j["sliding_window"] = c.sliding_window;
      } else {
        j["sliding_window"] = nullptr;
      }
      break;
    case SlidingWindowFields::kLayerTypes: {
      int64_t window = 0;
      std::vector<std::string> types;
      for (const int64_t w : c.layer_windows) {
        window = std::max(window, w);
        types.push_back(w > 0 ? "sliding_attention" : "full_attention");
      }
      j["sliding_window"] = window > 0 ? nlohmann::ordered_json(window) : nlohmann::ordered_json(nullptr);
      j["layer_types"] = types;
      break;
    }
    case SlidingWindowFields::kFromLayer:
      j["use_sliding_window"] = c.sliding_window > 0;
      if (c.sliding_window > 0) {
        j["sliding_window"] = c.sliding_window;
        j["max_window_layers"] = c.sliding_from;
      }
      break;
  }
  if (cls.local_rope_fields) j["rope_local_base_freq"] = c.local_rope_theta;
  if (cls.attention_scale_fields) {
    auto number = [](double v) { return v > 0 ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr); };
    j["query_pre_attn_scalar"] = number(c.query_pre_attn_scalar);
    j["attn_logit_softcapping"] = number(c.attn_logit_softcapping);
    j["final_logit_softcapping"] = number(c.final_logit_softcapping);
  }
  if (cls.experts != ExpertFields::kNone) j["num_experts_per_tok"] = c.num_experts_per_tok;
  switch (cls.experts) {
    case ExpertFields::kNone:
      break;
    case ExpertFields::kLocalExperts:
      j["num_local_experts"] = c.num_experts;
      break;
    case ExpertFields::kSwigluLimit:
      j["num_local_experts"] = c.num_experts;
      j["swiglu_limit"] = c.swiglu_limit;
      j["swiglu_alpha"] = c.swiglu_alpha;
      break;
    case ExpertFields::kSparseStep:
      j["num_experts"] = c.num_experts;
      j["moe_intermediate_size"] = c.moe_intermediate_size;
      j["decoder_sparse_step"] = c.decoder_sparse_step;
      j["mlp_only_layers"] = c.mlp_only_layers;
      break;
    case ExpertFields::kFirstKDense:
    case ExpertFields::kLayerTypes:
      j["n_routed_experts"] = c.num_experts;
      j["moe_intermediate_size"] = c.moe_intermediate_size;
      j["n_shared_experts"] = c.n_shared_experts;
      if (c.mlp_sparse.empty()) {  // as read: a list of num_hidden_layers is not built here
        j["first_k_dense_replace"] = c.first_k_dense_replace;
      } else {  // kLayerTypes
        std::vector<std::string> types;
        for (bool sparse : c.mlp_sparse) types.push_back(sparse ? "sparse" : "dense");
        j["mlp_layer_types"] = types;
      }
      break;
  }
  if (cls.experts != ExpertFields::kNone) {
    switch (cls.router) {
      case RouterFields::kNone:
        break;
      case RouterFields::kNormTopkProb:
        j["norm_topk_prob"] = c.norm_topk_prob;
        break;
      case RouterFields::kScalingFactor:
        j["routed_scaling_factor"] = c.routed_scaling_factor;
        j["topk_method"] = "greedy";
        break;
      case RouterFields::kGroups:
        j["norm_topk_prob"] = c.norm_topk_prob;
        j["routed_scaling_factor"] = c.routed_scaling_factor;
        j["n_group"] = c.n_group;
        j["topk_group"] = c.topk_group;
        break;
    }
  }
  if (cls.latent_attention_fields) {
    if (c.q_lora_rank > 0) {
      j["q_lora_rank"] = c.q_lora_rank;
    } else {
      j["q_lora_rank"] = nullptr;
    }
    j["kv_lora_rank"] = c.kv_lora_rank;
    j["qk_nope_head_dim"] = c.qk_nope_head_dim;
    j["qk_rope_head_dim"] = c.qk_rope_head_dim;
    j["v_head_dim"] = c.v_head_dim;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = c.dtype == DType::kBF16   ? "bfloat16"
                     : c.dtype == DType::kF16 ? "float16"
                                              : "float32";
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  if (c.eos_token_ids.size() > 1) j["eos_token_id"] = c.eos_token_ids;
  return j.dump(2) + "\n";
}

}  // namespace dt::loaders
