// bench_gemm: ops::Matmul / ops::Linear against the GEMMs it could have used and against memcpy,
// every baseline on the same number of threads as ours, measured in the same run, interleaved.
//
//   section            ours                         baselines
//   f32 GEMM           Matmul on T threads          OpenBLAS cblas_sgemm, openblas_set_num_threads(T)
//   per thread         Matmul in a 1-thread arena   Eigen 3.4 `C.noalias() = A * B` (single-threaded:
//                                                   Eigen threads only with OpenMP, not used here),
//                                                   OpenBLAS on 1 thread
//   bf16 GEMM          Matmul bf16 on T threads     Matmul f32 on T threads (same shape); Eigen's
//                                                   own Eigen::bfloat16 GEMM, 1 thread vs ours on 1
//   decode             Linear(x [M, K], w [N, K])   memcpy on T threads (64 MiB, beyond the L3);
//                      on T threads, weights cold   OpenBLAS sgemv (M=1) / sgemm (M>1) on T threads
//                                                   (f32 only: Debian's OpenBLAS has no bf16)
//   quantized decode   the same with w q4_1, q4_k,  memcpy on T threads
//                      q8_0 blocks (GB/s of blocks)
//
// T = oneTBB's arena size (all cores). "Weights cold": each call uses the next of enough copies of
// w to exceed three times the L3, as in a decode step, which streams every layer's weights once.
// Decode GB/s counts the weight bytes read per second; memcpy GB/s the bytes copied per second.
// Timing: each function is called once to warm up, then the functions take turns in ABBA order
// (a b b a a b ...) until each ran min_reps times and min_seconds passed; medians are reported.
//
// Usage: bench_gemm [--quick]   (--quick: fewer shapes and repetitions, under a minute)
// Ends with one line per target: RESULT <metric> <value> <target> PASS|FAIL.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include "dtensor/bench/bench_util.h"
#include "dtensor/core/quant.h"
#include "dtensor/core/tensor.h"
#include "dtensor/ops/local/cpu/gemm_kernels.h"
#include "dtensor/ops/local/cpu/qgemm.h"
#include "dtensor/ops/local/ops.h"

#ifdef DT_BENCH_OPENBLAS
#include <cblas.h>
#endif

