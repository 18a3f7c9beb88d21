// GPU kernel benchmarks, each against a baseline measured in the same run on the same device:
//   - Matmul (bf16 and f32, f32 compute) in TFLOP/s against cuBLAS called directly (cublasGemmEx
//     on a handle of its own with default settings, same operands and layout);
//   - decode attention (Sq = 1 over a KV cache, GQA) and RmsNorm in GB/s against a device-to-device
//     cudaMemcpy that moves the same number of bytes (read + write).
// The kernels are timed at the kernel interface (ops/local/kernels.h, reached through the
// libdtensor_cuda.so module's table as the ops do) with preallocated outputs, so the numbers
// exclude the public ops' output allocation; the public Matmul is printed for reference.
//
//   bench_cuda_ops [--quick]      --quick: one size per benchmark, fewer repetitions (< 1 minute)
//
// Ends with one line per target: RESULT <metric> <value> <target> PASS|FAIL. Without a CUDA device
// it prints "no CUDA device (<why>): nothing measured" and exits 0.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dtensor/bench/bench_util.h"
#include "absl/strings/str_format.h"
#include "dtensor/core/tensor.h"
#include "dtensor/ops/local/cuda_kernels.h"
#include "dtensor/ops/local/ops.h"

namespace dt {
namespace {

constexpr Device kGpu = Device::CUDA(0);

struct Result {
  std::string metric;
  double value, target;
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "bench_cuda_ops: %s\n", what.c_str());
  std::exit(1);
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(absl::StrFormat("%s: %s", what, s.ToString()));
}
template <typename T>
T Value(absl::StatusOr<T> v, const char* what) {
  Check(v.status(), what);
  return *std::move(v);
}
// The module's cuda:: kernels (Note [CUDA module] in core/cuda_module.h).
const ops::internal::CudaKernels& Kernels() {
  static const ops::internal::CudaKernels* kernels =
      Value(ops::internal::LoadCudaKernels("bench_cuda_ops", kGpu), "loading the CUDA kernels");
  return *kernels;
}
void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(absl::StrFormat("%s: %s", what, cudaGetErrorString(e)));
}

// Median over `reps` of the mean time of `iters` calls of fn, in seconds (after one warm-up call).
double TimeIt(const std::function<void()>& fn, int iters, int reps) {
  cudaEvent_t start, stop;
  CheckCuda(cudaEventCreate(&start), "cudaEventCreate");
  CheckCuda(cudaEventCreate(&stop), "cudaEventCreate");
  fn();
  CheckCuda(cudaDeviceSynchronize(), "warm-up");
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    CheckCuda(cudaEventRecord(start), "cudaEventRecord");
    for (int i = 0; i < iters; ++i) fn();
    CheckCuda(cudaEventRecord(stop), "cudaEventRecord");
    CheckCuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    CheckCuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(ms * 1e-3 / iters);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Seconds for a device-to-device copy of `bytes` bytes.
double MemcpySeconds(int64_t bytes, int iters, int reps) {
  void *src = nullptr, *dst = nullptr;
  CheckCuda(cudaMalloc(&src, bytes), "cudaMalloc");
  CheckCuda(cudaMalloc(&dst, bytes), "cudaMalloc");
  CheckCuda(cudaMemset(src, 0, bytes), "cudaMemset");
  const double t = TimeIt(
      [&] { CheckCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice), "memcpy"); },
      iters, reps);
  cudaFree(src);
  cudaFree(dst);
  return t;
}

// ---- GEMM
// ----------------------------------------------------------------------------------------

double GemmRatio(DType dtype, const std::vector<int64_t>& sizes, int iters, int reps) {
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) Die("cublasCreate");
  const cudaDataType_t type = dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  double ratio = 0;
  for (int64_t n : sizes) {
    const Tensor a = Value(Tensor::Randn({n, n}, 1, dtype, kGpu), "Randn");
    const Tensor b = Value(Tensor::Randn({n, n}, 2, dtype, kGpu), "Randn");
    const Tensor ours = Value(Tensor::Empty({n, n}, dtype, kGpu), "Empty");
    const Tensor theirs = Value(Tensor::Empty({n, n}, dtype, kGpu), "Empty");
    const double flops = 2.0 * n * n * n;
    const double t_ours =
        TimeIt([&] { Check(Kernels().Matmul(a, b, Tensor(), ours), "Matmul"); }, iters, reps);
    const float alpha = 1, beta = 0;
    const int ni = static_cast<int>(n);
    // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ.
    const double t_cublas = TimeIt(
        [&] {
          const cublasStatus_t s =
              cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &alpha, b.raw_data(), type,
                           ni, a.raw_data(), type, ni, &beta, theirs.raw_data(), type, ni,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
          if (s != CUBLAS_STATUS_SUCCESS) Die("cublasGemmEx");
        },
        iters, reps);
    const double t_public = TimeIt([&] { Value(ops::Matmul(a, b), "ops::Matmul"); }, iters, reps);
    const absl::Status same =
        AllClose(ours, theirs, 1e-2 * std::sqrt(static_cast<double>(n)), 1e-2);
    ratio = t_cublas / t_ours;
    std::printf(
        "gemm %-4s %5lld^3: ours %7.1f TFLOP/s, cuBLAS %7.1f TFLOP/s, ratio %.3f; ops::Matmul "
        "%7.1f TFLOP/s%s\n",
        std::string(DTypeName(dtype)).c_str(), static_cast<long long>(n), flops / t_ours * 1e-12,
        flops / t_cublas * 1e-12, ratio, flops / t_public * 1e-12,
        same.ok() ? "" : (" (results differ: " + std::string(same.message()) + ")").c_str());
  }
  cublasDestroy(handle);
  return ratio;  // of the last (largest) size
}

