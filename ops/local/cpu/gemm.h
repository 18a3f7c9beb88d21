#pragma once
// Internal to the CPU kernels: the single-threaded f32 GEMM the attention kernel calls on its own
// small blocks (gemm.cc, beside the Matmul kernel); our GEMM paths behind both are gemm_paths.h.

#include <cstdint>

#include "absl/status/status.h"
#include "dtensor/ops/local/cpu/gemm_paths.h"

namespace dt::ops::cpu {

// c[M, N] (row-major, leading dimension ldc) = a[M, K] · b[K, N], where element (i, j) of a is
// a[i * a_rs + j * a_cs] (one of a_rs, a_cs is 1; likewise for b). On the calling thread, with our
// own kernels (skinny or packed): the attention kernel parallelises over heads and calls it per
// block. Fails only when scratch memory runs out.
absl::Status Sgemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
                   const float* b, int64_t b_rs, int64_t b_cs, float* c, int64_t ldc);

}  // namespace dt::ops::cpu
