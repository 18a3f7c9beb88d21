#pragma once
// Internal to the CPU kernels: exp, tanh and the activations built on them over f32 arrays, 8 lanes at a
// time where the build has AVX2 + FMA (the x86-64-v3 baseline), one at a time otherwise.
//
// Note [Vector exp]
// libm's expf is scalar (GCC vectorizes calls to it only under -ffast-math), and SiLU, softmax
// and attention call it once per element: in a Flux2 step that was a few percent of the time on its
// own. ExpF32 reduces x = n·ln2 + r (|r| <= ln2/2, ln2 split in two for exactness), evaluates a
// degree-6 polynomial for e^r (Cephes' expf coefficients) and scales by 2^n through the exponent
// bits: within 2 ulp of the correctly rounded value over the normal range (ExpF32 is checked against
// std::exp in tests/ops/local/pointwise_test.cc). Below -87.3, where e^x is subnormal, it returns 0;
// above 88.72 +inf; NaN stays NaN.

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define DT_VEC_MATH_AVX2 1
#else
#define DT_VEC_MATH_AVX2 0
#endif

// The 8-lane function of a MapF32 call where AVX2 is compiled in, nullptr (unused) where not:
// MapF32(x, y, n, DT_VEC8([](__m256 v) { return Exp8(v); }), ExpScalar).
#if DT_VEC_MATH_AVX2
#define DT_VEC8(...) __VA_ARGS__
#else
#define DT_VEC8(...) nullptr
#endif

namespace dt::ops::cpu {

namespace vec_math_internal {
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
inline constexpr float kMaxX = 88.7228391f, kMinX = -87.3365448f;
inline constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace vec_math_internal

// e^x as Note [Vector exp] describes (scalar form of Exp8).
inline float ExpScalar(float x) {
  using namespace vec_math_internal;
  if (!(x > kMinX)) return std::isnan(x) ? x : 0.0f;
  if (x > kMaxX) return INFINITY;
  const float n = std::nearbyint(x * kLog2e);
  const float r = std::fma(-n, kLn2Lo, std::fma(-n, kLn2Hi, x));
  float p = kP[0];
  for (int i = 1; i < 6; ++i) p = std::fma(p, r, kP[i]);
  p = std::fma(p, r * r, r) + 1.0f;
  return std::ldexp(p, static_cast<int>(n));
}

#if DT_VEC_MATH_AVX2
inline __m256 Exp8(__m256 x) {
  using namespace vec_math_internal;
  const __m256 too_small = _mm256_cmp_ps(x, _mm256_set1_ps(kMinX), _CMP_NGT_UQ);  // also NaN
  const __m256 too_large = _mm256_cmp_ps(x, _mm256_set1_ps(kMaxX), _CMP_GT_OQ);
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kMinX)), _mm256_set1_ps(kMaxX));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP[i]));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  // 2^n for n in [-126, 128]: n = 128 (x near kMaxX) is split as 2^127 · 2.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_min_epi32(ni, _mm256_set1_epi32(127));
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, n1), _mm256_set1_epi32(127)), 23));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), too_small);
  y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), too_large);
  return _mm256_blendv_ps(y, x, nan);
}
#endif

// y[i] = f(x[i]) for i < n, with f evaluated 8 lanes at a time: vec(__m256) -> __m256 and
// scalar(float) -> float must compute the same function. y may be x.
template <typename Vec, typename Scalar>
inline void MapF32(const float* x, float* y, int64_t n, Vec&& vec, Scalar&& scalar) {
  int64_t i = 0;
#if DT_VEC_MATH_AVX2
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, vec(_mm256_loadu_ps(x + i)));
  if (i < n) {
    float tmp[8] = {};
    for (int64_t j = i; j < n; ++j) tmp[j - i] = x[j];
    const __m256 v = vec(_mm256_loadu_ps(tmp));
    _mm256_storeu_ps(tmp, v);
    for (int64_t j = i; j < n; ++j) y[j] = tmp[j - i];
  }
#else
  (void)vec;
  for (; i < n; ++i) y[i] = scalar(x[i]);
#endif
}

// y = e^x elementwise (Note [Vector exp]); y may be x.
inline void ExpF32(const float* x, float* y, int64_t n) {
  MapF32(x, y, n, DT_VEC8([](__m256 v) { return Exp8(v); }), ExpScalar);
}

// y = x / (1 + e^-x) (SiLU) elementwise; y may be x.
inline void SiluF32(const float* x, float* y, int64_t n) {
  auto scalar = [](float v) { return v / (1.0f + ExpScalar(-v)); };
  MapF32(x, y, n, DT_VEC8([](__m256 v) {
           const __m256 e = Exp8(_mm256_sub_ps(_mm256_setzero_ps(), v));
           return _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
         }),
         scalar);
}

