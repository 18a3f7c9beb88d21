#pragma once
// Mixture-of-experts blocks, in transformers 5's layout (Note [MoE blocks] in
// nn/models/decoder_family.h).
//
//   TopKRouter      {x [N, H]} -> {weights [N, k], ids [N, k] i64}
//                   weight [E, H] (and with `bias` a bias [E], gpt-oss);
//                   p = softmax(x · weightᵀ + bias) over the E experts, in f32; the k
//                   largest; with `normalize` divided by their sum, times `scaling`; weights in
//                   f32, or in x's dtype with `weights_in_input_dtype` (Qwen3-MoE). With
//                   `f32_logits` the logits themselves are computed in f32 (DeepSeek's router
//                   keeps its weight in f32). With kSigmoid scoring (DeepSeek-V3, MiniCPM5-MoE:
//                   Note [Sigmoid group routing]) a parameter e_score_correction_bias [E] (f32)
//                   shifts the scores that choose, not the weights.
//   Experts         {x [N, H], ids [N, k] i64, weights [N, k]}
//                     -> {y [N, H]: y[n] = Σ_j weights[n, j] · expert_{ids[n, j]}(x[n])}
//                   parameters gate_up_proj [E, 2I, H] (rows gate | up of each expert) and
//                   down_proj [E, H, I]; expert e(x) = down_e(act(gate_e · x) * (up_e · x)).
//                   With ExpertsLayout::kInterleavedColumns and swiglu_limit: gpt-oss's experts
//                   (Note [gpt-oss experts]).
//                   Grouped (Note [Grouped experts]): one GEMM per expert that received tokens,
//                   none for the others. An id equal to the number of experts this rank holds is
//                   skipped (the sentinel of ep_router, transformers' one_hot(num_experts + 1));
//                   with identity experts, ids E .. E + E_id - 1 pick the child `identity`
//                   (IdentityExpert: x itself, LongCat-Flash's "zero experts").
//   IdentityExpert  {x} -> {x}.
//   MoeBlock        {h [B, S, H]} -> {experts(h, gate(h)) + shared_experts(h)}
//                   children gate (TopKRouter; router_name, gpt-oss's "router"), experts
//                   (Experts) and, with shared experts,
//                   shared_experts (SwiGLUMLP of n_shared · I, DeepSeek); computed on whole
//                   (replicated) activations, the output a local tensor.
//
// Experts computes on local tensors: this rank's piece of every expert it holds (moe_tp_experts:
// a slice of every expert, reduced by one all_reduce; grouped_gemm: whole experts, E / ep of
// them, reached through ep_dispatch_experts or ep_router: nn/expert_parallel.h). DTensor inputs
// must be replicated.
//
// Plans (T = tensor-parallel size; names as constructed):
//   Experts   gate_up_proj packed_colwise (blocks [I, I] declared: each rank holds matching gate
//             and up rows), down_proj rowwise, the module moe_tp_experts; identity
//             moe_identity_expert. T divides I. kInterleavedColumns (Note [gpt-oss experts]):
//             gate_up_proj and gate_up_proj_bias rowwise (their last dim, the columns), down_proj
//             colwise (its dim 1, I), down_proj_bias replicated (added by one rank of the tp
//             dim), the module moe_tp_experts.
//   MoeBlock  the router replicated (no rule), shared_experts as a SwiGLUMLP.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dtensor/core/dtype.h"
#include "dtensor/nn/mlp.h"
#include "dtensor/nn/module.h"

namespace dt::nn {

// Note [Sigmoid group routing]
// DeepSeek-V3's router (transformers' DeepseekV3TopkRouter, MiniCPM5-MoE's copy): scores s =
// sigmoid(logits) in f32; the experts are chosen by s + e_score_correction_bias, first among
// groups: the E experts form num_groups groups of consecutive experts, each scored by the sum of
// its two best choice values, and only the topk_groups best groups are eligible; then the top_k
// eligible experts. Their weights are s itself (without the bias), divided by their sum + 1e-20
// when `normalize`, times `scaling`. Computed on the host per token (N · E floats).
enum class RouterScoring : uint8_t {
  kSoftmax,  // p = softmax(logits); the top k of p, weighted by p
  kSigmoid,  // Note [Sigmoid group routing]
};

// Whether `experts` in `groups` groups, the `topk_groups` best of them eligible, can give `top_k`
// (kSigmoid): the groups divide the experts and hold 2 or more each (a group's score is its two
// best), and the eligible groups hold top_k experts or more. The config reader refuses the same
// n_group / topk_group in the config's words (loaders/hf_config_read.cc).
constexpr bool SigmoidGroupsFit(int64_t experts, int64_t groups, int64_t topk_groups,
                                int64_t top_k) {
  return groups > 0 && topk_groups > 0 && experts % groups == 0 && experts / groups >= 2 &&
         topk_groups <= groups && top_k <= topk_groups * (experts / groups);
}

struct RouterOptions {
  int64_t hidden_size = 0;
  int64_t num_experts = 0;
  int64_t top_k = 0;
  bool bias = false;                    // a parameter "bias" [E] on the logits (gpt-oss)
  bool normalize = false;               // the k weights divided by their sum
  double scaling = 1.0;                 // then multiplied by this (routed_scaling_factor)
  bool f32_logits = false;              // weight and logits in f32 (DeepSeek)
  bool weights_in_input_dtype = false;  // weights cast to x's dtype (Qwen3-MoE)
  RouterScoring scoring = RouterScoring::kSoftmax;
  int64_t num_groups = 1;   // kSigmoid: groups of experts (n_group)
  int64_t topk_groups = 1;  // kSigmoid: groups eligible per token (topk_group)
  DType dtype = DType::kF32;            // the weight's (f32 with f32_logits)
};

class TopKRouter : public Module {
 public:
  explicit TopKRouter(const RouterOptions& options);
  const RouterOptions& options() const { return options_; }
  std::string ExtraRepr() const override;
  // Groups that cannot give top_k, reported by ParallelizeModule before any weight is read (and
  // by every forward, for a router placed some other way).
  absl::Status ValidateTensorParallel(const TPValidationContext& ctx) const override;

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  // kSigmoid groups that cannot give top_k (SigmoidGroupsFit): why, else "".
  std::string GroupMisfit() const;

