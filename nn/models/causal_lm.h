#pragma once
// The decoder-only causal language models (transformers' LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM) as one model class assembled from the
// family's description (nn/models/decoder_family.h), with Hugging Face names, the family's
// tensor-parallel plan, sharded loading from safetensors or GGUF, a KV cache and generation.
//
//   CausalLM
//   ├── model (DecoderModel)
//   │   ├── embed_tokens (Embedding)                    model.embed_tokens.weight   [V, H]
//   │   ├── layers (ModuleList) × L of DecoderLayer
//   │   │   ├── input_layernorm (RMSNorm)               model.layers.{i}.input_layernorm.weight
//   │   │   ├── self_attn (Attention, GQA, KV cache)    ....self_attn.{q,k,v,o}_proj.weight (+bias)
//   │   │   │                                           Qwen3: ....self_attn.{q,k}_norm.weight;
//   │   │   │                                           Phi-3: ....self_attn.qkv_proj.weight
//   │   │   ├── post_attention_layernorm (RMSNorm)
//   │   │   └── mlp (SwiGLUMLP)                         ....mlp.{gate,up,down}_proj.weight (+bias);
//   │   │                                               Phi-3: ....mlp.gate_up_proj.weight
//   │   ├── norm (RMSNorm)                              model.norm.weight
//   │   └── rotary_emb (RotaryEmbedding)                inv_freq buffer (the config's rope type),
//   │                                                   no file
//   └── lm_head (Linear)                                lm_head.weight [V, H]; when
//                                                       tie_word_embeddings, read from
//                                                       model.embed_tokens.weight
//
// Tensor-parallel plan: the family's (nn/models/decoder_family.h; Llama's below):
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
//                                        CausalLMLoadOptions::shard_embedding (all_reduce)
//
// At a tp that does not divide the KV heads the default plan splits k_proj / v_proj unit_colwise
// instead: each KV head whole on the ranks whose query heads use it (Note [KV heads past tp]).
// Norms and rotary tables stay replicated. A tied lm_head is its own colwise parameter read from
// the embedding's rows, so it costs V·H/tp per rank. A plan that replicates k_proj and v_proj runs
// any tp that divides the query heads (Note [Replicated KV heads] in nn/attention.cc). Loading
// follows nn::LoadPretrained (nn/load.h): the config against the checkpoint's headers, the plan
// against the config and the mesh (tp must divide what the plan splits: heads, KV heads when
// k_proj / v_proj are split, intermediate size, the gathered vocab), then the checkpoint's names
// and shapes; only then does each rank read its own ranges (spec.Ranges()) of every tensor, so
// no rank ever holds a full sharded weight (LoadReport proves it with the loader's counts).
//
// Numerics follow transformers (reference §3.3): RMSNorm in f32, rounded to the model dtype, then
// scaled; rotate_half RoPE with the config's rope type; GQA; softmax in f32. The compute dtype is
// the config's torch_dtype unless CausalLMLoadOptions::dtype says otherwise (a bf16 checkpoint
// can run in f32).
//
// Generation (Generate): prefill the prompt, then one token per step with the KV cache. Every
// rank ends up with the same gathered logits; each checks them finite, group rank 0 of the mesh
// picks the token (greedy or temperature/top-k/top-p with a counter-based RNG seeded by
// SamplingOptions::seed), and one 16-byte all_reduce hands every rank rank 0's token or the same
// error (AgreeOnToken in nn/models/sampling.h; Note [Agreeing on tokens]), so the ranks agree on
// every token even if a backend's reductions were not bitwise identical across ranks.
//
// Note [The context limit]
// A sequence (prompt + new tokens) holds at most context_length() = the config's
// max_position_embeddings (GGUF's context_length) tokens: the positions the model was made for,
// and a bound on the KV cache. Generate refuses a longer prompt before any work, naming both
// numbers, or with GenerateOptions::truncate cuts it (FitPromptToContext); it stops at the
// context (GenerateResult::stop == kContext) when max_new_tokens would pass it, and sizes the
// KV buffers for min(prompt + max_new_tokens, context) (at most kMaxReserve up front: Note [KV
// buffers are reserved]); Logits refuses positions past it. Rope types that extend past
// max_position_embeddings by themselves (`dynamic`) are held to it as well.
//
// Note [Non-finite values]
// A NaN or an infinity in the logits is an error on every rank at once, at the step it appeared
// ("Generate: step 3: the logits are not finite: logit 7 of 384 is NaN"; AgreeOnToken): a cheap
// check of the V logits each step. set_check_finite(true) (generate --check-finite) checks every
// layer's output as well: forward hooks on the embedding, the rotary table, each layer's norms,
// attention, MLP and output, the final norm and lm_head record the first output that is not
// finite, one all_reduce (min) per forward agrees on it across ranks, and the error names that
// module and which of its parameters hold non-finite values, every rank the same even when one
// rank alone holds the bad shard ("Generate: step 0: model.layers.1.mlp: its output holds NaN
// (the first layer output of this forward that is not finite); non-finite values in
// model.layers.1.mlp.down_proj.weight"). The hooks only record: a rank that failed alone would
// leave the others waiting in the next collective.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dtensor/core/tensor.h"
#include "dtensor/loaders/checkpoint.h"
#include "dtensor/loaders/hf_config.h"
#include "dtensor/loaders/safetensors.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/attention.h"
#include "dtensor/nn/distributed.h"
#include "dtensor/nn/load.h"
#include "dtensor/nn/module.h"
#include "dtensor/nn/plan.h"
#include "dtensor/nn/save.h"
#include "dtensor/nn/models/decoder_family.h"
#include "dtensor/nn/models/sampling.h"

