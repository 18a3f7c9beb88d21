#pragma once
// Internal to the CPU attention: one task of the flash path (Note [Flash attention on the CPU] in
// attention.cc) for plain C++, AVX2, AVX-512 and AVX-512 with bf16 dot products, picked at run time
// as the GEMM's kernels are (Note [GEMM kernels] in gemm_kernels.cc).

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace dt::ops::cpu::attention {

// kGeneric is plain C++ (any CPU); kAvx2 needs AVX2 + FMA (x86-64-v3); kAvx512 needs AVX-512
// F/BW/DQ/VL; kAvx512Bf16 adds AVX512_BF16, whose vdpbf16ps multiplies bf16 queries with bf16 keys
// and bf16-rounded probabilities with bf16 values. Each level includes the ones before it.
enum class Isa : uint8_t { kGeneric, kAvx2, kAvx512, kAvx512Bf16 };

const char* IsaName(Isa isa);
bool IsaSupported(Isa isa);
// The set the kernel uses: a test's, else the one the GEMM's knob gemm.isa picks (the attention
// kernels share the GEMM's sets: Note [Tuned instruction set] in isa_choice.h).
Isa ActiveIsa();
// A test's set, else the most preferred supported one.
Isa BaseIsa();
// The sets gemm.isa may pick, most preferred first.
std::vector<Isa> IsaCandidates();
// Tests and benches: force `isa` (must be supported), or go back to the knob's with nullopt.
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
  // Key j's d elements at k + j * k_rs, value j's dv at v + j * v_rs (rows of unit stride); or,
  // with `pages` (PagedAttention: Note [Paged attention] in attention.cc), at
  // k + pages[j / page] * k_ps + (j % page) * k_rs and likewise for v with v_ps.
  const void* k = nullptr;
  int64_t k_rs = 0;
  const void* v = nullptr;
  int64_t v_rs = 0;
  const int32_t* pages = nullptr;
  int64_t page = 0, k_ps = 0, v_ps = 0;
  int64_t kv_end = 0;  // >= 1
  // Causal: row (hg, r) sees keys j < min(kv_end, limit0 + r); otherwise every key.
  bool causal = false;
  int64_t limit0 = 0;
  float scale = 1;
  // Options (Note [Attention options] in attention.cc), off at their defaults. softcap > 0: scores
  // become softcap · tanh(scores / softcap). window > 0 (causal): row (hg, r) sees no key
  // j < limit0 + r - window. sinks: the logits of the group's heads (sinks[hg]), each in its rows'
  // softmax denominators. mask: f32 added to the scores, row r's key j at mask[r * mask_rs + j].
  float softcap = 0;
  int64_t window = 0;
  const float* sinks = nullptr;
  const float* mask = nullptr;
  int64_t mask_rs = 0;
  int64_t kv_block = 64;  // >= 1
  // The result, f32: softmax(q kᵀ scale) v of row (hg, r) (zeros where it sees no key) at
  // out + hg * out_hs + r * out_rs, dv elements of unit stride.
  float* out = nullptr;
  int64_t out_hs = 0, out_rs = 0;
};

using FlashFn = void (*)(const FlashTask& task);

// Key j of a task (its first element); likewise ValueRow.
template <typename T>
inline const T* KeyRow(const FlashTask& t, int64_t j) {
  const T* k = static_cast<const T*>(t.k);
  if (t.pages == nullptr) return k + j * t.k_rs;
  return k + t.pages[j / t.page] * t.k_ps + j % t.page * t.k_rs;
}
template <typename T>
inline const T* ValueRow(const FlashTask& t, int64_t j) {
  const T* v = static_cast<const T*>(t.v);
  if (t.pages == nullptr) return v + j * t.v_rs;
  return v + t.pages[j / t.page] * t.v_ps + j % t.page * t.v_rs;
}

// Calls f(at, n, k, v) for each run of keys [j0 + at, j0 + at + n) of [j0, j0 + nk) whose rows lie
// k_rs (and v_rs) apart from k (and v): the whole range for contiguous keys, else each page's part.
template <typename T, typename F>
inline void ForRuns(const FlashTask& t, int64_t j0, int64_t nk, F&& f) {
  if (t.pages == nullptr) {
    f(int64_t{0}, nk, KeyRow<T>(t, j0), ValueRow<T>(t, j0));
    return;
  }
  for (int64_t at = 0; at < nk;) {
    const int64_t j = j0 + at, n = std::min(nk - at, t.page - j % t.page);
    f(at, n, KeyRow<T>(t, j), ValueRow<T>(t, j));
    at += n;
  }
}

// The first key any row of a causal task with a window sees (0 without one).
inline int64_t FirstKey(const FlashTask& t) {
  return t.window > 0 ? std::clamp<int64_t>(t.limit0 - t.window, 0, t.kv_end) : 0;
}

// The task function of `isa` (which must be supported) for elements `elem`.
FlashFn FlashFor(Isa isa, Elem elem);

}  // namespace dt::ops::cpu::attention
