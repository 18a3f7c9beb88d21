#pragma once
// Internal to the CPU kernels: single-threaded f32 GEMM through Eigen.

#include <cstdint>

namespace dt::ops::cpu {

// c[M, N] (row-major, leading dimension ldc) = a[M, K] · b[K, N], where element (i, j) of a is
// a[i * a_rs + j * a_cs] (one of a_rs, a_cs is 1; likewise for b). Single-threaded: callers
// parallelise over blocks. Only f32 GEMM is ever instantiated (see Note [bf16 GEMM]).
void Sgemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
           const float* b, int64_t b_rs, int64_t b_cs, float* c, int64_t ldc);

}  // namespace dt::ops::cpu
