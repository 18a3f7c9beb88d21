// bf16/f16 conversions: exhaustive over all 65536 bit patterns, round to nearest even at every tie,
// and nearest rounding of random floats against an independent reference in double.

#include <cmath>
#include <limits>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "dtensor/core/dtype.h"
#include "dtensor/tests/test_util.h"

namespace dt {
namespace {

// Independent decoders (ldexp on the fields) of the 16-bit floats with `man_bits` mantissa bits
// (f16: 10, bf16: 7) and the rest of the 15 below the sign for the exponent.
double Decode16(uint16_t h, int man_bits) {
  const int exp_bits = 15 - man_bits, bias = (1 << (exp_bits - 1)) - 1;
  const int sign = h >> 15, exp = (h >> man_bits) & ((1 << exp_bits) - 1), man = h & ((1 << man_bits) - 1);
  double v;
  if (exp == 0) v = std::ldexp(man, 1 - bias - man_bits);
  else if (exp == (1 << exp_bits) - 1) v = man ? std::numeric_limits<double>::quiet_NaN() : INFINITY;
  else v = std::ldexp((1 << man_bits) + man, exp - bias - man_bits);
  return sign ? -v : v;
}
double DecodeF16(uint16_t h) { return Decode16(h, 10); }
double DecodeBF16(uint16_t h) { return Decode16(h, 7); }

// Round-to-nearest-even of f into a format with `mant_bits` explicit mantissa bits, minimum normal
// exponent `emin` and overflow at 2^(emax+1), computed in double.
double RoundNearestEven(float f, int mant_bits, int emin, int emax) {
  const double a = std::abs(static_cast<double>(f));
  if (a == 0) return f;
  const int e = std::max(emin, std::ilogb(a));
  const double q = std::ldexp(1.0, e - mant_bits);
  const double r = std::nearbyint(a / q) * q;  // default rounding mode: ties to even
  const double v = r >= std::ldexp(1.0, emax + 1) ? INFINITY : r;
  return std::signbit(f) ? -v : v;
}

bool SameValue(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// Every 16-bit pattern decodes as the oracle with `man_bits` mantissa bits says and encodes back to
// itself; a NaN encodes to a NaN (of the same sign where `nan_sign`).
template <typename ToFloat, typename FromFloat>
void CheckExhaustiveRoundTrip(ToFloat to_float, FromFloat from_float, int man_bits, bool nan_sign) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = to_float(static_cast<uint16_t>(h));
    ASSERT_TRUE(SameValue(f, Decode16(static_cast<uint16_t>(h), man_bits))) << "bits " << h;
    const uint16_t back = from_float(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(to_float(back))) << "bits " << h;
      if (nan_sign) {
        ASSERT_EQ(back >> 15, h >> 15) << "NaN sign, bits " << h;
      }
    } else {
      ASSERT_EQ(back, h) << "value " << f;
    }
  }
}

TEST(DTypeTest, Float16ExhaustiveRoundTrip) {
  CheckExhaustiveRoundTrip([](uint16_t h) { return Float16::ToFloat(h); },
                           [](float f) { return Float16::FromFloat(f); }, 10, /*nan_sign=*/true);
}

TEST(DTypeTest, BFloat16ExhaustiveRoundTrip) {
  CheckExhaustiveRoundTrip([](uint16_t h) { return static_cast<float>(BFloat16::FromBits(h)); },
                           [](float f) { return BFloat16::FromFloat(f); }, 7, /*nan_sign=*/false);
}

// Every midpoint between neighbouring values (including the largest finite value and the infinity
// it overflows to) rounds to the even one; one float ulp either side rounds to the nearer one.
template <typename Fn, typename Decode>
void CheckTies(uint16_t last_finite, Fn from_float, Decode decode, double overflow_next) {
  for (uint32_t h = 0; h <= last_finite; ++h) {
    const double lo = decode(static_cast<uint16_t>(h));
    const double hi = h == last_finite ? overflow_next : decode(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2) << "midpoint not exact in f32";
    const uint16_t even = (h & 1) == 0 ? h : h + 1;
    for (int sign : {0, 1}) {
      const float s = sign ? -1.0f : 1.0f;
      const uint16_t sb = static_cast<uint16_t>(sign << 15);
      ASSERT_EQ(from_float(s * mid), sb | even) << "tie at " << mid;
      ASSERT_EQ(from_float(s * std::nextafter(mid, 0.0f)), sb | h) << "below " << mid;
      ASSERT_EQ(from_float(s * std::nextafter(mid, INFINITY)), sb | (h + 1)) << "above " << mid;
    }
  }
}

TEST(DTypeTest, Float16RoundsTiesToEven) {
  CheckTies(0x7bff, Float16::FromFloat, DecodeF16, 65536.0);
}

TEST(DTypeTest, BFloat16RoundsTiesToEven) {
  CheckTies(0x7f7f, BFloat16::FromFloat, DecodeBF16, std::ldexp(1.0, 128));
}

RC_GTEST_PROP(DTypeTest, RandomFloatsRoundToNearest, ()) {
  // Fields drawn separately so that every exponent (subnormals, overflow, inf, NaN) is likely.
  const uint32_t bits = (*rc::gen::inRange<uint32_t>(0, 2) << 31) | (*rc::gen::inRange<uint32_t>(0, 256) << 23) |
                        *rc::gen::inRange<uint32_t>(0, 1u << 23);
  const float f = BitsFloat(bits);
  if (std::isnan(f)) {
    RC_ASSERT(std::isnan(Float16::ToFloat(Float16::FromFloat(f))));
    RC_ASSERT(std::isnan(static_cast<float>(BFloat16(f))));
    return;
  }
  RC_ASSERT(SameValue(DecodeF16(Float16::FromFloat(f)), RoundNearestEven(f, 10, -14, 15)));
  RC_ASSERT(SameValue(DecodeBF16(BFloat16::FromFloat(f)), RoundNearestEven(f, 7, -126, 127)));
}

TEST(DTypeTest, NamesAndParsing) {
  for (DType t : kAllDTypes) {
    EXPECT_EQ(ParseDType(DTypeName(t)).value(), t);
  }
  EXPECT_EQ(ParseDType("bfloat16").value(), DType::kBF16);
  EXPECT_EQ(ParseDType("Float32").value(), DType::kF32);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2);
  EXPECT_EQ(DTypeSize(DType::kI64), 8);
  const auto s = ParseDType("f8").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dt::testing::Contains(s, "unknown dtype 'f8'"));
}

}  // namespace
}  // namespace dt
