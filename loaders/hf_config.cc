#include "dtensor/loaders/hf_config.h"

#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/small_file.h"
#include "nlohmann/json.hpp"
#include "dtensor/ops/local/ops.h"

namespace dt::loaders {
namespace {

using Json = nlohmann::json;

class Reader {
 public:
  Reader(const Json& j, absl::string_view what) : j_(j), what_(what) {}

  absl::Status Error(absl::string_view msg) const {
    return absl::InvalidArgumentError(absl::StrCat("config '", what_, "': ", msg));
  }
  // A valid value this implementation does not support.
  absl::Status Unsupported(absl::string_view msg) const {
    return absl::UnimplementedError(absl::StrCat("config '", what_, "': ", msg));
  }
  const Json* Find(const Json& obj, absl::string_view key) const {
    auto it = obj.find(std::string(key));
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
  }

  // A positive integer; `required` or `fallback`.
  absl::StatusOr<int64_t> PositiveInt(const Json& obj, absl::string_view key,
                                      std::optional<int64_t> fallback) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      return Error(absl::StrCat("missing required field \"", key, "\""));
    }
    if (!v->is_number_integer() || v->get<int64_t>() <= 0) {
      return Error(absl::StrCat("\"", key, "\" must be a positive integer, got ", v->dump()));
    }
    return v->get<int64_t>();
  }
  absl::StatusOr<double> PositiveNumber(const Json& obj, absl::string_view key,
                                        double fallback) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return fallback;
    if (!v->is_number() || !(v->get<double>() > 0) || !std::isfinite(v->get<double>())) {
      return Error(absl::StrCat("\"", key, "\" must be a positive number, got ", v->dump()));
    }
    return v->get<double>();
  }
  absl::StatusOr<bool> Bool(absl::string_view key, bool fallback) const {
    const Json* v = Find(j_, key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) {
      return Error(absl::StrCat("\"", key, "\" must be true or false, got ", v->dump()));
    }
    return v->get<bool>();
  }
  absl::StatusOr<std::optional<std::string>> String(absl::string_view key) const {
    const Json* v = Find(j_, key);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string()) {
      return Error(absl::StrCat("\"", key, "\" must be a string, got ", v->dump()));
    }
    return std::optional<std::string>(v->get<std::string>());
  }

  const Json& j() const { return j_; }

 private:
  const Json& j_;
  std::string what_;
};

absl::StatusOr<DType> TorchDType(const Reader& r, const std::string& name) {
  if (name == "float32" || name == "float") return DType::kF32;
  if (name == "bfloat16") return DType::kBF16;
  if (name == "float16" || name == "half") return DType::kF16;
  return r.Error(absl::StrCat("torch_dtype \"", name,
                              "\" is not supported (float32, bfloat16, float16)"));
}

absl::Status ParseRope(const Reader& r, LlamaConfig* c) {
  const Json& j = r.j();
  // v5: rope_parameters {rope_type, rope_theta, ...}; v4: rope_theta + rope_scaling {...}.
  const Json* params = r.Find(j, "rope_parameters");
  const char* key = "rope_parameters";
  if (params == nullptr) {
    params = r.Find(j, "rope_scaling");
    key = "rope_scaling";
  }
  DT_ASSIGN_OR_RETURN(c->rope_theta, r.PositiveNumber(j, "rope_theta", 10000.0));
  if (params == nullptr) return absl::OkStatus();
  if (!params->is_object()) {
    return r.Error(absl::StrCat("\"", key, "\" must be an object or null, got ", params->dump()));
  }
  DT_ASSIGN_OR_RETURN(c->rope_theta, r.PositiveNumber(*params, "rope_theta", c->rope_theta));
  const Json* type = r.Find(*params, "rope_type");
  if (type == nullptr) type = r.Find(*params, "type");  // legacy spelling
  std::string t = "default";
  if (type != nullptr) {
    if (!type->is_string()) {
      return r.Error(absl::StrCat("\"", key, ".rope_type\" must be a string, got ", type->dump()));
    }
    t = type->get<std::string>();
  }
  RopeScaling& s = c->rope_scaling;
  s.rope_type = t;
  if (t == "default") return absl::OkStatus();
  if (t == "linear") {
    DT_ASSIGN_OR_RETURN(s.factor, r.PositiveNumber(*params, "factor", 1.0));
    return absl::OkStatus();
  }
  if (t == "llama3") {
    for (const char* f : {"factor", "low_freq_factor", "high_freq_factor"}) {
      if (r.Find(*params, f) == nullptr) {
        return r.Error(absl::StrCat("\"", key, "\" of rope_type llama3 needs \"", f, "\""));
      }
    }
    DT_ASSIGN_OR_RETURN(s.factor, r.PositiveNumber(*params, "factor", 1.0));
    DT_ASSIGN_OR_RETURN(s.low_freq_factor, r.PositiveNumber(*params, "low_freq_factor", 1.0));
    DT_ASSIGN_OR_RETURN(s.high_freq_factor, r.PositiveNumber(*params, "high_freq_factor", 4.0));
    DT_ASSIGN_OR_RETURN(s.original_max_position_embeddings,
                        r.PositiveInt(*params, "original_max_position_embeddings",
                                      c->max_position_embeddings));
    if (!(s.low_freq_factor < s.high_freq_factor)) {
      return r.Error(absl::StrCat("llama3 rope: low_freq_factor ", s.low_freq_factor,
                                  " must be below high_freq_factor ", s.high_freq_factor));
    }
    return absl::OkStatus();
  }
  return r.Unsupported(
      absl::StrCat("rope_type \"", t, "\" is not supported (default, linear, llama3)"));
}

}  // namespace

