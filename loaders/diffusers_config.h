#pragma once
// diffusers' config files for Flux2: the transformer's `config.json` (Flux2Transformer2DModel) and
// the scheduler's `scheduler_config.json` (FlowMatchEulerDiscreteScheduler).
//
// Flux2Transformer2DModel, every field of its __init__ (defaults = FLUX.2-dev):
//
//   field                        default   notes
//   patch_size                   1         proj_out has patch_size² · out_channels rows
//   in_channels                  128       x_embedder input (32 VAE channels · 2 × 2 patchify)
//   out_channels                 null      null: in_channels
//   num_layers                   8         double-stream blocks
//   num_single_layers            48        single-stream blocks
//   attention_head_dim           128       = sum(axes_dims_rope)
//   num_attention_heads          48        inner dim D = heads · head_dim
//   joint_attention_dim          15360     context_embedder input (text encoder width)
//   timestep_guidance_channels   256       sinusoidal embedding width (even)
//   mlp_ratio                    3.0       M = int(D · mlp_ratio)
//   axes_dims_rope               [32, 32, 32, 32]   4 rotary axes (t, h, w, l), each even
//   rope_theta                   2000
//   eps                          1e-6      LayerNorm and the q/k RMSNorms
//   guidance_embeds              true      a guidance embedder (guidance-distilled dev model)
//
// `_class_name` must be Flux2Transformer2DModel when present; other keys starting with '_'
// (`_diffusers_version`, `_name_or_path`) are metadata. Any other key is refused: a field this
// implementation does not know may change the model, and running it anyway would be silent
// garbage.
//
// FlowMatchEulerDiscreteScheduler: num_train_timesteps, shift, use_dynamic_shifting, base_shift,
// max_shift, base_image_seq_len, max_image_seq_len and time_shift_type ("exponential" or
// "linear") are implemented; invert_sigmas, shift_terminal, use_karras_sigmas,
// use_exponential_sigmas, use_beta_sigmas and stochastic_sampling are accepted only at their
// defaults (false / null) and refused otherwise.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dt::loaders {

struct Flux2Config {
  int64_t patch_size = 1;
  int64_t in_channels = 128;
  int64_t out_channels = 128;  // resolved: in_channels when the file says null
  int64_t num_layers = 8;
  int64_t num_single_layers = 48;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 48;
  int64_t joint_attention_dim = 15360;
  int64_t timestep_guidance_channels = 256;
  double mlp_ratio = 3.0;
  std::vector<int64_t> axes_dims_rope = {32, 32, 32, 32};
  double rope_theta = 2000.0;
  double eps = 1e-6;
  bool guidance_embeds = true;

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  // diffusers: int(inner_dim * mlp_ratio).
  int64_t mlp_hidden_dim() const;
  int64_t NumParameters() const;
  // "flux2: D=3072 heads=24x128 double=5 single=20 M=9216 ctx=7680 guidance=no".
  std::string Summary() const;
};

// `what` names the source in messages.
absl::StatusOr<Flux2Config> ParseFlux2Config(absl::string_view json, absl::string_view what);
// The directory holding the transformer: `dir` itself when it has config.json, else the
// `transformer/` subfolder of a pipeline directory; NotFound naming both when neither has one.
absl::StatusOr<std::string> Flux2TransformerDir(const std::string& dir);
// config.json of Flux2TransformerDir(dir).
absl::StatusOr<Flux2Config> LoadFlux2Config(const std::string& dir);
// The `_class_name` of a diffusers model (Flux2TransformerDir(dir)'s config.json), or "" when
// `dir` holds no diffusers config (a transformers directory, whose config.json has none, or no
// config at all). Lets a tool that takes any model directory tell which loader it needs.
absl::StatusOr<std::string> DiffusersClassName(const std::string& dir);
// The config as diffusers writes it (every field, `_class_name` first).
std::string Flux2ConfigToJson(const Flux2Config& config);

struct FlowMatchSchedulerConfig {
  int64_t num_train_timesteps = 1000;
  double shift = 1.0;
  bool use_dynamic_shifting = false;
  double base_shift = 0.5;
  double max_shift = 1.15;
  int64_t base_image_seq_len = 256;
  int64_t max_image_seq_len = 4096;
  bool exponential_time_shift = true;  // time_shift_type "exponential" (else "linear")

  // FLUX.2-dev's scheduler (the pipeline's scheduler_config.json).
  static FlowMatchSchedulerConfig Flux2();
};

absl::StatusOr<FlowMatchSchedulerConfig> ParseFlowMatchSchedulerConfig(absl::string_view json,
                                                                       absl::string_view what);
// `dir`/scheduler/scheduler_config.json, `dir`/scheduler_config.json, or Flux2() when `dir` has
// neither (a bare transformer directory).
absl::StatusOr<FlowMatchSchedulerConfig> LoadFlowMatchSchedulerConfig(const std::string& dir);

}  // namespace dt::loaders
