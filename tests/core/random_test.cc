// Counter-based RNG: any slice of a global random tensor equals the same slice of the full tensor.

#include <cmath>
#include <numeric>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "dtensor/core/random.h"
#include "dtensor/tests/test_util.h"

namespace dt {
namespace {

RC_GTEST_PROP(RandomTest, SliceOfAnyIndicesEqualsSliceOfFullTensor, ()) {
  Shape shape;
  for (int i = *rc::gen::inRange(0, 4); i > 0; --i) shape.push_back(*rc::gen::inRange<int64_t>(0, 6));
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  const Distribution dist = *rc::gen::element(Distribution::kUniform, Distribution::kNormal);
  const DType dtype = *rc::gen::element(DType::kF32, DType::kBF16, DType::kF16);
  // Any index lists: subsets, out of order, repeated.
  std::vector<std::vector<int64_t>> idx(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) continue;
    for (int n = *rc::gen::inRange(0, 5); n > 0; --n) idx[d].push_back(*rc::gen::inRange<int64_t>(0, shape[d]));
  }
  const Tensor full = (dist == Distribution::kUniform ? Tensor::Rand(shape, seed, dtype)
                                                      : Tensor::Randn(shape, seed, dtype)).value();
  const Tensor slice = RandomSlice(shape, idx, seed, dist, dtype).value();
  Shape slice_shape;
  for (const auto& l : idx) slice_shape.push_back(static_cast<int64_t>(l.size()));
  RC_ASSERT(slice.shape() == slice_shape);
  RC_ASSERT(slice.dtype() == dtype);
  const std::vector<double> fv = full.ToDoubles(), sv = slice.ToDoubles();
  const Shape fstr = ContiguousStrides(shape);
  for (int64_t i = 0; i < slice.numel(); ++i) {
    int64_t rem = i, flat = 0;
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      flat += idx[d][rem % slice_shape[d]] * fstr[d];
      rem /= slice_shape[d];
    }
    RC_ASSERT(sv[i] == fv[flat]);
    // And the element is the pure function of (seed, flat index), rounded to the dtype.
    const float direct = dist == Distribution::kUniform ? UniformAt(seed, flat) : NormalAt(seed, flat);
    const Tensor one = Tensor::FromVector<float>({1}, {direct}).value().To(dtype).value();
    RC_ASSERT(sv[i] == one.ToDoubles()[0]);
  }
}

TEST(RandomTest, Distributions) {
  const int64_t n = 100000;
  const std::vector<double> u = Tensor::Rand({n}, 42).value().ToDoubles();
  const std::vector<double> z = Tensor::Randn({n}, 42).value().ToDoubles();
  double us = 0, zs = 0, zz = 0;
  for (double v : u) {
    ASSERT_GE(v, 0.0);
    ASSERT_LT(v, 1.0);
    us += v;
  }
  for (double v : z) {
    ASSERT_TRUE(std::isfinite(v));
    zs += v;
    zz += v * v;
  }
  EXPECT_NEAR(us / n, 0.5, 0.01);
  EXPECT_NEAR(zs / n, 0.0, 0.02);
  EXPECT_NEAR(zz / n, 1.0, 0.02);
  // Deterministic in the seed; different seeds differ.
  EXPECT_TRUE(Equal(Tensor::Rand({3, 4}, 7).value(), Tensor::Rand({3, 4}, 7).value()));
  EXPECT_FALSE(Equal(Tensor::Rand({3, 4}, 7).value(), Tensor::Rand({3, 4}, 8).value()));
}

TEST(RandomTest, Errors) {
  const std::vector<std::vector<int64_t>> idx = {{0, 4}};
  auto s = RandomSlice({4}, idx, 1, Distribution::kUniform).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(dt::testing::Contains(s, "RandomSlice: index 4 out of range for dim 0 of [4]"));
  s = RandomSlice({4, 2}, idx, 1, Distribution::kUniform).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dt::testing::Contains(s, "RandomSlice: 1 index lists for shape [4, 2]"));
  s = Tensor::Rand({2, -1}, 1).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Rand: negative size"));
}

}  // namespace
}  // namespace dt
