// The SIMD inner loops of the CPU GEMM: micro-kernels of the packed GEMM and the skinny (decode)
// kernels, for plain C++, AVX2 and AVX-512.
//
// Note [GEMM kernels]
// The build targets x86-64-v3 (AVX2 + FMA) so that one binary runs on any x86 machine of the last
// decade, but most current server CPUs (this project's Zen 5 VMs among them) have AVX-512, whose
// 512-bit FMAs double the GEMM peak. The x86 kernels are therefore compiled per instruction set with
// function target attributes (`DT_AVX2`, `DT_AVX512`) and chosen once at run time among those
// CPUID reports (with the OS saving the wide registers) by the tuner's knob gemm.isa (Note [Tuned
// instruction set] in isa_choice.h: the widest set is not the fastest on every CPU). Target
// attributes, not a separate translation unit built with -mavx512f, so that no inline function
// from a header (std::, absl) is ever instantiated with AVX-512 and then picked by the linker for
// code that runs on a CPU without it. Each function that uses a wider set carries the attribute;
// helpers are inlined into callers of the same set.
// That is also why the kernels AVX2 and AVX-512 have in common are written once, in gemm_x86.inc,
// and included into each set's namespace (as qgemm_x86.inc is), not shared as one template: a
// function shared across sets would be compiled for one set only and could not inline the others.
// Each set defines before the include what differs: its widening loads, its partial vectors
// (AVX-512's masks, AVX2's zeroed buffer) and its horizontal sums.
//
// Micro-tiles (rows x columns of the output kept in registers during the k loop):
//   set       tile      accumulators          per k step
//   AVX-512   12 x 32   24 zmm (of 32)        2 loads of B, 12 broadcasts of A, 24 FMAs
//   AVX2       6 x 16   12 ymm (of 16)        2 loads of B,  6 broadcasts of A, 12 FMAs
//   generic    4 x 16   (compiler-vectorized)
// Enough independent accumulators to cover the FMA latency (4 cycles, 2 per cycle) with room for
// the operands.
//
// The skinny kernels (M <= 8: a decode step; Note [Skinny GEMM]) read each weight element exactly
// once, in the layout it is stored (no packing), widen bf16/f16 in registers (bf16 -> f32 is a
// 16-bit shift; f16 through vcvtph2ps) and read the M rows of x, converted to f32 by the caller,
// from L1:
//   dot   (w [n, k], rows contiguous: a Linear weight) keeps M x R dot products in registers, R
//         weight rows at once (R = 8, 4 or 2 as M grows; one row at a time for M = 1,
//         Note [Skinny dot order]), sums each horizontally at the end, four at a time. Where
//         M rows of x would not fit in L1 (M * k * 4 > 24 KiB) k is cut into blocks
//         (DotBlocked). Each tile prefetches the rows a few tiles ahead.
//   axpy  (w [k, n], rows contiguous) streams kAxpyRows rows of w at a time through M output rows
//         held in L1, 16 (8) columns at a time; or, where they fit, in registers (Note [Axpy in
//         registers]).
//
// Note [Axpy in registers]
// Attention's probabilities times values are axpy products with few columns (a head's dv, 64 or
// 128) and M the query heads of a KV head (2-4 in decode): there the passes loaded and stored every
// vector of c once per kAxpyRows rows of w, as many memory operations as FMAs. Where c's M rows are
// 4 or 8 whole vectors and M x that fits kHeldAccumulators registers, AxpyHeld keeps them in
// registers over all k rows of w, read once in order: the same FMAs in the same order, so the
// same bits. Measured on the AMD EPYC Zen 5 VM (2026-12-07, one thread, SmolLM2-135M Q4_1 decode
// at 225-480 cached positions, cpu-clock profiles): the kernel went from 8.3 % to 5.6 % of the
// samples; bench_attention --quick, f32 decode over 2048 positions, 32/8/64 heads: 0.20-0.23 ms
// -> 0.14-0.15 (two interleaved runs; 32/8/128, four query heads of 128 columns, does not fit and
// is unchanged).
//
// Note [Skinny dot order]
// For a single row of x (M = 1, every decode GEMV) the dot kernels read one weight row at a time,
// start to end, with four accumulators over consecutive vectors of k to cover the FMA latency,
// instead of four or eight rows side by side: one sequential stream per thread is what the
// hardware prefetchers follow best. Measured with both variants in one process (this file
// compiled twice into a throwaway harness), interleaved, cold weights (384 MiB), SmolLM2 shapes,
// on the 2-vCPU Zen 5 VM: AVX-512 f32 1.13-1.34x on one thread (36-37 against 27-33 GB/s) and
// 1.05-1.08x on two, bf16 (vdpbf16ps) 1.15-1.27x and 1.07-1.17x; the AVX2 kernels (forced on
// the same CPU) f32 1.15-1.19x and 1.10-1.17x, bf16 1.24-1.34x and 1.15-1.29x. Rows of at least
// 4 KiB were the exception: there several rows side by side read faster. bench_gemm on the
// 2-vCPU Zen 4 VM (2026-12-04, 2 threads, both variants selected by a temporary switch in one
// build): 4096 x 4096 f32 30.5 against 22.5 GB/s with one row (oneDNN and OpenBLAS 30-31), bf16
// 29.5 against 25.2, down_proj (K = 1536, 6 KiB rows) 23.5 against 22.4; the short SmolLM2 rows
// (K = 576) 0.85-0.95x with four. For M >= 2 the side-by-side rows stay: each weight vector then
// meets M rows of x, and one row at a time measured 0.82-0.96x at M = 2 (AVX-512). Eight long rows
// instead of four on AVX-512 (2026-12-05, same VM, idle, 2 threads, interleaved with oneDNN): bf16
// 4096 x 4096 went from 0.78-0.90x oneDNN's GEMV to 0.93-1.00x where the VM streamed about 32 GB/s
// (0.88-0.89 in its 40+ GB/s phases, where oneDNN reads 40-44), f32 stayed level with oneDNN and
// OpenBLAS (31-37 GB/s); sixteen rows measured 0.71-0.85x. The AVX2 kernels (forced, same VM and
// day, interleaved) keep four (16 vector registers, AVX-512 has 32): with eight, 4096 x 4096 fell
// from 0.95-0.98x to 0.83-0.91x oneDNN in f32 and from 0.87-0.89x to 0.66-0.76x in bf16.
// All of that was measured on AMD Zen 4 and Zen 5 only, so for one row of x (every decode GEMV)
// the order is the tuner's knob gemm.skinny_rows (gemm_skinny.cc): how many rows side by side
// (the widest tile or half of it) from which row length, or one at a time always; the 4 KiB
// measured here is its first candidate (OneRowTile reads it; on the 2-vCPU Zen 5 VM of
// 2026-12-07 the tuner picked `1`, one row at a time always, 8-18 % over `8/4k` in five
// calibrations). DotTileRows keeps the register-bound tiles of M >= 2 and DotChains the
// accumulators that cover the FMA latency: what the registers allow, not a CPU's memory.