absl::StatusOr<LlamaConfig> ParseLlamaConfig(absl::string_view json, absl::string_view what) {
  Json j = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  Reader r(j, what);
  if (j.is_discarded()) return r.Error("not valid JSON");
  if (!j.is_object()) return r.Error(absl::StrCat("must be a JSON object, got ", j.type_name()));
  LlamaConfig c;
  try {
    DT_ASSIGN_OR_RETURN(std::optional<std::string> model_type, r.String("model_type"));
    if (model_type && *model_type != "llama") {
      return r.Error(absl::StrCat("model_type \"", *model_type, "\" is not \"llama\""));
    }
    DT_ASSIGN_OR_RETURN(c.vocab_size, r.PositiveInt(j, "vocab_size", std::nullopt));
    DT_ASSIGN_OR_RETURN(c.hidden_size, r.PositiveInt(j, "hidden_size", std::nullopt));
    DT_ASSIGN_OR_RETURN(c.intermediate_size, r.PositiveInt(j, "intermediate_size", std::nullopt));
    DT_ASSIGN_OR_RETURN(c.num_hidden_layers, r.PositiveInt(j, "num_hidden_layers", std::nullopt));
    DT_ASSIGN_OR_RETURN(c.num_attention_heads,
                        r.PositiveInt(j, "num_attention_heads", std::nullopt));
    DT_ASSIGN_OR_RETURN(c.num_key_value_heads,
                        r.PositiveInt(j, "num_key_value_heads", c.num_attention_heads));
    const bool explicit_head_dim = r.Find(j, "head_dim") != nullptr;
    if (!explicit_head_dim && c.hidden_size % c.num_attention_heads != 0) {
      return r.Error(absl::StrCat("hidden_size ", c.hidden_size,
                                  " is not a multiple of num_attention_heads ",
                                  c.num_attention_heads, " (and no head_dim is given)"));
    }
    DT_ASSIGN_OR_RETURN(c.head_dim,
                        r.PositiveInt(j, "head_dim", c.hidden_size / c.num_attention_heads));
    if (c.head_dim % 2 != 0) {
      return r.Error(absl::StrCat("head_dim ", c.head_dim, " must be even (rotary embeddings)"));
    }
    if (c.num_attention_heads % c.num_key_value_heads != 0) {
      return r.Error(absl::StrCat("num_key_value_heads ", c.num_key_value_heads,
                                  " must divide num_attention_heads ", c.num_attention_heads));
    }
    DT_ASSIGN_OR_RETURN(c.max_position_embeddings,
                        r.PositiveInt(j, "max_position_embeddings", 2048));
    DT_ASSIGN_OR_RETURN(c.rms_norm_eps, r.PositiveNumber(j, "rms_norm_eps", 1e-6));
    DT_RETURN_IF_ERROR(ParseRope(r, &c));
    DT_ASSIGN_OR_RETURN(std::optional<std::string> act, r.String("hidden_act"));
    if (act && *act != "silu") {
      return r.Unsupported(absl::StrCat("hidden_act \"", *act, "\" is not supported (silu)"));
    }
    DT_ASSIGN_OR_RETURN(c.attention_bias, r.Bool("attention_bias", false));
    DT_ASSIGN_OR_RETURN(c.mlp_bias, r.Bool("mlp_bias", false));
    DT_ASSIGN_OR_RETURN(c.tie_word_embeddings, r.Bool("tie_word_embeddings", false));
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

absl::StatusOr<LlamaConfig> LoadLlamaConfig(const std::string& path) {
  std::error_code ec;
  std::string file = path;
  if (std::filesystem::is_directory(path, ec)) {
    file = (std::filesystem::path(path) / "config.json").string();
  }
  DT_ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(file, int64_t{16} << 20));
  return ParseLlamaConfig(text, file);
}

int64_t LlamaConfig::NumParameters() const {
  const int64_t h = hidden_size, q = num_attention_heads * head_dim,
                kv = num_key_value_heads * head_dim, i = intermediate_size;
  int64_t layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h;
  if (attention_bias) layer += q + 2 * kv + h;
  if (mlp_bias) layer += 2 * i + h;
  return vocab_size * h * (tie_word_embeddings ? 1 : 2) + num_hidden_layers * layer + h;
}

std::string LlamaConfig::Summary() const {
  std::string rope = rope_scaling.rope_type;
  if (rope != "default") absl::StrAppend(&rope, "(x", rope_scaling.factor, ")");
  return absl::StrCat("llama: L=", num_hidden_layers, " H=", hidden_size,
                      " I=", intermediate_size, " heads=", num_attention_heads, "/",
                      num_key_value_heads, " head_dim=", head_dim, " V=", vocab_size,
                      " rope=", rope, " theta=", rope_theta, " ", DTypeName(dtype),
                      tie_word_embeddings ? " tied" : " untied");
}

std::string LlamaConfigToJson(const LlamaConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
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
  if (s.rope_type == "default") {
    j["rope_scaling"] = nullptr;
  } else if (s.rope_type == "linear") {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", s.factor}};
  } else {
    j["rope_scaling"] = {{"rope_type", s.rope_type},
                         {"factor", s.factor},
                         {"low_freq_factor", s.low_freq_factor},
                         {"high_freq_factor", s.high_freq_factor},
                         {"original_max_position_embeddings", s.original_max_position_embeddings}};
  }
  j["hidden_act"] = c.hidden_act;
  j["attention_bias"] = c.attention_bias;
  j["mlp_bias"] = c.mlp_bias;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = c.dtype == DType::kBF16   ? "bfloat16"
                     : c.dtype == DType::kF16 ? "float16"
                                              : "float32";
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  if (c.eos_token_ids.size() > 1) j["eos_token_id"] = c.eos_token_ids;
  return j.dump(2) + "\n";
}

std::vector<float> RopeInverseFrequencies(const LlamaConfig& c) {
  std::vector<float> inv = ops::RopeInverseFrequencies(c.head_dim, c.rope_theta);
  const RopeScaling& s = c.rope_scaling;
  if (s.rope_type == "linear") {
    for (float& f : inv) f = f / static_cast<float>(s.factor);
  } else if (s.rope_type == "llama3") {
    const float factor = static_cast<float>(s.factor);
    const float low = static_cast<float>(s.low_freq_factor);
    const float high = static_cast<float>(s.high_freq_factor);
    const float old_len = static_cast<float>(s.original_max_position_embeddings);
    const double low_wl = static_cast<double>(s.original_max_position_embeddings) / s.low_freq_factor;
    const double high_wl =
        static_cast<double>(s.original_max_position_embeddings) / s.high_freq_factor;
    const float two_pi = static_cast<float>(2 * M_PI);
    for (float& f : inv) {
      const float wavelen = two_pi / f;
      float g = wavelen > low_wl ? f / factor : f;
      const float smooth = (old_len / wavelen - low) / (high - low);
      const float smoothed = (1 - smooth) * g / factor + smooth * g;
      const bool medium = !(wavelen < high_wl) && !(wavelen > low_wl);
      f = medium ? smoothed : g;
    }
  }
  return inv;
}

}  // namespace dt::loaders