  RouterOptions options_;
};

class IdentityExpert : public Module {
 public:
  IdentityExpert() : Module("IdentityExpert") {}

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;
};

// Note [gpt-oss experts]
// gpt-oss (transformers' GptOssExperts) stores its experts for x · W, not x · Wᵀ: gate_up_proj
// [E, H, 2I] whose columns interleave gate and up (gate_j at 2j, up_j at 2j + 1), with
// gate_up_proj_bias [E, 2I], and down_proj [E, I, H] with down_proj_bias [E, H]. Its GLU is a
// clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit), out = (u + 1) · g ·
// sigmoid(alpha · g), each step rounded to the dtype as transformers' ops round. Under tensor
// parallelism the columns split in contiguous ranges: with T dividing I each rank's range starts
// at an even column and holds whole (gate_j, up_j) pairs, so plain S(2) (rowwise's S(ndim-1)) is
// the interleaved split, and FullTensor gives back the checkpoint's layout. down_proj splits its
// I rows (colwise's S(ndim-2)); down_proj_bias stays whole and is added by the first rank of the
// dim down_proj is split over only, so the all_reduce adds it once.
enum class ExpertsLayout : uint8_t {
  kGateUpRows,          // gate_up_proj [E, 2I, H] rows gate | up, down_proj [E, H, I]
  kInterleavedColumns,  // Note [gpt-oss experts], with biases
};

struct ExpertsOptions {
  int64_t num_experts = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_identity_experts = 0;
  Activation activation = Activation::kSilu;
  ExpertsLayout layout = ExpertsLayout::kGateUpRows;
  // > 0: the clamped SwiGLU of Note [gpt-oss experts] instead of act(gate) · up.
  double swiglu_limit = 0;
  double swiglu_alpha = 1.702;
  DType dtype = DType::kF32;
};

class Experts : public Module {
 public:
  explicit Experts(const ExpertsOptions& options);
  const ExpertsOptions& options() const { return options_; }
  std::string ExtraRepr() const override;
  absl::Status ValidateTensorParallel(const TPValidationContext& ctx) const override;
  // gate_up_proj holds [gate | up] per expert: blocks [I, I] along its rows.
  std::vector<int64_t> PackedBlocks(const Parameter& param, bool col) const override;

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  // Expert e's output for its rows xe (this rank's piece of it under tensor parallelism).
  absl::StatusOr<Tensor> RunExpert(const Tensor& xe, int64_t e, const Tensor& gate_up,
                                   const Tensor& down);
  // Whether this rank adds down_proj_bias (Note [gpt-oss experts]).
  absl::StatusOr<bool> AddsDownBias() const;

  ExpertsOptions options_;
  IdentityExpert* identity_ = nullptr;  // with num_identity_experts
};

struct MoeBlockOptions {
  RouterOptions router;
  std::string router_name = "gate";  // gpt-oss: "router"
  ExpertsOptions experts;
  int64_t shared_intermediate_size = 0;  // 0: no shared experts
  bool shared_bias = false;
};

class MoeBlock : public Module {
 public:
  explicit MoeBlock(const MoeBlockOptions& options);
  const MoeBlockOptions& options() const { return options_; }

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  MoeBlockOptions options_;
  // The children the forward calls, as built.
  TopKRouter* gate_;
  Experts* experts_;
  SwiGLUMLP* shared_experts_ = nullptr;  // with shared_intermediate_size
};

// Rows [P, H], one per (token, slot) pair in the order the caller computed them (Note [Grouped
// experts]: by expert), weighted by `weights` (f32 multiply, rounded to the rows' dtype) and summed
// per token in that order: y [n, H]; a token with no rows gets zeros. Shared with expert
// parallelism's combine (nn/expert_parallel.h).
absl::StatusOr<Tensor> CombineByToken(const Tensor& rows, absl::Span<const int64_t> tokens,
                                      absl::Span<const float> weights, int64_t n);

}  // namespace dt::nn
