#include "dtensor/loaders/gguf_llama.h"

#include <cmath>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "dtensor/core/ranges.h"
#include "dtensor/core/status.h"

namespace dt::loaders {
namespace {

std::string Where(const GgufFile& f) { return absl::StrCat("gguf '", f.path(), "'"); }

absl::Status Bad(const GgufFile& f, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(Where(f), ": ", msg));
}

// A positive integer metadata value (`fallback` when absent; nullopt fallback: required).
absl::StatusOr<int64_t> Positive(const GgufFile& f, const std::string& key,
                                 std::optional<int64_t> fallback) {
  DT_ASSIGN_OR_RETURN(std::optional<int64_t> v, f.GetOptionalInt(key));
  if (!v) {
    if (!fallback) return Bad(f, absl::StrCat("no metadata '", key, "' (required)"));
    return *fallback;
  }
  if (*v < 1) return Bad(f, absl::StrCat("metadata '", key, "' is ", *v, "; it must be >= 1"));
  return *v;
}

// A float metadata value that must be finite and > 0 (`fallback` when absent): an infinite
// rope.freq_base or a NaN epsilon is accepted by nothing downstream that would say so, and
// changes every token.
absl::StatusOr<double> PositiveNumber(const GgufFile& f, const std::string& key, double fallback) {
  DT_ASSIGN_OR_RETURN(std::optional<double> v, f.GetOptionalDouble(key));
  if (!v) return fallback;
  if (!(*v > 0) || !std::isfinite(*v)) {
    return Bad(f, absl::StrCat("metadata '", key, "' is ", *v, "; it must be a finite number > 0"));
  }
  return *v;
}

// The ARCH.* keys this reader understands for every architecture (the rest are refused, but for
// ClassKeys'); Phi-3 adds its longrope scale.
const std::set<std::string>& KnownKeys() {
  static const std::set<std::string> keys = {
      "block_count", "embedding_length", "feed_forward_length", "attention.head_count",
      "attention.head_count_kv", "attention.key_length", "attention.value_length",
      "rope.dimension_count", "context_length", "attention.layer_norm_rms_epsilon",
      "rope.freq_base", "rope.scaling.type", "rope.scaling.factor",
      "rope.scaling.original_context_length", "vocab_size", "expert_count",
      "expert_used_count", "rope.scaling.attn_factor", "expert_feed_forward_length",
      "expert_weights_norm"};
  return keys;
}

// The keys of the Gemma 2 / 3 fields a class reads (Note [GGUF Gemma]).
bool IsClassKey(const DecoderConfigClass& cls, absl::string_view key) {
  if (cls.sliding_window == SlidingWindowFields::kLayerTypes &&
      (key == "attention.sliding_window" || key == "attention.sliding_window_pattern")) {
    return true;
  }
  if (cls.local_rope_fields && key == "rope.freq_base_swa") return true;
  return cls.attention_scale_fields &&
         (key == "attn_logit_softcapping" || key == "final_logit_softcapping");
}

// Note [GGUF Gemma]: what llama.cpp computes for the Gemma architectures beyond their GGUF
// metadata, read (never copied) from its src/models/gemma*.cpp and the converter's Gemma classes:
// - convert_hf_to_gguf stores every RMSNorm weight as 1 + w (transformers' Gemma RMSNorm scales
//   by 1 + w; llama.cpp's by the weight): GgufTensorName::norm_offset takes the 1 back off on
//   read, for the family's (1 + w) norms.
// - the softmax scale is 1 / sqrt(head_dim), or 1 / sqrt(hidden / heads) for the layer counts
//   of the 27B checkpoints (Gemma 2: 46, Gemma 3: 62); no key carries query_pre_attn_scalar.
// - the sliding layers: ARCH.attention.sliding_window_pattern (an integer n: layer i slides
//   unless i % n == n - 1, transformers' (i + 1) % n != 0; 0: every layer; or a bool per layer), else every
//   other layer (Gemma 2) / all but every sixth (Gemma 3); the window ARCH.attention
//   .sliding_window, else 4096 (Gemma 2) / none at all (Gemma 3). Gemma 3's sliding layers rotate
//   with ARCH.rope.freq_base_swa (10000) unscaled, its full layers with rope.freq_base and the
//   file's scaling; Gemma 2's layers all with rope.freq_base.
// - soft-caps: ARCH.attn_logit_softcapping and final_logit_softcapping, else 50 and 30 (Gemma 2)
//   / none (Gemma 3): the config classes' defaults.
struct GemmaArch {
  const char* arch;
  int64_t sliding_window;   // without ARCH.attention.sliding_window
  int64_t sliding_pattern;  // without ARCH.attention.sliding_window_pattern
  int64_t layers_27b;       // the 27B checkpoint's layer count
};
constexpr GemmaArch kGemmaArchs[] = {{"gemma2", 4096, 2, 46}, {"gemma3", 0, 6, 62}};

bool StoresNormPlusOne(absl::string_view arch) {
  return arch == "gemma" || arch == "gemma2" || arch == "gemma3";
}

// Note [GGUF Gemma]: the attention scale, soft-caps, sliding layers and their RoPE base.
absl::Status ReadGemma(const GgufFile& f, const std::string& arch, DecoderConfig* c) {
  const GemmaArch* g = nullptr;
  for (const GemmaArch& a : kGemmaArchs) {
    if (arch == a.arch) g = &a;
  }
  if (g == nullptr) return absl::OkStatus();
  const DecoderConfigClass& cls = c->config_class();
  const std::string p = arch + ".";
  c->query_pre_attn_scalar = static_cast<double>(
      c->num_hidden_layers == g->layers_27b ? c->hidden_size / c->num_attention_heads
                                            : c->head_dim);
  for (auto [key, out, fallback] :
       {std::tuple{"attn_logit_softcapping", &c->attn_logit_softcapping,
                   cls.default_attn_logit_softcapping},
        std::tuple{"final_logit_softcapping", &c->final_logit_softcapping,
                   cls.default_final_logit_softcapping}}) {
    DT_ASSIGN_OR_RETURN(std::optional<double> v, f.GetOptionalDouble(p + key));
    if (v && *v == 0) {
      *out = 0;  // no cap, as llama.cpp reads 0
    } else {
      DT_ASSIGN_OR_RETURN(*out, PositiveNumber(f, p + key, fallback));
    }
  }
  if (cls.local_rope_fields) {
    DT_ASSIGN_OR_RETURN(c->local_rope_theta,
                        PositiveNumber(f, p + "rope.freq_base_swa", cls.default_local_rope_theta));
  }
  DT_ASSIGN_OR_RETURN(std::optional<int64_t> window, f.GetOptionalInt(p + "attention.sliding_window"));
  if (window && *window < 0) {
    return Bad(f, absl::StrCat("metadata '", p, "attention.sliding_window' is ", *window,
                               "; it must be >= 0"));
  }
  const int64_t w = window.value_or(g->sliding_window);
  c->layer_windows.assign(c->num_hidden_layers, 0);
  if (w == 0) return absl::OkStatus();
  std::vector<bool> sliding(c->num_hidden_layers);
  const GgufValue* pattern = f.Find(p + "attention.sliding_window_pattern");
  const GgufArray* per_layer = pattern != nullptr ? pattern->AsArray() : nullptr;
  if (per_layer != nullptr) {
    if (per_layer->element_type != GgufValue::kBool || per_layer->size != c->num_hidden_layers) {
      return Bad(f, absl::StrCat("metadata '", p, "attention.sliding_window_pattern' must be an ",
                                 "integer or ", c->num_hidden_layers, " bools (one per layer), got ",
                                 pattern->ToString()));
    }
    for (int64_t i = 0; i < c->num_hidden_layers; ++i) {
      sliding[i] = std::get<bool>(per_layer->Element(i).value);
    }
  } else {
    DT_ASSIGN_OR_RETURN(std::optional<int64_t> n,
                        f.GetOptionalInt(p + "attention.sliding_window_pattern"));
    if (n && *n < 0) {
      return Bad(f, absl::StrCat("metadata '", p, "attention.sliding_window_pattern' is ", *n,
                                 "; it must be >= 0"));
    }
    const int64_t every = n.value_or(g->sliding_pattern);  // 0: every layer slides
    for (int64_t i = 0; i < c->num_hidden_layers; ++i) {
      sliding[i] = every == 0 || i % every < every - 1;
    }
  }
  for (int64_t i = 0; i < c->num_hidden_layers; ++i) {
    if (sliding[i]) c->layer_windows[i] = w;
  }
  return absl::OkStatus();
}

// Note [GGUF longrope]: convert_hf_to_gguf writes Phi-3's longrope factors as the tensors
// rope_factors_short.weight / rope_factors_long.weight ([head_dim / 2] f32), the context they were
// trained for as phi3.rope.scaling.original_context_length and transformers' cos/sin scale as
// phi3.rope.scaling.attn_factor; here they become the config's longrope parameters again.
absl::Status ReadLongrope(const GgufFile& f, const std::string& arch, DecoderConfig* c) {
  const bool has_short = f.FindTensor("rope_factors_short.weight") != nullptr;
  const bool has_long = f.FindTensor("rope_factors_long.weight") != nullptr;
  if (!has_short && !has_long) return absl::OkStatus();
  if (has_short != has_long || arch != "phi3") {
    return absl::UnimplementedError(absl::StrCat(
        Where(f), ": rope factor tensors are read for phi3 as a short and a long pair (longrope); "
                  "this ", arch, " file has ",
        has_short ? "rope_factors_short.weight" : "rope_factors_long.weight",
        has_short && has_long ? " and rope_factors_long.weight" : " only"));
  }
  RopeScaling& s = c->rope_scaling;
  s.rope_type = "longrope";
  s.has_factor = false;
  for (auto [name, out] : {std::pair<const char*, std::vector<double>*>{
                               "rope_factors_short.weight", &s.short_factor},
                           {"rope_factors_long.weight", &s.long_factor}}) {
    const GgufTensorInfo& t = *f.FindTensor(name);
    if (t.shape != Shape{c->head_dim / 2}) {
      return Bad(f, absl::StrCat("tensor '", name, "' is ", t.Describe(), "; longrope needs [",
                                 c->head_dim / 2, "] (head_dim / 2)"));
    }
    DT_ASSIGN_OR_RETURN(Tensor v, f.ReadRanges(name, FullRanges(t.shape)));
    for (float x : v.ToVector<float>()) {
      if (!(x > 0) || !std::isfinite(x)) return Bad(f, absl::StrCat("tensor '", name, "' holds ", x));
      out->push_back(x);
    }
  }
  DT_ASSIGN_OR_RETURN(s.original_max_position_embeddings,
                      Positive(f, arch + ".rope.scaling.original_context_length",
                               c->max_position_embeddings));
  if (f.Find(arch + ".rope.scaling.attn_factor") != nullptr) {
    DT_ASSIGN_OR_RETURN(s.attention_factor,
                        PositiveNumber(f, arch + ".rope.scaling.attn_factor", 1.0));
  }
  return absl::OkStatus();
}

// Note [GGUF experts]: convert_hf_to_gguf stacks each sparse layer's experts into
// blk.N.ffn_{gate,up,down}_exps ([E, I, H], [E, I, H], [E, H, I]) with the router as
// blk.N.ffn_gate_inp [E, H], and writes ARCH.expert_count / expert_used_count (Mixtral as
// architecture llama, Qwen3-MoE as qwen3moe with expert_feed_forward_length, the experts' size).
// llama.cpp renormalises Qwen3-MoE's top-k weights (transformers' GGUF reader sets
// norm_topk_prob likewise) unless ARCH.expert_weights_norm says otherwise. Its qwen3moe has a
// sparse block in every layer, as transformers' reader assumes: a layer without ffn_gate_inp is
// refused rather than read as a dense one nobody else would read.
absl::Status ReadExperts(const GgufFile& f, const std::string& p, DecoderConfig* c) {
  const DecoderConfigClass& cls = c->config_class();
  if (cls.experts == ExpertFields::kNone) return absl::OkStatus();
  DT_ASSIGN_OR_RETURN(c->num_experts, Positive(f, p + "expert_count", std::nullopt));
  DT_ASSIGN_OR_RETURN(c->num_experts_per_tok, Positive(f, p + "expert_used_count", std::nullopt));
  DT_ASSIGN_OR_RETURN(c->moe_intermediate_size,
                      Positive(f, p + "expert_feed_forward_length", c->intermediate_size));
  if (c->num_experts < 2 || c->num_experts_per_tok > c->num_experts) {
    return Bad(f, absl::StrCat(p, "expert_count ", c->num_experts, " must be >= 2 and >= ",
                               p, "expert_used_count ", c->num_experts_per_tok));
  }
  c->norm_topk_prob = true;
  if (cls.router == RouterFields::kNormTopkProb) {
    if (const GgufValue* v = f.Find(p + "expert_weights_norm")) {
      const bool* b = std::get_if<bool>(&v->value);
      if (b == nullptr) {
        return Bad(f, absl::StrCat("metadata '", p, "expert_weights_norm' must be a bool, got ",
                                   v->ToString()));
      }
      c->norm_topk_prob = *b;
    }
  }
  for (int64_t i = 0; i < c->num_hidden_layers; ++i) {
    if (f.FindTensor(absl::StrCat("blk.", i, ".ffn_gate_inp.weight")) == nullptr) {
      return absl::UnimplementedError(absl::StrCat(
          Where(f), ": layer ", i, " has no router (blk.", i, ".ffn_gate_inp.weight); ",
          cls.model_type, " from GGUF has a sparse block in every layer, as llama.cpp's"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> GgufConfigTensors(const GgufFile& f) {
  std::vector<std::string> names;
  for (const char* name : {"rope_factors_short.weight", "rope_factors_long.weight"}) {
    if (f.FindTensor(name) != nullptr) names.push_back(name);  // ReadLongrope's
  }
  return names;
}

absl::StatusOr<DecoderConfig> DecoderConfigFromGguf(const GgufFile& f) {
  DT_ASSIGN_OR_RETURN(std::optional<std::string> arch, f.GetOptionalString("general.architecture"));
  if (!arch) return Bad(f, "no metadata 'general.architecture'");
  // llama.cpp writes Mixtral as llama with experts (Note [GGUF experts]).
  DT_ASSIGN_OR_RETURN(std::optional<int64_t> expert_count,
                      f.GetOptionalInt(*arch + ".expert_count"));
  const bool experts = expert_count.value_or(0) != 0;
  absl::StatusOr<const DecoderConfigClass*> found = FindGgufConfigClass(*arch, experts);
  if (!found.ok()) {
    return absl::UnimplementedError(absl::StrCat(Where(f), ": ", found.status().message()));
  }
  const DecoderConfigClass& cls = **found;
  const std::string p = *arch + ".";  // the metadata prefix: "qwen3."
  for (const auto& [key, value] : f.metadata()) {
    if (!absl::StartsWith(key, p)) continue;
    if (!KnownKeys().count(key.substr(p.size())) && !IsClassKey(cls, key.substr(p.size()))) {
      return absl::UnimplementedError(absl::StrCat(Where(f), ": metadata '", key, "' (",
                                                   value.ToString(),
                                                   ") is not supported by dtensor's ", *arch));
    }
  }
  DecoderConfig c;
  c.model_type = cls.model_type;
  DT_ASSIGN_OR_RETURN(c.num_hidden_layers, Positive(f, p + "block_count", std::nullopt));
  DT_ASSIGN_OR_RETURN(c.hidden_size, Positive(f, p + "embedding_length", std::nullopt));
  DT_ASSIGN_OR_RETURN(c.intermediate_size, Positive(f, p + "feed_forward_length", std::nullopt));
  DT_ASSIGN_OR_RETURN(c.num_attention_heads, Positive(f, p + "attention.head_count", std::nullopt));
  DT_ASSIGN_OR_RETURN(c.num_key_value_heads,
                      Positive(f, p + "attention.head_count_kv", c.num_attention_heads));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return Bad(f, absl::StrCat(p, "attention.head_count_kv ", c.num_key_value_heads,
                               " must divide ", p, "attention.head_count ", c.num_attention_heads));
  }
  std::optional<int64_t> default_hd;
  if (c.hidden_size % c.num_attention_heads == 0) default_hd = c.hidden_size / c.num_attention_heads;
  if (cls.default_head_dim > 0) default_hd = cls.default_head_dim;
  if (!default_hd && f.Find(p + "attention.key_length") == nullptr) {
    return Bad(f, absl::StrCat(p, "embedding_length ", c.hidden_size, " is not a multiple of ", p,
                               "attention.head_count ", c.num_attention_heads, ", and there is no ",
                               p, "attention.key_length to give the head dim"));
  }
  DT_ASSIGN_OR_RETURN(c.head_dim, Positive(f, p + "attention.key_length", default_hd));
  DT_ASSIGN_OR_RETURN(int64_t value_length, Positive(f, p + "attention.value_length", c.head_dim));
  if (value_length != c.head_dim) {
    return absl::UnimplementedError(absl::StrCat(
        Where(f), ": ", p, "attention.value_length ", value_length,
        " differs from key_length ", c.head_dim, " (not supported)"));
  }
  if (c.head_dim % 2 != 0) return Bad(f, absl::StrCat("head dim ", c.head_dim, " must be even"));
  DT_ASSIGN_OR_RETURN(int64_t rope_dims, Positive(f, p + "rope.dimension_count", c.head_dim));
  if (rope_dims != c.head_dim) {
    return absl::UnimplementedError(absl::StrCat(
        Where(f), ": ", p, "rope.dimension_count ", rope_dims, " is not the head dim ", c.head_dim,
        " (partial rotary embeddings are not supported)"));
  }
  DT_ASSIGN_OR_RETURN(c.max_position_embeddings, Positive(f, p + "context_length", 2048));
  DT_ASSIGN_OR_RETURN(c.rms_norm_eps,
                      PositiveNumber(f, p + "attention.layer_norm_rms_epsilon", 1e-5));
  DT_ASSIGN_OR_RETURN(c.rope_theta, PositiveNumber(f, p + "rope.freq_base", 10000.0));
  DT_ASSIGN_OR_RETURN(std::optional<std::string> scaling, f.GetOptionalString(p + "rope.scaling.type"));
  if (scaling && *scaling != "none") {
    if (*scaling != "linear") {
      return absl::UnimplementedError(absl::StrCat(
          Where(f), ": ", p, "rope.scaling.type '", *scaling, "' is not supported (none, linear)"));
    }
    DT_ASSIGN_OR_RETURN(std::optional<double> factor, f.GetOptionalDouble(p + "rope.scaling.factor"));
    if (!factor || !(*factor >= 1) || !std::isfinite(*factor)) {
      return Bad(f, absl::StrCat("linear rope scaling needs a finite ", p,
                                 "rope.scaling.factor >= 1, got ",
                                 factor ? absl::StrCat(*factor) : "none"));
    }
    c.rope_scaling.rope_type = "linear";
    c.rope_scaling.factor = *factor;
  }
  DT_RETURN_IF_ERROR(ReadExperts(f, p, &c));
  std::optional<int64_t> n_tokens;
  if (const GgufValue* tokens = f.Find("tokenizer.ggml.tokens")) {
    if (tokens->AsArray() == nullptr || tokens->AsArray()->element_type != GgufValue::kString) {
      return Bad(f, absl::StrCat("metadata 'tokenizer.ggml.tokens' must be an array of strings, got ",
                                 GgufTypeName(tokens->type)));
    }
    n_tokens = tokens->ArrayLength();  // kept or not (GgufOpenOptions::tokenizer_arrays)
  }
  if (!n_tokens) {
    if (const GgufTensorInfo* e = f.FindTensor("token_embd.weight")) n_tokens = e->shape[0];
  }
  DT_ASSIGN_OR_RETURN(c.vocab_size, Positive(f, p + "vocab_size", n_tokens));
  if (f.FindTensor("rope_freqs.weight") != nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        Where(f), ": tensor rope_freqs.weight (llama 3.1 rope frequency factors) is not supported"));
  }
  DT_RETURN_IF_ERROR(ReadLongrope(f, *arch, &c));
  DT_RETURN_IF_ERROR(ReadGemma(f, *arch, &c));
  c.hidden_act = cls.default_hidden_act;
  c.tie_word_embeddings = f.FindTensor("output.weight") == nullptr;
  // Biases as the class has them (DecoderConfigClass): attention_bias gives q/k/v/o, a qkv_bias
  // class has q/k/v always.
  const bool q_bias = f.FindTensor("blk.0.attn_q.bias") != nullptr ||
                      f.FindTensor("blk.0.attn_qkv.bias") != nullptr;
  const bool o_bias = f.FindTensor("blk.0.attn_output.bias") != nullptr;
  if (q_bias != (cls.qkv_bias || (cls.attention_bias_field && o_bias)) ||
      (o_bias && !cls.attention_bias_field)) {
    return absl::UnimplementedError(absl::StrCat(
        Where(f), ": the attention biases (attn_q.bias ", q_bias ? "present" : "absent",
        ", attn_output.bias ", o_bias ? "present" : "absent", ") are not ", cls.model_type,
        "'s"));
  }
  c.attention_bias = o_bias;
  c.mlp_bias = f.FindTensor("blk.0.ffn_up.bias") != nullptr;
  if (c.mlp_bias && !cls.mlp_bias_field) {
    return absl::UnimplementedError(
        absl::StrCat(Where(f), ": MLP biases are not ", cls.model_type, "'s"));
  }
  c.dtype = DType::kF32;
  DT_ASSIGN_OR_RETURN(std::optional<int64_t> bos, f.GetOptionalInt("tokenizer.ggml.bos_token_id"));
  c.bos_token_id = bos;
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    DT_ASSIGN_OR_RETURN(std::optional<int64_t> id, f.GetOptionalInt(key));
    if (id && std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), *id) == c.eos_token_ids.end()) {
      c.eos_token_ids.push_back(*id);
    }
  }
  return c;
}