namespace dt::nn {

// One decoder layer: h + attn(norm(h)), then + mlp(norm(.)), with the family's norms (Note [Layer
// norms] in nn/models/decoder_family.h).
class DecoderLayer : public Module {
 public:
  DecoderLayer(const loaders::DecoderConfig& config, int64_t index, DType dtype);

 protected:
  // {h [B, S, H], cos, sin} -> {h}
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  // The children the forward calls, as built (self_attn: Attention or LatentAttention; mlp:
  // SwiGLUMLP or MoeBlock, by the family and the layer); a norm the family's layers lack is null.
  RMSNorm *input_layernorm_ = nullptr, *post_attention_norm_ = nullptr, *pre_mlp_norm_ = nullptr,
          *post_mlp_norm_ = nullptr;
  Module *self_attn_, *mlp_;
};

class DecoderModel : public Module {
 public:
  DecoderModel(const loaders::DecoderConfig& config, DType dtype);

  // The serving engine's step (CausalLM::StepLogits): ids [1, T] of several sequences, one after
  // the other (`segments`: tokens per sequence), at `positions` [T] -> the hidden states
  // [1, T, H] before the final norm. cos and sin are made per sequence, as a forward of that
  // sequence alone makes them (the table may depend on the length: loaders/rope.h).
  absl::StatusOr<Value> StepHidden(const Tensor& ids, const Tensor& positions,
                                   absl::Span<const int64_t> segments);
  RMSNorm& norm() { return *norm_; }

