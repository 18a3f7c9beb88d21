// The packed, cache-blocked GEMM for M > 8 rows (prefill, batched products).
//
// Note [Packed GEMM]
// The Goto/BLIS scheme: the output is cut into micro-tiles of mr x nr kept in registers (Note [GEMM
// kernels]), and both operands are first copied ("packed") into f32 panels laid out in the order
// the micro-kernel reads them, so that its loads are contiguous, aligned and from cache:
//
//   loop                         packed operand            lives in        sized by
//   K super-block (<= 4096 rows) --                        --              kMaxKBlock
//   N block of nc columns        B: [nc/nr][K block][nr]   L3 (<= 8 MiB)   kPackedBBytes
//   task: mc rows x a chunk of the nc columns (oneTBB parallel_for)
//     k step of kc rows          A: [mc/mr][kc][mr]        L2 (192 KiB)    kKc, kMcTarget
//       B micro-panel            kc x nr                   L1 (32 KiB)
//         A micro-panel          kc x mr                   streamed from L2
//
// Packing is also where dtypes are handled: bf16/f16 operands are widened to f32 while being
// copied, which the copy costs anyway, or, for bf16 on AVX512_BF16, packed as bf16 pairs along k
// for the vdpbf16ps micro-kernel (Note [bf16 GEMM] in gemm.cc); transposed or column-major
// operands cost little more (8 x 8 register transposes). B is packed once per block by all threads together and shared; A
// too, once per K super-block, when it fits in kSharedABytes (prefill-sized M: a task would
// otherwise pack its rows again for every column chunk, which for a 512-wide output cost as much
// as a fifth of the micro-kernels' time); a larger A is packed by each task for its rows.
//
// Threading: tasks are (block of mc rows) x (chunk of the block's columns), at least
// kTasksPerThread per thread where the shape allows, so that oneTBB can rebalance when a core is
// shared with other processes. A task owns its output region for the whole K super-block, so with
// one super-block (K <= 4096, every Llama/Flux projection) a bf16 product accumulates in a small
// per-task f32 scratch and is rounded into the output while it is still in cache; only longer K
// needs a full f32 scratch of the output. Bias and rounding happen once, after the last k step.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <type_traits>

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#endif

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include "absl/strings/str_cat.h"
#include "dtensor/ops/local/cpu/gemm_paths.h"
#include "dtensor/ops/local/cpu/gemm_scratch.h"

