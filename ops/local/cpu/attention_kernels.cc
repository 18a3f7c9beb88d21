// The flash path's task (Note [Flash attention on the CPU] in attention.cc) for each instruction
// set: plain C++ here, the x86 sets from attention_x86.inc, compiled per set with target attributes
// and picked at run time (Note [GEMM kernels] in gemm_kernels.cc).

#include "dtensor/ops/local/cpu/attention_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "dtensor/core/dtype.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/local/cpu/gemm_kernels.h"
#include "dtensor/ops/local/cpu/isa_choice.h"
#include "dtensor/ops/local/cpu/vec_math.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DT_ATT_X86 1
// GCC 12's AVX-512 intrinsics initialise their undefined operands with themselves, which
// -Wuninitialized reports once inlined (as in gemm_kernels.cc); the pragma must precede the header.
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#else
#define DT_ATT_X86 0
#endif

namespace dt::ops::cpu::attention {

namespace {

// ---- generic C++ ---------------------------------------------------------------------------------

namespace generic {

template <typename T>
inline float Widen(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return BitsFloat(uint32_t{x} << 16);
  }
}

// The same online softmax over blocks of keys as the x86 sets, one stacked row at a time.
template <typename T>
void Flash(const FlashTask& t) {
  const int64_t m = t.group * t.rows, d = t.d, dv = t.dv;
  const int64_t bk = std::min(t.kv_block, t.kv_end);
  thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(d + bk + dv));
  float* qf = buf.data();
  float* s = qf + d;
  float* o = s + bk;
  const T* q = static_cast<const T*>(t.q);
  for (int64_t rr = 0; rr < m; ++rr) {
    const int64_t hg = rr / t.rows, r = rr % t.rows;
    for (int64_t c = 0; c < d; ++c) qf[c] = Widen(q[hg * t.q_hs + r * t.q_rs + c * t.q_cs]);
    std::fill(o, o + dv, 0.0f);
    const int64_t limit = t.causal ? std::min(t.kv_end, t.limit0 + r) : t.kv_end;
    const int64_t first = t.window > 0 ? std::max<int64_t>(0, t.limit0 + r - t.window) : 0;
    const float* mask = t.mask != nullptr ? t.mask + r * t.mask_rs : nullptr;
    // A sink is a key of score sinks[hg] and no value: the running max and sum start with it.
    float mx = t.sinks != nullptr ? t.sinks[hg] : -INFINITY, l = t.sinks != nullptr ? 1 : 0;
    for (int64_t j0 = first; j0 < limit; j0 += bk) {
      const int64_t nk = std::min(bk, limit - j0);
      float bm = -INFINITY;
      for (int64_t jj = 0; jj < nk; ++jj) {
        const T* kr = KeyRow<T>(t, j0 + jj);
        float dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += qf[c] * Widen(kr[c]);
        s[jj] = dot * t.scale;
        if (t.softcap > 0) s[jj] = t.softcap * std::tanh(s[jj] / t.softcap);
        if (mask != nullptr) s[jj] += mask[j0 + jj];
        bm = std::max(bm, s[jj]);
      }
      const float m_new = std::max(mx, bm), m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = ExpScalar(mx - m_use);
      for (int64_t jj = 0; jj < nk; ++jj) s[jj] -= m_use;
      ExpF32(s, s, nk);
      float sum = 0;
      for (int64_t e = 0; e < dv; ++e) o[e] *= alpha;
      for (int64_t jj = 0; jj < nk; ++jj) {
        sum += s[jj];
        const T* vr = ValueRow<T>(t, j0 + jj);
        for (int64_t e = 0; e < dv; ++e) o[e] += s[jj] * Widen(vr[e]);
      }
      l = l * alpha + sum;
      mx = m_new;
    }
    const float inv = l > 0 ? 1.0f / l : 0.0f;
    float* dst = t.out + hg * t.out_hs + r * t.out_rs;
    for (int64_t e = 0; e < dv; ++e) dst[e] = o[e] * inv;
  }
}

}  // namespace generic

#if DT_ATT_X86

namespace avx2 {
#define DT_ATT_TARGET __attribute__((target("avx2,fma,f16c")))
#define DT_ATT_ZMM 0
#define DT_ATT_DPBF16 0
#include "dtensor/ops/local/cpu/attention_x86.inc"
#undef DT_ATT_TARGET
#undef DT_ATT_ZMM
#undef DT_ATT_DPBF16
}  // namespace avx2

namespace avx512 {
#define DT_ATT_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))
#define DT_ATT_ZMM 1
#define DT_ATT_DPBF16 0
#include "dtensor/ops/local/cpu/attention_x86.inc"
#undef DT_ATT_TARGET
#undef DT_ATT_ZMM
#undef DT_ATT_DPBF16
}  // namespace avx512

namespace avx512bf16 {
#define DT_ATT_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c")))
#define DT_ATT_ZMM 1
#define DT_ATT_DPBF16 1
#include "dtensor/ops/local/cpu/attention_x86.inc"
#undef DT_ATT_TARGET
#undef DT_ATT_ZMM
#undef DT_ATT_DPBF16
}  // namespace avx512bf16

#endif  // DT_ATT_X86

// The attention kernels run the set of the GEMM's knob (their sets are the GEMM's: Note [Tuned
// instruction set]).
Isa GemmsIsa() {
  static_assert(static_cast<int>(Isa::kGeneric) == static_cast<int>(gemm::Isa::kGeneric) &&
                static_cast<int>(Isa::kAvx2) == static_cast<int>(gemm::Isa::kAvx2) &&
                static_cast<int>(Isa::kAvx512) == static_cast<int>(gemm::Isa::kAvx512) &&
                static_cast<int>(Isa::kAvx512Bf16) == static_cast<int>(gemm::Isa::kAvx512Bf16));
  const Isa isa = static_cast<Isa>(gemm::TunedIsa());
  return IsaSupported(isa) ? isa : BaseIsa();
}

}  // namespace

DT_ISA_FUNCTIONS(Isa, FloatIsaSets<Isa>(DT_ATT_X86), &GemmsIsa)

FlashFn FlashFor(Isa isa, Elem elem) {
  DT_CHECK(IsaSupported(isa));
  const bool bf16 = elem == Elem::kBF16;
  switch (isa) {
#if DT_ATT_X86
    case Isa::kAvx512Bf16: return bf16 ? avx512bf16::Flash<uint16_t> : avx512::Flash<float>;
    case Isa::kAvx512: return bf16 ? avx512::Flash<uint16_t> : avx512::Flash<float>;
    case Isa::kAvx2: return bf16 ? avx2::Flash<uint16_t> : avx2::Flash<float>;
#endif
    default: return bf16 ? generic::Flash<uint16_t> : generic::Flash<float>;
  }
}

}  // namespace dt::ops::cpu::attention