namespace {

using dt::DType;
using dt::Tensor;
template <typename T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using Map = Eigen::Map<RowMajor<T>>;

constexpr bool kHaveOpenBlas =
#ifdef DT_BENCH_OPENBLAS
    true;
#else
    false;
#endif

struct Reps {
  int min_reps;
  double min_seconds;
};

// Median seconds per call of each function, after one warm-up call each, the functions taking
// turns in ABBA order (forward, then backward, ...) so that each sees the same machine load and
// follows each other equally often.
template <typename... F>
std::vector<double> Time(const Reps& reps, F&&... fns) {
  (fns(), ...);
  constexpr size_t kN = sizeof...(F);
  std::vector<std::vector<double>> t(kN);
  double total = 0;
  for (int round = 0; static_cast<int>(t[0].size()) < reps.min_reps || total < reps.min_seconds; ++round) {
    std::vector<size_t> order;
    for (size_t i = 0; i < kN; ++i) order.push_back(round % 2 == 0 ? i : kN - 1 - i);
    for (size_t i : order) {
      size_t j = 0;
      auto one = [&](auto& fn) {
        if (j++ != i) return;
        const auto start = std::chrono::steady_clock::now();
        fn();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        t[i].push_back(s);
        total += s / kN;
      };
      (one(fns), ...);
    }
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

std::string ShapeName(int64_t m, int64_t n, int64_t k) {
  char name[64];
  std::snprintf(name, sizeof(name), "%lldx%lldx%lld", static_cast<long long>(m),
                static_cast<long long>(n), static_cast<long long>(k));
  return name;
}

void SetOpenBlasThreads(int threads) {
#ifdef DT_BENCH_OPENBLAS
  openblas_set_num_threads(threads);
#endif
}

// C = A B with OpenBLAS on its current thread count (row-major, no transposes).
void OpenBlasSgemm(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c) {
#ifdef DT_BENCH_OPENBLAS
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, a, static_cast<int>(k), b, static_cast<int>(n), 0.0f, c,
              static_cast<int>(n));
#endif
}

struct Row {
  std::string name;
  double ours = 0, base = 0, base2 = 0;  // GFLOP/s or GB/s
};

// ---- f32 GEMM on T threads against OpenBLAS on T threads --------------------------------------

Row F32VsOpenBlas(int64_t m, int64_t n, int64_t k, const Reps& reps) {
  const Tensor a = Tensor::Randn({m, k}, 1).value(), b = Tensor::Randn({k, n}, 2).value();
  Tensor ours;
  std::vector<float> cb(static_cast<size_t>(m * n));
  auto run_ours = [&] { ours = dt::ops::Matmul(a, b).value(); };
  auto run_blas = [&] { OpenBlasSgemm(m, n, k, a.data<float>(), b.data<float>(), cb.data()); };
  Row r{ShapeName(m, n, k)};
  if (kHaveOpenBlas) {
    const std::vector<double> t = Time(reps, run_ours, run_blas);
    r.ours = Gflops(m, n, k, t[0]);
    r.base = Gflops(m, n, k, t[1]);
    const double err = RelError(ours.data<float>(), cb.data(), m * n);
    if (err > 1e-5) std::printf("  warning: %s: ours and OpenBLAS differ by %.1e\n", r.name.c_str(), err);
  } else {
    r.ours = Gflops(m, n, k, Time(reps, run_ours)[0]);
  }
  return r;
}

// ---- per thread: ours in a 1-thread arena, Eigen, OpenBLAS on 1 thread ----------------------

Row PerThread(int64_t m, int64_t n, int64_t k, const Reps& reps) {
  const Tensor a = Tensor::Randn({m, k}, 1).value(), b = Tensor::Randn({k, n}, 2).value();
  Map<float> am(a.data<float>(), m, k), bm(b.data<float>(), k, n);
  RowMajor<float> c(m, n);
  std::vector<float> cb(static_cast<size_t>(m * n));
  tbb::task_arena one(1);
  Tensor ours;
  auto run_ours = [&] { one.execute([&] { ours = dt::ops::Matmul(a, b).value(); }); };
  auto run_eigen = [&] { c.noalias() = am * bm; };
  auto run_blas = [&] { OpenBlasSgemm(m, n, k, a.data<float>(), b.data<float>(), cb.data()); };
  Row r{ShapeName(m, n, k)};
  SetOpenBlasThreads(1);
  const std::vector<double> t = kHaveOpenBlas ? Time(reps, run_ours, run_eigen, run_blas)
                                              : Time(reps, run_ours, run_eigen);
  r.ours = Gflops(m, n, k, t[0]);
  r.base = Gflops(m, n, k, t[1]);
  if (kHaveOpenBlas) r.base2 = Gflops(m, n, k, t[2]);
  const double err = RelError(ours.data<float>(), c.data(), m * n);
  if (err > 1e-5) std::printf("  warning: %s: ours and Eigen differ by %.1e\n", r.name.c_str(), err);
  return r;
}

// ---- bf16 against f32, both ours on T threads ----------------------------------------------

struct Bf16Row {
  std::string name;
  double bf16 = 0, f32 = 0;  // GFLOP/s
  double err = 0;            // bf16 result vs f32 accumulation of the same inputs
};

Bf16Row Bf16VsF32(int64_t m, int64_t n, int64_t k, const Reps& reps) {
  const Tensor a = Tensor::Randn({m, k}, 3, DType::kBF16).value();
  const Tensor b = Tensor::Randn({k, n}, 4, DType::kBF16).value();
  const Tensor a32 = a.To(DType::kF32).value(), b32 = b.To(DType::kF32).value();
  Tensor ours, ref;
  const std::vector<double> t = Time(reps, [&] { ours = dt::ops::Matmul(a, b).value(); },
                                     [&] { ref = dt::ops::Matmul(a32, b32).value(); });
  const Tensor ours32 = ours.To(DType::kF32).value();
  return {ShapeName(m, n, k), Gflops(m, n, k, t[0]), Gflops(m, n, k, t[1]),
          RelError(ours32.data<float>(), ref.data<float>(), m * n)};
}

// Eigen's own bfloat16 GEMM against ours, both on 1 thread.
Row Bf16VsEigenBf16(int64_t m, int64_t n, int64_t k, const Reps& reps, double* eigen_err) {
  const Tensor a = Tensor::Randn({m, k}, 3, DType::kBF16).value();
  const Tensor b = Tensor::Randn({k, n}, 4, DType::kBF16).value();
  // Eigen's bfloat16 has the same 16-bit layout as dt::BFloat16.
  RowMajor<Eigen::bfloat16> ae(m, k), be(k, n), ce(m, n);
  std::memcpy(ae.data(), a.raw_data(), static_cast<size_t>(a.nbytes()));
  std::memcpy(be.data(), b.raw_data(), static_cast<size_t>(b.nbytes()));
  tbb::task_arena one(1);
  Tensor ours;
  const std::vector<double> t =
      Time(reps, [&] { one.execute([&] { ours = dt::ops::Matmul(a, b).value(); }); },
           [&] { ce.noalias() = ae * be; });
  const Tensor ref = dt::ops::Matmul(a.To(DType::kF32).value(), b.To(DType::kF32).value()).value();
  const RowMajor<float> eigen32 = ce.cast<float>();
  *eigen_err = RelError(eigen32.data(), ref.data<float>(), m * n);
  return {ShapeName(m, n, k), Gflops(m, n, k, t[0]), Gflops(m, n, k, t[1])};
}

// ---- decode: Linear with cold weights against memcpy ---------------------------------------

struct DecodeShape {
  const char* name;
  int64_t n, k;  // w [n, k]: out features, in features
};

struct DecodeRow {
  std::string name;
  double ours = 0, memcpy = 0, blas = 0;  // GB/s (weights read; bytes copied; weights read)
};

DecodeRow Decode(const DecodeShape& s, int64_t m, DType dtype, bool matmul_layout,
                 const Reps& reps) {
  constexpr int64_t kPoolBytes = int64_t{96} << 20;  // three times the 32 MiB L3
  constexpr int64_t kCopyBytes = int64_t{64} << 20;
  const int64_t bytes = dt::DTypeBytes(dtype, s.n * s.k);
  const int64_t copies = std::max<int64_t>(1, (kPoolBytes + bytes - 1) / bytes);
  const dt::Shape wshape = matmul_layout ? dt::Shape{s.k, s.n} : dt::Shape{s.n, s.k};
  // A quantized w (random blocks) multiplies f32 activations.
  const bool quantized = dt::IsQuantized(dtype);
  std::vector<Tensor> w;
  w.push_back(quantized ? dt::RandomQuantized(dtype, wshape, 5).value()
                        : Tensor::Randn(wshape, 5, dtype).value());
  for (int64_t i = 1; i < copies; ++i) w.push_back(w[0].Clone().value());
  const Tensor x = Tensor::Randn({m, s.k}, 6, quantized ? DType::kF32 : dtype).value();
  // One pair of memcpy buffers for the whole run (touched once, not re-faulted per row).
  static std::vector<char> src(static_cast<size_t>(kCopyBytes), 1), dst(static_cast<size_t>(kCopyBytes), 2);
  // A sample is `calls` products in a row (at least 4 MB of weights), as a decode step runs one
  // projection after another: small products are not each timed alone, with the threads parked.
  const int64_t calls = std::max<int64_t>(1, (int64_t{4} << 20) / bytes);
  size_t next = 0;
  Tensor y;
  auto run_ours = [&] {
    for (int64_t c = 0; c < calls; ++c) {
      const Tensor& wi = w[next++ % w.size()];
      y = (matmul_layout ? dt::ops::Matmul(x, wi) : dt::ops::Linear(x, wi)).value();
    }
  };
  auto run_memcpy = [&] { dt::bench::ParallelMemcpy(dst.data(), src.data(), src.size()); };
  DecodeRow r;
  char name[96];
  std::snprintf(name, sizeof(name), "%s%s M=%lld %s", s.name, matmul_layout ? " (x.w)" : "",
                static_cast<long long>(m), dt::DTypeName(dtype).data());
  r.name = name;
#ifdef DT_BENCH_OPENBLAS
  if (dtype == DType::kF32 && !matmul_layout) {
    std::vector<float> yb(static_cast<size_t>(m * s.n));
    size_t next_b = 0;
    auto run_blas = [&] {
      for (int64_t c = 0; c < calls; ++c) {
      const float* wi = w[next_b++ % w.size()].data<float>();
      if (m == 1) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(s.n), static_cast<int>(s.k), 1.0f,
                    wi, static_cast<int>(s.k), x.data<float>(), 1, 0.0f, yb.data(), 1);
      } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m),
                    static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, x.data<float>(),
                    static_cast<int>(s.k), wi, static_cast<int>(s.k), 0.0f, yb.data(),
                    static_cast<int>(s.n));
      }
      }
    };
    const std::vector<double> t = Time(reps, run_ours, run_memcpy, run_blas);
    r.ours = bytes * calls / t[0] / 1e9;
    r.memcpy = kCopyBytes / t[1] / 1e9;
    r.blas = bytes * calls / t[2] / 1e9;
    const double err = RelError(y.data<float>(), yb.data(), m * s.n);
    if (err > 1e-5) std::printf("  warning: %s: ours and OpenBLAS differ by %.1e\n", name, err);
    return r;
  }
