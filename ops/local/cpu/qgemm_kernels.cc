// The quantized GEMM's kernels (Note [Quantized GEMM] in qgemm.cc): plain C++, and the x86 sets
// from qgemm_x86.inc, which differ only in the integer dot product (vpmaddwd + vpaddd on AVX2,
// vpdpwssd on AVX-VNNI and AVX-512 VNNI).

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <cstring>

#include "dtensor/core/quant.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/local/cpu/cpu_info.h"
#include "dtensor/ops/local/cpu/isa_choice.h"
#include "dtensor/ops/local/cpu/qgemm.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DT_QGEMM_X86 1
// GCC 12's AVX-512 intrinsics initialise their undefined operands with themselves, which
// -Wuninitialized reports once inlined (as in gemm_kernels.cc); the pragma must precede the header.
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#else
#define DT_QGEMM_X86 0
#endif

namespace dt::ops::cpu::qgemm {
namespace {

// ---- plain C++ -----------------------------------------------------------------------------------

namespace generic {

// Note [Activation blocks] (qgemm.cc). lrintf rounds half to even, as vcvtps2dq does.
void Quantize(int m, int64_t k, const float* x, int64_t ldx, int16_t* t, float* d, float* s,
              float* h) {
  const int64_t ld = QRowsLd(k);
  for (int i = 0; i < m; ++i) {
    for (int64_t b = 0; b < ld; ++b) {
      const int64_t e = i * ld + b;
      if (b >= k / 32) {
        d[e] = s[e] = h[e] = 0;
        continue;
      }
      const float* xb = x + i * ldx + b * 32;
      float amax = 0;
      bool finite = true;
      for (int p = 0; p < 32; ++p) {
        amax = std::max(amax, std::abs(xb[p]));
        finite &= std::isfinite(xb[p]);
      }
      // A NaN or an infinity makes the block's scale NaN, hence every output it enters.
      const float db = finite ? amax / kActivationMax : std::numeric_limits<float>::quiet_NaN();
      const float id = finite && db > 0 ? 1.0f / db : 0.0f;
      int16_t* tb = t + i * k + b * 32;
      int32_t sum[2] = {0, 0};
      for (int p = 0; p < 32; ++p) {
        tb[p] = static_cast<int16_t>(std::lrintf(xb[p] * id));
        sum[p / 16] += tb[p];
      }
      d[e] = db;
      s[e] = db * static_cast<float>(sum[0] + sum[1]);
      h[e] = db * static_cast<float>(sum[0]);
    }
  }
}

// One 32-element sub-block decoded: element p is d[p / 16] * q[p] + m[p / 16].
struct Sub {
  int16_t q[32];
  float d[2];
  float m[2];
};

void Uniform(Sub* s, float d, float m) {
  s->d[0] = s->d[1] = d;
  s->m[0] = s->m[1] = m;
}

void Nibbles(const uint8_t* qs, int16_t* q) {
  for (int p = 0; p < 16; ++p) {
    q[p] = qs[p] & 0x0F;
    q[p + 16] = qs[p] >> 4;
  }
}

void FifthBits(const uint8_t* qh, int16_t* q) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  for (int p = 0; p < 32; ++p) q[p] = static_cast<int16_t>(q[p] | (((bits >> p) & 1) << 4));
}

void KScales(const uint8_t* b, float* ds, float* ms) {
  const float d = LoadHalf(b), dmin = LoadHalf(b + 2);
  const uint8_t* q = b + 4;
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    if (j < 4) {
      sc = q[j] & 63;
      m = q[j + 4] & 63;
    } else {
      sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
      m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
    ds[j] = d * static_cast<float>(sc);
    ms[j] = -dmin * static_cast<float>(m);
  }
}

void Iq4(const uint8_t* qs, int16_t* q) {
  for (int p = 0; p < 16; ++p) {
    q[p] = kIq4Values[qs[p] & 0x0F];
    q[p + 16] = kIq4Values[qs[p] >> 4];
  }
}

// Q2_K / Q3_K: sub-block s = 4 n + j of a super-block holds, in its halves h, the 2-bit quants
// 2j of bytes [32 n + 16 h, + 16) (core/quant.cc, TwoBitHalves), scale index 2 s + h.
void TwoBits(const uint8_t* qs, int s, int16_t* q) {
  for (int p = 0; p < 32; ++p) q[p] = (qs[32 * (s / 4) + p] >> (2 * (s % 4))) & 3;
}

// The sub-blocks of one block of `dtype` at b (DTypeBlock / 32 of them).
void Decode(DType dtype, const uint8_t* b, Sub* out) {
  switch (dtype) {
    case DType::kQ8_0: {
      for (int p = 0; p < 32; ++p) out->q[p] = static_cast<int8_t>(b[2 + p]);
      return Uniform(out, LoadHalf(b), 0);
    }
    case DType::kQ4_0: {
      const float d = LoadHalf(b);
      Nibbles(b + 2, out->q);
      return Uniform(out, d, -8 * d);
    }
    case DType::kQ4_1:
      Nibbles(b + 4, out->q);
      return Uniform(out, LoadHalf(b), LoadHalf(b + 2));
    case DType::kQ5_0: {
      const float d = LoadHalf(b);
      Nibbles(b + 6, out->q);
      FifthBits(b + 2, out->q);
      return Uniform(out, d, -16 * d);
    }
    case DType::kQ5_1:
      Nibbles(b + 8, out->q);
      FifthBits(b + 4, out->q);
      return Uniform(out, LoadHalf(b), LoadHalf(b + 2));
    case DType::kQ4_K:
    case DType::kQ5_K: {
      float ds[8], ms[8];
      KScales(b, ds, ms);
      const bool five = dtype == DType::kQ5_K;
      const uint8_t* qs = b + (five ? 48 : 16);
      const uint8_t* qh = b + 16;
      for (int j = 0; j < 4; ++j) {
        Sub& lo = out[2 * j];
        Sub& hi = out[2 * j + 1];
        for (int p = 0; p < 32; ++p) {
          lo.q[p] = qs[32 * j + p] & 0x0F;
          hi.q[p] = qs[32 * j + p] >> 4;
          if (five) {
            lo.q[p] = static_cast<int16_t>(lo.q[p] | (((qh[p] >> (2 * j)) & 1) << 4));
            hi.q[p] = static_cast<int16_t>(hi.q[p] | (((qh[p] >> (2 * j + 1)) & 1) << 4));
          }
        }
        Uniform(&lo, ds[2 * j], ms[2 * j]);
        Uniform(&hi, ds[2 * j + 1], ms[2 * j + 1]);
      }
      return;
    }
    case DType::kQ6_K: {
      const float d = LoadHalf(b + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      for (int n = 0; n < 2; ++n) {
        const uint8_t* ql = b + 64 * n;
        const uint8_t* qh = b + 128 + 32 * n;
        for (int s = 0; s < 4; ++s) {
          Sub& o = out[4 * n + s];
          for (int p = 0; p < 32; ++p) {
            const uint8_t l = s % 2 == 0 ? ql[p] : ql[p + 32];
            o.q[p] = static_cast<int16_t>((s < 2 ? l & 0x0F : l >> 4) | (((qh[p] >> (2 * s)) & 3) << 4));
          }
          for (int h = 0; h < 2; ++h) {
            o.d[h] = d * static_cast<float>(sc[8 * n + 2 * s + h]);
            o.m[h] = -32 * o.d[h];
          }
        }
      }
      return;
    }
    case DType::kQ2_K: {
      const float d = LoadHalf(b + 80), dmin = LoadHalf(b + 82);
      for (int s = 0; s < 8; ++s) {
        TwoBits(b + 16, s, out[s].q);
        for (int h = 0; h < 2; ++h) {
          const uint8_t sc = b[2 * s + h];
          out[s].d[h] = d * static_cast<float>(sc & 0xF);
          out[s].m[h] = -dmin * static_cast<float>(sc >> 4);
        }
      }
      return;
    }
    case DType::kQ3_K: {
      // Quants q + 4 (0..7: the third bit set adds 4), offsets -4 scale.
      const float d = LoadHalf(b + 108);
      for (int s = 0; s < 8; ++s) {
        TwoBits(b + 32, s, out[s].q);
        for (int p = 0; p < 32; ++p) {
          out[s].q[p] = static_cast<int16_t>(out[s].q[p] | ((b[p] >> s) & 1) << 2);
        }
        for (int h = 0; h < 2; ++h) {
          out[s].d[h] = d * static_cast<float>(Q3KScale(b + 96, 2 * s + h));
          out[s].m[h] = -4 * out[s].d[h];
        }
      }
      return;
    }
    case DType::kIQ4_NL:
      Iq4(b + 2, out->q);
      return Uniform(out, LoadHalf(b), 0);
    case DType::kIQ4_XS: {
      const float d = LoadHalf(b);
      for (int s = 0; s < 8; ++s) {
        Iq4(b + 8 + 16 * s, out[s].q);
        Uniform(&out[s], d * static_cast<float>(Iq4XsScale(b, s)), 0);
      }
      return;
    }
    default: DT_CHECK(false, "quantized Dot on ", DTypeName(dtype));
  }
}

void Dot(DType dtype, const QRows& x, int64_t n, const uint8_t* w, int64_t row_bytes, float* c,
         int64_t ldc, Prefetch) {
  const int64_t qk = DTypeBlock(dtype), bytes = DTypeBlockBytes(dtype), k = x.k;
  Sub subs[8];
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* row = w + j * row_bytes;
    for (int i = 0; i < x.m; ++i) {
      const int16_t* xt = x.t + i * k;
      const float* xd = x.d + i * x.ld;
      const float* xs = x.s + i * x.ld;
      const float* xh = x.h + i * x.ld;
      float acc = 0;
      for (int64_t b = 0; b < k / qk; ++b) {
        Decode(dtype, row + b * bytes, subs);
        for (int64_t u = 0; u < qk / 32; ++u) {
          const Sub& s = subs[u];
          const int64_t sb = b * (qk / 32) + u;
          int32_t dot[2] = {0, 0};
          for (int p = 0; p < 32; ++p) dot[p / 16] += s.q[p] * xt[32 * sb + p];
          acc += xd[sb] * (s.d[0] * static_cast<float>(dot[0]) + s.d[1] * static_cast<float>(dot[1])) +
                 s.m[0] * xh[sb] + s.m[1] * (xs[sb] - xh[sb]);
        }
      }
      c[i * ldc + j] = acc;
    }
  }
}

}  // namespace generic

// ---- x86 -----------------------------------------------------------------------------------------

#if DT_QGEMM_X86

namespace avx2 {
#define DT_Q_TARGET __attribute__((target("avx2,fma,f16c")))
#define DT_Q_VNNI 0
#define DT_Q_ZMM 0
#include "dtensor/ops/local/cpu/qgemm_x86.inc"
#undef DT_Q_TARGET
#undef DT_Q_VNNI
#undef DT_Q_ZMM
}  // namespace avx2

namespace avxvnni {
#define DT_Q_TARGET __attribute__((target("avxvnni,avx2,fma,f16c")))
#define DT_Q_VNNI 1
#define DT_Q_DPWSSD _mm256_dpwssd_avx_epi32
#define DT_Q_ZMM 0
#include "dtensor/ops/local/cpu/qgemm_x86.inc"
#undef DT_Q_TARGET
#undef DT_Q_VNNI
#undef DT_Q_ZMM
#undef DT_Q_DPWSSD
}  // namespace avxvnni

namespace avx512vnni {
#define DT_Q_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))
#define DT_Q_VNNI 1
#define DT_Q_DPWSSD _mm256_dpwssd_epi32
#define DT_Q_ZMM 1
#include "dtensor/ops/local/cpu/qgemm_x86.inc"
#undef DT_Q_TARGET
#undef DT_Q_VNNI
#undef DT_Q_ZMM
#undef DT_Q_DPWSSD
}  // namespace avx512vnni

#endif

std::array<IsaEntry<Isa>, 4> Sets() {
  constexpr bool kX86 = DT_QGEMM_X86;
  const CpuInfo& cpu = ThisCpu();
  return {{{Isa::kGeneric, "generic", true},
           {Isa::kAvx2, "avx2", kX86 && cpu.avx2},
           {Isa::kAvxVnni, "avx-vnni", kX86 && cpu.avx_vnni},
           {Isa::kAvx512Vnni, "avx512-vnni", kX86 && cpu.avx2 && cpu.avx512_vnni}}};
}

}  // namespace

