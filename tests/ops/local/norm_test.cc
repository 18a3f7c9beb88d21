#include <cmath>
#include <vector>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/ops/local/test_util.h"
#include "dtensor/tests/test_util.h"

namespace dt::ops {
namespace {

using testing::RandomShape;
using testing::RandomTensor;

RC_GTEST_PROP(RmsNormTest, MatchesHuggingFaceLlama, ()) {
  const DType dtype = testing::RandomFloatDType();
  Shape shape = RandomShape(*rc::gen::inRange(0, 3), 0, 4);
  const int64_t h = *rc::gen::inRange<int64_t>(1, 17);
  shape.push_back(h);
  const bool with_weight = *rc::gen::arbitrary<bool>();
  const double eps = *rc::gen::element(1e-6, 1e-5, 0.5);
  const Tensor x = RandomTensor(shape, dtype);
  const Tensor w = with_weight ? RandomTensor({h}, dtype) : Tensor();
  const std::vector<double> xv = x.ToDoubles();
  const std::vector<double> wv = with_weight ? w.ToDoubles() : std::vector<double>();
  std::vector<double> want(xv.size());
  for (size_t r = 0; r < xv.size() / h; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < h; ++i) ss += xv[r * h + i] * xv[r * h + i];
    const double inv = 1 / std::sqrt(ss / h + eps);
    for (int64_t i = 0; i < h; ++i) {
      // HF: (x * rsqrt(mean(x²) + eps)).to(dtype), then weight * that, in dtype.
      const double n = testing::RoundTo(dtype, xv[r * h + i] * inv);
      want[r * h + i] = with_weight ? testing::RoundTo(dtype, wv[i] * n) : n;
    }
  }
  // One ulp of slack for each of the two roundings.
  testing::Tol tol = testing::TolFor(dtype, 0.1);
  tol.rtol *= 2;
  RC_ASSERT(testing::Mismatch(RmsNorm(x, w, eps).value(), shape, want, tol) == "");
}

// The weight multiplies the normalized x as rounded to its dtype (transformers' order), so with a
// weight RmsNorm is, bit for bit, the unweighted RmsNorm times the weight in that dtype.
RC_GTEST_PROP(RmsNormTest, WeightScalesTheRoundedNorm, ()) {
  const DType dtype = testing::RandomFloatDType();
  Shape shape = RandomShape(*rc::gen::inRange(0, 3), 0, 4);
  const int64_t h = *rc::gen::element<int64_t>(1, 7, 64, 300, 513);
  shape.push_back(h);
  const Tensor x = RandomTensor(shape, dtype), w = RandomTensor({h}, dtype);
  const Tensor got = RmsNorm(x, w, 1e-5).value();
  const Tensor want = Mul(RmsNorm(x, Tensor(), 1e-5).value(), w).value();
  RC_ASSERT(Equal(got, want));
}

RC_GTEST_PROP(LayerNormTest, AgreesWithNaiveLoops, ()) {
  const DType dtype = testing::RandomFloatDType();
  Shape shape = RandomShape(*rc::gen::inRange(0, 3), 0, 4);
  const int64_t h = *rc::gen::inRange<int64_t>(1, 17);
  shape.push_back(h);
  const bool with_weight = *rc::gen::arbitrary<bool>(), with_bias = *rc::gen::arbitrary<bool>();
  const Tensor x = RandomTensor(shape, dtype);
  const Tensor w = with_weight ? RandomTensor({h}, dtype) : Tensor();
  const Tensor b = with_bias ? RandomTensor({h}, dtype) : Tensor();
  const std::vector<double> xv = x.ToDoubles();
  const std::vector<double> wv = with_weight ? w.ToDoubles() : std::vector<double>();
  const std::vector<double> bv = with_bias ? b.ToDoubles() : std::vector<double>();
  std::vector<double> want(xv.size());
  for (size_t r = 0; r < xv.size() / h; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < h; ++i) mean += xv[r * h + i] / h;
    for (int64_t i = 0; i < h; ++i) var += (xv[r * h + i] - mean) * (xv[r * h + i] - mean) / h;
    for (int64_t i = 0; i < h; ++i) {
      double y = (xv[r * h + i] - mean) / std::sqrt(var + 1e-5);
      if (with_weight) y *= wv[i];
      if (with_bias) y += bv[i];
      want[r * h + i] = testing::RoundTo(dtype, y);
    }
  }
  RC_ASSERT(testing::Mismatch(LayerNorm(x, w, b).value(), shape, want, testing::TolFor(dtype, 10)) == "");
}

