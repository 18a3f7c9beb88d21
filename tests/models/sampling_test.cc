// nn/models/sampling: greedy, and the sampling distribution against softmax computed here;
// non-finite logits refused (Note [Logits must be finite]); AgreeOnToken on vocab-sharded logits
// gathered over 1, 2 and 3 thread ranks: the same token or the same error on every rank and at
// every tp, ties and non-finite values included (Note [Agreeing on tokens]).
#include "dtensor/nn/models/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/random.h"
#include "dtensor/core/status.h"
#include "dtensor/dtensor/dtensor.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/world.h"
#include "dtensor/ops/value.h"
#include "dtensor/tests/test_util.h"
#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"

namespace dt::nn {
namespace {

using dt::testing::Contains;

TEST(Sampling, GreedyIsTheFirstMaximum) {
  EXPECT_EQ(SampleToken({0.f, 3.f, 1.f, 3.f}, {}, 0).value(), 1);
  EXPECT_EQ(SampleToken({-1.f}, {}, 5).value(), 0);
  EXPECT_FALSE(SampleToken({}, {}, 0).ok());
}

TEST(Sampling, TopKOneIsGreedy) {
  SamplingOptions o;
  o.greedy = false;
  o.top_k = 1;
  for (int step = 0; step < 20; ++step) {
    EXPECT_EQ(SampleToken({0.f, 3.f, 1.f, 2.9f}, o, step).value(), 1);
  }
}

TEST(Sampling, FrequenciesFollowTheTemperedSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
  SamplingOptions o;
  o.greedy = false;
  o.temperature = 0.7;
  o.seed = 42;
  const int n = 20000;
  std::vector<int> count(logits.size());
  for (int step = 0; step < n; ++step) ++count[SampleToken(logits, o, step).value()];
  double z = 0;
  for (float l : logits) z += std::exp(l / 0.7);
  for (size_t i = 0; i < logits.size(); ++i) {
    const double p = std::exp(logits[i] / 0.7) / z;
    EXPECT_NEAR(count[i] / double(n), p, 4 * std::sqrt(p * (1 - p) / n) + 1e-3) << i;
  }
}

TEST(Sampling, TopKAndTopPRestrictTheSupport) {
  const std::vector<float> logits = {3.0f, 2.9f, 0.0f, -5.0f, 2.0f};
  SamplingOptions o;
  o.greedy = false;
  o.top_k = 3;  // {0, 1, 4}
  for (int step = 0; step < 500; ++step) {
    const int64_t t = SampleToken(logits, o, step).value();
    EXPECT_TRUE(t == 0 || t == 1 || t == 4) << t;
  }
  o.top_k = 0;
  o.top_p = 0.5;  // token 0 alone has ~0.45 of the mass, so {0, 1}
  std::vector<int> seen(logits.size());
  for (int step = 0; step < 500; ++step) ++seen[SampleToken(logits, o, step).value()];
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_EQ(seen[2] + seen[3] + seen[4], 0);
  // Same (logits, options, step): same token, in any process and run (values from one run; a
  // change of the RNG or of the sampling arithmetic changes them).
  EXPECT_EQ(SampleToken(logits, o, 7).value(), 1);
  std::vector<int64_t> first;
  for (int step = 0; step < 12; ++step) first.push_back(SampleToken(logits, o, step).value());
  EXPECT_EQ(first, (std::vector<int64_t>{0, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1}));
}

TEST(Sampling, RejectsBadOptions) {
  SamplingOptions o;
  o.greedy = false;
  o.temperature = 0;
  EXPECT_FALSE(SampleToken({1.f, 2.f}, o, 0).ok());
  o.temperature = 1;
  o.top_p = 1.5;
  EXPECT_FALSE(SampleToken({1.f, 2.f}, o, 0).ok());
  o.top_p = 1;
  EXPECT_FALSE(SampleToken({-INFINITY, NAN}, o, 0).ok());
  o.temperature = NAN;
  EXPECT_TRUE(Contains(SampleToken({1.f, 2.f}, o, 0).status(), "temperature must be finite"));
  o.temperature = INFINITY;
  EXPECT_FALSE(SampleToken({1.f, 2.f}, o, 0).ok());
  o.temperature = 1;
  o.top_p = NAN;
  EXPECT_TRUE(Contains(SampleToken({1.f, 2.f}, o, 0).status(), "top_p must be in (0, 1]"));
  o.top_p = 1;
  o.top_k = -1;
  EXPECT_TRUE(Contains(SampleToken({1.f, 2.f}, o, 0).status(), "top_k must be >= 0"));
}

// Note [Logits must be finite]: greedy or sampled, the first non-finite logit is named.
TEST(Sampling, NonFiniteLogitsAreRefusedNamingTheFirst) {
  SamplingOptions sampled;
  sampled.greedy = false;
  for (const SamplingOptions& o : {SamplingOptions(), sampled}) {
    EXPECT_TRUE(Contains(SampleToken({1.f, NAN, 2.f, INFINITY}, o, 0).status(),
                         "the logits are not finite: logit 1 of 4 is NaN"));
    EXPECT_TRUE(Contains(SampleToken({1.f, 3.f, INFINITY}, o, 0).status(),
                         "logit 2 of 3 is +inf"));
    EXPECT_TRUE(Contains(SampleToken({-INFINITY, 0.f}, o, 0).status(), "logit 0 of 2 is -inf"));
    // A NaN where `>` would have let partial_sort or the argmax skip it.
    EXPECT_FALSE(SampleToken({5.f, 4.f, 3.f, NAN}, o, 0).ok());
  }
}

// The values a generated logit takes: few, so that ties are common.
rc::Gen<float> TiedLogit() { return rc::gen::element(-2.f, -0.5f, 0.f, 0.5f, 1.f, 3.f); }

// Greedy and top-k 1 are the lowest id among the maxima; a top-k draw is among the k first in
// the order (larger first, ties by lower id), computed here by a full sort.
RC_GTEST_PROP(Sampling, TiesAreBrokenByLowerId, ()) {
  const auto logits = *rc::gen::nonEmpty(rc::gen::container<std::vector<float>>(TiedLogit()));
  const int64_t n = static_cast<int64_t>(logits.size());
  const float top = *std::max_element(logits.begin(), logits.end());
  const int64_t first_max = std::find(logits.begin(), logits.end(), top) - logits.begin();
  RC_ASSERT(SampleToken(logits, {}, 0).value() == first_max);
  SamplingOptions o;
  o.greedy = false;
  o.top_k = *rc::gen::inRange<int64_t>(1, n + 2);
  o.temperature = *rc::gen::element(0.25, 1.0, 4.0);
  o.top_p = *rc::gen::element(0.3, 0.9, 1.0);
  o.seed = *rc::gen::arbitrary<uint32_t>();
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  order.resize(std::min(o.top_k, n));
  for (int step = 0; step < 8; ++step) {
    const int64_t t = SampleToken(logits, o, step).value();
    RC_ASSERT(std::find(order.begin(), order.end(), t) != order.end());
    if (o.top_k == 1) RC_ASSERT(t == first_max);
  }
}

// The draw written from its definition over a full sort of the vocabulary (Note [Candidates in
// order without sorting the vocabulary]: the normalizer over the whole vocabulary summed in id
// order, over top_k < it in candidate order), with -0 and +0 equal.
int64_t FullSortDraw(const std::vector<float>& logits, const SamplingOptions& o, int64_t step) {
  const int64_t n = static_cast<int64_t>(logits.size());
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, n) : n;
  const double top = logits[order[0]];
  auto p = [&](int64_t id) { return std::exp((logits[id] - top) / o.temperature); };
  // The candidates' weights in order, their running sums (the CDF before normalizing) and their
  // running shares of the normalizer (what top-p cuts).
  std::vector<double> w(k), cdf(k), share(k);
  for (int64_t i = 0; i < k; ++i) w[i] = p(order[i]);
  std::partial_sum(w.begin(), w.end(), cdf.begin());
  double total = cdf.back();
  if (k == n) {
    total = 0;
    for (int64_t id = 0; id < n; ++id) total += p(id);
  }
  std::transform(w.begin(), w.end(), share.begin(), [&](double x) { return x / total; });
  std::partial_sum(share.begin(), share.end(), share.begin());
  int64_t keep = k;
  if (o.top_p < 1) {
    keep = std::min<int64_t>(k, std::find_if(share.begin(), share.end(),
                                             [&](double m) { return m >= o.top_p; }) - share.begin() + 1);
  }
  const double kept = keep < k ? cdf[keep - 1] : total;
  const double u = UniformAt(o.seed, static_cast<uint64_t>(step)) * kept;
  const int64_t at = std::upper_bound(cdf.begin(), cdf.begin() + keep, u) - cdf.begin();
  return order[std::min(at, keep - 1)];
}

// Sampled tokens are the full sort's draw, over vocabularies from one token to past the first
// candidates the sampler sorts (64) and their doublings, with ties, signed zeros and a spread that
// makes draws reach deep.
RC_GTEST_PROP(Sampling, DrawsAreTheFullSortsDraw, ()) {
  const int64_t n = *rc::gen::inRange<int64_t>(1, 1200);
  const float spread = *rc::gen::element(0.01f, 1.f, 8.f);
  std::vector<float> logits(n);
  for (float& v : logits) {
    v = *rc::gen::element(0, 1, 2) == 0 ? *TiedLogit() * (*rc::gen::arbitrary<bool>() ? 1 : -1)
                                        : *rc::gen::inRange(-1000, 1000) / 1000.f * spread;
  }
  SamplingOptions o;
  o.greedy = false;
  o.top_k = *rc::gen::element<int64_t>(0, 0, 1, 40, *rc::gen::inRange<int64_t>(1, n + 2));
  o.temperature = *rc::gen::element(0.25, 1.0, 4.0);
  o.top_p = *rc::gen::element(0.3, 0.9, 0.99, 1.0);
  o.seed = *rc::gen::arbitrary<uint32_t>();
  for (int step = 0; step < 8; ++step) {
    RC_ASSERT(SampleToken(logits, o, step).value() == FullSortDraw(logits, o, step));
  }
}

// What each rank of a run returned: "token N" or the error.
std::string Outcome(const absl::StatusOr<int64_t>& r) {
  return r.ok() ? absl::StrCat("token ", *r) : r.status().ToString();
}

// The logits sharded over the vocab on `tp` thread ranks (as a colwise lm_head leaves them),
// gathered whole on every rank (as CausalLM::Logits does), then AgreeOnToken over the mesh;
// `poison_rank` (if >= 0) gets a NaN at `poison_at` in its gathered copy (a backend whose
// reductions differ by rank). Every rank's outcome, by rank.
std::vector<std::string> OnRanks(int tp, const std::vector<float>& logits, const SamplingOptions& o,
                                 int64_t step, int poison_rank = -1, int64_t poison_at = 0) {
  std::vector<std::string> outcomes(tp);
  std::mutex mu;
  const absl::Status s = World::RunThreads(tp, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {tp}, {"tp"}));
    DT_ASSIGN_OR_RETURN(Tensor full, Tensor::FromVector<float>(
                                         {static_cast<int64_t>(logits.size())}, logits));
    DT_ASSIGN_OR_RETURN(DTensor sharded, DTensor::Distribute(full, mesh, {Placement::Shard(0)},
                                                             std::nullopt));
    DT_ASSIGN_OR_RETURN(Tensor gathered, WholeTensor(Value(sharded)));
    DT_ASSIGN_OR_RETURN(gathered, gathered.Contiguous());
    std::vector<float> mine = gathered.ToVector<float>();
    if (w.rank() == poison_rank) mine[poison_at] = NAN;
    DT_ASSIGN_OR_RETURN(CommPtr comm, mesh.Comm(0));
    const absl::StatusOr<int64_t> token = AgreeOnToken(mine, o, step, comm.get());
    std::lock_guard<std::mutex> lock(mu);
    outcomes[w.rank()] = Outcome(token);
    return absl::OkStatus();
  });
  if (!s.ok()) outcomes.assign(tp, absl::StrCat("the run failed: ", s.ToString()));
  return outcomes;
}

