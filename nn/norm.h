#pragma once
// Normalization layers over the last dim (token-wise, so sequence_parallel can shard the tokens).
//
//   layer       parameters                          forward
//   RMSNorm     weight [H]                          {x [..., H]} -> {x·rsqrt(mean(x²)+eps)·weight}
//   LayerNorm   weight [H], bias [H] when affine    {x [..., H]} -> {(x-mean)/sqrt(var+eps)·w + b}
//
// Numerics are ops::RmsNorm (Hugging Face Llama: normalize in f32, round, then scale) and
// ops::LayerNorm. Flux2's LayerNorms have no parameters (elementwise_affine = false).

#include <cstdint>
#include <string>

#include "dtensor/core/dtype.h"
#include "dtensor/nn/module.h"

namespace dt::nn {

class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t hidden_size, double eps = 1e-6, DType dtype = DType::kF32);
  std::string ExtraRepr() const override;

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  int64_t hidden_;
  double eps_;
};

class LayerNorm : public Module {
 public:
  // bias is only registered with elementwise_affine.
  explicit LayerNorm(int64_t hidden_size, double eps = 1e-5, bool elementwise_affine = true,
                     bool bias = true, DType dtype = DType::kF32);
  std::string ExtraRepr() const override;

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  int64_t hidden_;
  double eps_;
};

}  // namespace dt::nn