 protected:
  // {ids [B, S] i64, positions [S] i64} -> {hidden [B, S, H] after the final norm}
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  // The children the forward calls, as built.
  Embedding* embed_tokens_;
  ModuleList* layers_;
  RMSNorm* norm_;
  RotaryEmbedding* rotary_emb_;
  // Gemma 3's sliding layers' table (DecoderConfig::local_rope_theta) and which layers use it.
  RotaryEmbedding* rotary_emb_local_ = nullptr;
  std::vector<bool> local_layers_;
  bool rope_by_length_;  // the rotary table depends on the length the positions reach
  std::optional<double> embed_scale_;  // the family's (Gemma: √hidden_size)
  // {ids [B, S], cos, sin} -> the layers' output, before the final norm (positions for the
  // sliding layers' own table).
  absl::StatusOr<Value> RunLayers(const Value& ids, Value cos, Value sin, const Value& positions);
};

// set_check_finite's hooks and what they recorded (nn/models/causal_lm.cc).
struct FiniteWatch;
class LatentAttention;

// One step of the serving engine (nn/models/engine.h): the new tokens of several sequences in one
// forward, sequence after sequence (Note [Paged KV cache] in nn/attention.cc).
struct BatchStep {
  std::vector<int64_t> ids;        // [T] the step's tokens
  std::vector<int64_t> positions;  // [T] each one's position in its sequence
  std::vector<int64_t> segments;   // tokens per sequence, summing to T
  PagedStep paged;                 // where their keys and values go and are read from
  std::vector<int64_t> logit_rows;  // the rows of T whose logits are wanted
};

struct CausalLMLoadOptions {
  // The compute dtype; nullopt: the config's torch_dtype.
  std::optional<DType> dtype;
  // embed_tokens as embedding_rowwise (vocab rows split, masked lookup + all_reduce) instead of
  // replicated.
  bool shard_embedding = false;
  // k_proj and v_proj replicated instead of colwise: any tp that divides the query heads, each
  // rank keeping the KV heads its query heads use (Note [Replicated KV heads]).
  bool replicate_kv = false;
  // At a tp that does not divide the query heads, split them unevenly in whole heads (9 on 2
  // ranks: 5 + 4), the KV heads following (Note [Uneven heads at any tp] in
  // nn/models/uneven_heads.cc); the load report states the imbalance.
  bool uneven_heads = false;
  // mmap views for pieces that are contiguous in the file and already in the compute dtype.
  bool zero_copy = true;
  // Checkpoint tensors the model does not use: refused (Note [Every tensor is used] in nn/load.h),
  // kWarn warns from the mesh's first rank, kIgnore says nothing.
  PlanCheck unused_tensors = PlanCheck::kError;
  // The plan; nullopt: TPPlan(config, shard_embedding, replicate_kv). (DistributedConfig::tp_plan
  // sets it.)
  std::optional<ParallelPlan> plan;
  // The expert-parallel plan: on a 2-D (ep, tp) mesh (nullopt: EPPlan(config)), or, set, on the 1-D
  // mesh ep and tp share. (DistributedConfig::ep_size and ep_plan set it.)
  std::optional<ParallelPlan> ep_plan;
  // What ParallelizeModule does with plan rules that match no layer (DistributedConfig's
  // unmatched_keys sets it).
  PlanCheck unused_rules = PlanCheck::kWarn;
  // Read every weight whole on every rank, then shard in place (ShardLoaded, diffusers'
  // enable_parallelism) instead of reading only this rank's ranges: the slow, memory-heavy path,
  // kept to compare with (bench/load) and for models that arrive whole.
  bool load_whole = false;
  // Keep the weights a GGUF stores quantized as their blocks (nn::KeepQuantized: every Linear
  // weight and the embedding table; Note [Quantized dtypes]) instead of dequantizing them to the
  // compute dtype; not with load_whole. A weight whose shards would not be whole blocks at this
  // tp is dequantized (said in LoadReport::dequantized) or, with kRefuse, refused before
  // anything is read.
  bool keep_quantized = false;
  QuantizedMisfit quantized_misfit = QuantizedMisfit::kDequantize;
  // The KV cache's dtype (CausalLM::SetKVCacheDType); nullopt: the compute dtype.
  std::optional<DType> kv_dtype;
};

// What Generate does with a prompt that leaves no room for max_new_tokens in the context
// (FitPromptToContext): kNone runs it while it fits the context at all.
enum class PromptTruncation { kNone, kLeft, kRight };
// "none", "left", "right".
absl::StatusOr<PromptTruncation> ParsePromptTruncation(absl::string_view name);

// The prompt Generate runs for `context` positions (Note [The context limit]): kNone: the prompt
// itself when it fits the context, else OutOfRange naming both lengths; kLeft / kRight: the prompt
// without its first / last tokens, as many as needed for prompt + max_new_tokens to fit the
// context but no more than leave half the context (rounded up) of it.
absl::StatusOr<std::vector<int64_t>> FitPromptToContext(const std::vector<int64_t>& prompt,
                                                        int64_t max_new_tokens, int64_t context,
                                                        PromptTruncation truncate);

struct GenerateOptions {
  // At most this many new tokens; fewer when the context ends first (GenerateResult::stop).
  int64_t max_new_tokens = 32;
  SamplingOptions sampling;
  // Stop after producing one of these (not part of the max); empty: never stop early.
  std::vector<int64_t> stop_token_ids;
  // A prompt longer than the context is refused unless truncated (FitPromptToContext).
  PromptTruncation truncate = PromptTruncation::kNone;
  // Called after the prefill and after every decode step on every rank (print from one).
  std::function<void(const struct GenerateProgress&)> on_progress;
};

struct GenerateProgress {
  int64_t step = 0;  // tokens generated so far
  int64_t token = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;  // since the prefill ended
};

// Why generation ended.
enum class StopReason {
  kMaxNewTokens,  // max_new_tokens were produced
  kStopToken,     // the last token is one of stop_token_ids
  kContext,       // prompt + tokens reached the context before max_new_tokens
};

struct GenerateResult {
  std::vector<int64_t> tokens;  // the new tokens only
  int64_t prompt_tokens = 0;    // after truncation
  int64_t truncated_tokens = 0;  // cut from the prompt (GenerateOptions::truncate)
  StopReason stop = StopReason::kMaxNewTokens;
  double prefill_seconds = 0;
  double decode_seconds = 0;  // the steps after the first token
  double prefill_tokens_per_second() const;
  double decode_tokens_per_second() const;
};

class CausalLM : public Module {
 public:
  // The config must be valid (ParseDecoderConfig's checks); ValidateConfig says what this class
  // refuses beyond them, and every entry point returns it.
  CausalLM(const loaders::DecoderConfig& config, DType dtype);
  ~CausalLM() override;