// The same seed at tp 1, 2 and 3 on random logits with ties and non-finite values: identical
// tokens or the identical error on every rank and at every tp; the error names the lowest
// non-finite id, a token is what SampleToken gives on one rank.
RC_GTEST_PROP(Sampling, EveryRankAndTpAgreeOnTheTokenOrTheError, ()) {
  auto logit = rc::gen::weightedOneOf<float>(
      {{40, TiedLogit()},
       {1, rc::gen::element(std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY)}});
  const auto logits = *rc::gen::resize(
      24, rc::gen::nonEmpty(rc::gen::container<std::vector<float>>(logit)));
  const int64_t n = static_cast<int64_t>(logits.size());
  SamplingOptions o;
  o.greedy = *rc::gen::arbitrary<bool>();
  o.top_k = *rc::gen::inRange<int64_t>(0, n + 2);
  o.temperature = *rc::gen::element(0.25, 1.0, 4.0);
  o.top_p = *rc::gen::element(0.3, 0.9, 1.0);
  o.seed = *rc::gen::arbitrary<uint32_t>();
  const int64_t step = *rc::gen::inRange<int64_t>(0, 1000);
  const int64_t bad = std::find_if(logits.begin(), logits.end(),
                                   [](float v) { return !std::isfinite(v); }) -
                      logits.begin();
  const char* kind = bad == n                ? ""
                     : std::isnan(logits[bad]) ? "NaN"
                     : logits[bad] > 0         ? "+inf"
                                               : "-inf";
  const std::string want =
      bad < n ? absl::StrCat("INVALID_ARGUMENT: the logits are not finite: logit ", bad, " of ", n,
                             " is ", kind)
              : Outcome(SampleToken(logits, o, step));
  RC_CLASSIFY(bad < n, "non-finite");
  for (int tp = 1; tp <= 3; ++tp) {
    const std::vector<std::string> got = OnRanks(tp, logits, o, step);
    for (int r = 0; r < tp; ++r) RC_ASSERT(got[r] == want);
  }
  // One rank's copy differs (a NaN only it sees): every rank fails alike, naming the lowest
  // non-finite id any rank saw.
  const int tp = *rc::gen::inRange(2, 4);
  const int poison_rank = *rc::gen::inRange(0, tp);
  const int64_t at = *rc::gen::inRange<int64_t>(0, n);
  const std::vector<std::string> got = OnRanks(tp, logits, o, step, poison_rank, at);
  const int64_t lowest = std::min(bad, at);
  RC_ASSERT(Contains(got[0], absl::StrCat("logit ", lowest, " of ", n, " is ")));
  for (int r = 1; r < tp; ++r) RC_ASSERT(got[r] == got[0]);
}

}  // namespace
}  // namespace dt::nn