#include "dtensor/ops/local/cpu/gemm_kernels.h"

#include <algorithm>
#include <cstring>

#include "dtensor/core/dtype.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/local/cpu/isa_choice.h"
#include "dtensor/ops/local/cpu/prefetch.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DT_GEMM_X86 1
// GCC 12's AVX-512 intrinsics initialise their undefined operands with themselves (`__Y = __Y`),
// which -Wuninitialized reports at every use once inlined; the pragma must precede the header.
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#define DT_AVX2 __attribute__((target("avx2,fma,f16c")))
#define DT_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))
#define DT_AVX512BF16 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c")))
#else
#define DT_GEMM_X86 0
#endif

namespace dt::ops::cpu::gemm {

namespace {

// Calls f.template operator()<E>() for the runtime element type e.
template <typename F>
inline void WithElem(Elem e, F&& f) {
  switch (e) {
    case Elem::kF32: return f.template operator()<Elem::kF32>();
    case Elem::kBF16: return f.template operator()<Elem::kBF16>();
    case Elem::kF16: return f.template operator()<Elem::kF16>();
  }
}

// ---- generic C++ ---------------------------------------------------------------------------------

namespace generic {

constexpr int kMr = 4, kNr = 16;

void Micro(int64_t kc, const float* ap, const float* bp, float* c, int64_t ldc, bool accumulate) {
  float r[kMr][kNr] = {};
  for (int64_t p = 0; p < kc; ++p, ap += kMr, bp += kNr) {
    for (int i = 0; i < kMr; ++i) {
      for (int j = 0; j < kNr; ++j) r[i][j] += ap[i] * bp[j];
    }
  }
  for (int i = 0; i < kMr; ++i) {
    for (int j = 0; j < kNr; ++j) c[i * ldc + j] = (accumulate ? c[i * ldc + j] : 0.0f) + r[i][j];
  }
}

template <Elem E>
inline float Widen(const void* w, int64_t i) {
  if constexpr (E == Elem::kF32) {
    return static_cast<const float*>(w)[i];
  } else if constexpr (E == Elem::kBF16) {
    return BitsFloat(uint32_t{static_cast<const uint16_t*>(w)[i]} << 16);
  } else {
    return Float16::ToFloat(static_cast<const uint16_t*>(w)[i]);
  }
}

template <Elem E>
void DotE(int m, int64_t n, int64_t k, const float* x, int64_t ldx, const void* w, int64_t ldw,
          float* c, int64_t ldc, Prefetch) {
  for (int64_t j = 0; j < n; ++j) {
    float acc[kSkinnyMaxRows] = {};
    for (int64_t p = 0; p < k; ++p) {
      const float wv = Widen<E>(w, j * ldw + p);
      for (int i = 0; i < m; ++i) acc[i] += x[i * ldx + p] * wv;
    }
    for (int i = 0; i < m; ++i) c[i * ldc + j] = acc[i];
  }
}

template <Elem E>
void AxpyE(int m, int64_t n, int64_t k, const float* x, int64_t ldx, const void* w, int64_t ldw,
           float* c, int64_t ldc, Prefetch) {
  constexpr int64_t kStrip = 64;
  for (int64_t j0 = 0; j0 < n; j0 += kStrip) {
    const int64_t width = std::min(kStrip, n - j0);
    float acc[kSkinnyMaxRows][kStrip] = {};
    for (int64_t p = 0; p < k; ++p) {
      float wv[kStrip];
      for (int64_t j = 0; j < width; ++j) wv[j] = Widen<E>(w, p * ldw + j0 + j);
      for (int i = 0; i < m; ++i) {
        const float xv = x[i * ldx + p];
        for (int64_t j = 0; j < width; ++j) acc[i][j] += xv * wv[j];
      }
    }
    for (int i = 0; i < m; ++i) std::memcpy(c + i * ldc + j0, acc[i], width * sizeof(float));
  }
}

void Dot(int m, int64_t n, int64_t k, const float* x, int64_t ldx, const void* w, int64_t ldw,
         Elem e, float* c, int64_t ldc, Prefetch pf, DotOrder) {
  WithElem(e, [&]<Elem E>() { DotE<E>(m, n, k, x, ldx, w, ldw, c, ldc, pf); });
}
void Axpy(int m, int64_t n, int64_t k, const float* x, int64_t ldx, const void* w, int64_t ldw,
          Elem e, float* c, int64_t ldc, Prefetch pf) {
  WithElem(e, [&]<Elem E>() { AxpyE<E>(m, n, k, x, ldx, w, ldw, c, ldc, pf); });
}

}  // namespace generic

// Rows of w the axpy kernels read per pass over the output rows.
constexpr int64_t kAxpyRows = 4;

// How far ahead the axpy kernels prefetch w, in bytes: the same column of the next pass's rows,
// at most 32 KiB on. A pass reads kAxpyRows short rows side by side, too short for the hardware
// prefetchers to get ahead of (3 KiB for a 1536-wide bf16 row). The cap was 16 KiB, which put
// the prefetch of a 1536-wide f32 row (24 KiB a pass) inside the pass being read: bench_gemm's
// f32 up_proj (x.w) M = 1 ran at 0.65x OpenBLAS's sgemv on the AMD EPYC (Zen 4) VM.
inline int64_t AxpyPrefetchBytes(int64_t ldw, int64_t size) {
  return std::min<int64_t>(kAxpyRows * ldw * size, 32 << 10);
}

// Calls f.template operator()<M>() for the runtime m in 1..8.
template <typename F>
inline void WithRows(int m, F&& f) {
  switch (m) {
    case 1: return f.template operator()<1>();
    case 2: return f.template operator()<2>();
    case 3: return f.template operator()<3>();
    case 4: return f.template operator()<4>();
    case 5: return f.template operator()<5>();
    case 6: return f.template operator()<6>();
    case 7: return f.template operator()<7>();
    default: return f.template operator()<8>();
  }
}

// A dot tile: c[i * ldc + r] = (accumulate ? c[i * ldc + r] : 0) + x[i, 0:k] . w[r, 0:k]; it also
// prefetches, with the tuner's hint, the same columns of the rows `ahead` elements further on in
// w: about the tuner's distance later in the order the rows are read, so that the next tiles'
// weights are on their way from memory while this one computes (the hardware prefetchers alone
// leave the M = 8 kernels, with the most arithmetic per byte, at half the bandwidth): Note [Skinny
// prefetch]. x is f32 (XT float) or, for the bf16 dot-product kernels, bf16 bits (XT uint16_t).
inline int64_t CeilDivRows(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Weight rows a dot tile reads side by side for m rows of x (Note [Skinny dot order]): one for
// m = 1 (or as the tuner's DotOrder says), else the set's `widest` for m = 2 (kWidestTile: 8 rows
// with AVX-512's 32 vector registers, 4 with AVX2's 16), half of it up to m = 4, a quarter beyond.
constexpr int DotTileRows(int m, int widest) {
  return m == 1 ? 1 : m <= 2 ? widest : m <= 4 ? widest / 2 : widest / 4;
}
// Weight rows a dot tile reads side by side for one row of x against rows of row_bytes, as the
// tuner's `order` says: the set's widest tile, half of it, or one.
constexpr int OneRowTile(DotOrder order, int64_t row_bytes, int widest) {
  return order.rows <= 1 || row_bytes < order.from_bytes ? 1
         : order.rows >= widest                          ? widest
                                                         : widest / 2;
}
// Accumulator sets a dot tile of m x r keeps over consecutive vectors of k, so that at least four
// FMA chains are in flight however few rows there are.
constexpr int DotChains(int m, int r) { return m * r >= 4 ? 1 : 4 / (m * r); }

template <typename XT>
using DotTileFn = void (*)(int64_t k, const XT* x, int64_t ldx, const void* w, int64_t ldw,
                           float* c, int64_t ldc, bool accumulate, int64_t ahead, PrefetchHint hint);

// The dot layout's loop over the n weight rows, R at a time (tile, then tile1 for the rest). When
// the M rows of x would not stay in L1 (M * k * sizeof(XT) over kXBytes), k is cut into blocks
// and rows are taken kGroupRows at a time, so that a block of x is reused from L1 by every row of
// the group while each weight byte is still read once.
template <int M, int R, typename XT>
void DotBlocked(int64_t n, int64_t k, const XT* x, int64_t ldx, const char* w, int64_t ldw,
                int64_t size, float* c, int64_t ldc, DotTileFn<XT> tile, DotTileFn<XT> tile1, Prefetch pf) {
  constexpr int64_t kXBytes = 24 << 10;
  constexpr int64_t kGroupRows = 64;
  constexpr int64_t kb = std::max<int64_t>(256, kXBytes / (int64_t{sizeof(XT)} * M) / 32 * 32);
  auto rows = [&](int64_t j0, int64_t j1, int64_t p0, int64_t kl, bool accumulate) {
    // Tiles of R rows x kl: prefetch about pf.distance bytes ahead of the reads, further along
    // the same rows when a tile is larger than that, else in the rows of the tiles to come.
    const int64_t ahead = R * kl * size > pf.distance
                              ? pf.distance / (R * size)
                              : CeilDivRows(pf.distance, kl * size) * ldw;
    int64_t j = j0;
    for (; j + R <= j1; j += R) {
      tile(kl, x + p0, ldx, w + (j * ldw + p0) * size, ldw, c + j, ldc, accumulate, ahead, pf.hint);
    }
    for (; j < j1; ++j) {
      tile1(kl, x + p0, ldx, w + (j * ldw + p0) * size, ldw, c + j, ldc, accumulate, ahead, pf.hint);
    }
  };
  if (k <= kb) return rows(0, n, 0, k, false);
  for (int64_t j0 = 0; j0 < n; j0 += kGroupRows) {
    const int64_t j1 = std::min(n, j0 + kGroupRows);
    for (int64_t p0 = 0; p0 < k; p0 += kb) rows(j0, j1, p0, std::min(kb, k - p0), p0 > 0);
  }
}

#if DT_GEMM_X86

// Note [Skinny prefetch]
// The skinny kernels' software prefetches of w (dot and axpy, every ISA) take their hint and the
// dot's distance from the tuner (knob gemm.skinny_prefetch, gemm_skinny.cc; Note [Tuner]). What
// was measured before it decided per CPU: on the 2-vCPU AMD EPYC Zen 4 VM (2026-12-06, 2 threads,
// bench_gemm's decode rows with both hints switched at run time in one process, interleaved, cold
// weights) asking for L2 (prefetcht1) instead of L1 (prefetcht0) ran the AVX-512 dot kernels
// 1.1-1.3x faster at M = 1 and 1.1-1.7x at M = 8 on the SmolLM2 shapes (f32 and bf16), 1.15-1.45x
// on rows 4096-14336 wide, the axpy kernels 1.2-1.45x, the AVX2 kernels (forced) 1.0-1.5x: a
// prefetch into L1 holds one of the core's few L1 miss buffers until its line arrives, the same
// buffers the loads need, so the bytes in flight per core stay low, while L2's miss queue is much
// longer. On a 2-vCPU Intel Xeon (Sapphire Rapids or later, 2026-12-06) t1 and t0 measured level
// and no prefetch far worse. A 48 KiB distance instead of 12 KiB gave no more on the EPYC.

// ---- AVX2 + FMA ----------------------------------------------------------------------------------

namespace avx2 {

constexpr int kMr = 6, kNr = 16;
constexpr int kWidestTile = 4;  // skinny dot tile rows (Note [Skinny dot order])
constexpr int kLanes = 8;
constexpr int kHeldAccumulators = 12;  // of the 16 vector registers (Note [Axpy in registers])

// 8 16-bit elements (bf16 or f16 bits) from p, and as f32.
DT_AVX2 inline __m128i LoadHalves(const uint16_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
template <Elem E>
DT_AVX2 inline __m256 Widen(__m128i h) {
  return E == Elem::kBF16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h);
}

// The first `count` (< 8) lanes of a vector. AVX2 has no masked loads of 16-bit elements: a part
// goes through a zeroed buffer.
struct Part {
  int64_t count;
};
inline Part PartOf(int64_t count) { return {count}; }
template <Elem E>
DT_AVX2 inline __m256 LoadWPart(const void* w, int64_t i, Part part) {
  alignas(32) uint32_t tmp[8] = {};
  const size_t size = E == Elem::kF32 ? 4 : 2;
  std::memcpy(tmp, static_cast<const char*>(w) + i * size, static_cast<size_t>(part.count) * size);
  if constexpr (E == Elem::kF32) {
    return _mm256_load_ps(reinterpret_cast<const float*>(tmp));
  } else {
    return Widen<E>(LoadHalves(reinterpret_cast<const uint16_t*>(tmp)));
  }
}
// The rows of x are zero past k up to a multiple of 16 (gemm_skinny.cc pads them): read whole.
DT_AVX2 inline __m256 LoadXPart(const float* x, Part) { return _mm256_loadu_ps(x); }
DT_AVX2 inline __m256 LoadCPart(const float* c, Part part) { return LoadWPart<Elem::kF32>(c, 0, part); }
DT_AVX2 inline void StoreCPart(float* c, Part part, __m256 v) {
  alignas(32) float tmp[8];
  _mm256_store_ps(tmp, v);
  std::memcpy(c, tmp, static_cast<size_t>(part.count) * sizeof(float));
}

// Four horizontal sums at once: {sum(a), sum(b), sum(c), sum(d)}.
DT_AVX2 inline __m128 Hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

#define DT_G_TARGET DT_AVX2
#define DT_G_VEC __m256
#define DT_G_PS(op) _mm256_##op##_ps
#define DT_G_PREFETCH_C 0
#include "dtensor/ops/local/cpu/gemm_x86.inc"
#undef DT_G_TARGET
#undef DT_G_VEC
#undef DT_G_PS
#undef DT_G_PREFETCH_C

}  // namespace avx2

// ---- AVX-512 -------------------------------------------------------------------------------------

namespace avx512 {

constexpr int kMr = 12, kNr = 32;
constexpr int kWidestTile = 8;  // skinny dot tile rows (Note [Skinny dot order])
constexpr int kLanes = 16;
constexpr int kHeldAccumulators = 24;  // of the 32 vector registers (Note [Axpy in registers])

// 16 16-bit elements (bf16 or f16 bits) from p, and as f32.
DT_AVX512 inline __m256i LoadHalves(const uint16_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
template <Elem E>
DT_AVX512 inline __m512 Widen(__m256i h) {
  return E == Elem::kBF16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
}

// The first `count` lanes of a vector: a mask. Only the last, partial vector of a loop uses the
// masked loads and stores (a masked store is slow on AMD and does not forward to a later load).
using Part = __mmask16;
DT_AVX512 inline Part PartOf(int64_t count) {
  return static_cast<__mmask16>(count >= 16 ? 0xffffu : (1u << count) - 1u);
}
template <Elem E>
DT_AVX512 inline __m512 LoadWPart(const void* w, int64_t i, Part mask) {
  if constexpr (E == Elem::kF32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(w) + i);
  } else {
    return Widen<E>(_mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(w) + i));
  }
}
DT_AVX512 inline __m512 LoadXPart(const float* x, Part mask) { return _mm512_maskz_loadu_ps(mask, x); }
DT_AVX512 inline __m512 LoadCPart(const float* c, Part mask) { return _mm512_maskz_loadu_ps(mask, c); }
DT_AVX512 inline void StoreCPart(float* c, Part mask, __m512 v) { _mm512_mask_storeu_ps(c, mask, v); }

// Four horizontal sums at once: {sum(a), sum(b), sum(c), sum(d)}.
DT_AVX512 inline __m128 Hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // Per 128-bit lane: ab = {a0+a2, b0+b2, a1+a3, b1+b3}, likewise cd; then {a, b, c, d} partials.
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 abcd = _mm512_add_ps(
      _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
      _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));
  const __m256 s = _mm256_add_ps(_mm512_extractf32x8_ps(abcd, 0), _mm512_extractf32x8_ps(abcd, 1));
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

#define DT_G_TARGET DT_AVX512
#define DT_G_VEC __m512
#define DT_G_PS(op) _mm512_##op##_ps
#define DT_G_PREFETCH_C 1
#include "dtensor/ops/local/cpu/gemm_x86.inc"
#undef DT_G_TARGET
#undef DT_G_VEC
#undef DT_G_PS
#undef DT_G_PREFETCH_C

}  // namespace avx512

// ---- AVX512_BF16 ---------------------------------------------------------------------------------

// Note [bf16 dot products]
// vdpbf16ps multiplies 16 pairs of bf16 and adds both products to 16 f32 accumulators: the
// products of two bf16 are exact in f32 (8-bit significands), and the two additions round to
// nearest even like two FMAs would, so it computes the f32 accumulation of the widened operands
// (in the order pair element 1, then 0), at twice the FMA rate per instruction. What differs from
// widening: the instruction treats denormal inputs as zero and flushes denormal results (bf16
// denormals are below 1.2e-38, far under anything a network computes). The packed bf16 GEMM
// therefore packs operands as pairs along k (gemm_packed.cc) instead of widening them.
namespace avx512bf16 {

DT_AVX512BF16 void Micro(int64_t kp, const uint32_t* ap, const uint32_t* bp, float* c, int64_t ldc,
                         bool accumulate) {
  constexpr int kMr = avx512::kMr;
  __m512 r[kMr][2];
  avx512::StartMicroTile(r, c, ldc);
  for (int64_t p = 0; p < kp; ++p, ap += kMr, bp += avx512::kNr) {
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_load_si512(bp));
    const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_load_si512(bp + 16));
#pragma GCC unroll 16
    for (int i = 0; i < kMr; ++i) {
      const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(ap[i])));
      r[i][0] = _mm512_dpbf16_ps(r[i][0], a, b0);
      r[i][1] = _mm512_dpbf16_ps(r[i][1], a, b1);
    }
  }
  avx512::StoreMicroTile(r, c, ldc, accumulate);
}

