#pragma once
// Internal to the CPU GEMM: the product every path computes, and our own two paths for it (the
// libraries' are gemm_backends.h). The dispatcher that picks among them (gemm_dispatch.h) and the
// Matmul kernel that asks it (gemm.cc) are above this header (Note [Include graph]).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dtensor/core/dtype.h"
#include "dtensor/ops/local/cpu/gemm_kernels.h"

namespace dt::ops::cpu::tune {
struct Knob;
}  // namespace dt::ops::cpu::tune

namespace dt::ops::cpu::gemm {

// One matrix product out[M, N] = a[M, K] · b[K, N] (+ bias), M, N, K >= 1. a, b and out share
// `dtype` (f32, bf16 or f16); element (i, j) of a is at a[i * a_rs + j * a_cs] (likewise b), with
// a_rs or a_cs equal to 1 (likewise b: see the Matmul kernel contract). out has unit column stride
// and rows ldo apart. bias: [N] f32 or null. Products accumulate in f32 and are rounded once.
struct Problem {
  int64_t m = 0, n = 0, k = 0;
  DType dtype = DType::kF32;
  const void* a = nullptr;
  int64_t a_rs = 0, a_cs = 0;
  const void* b = nullptr;
  int64_t b_rs = 0, b_cs = 0;
  void* out = nullptr;
  int64_t ldo = 0;
  const float* bias = nullptr;
};

// Packed, cache-blocked GEMM (Note [Packed GEMM] in gemm_packed.cc); any M. With `parallel`,
// the work is spread over the current oneTBB arena, otherwise it runs on the calling thread.
// Fails only when scratch memory runs out (ResourceExhausted).
absl::Status Packed(const Problem& p, const Kernels& kernels, bool parallel);

// M <= kSkinnyMaxRows: every element of b read once, in place (Note [Skinny GEMM] in
// gemm_skinny.cc), prefetched as the tuner's knob SkinnyPrefetchKnob() says, its rows read in the
// order SkinnyRowsKnob() says and split among the threads as SkinnySplitKnobs() say for its size
// (or as `plan` says). Same contract as Packed, and fails when DT_TUNE is malformed.
absl::Status Skinny(const Problem& p, const Kernels& kernels, bool parallel);
// The skinny kernels' element type of a float dtype (f32 for any other).
inline Elem ElemOf(DType t) {
  return t == DType::kBF16 ? Elem::kBF16 : t == DType::kF16 ? Elem::kF16 : Elem::kF32;
}
// The prefetch SkinnyPrefetchKnob() and the order SkinnyRowsKnob() pick (for callers of the
// skinny kernels themselves).
absl::StatusOr<Prefetch> PickSkinnyPrefetch();
absl::StatusOr<DotOrder> PickDotOrder();
// How one skinny product reads and splits its weights: chunks_per_thread chunks per thread, 0 for
// none (Note [Decode split] in decode_split.cc).
struct SkinnyPlan {
  Prefetch pf;
  int chunks_per_thread = 0;
  DotOrder order;
};
absl::Status Skinny(const Problem& p, const Kernels& kernels, bool parallel,
                    const SkinnyPlan& plan);
const tune::Knob& SkinnyPrefetchKnob();
// gemm.skinny_rows (Note [Skinny dot order] in gemm_kernels.cc).
const tune::Knob& SkinnyRowsKnob();
// gemm.skinny_split.small, .medium, .large.
const std::vector<const tune::Knob*>& SkinnySplitKnobs();

}  // namespace dt::ops::cpu::gemm
