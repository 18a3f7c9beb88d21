#pragma once
// Feed-forward blocks.
//
//   MLP            {x [..., H]} -> {down(act(up(x)))}, act one of GELU (tanh or erf), SiLU, ReLU;
//                  children `up` [I, H] and `down` [H, I] under names of your choice (GPT-2:
//                  c_fc / c_proj; ViT, OPT: fc1 / fc2), biases optional.
//   SwiGLUMLP      {x [..., H]} -> {down(act(gate(x)) * up(x))}, act SiLU unless given (GeGLU
//                  with a GELU)
//                  children gate_proj [I, H], up_proj [I, H], down_proj [H, I] (Llama), or with
//                  `fused` gate_up_proj [2I, H] (rows gate | up, recorded as packed blocks
//                  [I, I]) and down_proj.
//
// The experts of a mixture of experts are in nn/moe.h.
//
// Plans (T = tensor-parallel size; names as constructed):
//   MLP        up colwise, down rowwise                 one all_reduce, I % T == 0
//   SwiGLUMLP  gate_proj, up_proj colwise, down_proj rowwise; fused: gate_up_proj packed_colwise
//              (blocks [I, I] declared by the module), down_proj rowwise
//
// Tensor-parallel validation (before any weight is read): when the plan shards the projections,
// tp must divide the intermediate size:
//   "SwiGLUMLP 'layers.0.mlp': tensor parallel size 3 does not divide intermediate_size 64
//    (gate_proj, up_proj, down_proj are sharded)"
// and gate_proj and up_proj must be split alike (their outputs are multiplied element by element):
//   "SwiGLUMLP 'layers.0.mlp': gate_proj.weight is [S(0)] but up_proj.weight is [R]: ..."

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dtensor/core/dtype.h"
#include "dtensor/nn/linear.h"
#include "dtensor/nn/module.h"

namespace dt::nn {

enum class Activation : uint8_t {
  kGeluTanh,  // GPT-2's gelu_new / gelu_pytorch_tanh
  kGelu,      // exact (erf), PyTorch's default nn.GELU()
  kSilu,
  kRelu,
};
// "gelu_tanh", "gelu", "silu", "relu".
const char* ActivationName(Activation a);
// Hugging Face's config.json `hidden_act` / `activation_function` names: gelu_new,
// gelu_pytorch_tanh, gelu_fast -> kGeluTanh; gelu -> kGelu; silu, swish -> kSilu; relu -> kRelu.
// InvalidArgument listing them for any other.
absl::StatusOr<Activation> ParseActivation(absl::string_view name);
// act(x) on DTensors or local tensors (ops/value_ops.h).
absl::StatusOr<Value> Activate(const Value& x, Activation a);

struct MLPOptions {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  Activation activation = Activation::kGeluTanh;
  bool bias = true;
  std::string up_name = "fc1";    // GPT-2: "c_fc"
  std::string down_name = "fc2";  // GPT-2: "c_proj"
  DType dtype = DType::kF32;
};

class MLP : public Module {
 public:
  explicit MLP(const MLPOptions& options);
  const MLPOptions& options() const { return options_; }
  std::string ExtraRepr() const override;
  absl::Status ValidateTensorParallel(const TPValidationContext& ctx) const override;

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  MLPOptions options_;
  Linear *up_, *down_;  // the children the forward calls, as built
};

struct SwiGLUOptions {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  bool bias = false;
  bool fused = false;  // one gate_up_proj instead of gate_proj and up_proj
  Activation activation = Activation::kSilu;
  DType dtype = DType::kF32;
};

class SwiGLUMLP : public Module {
 public:
  explicit SwiGLUMLP(const SwiGLUOptions& options);
  const SwiGLUOptions& options() const { return options_; }
  std::string ExtraRepr() const override;
  absl::Status ValidateTensorParallel(const TPValidationContext& ctx) const override;

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  SwiGLUOptions options_;
  // The children the forward calls, as built: gate_up_ when fused, else gate_ and up_.
  Linear *gate_up_ = nullptr, *gate_ = nullptr, *up_ = nullptr, *down_ = nullptr;
};

// For modules with projections of an intermediate size (MLP, SwiGLUMLP, Experts): when the plan
// shards any of `projections`, tp must divide `intermediate`; InvalidArgument naming the module,
// both numbers and the sharded projections otherwise.
absl::Status CheckIntermediate(const Module& m, const TPValidationContext& ctx,
                               absl::Span<const std::string> projections, int64_t intermediate);

}  // namespace dt::nn