// Skinny dot tile on bf16 pairs: x rows are bf16 bits (zero past k up to a multiple of 32), w
// rows bf16; 32 products per instruction and no widening (Note [bf16 dot products]).
template <int M, int R>
DT_AVX512BF16 void DotTile(int64_t k, const uint16_t* x, int64_t ldx, const void* w, int64_t ldw,
                           float* c, int64_t ldc, bool accumulate, int64_t ahead, PrefetchHint hint) {
  constexpr int U = DotChains(M, R);
  __m512 acc[U][M][R] = {};
  const uint16_t* wb = static_cast<const uint16_t*>(w);
  auto step = [&](int u, int64_t p) DT_AVX512BF16 {
    __m512bh wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      PrefetchLine(wb + r * ldw + ahead + p, hint);
      wv[r] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(wb + r * ldw + p));
    }
#pragma GCC unroll 8
    for (int i = 0; i < M; ++i) {
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + i * ldx + p));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[u][i][r] = _mm512_dpbf16_ps(acc[u][i][r], xv, wv[r]);
    }
  };
  int64_t p = 0;
  for (; p + 32 * U <= k; p += 32 * U) {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) step(u, p + 32 * u);
  }
  for (; p + 32 <= k; p += 32) step(0, p);
  if (p < k) {
    const __mmask32 mask = static_cast<__mmask32>((uint64_t{1} << (k - p)) - 1);
    __m512bh wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      wv[r] = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(mask, wb + r * ldw + p));
    }
