#pragma once
// Internal to the CPU kernels: the quantized GEMM (Linear with a quantized weight, Note
// [Quantized GEMM] in qgemm.cc) and its per-instruction-set dot kernels (qgemm_kernels.cc).

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "dtensor/core/dtype.h"
#include "dtensor/core/tensor.h"
#include "dtensor/ops/local/cpu/prefetch.h"

namespace dt::ops::cpu::tune {
struct Knob;
}  // namespace dt::ops::cpu::tune

namespace dt::ops::cpu::qgemm {

// Integer dot products of the kernels: kGeneric is plain C++ (any CPU); kAvx2 uses vpmaddwd
// (AVX2 + FMA + F16C); kAvxVnni the VEX vpdpwssd (AVX-VNNI: Alder Lake, Zen 5); kAvx512Vnni the
// EVEX vpdpwssd (AVX-512 VNNI: Ice Lake+, Zen 4+). The x86 sets are compiled with function target
// attributes and picked at run time, as the float GEMM's are (Note [GEMM kernels]).
enum class Isa : uint8_t { kGeneric, kAvx2, kAvxVnni, kAvx512Vnni };
inline constexpr Isa kAllIsas[] = {Isa::kGeneric, Isa::kAvx2, Isa::kAvxVnni, Isa::kAvx512Vnni};

const char* IsaName(Isa isa);
bool IsaSupported(Isa isa);
// The set QuantizedLinear uses: a test's, else TunedIsa() (Note [Tuned instruction set] in
// isa_choice.h).
Isa ActiveIsa();
// A test's set, else the most preferred supported one: what the tuner's cache key names.
Isa BaseIsa();
// The candidates of the knob qgemm.isa (IsaKnob()), most preferred first.
std::vector<Isa> IsaCandidates();
// The set qgemm.isa picks on this CPU.
Isa TunedIsa();
// Tests and benchmarks: force `isa` (must be supported), or go back to the knob's (nullopt).
void SetIsaForTesting(std::optional<Isa> isa);

// Activations quantized to 16-bit integers, one scale per 32 elements (Note [Activation blocks]
// in qgemm.cc): row i's block b holds t[i * k + 32 b ...] and, at [i * ld + b], its scale d,
// s = d * (sum of its 32 t) and h = d * (sum of its first 16). ld >= k / 32 is a multiple of 8,
// and the entries from k / 32 to ld are zero (the kernels read whole groups of eight).
struct QRows {
  int m = 0;
  int64_t k = 0;  // a multiple of 32
  int64_t ld = 0;
  const int16_t* t = nullptr;
  const float* d = nullptr;
  const float* s = nullptr;
  const float* h = nullptr;
  // t again with each pair of blocks' halves interleaved, PairedLd(k) per row: the layout of the
  // 512-bit dot (Kernels::dot_wide, Note [512-bit quantized dot] in qgemm_x86.inc); null where
  // the product does not run it.
  const int16_t* paired = nullptr;
  // `dot` with one row of x reads weight rows of at most this many bytes two at a time (Note
  // [Quantized dot pairs] in qgemm_x86.inc: the tuner's qgemm.dot_pairs); 0: one at a time.
  int64_t pair_bytes = 0;
};

// QRows::ld for k.
inline int64_t QRowsLd(int64_t k) { return (k / 32 + 7) / 8 * 8; }
// QRows::paired's elements per row: pair p of 32-blocks a = 2p, b = 2p + 1 at 64 p holds t's
// a[0, 16), b[0, 16), a[16, 32), b[16, 32) (zeros for the b of an odd last block).
inline int64_t PairedLd(int64_t k) { return (k / 32 + 1) / 2 * 64; }
// The largest |t| (Note [Activation blocks]).
inline constexpr int kActivationMax = 32767;

// Quantizes m rows of k floats (rows ldx apart; k a multiple of 32) into t [m * k] and d, s, h
// [m * QRowsLd(k)] (see QRows); every instruction set's version gives the same bits.
using QuantizeFn = void (*)(int m, int64_t k, const float* x, int64_t ldx, int16_t* t, float* d,
                            float* s, float* h);

// c[i * ldc + j] = sum_p x(i, p) * w(j, p) for i < x.m, j < n, where x(i, p) = d * t of its block
// and w(j, p) is element p of weight row j: the blocks of quantized `dtype` at w + j * row_bytes,
// x.k elements; x.m >= 1, n >= 1. `dot` reads each weight block where it lies and serves four rows
// of x with it (decode, Note [Quantized dot groups]); for prefill, `pack` decodes n weight rows of
// k elements into panels (GemmScratchBytes of them, 64-byte aligned) and `panels` runs
// register tiles over all rows of x against such panels (Note [Quantized panels]); the panels are
// made per call or once per weight (Note [Packed quantized weights] in qgemm.cc).
// `dot` prefetches each weight row as `pf` says (Note [Quantized dot prefetch]); `panels` asks for
// the next register tile's panels with `hint` while it multiplies (Note [Panels prefetch]).
using DotFn = void (*)(DType dtype, const QRows& x, int64_t n, const uint8_t* w, int64_t row_bytes,
                       float* c, int64_t ldc, Prefetch pf);
using PackFn = void (*)(DType dtype, int64_t n, int64_t k, const uint8_t* w, int64_t row_bytes,
                        void* panel);
using PanelsFn = void (*)(DType dtype, const QRows& x, int64_t n, const void* panel, float* c,
                          int64_t ldc, PrefetchHint hint);
struct Kernels {
  QuantizeFn quantize;
  DotFn dot;
  PackFn pack;      // null: no panels (plain C++), `dot` serves every M
  PanelsFn panels;  // null with pack
  int gemm_lanes;   // weight rows per panel vector
  DotFn dot_wide;   // `dot` on 512-bit vectors, reading x.paired; null where the set has none
};
const Kernels& KernelsFor(Isa isa);
// The tuner's knob for the instruction set of the kernels (Note [Tuned instruction set] in
// isa_choice.h): candidates IsaCandidates().
const tune::Knob& IsaKnob();
// The tuner's knob for `dot`'s prefetch (Note [Quantized dot prefetch]).
const tune::Knob& DotPrefetchKnob();
// The tuner's knob for the width of `dot`'s vectors: "256" (`dot`) or "512" (`dot_wide`, where
// the process's set has it; Note [512-bit quantized dot] in qgemm_x86.inc).
const tune::Knob& DotWidthKnob();
// The tuner's knob for the weight rows `dot` reads two at a time for one row of x: "off", or rows
// of at most "512", "1k", "2k" bytes (QRows::pair_bytes; Note [Quantized dot pairs]).
const tune::Knob& DotPairsKnob();
// QRows::pair_bytes of the knob's candidate i.
int64_t DotPairBytes(int candidate);
// The tuner's knob for `panels`' prefetch hint (Note [Panels prefetch] in qgemm_x86.inc).
const tune::Knob& PanelsPrefetchKnob();
// The tuner's knob for the most bytes of panels packed and multiplied as one chunk (Note [Panel
// chunk] in qgemm.cc).
const tune::Knob& PanelChunkKnob();
// The tuner's knobs for the rows of x up to which `dot` runs, not the panels (Note [Dot or panels]
// in qgemm.cc): candidates "4" to "8"; one for panels packed per call, one for a process that
// keeps them.
const tune::Knob& DotMaxRowsKnob(bool kept_panels);
// The tuner's knobs for how `dot`'s products are split among the threads, one per size class of
// the bytes a call reads: qgemm.dot_split.small, .medium, .large (Note [Decode split] in
// decode_split.cc).
const std::vector<const tune::Knob*>& DotSplitKnobs();

// Keeping each weight's prefill panels (Note [Packed quantized weights] in qgemm.cc): at most
// `bytes` of them in this process (0 keeps none and drops those kept); the default is
// DT_QGEMM_PACKED_MB MiB from the environment, else 0. PackedBytes: the bytes kept now.
void SetPackedBudget(int64_t bytes);
int64_t PackedBytes();

// Whether quantized `dtype` scales (and offsets) its weights per 16 elements, not per 32: q6_k, q3_k
// and q2_k.
inline constexpr bool HasHalfBlockScales(DType dtype) {
  return dtype == DType::kQ6_K || dtype == DType::kQ3_K || dtype == DType::kQ2_K;
}
// Bytes of a panel per weight row and 32-element block (Note [Quantized panels] in
// qgemm_x86.inc): 32 8-bit quants, then the block's f32 scale and offset, or two of each for the
// types with per-16 scales.
inline constexpr int64_t PanelRowBlockBytes(DType dtype) {
  return HasHalfBlockScales(dtype) ? 48 : 40;
}
// Bytes of the panels ks.pack makes of n weight rows of k elements of `dtype`.
int64_t GemmScratchBytes(const Kernels& ks, DType dtype, int64_t n, int64_t k);

}  // namespace dt::ops::cpu::qgemm

namespace dt::ops::cpu {
// y [M, N] = x [M, K] · wᵀ (+ bias): x float with unit column stride, rows x.stride(0) apart; w
// quantized [N, K] with contiguous rows; bias undefined or [N] of out's dtype (contiguous); out
// [M, N] contiguous of x's dtype. M, N, K >= 1.
absl::Status QuantizedLinear(const Tensor& x, const Tensor& w, const Tensor& bias,
                             const Tensor& out);
// The same for several weights of K columns (ws[i] [N_i, K], biases[i] undefined or [N_i],
// outs[i] [M, N_i]): x is quantized once and every weight's chunks of rows run in one fork-join
// (Note [Sibling projections] in ops/local/ops.h).
absl::Status QuantizedLinears(const Tensor& x, absl::Span<const Tensor> ws,
                              absl::Span<const Tensor> biases, absl::Span<const Tensor> outs);
}  // namespace dt::ops::cpu
