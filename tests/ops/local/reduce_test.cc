#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/ops/local/test_util.h"
#include "dtensor/tests/test_util.h"

namespace dt::ops {
namespace {

using testing::RandomShape;
using testing::RandomTensor;

// For each output position (x's shape without dim d), the n values of x along d.
std::vector<std::vector<double>> Lanes(const Tensor& x, int d, Shape* out_shape) {
  const std::vector<double> v = x.ToDoubles();
  *out_shape = x.shape();
  out_shape->erase(out_shape->begin() + d);
  std::vector<std::vector<double>> lanes(static_cast<size_t>(Numel(*out_shape)));
  for (int64_t i = 0; i < x.numel(); ++i) {
    Shape idx = testing::Unravel(i, x.shape());
    idx.erase(idx.begin() + d);
    lanes[testing::FlatIndex(idx, *out_shape)].push_back(v[i]);
  }
  return lanes;
}

RC_GTEST_PROP(ReduceTest, AgreesWithNaiveLoops, ()) {
  const Reduction op = *rc::gen::element(Reduction::kSum, Reduction::kMean, Reduction::kMax, Reduction::kArgmax);
  const DType dtype = op == Reduction::kMean
                          ? testing::RandomFloatDType()
                          : *rc::gen::element(DType::kF32, DType::kBF16, DType::kF16, DType::kI64,
                                              DType::kI32, DType::kU8);
  const int rank = *rc::gen::inRange(1, 5);
  const Shape shape = RandomShape(rank, 0, 5);
  const int d = *rc::gen::inRange(0, rank);
  const bool keepdim = *rc::gen::arbitrary<bool>();
  const bool ties = op == Reduction::kMax || op == Reduction::kArgmax;
  const Tensor x = RandomTensor(shape, dtype, ties ? testing::Values::kSmallInts : testing::Values::kNormal);
  const int64_t dim_arg = *rc::gen::arbitrary<bool>() ? d : d - rank;
  auto got = Reduce(op, x, dim_arg, keepdim);
  if ((op == Reduction::kMax || op == Reduction::kArgmax) && shape[d] == 0) {
    RC_ASSERT(got.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  Shape out_shape;
  const auto lanes = Lanes(x, d, &out_shape);
  std::vector<double> want;
  for (const auto& lane : lanes) {
    const double sum = std::accumulate(lane.begin(), lane.end(), 0.0);
    switch (op) {
      case Reduction::kSum: want.push_back(testing::RoundTo(dtype, sum)); break;
      case Reduction::kMean: want.push_back(testing::RoundTo(dtype, sum / lane.size())); break;
      case Reduction::kMax: want.push_back(*std::max_element(lane.begin(), lane.end())); break;
      case Reduction::kArgmax: want.push_back(std::max_element(lane.begin(), lane.end()) - lane.begin()); break;
    }
  }
  if (keepdim) out_shape.insert(out_shape.begin() + d, 1);
  const Tensor y = got.value();
  const bool i64_out = op == Reduction::kArgmax || (op == Reduction::kSum && !IsFloating(dtype));
  RC_ASSERT(y.dtype() == (i64_out ? DType::kI64 : dtype));
  RC_ASSERT(testing::Mismatch(y, out_shape, want, testing::TolFor(dtype)) == "");
}

TEST(ReduceTest, GoldenAndNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor x = Tensor::FromVector<float>({2, 3}, {1, 5, 5, nan, 2, 9}).value();
  EXPECT_EQ(Sum(x, 0).value().ToVector<float>()[1], 7.0f);
  EXPECT_EQ(Mean(x, 1, true).value().shape(), (Shape{2, 1}));
  EXPECT_NEAR(Mean(x, 1).value().ToVector<float>()[0], 11.0 / 3, 1e-6);
  const std::vector<float> mx = Max(x, -1).value().ToVector<float>();
  EXPECT_EQ(mx[0], 5.0f);
  EXPECT_TRUE(std::isnan(mx[1]));  // NaN propagates
  EXPECT_EQ(Argmax(x, 1).value().ToVector<int64_t>(), (std::vector<int64_t>{1, 0}));  // first max; NaN wins
  EXPECT_EQ(Sum(Tensor::FromVector<int32_t>({2}, {2147483647, 1}).value(), 0).value().ToVector<int64_t>(),
            (std::vector<int64_t>{2147483648LL}));  // integer sums are i64
  EXPECT_EQ(Sum(Tensor::Zeros({2, 0}).value(), 1).value().ToVector<float>(), (std::vector<float>{0, 0}));
  EXPECT_TRUE(std::isnan(Mean(Tensor::Zeros({1, 0}).value(), 1).value().ToVector<float>()[0]));
}

TEST(ReduceTest, Errors) {
  const Tensor x = Tensor::Zeros({2, 3}).value();
  auto s = Sum(x, 2).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dt::testing::Contains(s, "Sum: dim 2 is out of range for a tensor of 2 dims"));
  s = Max(Tensor::Zeros({2, 0}).value(), 1).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Max: cannot reduce the zero-size dim 1"));
  s = Mean(Tensor::Zeros({2}, DType::kI64).value(), 0).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Mean: x must be f32, bf16 or f16"));
  s = Argmax(Tensor::Zeros({2}, DType::kBool).value(), 0).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Argmax: x must not be bool"));
}

RC_GTEST_PROP(SoftmaxTest, AgreesWithNaiveLoops, ()) {
  const DType dtype = testing::RandomFloatDType();
  const bool log = *rc::gen::arbitrary<bool>();
  const int rank = *rc::gen::inRange(1, 4);
  const Shape shape = RandomShape(rank, 0, 6);
  const int d = *rc::gen::inRange(0, rank);
  const Tensor x = RandomTensor(shape, dtype);
  const Tensor y = (log ? LogSoftmax(x, d) : Softmax(x, d)).value();
  // Reference in double, written back in x's layout order.
  const std::vector<double> xv = x.ToDoubles();
  std::vector<double> want(xv.size());
  const int64_t n = shape[d];
  for (int64_t i = 0; i < x.numel(); ++i) {
    const Shape idx = testing::Unravel(i, shape);
    Shape j = idx;
    double mx = -INFINITY, sum = 0;
    for (j[d] = 0; j[d] < n; ++j[d]) mx = std::max(mx, xv[testing::FlatIndex(j, shape)]);
    for (j[d] = 0; j[d] < n; ++j[d]) sum += std::exp(xv[testing::FlatIndex(j, shape)] - mx);
    const double r = log ? xv[i] - mx - std::log(sum) : std::exp(xv[i] - mx) / sum;
    want[i] = testing::RoundTo(dtype, r);
  }
  testing::Tol tol = testing::TolFor(dtype);
  if (dtype == DType::kF32) tol = {1e-6, 1e-5};
  RC_ASSERT(testing::Mismatch(y, shape, want, tol) == "");
}

TEST(SoftmaxTest, Golden) {
  const Tensor x = Tensor::FromVector<float>({1, 2}, {0.0f, std::log(3.0f)}).value();
  const std::vector<float> p = Softmax(x, 1).value().ToVector<float>();
  EXPECT_NEAR(p[0], 0.25, 1e-7);
  EXPECT_NEAR(p[1], 0.75, 1e-7);
  EXPECT_NEAR(LogSoftmax(x, -1).value().ToVector<float>()[0], std::log(0.25), 1e-6);
  // Large inputs do not overflow.
  const Tensor big = Tensor::FromVector<float>({2}, {1000, 1000}).value();
  EXPECT_EQ(Softmax(big, 0).value().ToVector<float>(), (std::vector<float>{0.5, 0.5}));
  EXPECT_TRUE(dt::testing::Contains(Softmax(Tensor::Zeros({2}, DType::kI32).value(), 0).status(),
      "Softmax: x must be"));
}

RC_GTEST_PROP(TopKTest, AgreesWithStableSort, ()) {
  const DType dtype = *rc::gen::element(DType::kF32, DType::kBF16, DType::kF16, DType::kI64, DType::kI32);
  const int rank = *rc::gen::inRange(1, 4);
  const Shape shape = RandomShape(rank, 0, 6);
  const int d = *rc::gen::inRange(0, rank);
  const int64_t k = *rc::gen::inRange<int64_t>(0, shape[d] + 1);
  const bool largest = *rc::gen::arbitrary<bool>();
  Tensor x = RandomTensor(shape, dtype, testing::Values::kSmallInts);  // many ties
  if (dtype == DType::kF32 && x.numel() > 0 && *rc::gen::arbitrary<bool>()) {
    std::vector<double> v = x.ToDoubles();
    v[*rc::gen::inRange<size_t>(0, v.size())] = NAN;
    x = Tensor::FromDoubles(shape, v, dtype).value();
  }
  const TopKResult r = TopK(x, k, d, largest).value();
  // Reference: stable sort of the lane's indices (NaN above every number).
  const std::vector<double> xv = x.ToDoubles();
  Shape out_shape = shape;
  out_shape[d] = k;
  std::vector<double> want_v(static_cast<size_t>(Numel(out_shape))), want_i(want_v.size());
  auto key = [](double v) { return std::isnan(v) ? INFINITY : v; };
  for (int64_t o = 0; o < Numel(out_shape); ++o) {
    Shape idx = testing::Unravel(o, out_shape);
    if (idx[d] != 0) continue;
    std::vector<int64_t> order(static_cast<size_t>(shape[d]));
    std::iota(order.begin(), order.end(), 0);
    auto val = [&](int64_t i) {
      Shape j = idx;
      j[d] = i;
      return xv[testing::FlatIndex(j, shape)];
    };
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      const double ka = key(val(a)), kb = key(val(b));
      const bool na = std::isnan(val(a)), nb = std::isnan(val(b));
      if (largest) return (na && !nb) || (!na && !nb && ka > kb);
      return (!na && nb) || (!na && !nb && ka < kb);
    });
    for (int64_t i = 0; i < k; ++i) {
      Shape j = idx;
      j[d] = i;
      want_v[testing::FlatIndex(j, out_shape)] = val(order[i]);
      want_i[testing::FlatIndex(j, out_shape)] = static_cast<double>(order[i]);
    }
  }
  RC_ASSERT(r.indices.dtype() == DType::kI64);
  RC_ASSERT(testing::Mismatch(r.values, out_shape, want_v) == "");
  RC_ASSERT(testing::Mismatch(r.indices, out_shape, want_i) == "");
}

TEST(TopKTest, GoldenAndErrors) {
  const Tensor x = Tensor::FromVector<float>({5}, {3, 1, 4, 1, 5}).value();
  auto [v, i] = TopK(x, 3).value();
  EXPECT_EQ(v.ToVector<float>(), (std::vector<float>{5, 4, 3}));
  EXPECT_EQ(i.ToVector<int64_t>(), (std::vector<int64_t>{4, 2, 0}));
  auto small = TopK(x, 2, 0, false).value();
  EXPECT_EQ(small.values.ToVector<float>(), (std::vector<float>{1, 1}));
  EXPECT_EQ(small.indices.ToVector<int64_t>(), (std::vector<int64_t>{1, 3}));
  auto s = TopK(x, 6).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dt::testing::Contains(s, "TopK: k 6 is out of range for dim 0"));
}

}  // namespace
}  // namespace dt::ops