#pragma GCC unroll 8
    for (int i = 0; i < M; ++i) {
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(mask, x + i * ldx + p));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[0][i][r] = _mm512_dpbf16_ps(acc[0][i][r], xv, wv[r]);
    }
  }
  avx512::StoreDotSums<U, M, R>(acc, c, ldc, accumulate);
}

template <int M>
void DotRows(int64_t n, int64_t k, const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t ldw,
             float* c, int64_t ldc, Prefetch pf, DotOrder order) {
  const char* wb = reinterpret_cast<const char*>(w);
  constexpr int kWide = avx512::kWidestTile, kHalf = kWide / 2;
  if constexpr (M == 1) {
    switch (OneRowTile(order, k * 2, kWide)) {
      case kWide:
        return DotBlocked<1, kWide, uint16_t>(n, k, x, ldx, wb, ldw, 2, c, ldc, DotTile<1, kWide>,
                                              DotTile<1, 1>, pf);
      case kHalf:
        return DotBlocked<1, kHalf, uint16_t>(n, k, x, ldx, wb, ldw, 2, c, ldc, DotTile<1, kHalf>,
                                              DotTile<1, 1>, pf);
      default: break;
    }
  }
  constexpr int R = DotTileRows(M, kWide);
  DotBlocked<M, R, uint16_t>(n, k, x, ldx, wb, ldw, 2, c, ldc, DotTile<M, R>, DotTile<M, 1>, pf);
}

