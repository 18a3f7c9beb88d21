#include <random>
#include <tuple>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/ops/local/test_util.h"
#include "dtensor/tests/test_util.h"

namespace dt::ops {
namespace {

using testing::RandomShape;
using testing::RandomTensor;

// Naive batched matmul in double with numpy broadcasting over batch dims. a is [..., M, K] (or
// [..., K, M] when trans_a), b is [..., K, N] (or [..., N, K]).
std::vector<double> NaiveMatmul(const Tensor& a, const Tensor& b, bool ta, bool tb, Shape* out_shape,
                                double* scale) {
  const std::vector<double> av = a.ToDoubles(), bv = b.ToDoubles();
  const int64_t m = ta ? a.size(-1) : a.size(-2), k = ta ? a.size(-2) : a.size(-1);
  const int64_t n = tb ? b.size(-2) : b.size(-1);
  const Shape ab(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  Shape batch = BroadcastShapes(ab, bb).value();
  *out_shape = batch;
  out_shape->insert(out_shape->end(), {m, n});
  std::vector<double> out(static_cast<size_t>(Numel(*out_shape)));
  *scale = std::sqrt(static_cast<double>(std::max<int64_t>(k, 1)));
  for (int64_t bi = 0; bi < Numel(batch); ++bi) {
    const Shape idx = testing::Unravel(bi, batch);
    const int64_t ao = testing::BroadcastFlat(idx, ab) * m * k, bo = testing::BroadcastFlat(idx, bb) * k * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t l = 0; l < k; ++l) {
          s += av[ao + (ta ? l * m + i : i * k + l)] * bv[bo + (tb ? j * k + l : l * n + j)];
        }
        out[(bi * m + i) * n + j] = s;
      }
    }
  }
  return out;
}

RC_GTEST_PROP(MatmulTest, AgreesWithNaiveLoops, ()) {
  const DType dtype = testing::RandomFloatDType();
  const bool ta = *rc::gen::arbitrary<bool>(), tb = *rc::gen::arbitrary<bool>();
  const int64_t m = *rc::gen::inRange<int64_t>(0, 9), n = *rc::gen::inRange<int64_t>(0, 9),
                k = *rc::gen::inRange<int64_t>(0, 9);
  // Batch dims: each of a and b gets a suffix of `batch`, with some dims set to 1.
  const Shape batch = RandomShape(*rc::gen::inRange(0, 3), 1, 3);
  auto operand_batch = [&] {
    const size_t drop = *rc::gen::inRange<size_t>(0, batch.size() + 1);
    Shape s(batch.begin() + drop, batch.end());
    for (int64_t& d : s) d = *rc::gen::arbitrary<bool>() ? d : 1;
    return s;
  };
  Shape as = operand_batch(), bs = operand_batch();
  as.insert(as.end(), {ta ? k : m, ta ? m : k});
  bs.insert(bs.end(), {tb ? n : k, tb ? k : n});
  const Tensor a = RandomTensor(as, dtype), b = RandomTensor(bs, dtype);
  Shape want_shape;
  double scale;
  const std::vector<double> want = NaiveMatmul(a, b, ta, tb, &want_shape, &scale);
  const Tensor got = Matmul(a, b, ta, tb).value();
  RC_ASSERT(got.dtype() == dtype);
  RC_ASSERT(got.is_contiguous());
  RC_ASSERT(testing::Mismatch(got, want_shape, want, testing::TolFor(dtype, scale)) == "");
}

RC_GTEST_PROP(LinearTest, AgreesWithNaiveLoops, ()) {
  const DType dtype = testing::RandomFloatDType();
  const int64_t in = *rc::gen::inRange<int64_t>(0, 9), out = *rc::gen::inRange<int64_t>(0, 9);
  Shape xs = RandomShape(*rc::gen::inRange(0, 3), 0, 4);
  xs.push_back(in);
  const bool with_bias = *rc::gen::arbitrary<bool>();
  const Tensor x = RandomTensor(xs, dtype), w = RandomTensor({out, in}, dtype);
  const Tensor bias = with_bias ? RandomTensor({out}, dtype) : Tensor();
  const std::vector<double> xv = x.ToDoubles(), wv = w.ToDoubles();
  const std::vector<double> bv = with_bias ? bias.ToDoubles() : std::vector<double>();
  Shape want_shape(xs.begin(), xs.end() - 1);
  want_shape.push_back(out);
  const int64_t t = Numel(Shape(xs.begin(), xs.end() - 1));
  std::vector<double> want(static_cast<size_t>(t * out));
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double s = with_bias ? bv[o] : 0.0;
      for (int64_t i = 0; i < in; ++i) s += xv[r * in + i] * wv[o * in + i];
      want[r * out + o] = s;
    }
  }
  const Tensor got = Linear(x, w, bias).value();
  RC_ASSERT(testing::Mismatch(got, want_shape, want,
                              testing::TolFor(dtype, std::sqrt(static_cast<double>(in) + 1))) == "");
}

