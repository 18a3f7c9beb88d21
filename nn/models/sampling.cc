#include "dtensor/nn/models/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/random.h"
#include "dtensor/core/status.h"
#include "dtensor/core/tensor.h"

namespace dt::nn {

std::string SamplingOptions::ToString() const {
  if (greedy) return "greedy";
  return absl::StrCat("temperature ", temperature, ", top-k ", top_k, ", top-p ", top_p,
                      ", seed ", seed);
}

absl::Status SamplingOptions::Validate() const {
  if (greedy) return absl::OkStatus();
  if (!(temperature > 0) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling: temperature must be finite and > 0, got ", temperature));
  }
  if (top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: top_k must be >= 0, got ", top_k));
  }
  if (!(top_p > 0) || top_p > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling: top_p must be in (0, 1], got ", top_p));
  }
  return absl::OkStatus();
}

namespace {

// The first non-finite logit, encoded as 3 · id + kind (kind 0: NaN, 1: +inf, 2: -inf) so that
// the minimum over ranks is the lowest id any rank saw; nullopt when all are finite.
std::optional<int64_t> FirstNonFinite(absl::Span<const float> logits) {
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (!std::isfinite(v)) {
      return 3 * static_cast<int64_t>(i) + (std::isnan(v) ? 0 : v > 0 ? 1 : 2);
    }
  }
  return std::nullopt;
}

absl::Status NonFiniteError(int64_t code, int64_t n) {
  static constexpr const char* kKinds[] = {"NaN", "+inf", "-inf"};
  return absl::InvalidArgumentError(absl::StrCat("the logits are not finite: logit ", code / 3,
                                                 " of ", n, " is ", kKinds[code % 3]));
}

// SampleToken on validated options and finite, non-empty logits (Note [Logits must be finite]).
int64_t SampleFinite(absl::Span<const float> logits, const SamplingOptions& o, int64_t step) {
  const int64_t n = static_cast<int64_t>(logits.size());
  if (o.greedy) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i) {
      if (logits[i] > logits[best]) best = i;
    }
    return best;
  }
  // Candidates sorted by logit, descending, ties by lower id: a strict total order on finite
  // values, so the first k are the same whatever partial_sort's algorithm.
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, n) : n;
  auto before = [&](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  order.resize(k);
  const double top = logits[order[0]];
  std::vector<double> p(k);
  double total = 0;
  for (int64_t i = 0; i < k; ++i) {
    p[i] = std::exp((logits[order[i]] - top) / o.temperature);
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

}  // namespace

absl::StatusOr<int64_t> SampleToken(absl::Span<const float> logits, const SamplingOptions& o,
                                    int64_t step) {
  if (logits.empty()) return absl::InvalidArgumentError("SampleToken: no logits");
  if (absl::Status s = o.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("SampleToken: ", s.message()));
  }
  if (std::optional<int64_t> bad = FirstNonFinite(logits)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SampleToken: ", NonFiniteError(*bad, static_cast<int64_t>(logits.size())).message()));
  }
  return SampleFinite(logits, o, step);
}

// Note [Agreeing on tokens]
// Every rank holds the gathered logits, and with this runtime's backends they are bitwise equal
// on every rank (all_gather copies bytes; each all_reduce hands every member the same sum). Still,
// a rank that took a different token, or failed where the others went on, would feed the others'
// KV caches garbage or leave them waiting in the next collective, and an MPI all_reduce is not
// required to be bitwise identical across ranks. So the decision is made once for all ranks:
// each rank checks its own copy of the logits (Note [Logits must be finite]), group rank 0
// samples, and one all_reduce (min) of {first non-finite logit or INT64_MAX, rank 0's token or
// INT64_MAX} tells every rank both: any rank's non-finite logit fails every rank with the same
// message, and otherwise every rank takes rank 0's token. 16 bytes per token (the 8-byte
// broadcast it replaced cost the same), a few microseconds against a forward.
absl::StatusOr<int64_t> AgreeOnToken(absl::Span<const float> logits, const SamplingOptions& o,
                                     int64_t step, Communicator* comm) {
  // The same on every rank: return without communicating.
  if (logits.empty()) return absl::InvalidArgumentError("no logits to pick a token from");
  DT_RETURN_IF_ERROR(o.Validate());
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  const int64_t bad = FirstNonFinite(logits).value_or(kNone);
  const bool lead = comm == nullptr || comm->rank() == 0;
  int64_t verdict[2] = {bad, lead && bad == kNone ? SampleFinite(logits, o, step) : kNone};
  if (comm != nullptr && comm->size() > 1) {
    DT_ASSIGN_OR_RETURN(Tensor t, Tensor::FromVector<int64_t>({2}, {verdict[0], verdict[1]}));
    DT_RETURN_IF_ERROR(comm->AllReduce(t, ReduceOp::kMin));
    verdict[0] = t.data<int64_t>()[0];
    verdict[1] = t.data<int64_t>()[1];
  }
  if (verdict[0] != kNone) return NonFiniteError(verdict[0], static_cast<int64_t>(logits.size()));
  return verdict[1];
}

}  // namespace dt::nn