void Dot(int m, int64_t n, int64_t k, const uint16_t* x, int64_t ldx, const uint16_t* w,
         int64_t ldw, float* c, int64_t ldc, Prefetch pf, DotOrder order) {
  WithRows(m, [&]<int M>() { DotRows<M>(n, k, x, ldx, w, ldw, c, ldc, pf, order); });
}

}  // namespace avx512bf16

#endif  // DT_GEMM_X86

constexpr Kernels kGenericKernels{Isa::kGeneric, generic::kMr, generic::kNr, generic::Micro,
                                  nullptr, generic::Dot, generic::Axpy, nullptr};
#if DT_GEMM_X86
constexpr Kernels kAvx2Kernels{Isa::kAvx2, avx2::kMr, avx2::kNr, avx2::Micro, nullptr, avx2::Dot,
                               avx2::Axpy, nullptr};
constexpr Kernels kAvx512Kernels{Isa::kAvx512, avx512::kMr, avx512::kNr, avx512::Micro, nullptr,
                                 avx512::Dot, avx512::Axpy, nullptr};
constexpr Kernels kAvx512Bf16Kernels{Isa::kAvx512Bf16, avx512::kMr, avx512::kNr, avx512::Micro,
                                     avx512bf16::Micro, avx512::Dot, avx512::Axpy,
                                     avx512bf16::Dot};
#endif

}  // namespace

DT_ISA_FUNCTIONS(Isa, FloatIsaSets<Isa>(DT_GEMM_X86), &TunedIsa)

const Kernels& KernelsFor(Isa isa) {
  DT_CHECK(IsaSupported(isa));
  switch (isa) {
#if DT_GEMM_X86
    case Isa::kAvx512Bf16: return kAvx512Bf16Kernels;
    case Isa::kAvx512: return kAvx512Kernels;
    case Isa::kAvx2: return kAvx2Kernels;
#endif
    default: return kGenericKernels;
  }
}

}  // namespace dt::ops::cpu::gemm
