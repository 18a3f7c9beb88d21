#pragma once
// The flow-matching Euler sampler of diffusers' Flux2Pipeline (FlowMatchEulerDiscreteScheduler
// with dynamic shifting):
//
//   sigmas_in = linspace(1, 1/N, N)                          (f32)
//   mu        = Flux2EmpiricalMu(image_seq_len, N)           (black-forest-labs' fit, f64)
//   sigma_i   = e^mu / (e^mu + (1/sigma_in_i - 1))           exponential time shift (f32);
//               linear: mu / (mu + (1/sigma_in_i - 1)); without dynamic shifting the static
//               shift s: s·σ / (1 + (s - 1)·σ)
//   t_i       = sigma_i · num_train_timesteps                 (the model gets t_i / 1000)
//   sigmas    = [sigma_0 .. sigma_{N-1}, 0]
//   step i:   x <- x + (sigma_{i+1} - sigma_i) · v            in f32, v = the transformer's output
//
// Every value is computed in the precision diffusers uses (numpy f32 for the shift, torch f32 for
// the step), so the sigmas equal diffusers' bit for bit (tests/models/flux2_test.cc).

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "dtensor/core/tensor.h"
#include "dtensor/loaders/diffusers_config.h"

namespace dt::nn {

// Flux2Pipeline's compute_empirical_mu.
double Flux2EmpiricalMu(int64_t image_seq_len, int64_t num_steps);

class FlowMatchEulerScheduler {
 public:
  explicit FlowMatchEulerScheduler(loaders::FlowMatchSchedulerConfig config = {})
      : config_(config) {}

  // The schedule for `num_steps` steps; `mu` is required with dynamic shifting.
  absl::Status SetTimesteps(int64_t num_steps, double mu);

  const std::vector<float>& sigmas() const { return sigmas_; }        // N + 1, ends with 0
  const std::vector<float>& timesteps() const { return timesteps_; }  // N
  int64_t num_steps() const { return static_cast<int64_t>(timesteps_.size()); }

  // x_{i+1} = x_i + (sigma_{i+1} - sigma_i) · v, in f32; the result has x's dtype.
  absl::StatusOr<Tensor> Step(const Tensor& v, int64_t step, const Tensor& x) const;

  const loaders::FlowMatchSchedulerConfig& config() const { return config_; }

 private:
  loaders::FlowMatchSchedulerConfig config_;
  std::vector<float> sigmas_;
  std::vector<float> timesteps_;
};

}  // namespace dt::nn
