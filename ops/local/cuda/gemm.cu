// CUDA Matmul kernel: cuBLAS GEMM with f32 compute, one lazily created handle per device.
//
// Note [cuBLAS layouts]
// Our matrices are row-major [M, N] outputs; cuBLAS is column-major. A row-major C [M, N] with
// leading dimension N is the column-major Cᵀ [N, M], and Cᵀ = Bᵀ·Aᵀ, so we ask cuBLAS for
// (N x M) = op(B') (N x K) · op(A') (K x M). An operand that is row-major in our terms ([R, C] with
// stride (ld, 1)) is, read column-major, its own transpose with leading dimension ld and needs
// CUBLAS_OP_N; a column-major operand (stride (1, ld)) needs CUBLAS_OP_T.
//
// Note [GEMM bias and rounding]
// The bias is broadcast into `out` first and the GEMM runs with beta = 1: cuBLAS forms
// alpha·(A·B) + beta·C in f32 and rounds once to out's dtype, which is exactly "add the bias in f32
// before the single rounding". The handle disallows reduced-precision split-K reductions so that
// bf16/f16 results are also rounded only once.

#include <cublas_v2.h>

#include <mutex>
#include <vector>

#include "dtensor/ops/local/cuda/cuda_util.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::cuda {

namespace {

constexpr absl::string_view kKernel = "Matmul";

absl::Status CublasError(cublasStatus_t s, absl::string_view what) {
  return absl::InternalError(absl::StrCat("cuBLAS error in ", kKernel, " (", what,
                                          "): ", cublasGetStatusName(s), " (",
                                          cublasGetStatusString(s), ")"));
}

// One handle per device, created on first use and never destroyed (destroying it from a static
// destructor can run after the CUDA context is gone). cuBLAS allows concurrent calls on one handle
// from several threads as long as its configuration does not change, and ours never does after
// creation.
absl::StatusOr<cublasHandle_t> Handle(int device) {
  static std::mutex mu;
  static std::vector<cublasHandle_t> handles;
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0) return absl::InvalidArgumentError(absl::StrCat(kKernel, ": bad device ", device));
  if (handles.size() <= static_cast<size_t>(device)) handles.resize(device + 1, nullptr);
  if (handles[device] == nullptr) {
    cublasHandle_t h = nullptr;
    cublasStatus_t s = cublasCreate(&h);
    if (s != CUBLAS_STATUS_SUCCESS)
      return CublasError(s, absl::StrCat("cublasCreate on cuda:", device));
    s = cublasSetMathMode(
        h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                     CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    if (s != CUBLAS_STATUS_SUCCESS) {
      cublasDestroy(h);
      return CublasError(s, "cublasSetMathMode");
    }
    handles[device] = h;
  }
  return handles[device];
}

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

// out[r, :] = bias for every row r (bias contiguous [n], out contiguous [rows, n]); T is 2 or 4
// bytes.
template <typename T>
__global__ void BroadcastRowsKernel(T* out, const T* bias, int64_t n, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = bias[i % n];
  }
}

// One operand matrix in cuBLAS terms (Note [cuBLAS layouts]).
struct Operand {
  cublasOperation_t op;
  int64_t ld;
};

Operand Layout(const Tensor& t) {
  // The public layer guarantees one of the last two strides is 1 (Matmul contract in kernels.h).
  if (t.stride(-1) == 1 && t.stride(-2) >= std::max<int64_t>(1, t.size(-1))) {
    return {CUBLAS_OP_N, t.stride(-2)};
  }
  return {CUBLAS_OP_T, t.stride(-1)};
}

bool IsGemmLayout(const Tensor& t) {
  const int64_t rows = t.size(-2), cols = t.size(-1), rs = t.stride(-2), cs = t.stride(-1);
  return (cs == 1 && rs >= std::max<int64_t>(1, cols)) ||
         (rs == 1 && cs >= std::max<int64_t>(1, rows));
}

// Batch dims of a, b and out (all of out's batch shape), merged where all three are contiguous
// across them and size-1 dims dropped: the innermost merged dim becomes cuBLAS's strided batch,
// the rest are looped over on the host.
struct Batch {
  Shape sizes;
  Shape strides[3];  // a, b, out
};

Batch MergeBatch(const Tensor& a, const Tensor& b, const Tensor& out) {
  Batch r;
  const Tensor* ts[3] = {&a, &b, &out};
  for (int d = 0; d < out.dim() - 2; ++d) {
    const int64_t size = out.size(d);
    if (size == 1) continue;
    bool merge = !r.sizes.empty();
    for (int k = 0; k < 3 && merge; ++k) merge = r.strides[k].back() == ts[k]->stride(d) * size;
    if (merge) {
      r.sizes.back() *= size;
      for (int k = 0; k < 3; ++k) r.strides[k].back() = ts[k]->stride(d);
    } else {
      r.sizes.push_back(size);
      for (int k = 0; k < 3; ++k) r.strides[k].push_back(ts[k]->stride(d));
    }
  }
  if (r.sizes.empty()) {
    r.sizes.push_back(1);
    for (int k = 0; k < 3; ++k) r.strides[k].push_back(0);
  }
  return r;
}

