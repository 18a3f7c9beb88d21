#pragma once
// Internal to the CPU attention: one task of the flash path (Note [Flash attention on the CPU] in
// attention.cc) for plain C++, AVX2, AVX-512 and AVX-512 with bf16 dot products, picked at run time
// as the GEMM's kernels are (Note [GEMM kernels] in gemm_kernels.cc).

#include <cstdint>
#include <optional>

namespace dt::ops::cpu::attention {

// kGeneric is plain C++ (any CPU); kAvx2 needs AVX2 + FMA (x86-64-v3); kAvx512 needs AVX-512
// F/BW/DQ/VL; kAvx512Bf16 adds AVX512_BF16, whose vdpbf16ps multiplies bf16 queries with bf16 keys
// and bf16-rounded probabilities with bf16 values. Each level includes the ones before it.
enum class Isa : uint8_t { kGeneric, kAvx2, kAvx512, kAvx512Bf16 };

const char* IsaName(Isa isa);
bool IsaSupported(Isa isa);
// The set the kernel uses: the best supported one, unless a test forced another.
Isa ActiveIsa();
// Tests and benches: force `isa` (must be supported), or go back to the detected one with nullopt.
void SetIsaForTesting(std::optional<Isa> isa);

// How q, k and v are stored: f32, or bf16 (the bits, as uint16_t).
enum class Elem : uint8_t { kF32, kBF16 };

// One task: the `group` x `rows` stacked query rows of one KV head (row rr = hg * rows + r is query
// r of the group's head hg) against keys and values [0, kv_end).
struct FlashTask {
  int64_t group = 1, rows = 0;
  int64_t d = 0, dv = 0;
  // Element c of stacked row (hg, r) at q[hg * q_hs + r * q_rs + c * q_cs].
  const void* q = nullptr;
  int64_t q_hs = 0, q_rs = 0, q_cs = 1;
  // Key j's d elements at k + j * k_rs, value j's dv at v + j * v_rs (rows of unit stride).
  const void* k = nullptr;
  int64_t k_rs = 0;
  const void* v = nullptr;
  int64_t v_rs = 0;
  int64_t kv_end = 0;  // >= 1
  // Causal: row (hg, r) sees keys j < min(kv_end, limit0 + r); otherwise every key.
  bool causal = false;
  int64_t limit0 = 0;
  float scale = 1;
  int64_t kv_block = 64;  // >= 1
  // The result, f32: softmax(q kᵀ scale) v of row (hg, r) (zeros where it sees no key) at
  // out + hg * out_hs + r * out_rs, dv elements of unit stride.
  float* out = nullptr;
  int64_t out_hs = 0, out_rs = 0;
};

using FlashFn = void (*)(const FlashTask& task);

// The task function of `isa` (which must be supported) for elements `elem`.
FlashFn FlashFor(Isa isa, Elem elem);

}  // namespace dt::ops::cpu::attention