TEST(NormTest, GoldenAndErrors) {
  // rms([3, 4]) = sqrt(12.5); with eps 0.
  const Tensor x = Tensor::FromVector<float>({2}, {3, 4}).value();
  const Tensor w = Tensor::FromVector<float>({2}, {1, 2}).value();
  const std::vector<float> y = RmsNorm(x, w, 0.0).value().ToVector<float>();
  EXPECT_NEAR(y[0], 3 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(y[1], 8 / std::sqrt(12.5), 1e-6);
  // LayerNorm([1, 3]) = [-1, 1] (eps 0).
  EXPECT_EQ(LayerNorm(Tensor::FromVector<float>({2}, {1, 3}).value(), Tensor(), Tensor(), 0.0)
                .value()
                .ToVector<float>(),
            (std::vector<float>{-1, 1}));
  auto s = RmsNorm(x, Tensor::Ones({3}).value()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dt::testing::Contains(s, "RmsNorm: weight must have shape [2], got f32[3] cpu"));
  s = RmsNorm(x, Tensor::Ones({2}, DType::kBF16).value()).status();
  EXPECT_TRUE(dt::testing::Contains(s, "RmsNorm: dtypes differ"));
  s = LayerNorm(x, Tensor(), Tensor(), -1).status();
  EXPECT_TRUE(dt::testing::Contains(s, "LayerNorm: eps must be finite and >= 0"));
  s = LayerNorm(Tensor::Ones({}).value()).status();
  EXPECT_TRUE(dt::testing::Contains(s, "LayerNorm: x must have at least 1 dims"));
}

RC_GTEST_PROP(ApplyRotaryTest, AgreesWithNaiveLoops, ()) {
  const DType dtype = testing::RandomFloatDType();
  const RotaryStyle style = *rc::gen::element(RotaryStyle::kHalf, RotaryStyle::kInterleaved);
  Shape shape = RandomShape(*rc::gen::inRange(0, 4), 0, 3);
  const int64_t d = 2 * *rc::gen::inRange<int64_t>(0, 5);
  shape.push_back(d);
  // cos/sin: a suffix of x's shape with some dims set to 1 (the last stays D); any float dtype.
  const size_t drop = *rc::gen::inRange<size_t>(0, shape.size());
  Shape cs(shape.begin() + drop, shape.end());
  for (size_t i = 0; i + 1 < cs.size(); ++i) cs[i] = *rc::gen::arbitrary<bool>() ? cs[i] : 1;
  const Tensor x = RandomTensor(shape, dtype);
  const Tensor cos = RandomTensor(cs, testing::RandomFloatDType());
  const Tensor sin = RandomTensor(cs, testing::RandomFloatDType());
  const std::vector<double> xv = x.ToDoubles(), cv = cos.ToDoubles(), sv = sin.ToDoubles();
  std::vector<double> want(xv.size());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const Shape idx = testing::Unravel(i, shape);
    const int64_t j = idx.back(), row = i - j;
    const double c = cv[testing::BroadcastFlat(idx, cs)], s = sv[testing::BroadcastFlat(idx, cs)];
    double partner;  // the element x[j] is rotated with, signed
    if (style == RotaryStyle::kHalf) {
      partner = j < d / 2 ? -xv[row + j + d / 2] : xv[row + j - d / 2];
    } else {
      partner = j % 2 == 0 ? -xv[row + j + 1] : xv[row + j - 1];
    }
    want[i] = testing::RoundTo(dtype, xv[i] * c + partner * s);
  }
  RC_ASSERT(testing::Mismatch(ApplyRotary(x, cos, sin, style).value(), shape, want,
                              testing::TolFor(dtype)) == "");
}