constexpr int64_t kIntMax = 2147483647;

}  // namespace

absl::Status Matmul(const Tensor& a_in, const Tensor& b_in, const Tensor& bias, const Tensor& out) {
  DT_RETURN_IF_ERROR(UseDevice(out, kKernel));
  // Defensive: an operand outside the documented layouts is copied (never happens via ops.h).
  Tensor a = a_in, b = b_in;
  if (!IsGemmLayout(a)) {
    DT_ASSIGN_OR_RETURN(a, a.Clone());
  }
  if (!IsGemmLayout(b)) {
    DT_ASSIGN_OR_RETURN(b, b.Clone());
  }
  const int64_t m = out.size(-2), n = out.size(-1), k = a.size(-1);
  const Operand oa = Layout(a), ob = Layout(b);
  if (m > kIntMax || n > kIntMax || k > kIntMax || oa.ld > kIntMax || ob.ld > kIntMax) {
    return absl::UnimplementedError(
        absl::StrCat(kKernel, " on CUDA: dims or leading dimensions above 2^31 (a ", a.Describe(),
                     ", b ", b.Describe(), ")"));
  }
  DT_ASSIGN_OR_RETURN(cublasHandle_t handle, Handle(out.device().index));

  float beta = 0.0f;
  if (bias.defined()) {  // Note [GEMM bias and rounding]
    const int64_t total = out.numel();
    if (DTypeSize(out.dtype()) == 4) {
      DT_RETURN_IF_ERROR(Launch(kKernel, BroadcastRowsKernel<uint32_t>, GridFor(total, 256), 256, 0,
                                out.raw_data(), bias.raw_data(), n, total));
    } else {
      DT_RETURN_IF_ERROR(Launch(kKernel, BroadcastRowsKernel<uint16_t>, GridFor(total, 256), 256, 0,
                                out.raw_data(), bias.raw_data(), n, total));
    }
    beta = 1.0f;
  }
  const float alpha = 1.0f;
  const cudaDataType_t type = CudaType(out.dtype());
  const int64_t esz = DTypeSize(out.dtype());

  const Batch batch = MergeBatch(a, b, out);
  const int inner = static_cast<int>(batch.sizes.size()) - 1;
  const int64_t count = batch.sizes[inner];
  const IntSpan outer(batch.sizes.data(), static_cast<size_t>(inner));
  const int64_t outer_count = Numel(outer);
  const int64_t chunk = std::min(count, kIntMax);  // cuBLAS takes an int batch count
  for (int64_t o = 0; o < outer_count; ++o) {
    int64_t off[3] = {0, 0, 0};
    int64_t rem = o;
    for (int d = inner - 1; d >= 0; --d) {
      const int64_t idx = rem % batch.sizes[d];
      rem /= batch.sizes[d];
      for (int t = 0; t < 3; ++t) off[t] += idx * batch.strides[t][d];
    }
    for (int64_t c0 = 0; c0 < count; c0 += chunk) {
      const int64_t c = std::min(chunk, count - c0);
      const char* pa =
          static_cast<const char*>(a.raw_data()) + (off[0] + c0 * batch.strides[0][inner]) * esz;
      const char* pb =
          static_cast<const char*>(b.raw_data()) + (off[1] + c0 * batch.strides[1][inner]) * esz;
      char* pc = static_cast<char*>(out.raw_data()) + (off[2] + c0 * batch.strides[2][inner]) * esz;
      // Cᵀ (n x m) = op(B') · op(A'), see Note [cuBLAS layouts]. A single matrix goes through
      // cublasGemmEx, whose heuristics callers of cuBLAS know best.
      const int in = static_cast<int>(n), im = static_cast<int>(m), ik = static_cast<int>(k);
      const int ldb = static_cast<int>(ob.ld), lda = static_cast<int>(oa.ld);
      const cublasStatus_t s =
          c == 1 ? cublasGemmEx(handle, ob.op, oa.op, in, im, ik, &alpha, pb, type, ldb, pa, type,
                                lda, &beta, pc, type, in, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
                 : cublasGemmStridedBatchedEx(handle, ob.op, oa.op, in, im, ik, &alpha, pb, type,
                                              ldb, batch.strides[1][inner], pa, type, lda,
                                              batch.strides[0][inner], &beta, pc, type, in,
                                              batch.strides[2][inner], static_cast<int>(c),
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (s != CUBLAS_STATUS_SUCCESS) {
        return CublasError(s, absl::StrCat("GEMM m=", m, " n=", n, " k=", k, " batch=", c));
      }
    }
  }
  return CheckLaunch(kKernel);
}

}  // namespace dt::ops::cuda
