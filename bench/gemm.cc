// bench_gemm: ops::Matmul against the GEMMs it could have used, measured in the same run.
//
//   column            what runs
//   ours              dt::ops::Matmul (Eigen f32 GEMM per output panel, panels over all cores
//                     with oneTBB; bf16 converted to f32 and back, see Note [bf16 GEMM])
//   eigen             Eigen 3.4 `C.noalias() = A * B` called directly, single-threaded (Eigen
//                     threads only with OpenMP, which this build does not use), same flags
//   openblas          cblas_sgemm with OpenBLAS's default threads (skipped if OpenBLAS is absent)
//   eigen bf16        Eigen's own Eigen::bfloat16 GEMM (no SIMD kernel, bf16 accumulation)
//
// Usage: bench_gemm [--quick]   (--quick: fewer repetitions, well under a minute)
// Ends with one line per target: RESULT <metric> <value> <target> PASS|FAIL.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <tbb/task_arena.h>

#include "dtensor/bench/bench_util.h"
#include "dtensor/core/tensor.h"
#include "dtensor/ops/local/ops.h"

#ifdef DT_BENCH_OPENBLAS
#include <cblas.h>
#endif

namespace {

using dt::Tensor;
template <typename T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using Map = Eigen::Map<RowMajor<T>>;

struct Reps {
  int min_reps;
  double min_seconds;
};

// Median seconds per call of each function, after one warm-up call each. The functions take turns
// (a b c a b c ...) so that all of them see the same machine load; this matters on a shared
// 2-core machine where other processes come and go.
template <typename... F>
std::vector<double> Time(const Reps& reps, F&&... fns) {
  (fns(), ...);
  constexpr size_t kN = sizeof...(F);
  std::vector<std::vector<double>> t(kN);
  double total = 0;
  while (static_cast<int>(t[0].size()) < reps.min_reps || total < reps.min_seconds) {
    size_t i = 0;
    auto one = [&](auto& fn) {
      const auto start = std::chrono::steady_clock::now();
      fn();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      t[i++].push_back(s);
      total += s / kN;
    };
    (one(fns), ...);
  }
  std::vector<double> medians;
  for (auto& v : t) medians.push_back(dt::bench::Median(std::move(v)));
  return medians;
}

double Gflops(int64_t m, int64_t n, int64_t k, double seconds) {
  return 2.0 * static_cast<double>(m) * n * k / seconds / 1e9;
}

// max |x - ref| / max |ref|.
double RelError(const float* x, const float* ref, int64_t n) {
  double err = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    err = std::max(err, std::abs(static_cast<double>(x[i]) - ref[i]));
    scale = std::max(scale, std::abs(static_cast<double>(ref[i])));
  }
  return err / std::max(scale, 1e-30);
}

struct F32Result {
  double ours, eigen, openblas;  // GFLOP/s; openblas 0 when absent
};

F32Result BenchF32(int64_t m, int64_t n, int64_t k, const Reps& reps) {
  const Tensor a = Tensor::Randn({m, k}, 1).value(), b = Tensor::Randn({k, n}, 2).value();
  F32Result r{};
  Tensor ours;
  Map<float> am(a.data<float>(), m, k), bm(b.data<float>(), k, n);
  RowMajor<float> c(m, n);
  auto run_ours = [&] { ours = dt::ops::Matmul(a, b).value(); };
  auto run_eigen = [&] { c.noalias() = am * bm; };
#ifdef DT_BENCH_OPENBLAS
  std::vector<float> cb(static_cast<size_t>(m * n));
  auto run_openblas = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, a.data<float>(), static_cast<int>(k), b.data<float>(),
                static_cast<int>(n), 0.0f, cb.data(), static_cast<int>(n));
  };
  const std::vector<double> t = Time(reps, run_ours, run_eigen, run_openblas);
  r.openblas = Gflops(m, n, k, t[2]);
#else
  const std::vector<double> t = Time(reps, run_ours, run_eigen);
#endif
  r.ours = Gflops(m, n, k, t[0]);
  r.eigen = Gflops(m, n, k, t[1]);
  const double err = RelError(ours.data<float>(), c.data(), m * n);
  if (err > 1e-5) std::printf("  warning: %lldx%lldx%lld: ours and eigen differ by %.1e\n",
                              static_cast<long long>(m), static_cast<long long>(n),
                              static_cast<long long>(k), err);
  return r;
}

struct Bf16Result {
  double ours, eigen;        // GFLOP/s
  double ours_err, eigen_err;  // against f32 accumulation of the same bf16 inputs
};

