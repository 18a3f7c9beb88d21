#include "dtensor/loaders/hf_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/gguf_llama.h"
#include "dtensor/loaders/json_reader.h"
#include "dtensor/loaders/small_file.h"
#include "nlohmann/json.hpp"

namespace dt::loaders {
namespace {

using Json = nlohmann::json;
using internal::Reader;
using internal::TorchDType;

// The keys each rope_type takes besides rope_type/type and rope_theta (transformers' validation).
const std::vector<std::string>& RopeKeys(const std::string& type) {
  static const auto* keys = new std::map<std::string, std::vector<std::string>>{
      {"default", {}},
      {"linear", {"factor"}},
      {"dynamic", {"factor"}},
      {"yarn", {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                "mscale", "mscale_all_dim", "truncate"}},
      {"longrope", {"short_factor", "long_factor", "original_max_position_embeddings", "factor",
                    "attention_factor"}},
      {"llama3", {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}},
  };
  static const std::vector<std::string> none;
  auto it = keys->find(type);
  return it == keys->end() ? none : it->second;
}

absl::StatusOr<std::vector<double>> NumberList(const Reader& r, const Json& obj, absl::string_view key,
                                               size_t want, absl::string_view where) {
  const Json* v = r.Find(obj, key);
  if (v == nullptr) return r.Error(absl::StrCat("\"", where, "\" of rope_type longrope needs \"", key, "\""));
  if (!v->is_array() || v->size() != want) {
    return r.Error(absl::StrCat("\"", where, ".", key, "\" must be a list of ", want,
                                " numbers (head_dim / 2), got ", v->dump().substr(0, 80)));
  }
  std::vector<double> out;
  for (const Json& x : *v) {
    if (!x.is_number() || !(x.get<double>() > 0) || !std::isfinite(x.get<double>())) {
      return r.Error(absl::StrCat("\"", where, ".", key, "\" must hold positive numbers, got ", x.dump()));
    }
    out.push_back(x.get<double>());
  }
  return out;
}

// Needs head_dim and max_position_embeddings parsed.
absl::Status ParseRope(const Reader& r, const DecoderConfigClass& cls, DecoderConfig* c) {
  const Json& j = r.j();
  // v5: rope_parameters {rope_type, rope_theta, ...}; v4: rope_theta + rope_scaling {...}.
  // transformers takes rope_scaling over rope_parameters; a config with both that disagree is
  // ambiguous, so it is refused.
  const Json* v5 = r.Find(j, "rope_parameters");
  const Json* v4 = r.Find(j, "rope_scaling");
  if (v5 != nullptr && v4 != nullptr && *v5 != *v4) {
    return r.Error(absl::StrCat("\"rope_parameters\" ", v5->dump().substr(0, 120), " and \"rope_scaling\" ",
                                v4->dump().substr(0, 120), " disagree; keep one"));
  }
  const Json* params = v5 != nullptr ? v5 : v4;
  const std::string key = v5 != nullptr ? "rope_parameters" : "rope_scaling";
  DT_ASSIGN_OR_RETURN(c->rope_theta, r.PositiveNumber(j, "rope_theta", cls.default_rope_theta));
  Json class_default;  // the class's rope when the config names none (GptOssConfig's YaRN)
  if (params == nullptr && !cls.default_rope_parameters.empty()) {
    class_default = Json::parse(cls.default_rope_parameters);
    params = &class_default;
  }
  if (params == nullptr) return absl::OkStatus();
  if (!params->is_object()) {
    return r.Error(absl::StrCat("\"", key, "\" must be an object or null, got ", params->dump()));
  }
  if (r.Find(*params, "rope_theta") != nullptr) {
    DT_ASSIGN_OR_RETURN(const double theta, r.PositiveNumber(*params, "rope_theta", c->rope_theta));
    if (r.Find(j, "rope_theta") != nullptr && theta != c->rope_theta) {
      return r.Error(absl::StrCat("\"rope_theta\" ", c->rope_theta, " and \"", key, ".rope_theta\" ", theta,
                                  " disagree; keep one"));
    }
    c->rope_theta = theta;
  }
  const Json* type = r.Find(*params, "rope_type");
  if (type == nullptr) type = r.Find(*params, "type");  // legacy spelling
  std::string t = "default";
  if (type != nullptr) {
    if (!type->is_string()) {
      return r.Error(absl::StrCat("\"", key, ".rope_type\" must be a string, got ", type->dump()));
    }
    t = type->get<std::string>();
    for (const std::string& alias : cls.longrope_aliases) {
      if (t == alias) t = "longrope";  // transformers' Phi-3 reads legacy names as longrope
    }
  }
  static const std::vector<std::string> kTypes = {"default", "linear", "dynamic", "yarn", "longrope", "llama3"};
  if (std::find(kTypes.begin(), kTypes.end(), t) == kTypes.end()) {
    return r.Unsupported(absl::StrCat("rope_type \"", t,
                                      "\" is not supported (default, linear, dynamic, yarn, longrope, llama3)"));
  }
  const std::vector<std::string>& allowed = RopeKeys(t);
  for (auto it = params->begin(); it != params->end(); ++it) {
    const std::string& k = it.key();
    if (k == "rope_type" || k == "type" || k == "rope_theta" || it->is_null()) continue;
    if (k == "partial_rotary_factor" && it->is_number() && it->get<double>() == 1.0) continue;
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end()) {
      return r.Unsupported(absl::StrCat("\"", key, ".", k, "\" is not a parameter of rope_type ", t,
                                        " that this implementation knows; refusing to ignore it"));
    }
  }
  RopeScaling& s = c->rope_scaling;
  s.rope_type = t;
  if (t == "default") return absl::OkStatus();
  auto require = [&](const char* f) -> absl::Status {
    if (r.Find(*params, f) != nullptr) return absl::OkStatus();
    return r.Error(absl::StrCat("\"", key, "\" of rope_type ", t, " needs \"", f, "\""));
  };
  auto optional_number = [&](const char* f, std::optional<double>* out) -> absl::Status {
    if (r.Find(*params, f) == nullptr) return absl::OkStatus();
    DT_ASSIGN_OR_RETURN(double v, r.PositiveNumber(*params, f, 1.0));
    *out = v;
    return absl::OkStatus();
  };
  // Phi-3 style: a top-level original_max_position_embeddings wins (transformers' exception).
  DT_ASSIGN_OR_RETURN(const int64_t top_original,
                      r.PositiveInt(j, "original_max_position_embeddings", int64_t{0}));
  DT_ASSIGN_OR_RETURN(s.original_max_position_embeddings,
                      r.PositiveInt(*params, "original_max_position_embeddings", c->max_position_embeddings));
  if (top_original > 0) s.original_max_position_embeddings = top_original;
  if (t != "longrope") DT_RETURN_IF_ERROR(require("factor"));
  s.has_factor = r.Find(*params, "factor") != nullptr;
  DT_ASSIGN_OR_RETURN(s.factor, r.PositiveNumber(*params, "factor", 1.0));
  if (t == "llama3") {
    DT_RETURN_IF_ERROR(require("low_freq_factor"));
    DT_RETURN_IF_ERROR(require("high_freq_factor"));
    DT_ASSIGN_OR_RETURN(s.low_freq_factor, r.PositiveNumber(*params, "low_freq_factor", 1.0));
    DT_ASSIGN_OR_RETURN(s.high_freq_factor, r.PositiveNumber(*params, "high_freq_factor", 4.0));
    if (!(s.low_freq_factor < s.high_freq_factor)) {
      return r.Error(absl::StrCat("llama3 rope: low_freq_factor ", s.low_freq_factor,
                                  " must be below high_freq_factor ", s.high_freq_factor));
    }
  } else if (t == "yarn") {
    DT_RETURN_IF_ERROR(optional_number("attention_factor", &s.attention_factor));
    DT_RETURN_IF_ERROR(optional_number("beta_fast", &s.beta_fast));
    DT_RETURN_IF_ERROR(optional_number("beta_slow", &s.beta_slow));
    DT_RETURN_IF_ERROR(optional_number("mscale", &s.mscale));
    DT_RETURN_IF_ERROR(optional_number("mscale_all_dim", &s.mscale_all_dim));
    if (const Json* tr = r.Find(*params, "truncate")) {
      if (!tr->is_boolean()) return r.Error(absl::StrCat("\"", key, ".truncate\" must be true or false"));
      s.truncate = tr->get<bool>();
    }
    if (s.beta_fast.value_or(32) < s.beta_slow.value_or(1)) {
      return r.Error(absl::StrCat("yarn rope: beta_fast ", s.beta_fast.value_or(32), " must not be below beta_slow ",
                                  s.beta_slow.value_or(1)));
    }
  } else if (t == "longrope") {
    const size_t half = static_cast<size_t>(c->head_dim / 2);
    DT_ASSIGN_OR_RETURN(s.short_factor, NumberList(r, *params, "short_factor", half, key));
    DT_ASSIGN_OR_RETURN(s.long_factor, NumberList(r, *params, "long_factor", half, key));
    DT_RETURN_IF_ERROR(optional_number("attention_factor", &s.attention_factor));
  }
  return absl::OkStatus();
}

// Note [Fields no family implements]
// Keys of transformers' decoder config classes that change what a model computes. A config that
// sets one its class does not read is refused by name rather than computed without it: a field of
// another family (a Gemma 2 checkpoint relabelled "llama" still carries its soft-caps,
// query_pre_attn_scalar and layer_types), a feature of a supported family that dtensor does not
// compute (Phi-4-mini's partial_rotary_factor under phi3), or one no family here has
// (quantization_config). The values transformers reads as "the feature is off" are accepted: null,
// false, 0 and an empty list, 1 for factors, and a layer_types whose every layer is
// "full_attention". Features with no config field of their own (gpt-oss's attention sinks, OLMo 2's
// post-norms, Gemma's (1 + w) norms) show in the checkpoint's tensors instead, which a strict load
// refuses when the model does not use them (Note [Every tensor is used] in nn/load.h).
struct UnimplementedField {
  enum Off : uint8_t { kZero, kOne, kAllFullAttention };
  const char* key;
  const char* what;  // whose feature, for the message
  Off off = kZero;
  // The config classes that read the key themselves; nullptr: none.
  bool (*read_by)(const DecoderConfigClass&) = nullptr;
};

bool HasExperts(const DecoderConfigClass& c) { return c.experts != ExpertFields::kNone; }
bool HasSharedExperts(const DecoderConfigClass& c) {
  return c.experts == ExpertFields::kFirstKDense || c.experts == ExpertFields::kLayerTypes;
}
bool HasSparseStep(const DecoderConfigClass& c) { return c.experts == ExpertFields::kSparseStep; }
bool HasMlpLayerTypes(const DecoderConfigClass& c) {
  return c.experts == ExpertFields::kLayerTypes;  // also its use_gated_attention (ParseExperts)
}
bool HasLatentAttention(const DecoderConfigClass& c) { return c.latent_attention_fields; }
bool ReadsHiddenActivation(const DecoderConfigClass& c) {
  return c.activation_key != ActivationKey::kHiddenAct;
}
bool ReadsAttentionScales(const DecoderConfigClass& c) { return c.attention_scale_fields; }
bool ReadsSlidingPattern(const DecoderConfigClass& c) { return c.sliding_pattern_field; }
bool ReadsLocalRope(const DecoderConfigClass& c) { return c.local_rope_fields; }
bool ReadsSwigluLimit(const DecoderConfigClass& c) {
  return c.experts == ExpertFields::kSwigluLimit;
}
bool ReadsLayerTypes(const DecoderConfigClass& c) {
  return c.sliding_window == SlidingWindowFields::kFromLayer ||
         c.sliding_window == SlidingWindowFields::kLayerTypes;
}
bool HasWindow(const DecoderConfigClass& c) {
  return c.sliding_window != SlidingWindowFields::kNone;
}
bool HasLayerWindows(const DecoderConfigClass& c) {
  return c.sliding_window == SlidingWindowFields::kFromLayer;
}

const std::vector<UnimplementedField>& UnimplementedFields() {
  using F = UnimplementedField;
  static const std::vector<F>* const fields = new std::vector<F>{
      // ---- attention
      {"partial_rotary_factor", "partial rotary embeddings (Phi-4-mini, StableLM)", F::kOne},
      {"rotary_pct", "GPT-NeoX's partial rotary embeddings", F::kOne},
      {"attn_logit_softcapping", "Gemma 2's attention logit soft-capping", F::kZero,
       ReadsAttentionScales},
      {"query_pre_attn_scalar", "Gemma 2's attention scale", F::kZero, ReadsAttentionScales},
      {"use_bidirectional_attention", "Gemma's bidirectional attention"},
      {"layer_types", "per-layer attention types (Gemma 2, Gemma 3, gpt-oss)",
       F::kAllFullAttention, ReadsLayerTypes},
      {"sliding_window", "sliding-window attention", F::kZero, HasWindow},
      {"use_sliding_window", "Qwen's sliding-window attention", F::kZero, HasLayerWindows},
      {"sliding_window_pattern", "Gemma 3's local and global layers", F::kZero,
       ReadsSlidingPattern},
      {"rope_local_base_freq", "Gemma 3's local RoPE base", F::kZero, ReadsLocalRope},
      {"use_gated_attention", "gated attention (Qwen3-Next)", F::kZero, HasMlpLayerTypes},
      {"q_lora_rank", "DeepSeek's latent attention", F::kZero, HasLatentAttention},
      {"kv_lora_rank", "DeepSeek's latent attention", F::kZero, HasLatentAttention},
      {"clip_qkv", "OLMo's q/k/v clipping"},
      {"use_qk_norm", "q/k norms (Cohere, Llama 4)"},
      {"qk_layernorm", "q/k layer norms (Persimmon, StableLM)"},
      {"use_parallel_residual", "parallel residuals (GPT-NeoX, StableLM)"},
      {"parallel_attn", "Falcon's parallel attention"},
      {"alibi", "Falcon's ALiBi positions"},
      {"no_rope_layers", "Llama 4's layers without RoPE"},
      {"attention_chunk_size", "Llama 4's chunked attention"},
      {"attn_temperature_tuning", "Llama 4's attention temperature"},
      {"attention_multiplier", "Granite's attention scale", F::kOne},
      // ---- MLP and experts
      {"hidden_activation", "Gemma's MLP activation", F::kZero, ReadsHiddenActivation},
      {"swiglu_limit", "gpt-oss's clamped SwiGLU", F::kZero, ReadsSwigluLimit},
      {"num_experts", "experts", F::kZero, HasExperts},
      {"num_local_experts", "experts", F::kZero, HasExperts},
      {"n_routed_experts", "experts", F::kZero, HasExperts},
      {"moe_intermediate_size", "experts", F::kZero, HasExperts},
      {"num_experts_per_tok", "experts", F::kZero, HasExperts},
      {"decoder_sparse_step", "Qwen-MoE's sparse layers", F::kOne, HasSparseStep},
      {"mlp_only_layers", "Qwen-MoE's dense layers", F::kZero, HasSparseStep},
      {"mlp_layer_types", "MiniCPM5-MoE's sparse layers", F::kZero, HasMlpLayerTypes},
      {"shared_expert_intermediate_size", "Qwen2-MoE's shared expert"},
      {"n_shared_experts", "shared experts", F::kZero, HasSharedExperts},
      {"first_k_dense_replace", "DeepSeek's dense first layers", F::kZero, HasSharedExperts},
      // ---- scales around the layers
      {"final_logit_softcapping", "Gemma 2's final logit soft-capping", F::kZero,
       ReadsAttentionScales},
      {"logits_scaling", "Granite's logit scale", F::kOne},
      {"logit_scale", "Cohere's logit scale", F::kOne},
      {"embedding_multiplier", "Granite's embedding scale", F::kOne},
      {"residual_multiplier", "Granite's residual scale", F::kOne},
      {"mup_width_multiplier", "muP width scaling", F::kOne},
      {"scale_emb", "MiniCPM's embedding scale"},
      {"dim_model_base", "MiniCPM's logit scale"},
      {"scale_depth", "MiniCPM's residual scale"},
      // ---- weights
      {"quantization_config", "quantized weights (AWQ, GPTQ, FP8, ...)"},
  };
  return *fields;
}

bool IsOff(const Json& v, UnimplementedField::Off off) {
  if (v.is_null()) return true;
  if (v.is_boolean()) return !v.get<bool>();
  if (v.is_number()) {
    return v.get<double>() == 0.0 || (off == UnimplementedField::kOne && v.get<double>() == 1.0);
  }
  if (v.is_array() && off == UnimplementedField::kAllFullAttention) {
    return std::all_of(v.begin(), v.end(), [](const Json& t) { return t == "full_attention"; });
  }
  if (v.is_array() || v.is_object()) return v.empty();
  return false;
}

absl::Status RefuseUnimplemented(const Reader& r, const DecoderConfigClass& cls) {
  for (const UnimplementedField& f : UnimplementedFields()) {
    if (f.read_by != nullptr && f.read_by(cls)) continue;
    const Json* v = r.Find(r.j(), f.key);
    if (v == nullptr || IsOff(*v, f.off)) continue;
    // A quantization names its method (gpt-oss's "mxfp4" follows a long modules_to_not_convert).
    const Json* method = v->is_object() ? r.Find(*v, "quant_method") : nullptr;
    if (method != nullptr && method->is_string()) {
      return r.Unsupported(absl::StrCat(
          "\"", f.key, "\" with quant_method \"", method->get<std::string>(), "\" (", f.what,
          ") is not implemented by dtensor's ", cls.model_type,
          "; refusing to read quantized weights as plain ones"));
    }
    return r.Unsupported(absl::StrCat("\"", f.key, "\": ", v->dump().substr(0, 80), " (", f.what,
                                      ") is not implemented by dtensor's ", cls.model_type,
                                      "; refusing to ignore it"));
  }
  return absl::OkStatus();
}

// Note [Which model a config describes]
// transformers picks a config's class by "model_type" and its model class from that (AutoModel),
// while "architectures" names the model class that wrote the checkpoint (what vLLM builds). A
// config missing one is read by the other; one that has both must agree, or the file contradicts
// itself: a Gemma checkpoint whose config says "llama" (or lost its model_type, which defaulted to
// llama here once) ran as Llama with wrong tokens and no warning. Every entry of architectures
// must be the class's own model class; a config with neither field says nothing about its model
// and is refused.
absl::StatusOr<const DecoderConfigClass*> WhichClass(const Reader& r) {
  DT_ASSIGN_OR_RETURN(std::optional<std::string> model_type, r.String("model_type"));
  std::vector<std::string> architectures;
  if (const Json* a = r.Find(r.j(), "architectures")) {
    if (!a->is_array() || a->empty() ||
        !std::all_of(a->begin(), a->end(), [](const Json& e) { return e.is_string(); })) {
      return r.Error(absl::StrCat("\"architectures\" must be a list of model class names, got ",
                                  a->dump().substr(0, 80)));
    }
    for (const Json& e : *a) architectures.push_back(e.get<std::string>());
  }
  auto listed = [&] {
    std::string s;
    for (const std::string& a : architectures) {
      absl::StrAppend(&s, s.empty() ? "" : ", ", "\"", a, "\"");
    }
    return absl::StrCat("[", s, "]");
  };
  if (!model_type && architectures.empty()) {
    return r.Error(absl::StrCat(
        "has neither \"model_type\" nor \"architectures\", so which model it describes is "
        "unknown (supported: ", DecoderModelTypes(), ")"));
  }
  if (!model_type) {
    for (const DecoderConfigClass& c : DecoderConfigClasses()) {
      if (c.architecture == architectures[0]) {
        model_type = c.model_type;
        break;
      }
    }
    if (!model_type) {
      std::string supported;
      for (const DecoderConfigClass& c : DecoderConfigClasses()) {
        absl::StrAppend(&supported, supported.empty() ? "" : ", ", c.architecture);
      }
      return r.Error(absl::StrCat("has no \"model_type\", and \"architectures\" ", listed(),
                                  " is not a model dtensor runs (supported: ", supported, ")"));
    }
  }
  absl::StatusOr<const DecoderConfigClass*> found = FindDecoderConfigClass(*model_type);
  if (!found.ok()) return r.Error(found.status().message());
  for (const std::string& a : architectures) {
    if (a == (*found)->architecture) continue;
    std::string whose;
    for (const DecoderConfigClass& c : DecoderConfigClasses()) {
      if (c.architecture == a) whose = absl::StrCat(", which is model_type \"", c.model_type, "\"'s");
    }
    return r.Error(absl::StrCat("\"model_type\" \"", *model_type, "\" and \"architectures\" ",
                                listed(), " disagree: a ", *model_type, " checkpoint is ",
                                (*found)->architecture, ", not ", a, whose,
                                "; refusing to guess which model the weights are"));
  }
  return *found;
}

// hidden_act as the class reads it (DecoderConfigClass::activation_key): either key alone names
// the activation where the class reads both, and both given must agree.
absl::Status ParseHiddenAct(const Reader& r, const DecoderConfigClass& cls, DecoderConfig* c) {
  DT_ASSIGN_OR_RETURN(std::optional<std::string> act, r.String("hidden_act"));
  if (cls.activation_key == ActivationKey::kHiddenAct) {
    c->hidden_act = act.value_or(cls.default_hidden_act);
    return absl::OkStatus();
  }
  DT_ASSIGN_OR_RETURN(std::optional<std::string> activation, r.String("hidden_activation"));
  const bool gemma = cls.activation_key == ActivationKey::kHiddenActGemma;
  if (gemma && act == "gelu") act = "gelu_pytorch_tanh";  // GemmaConfig's reading
  const std::optional<std::string>& primary = gemma ? act : activation;
  const std::optional<std::string>& other = gemma ? activation : act;
  c->hidden_act = primary.value_or(other.value_or(cls.default_hidden_act));
  if (!act || !activation || *act == *activation) return absl::OkStatus();
  return r.Unsupported(absl::StrCat("\"hidden_activation\" \"", *activation,
                                    "\" and \"hidden_act\" \"", *act, "\" (as ",
                                    cls.model_type,
                                    " reads it) disagree; refusing to guess the activation"));
}

// SlidingWindowFields::kLayerTypes: a window on the layers layer_types calls sliding_attention.
absl::Status ParseLayerWindows(const Reader& r, const DecoderConfigClass& cls, DecoderConfig* c) {
  const Json& j = r.j();
  int64_t window = cls.default_sliding_window;
  if (auto it = j.find("sliding_window"); it != j.end()) {
    window = 0;
    if (!it->is_null()) {
      DT_ASSIGN_OR_RETURN(window, r.PositiveInt(j, "sliding_window", std::nullopt));
    }
  }
  c->layer_windows.assign(c->num_hidden_layers, 0);
  const Json* types = r.Find(j, "layer_types");
  if (types != nullptr &&
      (!types->is_array() || static_cast<int64_t>(types->size()) != c->num_hidden_layers)) {
    return r.Error(absl::StrCat("\"layer_types\" must list ", c->num_hidden_layers,
                                " layer types, got ", types->dump().substr(0, 80)));
  }
  int64_t pattern = cls.default_sliding_pattern;
  if (cls.sliding_pattern_field) {
    DT_ASSIGN_OR_RETURN(pattern, r.PositiveInt(j, "sliding_window_pattern", pattern));
  }
  for (int64_t i = 0; i < c->num_hidden_layers; ++i) {
    bool sliding = (i + 1) % pattern != 0;
    if (types != nullptr) {
      const Json& t = (*types)[i];
      sliding = t == "sliding_attention";
      if (!sliding && t != "full_attention") {
        return r.Unsupported(absl::StrCat("layer_types[", i, "] ", t.dump(),
                                          " is not supported (full_attention, sliding_attention)"));
      }
    }
    if (sliding) c->layer_windows[i] = window;
  }
  return absl::OkStatus();
}

// The sliding layers' RoPE base (DecoderConfigClass::local_rope_fields), before ParseRope: v5's
// rope_parameters per layer type leaves its full_attention entry in place of the whole, which
// ParseRope then reads as every other class's.
absl::Status ParseLocalRope(const Reader& r, const DecoderConfigClass& cls, Json* j,
                            DecoderConfig* c) {
  if (!cls.local_rope_fields) return absl::OkStatus();
  DT_ASSIGN_OR_RETURN(c->local_rope_theta,
                      r.PositiveNumber(*j, "rope_local_base_freq", cls.default_local_rope_theta));
  auto params = j->find("rope_parameters");
  if (params == j->end() || !params->is_object() ||
      (!params->contains("full_attention") && !params->contains("sliding_attention"))) {
    return absl::OkStatus();
  }
  for (auto it = params->begin(); it != params->end(); ++it) {
    if (it.key() != "full_attention" && it.key() != "sliding_attention") {
      return r.Error(absl::StrCat("\"rope_parameters\" per layer type has a key \"", it.key(),
                                  "\" (full_attention, sliding_attention)"));
    }
  }
  if (const Json* local = r.Find(*params, "sliding_attention")) {
    for (auto it = local->begin(); it != local->end(); ++it) {
      const bool plain = (it.key() == "rope_type" && *it == "default") || it.key() == "rope_theta" ||
                         it->is_null();
      if (!plain) {
        return r.Unsupported(absl::StrCat("\"rope_parameters.sliding_attention.", it.key(), "\" ",
                                          it->dump().substr(0, 40),
                                          ": the sliding layers' RoPE is read as the default type "
                                          "with its rope_theta only"));
      }
    }
    if (r.Find(*local, "rope_theta") != nullptr) {
      DT_ASSIGN_OR_RETURN(const double theta,
                          r.PositiveNumber(*local, "rope_theta", c->local_rope_theta));
      if (r.Find(*j, "rope_local_base_freq") != nullptr && theta != c->local_rope_theta) {
        return r.Error(absl::StrCat("\"rope_local_base_freq\" ", c->local_rope_theta,
                                    " and \"rope_parameters.sliding_attention.rope_theta\" ",
                                    theta, " disagree; keep one"));
      }
      c->local_rope_theta = theta;
    }
  }
  const Json full = params->value("full_attention", Json(nullptr));
  (*j)["rope_parameters"] = full;
  return absl::OkStatus();
}

// query_pre_attn_scalar and the soft-caps (DecoderConfigClass::attention_scale_fields).
absl::Status ParseAttentionScales(const Reader& r, const DecoderConfigClass& cls,
                                  DecoderConfig* c) {
  if (!cls.attention_scale_fields) return absl::OkStatus();
  const Json& j = r.j();
  auto number = [&](const char* key, double fallback) -> absl::StatusOr<double> {
    auto it = j.find(key);
    if (it == j.end()) return fallback;
    if (it->is_null()) return 0.0;
    return r.PositiveNumber(j, key, fallback);
  };
  DT_ASSIGN_OR_RETURN(c->query_pre_attn_scalar,
                      number("query_pre_attn_scalar", cls.default_query_pre_attn_scalar));
  DT_ASSIGN_OR_RETURN(c->attn_logit_softcapping,
                      number("attn_logit_softcapping", cls.default_attn_logit_softcapping));
  DT_ASSIGN_OR_RETURN(c->final_logit_softcapping,
                      number("final_logit_softcapping", cls.default_final_logit_softcapping));
  return absl::OkStatus();
}

// Note [Sliding windows] (hf_config.h), read as the config class does.
absl::Status ParseSlidingWindow(const Reader& r, const DecoderConfigClass& cls, DecoderConfig* c) {
  const Json& j = r.j();
  auto window = [&](int64_t fallback) -> absl::StatusOr<int64_t> {
    auto it = j.find("sliding_window");
    if (it == j.end()) return fallback;
    if (it->is_null()) return int64_t{0};
    return r.PositiveInt(j, "sliding_window", std::nullopt);
  };
  switch (cls.sliding_window) {
    case SlidingWindowFields::kNone:
      return absl::OkStatus();
    case SlidingWindowFields::kAll: {
      DT_ASSIGN_OR_RETURN(c->sliding_window, window(cls.default_sliding_window));
      return absl::OkStatus();
    }
    case SlidingWindowFields::kLayerTypes:
      return ParseLayerWindows(r, cls, c);
    case SlidingWindowFields::kFromLayer:
      break;
  }
  DT_ASSIGN_OR_RETURN(const bool use, r.Bool("use_sliding_window", false));
  DT_ASSIGN_OR_RETURN(const int64_t w, window(4096));
  DT_ASSIGN_OR_RETURN(int64_t from, r.NonNegativeInt("max_window_layers", 28));
  if (const Json* types = r.Find(j, "layer_types")) {
    // transformers' v5 spelling: one entry per layer; only a window from some layer on is read.
    if (!types->is_array() || static_cast<int64_t>(types->size()) != c->num_hidden_layers) {
      return r.Error(absl::StrCat("\"layer_types\" must list ", c->num_hidden_layers,
                                  " layer types, got ", types->dump().substr(0, 80)));
    }
    from = c->num_hidden_layers;
    for (int64_t i = 0; i < c->num_hidden_layers; ++i) {
      const Json& t = (*types)[i];
      const bool sliding = t == "sliding_attention";
      if (!sliding && t != "full_attention") {
        return r.Unsupported(absl::StrCat("layer_types[", i, "] ", t.dump(),
                                          " is not supported (full_attention, sliding_attention)"));
      }
      if (sliding && from == c->num_hidden_layers) from = i;
      if (!sliding && from < i) {
        return r.Unsupported(absl::StrCat("\"layer_types\" alternates full and sliding attention (",
                                          "layer ", i, " is full after sliding layer ", from,
                                          "); only sliding layers from one layer on are read"));
      }
    }
  }
  // Without use_sliding_window, transformers' Qwen gives "sliding_attention" layers no window.
  if (use && w > 0 && from < c->num_hidden_layers) {
    c->sliding_window = w;
    c->sliding_from = from;
  }
  return absl::OkStatus();
}

// Latent attention's fields, read as DeepseekV2Config does: head_dim becomes qk_rope_head_dim (the
// RoPE tables' size).
absl::Status ParseLatentAttention(const Reader& r, const DecoderConfigClass& cls,
                                  DecoderConfig* c) {
  if (!cls.latent_attention_fields) return absl::OkStatus();
  const Json& j = r.j();
  auto q_lora = j.find("q_lora_rank");
  if (q_lora == j.end()) {
    c->q_lora_rank = 1536;  // DeepseekV2Config's default
  } else if (!q_lora->is_null()) {
    DT_ASSIGN_OR_RETURN(c->q_lora_rank, r.PositiveInt(j, "q_lora_rank", std::nullopt));
  }
  DT_ASSIGN_OR_RETURN(c->kv_lora_rank, r.PositiveInt(j, "kv_lora_rank", int64_t{512}));
  DT_ASSIGN_OR_RETURN(c->qk_nope_head_dim, r.PositiveInt(j, "qk_nope_head_dim", int64_t{128}));
  DT_ASSIGN_OR_RETURN(c->qk_rope_head_dim, r.PositiveInt(j, "qk_rope_head_dim", int64_t{64}));
  DT_ASSIGN_OR_RETURN(c->v_head_dim, r.PositiveInt(j, "v_head_dim", int64_t{128}));
  if (c->qk_rope_head_dim % 2 != 0) {
    return r.Error(absl::StrCat("qk_rope_head_dim ", c->qk_rope_head_dim,
                                " must be even (rotary embeddings)"));
  }
  if (c->num_key_value_heads != c->num_attention_heads) {
    return r.Unsupported(absl::StrCat(
        "num_key_value_heads ", c->num_key_value_heads, " must equal num_attention_heads ",
        c->num_attention_heads, " for latent attention (kv_b_proj gives every head its keys)"));
  }
  c->head_dim = c->qk_rope_head_dim;
  return absl::OkStatus();
}

// The experts (ExpertFields) and their router's weighing (RouterFields), read as the config class
// does. The sparse layers' fields that a class does not read keep their defaults, which
// DecoderConfig::IsMoeLayer reads as "every layer".
absl::Status ParseExperts(const Reader& r, const DecoderConfigClass& cls, DecoderConfig* c) {
  if (cls.experts == ExpertFields::kNone) return absl::OkStatus();
  const Json& j = r.j();
  switch (cls.experts) {
    case ExpertFields::kLocalExperts: {
      DT_ASSIGN_OR_RETURN(c->num_experts, r.PositiveInt(j, "num_local_experts", int64_t{8}));
      DT_ASSIGN_OR_RETURN(c->num_experts_per_tok,
                          r.PositiveInt(j, "num_experts_per_tok", int64_t{2}));
      c->moe_intermediate_size = c->intermediate_size;
      break;
    }
    case ExpertFields::kSwigluLimit: {
      DT_ASSIGN_OR_RETURN(c->num_experts, r.PositiveInt(j, "num_local_experts", int64_t{128}));
      DT_ASSIGN_OR_RETURN(c->num_experts_per_tok,
                          r.PositiveInt(j, "num_experts_per_tok", int64_t{4}));
      c->moe_intermediate_size = c->intermediate_size;
      DT_ASSIGN_OR_RETURN(c->swiglu_limit, r.PositiveNumber(j, "swiglu_limit", 7.0));
      DT_ASSIGN_OR_RETURN(c->swiglu_alpha, r.PositiveNumber(j, "swiglu_alpha", 1.702));
      break;
    }
    case ExpertFields::kSparseStep: {
      // v5 writes num_local_experts (its attribute map); v4 num_experts.
      const char* key = r.Find(j, "num_experts") != nullptr ? "num_experts" : "num_local_experts";
      DT_ASSIGN_OR_RETURN(c->num_experts, r.PositiveInt(j, key, int64_t{128}));
      DT_ASSIGN_OR_RETURN(c->num_experts_per_tok,
                          r.PositiveInt(j, "num_experts_per_tok", int64_t{8}));
      DT_ASSIGN_OR_RETURN(c->moe_intermediate_size,
                          r.PositiveInt(j, "moe_intermediate_size", int64_t{768}));
      DT_ASSIGN_OR_RETURN(c->decoder_sparse_step,
                          r.PositiveInt(j, "decoder_sparse_step", int64_t{1}));
      if (const Json* m = r.Find(j, "mlp_only_layers")) {
        if (!m->is_array()) {
          return r.Error(absl::StrCat("\"mlp_only_layers\" must be a list of layer indices, got ",
                                      m->dump().substr(0, 80)));
        }
        for (const Json& i : *m) {
          if (!i.is_number_integer() || i.get<int64_t>() < 0 ||
              i.get<int64_t>() >= c->num_hidden_layers) {
            return r.Error(absl::StrCat("\"mlp_only_layers\" entry ", i.dump(),
                                        " is not a layer index in [0, ", c->num_hidden_layers, ")"));
          }
          c->mlp_only_layers.push_back(i.get<int64_t>());
        }
      }
      break;
    }
    case ExpertFields::kFirstKDense: {
      DT_ASSIGN_OR_RETURN(c->num_experts, r.PositiveInt(j, "n_routed_experts", int64_t{64}));
      DT_ASSIGN_OR_RETURN(c->num_experts_per_tok,
                          r.PositiveInt(j, "num_experts_per_tok", std::nullopt));
      DT_ASSIGN_OR_RETURN(c->moe_intermediate_size,
                          r.PositiveInt(j, "moe_intermediate_size", int64_t{1407}));
      DT_ASSIGN_OR_RETURN(c->first_k_dense_replace,
                          r.NonNegativeInt("first_k_dense_replace", 0));
      DT_ASSIGN_OR_RETURN(c->n_shared_experts, r.NonNegativeInt("n_shared_experts", 2));
      break;
    }
    case ExpertFields::kLayerTypes: {
      DT_ASSIGN_OR_RETURN(c->num_experts, r.PositiveInt(j, "n_routed_experts", int64_t{160}));
      DT_ASSIGN_OR_RETURN(c->num_experts_per_tok,
                          r.PositiveInt(j, "num_experts_per_tok", int64_t{16}));
      DT_ASSIGN_OR_RETURN(c->moe_intermediate_size,
                          r.PositiveInt(j, "moe_intermediate_size", int64_t{512}));
      DT_ASSIGN_OR_RETURN(c->n_shared_experts, r.NonNegativeInt("n_shared_experts", 1));
      DT_ASSIGN_OR_RETURN(c->first_k_dense_replace, r.NonNegativeInt("first_k_dense_replace", 1));
      if (const Json* types = r.Find(j, "mlp_layer_types")) {
        if (!types->is_array() || static_cast<int64_t>(types->size()) != c->num_hidden_layers) {
          return r.Error(absl::StrCat("\"mlp_layer_types\" must list ", c->num_hidden_layers,
                                      " layer types, got ", types->dump().substr(0, 80)));
        }
        for (const Json& t : *types) {
          if (t != "dense" && t != "sparse") {
            return r.Error(absl::StrCat("\"mlp_layer_types\" entry ", t.dump().substr(0, 40),
                                        " is not \"dense\" or \"sparse\""));
          }
          c->mlp_sparse.push_back(t == "sparse");
        }
        c->first_k_dense_replace = 0;  // the list decides
      }
      DT_ASSIGN_OR_RETURN(const bool gated, r.Bool("use_gated_attention", true));
      if (!gated) {
        return r.Unsupported(
            "\"use_gated_attention\": false is not a MiniCPM5-MoE checkpoint (its attention is "
            "always gated; transformers refuses it too)");
      }
      break;
    }
    case ExpertFields::kNone:
      break;
  }
  if (c->num_experts < 2 || c->num_experts_per_tok > c->num_experts) {
    return r.Error(absl::StrCat("the experts must number at least 2 and at least "
                                "num_experts_per_tok ", c->num_experts_per_tok, ", got ",
                                c->num_experts));
  }
  switch (cls.router) {
    case RouterFields::kNone:
      c->norm_topk_prob = true;
      break;
    case RouterFields::kNormTopkProb: {
      DT_ASSIGN_OR_RETURN(c->norm_topk_prob, r.Bool("norm_topk_prob", false));
      break;
    }
    case RouterFields::kScalingFactor: {
      DT_ASSIGN_OR_RETURN(const bool norm, r.Bool("norm_topk_prob", false));
      if (norm) {
        return r.Unsupported(absl::StrCat(
            "\"norm_topk_prob\": true is ambiguous for ", cls.model_type,
            " (transformers' router ignores it, DeepSeek's own code renormalises the top-k "
            "weights); refusing to guess"));
      }
      DT_ASSIGN_OR_RETURN(c->routed_scaling_factor,
                          r.PositiveNumber(j, "routed_scaling_factor", 1.0));
      DT_ASSIGN_OR_RETURN(std::optional<std::string> method, r.String("topk_method"));
      if (method && *method != "greedy") {
        return r.Unsupported(absl::StrCat("\"topk_method\": \"", *method,
                                          "\" is not implemented (greedy only)"));
      }
      break;  // n_group / topk_group only matter to group_limited_greedy (transformers')
    }
    case RouterFields::kGroups: {
      DT_ASSIGN_OR_RETURN(c->norm_topk_prob, r.Bool("norm_topk_prob", true));
      DT_ASSIGN_OR_RETURN(c->routed_scaling_factor,
                          r.PositiveNumber(j, "routed_scaling_factor", 3.66));
      DT_ASSIGN_OR_RETURN(c->n_group, r.PositiveInt(j, "n_group", int64_t{1}));
      DT_ASSIGN_OR_RETURN(c->topk_group, r.PositiveInt(j, "topk_group", int64_t{1}));
      // The router's own rule (nn::SigmoidGroupsFit in nn/moe.h), in the config's words; the
      // reader and the router refuse the same configs (DecoderFamilies.GroupsAsTheRouterSays).
      const int64_t experts = c->num_experts, groups = c->n_group, best = c->topk_group;
      if (!(experts % groups == 0 && experts / groups >= 2 && best <= groups &&
            c->num_experts_per_tok <= best * (experts / groups))) {
        return r.Error(absl::StrCat(
            "n_group ", c->n_group, " and topk_group ", c->topk_group, " do not fit ",
            c->num_experts, " experts and num_experts_per_tok ", c->num_experts_per_tok,
            ": the groups must divide the experts, hold 2 or more each (a group's score is its "
            "two best), and the topk_group best groups at least num_experts_per_tok experts"));
      }
      break;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DecoderConfig> ParseDecoderConfig(absl::string_view json, absl::string_view what) {
  Json j = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  Reader r(j, what);
  DT_RETURN_IF_ERROR(r.CheckObject(json));
  DecoderConfig c;
  try {
    DT_ASSIGN_OR_RETURN(const DecoderConfigClass* found, WhichClass(r));
    const DecoderConfigClass& cls = *found;
    c.model_type = cls.model_type;
    DT_RETURN_IF_ERROR(RefuseUnimplemented(r, cls));
    DT_ASSIGN_OR_RETURN(c.vocab_size, r.PositiveInt(j, "vocab_size", std::nullopt));
    DT_ASSIGN_OR_RETURN(c.hidden_size, r.PositiveInt(j, "hidden_size", std::nullopt));
    DT_ASSIGN_OR_RETURN(c.intermediate_size, r.PositiveInt(j, "intermediate_size", std::nullopt));
    DT_ASSIGN_OR_RETURN(c.num_hidden_layers, r.PositiveInt(j, "num_hidden_layers", std::nullopt));
    DT_ASSIGN_OR_RETURN(c.num_attention_heads,
                        r.PositiveInt(j, "num_attention_heads", std::nullopt));
    DT_ASSIGN_OR_RETURN(c.num_key_value_heads,
                        r.PositiveInt(j, "num_key_value_heads", c.num_attention_heads));
    const bool explicit_head_dim = r.Find(j, "head_dim") != nullptr;
    if (!explicit_head_dim && cls.default_head_dim == 0 &&
        c.hidden_size % c.num_attention_heads != 0) {
      return r.Error(absl::StrCat("hidden_size ", c.hidden_size,
                                  " is not a multiple of num_attention_heads ",
                                  c.num_attention_heads, " (and no head_dim is given)"));
    }
    const int64_t default_head_dim = cls.default_head_dim > 0
                                         ? cls.default_head_dim
                                         : c.hidden_size / c.num_attention_heads;
    DT_ASSIGN_OR_RETURN(c.head_dim, r.PositiveInt(j, "head_dim", default_head_dim));
    if (c.head_dim % 2 != 0) {
      return r.Error(absl::StrCat("head_dim ", c.head_dim, " must be even (rotary embeddings)"));
    }
    if (c.num_attention_heads % c.num_key_value_heads != 0) {
      return r.Error(absl::StrCat("num_key_value_heads ", c.num_key_value_heads,
                                  " must divide num_attention_heads ", c.num_attention_heads));
    }
    DT_RETURN_IF_ERROR(ParseLatentAttention(r, cls, &c));
    DT_ASSIGN_OR_RETURN(c.max_position_embeddings,
                        r.PositiveInt(j, "max_position_embeddings",
                                      cls.default_max_position_embeddings));
    DT_ASSIGN_OR_RETURN(c.rms_norm_eps,
                        r.PositiveNumber(j, "rms_norm_eps", cls.default_rms_norm_eps));
    DT_RETURN_IF_ERROR(ParseLocalRope(r, cls, &j, &c));
    DT_RETURN_IF_ERROR(ParseRope(r, cls, &c));
    DT_RETURN_IF_ERROR(ParseHiddenAct(r, cls, &c));
    if (cls.attention_bias_field) {
      DT_ASSIGN_OR_RETURN(c.attention_bias, r.Bool("attention_bias", cls.default_attention_bias));
    }
    if (cls.mlp_bias_field) {
      DT_ASSIGN_OR_RETURN(c.mlp_bias, r.Bool("mlp_bias", false));
    }
    DT_RETURN_IF_ERROR(ParseSlidingWindow(r, cls, &c));
    DT_RETURN_IF_ERROR(ParseAttentionScales(r, cls, &c));
    DT_RETURN_IF_ERROR(ParseExperts(r, cls, &c));
    DT_ASSIGN_OR_RETURN(c.tie_word_embeddings,
                        r.Bool("tie_word_embeddings", cls.default_tie_word_embeddings));
    DT_ASSIGN_OR_RETURN(std::optional<std::string> dtype, r.String("torch_dtype"));
    if (!dtype) {
      DT_ASSIGN_OR_RETURN(dtype, r.String("dtype"));  // transformers v5 spelling
    }
    if (dtype) {
      DT_ASSIGN_OR_RETURN(c.dtype, TorchDType(r, *dtype));
    }
    if (const Json* bos = r.Find(j, "bos_token_id")) {
      if (!bos->is_number_integer()) return r.Error("\"bos_token_id\" must be an integer");
      c.bos_token_id = bos->get<int64_t>();
    }
    if (const Json* eos = r.Find(j, "eos_token_id")) {
      if (eos->is_number_integer()) {
        c.eos_token_ids.push_back(eos->get<int64_t>());
      } else if (eos->is_array()) {
        for (const Json& e : *eos) {
          if (!e.is_number_integer()) return r.Error("\"eos_token_id\" must be integers");
          c.eos_token_ids.push_back(e.get<int64_t>());
        }
      } else {
        return r.Error("\"eos_token_id\" must be an integer or a list of integers");
      }
    }
  } catch (const std::exception& e) {  // nlohmann must not throw past this boundary
    return r.Error(absl::StrCat("malformed (", e.what(), ")"));
  }
  return c;
}

absl::StatusOr<DecoderConfig> LoadDecoderConfig(const std::string& path) {
  std::error_code ec;
  std::string file = path;
  if (std::filesystem::is_regular_file(path, ec) &&
      (GgufFile::HasMagic(path) || absl::EndsWith(path, ".gguf"))) {
    GgufOpenOptions o;
    o.tokenizer_arrays = false;  // the config needs the vocabulary's length only
    DT_ASSIGN_OR_RETURN(std::shared_ptr<const GgufFile> gguf, GgufFile::Open(path, o));
    return DecoderConfigFromGguf(*gguf);
  }
  if (std::filesystem::is_directory(path, ec)) {
    file = (std::filesystem::path(path) / "config.json").string();
  }
  DT_ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(file, int64_t{16} << 20));
  return ParseDecoderConfig(text, file);
}

}  // namespace dt::loaders