DT_ISA_FUNCTIONS(Isa, Sets(), &TunedIsa)

int64_t GemmScratchBytes(const Kernels& ks, DType dtype, int64_t n, int64_t k) {
  // Note [Quantized panels]: whole groups of gemm_lanes weight rows.
  const int64_t w = ks.gemm_lanes;
  return w == 0 ? 0 : (n + w - 1) / w * w * (k / 32) * PanelRowBlockBytes(dtype);
}

const Kernels& KernelsFor(Isa isa) {
  DT_CHECK(IsaSupported(isa));
  static const Kernels kGeneric = {generic::Quantize, generic::Dot, nullptr, nullptr, 0, nullptr};
#if DT_QGEMM_X86
  static const Kernels kAvx2 = {avx2::Quantize, avx2::Dot, avx2::Pack, avx2::Panels,
                                avx2::kGemmLanes, nullptr};
  static const Kernels kAvxVnni = {avxvnni::Quantize, avxvnni::Dot, avxvnni::Pack, avxvnni::Panels,
                                   avxvnni::kGemmLanes, nullptr};
  static const Kernels kAvx512Vnni = {avx512vnni::Quantize, avx512vnni::Dot, avx512vnni::Pack,
                                      avx512vnni::Panels, avx512vnni::kGemmLanes,
                                      avx512vnni::DotWide};
  switch (isa) {
    case Isa::kAvx512Vnni: return kAvx512Vnni;
    case Isa::kAvxVnni: return kAvxVnni;
    case Isa::kAvx2: return kAvx2;
    default: break;
  }
#endif
  return kGeneric;
}

}  // namespace dt::ops::cpu::qgemm
