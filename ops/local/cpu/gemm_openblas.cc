// f32 products on OpenBLAS's cblas_sgemm, one thread per call (Note [Library threads]).

#include <cblas.h>

#include <algorithm>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/local/cpu/gemm_backends.h"

namespace dt::ops::cpu::gemm {

namespace {

// One thread per call, set once for the process (OpenBLAS's setting is process-wide).
void UseOneThread() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// One part: out = a · b (+ bias) through sgemm (sgemv for one row) with beta = 1 on rows
// pre-filled with the bias.
absl::Status Sgemm(const Problem& p) {
  // Each operand is row-major (column stride 1) or column-major (row stride 1) with a leading
  // dimension (the Matmul kernel contract); a column-major one is the transpose of a row-major.
  const bool a_row = p.a_cs == 1, b_row = p.b_cs == 1;
  const int64_t lda = std::max<int64_t>(1, a_row ? p.a_rs : p.a_cs);
  const int64_t ldb = std::max<int64_t>(1, b_row ? p.b_rs : p.b_cs);
  const float* a = static_cast<const float*>(p.a);
  const float* b = static_cast<const float*>(p.b);
  float* out = static_cast<float*>(p.out);
  if (p.bias != nullptr) {
    for (int64_t i = 0; i < p.m; ++i) std::copy(p.bias, p.bias + p.n, out + i * p.ldo);
  }
  const float beta = p.bias != nullptr ? 1.0f : 0.0f;
  auto i32 = [](int64_t v) { return static_cast<blasint>(v); };
  if (p.m == 1) {
    // out[j] = sum_p a[p] b(p, j): b row-major is [K, N] (transposed product), column-major is
    // the [N, K] matrix times a.
    cblas_sgemv(CblasRowMajor, b_row ? CblasTrans : CblasNoTrans, i32(b_row ? p.k : p.n),
                i32(b_row ? p.n : p.k), 1.0f, b, i32(ldb), a, i32(std::max<int64_t>(1, p.a_cs)),
                beta, out, 1);
    return absl::OkStatus();
  }
  cblas_sgemm(CblasRowMajor, a_row ? CblasNoTrans : CblasTrans, b_row ? CblasNoTrans : CblasTrans,
              i32(p.m), i32(p.n), i32(p.k), 1.0f, a, i32(lda), b, i32(ldb), beta, out, i32(p.ldo));
  return absl::OkStatus();
}

}  // namespace

absl::Status RunOpenBlas(const Problem& p, bool parallel) {
  DT_CHECK(p.dtype == DType::kF32);
  // blasint is 32-bit in Debian's build: a larger dimension or leading dimension cannot be passed.
  constexpr int64_t kMax = int64_t{1} << 31;
  for (const int64_t v : {p.m, p.n, p.k, p.a_rs, p.a_cs, p.b_rs, p.b_cs, p.ldo}) {
    if (v >= kMax) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Matmul on OpenBLAS: a dimension or stride of ", v, " exceeds its 32-bit integers (",
          p.m, "x", p.n, "x", p.k, "); use DT_GEMM=own"));
    }
  }
  UseOneThread();
  return SplitOutput(p, parallel, Sgemm);
}

std::string OpenBlasDescription() {
  return absl::StrCat(openblas_get_config(), " (core ", openblas_get_corename(), ")");
}

}  // namespace dt::ops::cpu::gemm
