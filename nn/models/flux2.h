#pragma once
// Flux2 (diffusers' Flux2Transformer2DModel) built from nn layers, with diffusers' parameter names,
// diffusers' `_tp_plan`, and sharded loading from a diffusers checkpoint.
//
//   Flux2Transformer2DModel                             D = heads · head_dim, M = int(D · mlp_ratio)
//   ├── time_guidance_embed                             sincos(t · 1000) -> linear_1 -> silu -> linear_2
//   │   ├── timestep_embedder.linear_1 / linear_2       [D, C_t], [D, D]
//   │   └── guidance_embedder.linear_1 / linear_2       (guidance_embeds only), added to the above
//   ├── double_stream_modulation_img / _txt.linear      [6D, D]: (shift, scale, gate) × {attn, ff}
//   ├── single_stream_modulation.linear                 [3D, D]: (shift, scale, gate)
//   ├── x_embedder [D, in], context_embedder [D, ctx]
//   ├── transformer_blocks × num_layers (Flux2TransformerBlock, double stream)
//   │   ├── norm1, norm1_context, norm2, norm2_context  LayerNorm without parameters
//   │   ├── attn (Flux2Attention)                       to_q/k/v, add_q/k/v_proj [D, D];
//   │   │                                               norm_q/k, norm_added_q/k [head_dim];
//   │   │                                               to_out.0, to_add_out [D, D]
//   │   └── ff, ff_context (Flux2FeedForward)           linear_in [2M, D] = [gate | up], linear_out [D, M]
//   ├── single_transformer_blocks × num_single_layers (Flux2SingleTransformerBlock)
//   │   ├── norm                                        LayerNorm without parameters
//   │   └── attn (Flux2ParallelSelfAttention)           to_qkv_mlp_proj [3D + 2M, D] = [Q|K|V|gate|up];
//   │                                                   norm_q/k; to_out [D, D + M] = [attn | mlp]
//   ├── norm_out.linear                                 [2D, D] = [scale | shift] (scale first)
//   └── proj_out                                        [patch² · out_channels, D]
//
// Tensor-parallel plan (diffusers' _tp_plan; T = tp):
//
//   key                                               style                     per rank
//   transformer_blocks.*.attn.to_q|to_k|to_v          colwise                   [D/T, D]: heads split
//   transformer_blocks.*.attn.add_q_proj|k|v          colwise
//   transformer_blocks.*.attn.to_out.0                rowwise                   all_reduce (image)
//   transformer_blocks.*.attn.to_add_out              rowwise                   all_reduce (text)
//   transformer_blocks.*.ff.linear_in                 packed_colwise [1, 1]     _S(0, [M, M])
//   transformer_blocks.*.ff.linear_out                rowwise                   all_reduce
//   transformer_blocks.*.ff_context.linear_in         packed_colwise [1, 1]
//   transformer_blocks.*.ff_context.linear_out        rowwise                   all_reduce
//   single_transformer_blocks.*.attn.to_qkv_mlp_proj  packed_colwise (Linear's  _S(0, [D, D, D, M, M])
//                                                     blocks)
//   single_transformer_blocks.*.attn.to_out           packed_rowwise (Linear's  _S(1, [D, M]), all_reduce
//                                                     blocks)
//
// So a forward costs 4 all_reduces per double block and 1 per single block; the modulations, the
// embedders, the q/k norms, norm_out and proj_out stay replicated (diffusers' choice: modulation
// indexes the whole hidden dim). Gathering any sharded weight gives the checkpoint's layout back
// (Note [Packed blocks] in nn/styles.h).
//
// Before any weight is read FromPretrained checks: the config against the checkpoint's block
// counts (Note [Config against checkpoint]); tp against the heads and every packed block on its
// own (diffusers' checks); q, k and v of one attention sharded alike; every plan rule matching a
// layer; then every tensor's shape — a fused projection that does not have 3·D + 2·M rows is named
// with the sizes it should have. Each rank then reads only its own ranges (several per packed
// weight); Flux2LoadReport proves it.
//
// Numerics follow diffusers: timestep and guidance cast to the model dtype, then × 1000;
// sinusoidal embedding [cos | sin] in f32; 4-axis RoPE from f64 frequencies with interleaved pairs
// and text tokens first; LayerNorm without affine (eps from the config); q/k RMSNorm per head; f32
// softmax. The compute dtype defaults to f32 (diffusers' from_pretrained default), whatever the
// checkpoint stores.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "dtensor/core/tensor.h"
#include "dtensor/loaders/checkpoint.h"
#include "dtensor/loaders/diffusers_config.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/distributed.h"
#include "dtensor/nn/linear.h"
#include "dtensor/nn/load.h"
#include "dtensor/nn/module.h"
#include "dtensor/nn/norm.h"
#include "dtensor/nn/plan.h"
#include "dtensor/nn/save.h"

