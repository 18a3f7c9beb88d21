#include "dtensor/core/quant.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"

namespace dt {
namespace {

float Half(const uint8_t* p) { return LoadHalf(p); }

// Q4_K / Q5_K: the j-th 6-bit (scale, min) pair of a super-block (ggml's get_scale_min_k4).
void ScaleMin(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q4_K / Q5_K: the scales and mins of sub-blocks `is` and `is + 1`, times the super-block's d and
// dmin.
struct SubBlockPair {
  float d1, m1, d2, m2;
};
SubBlockPair ScalesMins(int is, const uint8_t* scales, float d, float dmin) {
  uint8_t sc1, mn1, sc2, mn2;
  ScaleMin(is, scales, &sc1, &mn1);
  ScaleMin(is + 1, scales, &sc2, &mn2);
  return {d * sc1, dmin * mn1, d * sc2, dmin * mn2};
}

void Q8_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

void Q4_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  const uint8_t* q = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((q[j] & 0x0F) - 8) * d;
    y[j + 16] = static_cast<float>((q[j] >> 4) - 8) * d;
  }
}

void Q4_1(const uint8_t* b, float* y) {
  const float d = Half(b), m = Half(b + 2);
  const uint8_t* q = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(q[j] & 0x0F) * d + m;
    y[j + 16] = static_cast<float>(q[j] >> 4) * d + m;
  }
}

// Q5_0 / Q5_1: the 32 five-bit values of a block (low nibbles in q, fifth bits in the 32-bit
// little-endian word at qh), each mapped by `value`.
template <typename F>
void Q5(const uint8_t* qh_at, const uint8_t* q, float* y, F value) {
  uint32_t qh;
  std::memcpy(&qh, qh_at, 4);
  for (int j = 0; j < 16; ++j) {
    const uint8_t h0 = static_cast<uint8_t>(((qh >> j) << 4) & 0x10);
    const uint8_t h1 = static_cast<uint8_t>((qh >> (j + 12)) & 0x10);
    y[j] = value((q[j] & 0x0F) | h0);
    y[j + 16] = value((q[j] >> 4) | h1);
  }
}

void Q5_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  Q5(b + 2, b + 6, y, [d](int v) { return static_cast<float>(v - 16) * d; });
}

void Q5_1(const uint8_t* b, float* y) {
  const float d = Half(b), m = Half(b + 2);
  Q5(b + 4, b + 8, y, [d, m](int v) { return static_cast<float>(v) * d + m; });
}

void Q4_K(const uint8_t* b, float* y) {
  const float d = Half(b), dmin = Half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
    const auto [d1, m1, d2, m2] = ScalesMins(is, scales, d, dmin);
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
  }
}

void Q5_K(const uint8_t* b, float* y) {
  const float d = Half(b), dmin = Half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0, is = 0; j < 256; j += 64, is += 2, ql += 32) {
    const auto [d1, m1, d2, m2] = ScalesMins(is, scales, d, dmin);
    for (int l = 0; l < 32; ++l) {
      *y++ = d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      *y++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
    u1 = static_cast<uint8_t>(u1 << 2);
    u2 = static_cast<uint8_t>(u2 << 2);
  }
}

void Q6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = Half(b + 208);
  for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = static_cast<int8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = static_cast<int8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

// Q2_K / Q3_K: a super-block is two halves of 128 values, each from 32 bytes of 2-bit quants:
// value 32 j + 16 h + l of half n (j < 4, h < 2, l < 16) is bits 2j, 2j + 1 of byte 16 h + l of
// the half's quants, with scale (and min) 8 n + 2 j + h; `value(i, q, l)` maps quant q of the
// element at byte l of the half's quants under scale i.
template <typename F>
void TwoBitHalves(const uint8_t* q, float* y, F value) {
  for (int n = 0; n < 2; ++n, q += 32) {
    for (int j = 0; j < 4; ++j) {
      for (int h = 0; h < 2; ++h) {
        const int i = 8 * n + 2 * j + h;
        for (int l = 0; l < 16; ++l) *y++ = value(i, (q[16 * h + l] >> (2 * j)) & 3, 16 * h + l);
      }
    }
  }
}

void Q2_K(const uint8_t* b, float* y) {
  const uint8_t* sc = b;
  const float d = Half(b + 80), dmin = Half(b + 82);
  float dl[16], ml[16];
  for (int i = 0; i < 16; ++i) {
    dl[i] = d * static_cast<float>(sc[i] & 0xF);
    ml[i] = dmin * static_cast<float>(sc[i] >> 4);
  }
  TwoBitHalves(b + 16, y, [&](int i, int q, int) { return dl[i] * static_cast<float>(q) - ml[i]; });
}