#endif
  const std::vector<double> t = Time(reps, run_ours, run_memcpy);
  r.ours = bytes * calls / t[0] / 1e9;
  r.memcpy = kCopyBytes / t[1] / 1e9;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const std::optional<bool> flag = dt::bench::ParseQuickFlag(argc, argv);
  if (!flag.has_value()) return 2;
  const bool quick = *flag;
  const Reps reps = quick ? Reps{5, 0.5} : Reps{10, 2.0};
  const Reps decode_reps = quick ? Reps{5, 0.25} : Reps{15, 1.0};
  const int threads = tbb::this_task_arena::max_concurrency();
  SetOpenBlasThreads(threads);
  std::printf("bench_gemm%s: T = %d threads; ours: oneTBB, %s kernels", quick ? " --quick" : "",
              threads, dt::ops::cpu::gemm::IsaName(dt::ops::cpu::gemm::ActiveIsa()));
#ifdef DT_BENCH_OPENBLAS
  std::printf("; %s, core %s, %s, set to %d threads\n", openblas_get_config(),
              openblas_get_corename(),
              openblas_get_parallel() == 1 ? "pthreads" : openblas_get_parallel() == 2 ? "OpenMP" : "serial",
              openblas_get_num_threads());
  if (dt::ops::cpu::gemm::ActiveIsa() >= dt::ops::cpu::gemm::Isa::kAvx512 &&
      std::string(openblas_get_corename()) == "Haswell") {
    std::printf("note: this CPU has AVX-512 but OpenBLAS picked its Haswell (AVX2) kernels; "
                "OPENBLAS_CORETYPE=SkylakeX compares against its AVX-512 ones\n");
  }