// ---- attention and RmsNorm
// -----------------------------------------------------------------------

double AttentionRatio(int64_t batch, int64_t skv, int iters, int reps) {
  const int64_t hq = 32, hkv = 8, d = 128;
  const DType dt = DType::kBF16;
  const Tensor q = Value(Tensor::Randn({batch, hq, 1, d}, 3, dt, kGpu), "Randn");
  const Tensor k = Value(Tensor::Randn({batch, hkv, skv, d}, 4, dt, kGpu), "Randn");
  const Tensor v = Value(Tensor::Randn({batch, hkv, skv, d}, 5, dt, kGpu), "Randn");
  const Tensor out = Value(Tensor::Empty({batch, hq, 1, d}, dt, kGpu), "Empty");
  ops::AttentionParams p;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.kv_length = skv;
  p.q_offset = skv - 1;
  const int64_t bytes = k.nbytes() + v.nbytes() + q.nbytes() + out.nbytes();
  const double t =
      TimeIt([&] { Check(Kernels().Attention(q, k, v, p, out), "Attention"); }, iters, reps);
  // A memcpy of bytes/2 reads bytes/2 and writes bytes/2: the same traffic as attention's reads.
  const double t_copy = MemcpySeconds(bytes / 2, iters, reps);
  std::printf(
      "attention decode B=%lld Hq=%lld Hkv=%lld Skv=%lld D=%lld bf16: %7.1f GB/s, memcpy %7.1f "
      "GB/s, ratio %.3f\n",
      static_cast<long long>(batch), static_cast<long long>(hq), static_cast<long long>(hkv),
      static_cast<long long>(skv), static_cast<long long>(d), bytes / t * 1e-9,
      bytes / t_copy * 1e-9, t_copy / t);
  return t_copy / t;
}

double RmsNormRatio(int64_t rows, int64_t h, int iters, int reps) {
  const DType dt = DType::kBF16;
  const Tensor x = Value(Tensor::Randn({rows, h}, 6, dt, kGpu), "Randn");
  const Tensor w = Value(Tensor::Randn({h}, 7, dt, kGpu), "Randn");
  const Tensor out = Value(Tensor::Empty({rows, h}, dt, kGpu), "Empty");
  const double t =
      TimeIt([&] { Check(Kernels().RmsNorm(x, w, 1e-6f, out), "RmsNorm"); }, iters, reps);
  // RmsNorm reads x and writes out: the traffic of a copy of x.
  const double t_copy = MemcpySeconds(x.nbytes(), iters, reps);
  const double bytes = 2.0 * static_cast<double>(x.nbytes());
  std::printf("rms_norm [%lld, %lld] bf16: %7.1f GB/s, memcpy %7.1f GB/s, ratio %.3f\n",
              static_cast<long long>(rows), static_cast<long long>(h), bytes / t * 1e-9,
              bytes / t_copy * 1e-9, t_copy / t);
  return t_copy / t;
}

int Main(int argc, char** argv) {
  const std::optional<bool> flag = dt::bench::ParseQuickFlag(argc, argv);
  if (!flag.has_value()) return 2;
  const bool quick = *flag;
  if (!CudaAvailable()) {
    std::printf("no CUDA device (%s): nothing measured\n", CudaUnavailableReason().c_str());
    return 0;
  }
  cudaDeviceProp prop;
  CheckCuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s, %d SMs%s\n", prop.name, prop.multiProcessorCount,
              quick ? " (--quick)" : "");
  const int iters = quick ? 10 : 50, reps = quick ? 3 : 7;
  const std::vector<int64_t> sizes =
      quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{1024, 2048, 4096};
  std::vector<Result> results;
  results.push_back(
      {"cuda_gemm_bf16_vs_cublas", GemmRatio(DType::kBF16, sizes, iters, reps), 0.95});
  results.push_back(
      {"cuda_gemm_f32_vs_cublas", GemmRatio(DType::kF32, sizes, quick ? 3 : 10, reps), 0.95});
  if (!quick) AttentionRatio(1, 4096, iters, reps);
  results.push_back({"cuda_attention_decode_vs_memcpy", AttentionRatio(8, 8192, iters, reps), 0.5});
  if (!quick) RmsNormRatio(4096, 4096, iters, reps);
  results.push_back({"cuda_rms_norm_vs_memcpy", RmsNormRatio(16384, 8192, iters, reps), 0.7});
  for (const Result& r : results) {
    std::printf("RESULT %s %.3f %.2f %s\n", r.metric.c_str(), r.value, r.target,
                r.value >= r.target ? "PASS" : "FAIL");
  }
  return 0;
}

}  // namespace
}  // namespace dt

int main(int argc, char** argv) { return dt::Main(argc, argv); }