// Large enough to take the multi-threaded path (row panels, column panels, batches).
TEST(MatmulTest, LargeShapesAgreeWithNaiveLoops) {
  struct Case {
    Shape a, b;
    bool ta, tb;
    DType dtype;
  };
  const Case cases[] = {
      {{200, 96}, {96, 130}, false, false, DType::kF32},   // row panels
      {{70, 96}, {150, 96}, false, true, DType::kF32},     // column panels, b transposed
      {{3, 64, 80}, {80, 100}, false, false, DType::kBF16}, // folded batch
      {{4, 80, 64}, {4, 80, 90}, true, false, DType::kF16}, // batches, a transposed
  };
  for (const Case& c : cases) {
    std::mt19937_64 rng(7);
    auto make = [&](const Shape& s) {
      std::vector<double> v(static_cast<size_t>(Numel(s)));
      std::normal_distribution<double> normal;
      for (double& x : v) x = normal(rng);
      return Tensor::FromDoubles(s, v, c.dtype).value();
    };
    const Tensor a = make(c.a), b = make(c.b);
    Shape want_shape;
    double scale;
    const std::vector<double> want = NaiveMatmul(a, b, c.ta, c.tb, &want_shape, &scale);
    const Tensor got = Matmul(a, b, c.ta, c.tb).value();
    EXPECT_EQ(testing::Mismatch(got, want_shape, want, testing::TolFor(c.dtype, scale)), "")
        << ShapeToString(c.a) << " x " << ShapeToString(c.b);
  }
}

// Linear on the multi-threaded path: the bias is added per row panel and per column panel.
TEST(LinearTest, LargeShapesWithBias) {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> normal;
  auto make = [&](const Shape& s, DType dtype) {
    std::vector<double> v(static_cast<size_t>(Numel(s)));
    for (double& x : v) x = normal(rng);
    return Tensor::FromDoubles(s, v, dtype).value();
  };
  for (const auto& [rows, out, dtype] : {std::tuple<int64_t, int64_t, DType>{300, 200, DType::kF32},
                                         {150, 400, DType::kBF16}}) {
    const int64_t in = 64;
    const Tensor x = make({rows, in}, dtype), w = make({out, in}, dtype), b = make({out}, dtype);
    const std::vector<double> xv = x.ToDoubles(), wv = w.ToDoubles(), bv = b.ToDoubles();
    std::vector<double> want(static_cast<size_t>(rows * out));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < out; ++o) {
        double acc = bv[o];
        for (int64_t i = 0; i < in; ++i) acc += xv[r * in + i] * wv[o * in + i];
        want[r * out + o] = acc;
      }
    }
    EXPECT_EQ(testing::Mismatch(Linear(x, w, b).value(), {rows, out}, want, testing::TolFor(dtype, 8)), "");
  }
}

TEST(MatmulTest, Golden) {
  const Tensor a = Tensor::FromVector<float>({2, 2}, {1, 2, 3, 4}).value();
  const Tensor b = Tensor::FromVector<float>({2, 2}, {5, 6, 7, 8}).value();
  EXPECT_EQ(Matmul(a, b).value().ToVector<float>(), (std::vector<float>{19, 22, 43, 50}));
  EXPECT_EQ(Matmul(a, b, true, false).value().ToVector<float>(), (std::vector<float>{26, 30, 38, 44}));
  EXPECT_EQ(Matmul(a, b, false, true).value().ToVector<float>(), (std::vector<float>{17, 23, 39, 53}));
  // y = x·wᵀ + b: x [1, 2], w [3, 2].
  const Tensor x = Tensor::FromVector<float>({1, 2}, {1, -1}).value();
  const Tensor w = Tensor::FromVector<float>({3, 2}, {1, 2, 3, 4, 5, 7}).value();
  const Tensor bias = Tensor::FromVector<float>({3}, {10, 20, 30}).value();
  EXPECT_EQ(Linear(x, w, bias).value().ToVector<float>(), (std::vector<float>{9, 19, 28}));
  // K = 0: zeros plus bias.
  const Tensor x0 = Tensor::Empty({2, 0}).value(), w0 = Tensor::Empty({3, 0}).value();
  EXPECT_EQ(Linear(x0, w0, bias).value().ToVector<float>(), (std::vector<float>{10, 20, 30, 10, 20, 30}));
}

TEST(MatmulTest, Errors) {
  const Tensor a = Tensor::Zeros({2, 3}).value(), b = Tensor::Zeros({4, 5}).value();
  auto s = Matmul(a, b).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dt::testing::Contains(s, "Matmul: inner dims differ"));
  EXPECT_TRUE(dt::testing::Contains(s, "(3 vs 4)"));
  s = Matmul(a, Tensor::Zeros({3, 4}, DType::kBF16).value()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dt::testing::Contains(s, "Matmul: dtypes differ"));
  s = Matmul(Tensor::Zeros({3}).value(), b).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Matmul: a must have at least 2 dims"));
  s = Matmul(Tensor::Zeros({2, 2, 3}).value(), Tensor::Zeros({3, 3, 4}).value()).status();
  EXPECT_TRUE(dt::testing::Contains(s, "do not broadcast"));
  s = Matmul(Tensor::Zeros({2, 3}, DType::kI64).value(), Tensor::Zeros({3, 4}, DType::kI64).value()).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Matmul: a must be f32, bf16 or f16"));
  s = Linear(a, Tensor::Zeros({4, 2}).value()).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Linear: w must have shape [out, 3]"));
  s = Linear(a, Tensor::Zeros({4, 3}).value(), Tensor::Zeros({3}).value()).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Linear: bias must have shape [4]"));
  s = Linear(Tensor(), a).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Linear: x is an undefined tensor"));
}

}  // namespace
}  // namespace dt::ops