  // config.json + safetensors in `dir`, or a GGUF file, laid out over the 1-D tensor-parallel
  // `mesh`, or over a 2-D mesh (ep, tp) for expert parallelism (nn/expert_parallel.h; families
  // with experts only); every rank of the mesh calls it. `report` (optional) receives this
  // rank's loader accounting.
  static absl::StatusOr<std::unique_ptr<CausalLM>> FromPretrained(
      const std::string& dir, const DeviceMesh& mesh, const CausalLMLoadOptions& options = {},
      LoadReport* report = nullptr);

  // One entry point (nn/distributed.h): the mesh from the world or the n-D mesh's "tp" dim (and its
  // "ep" dim with ep_size > 1: ModelMesh), the plans from DistributedConfig::tp_plan ("auto":
  // TPPlan(config)) and ep_plan ("auto": EPPlan(config)).
  static absl::StatusOr<std::unique_ptr<CausalLM>> FromPretrained(
      const std::string& dir, const std::shared_ptr<World>& world, const DistributedConfig& dist,
      CausalLMLoadOptions options = {}, LoadReport* report = nullptr);
  static absl::StatusOr<std::unique_ptr<CausalLM>> FromPretrained(
      const std::string& dir, const DeviceMesh& mesh, const DistributedConfig& dist,
      CausalLMLoadOptions options = {}, LoadReport* report = nullptr);