// ApplyRotaryInto writes what ApplyRotary returns, bit for bit, into a slot of a KV cache's buffer
// [B, H, capacity, D] from keys laid out as a projection leaves them ([B, S, H, D] viewed as
// [B, H, S, D]), and nothing outside the slot; a buffer of another float dtype (a KV cache of its
// own dtype) gets the f32 rotation rounded to it once.
RC_GTEST_PROP(ApplyRotaryTest, IntoASlotEqualsApplyRotary, ()) {
  const DType dtype = testing::RandomFloatDType();
  const RotaryStyle style = *rc::gen::element(RotaryStyle::kHalf, RotaryStyle::kInterleaved);
  const int64_t b = *rc::gen::inRange(1, 3), h = *rc::gen::inRange(1, 4), s = *rc::gen::inRange(1, 6);
  const int64_t d = 2 * *rc::gen::inRange<int64_t>(1, 40), cap = s + *rc::gen::inRange(0, 5);
  const int64_t at = *rc::gen::inRange<int64_t>(0, cap - s + 1);
  const Tensor x = RandomTensor({b, s, h, d}, dtype).Transpose(1, 2).value();
  const Tensor cos = RandomTensor({b, 1, s, d}, dtype), sin = RandomTensor({b, 1, s, d}, dtype);
  const DType cache = *rc::gen::element(dtype, testing::RandomFloatDType());
  const Tensor buffer = RandomTensor({b, h, cap, d}, cache, testing::Values::kNormal, /*contiguous=*/true);
  const std::vector<double> before = buffer.ToDoubles();
  const Tensor slot = buffer.Narrow(2, at, s).value();
  const absl::Status st = ApplyRotaryInto(slot, x, cos, sin, style);
  if (!st.ok()) RC_FAIL(st.ToString());
  const Tensor x32 = x.To(DType::kF32).value();
  RC_ASSERT(Equal(slot.Contiguous().value(),
                  ApplyRotary(x32, cos, sin, style).value().To(cache).value()));
  const std::vector<double> after = buffer.ToDoubles();
  for (int64_t i = 0; i < buffer.numel(); ++i) {
    const int64_t pos = i / d % cap;
    if (pos < at || pos >= at + s) RC_ASSERT(after[i] == before[i]);
  }
}

TEST(ApplyRotaryTest, IntoErrors) {
  const Tensor x = Tensor::Zeros({2, 4}).value(), c = Tensor::Zeros({4}).value();
  const RotaryStyle kHalf = RotaryStyle::kHalf;
  EXPECT_TRUE(dt::testing::Contains(
      ApplyRotaryInto(Tensor::Zeros({2, 6}).value(), x, c, c, kHalf),
      "ApplyRotaryInto: out must have shape [2, 4], got f32[2, 6] cpu"));
  // On the CPU out may be of another float dtype (a KV cache of its own dtype), not an integer one.
  EXPECT_TRUE(dt::testing::Contains(
      ApplyRotaryInto(Tensor::Zeros({2, 4}, DType::kI32).value(), x, c, c, kHalf),
      "ApplyRotaryInto: out must be f32, bf16 or f16, got i32[2, 4] cpu"));
  EXPECT_TRUE(dt::testing::Contains(
      ApplyRotaryInto(Tensor::Zeros({4, 2}).value().Transpose(0, 1).value(), x, c, c, kHalf),
      "ApplyRotaryInto: out f32[2, 4] cpu must be writable with a unit stride along its last dim"));
  EXPECT_TRUE(dt::testing::Contains(ApplyRotaryInto(x, x, c, c, kHalf),
                                    "ApplyRotaryInto: out f32[2, 4] cpu shares its storage with x"));
  EXPECT_TRUE(dt::testing::Contains(ApplyRotaryInto(x, Tensor::Zeros({2, 3}).value(), c, c, kHalf),
                                    "ApplyRotaryInto: the last dim of x must be even"));
}

TEST(ApplyRotaryTest, GoldenAndErrors) {
  // x = [1, 2, 3, 4], cos = 0, sin = 1: rotate_half gives [-3, -4, 1, 2]; interleaved [-2, 1, -4, 3].
  const Tensor x = Tensor::FromVector<float>({1, 4}, {1, 2, 3, 4}).value();
  const Tensor c = Tensor::Zeros({4}).value(), s = Tensor::Ones({4}).value();
  EXPECT_EQ(ApplyRotary(x, c, s, RotaryStyle::kHalf).value().ToVector<float>(),
            (std::vector<float>{-3, -4, 1, 2}));
  EXPECT_EQ(ApplyRotary(x, c, s, RotaryStyle::kInterleaved).value().ToVector<float>(),
            (std::vector<float>{-2, 1, -4, 3}));
  auto st = ApplyRotary(Tensor::Zeros({2, 3}).value(), c, s, RotaryStyle::kHalf).status();
  EXPECT_TRUE(dt::testing::Contains(st, "ApplyRotary: the last dim of x must be even"));
  st = ApplyRotary(Tensor::Zeros({2, 4}).value(), Tensor::Zeros({3, 4}).value(), s, RotaryStyle::kHalf)
           .status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dt::testing::Contains(st, "ApplyRotary: cos f32[3, 4] cpu does not broadcast to x f32[2, 4] cpu"));
}

}  // namespace
}  // namespace dt::ops
