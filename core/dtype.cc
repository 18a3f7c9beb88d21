#include "dtensor/core/dtype.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace dt {

absl::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI64: return "i64";
    case DType::kI32: return "i32";
    case DType::kU8: return "u8";
    case DType::kBool: return "bool";
    case DType::kQ8_0: return "q8_0";
    case DType::kQ4_0: return "q4_0";
    case DType::kQ4_1: return "q4_1";
    case DType::kQ5_0: return "q5_0";
    case DType::kQ5_1: return "q5_1";
    case DType::kQ4_K: return "q4_k";
    case DType::kQ5_K: return "q5_k";
    case DType::kQ6_K: return "q6_k";
    case DType::kQ2_K: return "q2_k";
    case DType::kQ3_K: return "q3_k";
    case DType::kIQ4_NL: return "iq4_nl";
    case DType::kIQ4_XS: return "iq4_xs";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  std::string n = absl::AsciiStrToLower(name);
  if (n == "f32" || n == "float32" || n == "float" || n == "fp32") return DType::kF32;
  if (n == "f16" || n == "float16" || n == "half" || n == "fp16") return DType::kF16;
  if (n == "bf16" || n == "bfloat16") return DType::kBF16;
  if (n == "i64" || n == "int64" || n == "long") return DType::kI64;
  if (n == "i32" || n == "int32" || n == "int") return DType::kI32;
  if (n == "u8" || n == "uint8") return DType::kU8;
  if (n == "bool") return DType::kBool;
  for (DType q : kQuantizedDTypes) {
    if (n == DTypeName(q)) return q;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype '", name,
      "'; expected one of f32, f16, bf16, i64, i32, u8, bool, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, "
      "q5_k, q6_k, q2_k, q3_k, iq4_nl, iq4_xs"));
}

uint16_t Float16::FromFloat(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: infinity (also for inf input)
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // Value = abs_float; the half subnormal unit is 2^-24. Round to nearest even.
    const float af = BitsFloat(abs);
    // af * 2^24, computed exactly in float for these magnitudes.
    const float scaled = af * 16777216.0f;
    uint32_t q = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias exponent 127 -> 15 and round the mantissa 23 -> 10 bits to nearest even.
  uint32_t v = abs - 0x38000000u;  // (127-15) << 23
  v += 0xfffu + ((v >> 13) & 1u);
  return static_cast<uint16_t>(sign | (v >> 13));
}

float Float16::ToFloat(uint16_t h) {
  const uint32_t sign = (uint32_t{h} & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    if (man == 0) return BitsFloat(sign);
    const float v = static_cast<float>(man) * (1.0f / 16777216.0f);  // man * 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | (man << 13));
  return BitsFloat(sign | ((exp + 112) << 23) | (man << 13));
}

}  // namespace dt