  // The family's plan (the table above for Llama), and Llama's. replicate_kv: k_proj and v_proj
  // 'replicate' instead of colwise (families with separate projections).
  static ParallelPlan TPPlan(const loaders::DecoderConfig& config, bool shard_embedding = false,
                             bool replicate_kv = false);
  static ParallelPlan TPPlan(bool shard_embedding = false);
  // `plan` with colwise k_proj / v_proj made unit_colwise when tp does not divide the KV heads:
  // whole KV heads on the ranks whose query heads use them (Note [KV heads past tp]); what
  // FromPretrained does to the default plan.
  static ParallelPlan FitKVHeads(ParallelPlan plan, const loaders::DecoderConfig& config,
                                 int64_t tp);
  // The family's expert-parallel plan (transformers' base_model_ep_plan: tokens dispatched to the
  // experts' ranks), or with `all_reduce` its ep_router alternative; empty for families without
  // experts.
  static ParallelPlan EPPlan(const loaders::DecoderConfig& config, bool all_reduce = false);
  // What this class refuses in a config that parsed (an activation the gated MLP has not).
  static absl::Status ValidateConfig(const loaders::DecoderConfig& config);
  // The placements the parameters have, whichever entry point placed them (nn::FormatPlacements).
  std::string tp_plan();
  // The checks Parallelize and ShardLoaded apply (norms and, by default, the embedding are
  // replicated on purpose).
  ParallelizeOptions parallelize_options() const;

  // Places the parameters (ParallelizeModule with TPPlan, its KV heads fitted to the mesh:
  // FitKVHeads) without reading anything; on a 2-D
  // (ep, tp) mesh, or with an `ep_plan` on a 1-D mesh ep and tp share, the expert-parallel plan
  // too (ParallelizeModuleWithEP; the first form takes EPPlan on a 2-D mesh).
  absl::Status Parallelize(const DeviceMesh& mesh, bool shard_embedding = false);
  absl::Status Parallelize(const DeviceMesh& mesh, const ParallelPlan& plan,
                           const ParallelPlan& ep_plan = {});
  // Shards a model loaded whole (every parameter Replicate with its value): nn::ShardLoaded.
  absl::Status ShardLoaded(const ParallelPlan& plan);
  // Reads every placed parameter's local piece from `checkpoint` (names as in HF checkpoints).
  absl::Status LoadWeights(const loaders::Checkpoint& checkpoint,
                           const CausalLMLoadOptions& options, LoadReport* report = nullptr);
  // Checks, reading no weight, that `checkpoint` has every parameter with its shape, and holds no
  // tensor the model does not use (`unused`: nn::CheckCheckpoint).
  absl::Status CheckCheckpoint(const loaders::Checkpoint& checkpoint,
                               PlanCheck unused = PlanCheck::kError) const;
  // The checkpoint tensor parameter `name` is read from.
  std::string CheckpointName(absl::string_view name) const;
  // How SaveGathered (nn/save.h) writes this model as an HF checkpoint: HF names, a tied lm_head
  // left out, config.json from config().
  SaveOptions save_options() const;

  const loaders::DecoderConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }

  // ids [B, S] (i64) of the positions after the KV cache -> logits [B, S, V] (all positions) or
  // [B, 1, V] (last_only), as a plain tensor holding the full vocab on every rank. Appends to the
  // KV cache. Positions past the context (Note [The context limit]) or the config's sliding
  // window (Note [Sliding windows] in loaders/hf_config.h) are refused; with check_finite(), a
  // non-finite layer output is an error on every rank (Note [Non-finite values]).
  absl::StatusOr<Tensor> Logits(const Tensor& ids, bool last_only = false);
  // The most tokens a sequence may hold: the config's max_position_embeddings.
  int64_t context_length() const { return config_.max_position_embeddings; }
  // Checks every layer's output in Logits, Call and Generate (Note [Non-finite values]); off by
  // default (the logits are checked every step regardless). Set it alike on every rank.
  void set_check_finite(bool on);
  bool check_finite() const { return watch_ != nullptr; }
  // Tokens in the KV cache; ResetCache forgets them.
  int64_t cache_length() const { return past_; }
  // `reserve`: positions the caches' buffers are made for (Note [KV buffers are reserved] in
  // nn/attention.cc).
  void ResetCache(int64_t reserve = 0);
  // The dtype every attention layer keeps its keys and values in, contiguous cache and pages
  // (nullopt: the compute dtype, the default). f16 or bf16 under an f32 compute dtype halves what
  // a decode step reads of the cache, each key and value rounded once as it is written (llama.cpp
  // keeps f16 by default; Note [A KV cache of its own dtype] in ops/local/attention.cc); CPU
  // only when it is not the compute dtype. Forgets the cache. InvalidArgument for a dtype that
  // is not float, Unimplemented for another dtype than the compute dtype off the CPU.
  absl::Status SetKVCacheDType(std::optional<DType> dtype);
  DType kv_cache_dtype() const { return kv_dtype_.value_or(dtype_); }
  // The bytes this rank holds for the KV cache (not the pages), every layer's.
  int64_t kv_cache_bytes();

