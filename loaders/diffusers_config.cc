#include "dtensor/loaders/diffusers_config.h"

#include <filesystem>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/json_reader.h"
#include "dtensor/loaders/small_file.h"
#include "nlohmann/json.hpp"

namespace dt::loaders {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using internal::Reader;

constexpr int64_t kMaxConfigBytes = 1 << 20;

// Every key of `j` must be in `known` or start with '_' (diffusers' metadata).
absl::Status RefuseUnknownKeys(const Reader& r, const Json& j, const std::set<std::string>& known,
                               absl::string_view owner) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.key().empty() && it.key()[0] == '_') continue;
    if (!known.count(it.key())) {
      return r.Unsupported(absl::StrCat("\"", it.key(), "\" is not a field of ", owner,
                                        " that dtensor implements (known: ",
                                        absl::StrJoin(known, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckClassName(const Reader& r, absl::string_view want) {
  DT_ASSIGN_OR_RETURN(std::optional<std::string> cls, r.String("_class_name"));
  if (cls && *cls != want) {
    return r.Unsupported(absl::StrCat("_class_name \"", *cls, "\" is not ", want,
                                      *cls == "FluxTransformer2DModel"
                                          ? " (FLUX.1 checkpoints have a different layout)"
                                          : ""));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadConfigFile(const fs::path& file) {
  return ReadSmallFile(file.string(), kMaxConfigBytes);
}

}  // namespace

int64_t Flux2Config::mlp_hidden_dim() const {
  return static_cast<int64_t>(static_cast<double>(inner_dim()) * mlp_ratio);
}

int64_t Flux2Config::NumParameters() const {
  const int64_t d = inner_dim(), m = mlp_hidden_dim(), hd = attention_head_dim;
  const int64_t embedder = timestep_guidance_channels * d + d * d;
  int64_t n = embedder * (guidance_embeds ? 2 : 1);
  n += 15 * d * d;                                   // the three modulations: 6D + 6D + 3D rows
  n += d * in_channels + d * joint_attention_dim;    // x_embedder, context_embedder
  const int64_t dbl = 8 * d * d + 4 * hd + 2 * (2 * m * d + d * m);
  const int64_t sgl = (3 * d + 2 * m) * d + d * (d + m) + 2 * hd;
  n += num_layers * dbl + num_single_layers * sgl;
  n += 2 * d * d + patch_size * patch_size * out_channels * d;  // norm_out, proj_out
  return n;
}

std::string Flux2Config::Summary() const {
  return absl::StrCat("flux2: D=", inner_dim(), " heads=", num_attention_heads, "x",
                      attention_head_dim, " double=", num_layers, " single=", num_single_layers,
                      " M=", mlp_hidden_dim(), " ctx=", joint_attention_dim,
                      " guidance=", guidance_embeds ? "yes" : "no");
}

absl::StatusOr<Flux2Config> ParseFlux2Config(absl::string_view json, absl::string_view what) {
  Json j = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  Reader r(j, what);
  DT_RETURN_IF_ERROR(r.CheckObject(json));
  DT_RETURN_IF_ERROR(CheckClassName(r, "Flux2Transformer2DModel"));
  static const std::set<std::string> kKnown = {
      "patch_size",         "in_channels",       "out_channels",
      "num_layers",         "num_single_layers", "attention_head_dim",
      "num_attention_heads", "joint_attention_dim", "timestep_guidance_channels",
      "mlp_ratio",          "axes_dims_rope",    "rope_theta",
      "eps",                "guidance_embeds"};
  DT_RETURN_IF_ERROR(RefuseUnknownKeys(r, j, kKnown, "Flux2Transformer2DModel"));
  Flux2Config c;
  DT_ASSIGN_OR_RETURN(c.patch_size, r.PositiveInt(j, "patch_size", 1));
  DT_ASSIGN_OR_RETURN(c.in_channels, r.PositiveInt(j, "in_channels", 128));
  DT_ASSIGN_OR_RETURN(c.out_channels, r.PositiveInt(j, "out_channels", c.in_channels));
  DT_ASSIGN_OR_RETURN(c.num_layers, r.NonNegativeInt("num_layers", 8));
  DT_ASSIGN_OR_RETURN(c.num_single_layers, r.NonNegativeInt("num_single_layers", 48));
  DT_ASSIGN_OR_RETURN(c.attention_head_dim, r.PositiveInt(j, "attention_head_dim", 128));
  DT_ASSIGN_OR_RETURN(c.num_attention_heads, r.PositiveInt(j, "num_attention_heads", 48));
  DT_ASSIGN_OR_RETURN(c.joint_attention_dim, r.PositiveInt(j, "joint_attention_dim", 15360));
  DT_ASSIGN_OR_RETURN(c.timestep_guidance_channels,
                      r.PositiveInt(j, "timestep_guidance_channels", 256));
  DT_ASSIGN_OR_RETURN(c.mlp_ratio, r.PositiveNumber(j, "mlp_ratio", 3.0));
  DT_ASSIGN_OR_RETURN(c.rope_theta, r.PositiveNumber(j, "rope_theta", 2000.0));
  DT_ASSIGN_OR_RETURN(c.eps, r.PositiveNumber(j, "eps", 1e-6));
  DT_ASSIGN_OR_RETURN(c.guidance_embeds, r.Bool("guidance_embeds", true));
  if (const Json* axes = r.Find(j, "axes_dims_rope")) {
    if (!axes->is_array() || axes->empty()) {
      return r.Error(absl::StrCat("\"axes_dims_rope\" must be a list of even positive integers, got ",
                                  axes->dump().substr(0, 80)));
    }
    c.axes_dims_rope.clear();
    for (const Json& a : *axes) {
      if (!a.is_number_integer() || a.get<int64_t>() <= 0 || a.get<int64_t>() % 2 != 0) {
        return r.Error(absl::StrCat("\"axes_dims_rope\" must hold even positive integers, got ",
                                    a.dump()));
      }
      c.axes_dims_rope.push_back(a.get<int64_t>());
    }
  }
  // Sizes that would allocate absurdly are refused here, before any module is built.
  constexpr int64_t kMaxDim = int64_t{1} << 20;
  for (auto [name, v] : {std::pair<const char*, int64_t>{"in_channels", c.in_channels},
                         {"out_channels", c.out_channels},
                         {"attention_head_dim", c.attention_head_dim},
                         {"num_attention_heads", c.num_attention_heads},
                         {"joint_attention_dim", c.joint_attention_dim},
                         {"timestep_guidance_channels", c.timestep_guidance_channels},
                         {"patch_size", c.patch_size},
                         {"num_layers", c.num_layers},
                         {"num_single_layers", c.num_single_layers}}) {
    if (v > kMaxDim) return r.Error(absl::StrCat("\"", name, "\" ", v, " is implausibly large"));
  }
  if (c.inner_dim() > kMaxDim || !(c.mlp_ratio <= 64)) {
    return r.Error(absl::StrCat("inner dim ", c.inner_dim(), " with mlp_ratio ", c.mlp_ratio,
                                " is implausibly large"));
  }
  const int64_t axes_sum = std::accumulate(c.axes_dims_rope.begin(), c.axes_dims_rope.end(),
                                           int64_t{0});
  if (axes_sum != c.attention_head_dim) {
    return r.Error(absl::StrCat("axes_dims_rope [", absl::StrJoin(c.axes_dims_rope, ", "),
                                "] sums to ", axes_sum, ", not attention_head_dim ",
                                c.attention_head_dim));
  }
  if (c.timestep_guidance_channels % 2 != 0) {
    return r.Error(absl::StrCat("\"timestep_guidance_channels\" ", c.timestep_guidance_channels,
                                " must be even (cos and sin halves)"));
  }
  if (c.mlp_hidden_dim() <= 0) {
    return r.Error(absl::StrCat("mlp_ratio ", c.mlp_ratio, " gives an empty MLP for inner dim ",
                                c.inner_dim()));
  }
  return c;
}

absl::StatusOr<std::string> Flux2TransformerDir(const std::string& dir) {
  std::error_code ec;
  const fs::path d(dir);
  if (fs::exists(d / "config.json", ec)) return d.string();
  if (fs::exists(d / "transformer" / "config.json", ec)) return (d / "transformer").string();
  return absl::NotFoundError(absl::StrCat("'", dir, "' has neither config.json nor ",
                                          "transformer/config.json (a diffusers Flux2 model or "
                                          "pipeline directory)"));
}

absl::StatusOr<Flux2Config> LoadFlux2Config(const std::string& dir) {
  DT_ASSIGN_OR_RETURN(const std::string tdir, Flux2TransformerDir(dir));
  const fs::path file = fs::path(tdir) / "config.json";
  DT_ASSIGN_OR_RETURN(const std::string text, ReadConfigFile(file));
  return ParseFlux2Config(text, file.string());
}

absl::StatusOr<std::string> DiffusersClassName(const std::string& dir) {
  absl::StatusOr<std::string> tdir = Flux2TransformerDir(dir);
  if (!tdir.ok()) return std::string();
  const fs::path file = fs::path(*tdir) / "config.json";
  DT_ASSIGN_OR_RETURN(const std::string text, ReadConfigFile(file));
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Reader(j, file.string()).Error("must be a JSON object");
  auto it = j.find("_class_name");
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string Flux2ConfigToJson(const Flux2Config& c) {
  nlohmann::ordered_json j;
  j["_class_name"] = "Flux2Transformer2DModel";
  j["patch_size"] = c.patch_size;
  j["in_channels"] = c.in_channels;
  j["out_channels"] = c.out_channels;
  j["num_layers"] = c.num_layers;
  j["num_single_layers"] = c.num_single_layers;
  j["attention_head_dim"] = c.attention_head_dim;
  j["num_attention_heads"] = c.num_attention_heads;
  j["joint_attention_dim"] = c.joint_attention_dim;
  j["timestep_guidance_channels"] = c.timestep_guidance_channels;
  j["mlp_ratio"] = c.mlp_ratio;
  j["axes_dims_rope"] = c.axes_dims_rope;
  j["rope_theta"] = c.rope_theta;
  j["eps"] = c.eps;
  j["guidance_embeds"] = c.guidance_embeds;
  return j.dump(2) + "\n";
}

FlowMatchSchedulerConfig FlowMatchSchedulerConfig::Flux2() {
  FlowMatchSchedulerConfig s;
  s.shift = 3.0;
  s.use_dynamic_shifting = true;
  return s;
}

absl::StatusOr<FlowMatchSchedulerConfig> ParseFlowMatchSchedulerConfig(absl::string_view json,
                                                                       absl::string_view what) {
  Json j = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  Reader r(j, what);
  DT_RETURN_IF_ERROR(r.CheckObject(json));
  DT_RETURN_IF_ERROR(CheckClassName(r, "FlowMatchEulerDiscreteScheduler"));
  static const std::set<std::string> kKnown = {
      "num_train_timesteps", "shift", "use_dynamic_shifting", "base_shift", "max_shift",
      "base_image_seq_len", "max_image_seq_len", "time_shift_type", "invert_sigmas",
      "shift_terminal", "use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas",
      "stochastic_sampling"};
  DT_RETURN_IF_ERROR(RefuseUnknownKeys(r, j, kKnown, "FlowMatchEulerDiscreteScheduler"));
  FlowMatchSchedulerConfig s;
  DT_ASSIGN_OR_RETURN(s.num_train_timesteps, r.PositiveInt(j, "num_train_timesteps", 1000));
  DT_ASSIGN_OR_RETURN(s.shift, r.PositiveNumber(j, "shift", 1.0));
  DT_ASSIGN_OR_RETURN(s.use_dynamic_shifting, r.Bool("use_dynamic_shifting", false));
  DT_ASSIGN_OR_RETURN(s.base_shift, r.PositiveNumber(j, "base_shift", 0.5));
  DT_ASSIGN_OR_RETURN(s.max_shift, r.PositiveNumber(j, "max_shift", 1.15));
  DT_ASSIGN_OR_RETURN(s.base_image_seq_len, r.PositiveInt(j, "base_image_seq_len", 256));
  DT_ASSIGN_OR_RETURN(s.max_image_seq_len, r.PositiveInt(j, "max_image_seq_len", 4096));
  DT_ASSIGN_OR_RETURN(std::optional<std::string> shift_type, r.String("time_shift_type"));
  if (shift_type && *shift_type != "exponential" && *shift_type != "linear") {
    return r.Unsupported(absl::StrCat("time_shift_type \"", *shift_type,
                                      "\" is not supported (exponential, linear)"));
  }
  s.exponential_time_shift = !shift_type || *shift_type == "exponential";
  for (const char* flag : {"invert_sigmas", "use_karras_sigmas", "use_exponential_sigmas",
                           "use_beta_sigmas", "stochastic_sampling"}) {
    DT_ASSIGN_OR_RETURN(bool on, r.Bool(flag, false));
    if (on) return r.Unsupported(absl::StrCat("\"", flag, "\": true is not implemented"));
  }
  if (r.Find(j, "shift_terminal") != nullptr) {
    return r.Unsupported("\"shift_terminal\" is not implemented (only null)");
  }
  return s;
}

absl::StatusOr<FlowMatchSchedulerConfig> LoadFlowMatchSchedulerConfig(const std::string& dir) {
  std::error_code ec;
  for (const fs::path& file : {fs::path(dir) / "scheduler" / "scheduler_config.json",
                               fs::path(dir) / "scheduler_config.json"}) {
    if (!fs::exists(file, ec)) continue;
    DT_ASSIGN_OR_RETURN(const std::string text, ReadConfigFile(file));
    return ParseFlowMatchSchedulerConfig(text, file.string());
  }
  return FlowMatchSchedulerConfig::Flux2();
}

}  // namespace dt::loaders
