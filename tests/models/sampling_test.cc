// nn/models/sampling: greedy, and the sampling distribution against softmax computed here.
#include "dtensor/nn/models/sampling.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace dt::nn {
namespace {

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
}

}  // namespace
}  // namespace dt::nn