  // The serving engine's step (nn/models/engine.cc): the forward of `step`'s tokens over the
  // paged KV caches of its sequences, then the final norm and lm_head on the rows
  // `step.logit_rows` only -> logits [R, V] (the full vocab on every rank; [0, V] and no lm_head
  // when R = 0). Every rank of the mesh calls it with the same step. The ids, positions and
  // pages are the engine's to check (an id outside the vocab gives a zero row of a sharded
  // embedding, not an error); positions past the context are refused.
  absl::StatusOr<Tensor> StepLogits(const BatchStep& step);
  // The communicator over every rank of the mesh the model was laid over (they agree on tokens and
  // checks, and the serving engine's plans go through it), or nullptr on one rank.
  absl::StatusOr<CommPtr> MeshComm();
  // Frees every layer's KV pages (made by the first StepLogits).
  void ReleasePagedKV();
  // The bytes one position takes in the KV pages of this rank, over all layers (an estimate
  // before the first step: this rank's share of the KV heads, ceil(heads / tp)).
  int64_t PagedKVBytesPerPosition() const;
  // Positions a sequence may reach: context_length(), or the config's sliding window when
  // smaller (Note [Sliding windows] in loaders/hf_config.h: attention past it is not
  // implemented).
  int64_t position_limit() const;

  // Prefill + decode from an empty cache (the cache is reset first). Collective over the mesh.
  // The prompt and options are checked before any work (the prompt against the context and the
  // vocab); non-finite logits fail every rank at the step they appear (Note [Non-finite values]).
  absl::StatusOr<GenerateResult> Generate(const std::vector<int64_t>& prompt,
                                          const GenerateOptions& options);

 protected:
  // {ids [B, S]} -> {logits [B, S, V]}
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  absl::StatusOr<int64_t> PickToken(const Tensor& last_logits, const SamplingOptions& sampling,
                                    int64_t step);
  // With check_finite(): agrees across ranks on the first non-finite output the watch recorded in
  // the forward just run, and names it (Note [Non-finite values]).
  absl::Status CheckWatched();
  // Sets `step` on every attention layer (null: their contiguous KV caches again).
  void SetPagedStep(const PagedStep* step);
  // Fills paged_layers_ and paged_latent_layers_ at the first call.
  void FindPagedLayers();
  loaders::DecoderConfig config_;
  DType dtype_;
  std::optional<DType> kv_dtype_;  // SetKVCacheDType
  // The children Logits calls, as built.
  DecoderModel* model_;
  Linear* lm_head_;
  int64_t past_ = 0;
  // The mesh FromPretrained laid the model over (the tp mesh, or (ep, tp)): every rank of it
  // agrees on each token (Note [Agreeing on tokens]).
  std::optional<DeviceMesh> mesh_;
  std::unique_ptr<FiniteWatch> watch_;  // null unless check_finite()
  // Every attention layer, found once (Note [Paged layers are found once]).
  std::vector<Attention*> paged_layers_;
  std::vector<LatentAttention*> paged_latent_layers_;
};

}  // namespace dt::nn
