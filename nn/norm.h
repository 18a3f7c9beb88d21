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

class RMSNorm : public LastDimNorm {
 public:
  explicit RMSNorm(int64_t hidden_size, double eps = 1e-6, DType dtype = DType::kF32);
  std::string ExtraRepr() const override;

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;
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