Bf16Result BenchBf16(int64_t m, int64_t n, int64_t k, const Reps& reps) {
  const Tensor a = Tensor::Randn({m, k}, 3, dt::DType::kBF16).value();
  const Tensor b = Tensor::Randn({k, n}, 4, dt::DType::kBF16).value();
  Bf16Result r{};
  Tensor ours;
  // Eigen's bfloat16 has the same 16-bit layout as dt::BFloat16.
  RowMajor<Eigen::bfloat16> ae(m, k), be(k, n), ce(m, n);
  std::memcpy(ae.data(), a.raw_data(), static_cast<size_t>(a.nbytes()));
  std::memcpy(be.data(), b.raw_data(), static_cast<size_t>(b.nbytes()));
  const std::vector<double> t = Time(reps, [&] { ours = dt::ops::Matmul(a, b).value(); },
                                     [&] { ce.noalias() = ae * be; });
  r.ours = Gflops(m, n, k, t[0]);
  r.eigen = Gflops(m, n, k, t[1]);
  // Accuracy: both against an f32 GEMM of the same (bf16-valued) inputs.
  const Tensor ref = dt::ops::Matmul(a.To(dt::DType::kF32).value(), b.To(dt::DType::kF32).value()).value();
  const Tensor ours32 = ours.To(dt::DType::kF32).value();
  const RowMajor<float> eigen32 = ce.cast<float>();
  r.ours_err = RelError(ours32.data<float>(), ref.data<float>(), m * n);
  r.eigen_err = RelError(eigen32.data(), ref.data<float>(), m * n);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const std::optional<bool> flag = dt::bench::ParseQuickFlag(argc, argv);
  if (!flag.has_value()) return 2;
  const bool quick = *flag;
  const Reps reps = quick ? Reps{3, 0.3} : Reps{10, 2.0};
  std::printf("bench_gemm%s: ours on %d threads (oneTBB), eigen on 1 thread", quick ? " --quick" : "",
              tbb::this_task_arena::max_concurrency());
#ifdef DT_BENCH_OPENBLAS
  std::printf(", openblas on %d threads\n", openblas_get_num_threads());
#else
  std::printf(", openblas not built in\n");
#endif

  struct Size {
    int64_t m, n, k;
    const char* metric;
  };
  const Size sizes[] = {{1024, 1024, 1024, "gemm_f32_1024_vs_eigen"},
                        {4096, 4096, 1024, "gemm_f32_4096x4096x1024_vs_eigen"}};
  std::vector<std::pair<std::string, double>> ratios;
  std::printf("\n%-22s %10s %10s %10s %12s %14s\n", "f32 GEMM (MxNxK)", "ours", "eigen", "openblas",
              "ours/eigen", "ours/openblas");
  for (const Size& s : sizes) {
    const F32Result r = BenchF32(s.m, s.n, s.k, reps);
    char name[64];
    std::snprintf(name, sizeof(name), "%lldx%lldx%lld", static_cast<long long>(s.m),
                  static_cast<long long>(s.n), static_cast<long long>(s.k));
    std::printf("%-22s %10.1f %10.1f ", name, r.ours, r.eigen);
    if (r.openblas > 0) {
      std::printf("%10.1f %12.2f %14.2f\n", r.openblas, r.ours / r.eigen, r.ours / r.openblas);
    } else {
      std::printf("%10s %12.2f %14s\n", "-", r.ours / r.eigen, "-");
    }
    ratios.emplace_back(s.metric, r.ours / r.eigen);
  }
  const Bf16Result bf = BenchBf16(1024, 1024, 1024, reps);
  std::printf("\n%-22s %10s %10s %12s   %s\n", "bf16 GEMM (MxNxK)", "ours", "eigen bf16", "ours/eigen",
              "max rel error vs f32 accumulation (ours, eigen)");
  std::printf("%-22s %10.1f %10.1f %12.2f   %.1e, %.1e\n", "1024x1024x1024", bf.ours, bf.eigen,
              bf.ours / bf.eigen, bf.ours_err, bf.eigen_err);
  std::printf("(GFLOP/s = 2*M*N*K / median time per call)\n\n");

  for (const auto& [metric, ratio] : ratios) {
    std::printf("RESULT %s %.2f 0.9 %s\n", metric.c_str(), ratio, dt::bench::Verdict(ratio >= 0.9));
  }
  const double bf_ratio = bf.ours / bf.eigen;
  std::printf("RESULT gemm_bf16_vs_eigen_bf16 %.2f 3 %s\n", bf_ratio, dt::bench::Verdict(bf_ratio >= 3.0));
  return 0;
}