absl::StatusOr<DecoderConfig> LlamaConfigFromGguf(const GgufFile& f) {
  DT_ASSIGN_OR_RETURN(std::optional<std::string> arch, f.GetOptionalString("general.architecture"));
  if (arch && *arch != "llama") {
    return absl::UnimplementedError(absl::StrCat(
        Where(f), ": architecture '", *arch,
        "' is not supported by LlamaConfigFromGguf (llama only; DecoderConfigFromGguf reads every "
        "family)"));
  }
  return DecoderConfigFromGguf(f);
}

int64_t GgufRotaryRow(int64_t row, int64_t rows, int64_t heads) {
  const int64_t hd = rows / heads, half = hd / 2;
  const int64_t h = row / hd, j = row % hd;
  const int64_t s = j / half, i = j % half;
  return h * hd + 2 * i + s;
}

absl::StatusOr<std::vector<GgufTensorName>> DecoderGgufTensorNames(const GgufFile& f) {
  DT_ASSIGN_OR_RETURN(DecoderConfig c, DecoderConfigFromGguf(f));
  // llama.cpp permutes Q/K rows for the llama architecture only (Note [GGUF Q/K row order]);
  // the others use its NEOX rotation, which is Hugging Face's layout.
  const std::string& arch = c.config_class().gguf_architecture;
  const bool permuted = arch == "llama";
  static const std::pair<const char*, const char*> kTop[] = {
      {"token_embd", "model.embed_tokens"}, {"output_norm", "model.norm"}, {"output", "lm_head"}};
  static const std::pair<const char*, const char*> kBlock[] = {
      {"attn_norm", "input_layernorm"},     {"ffn_norm", "post_attention_layernorm"},
      {"attn_q", "self_attn.q_proj"},       {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},       {"attn_output", "self_attn.o_proj"},
      {"attn_q_norm", "self_attn.q_norm"},  {"attn_k_norm", "self_attn.k_norm"},
      {"attn_qkv", "self_attn.qkv_proj"},   {"ffn_gate", "mlp.gate_proj"},
      {"ffn_up", "mlp.up_proj"},            {"ffn_down", "mlp.down_proj"},
      {"ffn_gate_inp", "mlp.gate"},         {"post_attention_norm", "post_attention_layernorm"},
      {"post_ffw_norm", "post_feedforward_layernorm"}};
  std::vector<GgufTensorName> out;
  for (const GgufTensorInfo& t : f.tensors()) {
    GgufTensorName n{t.name, t.name, 0};
    const std::vector<std::string> parts = absl::StrSplit(t.name, '.');
    const std::string suffix = parts.back();  // weight, bias
    if (parts.size() == 2) {
      for (const auto& [g, hf] : kTop) {
        if (parts[0] == g) n.hf_name = absl::StrCat(hf, ".", suffix);
      }
    } else if (parts.size() == 4 && parts[0] == "blk") {
      int64_t layer = 0;
      if (absl::SimpleAtoi(parts[1], &layer)) {
        for (const auto& [g, hf] : kBlock) {
          if (parts[2] == g) n.hf_name = absl::StrCat("model.layers.", layer, ".", hf, ".", suffix);
        }
        // A layer whose ffn_up has no ffn_gate beside it holds the fused [gate | up] there
        // (llama.cpp writes Phi-3's gate_up_proj so).
        if (parts[2] == "ffn_up" &&
            f.FindTensor(absl::StrCat("blk.", parts[1], ".ffn_gate.weight")) == nullptr) {
          n.hf_name = absl::StrCat("model.layers.", layer, ".mlp.gate_up_proj.", suffix);
        }
        // A layer that normalizes the attention's output (post_attention_norm: OLMo 2, Gemma 2
        // and 3) has ffn_norm as the MLP's own pre-norm (Note [Layer norms] in
        // nn/models/decoder_family.h).
        if (parts[2] == "ffn_norm" &&
            f.FindTensor(absl::StrCat("blk.", parts[1], ".post_attention_norm.weight")) != nullptr) {
          n.hf_name = absl::StrCat("model.layers.", layer, ".pre_feedforward_layernorm.", suffix);
        }
        // Note [GGUF experts]: the stacks, named as loaders/moe_checkpoint.h reads them.
        for (const char* proj : {"gate", "up", "down"}) {
          if (parts[2] == absl::StrCat("ffn_", proj, "_exps") && suffix == "weight") {
            n.hf_name = absl::StrCat("model.layers.", layer, ".mlp.experts.", proj, "_proj");
          }
        }
        if (permuted && parts[2] == "attn_q") n.permute_heads = c.num_attention_heads;
        if (permuted && parts[2] == "attn_k") n.permute_heads = c.num_key_value_heads;
        if (n.permute_heads > 0 && suffix != "weight") {
          return absl::UnimplementedError(absl::StrCat(Where(f), ": tensor '", t.name,
                                                       "' (a rotary projection's bias) is not supported"));
        }
      }
    }
    if (StoresNormPlusOne(arch) && absl::EndsWith(n.hf_name, "norm.weight")) n.norm_offset = 1;
    if (n.permute_heads > 0 && t.shape[0] % (2 * n.permute_heads) != 0) {
      return Bad(f, absl::StrCat("tensor '", t.name, "' ", t.Describe(), ": ", t.shape[0],
                                 " rows are not ", n.permute_heads, " heads of even size"));
    }
    out.push_back(std::move(n));
  }
  return out;
}

}  // namespace dt::loaders
