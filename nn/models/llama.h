#pragma once
// Llama (transformers' LlamaForCausalLM) built from nn layers, with Hugging Face names, the
// transformers tensor-parallel plan, sharded loading from safetensors and generation.
//
//   LlamaForCausalLM
//   ├── model (LlamaModel)
//   │   ├── embed_tokens (Embedding)                    model.embed_tokens.weight   [V, H]
//   │   ├── layers (ModuleList) × L of LlamaDecoderLayer
//   │   │   ├── input_layernorm (RMSNorm)               model.layers.{i}.input_layernorm.weight
//   │   │   ├── self_attn (Attention, GQA, KV cache)    ....self_attn.{q,k,v,o}_proj.weight (+bias)
//   │   │   ├── post_attention_layernorm (RMSNorm)
//   │   │   └── mlp (SwiGLUMLP)                         ....mlp.{gate,up,down}_proj.weight (+bias)
//   │   ├── norm (RMSNorm)                              model.norm.weight
//   │   └── rotary_emb (RotaryEmbedding)                inv_freq buffer (llama3 scaling), no file
//   └── lm_head (Linear)                                lm_head.weight [V, H]; when
//                                                       tie_word_embeddings, read from
//                                                       model.embed_tokens.weight
//
// Tensor-parallel plan (transformers' base_model_tp_plan + LlamaForCausalLM._tp_plan):
//
//   key                                  style                   per layer / model
//   model.layers.*.self_attn.q_proj      colwise                 heads split, no communication
//   model.layers.*.self_attn.k_proj      colwise                 KV heads split
//   model.layers.*.self_attn.v_proj      colwise
//   model.layers.*.self_attn.o_proj      rowwise                 all_reduce [B, S, H]
//   model.layers.*.mlp.gate_proj         colwise
//   model.layers.*.mlp.up_proj           colwise
//   model.layers.*.mlp.down_proj         rowwise                 all_reduce [B, S, H]
//   lm_head                              colwise_gather_output   all_gather of the logits
//   model.embed_tokens                   (replicated) or embedding_rowwise with
//                                        LlamaLoadOptions::shard_embedding (all_reduce)
//
// Norms and rotary tables stay replicated. A tied lm_head is its own colwise parameter read from
// the embedding's rows, so it costs V·H/tp per rank. Before any weight is read, FromPretrained
// checks the plan against the config (tp must divide heads, KV heads, intermediate size and the
// vocab: TPConfig) and the checkpoint against the model (every tensor present with its shape and
// a supported dtype). Each rank then reads only its own ranges (spec.Ranges()) of every tensor:
// no rank ever holds a full sharded weight (LlamaLoadReport proves it with the loader's counts).
//
// Numerics follow transformers (reference §3.3): RMSNorm in f32, rounded to the model dtype, then
// scaled; rotate_half RoPE with llama3 frequency smoothing; GQA; softmax in f32. The compute dtype
// is the config's torch_dtype unless LlamaLoadOptions::dtype says otherwise (a bf16 checkpoint
// can run in f32).
//
// Generation (Generate): prefill the prompt, then one token per step with the KV cache. Every
// rank ends up with the same gathered logits; group rank 0 of the tp mesh picks the token (greedy
// or temperature/top-k/top-p with a counter-based RNG seeded by SamplingOptions::seed) and
// broadcasts it, so the ranks agree on every token even if a backend's reductions were not
// bitwise identical across ranks (one 8-byte broadcast per token). See Note [Agreeing on tokens].

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dtensor/core/tensor.h"
#include "dtensor/loaders/hf_config.h"
#include "dtensor/loaders/safetensors.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/distributed.h"
#include "dtensor/nn/load.h"
#include "dtensor/nn/module.h"
#include "dtensor/nn/plan.h"
#include "dtensor/nn/save.h"
#include "dtensor/nn/models/sampling.h"

namespace dt::nn {

class LlamaDecoderLayer : public Module {
 public:
  LlamaDecoderLayer(const loaders::LlamaConfig& config, DType dtype);

 protected:
  // {h [B, S, H], cos, sin} -> {h}
  absl::StatusOr<Values> Forward(Values inputs) override;
};

class LlamaModel : public Module {
 public:
  LlamaModel(const loaders::LlamaConfig& config, DType dtype);

