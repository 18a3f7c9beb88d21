#include "dtensor/loaders/rope.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "dtensor/core/status.h"
#include "dtensor/ops/local/ops.h"

namespace dt::loaders {
namespace {

// theta^(2i/D) in f32, as `base ** (arange(0, D, 2).float() / D)`.
float PosFreq(double theta, int64_t i, int64_t dim) {
  return std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(dim));
}

void Llama3(const RopeScaling& s, std::vector<float>* inv) {
  const float factor = static_cast<float>(s.factor);
  const float low = static_cast<float>(s.low_freq_factor);
  const float high = static_cast<float>(s.high_freq_factor);
  const float old_len = static_cast<float>(s.original_max_position_embeddings);
  const double low_wl = static_cast<double>(s.original_max_position_embeddings) / s.low_freq_factor;
  const double high_wl = static_cast<double>(s.original_max_position_embeddings) / s.high_freq_factor;
  const float two_pi = static_cast<float>(2 * M_PI);
  for (float& f : *inv) {
    const float wavelen = two_pi / f;
    float g = wavelen > low_wl ? f / factor : f;
    const float smooth = (old_len / wavelen - low) / (high - low);
    const float smoothed = (1 - smooth) * g / factor + smooth * g;
    const bool medium = !(wavelen < high_wl) && !(wavelen > low_wl);
    f = medium ? smoothed : g;
  }
}

double YarnMscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

RopeTable Yarn(const RopeSpec& spec) {
  const RopeScaling& s = spec.scaling;
  const int64_t dim = spec.head_dim;
  const double factor = s.factor;
  RopeTable t;
  if (s.attention_factor) {
    t.attention_scaling = static_cast<float>(*s.attention_factor);
  } else if (s.mscale.value_or(0) != 0 && s.mscale_all_dim.value_or(0) != 0) {
    t.attention_scaling = static_cast<float>(YarnMscale(factor, *s.mscale) / YarnMscale(factor, *s.mscale_all_dim));
  } else {
    t.attention_scaling = static_cast<float>(YarnMscale(factor, 1.0));
  }
  const double beta_fast = s.beta_fast.value_or(0) != 0 ? *s.beta_fast : 32.0;
  const double beta_slow = s.beta_slow.value_or(0) != 0 ? *s.beta_slow : 1.0;
  const double orig = static_cast<double>(s.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(orig / (rotations * 2 * M_PI))) / (2 * std::log(spec.theta));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers: "prevent singularity"
  const float low_f = static_cast<float>(low), span_f = static_cast<float>(high - low);
  const float factor_f = static_cast<float>(factor);
  t.inv_freq.resize(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float pos = PosFreq(spec.theta, i, dim);
    const float extrapolation = 1.0f / pos, interpolation = 1.0f / (factor_f * pos);
    const float ramp = std::clamp((static_cast<float>(i) - low_f) / span_f, 0.0f, 1.0f);
    const float keep = 1.0f - ramp;  // the share of the unscaled (extrapolated) frequency
    t.inv_freq[i] = interpolation * (1.0f - keep) + extrapolation * keep;
  }
  return t;
}

RopeTable Longrope(const RopeSpec& spec, std::optional<int64_t> seq_len) {
  const RopeScaling& s = spec.scaling;
  const double orig = static_cast<double>(s.original_max_position_embeddings);
  const double factor = s.has_factor ? s.factor : spec.max_position_embeddings / orig;
  RopeTable t;
  if (s.attention_factor) {
    t.attention_scaling = static_cast<float>(*s.attention_factor);
  } else {
    t.attention_scaling = factor <= 1.0 ? 1.0f : static_cast<float>(std::sqrt(1 + std::log(factor) / std::log(orig)));
  }
  const bool long_context = seq_len && *seq_len > s.original_max_position_embeddings;
  const std::vector<double>& ext = long_context ? s.long_factor : s.short_factor;
  const int64_t dim = spec.head_dim;
  t.inv_freq.resize(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    t.inv_freq[i] = 1.0f / (static_cast<float>(ext[i]) * PosFreq(spec.theta, i, dim));
  }
  return t;
}

}  // namespace

RopeTable ComputeRope(const RopeSpec& spec, std::optional<int64_t> seq_len) {
  const RopeScaling& s = spec.scaling;
  const std::string& type = s.rope_type;
  if (type == "yarn") return Yarn(spec);
  if (type == "longrope") return Longrope(spec, seq_len);
  RopeTable t;
  if (type == "dynamic") {
    // NTK: theta grows with the length beyond max_position_embeddings (double, as Python does).
    const double dim = static_cast<double>(spec.head_dim);
    const double len = static_cast<double>(std::max(seq_len.value_or(spec.max_position_embeddings),
                                                    spec.max_position_embeddings));
    const double base = spec.theta * std::pow(s.factor * len / spec.max_position_embeddings - (s.factor - 1),
                                              dim / (dim - 2));
    t.inv_freq = ops::RopeInverseFrequencies(spec.head_dim, base);
    return t;
  }
  t.inv_freq = ops::RopeInverseFrequencies(spec.head_dim, spec.theta);
  if (type == "linear") {
    for (float& f : t.inv_freq) f = f / static_cast<float>(s.factor);
  } else if (type == "llama3") {
    Llama3(s, &t.inv_freq);
  } else {
    DT_CHECK(type == "default", "rope_type ", type, " passed config parsing");
  }
  return t;
}

RopeSchedule::RopeSchedule(RopeSpec spec)
    : spec_(std::move(spec)), original_(ComputeRope(spec_)), current_(original_),
      max_seq_len_cached_(spec_.max_position_embeddings) {}

bool RopeSchedule::depends_on_length() const {
  return spec_.scaling.rope_type == "dynamic" || spec_.scaling.rope_type == "longrope";
}

const RopeTable& RopeSchedule::ForLength(int64_t seq_len) {
  const std::string& type = spec_.scaling.rope_type;
  if (type == "dynamic") {
    const int64_t cached = max_seq_len_cached_;
    if (seq_len > cached) {  // growth
      current_ = ComputeRope(spec_, seq_len);
      max_seq_len_cached_ = seq_len;
    }
    if (seq_len < spec_.max_position_embeddings && cached > spec_.max_position_embeddings) {  // reset
      current_ = original_;
      max_seq_len_cached_ = spec_.max_position_embeddings;
    }
  } else if (type == "longrope") {
    if (!long_) long_ = ComputeRope(spec_, spec_.scaling.original_max_position_embeddings + 1);
    current_ = seq_len > spec_.scaling.original_max_position_embeddings ? *long_ : original_;
  }
  return current_;
}

}  // namespace dt::loaders
