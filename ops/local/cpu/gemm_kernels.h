#pragma once
// Internal to the CPU GEMM: the SIMD inner loops, one set per instruction set, picked at run time
// (Note [GEMM kernels] in gemm_kernels.cc). Everything around them (packing, blocking, threading,
// bias and rounding) is shared and lives in gemm_packed.cc and gemm.cc.

#include <cstdint>
#include <optional>
#include <vector>

#include "dtensor/ops/local/cpu/prefetch.h"

namespace dt::ops::cpu::gemm {

// kGeneric is plain C++ (any CPU); kAvx2 needs AVX2 + FMA + F16C (x86-64-v3); kAvx512 needs
// AVX-512 F/BW/DQ/VL; kAvx512Bf16 adds AVX512_BF16 (Zen 4+, Cooper Lake, Sapphire Rapids+) for
// bf16 products (Note [bf16 dot products] in gemm_kernels.cc). The x86 sets are compiled with
// function target attributes, so one binary carries them all whatever -march says and runs the
// best one the CPU (and OS) supports. Each level includes the ones before it.
enum class Isa : uint8_t { kGeneric, kAvx2, kAvx512, kAvx512Bf16 };

const char* IsaName(Isa isa);
bool IsaSupported(Isa isa);
// The set Matmul uses: a test's, else TunedIsa() (Note [Tuned instruction set] in isa_choice.h).
Isa ActiveIsa();
// A test's set, else the most preferred supported one: what the tuner's cache key names.
Isa BaseIsa();
// The candidates of the knob gemm.isa (IsaKnob() in gemm_dispatch.h), most preferred first.
std::vector<Isa> IsaCandidates();
// The set gemm.isa picks on this CPU.
Isa TunedIsa();
// Tests: force `isa` (must be supported), or go back to the knob's with nullopt.
void SetIsaForTesting(std::optional<Isa> isa);

// How the skinny kernels read the right operand w (weights): its element type.
enum class Elem : uint8_t { kF32, kBF16, kF16 };

// How the dot kernels read the weight rows for one row of x (Note [Skinny dot order] in
// gemm_kernels.cc): `rows` side by side (8 or 4; at most the set's widest tile, 4 with AVX2's 16
// vector registers) when a row holds at least `from_bytes`, else one at a time; rows = 1: one at a
// time always. The tuner's knob gemm.skinny_rows settles it per CPU.
struct DotOrder {
  int rows = 8;
  int64_t from_bytes = int64_t{4} << 10;
};

struct Kernels {
  Isa isa;
  int mr, nr;  // the packed GEMM's micro-tile: mr rows by nr columns of the output

  // Micro-kernel of the packed GEMM: for i < mr, j < nr,
  //   c[i * ldc + j] = (accumulate ? c[i * ldc + j] : 0) + sum_{p < kc} ap[p * mr + i] * bp[p * nr + j]
  // ap and bp are packed panels (gemm_packed.cc), 64-byte aligned; kc >= 1.
  void (*micro)(int64_t kc, const float* ap, const float* bp, float* c, int64_t ldc,
                bool accumulate);
  // bf16 micro-kernel, or null: the same product for bf16 operands packed in pairs along k,
  //   c[i * ldc + j] = (accumulate ? c : 0) + sum_{p < kp} sum_{h < 2} A(i, 2p + h) * B(2p + h, j)
  // where ap[p * mr + i] holds the bf16 pair A(i, 2p), A(i, 2p + 1) (low half first) and
  // bp[p * nr + j] the pair B(2p, j), B(2p + 1, j); kp >= 1 pairs.
  void (*micro_bf16)(int64_t kp, const uint32_t* ap, const uint32_t* bp, float* c, int64_t ldc,
                     bool accumulate);

  // Skinny products for m = 1..8 rows of x (f32, rows ldx apart, each readable and zero up to k
  // rounded up to 16), every w element read once, converted to f32 in registers:
  //   dot:  c[i * ldc + j] = sum_{p < k} x[i * ldx + p] * w[j * ldw + p]   (w [n, k], rows contiguous)
  //   axpy: c[i * ldc + j] = sum_{p < k} x[i * ldx + p] * w[p * ldw + j]   (w [k, n], rows contiguous)
  // w is f32 (float*) or bf16/f16 (uint16_t* bits) as `elem` says. k, n >= 1. The x86 kernels
  // prefetch w ahead of their reads with pf's hint (dot: pf.distance bytes ahead; axpy: the next
  // pass's rows), Note [Skinny prefetch]; dot reads w's rows for m = 1 in `order`.
  void (*dot)(int m, int64_t n, int64_t k, const float* x, int64_t ldx, const void* w,
              int64_t ldw, Elem elem, float* c, int64_t ldc, Prefetch pf, DotOrder order);
  void (*axpy)(int m, int64_t n, int64_t k, const float* x, int64_t ldx, const void* w,
               int64_t ldw, Elem elem, float* c, int64_t ldc, Prefetch pf);
  // dot for bf16 x and w on bf16 dot products, or null: x rows are bf16 bits, each readable and
  // zero up to k rounded up to 32.
  void (*dot_bf16)(int m, int64_t n, int64_t k, const uint16_t* x, int64_t ldx, const uint16_t* w,
                   int64_t ldw, float* c, int64_t ldc, Prefetch pf, DotOrder order);
};

// The kernel set of `isa` (which must be supported).
const Kernels& KernelsFor(Isa isa);

// Most rows of x the skinny kernels take.
inline constexpr int kSkinnyMaxRows = 8;

}  // namespace dt::ops::cpu::gemm