 protected:
  // {ids [B, S] i64, positions [S] i64} -> {hidden [B, S, H] after the final norm}
  absl::StatusOr<Values> Forward(Values inputs) override;
};

struct LlamaLoadOptions {
  // The compute dtype; nullopt: the config's torch_dtype.
  std::optional<DType> dtype;
  // embed_tokens as embedding_rowwise (vocab rows split, masked lookup + all_reduce) instead of
  // replicated.
  bool shard_embedding = false;
  // mmap views for pieces that are contiguous in the file and already in the compute dtype.
  bool zero_copy = true;
  // Warnings for checkpoint tensors the model does not use.
  bool warn = true;
  // The plan; nullopt: TPPlan(shard_embedding). (DistributedConfig::tp_plan sets it.)
  std::optional<ParallelPlan> plan;
  // Read every weight whole on every rank, then shard in place (ShardLoaded, diffusers'
  // enable_parallelism) instead of reading only this rank's ranges: the slow, memory-heavy path,
  // kept to compare with (bench/load) and for models that arrive whole.
  bool load_whole = false;
  // Keep the weights a GGUF stores quantized as their blocks (nn::KeepQuantized: every Linear
  // weight and the embedding table; Note [Quantized dtypes]) instead of dequantizing them to the
  // compute dtype; not with load_whole. A weight whose shards would not be whole blocks at this
  // tp is dequantized (said in LlamaLoadReport::dequantized) or, with kRefuse, refused before
  // anything is read.
  bool keep_quantized = false;
  QuantizedMisfit quantized_misfit = QuantizedMisfit::kDequantize;
};

// What one rank's load did (nn/load.h).
using LlamaLoadReport = LoadReport;

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  SamplingOptions sampling;
  // Stop after producing one of these (not part of the max); empty: never stop early.
  std::vector<int64_t> stop_token_ids;
  // Called after the prefill and after every decode step on every rank (print from one).
  std::function<void(const struct GenerateProgress&)> on_progress;
};

struct GenerateProgress {
  int64_t step = 0;  // tokens generated so far
  int64_t token = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;  // since the prefill ended
};

struct GenerateResult {
  std::vector<int64_t> tokens;  // the new tokens only
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;  // the steps after the first token
  double prefill_tokens_per_second() const;
  double decode_tokens_per_second() const;
};

class LlamaForCausalLM : public Module {
 public:
  LlamaForCausalLM(const loaders::LlamaConfig& config, DType dtype);

  // config.json + safetensors in `dir`, laid out over the 1-D tensor-parallel `mesh` (every rank
  // of the mesh calls it). `report` (optional) receives this rank's loader accounting.
  static absl::StatusOr<std::unique_ptr<LlamaForCausalLM>> FromPretrained(
      const std::string& dir, const DeviceMesh& mesh, const LlamaLoadOptions& options = {},
      LlamaLoadReport* report = nullptr);

  // One entry point (nn/distributed.h): the mesh from the world or the n-D mesh's "tp" dim, the
  // plan from DistributedConfig::tp_plan ("auto": TPPlan()).
  static absl::StatusOr<std::unique_ptr<LlamaForCausalLM>> FromPretrained(
      const std::string& dir, const std::shared_ptr<World>& world, const DistributedConfig& dist,
      LlamaLoadOptions options = {}, LlamaLoadReport* report = nullptr);
  static absl::StatusOr<std::unique_ptr<LlamaForCausalLM>> FromPretrained(
      const std::string& dir, const DeviceMesh& mesh, const DistributedConfig& dist,
      LlamaLoadOptions options = {}, LlamaLoadReport* report = nullptr);

  // The plan above, and the config's numbers for TPConfig validation.
  static ParallelPlan TPPlan(bool shard_embedding = false);
  // The plan in effect, rule by rule with the parameters each matched (nn::FormatPlan).
  std::string tp_plan();
  TPConfig tp_config() const;

  // Places the parameters (ParallelizeModule with TPPlan and tp_config) without reading anything.
  absl::Status Parallelize(const DeviceMesh& mesh, bool shard_embedding = false);
  absl::Status Parallelize(const DeviceMesh& mesh, const ParallelPlan& plan);
  // Shards a model loaded whole (every parameter Replicate with its value): nn::ShardLoaded with
  // `plan` and tp_config.
  absl::Status ShardLoaded(const ParallelPlan& plan);
  // Reads every placed parameter's local piece from `checkpoint` (names as in HF checkpoints).
  absl::Status LoadWeights(const loaders::Checkpoint& checkpoint, const LlamaLoadOptions& options,
                           LlamaLoadReport* report = nullptr);
  // Checks, reading no weight, that `checkpoint` has every parameter with its shape.
  absl::Status CheckCheckpoint(const loaders::Checkpoint& checkpoint, bool warn) const;
  // The checkpoint tensor parameter `name` is read from.
  std::string CheckpointName(absl::string_view name) const;
  // How SaveGathered (nn/save.h) writes this model as an HF checkpoint: HF names, a tied lm_head
  // left out, config.json from config().
  SaveOptions save_options() const;

  const loaders::LlamaConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }

  // ids [B, S] (i64) of the positions after the KV cache -> logits [B, S, V] (all positions) or
  // [B, 1, V] (last_only), as a plain tensor holding the full vocab on every rank. Appends to the
  // KV cache.
  absl::StatusOr<Tensor> Logits(const Tensor& ids, bool last_only = false);
  // Tokens in the KV cache; ResetCache forgets them.
  int64_t cache_length() const { return past_; }
  void ResetCache();

  // Prefill + decode from an empty cache (the cache is reset first). Collective over the mesh.
  absl::StatusOr<GenerateResult> Generate(const std::vector<int64_t>& prompt,
                                          const GenerateOptions& options);

 protected:
  // {ids [B, S]} -> {logits [B, S, V]}
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  absl::StatusOr<int64_t> PickToken(const Tensor& last_logits, const SamplingOptions& sampling,
                                    int64_t step);

  loaders::LlamaConfig config_;
  DType dtype_;
  int64_t past_ = 0;
  std::optional<DeviceMesh> mesh_;
  ParallelPlan plan_;
};

}  // namespace dt::nn