// Note [Vector tanh]
// tanh(x) = sign(x) (1 - e) / (1 + e) with e = e^-2|x| (ExpScalar / Exp8: Note [Vector exp]); e
// rounds to 0 past |x| = 43.7, which gives ±1 exactly. Below |x| = 1/4, 1 - e would cancel, so
// the odd Taylor series to x⁹ is used there (the first term left out is under 1e-8 of the value).
// Both within 8 ulp of the correctly rounded tanh (checked against std::tanh in
// tests/ops/local/pointwise_test.cc); NaN stays NaN, -0 stays -0.
namespace vec_math_internal {
inline constexpr float kTanhSmall = 0.25f;
inline constexpr float kTanhT[4] = {-1.0f / 3.0f, 2.0f / 15.0f, -17.0f / 315.0f, 62.0f / 2835.0f};
}  // namespace vec_math_internal

inline float TanhScalar(float x) {
  using namespace vec_math_internal;
  const float a = std::fabs(x);
  if (a < kTanhSmall) {  // false for NaN
    const float x2 = x * x;
    float p = kTanhT[3];
    for (int i = 2; i >= 0; --i) p = std::fma(p, x2, kTanhT[i]);
    return x * std::fma(x2, p, 1.0f);  // x (1 + ...), not x + x³ (...): -0 stays -0
  }
  const float e = ExpScalar(-2.0f * a);
  return std::copysign((1.0f - e) / (1.0f + e), x);
}

#if DT_VEC_MATH_AVX2
inline __m256 Tanh8(__m256 x) {
  using namespace vec_math_internal;
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256 a = _mm256_andnot_ps(sign_bit, x);
  const __m256 x2 = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(kTanhT[3]);
  for (int i = 2; i >= 0; --i) p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(kTanhT[i]));
  const __m256 small = _mm256_mul_ps(x, _mm256_fmadd_ps(x2, p, _mm256_set1_ps(1.0f)));
  const __m256 e = Exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), a));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 large = _mm256_or_ps(
      _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e)), _mm256_and_ps(sign_bit, x));
  return _mm256_blendv_ps(large, small, _mm256_cmp_ps(a, _mm256_set1_ps(kTanhSmall), _CMP_LT_OQ));
}
#endif

// y = tanh(x) elementwise (Note [Vector tanh]); y may be x.
inline void TanhF32(const float* x, float* y, int64_t n) {
  MapF32(x, y, n, DT_VEC8([](__m256 v) { return Tanh8(v); }), TanhScalar);
}

// The largest of `init` and x[0, n), NaNs passed over (as a loop of std::max(m, x[i]) does).
inline float MaxF32(const float* x, int64_t n, float init) {
  int64_t i = 0;
  float m = init;
#if DT_VEC_MATH_AVX2
  if (n >= 8) {
    __m256 v = _mm256_set1_ps(init);
    for (; i + 8 <= n; i += 8) v = _mm256_max_ps(_mm256_loadu_ps(x + i), v);  // NaN: keeps v
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, v);
    for (const float l : lanes) m = std::max(m, l);
  }
#endif
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// Σ x[0, n): in 8 lanes where AVX2 is compiled in (lane l sums x[l], x[l + 8], ...; the lanes and
// the tail then added in order), one at a time otherwise.
inline float SumF32(const float* x, int64_t n) {
  int64_t i = 0;
  float s = 0;
#if DT_VEC_MATH_AVX2
  if (n >= 8) {
    __m256 v = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) v = _mm256_add_ps(v, _mm256_loadu_ps(x + i));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, v);
    for (const float l : lanes) s += l;
  }
#endif
  for (; i < n; ++i) s += x[i];
  return s;
}

// dst[i] = the bf16 bits of src[i], rounded to nearest even, NaN kept quiet: BFloat16::FromFloat
// (core/dtype.h) bit for bit, 8 lanes at a time.
inline void F32ToBf16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
#if DT_VEC_MATH_AVX2
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  for (; i + 16 <= n; i += 16) {
    __m256i h[2];
    for (int half = 0; half < 2; ++half) {
      const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 8 * half));
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
      const __m256i rounded = _mm256_srli_epi32(
          _mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(_mm256_srli_epi32(u, 16), one)), 16);
      const __m256i nan_bits = _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet);
      h[half] = _mm256_blendv_epi8(rounded, nan_bits, nan);
    }
    // Both halves hold values below 2^16: an unsigned-saturating pack is exact; it interleaves
    // 128-bit lanes, which the permute puts back in order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h[0], h[1]), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
  }
#endif
  for (; i < n; ++i) {
    uint32_t u;
    __builtin_memcpy(&u, src + i, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      dst[i] = static_cast<uint16_t>((u >> 16) | 0x40);
    } else {
      dst[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  }
}

}  // namespace dt::ops::cpu
