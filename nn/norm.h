#pragma once
// Normalization layers over the last dim (token-wise, so sequence_parallel can shard the tokens).
//
//   layer       parameters                          forward
//   RMSNorm     weight [H]                          {x [..., H]} -> {x·rsqrt(mean(x²)+eps)·weight}
//   LayerNorm   weight [H], bias [H] when affine    {x [..., H]} -> {(x-mean)/sqrt(var+eps)·w + b}
//
// Numerics are ops::RmsNorm (Hugging Face Llama: normalize in f32, round, then scale) and
// ops::LayerNorm. Flux2's LayerNorms have no parameters (elementwise_affine = false). RMSNorm has
// the other forms transformers' families use (RMSNormForm): the weight applied in f32 before the
// rounding (OLMo 2, T5), or as 1 + weight (Gemma, whose weights are stored as offsets from 1).
//
// Note [A norm over a sharded dim]
// A norm whose input is a piece sharded on the normalized dim (OLMo 2's q_norm over a colwise
// q_proj: each rank holds its heads' columns of the projection) needs the mean of squares over the
// whole dim. RMSNorm computes each rank's sum of squares (f32), sums them across the ranks (one
// all_reduce of [..., 1]: a Partial placement made Replicate), and normalizes and scales its own
// columns with its slice of the (replicated) weight, handing on a piece of the same layout. The
// projection is never gathered, unlike transformers' plan for OLMo 2 (colwise_gather_output).

#include <cstdint>
#include <string>
#include <utility>

#include "dtensor/core/dtype.h"
#include "dtensor/nn/module.h"

namespace dt::nn {

// What RMSNorm and LayerNorm share: the normalized size and eps.
class LastDimNorm : public Module {
 protected:
  LastDimNorm(std::string type_name, int64_t hidden_size, double eps)
      : Module(std::move(type_name)), hidden_(hidden_size), eps_(eps) {}

  int64_t hidden_;
  double eps_;
};

// How RMSNorm applies its weight w to x̂ = x·rsqrt(mean(x²)+eps) (computed in f32).
enum class RMSNormForm : uint8_t {
  kRoundThenScale,  // w · round(x̂) in the input dtype (Llama, Qwen, Mistral, Phi-3, ...)
  kScaleThenRound,  // round(w · x̂), the product in f32 (OLMo 2, T5)
  kOnePlusWeight,   // round((1 + w) · x̂), the product in f32 (Gemma; w is stored as w - 1)
};

class RMSNorm : public LastDimNorm {
 public:
  explicit RMSNorm(int64_t hidden_size, double eps = 1e-6, DType dtype = DType::kF32,
                   RMSNormForm form = RMSNormForm::kRoundThenScale);
  RMSNormForm form() const { return form_; }
  std::string ExtraRepr() const override;

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  // Note [A norm over a sharded dim]: x a piece of `whole` sharded on its last dim.
  absl::StatusOr<Value> ShardedForward(const Value& x, const DTensor& whole, const Value& w);
  RMSNormForm form_;
};

class LayerNorm : public LastDimNorm {
 public:
  // bias is only registered with elementwise_affine.
  explicit LayerNorm(int64_t hidden_size, double eps = 1e-5, bool elementwise_affine = true,
                     bool bias = true, DType dtype = DType::kF32);
  std::string ExtraRepr() const override;

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;
};

}  // namespace dt::nn
