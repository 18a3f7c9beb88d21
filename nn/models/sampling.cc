#include "dtensor/nn/models/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/random.h"

namespace dt::nn {

std::string SamplingOptions::ToString() const {
  if (greedy) return "greedy";
  return absl::StrCat("temperature ", temperature, ", top-k ", top_k, ", top-p ", top_p,
                      ", seed ", seed);
}

absl::StatusOr<int64_t> SampleToken(absl::Span<const float> logits, const SamplingOptions& o,
                                    int64_t step) {
  const int64_t n = static_cast<int64_t>(logits.size());
  if (n == 0) return absl::InvalidArgumentError("SampleToken: no logits");
  if (o.greedy) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i) {
      if (logits[i] > logits[best] || (std::isnan(logits[i]) && !std::isnan(logits[best]))) {
        best = i;
      }
    }
    return best;
  }
  if (!(o.temperature > 0) || !std::isfinite(o.temperature) || o.top_k < 0 || !(o.top_p > 0) ||
      o.top_p > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SampleToken: need temperature > 0, top_k >= 0, 0 < top_p <= 1; got ", o.ToString()));
  }
  // Candidates sorted by logit, descending (ties: lower index first).
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, n) : n;
  auto greater = [&](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), greater);
  order.resize(k);
  const double top = logits[order[0]];
  if (!std::isfinite(top)) {
    return absl::InvalidArgumentError("SampleToken: the largest logit is not finite");
  }
  std::vector<double> p(k);
  double total = 0;
  for (int64_t i = 0; i < k; ++i) {
    const double v = logits[order[i]];
    p[i] = std::isfinite(v) ? std::exp((v - top) / o.temperature) : 0.0;
    total += p[i];
  }
  // top-p: the smallest prefix whose mass reaches top_p (at least one token).
  int64_t keep = k;
  if (o.top_p < 1) {
    double mass = 0;
    for (int64_t i = 0; i < k; ++i) {
      mass += p[i] / total;
      if (mass >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (int64_t i = 0; i < keep; ++i) kept += p[i];
  const double u = UniformAt(o.seed, static_cast<uint64_t>(step)) * kept;
  double acc = 0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

}  // namespace dt::nn
