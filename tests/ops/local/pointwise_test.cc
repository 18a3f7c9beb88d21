#include <cmath>
#include <limits>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "absl/strings/str_cat.h"
#include "dtensor/ops/local/cpu/vec_math.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/ops/local/test_util.h"
#include "dtensor/tests/test_util.h"

namespace dt::ops {
namespace {

using testing::RandomShape;
using testing::RandomTensor;

DType RandomNumericDType() {
  return *rc::gen::element(DType::kF32, DType::kBF16, DType::kF16, DType::kI64, DType::kI32, DType::kU8);
}

// The value an integer dtype stores for the exact integer v (two's complement wrap-around).
double WrapTo(DType dtype, double v) {
  const int64_t i = static_cast<int64_t>(v);
  switch (dtype) {
    case DType::kI32: return static_cast<int32_t>(static_cast<uint32_t>(i));
    case DType::kU8: return static_cast<uint8_t>(i);
    default: return static_cast<double>(i);
  }
}

// The reference result of a op b stored in dtype: floats compute in f32 and round once.
double ApplyBinary(BinaryOp op, DType dtype, double a, double b) {
  double r = 0;
  switch (op) {
    case BinaryOp::kAdd: r = a + b; break;
    case BinaryOp::kSub: r = a - b; break;
    case BinaryOp::kMul: r = a * b; break;
    case BinaryOp::kDiv: r = a / b; break;
  }
  return IsFloating(dtype) ? testing::RoundTo(dtype, r) : WrapTo(dtype, r);
}

// Tolerance for one f32 op then rounding (the reference rounds the exact result once).
testing::Tol OneRounding(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return {0, 1.0 / 128};
    case DType::kF16: return {6e-8, 1.0 / 1024};  // 6e-8: f16's subnormal spacing
    case DType::kF32: return {0, 1e-7};
    default: return {0, 0};
  }
}

RC_GTEST_PROP(BinaryTest, BroadcastsLikeNumpy, ()) {
  const BinaryOp op = *rc::gen::element(BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv);
  const DType dtype = op == BinaryOp::kDiv ? testing::RandomFloatDType() : RandomNumericDType();
  const Shape out_shape = RandomShape(*rc::gen::inRange(0, 5), 0, 4);
  auto operand = [&] {
    const size_t drop = *rc::gen::inRange<size_t>(0, out_shape.size() + 1);
    Shape s(out_shape.begin() + drop, out_shape.end());
    for (int64_t& d : s) d = *rc::gen::inRange(0, 3) == 0 ? 1 : d;
    return s;
  };
  const Shape as = operand(), bs = operand();
  const Tensor a = RandomTensor(as, dtype);
  const Tensor b = RandomTensor(bs, dtype, op == BinaryOp::kDiv ? testing::Values::kPositive
                                                                : testing::Values::kNormal);
  const Shape shape = BroadcastShapes(as, bs).value();
  const std::vector<double> av = a.ToDoubles(), bv = b.ToDoubles();
  std::vector<double> want(static_cast<size_t>(Numel(shape)));
  for (int64_t i = 0; i < Numel(shape); ++i) {
    const Shape idx = testing::Unravel(i, shape);
    want[i] = ApplyBinary(op, dtype, av[testing::BroadcastFlat(idx, as)], bv[testing::BroadcastFlat(idx, bs)]);
  }
  const Tensor got = Binary(op, a, b).value();
  RC_ASSERT(got.dtype() == dtype);
  RC_ASSERT(got.is_contiguous());
  RC_ASSERT(testing::Mismatch(got, shape, want, OneRounding(dtype)) == "");
}

RC_GTEST_PROP(BinaryTest, ScalarAgreesWithElementwise, ()) {
  const BinaryOp op = *rc::gen::element(BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv);
  const DType dtype = op == BinaryOp::kDiv ? testing::RandomFloatDType() : RandomNumericDType();
  const Shape shape = RandomShape(*rc::gen::inRange(0, 4), 0, 5);
  const Tensor x = RandomTensor(shape, dtype);
  double s = *rc::gen::inRange(-30, 30);
  if (IsFloating(dtype)) s = s / 7.0 + (op == BinaryOp::kDiv && s == 0 ? 1 : 0);
  const std::vector<double> xv = x.ToDoubles();
  std::vector<double> want(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    want[i] = ApplyBinary(op, dtype, xv[i], IsFloating(dtype) ? static_cast<float>(s) : s);
  }
  RC_ASSERT(testing::Mismatch(Binary(op, x, s).value(), shape, want, OneRounding(dtype)) == "");
}

// Modulate is the three ops it fuses, bit for bit, in every float dtype and layout.
RC_GTEST_PROP(ModulateTest, EqualsTheThreeOpsItFuses, ()) {
  const DType dtype = testing::RandomFloatDType();
  const Shape shape = RandomShape(*rc::gen::inRange(1, 4), 0, 5);
  Shape bshape = shape;
  for (int64_t& d : bshape) {
    if (*rc::gen::inRange(0, 3) == 0) d = 1;
  }
  const Tensor x = RandomTensor(shape, dtype);
  const Tensor scale = RandomTensor(bshape, dtype);
  const Tensor shift = RandomTensor(*rc::gen::element(0, 1) ? bshape : shape, dtype);
  const absl::StatusOr<Tensor> got = Modulate(x, scale, shift);
  if (!got.ok()) RC_FAIL(got.status().ToString());
  const Tensor want = Add(Mul(x, Add(scale, 1.0).value()).value(), shift).value();
  RC_ASSERT(got->shape() == shape);
  if (!Equal(*got, want)) RC_FAIL(got->ToString() + " vs " + want.ToString());
}

TEST(ModulateTest, Errors) {
  const Tensor x = Tensor::Zeros({2, 3}, DType::kF32).value();
  EXPECT_TRUE(testing::Contains(Modulate(x, Tensor::Zeros({2}, DType::kF32).value(), x).status(),
                                "Modulate: scale f32[2] cpu does not broadcast to x f32[2, 3]"));
  EXPECT_TRUE(testing::Contains(Modulate(x, Tensor::Zeros({3}, DType::kBF16).value(), x).status(),
                                "Modulate"));
  EXPECT_TRUE(testing::Contains(Modulate(Tensor::Zeros({2}, DType::kI64).value(),
                                         Tensor::Zeros({2}, DType::kI64).value(),
                                         Tensor::Zeros({2}, DType::kI64).value()).status(),
                                "Modulate"));
}

// GatedActivation is Unary then Mul, bit for bit, in every float dtype, activation and layout
// (RandomTensor's, and the two halves of one packed tensor), runs longer than the kernel's block
// included.
RC_GTEST_PROP(GatedActivationTest, EqualsTheTwoOpsItFuses, ()) {
  const DType dtype = testing::RandomFloatDType();
  const UnaryOp act = *rc::gen::elementOf(kAllUnaryOps);
  Shape shape = RandomShape(*rc::gen::inRange(1, 4), 0, 5);
  if (*rc::gen::inRange(0, 4) == 0) shape.back() = *rc::gen::inRange(500, 1100);
  Tensor gate, up;
  if (*rc::gen::arbitrary<bool>()) {
    // The halves of a packed gate|up projection, as SwiGLUMLP's fused form reads them.
    Shape packed = shape;
    packed.back() *= 2;
    const std::vector<Tensor> halves = Chunk(RandomTensor(packed, dtype), 2, -1).value();
    gate = halves[0];
    up = halves[halves.size() - 1];
  } else {
    gate = RandomTensor(shape, dtype);
    up = RandomTensor(shape, dtype);
  }
  RC_PRE(gate.shape() == up.shape());  // a packed dim of 0 has chunks of equal size only
  const absl::StatusOr<Tensor> got = GatedActivation(gate, up, act);
  if (!got.ok()) RC_FAIL(got.status().ToString());
  const Tensor want = Mul(Unary(act, gate).value(), up).value();
  RC_ASSERT(got->is_contiguous());
  if (!Equal(*got, want)) {
    RC_FAIL(absl::StrCat(UnaryOpName(act), " ", DTypeName(dtype), ": ", got->ToString(), " vs ",
                         want.ToString()));
  }
}

TEST(GatedActivationTest, Errors) {
  const Tensor x = Tensor::Zeros({2, 3}, DType::kF32).value();
  EXPECT_TRUE(testing::Contains(
      GatedActivation(x, Tensor::Zeros({3, 2}, DType::kF32).value(), UnaryOp::kSilu).status(),
      "GatedActivation: gate f32[2, 3] cpu and up f32[3, 2] cpu differ in shape"));
  EXPECT_TRUE(testing::Contains(
      GatedActivation(x, Tensor::Zeros({2, 3}, DType::kBF16).value(), UnaryOp::kSilu).status(),
      "GatedActivation: dtypes differ"));
  const Tensor i = Tensor::Zeros({2}, DType::kI64).value();
  EXPECT_TRUE(testing::Contains(GatedActivation(i, i, UnaryOp::kRelu).status(),
                                "GatedActivation: gate must be f32, bf16 or f16"));
}

double ApplyUnary(UnaryOp op, double v) {
  switch (op) {
    case UnaryOp::kNeg: return -v;
    case UnaryOp::kSilu: return v / (1 + std::exp(-v));
    case UnaryOp::kGeluTanh:
      return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    case UnaryOp::kGeluErf: return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    case UnaryOp::kExp: return std::exp(v);
    case UnaryOp::kRsqrt: return 1 / std::sqrt(v);
    case UnaryOp::kSqrt: return std::sqrt(v);
    case UnaryOp::kRelu: return v > 0 ? v : 0;
    case UnaryOp::kSigmoid: return 1 / (1 + std::exp(-v));
    case UnaryOp::kTanh: return std::tanh(v);
  }
  return 0;
}

RC_GTEST_PROP(UnaryTest, AgreesWithLibm, ()) {
  const UnaryOp op = *rc::gen::elementOf(kAllUnaryOps);
  const DType dtype = op == UnaryOp::kNeg ? RandomNumericDType() : testing::RandomFloatDType();
  const bool positive = op == UnaryOp::kRsqrt || op == UnaryOp::kSqrt;
  const Shape shape = RandomShape(*rc::gen::inRange(0, 4), 0, 5);
  const Tensor x = RandomTensor(shape, dtype, positive ? testing::Values::kPositive : testing::Values::kNormal);
  const std::vector<double> xv = x.ToDoubles();
  std::vector<double> want(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    const double r = ApplyUnary(op, xv[i]);
    want[i] = IsFloating(dtype) ? testing::RoundTo(dtype, r) : WrapTo(dtype, r);
  }
  // libm's float functions are within a few ulp; halves get one extra rounding step.
  // Gelu's 1 + tanh/erf cancels for negative inputs: an absolute f32 error of about 1e-7.
  testing::Tol tol = OneRounding(dtype);
  if (dtype == DType::kF32) tol.rtol = 1e-6;
  if (IsFloating(dtype)) tol.atol = 1e-6;
  RC_ASSERT(testing::Mismatch(Unary(op, x).value(), shape, want, tol) == "");
}

// Every row of DT_UNARY_OPS is a function of its own, Name(x), that runs its row and names it.
TEST(UnaryTest, EveryRowIsItsOwnFunction) {
  const Tensor x = Tensor::FromVector<float>({2, 3}, {0.25f, 0.5f, 1, 2, 3.5f, 9}).value();
#define DT_CHECK_ROW_(name, formula)                                                    \
  EXPECT_STREQ(UnaryOpName(UnaryOp::k##name), #name);                                   \
  EXPECT_EQ(name(x).value().ToDoubles(), Unary(UnaryOp::k##name, x).value().ToDoubles()) \
      << #name;
  DT_UNARY_OPS(DT_CHECK_ROW_)
#undef DT_CHECK_ROW_
  const absl::Status bad = Sigmoid(Tensor::FromVector<int32_t>({1}, {1}).value()).status();
  EXPECT_TRUE(testing::Contains(bad, "Sigmoid")) << bad;
}

// Note [Vector exp]: within 2 ulp of e^x (computed in double) on a sweep of 2^22 floats over the
// normal range, in both the vector and the scalar form; the ends and the special values exactly.
TEST(VecMathTest, ExpWithinTwoUlp) {
  constexpr int kN = 1 << 22;
  std::vector<float> x(kN), y(kN);
  for (int i = 0; i < kN; ++i) x[i] = -87.3f + (88.7f + 87.3f) * static_cast<float>(i) / kN;
  cpu::ExpF32(x.data(), y.data(), kN);
  int worst = 0;
  for (int i = 0; i < kN; ++i) {
    const float want = static_cast<float>(std::exp(static_cast<double>(x[i])));
    const float ulp = std::nextafter(want, INFINITY) - want;
    const int e1 = static_cast<int>(std::lround(std::abs(y[i] - want) / ulp));
    const int e2 = static_cast<int>(std::lround(std::abs(cpu::ExpScalar(x[i]) - want) / ulp));
    worst = std::max({worst, e1, e2});
    ASSERT_LE(std::max(e1, e2), 2) << "x = " << x[i] << ": " << y[i] << " / " << cpu::ExpScalar(x[i])
                                   << " vs " << want;
  }
  RecordProperty("worst_ulp", worst);
  const float special[] = {-INFINITY, -1000.0f, -88.0f, 0.0f, 89.0f, INFINITY, NAN, 1.0f, -0.0f};
  float out[9];
  cpu::ExpF32(special, out, 9);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], 0.0f);  // subnormal e^-88 flushes to 0 (Note [Vector exp])
  EXPECT_EQ(out[3], 1.0f);
  EXPECT_EQ(out[4], INFINITY);
  EXPECT_EQ(out[5], INFINITY);
  EXPECT_TRUE(std::isnan(out[6]));
  EXPECT_NEAR(out[7], 2.718281828f, 3e-7f);
  EXPECT_EQ(out[8], 1.0f);
}

// Note [Vector tanh]: within 8 ulp of tanh (computed in double) on a sweep of 2^22 floats that
// covers both branches, in both the vector and the scalar form; the special values exactly.
TEST(VecMathTest, TanhWithinEightUlp) {
  constexpr int kN = 1 << 22;
  std::vector<float> x(kN), y(kN);
  for (int i = 0; i < kN; ++i) x[i] = -12.0f + 24.0f * static_cast<float>(i) / kN;
  cpu::TanhF32(x.data(), y.data(), kN);
  int worst = 0;
  for (int i = 0; i < kN; ++i) {
    const float want = static_cast<float>(std::tanh(static_cast<double>(x[i])));
    const float ulp = std::nextafter(std::abs(want), INFINITY) - std::abs(want);
    const int e1 = static_cast<int>(std::lround(std::abs(y[i] - want) / ulp));
    const int e2 = static_cast<int>(std::lround(std::abs(cpu::TanhScalar(x[i]) - want) / ulp));
    worst = std::max({worst, e1, e2});
    ASSERT_LE(std::max(e1, e2), 8) << "x = " << x[i] << ": " << y[i] << " / "
                                   << cpu::TanhScalar(x[i]) << " vs " << want;
  }
  RecordProperty("worst_ulp", worst);
  const float special[] = {-INFINITY, -50.0f, -0.0f, 0.0f, 1e-30f, 50.0f, INFINITY, NAN, 0.25f};
  float out[9];
  cpu::TanhF32(special, out, 9);
  EXPECT_EQ(out[0], -1.0f);
  EXPECT_EQ(out[1], -1.0f);
  EXPECT_TRUE(out[2] == 0.0f && std::signbit(out[2]));
  EXPECT_TRUE(out[3] == 0.0f && !std::signbit(out[3]));
  EXPECT_EQ(out[4], 1e-30f);
  EXPECT_EQ(out[5], 1.0f);
  EXPECT_EQ(out[6], 1.0f);
  EXPECT_TRUE(std::isnan(out[7]));
  EXPECT_NEAR(out[8], 0.244918662f, 1e-7f);
}

// torch.tanh (torch 2.15, f32) at values over both branches of Note [Vector tanh] and the ends.
TEST(UnaryTest, TanhMatchesTorch) {
  const std::vector<float> x = {0.0f, -0.0f, 9.99999997e-07f, -0.000300000014f, 0.00999999978f,
                                -0.100000001f, 0.200000003f, 0.249899998f, 0.25f, -0.25999999f,
                                0.5f, -0.75f, 1.0f, -1.5f, 2.0f, 3.70000005f, -5.0f, 8.5f,
                                9.10000038f, -12.0f, 20.0f, 45.0f, -88.0f, 200.0f};
  const std::vector<float> torch = {0.0f, -0.0f, 9.99999997e-07f, -0.000300000014f,
                                    0.00999966636f, -0.0996679962f, 0.197375327f, 0.244824663f,
                                    0.244918659f, -0.254295528f, 0.462117165f, -0.635148942f,
                                    0.761594176f, -0.905148268f, 0.964027584f, 0.998778224f,
                                    -0.999909222f, 0.99999994f, 1.0f, -1.0f, 1.0f, 1.0f, -1.0f,
                                    1.0f};
  const Tensor t = Tanh(Tensor::FromVector<float>({static_cast<int64_t>(x.size())}, x).value()).value();
  const std::vector<float> got = t.ToVector<float>();
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(got[i], torch[i], 1e-6f * std::abs(torch[i]) + 1e-12f) << "x = " << x[i];
    EXPECT_EQ(std::signbit(got[i]), std::signbit(torch[i])) << "x = " << x[i];
  }
}

// F32ToBf16 is BFloat16::FromFloat bit for bit: every 251st bit pattern (ties, NaNs of both
// signs, infinities, denormals among them) and a tail shorter than a vector.
TEST(VecMathTest, F32ToBf16EqualsFromFloat) {
  std::vector<float> x;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 251) x.push_back(BitsFloat(static_cast<uint32_t>(u)));
  for (uint32_t u : {0x3f808000u, 0x3f818000u, 0x7f800001u, 0xffc00001u, 0x7f7fffffu}) x.push_back(BitsFloat(u));
  std::vector<uint16_t> got(x.size());
  cpu::F32ToBf16(x.data(), got.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(got[i], BFloat16::FromFloat(x[i])) << "bits " << std::hex << FloatBits(x[i]);
  }
}

RC_GTEST_PROP(CastTest, ConvertsEveryPair, ()) {
  const DType from = *rc::gen::elementOf(std::vector<DType>(std::begin(kAllDTypes), std::end(kAllDTypes)));
  const DType to = *rc::gen::elementOf(std::vector<DType>(std::begin(kAllDTypes), std::end(kAllDTypes)));
  const Shape shape = RandomShape(*rc::gen::inRange(0, 4), 0, 4);
  const Tensor x = RandomTensor(shape, from);
  std::vector<double> want = x.ToDoubles();
  for (double& v : want) {
    if (to == DType::kBool) v = v != 0;
    else if (IsFloating(to)) v = testing::RoundTo(to, v);
    else v = WrapTo(to, std::trunc(v));
  }
  const Tensor y = Cast(x, to).value();
  RC_ASSERT(y.dtype() == to);
  RC_ASSERT(y.is_contiguous());
  RC_ASSERT(testing::Mismatch(y, shape, want) == "");
}

TEST(PointwiseTest, Golden) {
  const Tensor a = Tensor::FromVector<float>({2, 1}, {1, 2}).value();
  const Tensor b = Tensor::FromVector<float>({3}, {10, 20, 30}).value();
  EXPECT_EQ(Add(a, b).value().ToVector<float>(), (std::vector<float>{11, 21, 31, 12, 22, 32}));
  EXPECT_EQ(Sub(a, b).value().shape(), (Shape{2, 3}));
  EXPECT_EQ(Div(b, 4.0).value().ToVector<float>(), (std::vector<float>{2.5, 5, 7.5}));
  EXPECT_EQ(Mul(b, -0.5).value().ToVector<float>(), (std::vector<float>{-5, -10, -15}));
  const Tensor x = Tensor::FromVector<float>({4}, {0, 1, -1, 4}).value();
  EXPECT_EQ(Silu(x).value().ToVector<float>()[0], 0.0f);
  EXPECT_NEAR(Silu(x).value().ToVector<float>()[1], 0.7310586f, 1e-6);
  EXPECT_NEAR(Gelu(x).value().ToVector<float>()[2], -0.15865525f, 1e-6);
  EXPECT_NEAR(Gelu(x, GeluApproximation::kTanh).value().ToVector<float>()[2], -0.15880801f, 1e-6);
  EXPECT_EQ(Sqrt(x).value().ToVector<float>()[3], 2.0f);
  EXPECT_EQ(Rsqrt(x).value().ToVector<float>()[3], 0.5f);
  EXPECT_EQ(Relu(x).value().ToVector<float>(), (std::vector<float>{0, 1, 0, 4}));
  const Tensor nan = Tensor::FromVector<float>({1}, {std::nanf("")}).value();
  EXPECT_TRUE(std::isnan(Relu(nan).value().ToVector<float>()[0]));  // as torch.relu
  EXPECT_TRUE(std::isinf(Rsqrt(x).value().ToVector<float>()[0]));
  // Integers wrap.
  const Tensor i = Tensor::FromVector<int32_t>({2}, {std::numeric_limits<int32_t>::max(), 7}).value();
  EXPECT_EQ(Add(i, 1.0).value().ToVector<int64_t>(),
            (std::vector<int64_t>{std::numeric_limits<int32_t>::min(), 8}));
  EXPECT_EQ(Neg(Tensor::FromVector<uint8_t>({1}, {1}).value()).value().ToVector<int64_t>(),
            (std::vector<int64_t>{255}));
  // bf16 rounds once: 1 + 2^-9 is a tie between 1 and 1 + 2^-7... rounds to even (1).
  const Tensor one = Tensor::Full({1}, 1.0, DType::kBF16).value();
  EXPECT_EQ(Add(one, 1.0 / 512).value().ToVector<float>()[0], 1.0f);
  EXPECT_EQ(Add(one, 3.0 / 512).value().ToVector<float>()[0], 1.0078125f);
}

TEST(PointwiseTest, Errors) {
  const Tensor f = Tensor::Zeros({2, 3}).value();
  auto s = Add(f, Tensor::Zeros({4}).value()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dt::testing::Contains(s, "Add: a f32[2, 3] cpu and b f32[4] cpu do not broadcast"));
  s = Mul(f, Tensor::Zeros({3}, DType::kBF16).value()).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Mul: dtypes differ"));
  s = Div(Tensor::Zeros({3}, DType::kI32).value(), 2.0).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Div: x must be f32, bf16 or f16, got i32[3] cpu"));
  s = Add(Tensor::Zeros({3}, DType::kI64).value(), 0.5).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Add: scalar 0.5 is not an integer"));
  s = Sub(Tensor::Zeros({3}, DType::kBool).value(), 1.0).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Sub: x must not be bool"));
  s = Exp(Tensor::Zeros({3}, DType::kI64).value()).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Exp: x must be f32, bf16 or f16"));
  s = Silu(Tensor()).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Silu: x is an undefined tensor"));
}

}  // namespace
}  // namespace dt::ops