namespace dt::nn {

// linear_1 -> silu -> linear_2 (diffusers' TimestepEmbedding without biases).
class TimestepEmbedding : public Module {
 public:
  TimestepEmbedding(int64_t in_channels, int64_t dim, DType dtype);

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  Linear* linear_1_;
  Linear* linear_2_;
};

// {t [B] f32 (× 1000 already), g [B] or undefined} -> {temb [B, D]}.
class Flux2TimestepGuidanceEmbeddings : public Module {
 public:
  Flux2TimestepGuidanceEmbeddings(int64_t channels, int64_t dim, bool guidance, DType dtype);

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  int64_t channels_;
  DType dtype_;
  TimestepEmbedding* timestep_embedder_;
  TimestepEmbedding* guidance_embedder_ = nullptr;  // with guidance_embeds only
};

// {temb [B, D]} -> {linear(silu(temb)) [B, sets · 3D]}.
class Flux2Modulation : public Module {
 public:
  Flux2Modulation(int64_t dim, int64_t sets, DType dtype);

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  Linear* linear_;
};

struct Flux2AttentionOptions {
  int64_t dim = 0;  // D
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t mlp_hidden_dim = 0;  // M (single-stream only)
  double eps = 1e-6;
  DType dtype = DType::kF32;
};

// Double-stream joint attention: {x [B, Si, D], c [B, St, D], cos, sin [St + Si, hd]} ->
// {x_out, c_out}.
class Flux2Attention : public Module {
 public:
  explicit Flux2Attention(const Flux2AttentionOptions& options);
  absl::Status ValidateTensorParallel(const TPValidationContext& ctx) const override;

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  Flux2AttentionOptions options_;
  Linear *to_q_, *to_k_, *to_v_, *add_q_proj_, *add_k_proj_, *add_v_proj_;
  RMSNorm *norm_q_, *norm_k_, *norm_added_q_, *norm_added_k_;
  Linear *to_out_, *to_add_out_;  // to_out_: to_out.0 (diffusers' ModuleList)
};

// {x} -> {linear_out(silu(gate) * up)}, [gate | up] = linear_in(x).
class Flux2FeedForward : public Module {
 public:
  Flux2FeedForward(int64_t dim, int64_t hidden, DType dtype);

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  Linear *linear_in_, *linear_out_;
};

// {x, c, mod_img [B, 6D], mod_txt [B, 6D], cos, sin} -> {x, c}.
class Flux2TransformerBlock : public Module {
 public:
  explicit Flux2TransformerBlock(const Flux2AttentionOptions& options);

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  LayerNorm *norm1_, *norm1_context_, *norm2_, *norm2_context_;
  Flux2Attention* attn_;
  Flux2FeedForward *ff_, *ff_context_;
};

// Single-stream parallel attention + MLP: {h [B, S, D], cos, sin} -> {to_out([attn | mlp])}.
class Flux2ParallelSelfAttention : public Module {
 public:
  explicit Flux2ParallelSelfAttention(const Flux2AttentionOptions& options);
  absl::Status ValidateTensorParallel(const TPValidationContext& ctx) const override;

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  Flux2AttentionOptions options_;
  Linear *to_qkv_mlp_proj_, *to_out_;
  RMSNorm *norm_q_, *norm_k_;
};

// {h, mod [B, 3D], cos, sin} -> {h}.
class Flux2SingleTransformerBlock : public Module {
 public:
  explicit Flux2SingleTransformerBlock(const Flux2AttentionOptions& options);

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  LayerNorm* norm_;
  Flux2ParallelSelfAttention* attn_;
};

// diffusers' AdaLayerNormContinuous without affine: {x, temb} -> {LN(x) · (1 + scale) + shift},
// (scale, shift) = chunk(linear(silu(temb)), 2).
class AdaLayerNormContinuous : public Module {
 public:
  AdaLayerNormContinuous(int64_t dim, double eps, DType dtype);

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  Linear* linear_;
  LayerNorm* norm_;
};

// The transformer's inputs as diffusers' forward takes them (plain tensors, the same on every
// rank). Float inputs are converted to the model dtype; ids may be f32 or integer.
struct Flux2Inputs {
  Tensor hidden_states;          // [B, S_img, in_channels]
  Tensor encoder_hidden_states;  // [B, S_txt, joint_attention_dim]
  Tensor timestep;               // [B] in [0, 1] (the pipeline's t / 1000)
  Tensor guidance;               // [B] or undefined
  Tensor img_ids;                // [S_img, A] or [B, S_img, A] (batch 0 used), A = #rope axes
  Tensor txt_ids;                // [S_txt, A] or [B, S_txt, A]
};

struct Flux2LoadOptions {
  DType dtype = DType::kF32;  // compute dtype
  bool zero_copy = true;
  // Checkpoint tensors the model does not use: refused (Note [Every tensor is used] in nn/load.h).
  PlanCheck unused_tensors = PlanCheck::kError;
  std::optional<ParallelPlan> plan;  // nullopt: TPPlan(config)
  // Read every weight whole, then shard in place (nn::ShardLoaded, diffusers' enable_parallelism):
  // the same model, more memory on the way. The plan is still validated before anything is read.
  bool load_whole = false;
};

class Flux2Transformer2DModel : public Module {
 public:
  Flux2Transformer2DModel(const loaders::Flux2Config& config, DType dtype);