namespace dt::ops::cpu::gemm {

namespace {

constexpr int64_t kKc = 256;
constexpr int64_t kMcTarget = 192;
constexpr int64_t kMaxKBlock = 4096;
constexpr int64_t kPackedBBytes = int64_t{8} << 20;
constexpr int64_t kSharedABytes = int64_t{4} << 20;
constexpr int64_t kMinChunkCols = 256;
constexpr int kTasksPerThread = 4;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

template <typename T>
inline float ToF32(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return BitsFloat(uint32_t{v.bits} << 16);
  } else {
    return Float16::ToFloat(v.bits);
  }
}

#if defined(__AVX2__) && defined(__F16C__)
#define DT_PACK_AVX2 1
// r[i] = line i, 8 elements; on return out[q] holds element q of every line (an 8 x 8 transpose of
// 32-bit elements; bit-exact, whatever they are).
inline void Transpose8x8(const __m256 (&r)[8], __m256 (&out)[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
  out[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  out[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  out[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  out[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  out[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  out[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  out[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  out[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// The first `count` (1..8) 32-bit elements of v to d.
inline void StoreFirst(void* d, __m256 v, int64_t count) {
  if (count == 8) {
    _mm256_storeu_ps(static_cast<float*>(d), v);
  } else if (count == 4) {
    _mm_storeu_ps(static_cast<float*>(d), _mm256_castps256_ps128(v));
  } else {
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, v);
    std::memcpy(d, tmp, static_cast<size_t>(count) * sizeof(float));
  }
}
#else
#define DT_PACK_AVX2 0
#endif

// dst[q * width + i] = src[i * ld + q] (widened to f32) for i < count <= width, q < kc; zero for
// count <= i < width. Packing a row-major A panel or a column-major B panel is this transpose of
// `count` lines, each contiguous along k. With AVX2 (the build's x86-64-v3 baseline), 8 lines x 8
// k at a time go through an 8 x 8 register transpose: a scalar loop stores one float per cycle at
// best, and a Linear weight (B column-major) is packed this way for every prefill.
template <typename T>
void Interleave(const T* src, int64_t ld, int64_t count, int64_t kc, int width, float* dst) {
  int64_t q0 = 0;
#if DT_PACK_AVX2
  for (; q0 + 8 <= kc; q0 += 8) {
    for (int64_t i0 = 0; i0 < count; i0 += 8) {
      const int64_t lines = std::min<int64_t>(8, count - i0);
      __m256 r[8];
      for (int64_t i = 0; i < 8; ++i) {
        if (i >= lines) {
          r[i] = _mm256_setzero_ps();
          continue;
        }
        const T* line = src + (i0 + i) * ld + q0;
        if constexpr (std::is_same_v<T, float>) {
          r[i] = _mm256_loadu_ps(line);
        } else {
          const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(line));
          if constexpr (std::is_same_v<T, BFloat16>) {
            r[i] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
          } else {
            r[i] = _mm256_cvtph_ps(h);
          }
        }
      }
      __m256 out[8];
      Transpose8x8(r, out);
      for (int64_t q = 0; q < 8; ++q) StoreFirst(dst + (q0 + q) * width + i0, out[q], lines);
    }
  }
#endif
  for (int64_t i = 0; i < count; ++i) {
    const T* line = src + i * ld;
    for (int64_t q = q0; q < kc; ++q) dst[q * width + i] = ToF32(line[q]);
  }
  for (int64_t q = 0; q < kc; ++q) {
    for (int64_t i = count; i < width; ++i) dst[q * width + i] = 0.0f;
  }
}

// bf16 pairs along k for the AVX512_BF16 micro-kernel (Note [bf16 dot products]):
//   dst[p * width + i] = bits(x(i, 2p)) | bits(x(i, 2p + 1)) << 16
// for i < count <= width and p < ceil(kc / 2), where x(i, q) = src[i * ls + q * ks] and
// x(i, kc) = 0; zero for count <= i < width. Fast paths for lines contiguous along k (ks == 1: a
// transpose of 32-bit pairs, as Interleave) and for k-rows contiguous across lines (ls == 1: two
// rows zipped).
void InterleavePairs(const uint16_t* src, int64_t ls, int64_t ks, int64_t count, int64_t kc,
                     int width, uint32_t* dst) {
  const int64_t full = kc / 2, pairs = (kc + 1) / 2;
  int64_t p0 = 0;
#if DT_PACK_AVX2
  if (ks == 1) {
    for (; p0 + 8 <= full; p0 += 8) {
      for (int64_t i0 = 0; i0 < count; i0 += 8) {
        const int64_t lines = std::min<int64_t>(8, count - i0);
        __m256 r[8];
        for (int64_t i = 0; i < 8; ++i) {
          r[i] = i < lines ? _mm256_castsi256_ps(_mm256_loadu_si256(
                                 reinterpret_cast<const __m256i*>(src + (i0 + i) * ls + 2 * p0)))
                           : _mm256_setzero_ps();
        }
        __m256 out[8];
        Transpose8x8(r, out);
        for (int64_t q = 0; q < 8; ++q) StoreFirst(dst + (p0 + q) * width + i0, out[q], lines);
      }
    }
  } else if (ls == 1) {
    for (; p0 < full; ++p0) {
      const uint16_t* r0 = src + 2 * p0 * ks;
      const uint16_t* r1 = r0 + ks;
      uint32_t* d = dst + p0 * width;
      int64_t i = 0;
      for (; i + 16 <= count; i += 16) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + i));
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + i));
        const __m256i lo = _mm256_unpacklo_epi16(a, b), hi = _mm256_unpackhi_epi16(a, b);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
      }
      for (; i < count; ++i) d[i] = uint32_t{r0[i]} | uint32_t{r1[i]} << 16;
    }
  }
#endif
  for (int64_t p = p0; p < pairs; ++p) {
    for (int64_t i = 0; i < count; ++i) {
      const uint16_t* line = src + i * ls;
      const uint32_t hi = 2 * p + 1 < kc ? line[(2 * p + 1) * ks] : 0;
      dst[p * width + i] = uint32_t{line[2 * p * ks]} | hi << 16;
    }
  }
  for (int64_t p = 0; p < pairs; ++p) {
    for (int64_t i = count; i < width; ++i) dst[p * width + i] = 0;
  }
}

// ap[q * mr + i] = a(i, q) for i < rows (zero for rows <= i < mr), q < kc.
template <typename T>
void PackAPanel(const T* a, int64_t rs, int64_t cs, int64_t rows, int64_t kc, int mr, float* ap) {
  if (cs == 1) return Interleave(a, rs, rows, kc, mr, ap);
  for (int64_t q = 0; q < kc; ++q) {
    const T* src = a + q * cs;
    for (int64_t i = 0; i < rows; ++i) ap[q * mr + i] = ToF32(src[i * rs]);
    for (int64_t i = rows; i < mr; ++i) ap[q * mr + i] = 0.0f;
  }
}

// bp[q * nr + j] = b(q, j) for j < cols (zero for cols <= j < nr), q < kc.
template <typename T>
void PackBPanel(const T* b, int64_t rs, int64_t cs, int64_t cols, int64_t kc, int nr, float* bp) {
  if (cs != 1) return Interleave(b, cs, cols, kc, nr, bp);
  for (int64_t q = 0; q < kc; ++q) {
    const T* src = b + q * rs;
    float* dst = bp + q * nr;
    for (int64_t j = 0; j < cols; ++j) dst[j] = ToF32(src[j]);
    for (int64_t j = cols; j < nr; ++j) dst[j] = 0.0f;
  }
}

template <typename T>
absl::Status PackedT(const Problem& p, const Kernels& ks, bool parallel) {
  const int64_t m = p.m, n = p.n, k = p.k;
  const int mr = ks.mr, nr = ks.nr;
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  T* out = static_cast<T*>(p.out);
  const int threads = parallel ? AvailableThreads() : 1;
  // bf16 on AVX512_BF16: operands packed as pairs along k (Note [bf16 dot products]); a packed
  // panel then holds units(len) 32-bit words per row or column for len values of k.
  const bool pairs = std::is_same_v<T, BFloat16> && ks.micro_bf16 != nullptr;
  auto units = [pairs](int64_t len) { return pairs ? (len + 1) / 2 : len; };
  auto bits = [](const T* x) { return reinterpret_cast<const uint16_t*>(x); };
  auto words = [](float* x) { return reinterpret_cast<uint32_t*>(x); };

  const int64_t kblocks = CeilDiv(k, kMaxKBlock);
  const int64_t kb_len = CeilDiv(k, kblocks);
  const int64_t nc = std::min(RoundUp(n, nr), std::max<int64_t>(
      nr, kPackedBBytes / (kb_len * static_cast<int64_t>(sizeof(float))) / nr * nr));
  const int64_t ic_blocks = CeilDiv(m, kMcTarget);
  const int64_t mc = RoundUp(CeilDiv(m, ic_blocks), mr);

  // Where the f32 sums accumulate: the output itself (f32), a scratch of the whole output (half
  // types with several K super-blocks), or a per-task scratch of its region (half types, one).
  const bool f32_out = std::is_same_v<T, float>;
  const bool full_scratch = !f32_out && kblocks > 1;
  std::optional<ScratchBuffer> c_full;
  if (full_scratch) c_full.emplace(ScratchSlot::kC, m * n);
  if (full_scratch && c_full->data() == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("Matmul: out of memory for a ", m, "x", n,
                                                     " f32 scratch"));
  }
  ScratchBuffer packed_b(ScratchSlot::kPackedB, nc * kb_len);
  if (packed_b.data() == nullptr) {
    return absl::ResourceExhaustedError("Matmul: out of memory for the packed B block");
  }
  float* bp_all = packed_b.data();
  std::atomic<bool> out_of_memory{false};

  // Rows [r0, r0 + count) x k [q0, q0 + kc) of A as one packed panel at dst.
  auto pack_a = [&](int64_t r0, int64_t count, int64_t q0, int64_t kc, float* dst) {
    const T* src = a + r0 * p.a_rs + q0 * p.a_cs;
    if (pairs) {
      InterleavePairs(bits(src), p.a_rs, p.a_cs, count, kc, mr, words(dst));
    } else {
      PackAPanel(src, p.a_rs, p.a_cs, count, kc, mr, dst);
    }
  };
  // A packed once per K super-block for all tasks, when it is small enough to stay in the cache
  // (kSharedABytes); otherwise each task packs the rows it needs, once per column chunk. Layout:
  // k step s at s * mpad * units(kKc), row panel r at r * units(kc) within it (as a task's own).
  const int64_t mpad = RoundUp(m, mr);
  const int64_t step_units = mpad * units(kKc);
  const bool shared_a = threads > 1 && CeilDiv(kb_len, kKc) * step_units * 4 <= kSharedABytes;
  std::optional<ScratchBuffer> a_all;
  if (shared_a) {
    a_all.emplace(ScratchSlot::kSharedA, CeilDiv(kb_len, kKc) * step_units);
    if (a_all->data() == nullptr) {
      return absl::ResourceExhaustedError("Matmul: out of memory for the packed A block");
    }
  }

  for (int64_t kb0 = 0; kb0 < k; kb0 += kb_len) {
    const int64_t klen = std::min(kb_len, k - kb0);
    const bool first_kb = kb0 == 0, last_kb = kb0 + klen == k;
    if (shared_a) {
      const int64_t steps = CeilDiv(klen, kKc), row_panels = mpad / mr;
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, steps * row_panels, 1),
                        [&](const tbb::blocked_range<int64_t>& r) {
                          for (int64_t t = r.begin(); t != r.end(); ++t) {
                            const int64_t s = t / row_panels, ir = t % row_panels * mr;
                            const int64_t q0 = kb0 + s * kKc, kc = std::min(kKc, kb0 + klen - q0);
                            pack_a(ir, std::min<int64_t>(mr, m - ir), q0, kc,
                                   a_all->data() + s * step_units + ir * units(kc));
                          }
                        });
    }
    for (int64_t j0 = 0; j0 < n; j0 += nc) {
      const int64_t ncur = std::min(nc, n - j0);
      const int64_t panels = CeilDiv(ncur, nr);
      auto pack_b = [&](int64_t lo, int64_t hi) {
        for (int64_t pn = lo; pn < hi; ++pn) {
          const int64_t col = j0 + pn * nr;
          const T* src = b + kb0 * p.b_rs + col * p.b_cs;
          float* dst = bp_all + pn * nr * units(klen);
          if (pairs) {
            InterleavePairs(bits(src), p.b_cs, p.b_rs, std::min<int64_t>(nr, n - col), klen, nr, words(dst));
          } else {
            PackBPanel(src, p.b_rs, p.b_cs, std::min<int64_t>(nr, n - col), klen, nr, dst);
          }
        }
      };
      if (threads > 1 && panels > 1) {
        tbb::parallel_for(tbb::blocked_range<int64_t>(0, panels, std::max<int64_t>(1, panels / (4 * threads))),
                          [&](const tbb::blocked_range<int64_t>& r) { pack_b(r.begin(), r.end()); });
      } else {
        pack_b(0, panels);
      }

      // Tasks: ic_blocks x chunks of the panels.
      int64_t chunks = 1;
      if (threads > 1) {
        chunks = std::clamp<int64_t>(CeilDiv(kTasksPerThread * threads, ic_blocks), 1,
                                     std::max<int64_t>(1, panels * nr / kMinChunkCols));
      }
      const int64_t chunk_panels = CeilDiv(panels, chunks);
      chunks = CeilDiv(panels, chunk_panels);
      const int64_t tasks = ic_blocks * chunks;

      auto run_task = [&](int64_t t) {
        const int64_t i0 = (t / chunks) * mc;
        if (i0 >= m) return;
        const int64_t rows = std::min(mc, m - i0);
        const int64_t pan0 = (t % chunks) * chunk_panels;
        const int64_t pan1 = std::min(panels, pan0 + chunk_panels);
        const int64_t col0 = j0 + pan0 * nr;
        const int64_t cols = std::min(n, j0 + pan1 * nr) - col0;
        std::optional<ScratchBuffer> packed_a;
        if (!shared_a) packed_a.emplace(ScratchSlot::kPackedA, RoundUp(rows, mr) * std::min(kKc, klen));
        const bool region_scratch = !f32_out && !full_scratch;
        const int64_t region_ld = RoundUp(cols, 16);
        std::optional<ScratchBuffer> c_region;
        if (region_scratch) c_region.emplace(ScratchSlot::kC, rows * region_ld);
        if ((packed_a && packed_a->data() == nullptr) || (region_scratch && c_region->data() == nullptr)) {
          out_of_memory = true;
          return;
        }
        float* c;
        int64_t ldc;
        if (f32_out) {
          c = reinterpret_cast<float*>(out) + i0 * p.ldo + col0;
          ldc = p.ldo;
        } else if (full_scratch) {
          c = c_full->data() + i0 * n + col0;
          ldc = n;
        } else {
          c = c_region->data();
          ldc = region_ld;
        }
        alignas(64) float edge[16 * 32];
        for (int64_t q0 = kb0; q0 < kb0 + klen; q0 += kKc) {
          const int64_t kc = std::min(kKc, kb0 + klen - q0);
          const int64_t ku = units(kc);
          float* ap;
          if (shared_a) {
            ap = a_all->data() + (q0 - kb0) / kKc * step_units + i0 * ku;
          } else {
            ap = packed_a->data();
            for (int64_t ir = 0; ir < rows; ir += mr) pack_a(i0 + ir, std::min<int64_t>(mr, rows - ir), q0, kc, ap + ir * ku);
          }
          const bool accumulate = !first_kb || q0 > kb0;
          auto micro = [&](const float* apanel, const float* bpanel, float* ct, int64_t ldct, bool acc) {
            if (pairs) {
              ks.micro_bf16(ku, reinterpret_cast<const uint32_t*>(apanel),
                            reinterpret_cast<const uint32_t*>(bpanel), ct, ldct, acc);
            } else {
              ks.micro(kc, apanel, bpanel, ct, ldct, acc);
            }
          };
          for (int64_t pn = pan0; pn < pan1; ++pn) {
            const float* bp = bp_all + pn * nr * units(klen) + units(q0 - kb0) * nr;
            const int64_t jc = (pn - pan0) * nr;
            const int64_t ncols = std::min<int64_t>(nr, cols - jc);
            for (int64_t ir = 0; ir < rows; ir += mr) {
              const int64_t mrows = std::min<int64_t>(mr, rows - ir);
              float* ct = c + ir * ldc + jc;
              if (mrows == mr && ncols == nr) {
                micro(ap + ir * ku, bp, ct, ldc, accumulate);
                continue;
              }
              micro(ap + ir * ku, bp, edge, nr, false);
              for (int64_t i = 0; i < mrows; ++i) {
                for (int64_t j = 0; j < ncols; ++j) {
                  ct[i * ldc + j] = (accumulate ? ct[i * ldc + j] : 0.0f) + edge[i * nr + j];
                }
              }
            }
          }
        }
        if (last_kb) {
          FinishRows(rows, cols, c, ldc, p.bias != nullptr ? p.bias + col0 : nullptr, p.dtype,
                     out + i0 * p.ldo + col0, p.ldo);
        }
      };
      if (threads > 1 && tasks > 1) {
        tbb::parallel_for(tbb::blocked_range<int64_t>(0, tasks, 1),
                          [&](const tbb::blocked_range<int64_t>& r) {
                            for (int64_t t = r.begin(); t != r.end(); ++t) run_task(t);
                          },
                          tbb::simple_partitioner());
      } else {
        for (int64_t t = 0; t < tasks; ++t) run_task(t);
      }
      if (out_of_memory) {
        return absl::ResourceExhaustedError("Matmul: out of memory for GEMM scratch buffers");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Packed(const Problem& p, const Kernels& ks, bool parallel) {
  switch (p.dtype) {
    case DType::kBF16: return PackedT<BFloat16>(p, ks, parallel);
    case DType::kF16: return PackedT<Float16>(p, ks, parallel);
    default: return PackedT<float>(p, ks, parallel);
  }
}

}  // namespace dt::ops::cpu::gemm
