#pragma once
// Element types. f32/f16/bf16/i64/i32/u8/bool. Half types are stored as raw 16-bit patterns;
// conversions from f32 round to nearest even (NaN stays NaN, overflow goes to infinity).
// The quantized dtypes (q8_0 ... iq4_xs) are GGUF's block formats: a tensor's shape stays in
// elements, its bytes are whole blocks (Note [Quantized dtypes] in core/quant.h).
//
//   dtype  bytes  name     C++ type
//   f32    4      "f32"    float
//   f16    2      "f16"    dt::Float16
//   bf16   2      "bf16"   dt::BFloat16
//   i64    8      "i64"    int64_t
//   i32    4      "i32"    int32_t
//   u8     1      "u8"     uint8_t
//   bool   1      "bool"   bool
//   q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl (blocks of 32), q2_k q3_k q4_k q5_k q6_k iq4_xs (blocks of
//   256): core/quant.h

#include <cstdint>
#include <cstring>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace dt {

enum class DType : uint8_t {
  kF32, kF16, kBF16, kI64, kI32, kU8, kBool,
  // Quantized (Note [Quantized dtypes] in core/quant.h).
  kQ8_0, kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ4_K, kQ5_K, kQ6_K, kQ2_K, kQ3_K, kIQ4_NL, kIQ4_XS,
};
// The element dtypes (every elementwise kernel's domain).
inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kI64,
                                       DType::kI32, DType::kU8,  DType::kBool};
inline constexpr DType kQuantizedDTypes[] = {
    DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,  DType::kQ4_K,
    DType::kQ5_K, DType::kQ6_K, DType::kQ2_K, DType::kQ3_K, DType::kIQ4_NL, DType::kIQ4_XS};

constexpr bool IsQuantized(DType t) { return t >= DType::kQ8_0; }
// Bytes of one element; 0 for a quantized dtype, whose elements have no bytes of their own (use
// DTypeBytes).
constexpr int64_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI64: return 8;
    case DType::kI32: return 4;
    case DType::kU8: return 1;
    case DType::kBool: return 1;
    default: return 0;
  }
}
// Elements per block: 1 for element dtypes.
constexpr int64_t DTypeBlock(DType t) {
  switch (t) {
    case DType::kQ8_0: case DType::kQ4_0: case DType::kQ4_1: case DType::kQ5_0: case DType::kQ5_1:
    case DType::kIQ4_NL:
      return 32;
    case DType::kQ4_K: case DType::kQ5_K: case DType::kQ6_K: case DType::kQ2_K: case DType::kQ3_K:
    case DType::kIQ4_XS:
      return 256;
    default: return 1;
  }
}
// Bytes per block: DTypeSize for element dtypes.
constexpr int64_t DTypeBlockBytes(DType t) {
  switch (t) {
    case DType::kQ8_0: return 34;
    case DType::kQ4_0: return 18;
    case DType::kQ4_1: return 20;
    case DType::kQ5_0: return 22;
    case DType::kQ5_1: return 24;
    case DType::kQ4_K: return 144;
    case DType::kQ5_K: return 176;
    case DType::kQ6_K: return 210;
    case DType::kQ2_K: return 84;
    case DType::kQ3_K: return 110;
    case DType::kIQ4_NL: return 18;
    case DType::kIQ4_XS: return 136;
    default: return DTypeSize(t);
  }
}
// Bytes of n elements (n a whole number of blocks for a quantized dtype).
constexpr int64_t DTypeBytes(DType t, int64_t n) {
  return IsQuantized(t) ? n / DTypeBlock(t) * DTypeBlockBytes(t) : n * DTypeSize(t);
}
constexpr bool IsFloating(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }
absl::string_view DTypeName(DType t);
absl::StatusOr<DType> ParseDType(absl::string_view name);  // "f32", "float32", "bf16", ...

inline uint32_t FloatBits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float BitsFloat(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// bfloat16: the top 16 bits of an IEEE f32.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float f) : bits(FromFloat(f)) {}
  static constexpr BFloat16 FromBits(uint16_t b) { BFloat16 r; r.bits = b; return r; }
  operator float() const { return BitsFloat(uint32_t{bits} << 16); }
  static uint16_t FromFloat(float f) {
    uint32_t u = FloatBits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return static_cast<uint16_t>(u >> 16);
  }
};

// IEEE binary16.
struct Float16 {
  uint16_t bits = 0;
  Float16() = default;
  explicit Float16(float f) : bits(FromFloat(f)) {}
  static constexpr Float16 FromBits(uint16_t b) { Float16 r; r.bits = b; return r; }
  operator float() const { return ToFloat(bits); }
  static uint16_t FromFloat(float f);
  static float ToFloat(uint16_t h);
};

// Maps a C++ element type to its DType.
template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kF32; };
template <> struct DTypeOf<Float16> { static constexpr DType value = DType::kF16; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::kBF16; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kI64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kI32; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::kU8; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::kBool; };

// DT_DISPATCH_DTYPE(dtype, T, body): runs `body` with `T` bound to the C++ type of `dtype`.
#define DT_DISPATCH_DTYPE(dtype, T, ...)                               \
  [&] {                                                                \
    switch (dtype) {                                                   \
      case ::dt::DType::kF32: { using T = float; return __VA_ARGS__(); }         \
      case ::dt::DType::kF16: { using T = ::dt::Float16; return __VA_ARGS__(); } \
      case ::dt::DType::kBF16: { using T = ::dt::BFloat16; return __VA_ARGS__(); } \
      case ::dt::DType::kI64: { using T = int64_t; return __VA_ARGS__(); }       \
      case ::dt::DType::kI32: { using T = int32_t; return __VA_ARGS__(); }       \
      case ::dt::DType::kU8: { using T = uint8_t; return __VA_ARGS__(); }        \
      case ::dt::DType::kBool: { using T = bool; return __VA_ARGS__(); }         \
      default: break; /* quantized: callers refuse them first */       \
    }                                                                  \
    using T = float; return __VA_ARGS__();                             \
  }()

}  // namespace dt