  // A diffusers model directory (config.json + diffusion_pytorch_model.safetensors or its
  // .index.json) or a pipeline directory (its transformer/ subfolder), laid out over the 1-D
  // tensor-parallel `mesh` (every rank of the mesh calls it).
  static absl::StatusOr<std::unique_ptr<Flux2Transformer2DModel>> FromPretrained(
      const std::string& dir, const DeviceMesh& mesh, const Flux2LoadOptions& options = {},
      LoadReport* report = nullptr);
  // The mesh from the world (or an n-D mesh's "tp" dim), the plan from DistributedConfig::tp_plan.
  static absl::StatusOr<std::unique_ptr<Flux2Transformer2DModel>> FromPretrained(
      const std::string& dir, const std::shared_ptr<World>& world, const DistributedConfig& dist,
      Flux2LoadOptions options = {}, LoadReport* report = nullptr);

  // diffusers' _tp_plan (the table above); rules for blocks the config has none of are left out.
  static ParallelPlan TPPlan(const loaders::Flux2Config& config);
  static ParallelPlan TPPlan();  // for a model with both kinds of blocks
  TPConfig tp_config() const;
  // The checks Parallelize and ShardLoaded apply: tp_config(), every rule must match a layer,
  // uncovered parameters (modulations, embedders, norms) are replicated on purpose.
  ParallelizeOptions parallelize_options() const;
  // The placements the parameters have, whichever entry point placed them (FormatPlacements).
  std::string tp_plan();

  // Places the parameters without reading anything (every check of the file comment that needs
  // no checkpoint).
  absl::Status Parallelize(const DeviceMesh& mesh, const ParallelPlan& plan);
  // A model loaded whole (every parameter Replicate on the mesh) sharded in place by `plan`.
  absl::Status ShardLoaded(const ParallelPlan& plan);
  // Every parameter's tensor present with its shape (reads no weight).
  absl::Status CheckCheckpoint(const loaders::Checkpoint& checkpoint,
                               PlanCheck unused = PlanCheck::kError) const;
  absl::Status LoadWeights(const loaders::Checkpoint& checkpoint, const Flux2LoadOptions& options,
                           LoadReport* report = nullptr);
  // SaveGathered (nn/save.h): diffusers names, config.json from config().
  SaveOptions save_options() const;

  // One forward: -> sample [B, S_img, patch² · out_channels] (plain tensor, on every rank).
  // Collective over the mesh.
  absl::StatusOr<Tensor> Run(const Flux2Inputs& inputs);

  const loaders::Flux2Config& config() const { return config_; }
  DType dtype() const { return dtype_; }
  // The mesh the parameters are placed on (nullopt before placement).
  std::optional<DeviceMesh> mesh() const;

 protected:
  // {hidden_states, encoder_hidden_states, timestep, guidance (or undefined), img_ids, txt_ids}
  // -> {sample}.
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  // The fused projections' shapes, named with the layout they must have (reads no weight).
  absl::Status CheckFusedLayouts(const loaders::Checkpoint& checkpoint) const;

  loaders::Flux2Config config_;
  DType dtype_;
  // The children the forward calls, as built (Module::AddModule; no lookups by name).
  Flux2TimestepGuidanceEmbeddings* time_guidance_embed_;
  Flux2Modulation *double_stream_modulation_img_, *double_stream_modulation_txt_, *single_stream_modulation_;
  Linear *x_embedder_, *context_embedder_, *proj_out_;
  ModuleList *transformer_blocks_, *single_transformer_blocks_;
  AdaLayerNormContinuous* norm_out_;
};

// ---- pipeline pieces (diffusers' Flux2Pipeline) -------------------------------------------------

// Rotary tables of Flux2PosEmbed for ids [S, A] (any numeric dtype): for each axis i of dim d_i,
// angles pos · theta^(-2j/d_i) in f64, each repeated twice (interleaved pairs); cos and sin
// [S, sum d_i] f32.
absl::StatusOr<std::pair<Tensor, Tensor>> Flux2RotaryTables(const Tensor& ids,
                                                            const std::vector<int64_t>& axes_dims,
                                                            double theta);
// The sinusoidal timestep projection (diffusers' Timesteps with flip_sin_to_cos, shift 0):
// t [B] f32 -> [B, channels] = [cos(t·f) | sin(t·f)], f_k = exp(-ln(10000) · k / (channels/2)).
absl::StatusOr<Tensor> Flux2TimestepProjection(const Tensor& t, int64_t channels);

// Position ids as the pipeline makes them (i64): image tokens of an h × w latent grid
// (0, row, col, 0) row-major -> [h·w, 4]; text tokens (0, 0, 0, l) -> [len, 4].
absl::StatusOr<Tensor> Flux2LatentIds(int64_t height, int64_t width);
absl::StatusOr<Tensor> Flux2TextIds(int64_t length);

}  // namespace dt::nn