// The third bit of the element at byte l of half n, pair j, is bit 4 n + j of hmask[l]; clear
// means q - 4.
void Q3_K(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const float d = Half(b + 108);
  float dl[16];
  for (int i = 0; i < 16; ++i) dl[i] = d * static_cast<float>(Q3KScale(b + 96, i));
  TwoBitHalves(b + 32, y, [&](int i, int q, int l) {
    const int bit = 4 * (i / 8) + (i % 8) / 2;
    return dl[i] * static_cast<float>(q - ((hm[l] >> bit) & 1 ? 0 : 4));
  });
}

void IQ4_NL(const uint8_t* b, float* y) {
  const float d = Half(b);
  const uint8_t* q = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(kIq4Values[q[j] & 0x0F]);
    y[j + 16] = d * static_cast<float>(kIq4Values[q[j] >> 4]);
  }
}

void IQ4_XS(const uint8_t* b, float* y) {
  const float d = Half(b);
  const uint8_t* q = b + 8;
  for (int i = 0; i < 8; ++i, q += 16, y += 32) {
    const float dl = d * static_cast<float>(Iq4XsScale(b, i));
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * static_cast<float>(kIq4Values[q[j] & 0x0F]);
      y[j + 16] = dl * static_cast<float>(kIq4Values[q[j] >> 4]);
    }
  }
}

}  // namespace

float LoadHalf(const void* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return Float16::ToFloat(h);
}

void DequantizeBlocks(DType dtype, const void* src, int64_t n, float* out) {
  void (*block)(const uint8_t*, float*) = nullptr;
  switch (dtype) {
    case DType::kQ8_0: block = Q8_0; break;
    case DType::kQ4_0: block = Q4_0; break;
    case DType::kQ4_1: block = Q4_1; break;
    case DType::kQ5_0: block = Q5_0; break;
    case DType::kQ5_1: block = Q5_1; break;
    case DType::kQ4_K: block = Q4_K; break;
    case DType::kQ5_K: block = Q5_K; break;
    case DType::kQ6_K: block = Q6_K; break;
    case DType::kQ2_K: block = Q2_K; break;
    case DType::kQ3_K: block = Q3_K; break;
    case DType::kIQ4_NL: block = IQ4_NL; break;
    case DType::kIQ4_XS: block = IQ4_XS; break;
    default: DT_CHECK(false, "DequantizeBlocks on ", DTypeName(dtype));
  }
  const int64_t qk = DTypeBlock(dtype), bytes = DTypeBlockBytes(dtype);
  const uint8_t* p = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n / qk; ++i) block(p + i * bytes, out + i * qk);
}

std::optional<NonFiniteScale> FindNonFiniteScale(DType dtype, const void* src, int64_t n_blocks) {
  // The byte offsets of the f16 scales in a block (Note [Quantized dtypes]).
  struct Field {
    int offset;
    const char* name;
  };
  Field fields[2] = {{0, "d"}, {-1, ""}};
  switch (dtype) {
    case DType::kQ8_0: case DType::kQ4_0: case DType::kQ5_0: case DType::kIQ4_NL:
    case DType::kIQ4_XS: break;
    case DType::kQ4_1: case DType::kQ5_1: fields[1] = {2, "m"}; break;
    case DType::kQ4_K: case DType::kQ5_K: fields[1] = {2, "dmin"}; break;
    case DType::kQ6_K: fields[0] = {208, "d"}; break;
    case DType::kQ2_K: fields[0] = {80, "d"}; fields[1] = {82, "dmin"}; break;
    case DType::kQ3_K: fields[0] = {108, "d"}; break;
    default: DT_CHECK(false, "FindNonFiniteScale on ", DTypeName(dtype));
  }
  const int64_t bytes = DTypeBlockBytes(dtype);
  const uint8_t* p = static_cast<const uint8_t*>(src);
  for (int64_t b = 0; b < n_blocks; ++b) {
    for (const Field& f : fields) {
      if (f.offset < 0) continue;
      uint16_t h;
      std::memcpy(&h, p + b * bytes + f.offset, 2);
      if ((h & 0x7C00) == 0x7C00) return NonFiniteScale{b, f.name, Float16::ToFloat(h)};  // exponent all ones
    }
  }
  return std::nullopt;
}

absl::Status CheckQuantizedShape(DType dtype, IntSpan shape) {
  if (shape.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(DTypeName(dtype), ": a quantized tensor needs at least one dim"));
  }
  if (shape.back() % DTypeBlock(dtype) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        DTypeName(dtype), ShapeToString(shape), ": rows of ", shape.back(),
        " elements are not whole ", DTypeBlock(dtype), "-element blocks"));
  }
  return absl::OkStatus();
}

}  // namespace dt
