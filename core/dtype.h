#pragma once
// Element types. f32/f16/bf16/i64/i32/u8/bool. Half types are stored as raw 16-bit patterns;
// conversions from f32 round to nearest even (NaN stays NaN, overflow goes to infinity).
//
//   dtype  bytes  name     C++ type
//   f32    4      "f32"    float
//   f16    2      "f16"    dt::Float16
//   bf16   2      "bf16"   dt::BFloat16
//   i64    8      "i64"    int64_t
//   i32    4      "i32"    int32_t
//   u8     1      "u8"     uint8_t
//   bool   1      "bool"   bool

#include <cstdint>
#include <cstring>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace dt {

enum class DType : uint8_t { kF32, kF16, kBF16, kI64, kI32, kU8, kBool };
inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kI64,
                                       DType::kI32, DType::kU8,  DType::kBool};

constexpr int64_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI64: return 8;
    case DType::kI32: return 4;
    case DType::kU8: return 1;
    case DType::kBool: return 1;
  }
  return 0;
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
    }                                                                  \
    using T = float; return __VA_ARGS__();                             \
  }()

}  // namespace dt
