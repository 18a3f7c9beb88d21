#include "dtensor/nn/models/sampling.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
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
// the minimum over ranks is the lowest id any rank saw; nullopt when all are finite. A float is
// finite unless its exponent bits are all ones: one branch-free pass over the bits (it
// vectorizes) answers for the whole vocabulary, and only a bad one is looked for.
std::optional<int64_t> FirstNonFinite(absl::Span<const float> logits) {
  uint32_t bad = 0;
  for (const float v : logits) {
    bad |= (std::bit_cast<uint32_t>(v) & 0x7f800000u) == 0x7f800000u;
  }
  if (bad == 0) return std::nullopt;
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

// The lowest id of the largest of finite logits: the maximum in eight independent lanes (finite
// values: the same maximum in any order, and no chain of compares through the running best's
// index), then the first id that holds it.
int64_t Argmax(absl::Span<const float> logits) {
  constexpr size_t kLanes = 8;
  const size_t n = logits.size();
  float lane[kLanes];
  std::fill(lane, lane + kLanes, logits[0]);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lane[j] = std::max(lane[j], logits[i + j]);
  }
  for (; i < n; ++i) lane[0] = std::max(lane[0], logits[i]);
  const float best = *std::max_element(lane, lane + kLanes);
  return std::find(logits.begin(), logits.end(), best) - logits.begin();
}

// Note [Candidates in order without sorting the vocabulary]
// Sampling walks the candidates larger logit first, equal ones by lower id, but a draw reaches
// few of them: sorting a vocabulary of 49152 for every token (what top_k 0, OpenAI's default,
// asked of a partial_sort) cost milliseconds a token, as much as the forward of a small model.
// So each candidate is one integer whose ascending order is that order (the logit's bits made
// monotone, then inverted, above the id), and the walk sorts only as far as it goes: the first
// 64, then twice as many each time it needs more (a partial_sort of the rest: a heap of the
// few, which most keys only pass by). The token is the one the full sort gives. The softmax's
// normalizer over the whole vocabulary (top_k 0) is summed in id order, which needs no order at
// all; over top_k < the vocabulary it is summed in candidate order (those are sorted anyway).
// The keys live in a buffer of the thread's, kept between tokens: a fresh 400 KB vector a token
// is a fresh mapping whose pages fault in each time.
class Ranked {
 public:
  explicit Ranked(absl::Span<const float> logits) : keys_(Buffer()) {
    keys_.resize(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) {
      // -0 as +0 (they compare equal); then the bits ascend with the value; inverted: descend.
      const uint32_t bits = std::bit_cast<uint32_t>(logits[i] == 0 ? 0.0f : logits[i]);
      const uint32_t ascending = bits & 0x80000000u ? ~bits : bits | 0x80000000u;
      keys_[i] = uint64_t{~ascending} << 32 | static_cast<uint32_t>(i);
    }
  }
  // The id of the i-th candidate (i < the vocabulary).
  int64_t at(size_t i) {
    if (i >= sorted_) {
      const size_t upto = std::min(keys_.size(), std::max({i + 1, 2 * sorted_, size_t{64}}));
      std::partial_sort(keys_.begin() + sorted_, keys_.begin() + upto, keys_.end());
      sorted_ = upto;
    }
    return static_cast<int64_t>(keys_[i] & 0xffffffffu);
  }

 private:
  static std::vector<uint64_t>& Buffer() {
    thread_local std::vector<uint64_t> keys;
    return keys;
  }
  std::vector<uint64_t>& keys_;
  size_t sorted_ = 0;  // keys_[0, sorted_) are the first candidates, in order
};

// SampleToken on validated options and finite, non-empty logits (Note [Logits must be finite]).
int64_t SampleFinite(absl::Span<const float> logits, const SamplingOptions& o, int64_t step) {
  const int64_t n = static_cast<int64_t>(logits.size());
  if (o.greedy) return Argmax(logits);
  // Note [Candidates in order without sorting the vocabulary]
  Ranked ranked(logits);
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, n) : n;
  const double top = logits[ranked.at(0)];
  auto p = [&](int64_t i) { return std::exp((logits[ranked.at(i)] - top) / o.temperature); };
  double total = 0;
  if (k == n) {
    for (int64_t id = 0; id < n; ++id) total += std::exp((logits[id] - top) / o.temperature);
  } else {
    for (int64_t i = 0; i < k; ++i) total += p(i);
  }
  // top-p: the smallest prefix whose mass reaches top_p (at least one token).
  int64_t keep = k;
  double kept = total;
  if (o.top_p < 1) {
    double mass = 0, sum = 0;
    for (int64_t i = 0; i < k; ++i) {
      const double pi = p(i);
      sum += pi;
      mass += pi / total;
      if (mass >= o.top_p) {
        keep = i + 1;
        if (keep < k) kept = sum;
        break;
      }
    }
  }
  const double u = UniformAt(o.seed, static_cast<uint64_t>(step)) * kept;
  double acc = 0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += p(i);
    if (u < acc) return ranked.at(i);
  }
  return ranked.at(keep - 1);
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