#else
  std::printf("; OpenBLAS not built in\n");
#endif

  struct Size {
    int64_t m, n, k;
    const char* metric;
  };
  const Size sizes[] = {{1024, 1024, 1024, "gemm_f32_1024_vs_openblas"},
                        {4096, 4096, 1024, "gemm_f32_4096x4096x1024_vs_openblas"}};
  struct Result {
    std::string metric;
    double value, target;
  };
  std::vector<Result> results;

  std::printf("\nf32 GEMM, T=%d threads each (GFLOP/s = 2MNK / median time)\n", threads);
  std::printf("%-22s %10s %10s %14s\n", "MxNxK", "ours", "openblas", "ours/openblas");
  for (const Size& s : sizes) {
    const Row r = F32VsOpenBlas(s.m, s.n, s.k, reps);
    if (kHaveOpenBlas) {
      std::printf("%-22s %10.1f %10.1f %14.2f\n", r.name.c_str(), r.ours, r.base, r.ours / r.base);
      results.push_back({s.metric, r.ours / r.base, 1.0});
    } else {
      std::printf("%-22s %10.1f %10s %14s\n", r.name.c_str(), r.ours, "-", "-");
    }
  }

  std::printf("\nf32 GEMM per thread: 1 thread each (GFLOP/s)\n");
  std::printf("%-22s %10s %10s %10s %12s %14s\n", "MxNxK", "ours", "eigen", "openblas", "ours/eigen",
              "ours/openblas");
  for (const Size& s : sizes) {
    if (quick && s.m > 1024) continue;
    const Row r = PerThread(s.m, s.n, s.k, reps);
    std::printf("%-22s %10.1f %10.1f %10.1f %12.2f %14.2f\n", r.name.c_str(), r.ours, r.base,
                r.base2, r.ours / r.base, r.base2 > 0 ? r.ours / r.base2 : 0.0);
    if (s.m == 1024) results.push_back({"gemm_f32_1024_vs_eigen_per_thread", r.ours / r.base, 1.0});
  }
  SetOpenBlasThreads(threads);

  std::printf("\nbf16 GEMM (f32 accumulation) vs our f32 GEMM, T=%d threads each (GFLOP/s)\n", threads);
  std::printf("%-22s %10s %10s %10s   %s\n", "MxNxK", "bf16", "f32", "bf16/f32",
              "max rel error vs f32 accumulation");
  for (const Size& s : sizes) {
    if (quick && s.m > 1024) continue;
    const Bf16Row r = Bf16VsF32(s.m, s.n, s.k, reps);
    std::printf("%-22s %10.1f %10.1f %10.2f   %.1e\n", r.name.c_str(), r.bf16, r.f32, r.bf16 / r.f32, r.err);
    if (s.m == 1024) results.push_back({"gemm_bf16_vs_f32_1024", r.bf16 / r.f32, 1.0});
  }
  {
    double eigen_err = 0;
    const Row r = Bf16VsEigenBf16(1024, 1024, 1024, Reps{quick ? 2 : 3, 0.0}, &eigen_err);
    std::printf("%-22s %10.1f %10s %10s   (1 thread each: ours %.1f, Eigen::bfloat16 GEMM %.1f "
                "GFLOP/s, %.0fx; its error %.1e, bf16 accumulation)\n",
                r.name.c_str(), r.ours, "", "", r.ours, r.base, r.ours / r.base, eigen_err);
  }

  std::printf("\ndecode: Linear(x [M, K], w [N, K]) with cold weights, T=%d threads; GB/s of weights "
              "read vs memcpy GB/s (bytes copied, 64 MiB, T threads)\n", threads);
  std::printf("%-34s %9s %9s %9s %12s\n", "w [N, K]", "ours", "memcpy", "openblas", "ours/memcpy");
  const DecodeShape shapes[] = {
      {"q_proj 576x576", 576, 576},     {"k_proj 192x576", 192, 576},
      {"up_proj 1536x576", 1536, 576},  {"down_proj 576x1536", 576, 1536},
      {"lm_head 49152x576", 49152, 576}, {"4096x4096", 4096, 4096}};
  const std::vector<int64_t> ms = quick ? std::vector<int64_t>{1, 8} : std::vector<int64_t>{1, 2, 4, 8};
  double worst[2] = {1e9, 1e9};
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const DecodeShape& s : shapes) {
      for (const int64_t m : ms) {
        const DecodeRow r = Decode(s, m, dtype, false, decode_reps);
        std::printf("%-34s %9.1f %9.1f ", r.name.c_str(), r.ours, r.memcpy);
        if (r.blas > 0) {
          std::printf("%9.1f ", r.blas);
        } else {
          std::printf("%9s ", "-");
        }
        std::printf("%12.2f\n", r.ours / r.memcpy);
        double& w = worst[dtype == DType::kBF16 ? 1 : 0];
        w = std::min(w, r.ours / r.memcpy);
      }
    }
  }
  // The other layout (x [M, K] . w [K, N], w rows along N), for the record.
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    const DecodeRow r = Decode({"up_proj 1536x576", 1536, 576}, 1, dtype, true, decode_reps);
    std::printf("%-34s %9.1f %9.1f %9s %12.2f\n", r.name.c_str(), r.ours, r.memcpy, "-",
                r.ours / r.memcpy);
  }
  results.push_back({"gemv_f32_vs_memcpy_worst_row", worst[0], 0.7});
  results.push_back({"gemv_bf16_vs_memcpy_worst_row", worst[1], 0.7});

  // Quantized weights (GB/s of their blocks; Note [Quantized GEMM]): the k-quants only where K is
  // whole 256-element super-blocks.
  std::printf("\ndecode with quantized weights (x f32), T=%d threads, %s kernels; GB/s of blocks read\n",
              threads, dt::ops::cpu::qgemm::IsaName(dt::ops::cpu::qgemm::ActiveIsa()));
  double worst_q = 1e9;
  for (const DType dtype : {DType::kQ4_1, DType::kQ4_K, DType::kQ8_0}) {
    for (const DecodeShape& s : shapes) {
      if (s.k % dt::DTypeBlock(dtype) != 0) continue;
      for (const int64_t m : ms) {
        const DecodeRow r = Decode(s, m, dtype, false, decode_reps);
        std::printf("%-34s %9.1f %9.1f %9s %12.2f\n", r.name.c_str(), r.ours, r.memcpy, "-",
                    r.ours / r.memcpy);
        if (m == 1) worst_q = std::min(worst_q, r.ours / r.memcpy);
      }
    }
  }
  results.push_back({"qgemv_m1_vs_memcpy_worst_row", worst_q, 0.6});

  std::printf("\n");
  for (const Result& r : results) {
    std::printf("RESULT %s %.2f %.2g %s\n", r.metric.c_str(), r.value, r.target,
                dt::bench::Verdict(r.value >= r.target));
  }
  return 0;
}
