#include "dtensor/nn/models/flow_match.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/local/ops.h"

// Note [Schedules in diffusers' precision]
// numpy computes the shift in f32 (a Python float meeting an f32 array is converted to f32 first),
// torch the step in f32 with one rounding per op. This file is compiled with -ffp-contract=off so
// that `(s - 1) · σ + 1` and `a · N + b` are not fused into FMAs, which round once where numpy
// rounds twice; the step goes through ops::Mul and ops::Add for the same reason.

namespace dt::nn {

double Flux2EmpiricalMu(int64_t image_seq_len, int64_t num_steps) {
  const double a1 = 8.73809524e-05, b1 = 1.89833333;
  const double a2 = 0.00016927, b2 = 0.45666666;
  const double n = static_cast<double>(image_seq_len);
  if (image_seq_len > 4300) return a2 * n + b2;
  const double m_200 = a2 * n + b2;
  const double m_10 = a1 * n + b1;
  const double a = (m_200 - m_10) / 190.0;
  const double b = m_200 - 200.0 * a;
  return a * static_cast<double>(num_steps) + b;
}

absl::Status FlowMatchEulerScheduler::SetTimesteps(int64_t num_steps, double mu) {
  if (num_steps < 1 || num_steps > 100000) {
    return absl::InvalidArgumentError(
        absl::StrCat("FlowMatchEulerScheduler: steps must be in [1, 100000], got ", num_steps));
  }
  if (config_.use_dynamic_shifting && !std::isfinite(mu)) {
    return absl::InvalidArgumentError(
        absl::StrCat("FlowMatchEulerScheduler: dynamic shifting needs a finite mu, got ", mu));
  }
  sigmas_.clear();
  timesteps_.clear();
  // numpy's linspace(1, 1/N, N) in f64 (the last value exactly 1/N), then f32.
  const double start = 1.0, stop = 1.0 / static_cast<double>(num_steps);
  const double step = num_steps > 1 ? (stop - start) / static_cast<double>(num_steps - 1) : 0.0;
  const float e_mu = static_cast<float>(std::exp(mu));
  const float mu_f = static_cast<float>(mu);
  const float shift = static_cast<float>(config_.shift);
  for (int64_t i = 0; i < num_steps; ++i) {
    const double lin = i == num_steps - 1 ? stop : start + static_cast<double>(i) * step;
    const float t = static_cast<float>(lin);
    float sigma;
    if (config_.use_dynamic_shifting) {
      const float r = 1.0f / t - 1.0f;
      sigma = config_.exponential_time_shift ? e_mu / (e_mu + r) : mu_f / (mu_f + r);
    } else {
      sigma = shift * t / (1.0f + (shift - 1.0f) * t);
    }
    sigmas_.push_back(sigma);
    timesteps_.push_back(sigma * static_cast<float>(config_.num_train_timesteps));
  }
  sigmas_.push_back(0.0f);
  return absl::OkStatus();
}

absl::StatusOr<Tensor> FlowMatchEulerScheduler::Step(const Tensor& v, int64_t step,
                                                     const Tensor& x) const {
  if (step < 0 || step >= num_steps()) {
    return absl::InvalidArgumentError(absl::StrCat("FlowMatchEulerScheduler: step ", step,
                                                   " is outside [0, ", num_steps(), ")"));
  }
  if (!v.defined() || !x.defined() || v.shape() != x.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FlowMatchEulerScheduler: the model output and the sample must have one shape, got ",
        v.defined() ? v.Describe() : "undefined", " and ", x.defined() ? x.Describe() : "undefined"));
  }
  const float dt = sigmas_[step + 1] - sigmas_[step];
  DT_ASSIGN_OR_RETURN(Tensor xf, ops::Cast(x, DType::kF32));
  DT_ASSIGN_OR_RETURN(Tensor vf, ops::Cast(v, DType::kF32));
  DT_ASSIGN_OR_RETURN(Tensor dv, ops::Mul(vf, static_cast<double>(dt)));
  DT_ASSIGN_OR_RETURN(Tensor out, ops::Add(xf, dv));
  return ops::Cast(out, x.dtype());
}

}  // namespace dt::nn
