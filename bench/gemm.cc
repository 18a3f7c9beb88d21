// bench_gemm: ops::Matmul / ops::Linear on each GEMM backend (own kernels, oneDNN, OpenBLAS) and as
// the dispatcher picks it (Note [GEMM dispatch] in ops/local/cpu/gemm_dispatch.cc), against the
// libraries called directly on their own threads and against memcpy, every side on the same number
// of threads, measured in the same run, interleaved.
//
//   section      rows                                            baselines
//   dispatch     the decision per dtype and shape class, why     -
//   f32 GEMM     Matmul on own / dnnl / openblas and as picked,  oneDNN's matmul primitive on T
//                T oneTBB threads (the libraries one thread per  OpenMP threads; OpenBLAS sgemm
//                part: Note [Library threads])                   with openblas_set_num_threads(T)
//   bf16 GEMM    the same for own / dnnl (f32 accumulation)      oneDNN on T OpenMP threads; our
//                                                                f32 (picked) on the same shape
//   per thread   each backend and picked in a 1-thread arena     Eigen 3.4 `C.noalias() = A * B`
//                                                                (single-threaded)
//   decode       Linear(x [M, K], w [N, K]) on each backend      memcpy on T threads (64 MiB)
//                and as picked, weights cold
//   quantized    the same with w q4_1, q4_k, q8_0, q2_k, q3_k,  memcpy on T threads
//   decode       iq4_nl, iq4_xs blocks (GB/s of blocks; x f32;
//                our kernels only)
//   batched      quantized Linear at M = 8, 16 (a serving       the same product packing its
//   quantized    engine's decode step), its panels kept          panels on every call
//                (Note [Packed quantized weights])
//   prefill on   bf16, f32 Linear on oneDNN at M = 128..512,     the same product on the plain
//   kept weights the weights' layout kept                        weights (copied per call)
//                (Note [oneDNN weights layout])
//
// T = oneTBB's arena size (all cores). "Weights cold": each call uses the next of enough copies of
// w to exceed three times the L3, as in a decode step, which streams every layer's weights once.
// Decode GB/s counts the weight bytes read per second; memcpy GB/s the bytes copied per second.
// Timing: each function is called once to warm up, then the functions take turns in ABBA order
// (a b b a a b ...) until each ran min_reps times and min_seconds passed; medians are reported.
// tools/reference/torch_matmul_bench.py runs this program and PyTorch on the same shapes and
// threads and compares them.
//
// Usage: bench_gemm [--quick] [--gemm-only]
//   --quick: fewer repetitions and rows, under a minute; --gemm-only: the dispatcher and the GEMM
//   rows only (what tools/reference/torch_matmul_bench.py runs between its PyTorch passes).
// Ends with one line per target: RESULT <metric> <value> <target> PASS|FAIL.

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <unordered_map>
#include <string>
#include <vector>

#include <Eigen/Core>
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include <tbb/task_arena.h>

#include "dtensor/bench/bench_util.h"
#include "dtensor/core/quant.h"
#include "dtensor/core/tensor.h"
#include "dtensor/ops/local/cpu/cpu_info.h"
#include "dtensor/ops/local/cpu/gemm_backends.h"
#include "dtensor/ops/local/cpu/gemm_dispatch.h"
#include "dtensor/ops/local/cpu/gemm_kernels.h"
#include "dtensor/ops/local/cpu/kept_weights.h"
#include "dtensor/ops/local/cpu/qgemm.h"
#include "dtensor/ops/local/cpu/tuner.h"
#include "dtensor/ops/local/ops.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace {

using dt::DType;
using dt::Tensor;
using dt::ops::cpu::gemm::Backend;
namespace gemm = dt::ops::cpu::gemm;
template <typename T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using Map = Eigen::Map<RowMajor<T>>;

struct Reps {
  int min_reps;
  double min_seconds;
};

// Median seconds per call of each function, after one warm-up call each, the functions taking
// turns in ABBA order (forward, then backward, ...) so that each sees the same machine load and
// follows each other equally often.
std::vector<double> Time(const Reps& reps, const std::vector<std::function<void()>>& fns) {
  for (const auto& f : fns) f();
  const size_t n = fns.size();
  std::vector<std::vector<double>> t(n);
  double total = 0;
  for (int round = 0; static_cast<int>(t[0].size()) < reps.min_reps || total < reps.min_seconds; ++round) {
    for (size_t o = 0; o < n; ++o) {
      const size_t i = round % 2 == 0 ? o : n - 1 - o;
      const auto start = std::chrono::steady_clock::now();
      fns[i]();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      t[i].push_back(s);
      total += s / n;
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
double RelError(const Tensor& x, const Tensor& ref) {
  const std::vector<double> xv = x.ToDoubles(), rv = ref.ToDoubles();
  double err = 0, scale = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    err = std::max(err, std::abs(xv[i] - rv[i]));
    scale = std::max(scale, std::abs(rv[i]));
  }
  return err / std::max(scale, 1e-30);
}

std::string ShapeName(int64_t m, int64_t n, int64_t k) {
  char name[64];
  std::snprintf(name, sizeof(name), "%lldx%lldx%lld", static_cast<long long>(m),
                static_cast<long long>(n), static_cast<long long>(k));
  return name;
}

// Runs fn with the dispatcher forced to `b` (nullopt: as it picks).
template <typename F>
auto With(std::optional<Backend> b, F&& fn) {
  gemm::SetBackendForTesting(b);
  auto r = fn();
  gemm::SetBackendForTesting(std::nullopt);
  return r;
}

std::vector<Backend> BackendsFor(DType dtype) {
  std::vector<Backend> out;
  for (const Backend b : gemm::kAllBackends) {
    if (gemm::BackendRuns(b, dtype)) out.push_back(b);
  }
  return out;
}

// oneDNN's matmul primitive on the whole product, threaded by oneDNN itself (OpenMP, `threads`):
// how a program that calls oneDNN directly (PyTorch does for bf16) runs it.
class DnnlNative {
 public:
  // out = a · b (+ bias) for contiguous a [M, K] and b [K, N] (or w [N, K] when `linear`).
  DnnlNative(const Tensor& a, const Tensor& b, bool linear, const Tensor& out, int threads)
      : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
    using dnnl::memory;
    // oneDNN fixes the thread count when it makes the primitive (this thread's OpenMP setting,
    // which our own oneDNN calls set to 1 on whichever thread ran them).
    omp_set_num_threads(threads);
    const memory::data_type dt = a.dtype() == DType::kBF16 ? memory::data_type::bf16 : memory::data_type::f32;
    const int64_t m = a.size(0), k = a.size(1), n = out.size(1);
    const memory::desc ad({m, k}, dt, {k, 1}), od({m, n}, dt, {n, 1});
    const memory::desc bd({k, n}, dt, linear ? memory::dims{1, k} : memory::dims{n, 1});
    prim_ = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, od), engine_));
    args_ = {{DNNL_ARG_SRC, memory(ad, engine_, const_cast<void*>(a.raw_data()))},
             {DNNL_ARG_WEIGHTS, memory(bd, engine_, const_cast<void*>(b.raw_data()))},
             {DNNL_ARG_DST, memory(od, engine_, out.raw_data())}};
  }
  void Run() {
    prim_.execute(stream_, args_);
    stream_.wait();
  }

 private:
  dnnl::engine engine_;
  dnnl::stream stream_;
  dnnl::matmul prim_;
  std::unordered_map<int, dnnl::memory> args_;
};

struct Result {
  std::string metric;
  double value, target;
};

// Note [Picked against best]
// "picked" runs the very code of the backend the dispatcher chose, so the picked-vs-best RESULT
// asks whether the choice was right: that backend's own (forced) figure over the fastest forced
// figure. Dividing the separately timed picked figure by the largest of two or three others
// instead measured the noise of a shared VM (the picked column read 1-3% under the same backend's
// forced one in the same run, and the largest of three noisy samples is biased up), which failed
// rows whose choice was the fastest path. The picked column stays printed beside them.

// One figure per backend (GFLOP/s or GB/s; 0 where the backend does not run the dtype).
struct Paths {
  double by[3] = {0, 0, 0};
  double& operator[](Backend b) { return by[static_cast<int>(b)]; }
  double best() const { return std::max({by[0], by[1], by[2]}); }
  // The dispatcher's choice against the fastest backend, each timed forced (Note [Picked against
  // best]).
  double choice(Backend picked) const { return by[static_cast<int>(picked)] / best(); }
  // The figures in columns `width` wide, "-" for a backend that did not run.
  void Print(int width) const {
    for (const double g : by) {
      if (g > 0) {
        std::printf(" %*.1f", width, g);
      } else {
        std::printf(" %*s", width, "-");
      }
    }
  }
};

// ---- GEMM on T threads: every backend, picked, and the libraries on their own threads --------

struct GemmRow {
  std::string name;
  Paths paths;  // GFLOP/s through Matmul
  Backend picked = Backend::kOwn;
  double picked_gflops = 0, dnnl_native = 0, openblas_native = 0;
};

GemmRow Gemm(DType dtype, int64_t m, int64_t n, int64_t k, bool linear, int threads, const Reps& reps) {
  const Tensor a = Tensor::Randn({m, k}, 1, dtype).value();
  const Tensor b = Tensor::Randn(linear ? dt::Shape{n, k} : dt::Shape{k, n}, 2, dtype).value();
  auto product = [&] { return linear ? dt::ops::Linear(a, b) : dt::ops::Matmul(a, b); };
  const Tensor ref = product().value();
  GemmRow row{dt::DTypeName(dtype).data() + std::string(" ") + ShapeName(m, n, k) + (linear ? " x.wT" : "")};
  const std::vector<Backend> backends = BackendsFor(dtype);
  std::vector<Tensor> outs(backends.size() + 1);
  std::vector<std::function<void()>> fns;
  for (size_t i = 0; i < backends.size(); ++i) {
    fns.push_back([&, i] { outs[i] = With(backends[i], product).value(); });
  }
  fns.push_back([&] { outs.back() = product().value(); });
  const Tensor native_out = Tensor::Empty({m, n}, dtype).value();
  DnnlNative dnnl(a, b, linear, native_out, threads);
  fns.push_back([&] { dnnl.Run(); });
  const bool blas = dtype == DType::kF32;
  if (blas) {
    fns.push_back([&] {
      openblas_set_num_threads(threads);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, linear ? CblasTrans : CblasNoTrans, static_cast<int>(m),
                  static_cast<int>(n), static_cast<int>(k), 1.0f, a.data<float>(), static_cast<int>(k),
                  b.data<float>(), static_cast<int>(linear ? k : n), 0.0f, native_out.data<float>(),
                  static_cast<int>(n));
      openblas_set_num_threads(1);  // what our OpenBLAS backend runs with (Note [Library threads])
    });
  }
  const std::vector<double> t = Time(reps, fns);
  for (size_t i = 0; i < backends.size(); ++i) {
    row.paths[backends[i]] = Gflops(m, n, k, t[i]);
    const double err = RelError(outs[i], ref);
    if (err > (dtype == DType::kF32 ? 1e-5 : 1e-2)) {
      std::printf("  warning: %s: %s differs from the picked path by %.1e\n", row.name.c_str(),
                  gemm::BackendName(backends[i]), err);
    }
  }
  row.picked = gemm::Choose(dtype, m, n, k).value();
  row.picked_gflops = Gflops(m, n, k, t[backends.size()]);
  row.dnnl_native = Gflops(m, n, k, t[backends.size() + 1]);
  if (blas) row.openblas_native = Gflops(m, n, k, t[backends.size() + 2]);
  return row;
}

void PrintGemmHeader() {
  std::printf("%-28s %9s %9s %9s %14s %11s %11s %9s %9s %9s\n", "dtype MxNxK", "own", "dnnl",
              "openblas", "picked", "dnnl-omp", "blas-own-T", "pick/best", "/dnnl-omp",
              "/blas-T");
}

void PrintGemmRow(const GemmRow& r) {
  std::printf("%-28s", r.name.c_str());
  r.paths.Print(9);
  std::printf(" %5s %8.1f %11.1f", gemm::BackendName(r.picked), r.picked_gflops, r.dnnl_native);
  if (r.openblas_native > 0) {
    std::printf(" %11.1f", r.openblas_native);
  } else {
    std::printf(" %11s", "-");
  }
  std::printf(" %9.2f %9.2f", r.paths.choice(r.picked), r.picked_gflops / r.dnnl_native);
  if (r.openblas_native > 0) {
    std::printf(" %9.2f\n", r.picked_gflops / r.openblas_native);
  } else {
    std::printf(" %9s\n", "-");
  }
}

// ---- per thread: each backend and picked in a 1-thread arena, Eigen ------------------------

struct PerThreadRow {
  std::string name;
  Paths paths;  // GFLOP/s through Matmul in a 1-thread arena
  double picked = 0, eigen = 0;
};

PerThreadRow PerThread(int64_t m, int64_t n, int64_t k, const Reps& reps) {
  const Tensor a = Tensor::Randn({m, k}, 1).value(), b = Tensor::Randn({k, n}, 2).value();
  Map<float> am(a.data<float>(), m, k), bm(b.data<float>(), k, n);
  RowMajor<float> c(m, n);
  tbb::task_arena one(1);
  Tensor ours;
  auto on_one = [&](std::optional<Backend> backend) {
    return [&, backend] {
      one.execute([&] { ours = With(backend, [&] { return dt::ops::Matmul(a, b); }).value(); });
    };
  };
  std::vector<std::function<void()>> fns;
  for (const Backend b : gemm::kAllBackends) fns.push_back(on_one(b));
  fns.push_back(on_one(std::nullopt));
  fns.push_back([&] { c.noalias() = am * bm; });
  const std::vector<double> t = Time(reps, fns);
  PerThreadRow r{ShapeName(m, n, k)};
  for (const Backend b : gemm::kAllBackends) r.paths[b] = Gflops(m, n, k, t[static_cast<int>(b)]);
  r.picked = Gflops(m, n, k, t[3]);
  r.eigen = Gflops(m, n, k, t[4]);
  return r;
}

// Eigen's own bfloat16 GEMM against ours, both on 1 thread.
void Bf16VsEigenBf16(int64_t m, int64_t n, int64_t k, const Reps& reps) {
  const Tensor a = Tensor::Randn({m, k}, 3, DType::kBF16).value();
  const Tensor b = Tensor::Randn({k, n}, 4, DType::kBF16).value();
  // Eigen's bfloat16 has the same 16-bit layout as dt::BFloat16.
  RowMajor<Eigen::bfloat16> ae(m, k), be(k, n), ce(m, n);
  std::memcpy(ae.data(), a.raw_data(), static_cast<size_t>(a.nbytes()));
  std::memcpy(be.data(), b.raw_data(), static_cast<size_t>(b.nbytes()));
  tbb::task_arena one(1);
  Tensor ours;
  const std::vector<double> t =
      Time(reps, {[&] { one.execute([&] { ours = dt::ops::Matmul(a, b).value(); }); },
                  [&] { ce.noalias() = ae * be; }});
  const Tensor ref = dt::ops::Matmul(a.To(DType::kF32).value(), b.To(DType::kF32).value()).value();
  const RowMajor<float> c32 = ce.cast<float>();
  const Tensor eigen32 = Tensor::FromVector<float>({m, n}, std::vector<float>(c32.data(), c32.data() + m * n)).value();
  std::printf("bf16 %s, 1 thread each: picked %.1f GFLOP/s, Eigen::bfloat16 GEMM %.1f (%.0fx; its "
              "error %.1e, bf16 accumulation)\n",
              ShapeName(m, n, k).c_str(), Gflops(m, n, k, t[0]), Gflops(m, n, k, t[1]), t[1] / t[0],
              RelError(eigen32, ref));
}

// ---- decode: Linear with cold weights on each backend, against memcpy -----------------------

// Bytes of cold copies a decode row cycles through: three times the last-level cache this core
// shares (Note [Last-level cache] in ops/local/cpu/tuner.cc), at least 96 MiB, so that no copy is
// still cached when it comes round again on any CPU (a fixed 96 MiB was three times this AMD VM's
// 32 MiB and would fit an Intel server's 105 MiB L3).
int64_t PoolBytes() {
  return std::max<int64_t>(int64_t{96} << 20, 3 * dt::ops::cpu::tune::LastLevelCacheBytes());
}

struct DecodeShape {
  const char* name;
  int64_t n, k;  // w [n, k]: out features, in features
};

struct DecodeRow {
  std::string name;
  Paths paths;  // GB/s of weights read
  Backend picked = Backend::kOwn;
  double picked_gbs = 0, memcpy = 0;
};

// The decode rows of one weight shape and dtype, for each M, from one pool of cold copies.
std::vector<DecodeRow> Decode(const DecodeShape& s, const std::vector<int64_t>& ms, DType dtype,
                              bool matmul_layout, const Reps& reps) {
  const int64_t pool_bytes = PoolBytes();
  const int64_t bytes = dt::DTypeBytes(dtype, s.n * s.k);
  const int64_t copies = std::max<int64_t>(1, (pool_bytes + bytes - 1) / bytes);
  const dt::Shape wshape = matmul_layout ? dt::Shape{s.k, s.n} : dt::Shape{s.n, s.k};
  // A quantized w (random blocks) multiplies f32 activations on our kernels only.
  const bool quantized = dt::IsQuantized(dtype);
  std::vector<Tensor> w;
  w.push_back(quantized ? dt::RandomQuantized(dtype, wshape, 5).value()
                        : Tensor::Randn(wshape, 5, dtype).value());
  for (int64_t i = 1; i < copies; ++i) w.push_back(w[0].Clone().value());
  constexpr int64_t kCopyBytes = int64_t{64} << 20;
  // One pair of memcpy buffers for the whole run (touched once, not re-faulted per row).
  static std::vector<char> src(static_cast<size_t>(kCopyBytes), 1), dst(static_cast<size_t>(kCopyBytes), 2);
  // A sample is `calls` products in a row (at least 4 MB of weights), as a decode step runs one
  // projection after another: small products are not each timed alone, with the threads parked.
  const int64_t calls = std::max<int64_t>(1, (int64_t{4} << 20) / bytes);
  size_t next = 0;
  const std::vector<Backend> backends = quantized ? std::vector<Backend>{} : BackendsFor(dtype);
  std::vector<DecodeRow> rows;
  for (const int64_t m : ms) {
    const Tensor x = Tensor::Randn({m, s.k}, 6, quantized ? DType::kF32 : dtype).value();
    Tensor y;
    auto products = [&] {
      for (int64_t c = 0; c < calls; ++c) {
        const Tensor& wi = w[next++ % w.size()];
        y = (matmul_layout ? dt::ops::Matmul(x, wi) : dt::ops::Linear(x, wi)).value();
      }
    };
    DecodeRow r;
    char name[96];
    std::snprintf(name, sizeof(name), "%s %s%s M=%lld", dt::DTypeName(dtype).data(), s.name,
                  matmul_layout ? " (x.w)" : "", static_cast<long long>(m));
    r.name = name;
    std::vector<std::function<void()>> fns;
    for (const Backend b : backends) {
      fns.push_back([&, b] { With(b, [&] { products(); return 0; }); });
    }
    fns.push_back(products);
    fns.push_back([&] { dt::bench::ParallelMemcpy(dst.data(), src.data(), src.size()); });
    const std::vector<double> t = Time(reps, fns);
    for (size_t i = 0; i < backends.size(); ++i) r.paths[backends[i]] = bytes * calls / t[i] / 1e9;
    if (!quantized) r.picked = gemm::Choose(dtype, m, s.n, s.k).value();
    r.picked_gbs = bytes * calls / t[backends.size()] / 1e9;
    r.memcpy = kCopyBytes / t[backends.size() + 1] / 1e9;
    rows.push_back(r);
  }
  return rows;
}

// Batched decode with quantized weights: Linear(x [M, K], w [N, K]) with the weight's panels kept
// (Note [Packed quantized weights] in ops/local/cpu/qgemm.cc) against the same product packing
// them on every call, interleaved, each from its own pool of cold copies. The budget is set to the
// kept pool's panels, all made before the timing, so the per-call pool's do not fit and are
// packed per call: the one switch the process has. Returns kept's GB/s of blocks over per-call's,
// per M.
std::vector<double> BatchedQuantized(const DecodeShape& s, const std::vector<int64_t>& ms,
                                     DType dtype, const Reps& reps) {
  namespace qgemm = dt::ops::cpu::qgemm;
  const int64_t pool_bytes = PoolBytes();
  const int64_t bytes = dt::DTypeBytes(dtype, s.n * s.k);
  const int64_t copies = std::max<int64_t>(1, (pool_bytes + bytes - 1) / bytes);
  std::vector<Tensor> pools[2];  // 0: per call, 1: kept
  pools[0].push_back(dt::RandomQuantized(dtype, {s.n, s.k}, 5).value());
  for (int64_t i = 1; i < 2 * copies; ++i) pools[i % 2].push_back(pools[0][0].Clone().value());
  const qgemm::Kernels& ks = qgemm::KernelsFor(qgemm::ActiveIsa());
  qgemm::SetPackedBudget(static_cast<int64_t>(pools[1].size()) *
                         qgemm::GemmScratchBytes(ks, dtype, s.n, s.k));
  // Every kept copy's panels made before the timing (they take the whole budget).
  const Tensor x0 = Tensor::Randn({ms.back(), s.k}, 6).value();
  for (const Tensor& w : pools[1]) (void)dt::ops::Linear(x0, w).value();
  const int64_t calls = std::max<int64_t>(1, (int64_t{4} << 20) / bytes);
  size_t next[2] = {0, 0};
  std::vector<double> ratios;
  for (const int64_t m : ms) {
    const Tensor x = Tensor::Randn({m, s.k}, 6).value();
    Tensor y;
    auto products = [&](int pool) {
      for (int64_t c = 0; c < calls; ++c) {
        y = dt::ops::Linear(x, pools[pool][next[pool]++ % pools[pool].size()]).value();
      }
    };
    const std::vector<double> t = Time(reps, {[&] { products(1); }, [&] { products(0); }});
    const double kept = bytes * calls / t[0] / 1e9, per_call = bytes * calls / t[1] / 1e9;
    std::printf("%-6s %-22s M=%-3lld %10.1f %10.1f %8.2f %10.0f\n", dt::DTypeName(dtype).data(),
                s.name, static_cast<long long>(m), per_call, kept, kept / per_call,
                static_cast<double>(qgemm::PackedBytes()) / (1 << 20));
    ratios.push_back(kept / per_call);
  }
  qgemm::SetPackedBudget(0);
  return ratios;
}

// Prefill on oneDNN with kept weights (Note [oneDNN weights layout] in ops/local/cpu/gemm_dnnl.cc):
// Linear(x [M, K], w [N, K]) in `dtype` forced on oneDNN, the read-only weight's layout kept (made
// before the timing) against the same product on the plain weight, interleaved, T threads, weights
// warm (a prefill product is bound by compute). Prints a row per shape and M; returns the ratios
// prepacked / plain, and adds to `pick`/`best` the figures of the knob's pick and the best of both.
std::vector<double> PrefillKeptWeights(DType dtype, const DecodeShape& s, const std::vector<int64_t>& ms,
                                       const Reps& reps, double& pick_sum, double& best_sum) {
  namespace tune = dt::ops::cpu::tune;
  const tune::Knob& knob = gemm::DnnlWeightsKnob(dtype);
  const int pick = tune::Pick(knob).value();
  const Tensor writable = Tensor::Randn({s.n, s.k}, 7, dtype).value();
  const dt::Storage& st = writable.storage();
  const Tensor w(dt::Storage::Alias(st, st.data(), st.nbytes(), /*read_only=*/true), writable.shape(),
                 writable.strides(), writable.storage_offset(), writable.dtype());
  dt::ops::cpu::kept::SetBudget(int64_t{1} << 30);
  gemm::SetBackendForTesting(Backend::kDnnl);
  std::vector<double> ratios;
  for (const int64_t m : ms) {
    const Tensor x = Tensor::Randn({m, s.k}, 8, dtype).value();
    Tensor y;
    auto run = [&](int candidate) {
      tune::ForceForTesting(knob, candidate);
      y = dt::ops::Linear(x, w).value();
      tune::ForceForTesting(knob, std::nullopt);
    };
    run(1);  // the layouts made before the timing
    const std::vector<double> t = Time(reps, {[&] { run(0); }, [&] { run(1); }});
    const double plain = Gflops(m, s.n, s.k, t[0]), kept = Gflops(m, s.n, s.k, t[1]);
    std::printf("%-6s %-22s M=%-4lld %10.1f %10.1f %8.2f %10.1f\n", dt::DTypeName(dtype).data(), s.name,
                static_cast<long long>(m), plain,
                kept, kept / plain,
                static_cast<double>(dt::ops::cpu::kept::Bytes()) / (1 << 20));
    ratios.push_back(kept / plain);
    pick_sum += std::log(pick == 0 ? plain : kept);
    best_sum += std::log(std::max(plain, kept));
  }
  gemm::SetBackendForTesting(std::nullopt);
  dt::ops::cpu::kept::SetBudget(0);
  return ratios;
}

// Every knob of the tuner (Note [Tuner] in ops/local/cpu/tuner.cc): this process's choice (from the
// cache, or measured on first use) against every candidate measured again now, in the knob's unit.
// A RESULT per knob: the pick's figure over the best one's. With --gemm-only, the GEMM backends'.
bool TunerRows(bool gemm_only, std::vector<Result>& results) {
  namespace tune = dt::ops::cpu::tune;
  std::printf("\ntuner: each knob's pick (cached or measured at first use) against its candidates "
              "measured again now; pick/best: the pick's figure over the best one's\n");
  for (const tune::Knob* knob : tune::AllKnobs()) {
    const std::vector<const tune::Knob*> backends = gemm::BackendKnobs();
    if (gemm_only && std::find(backends.begin(), backends.end(), knob) == backends.end()) continue;
    const absl::StatusOr<tune::Choice> pick = tune::Explain(*knob);
    if (!pick.ok()) {
      std::fprintf(stderr, "bench_gemm: %s: %s\n", knob->name.c_str(), pick.status().ToString().c_str());
      return false;
    }
    if (pick->why.starts_with("rule:") || pick->why.starts_with("DT_TUNE")) {
      std::printf("  %-22s %-9s %s (not measured)\n", knob->name.c_str(),
                  knob->candidates[pick->index].c_str(), pick->why.c_str());
      continue;
    }
    const absl::StatusOr<tune::Choice> now = tune::MeasureNow(*knob);
    if (!now.ok()) {
      std::fprintf(stderr, "bench_gemm: %s: %s\n", knob->name.c_str(), now.status().ToString().c_str());
      return false;
    }
    const double best = *std::max_element(now->figures.begin(), now->figures.end());
    const double ratio = now->figures[pick->index] / best;
    std::printf("  %-22s pick %-9s now %s; pick/best %.2f\n", knob->name.c_str(),
                knob->candidates[pick->index].c_str(), now->why.c_str(), ratio);
    std::string metric = "tuner_" + knob->name + "_pick_vs_best";
    std::replace(metric.begin(), metric.end(), '.', '_');
    results.push_back({metric, ratio, 0.95});
  }
  return true;
}

int PrintResults(const std::vector<Result>& results) {
  std::printf("\n");
  for (const Result& r : results) {
    std::printf("RESULT %s %.2f %.2g %s\n", r.metric.c_str(), r.value, r.target,
                dt::bench::Verdict(r.value >= r.target));
  }
  return 0;
}

}  // namespace

ABSL_FLAG(bool, gemm_only, false, "the GEMM rows only (no decode rows)");

int main(int argc, char** argv) {
  const bool quick = dt::bench::ParseBenchFlags(
      argc, argv, "usage: bench_gemm [--quick] [--gemm-only]\nGEMM and decode on every backend");
  const bool gemm_only = absl::GetFlag(FLAGS_gemm_only);
  // --quick (under a minute): GEMM rows the median of three rounds, decode rows at M = 1 only,
  // batched ones at M = 16 only.
  const Reps reps = quick ? Reps{3, 0.3} : Reps{10, 2.0};
  const Reps decode_reps = quick ? Reps{5, 0.1} : Reps{15, 1.0};
  const int threads = tbb::this_task_arena::max_concurrency();
  const dt::ops::cpu::CpuInfo& cpu = dt::ops::cpu::ThisCpu();
  std::printf("bench_gemm%s: T = %d threads on %s\n", quick ? " --quick" : "", threads,
              cpu.Describe().c_str());
  std::printf("  own: %s kernels on oneTBB; %s; %s\n", gemm::IsaName(gemm::ActiveIsa()),
              gemm::DnnlDescription().c_str(), gemm::OpenBlasDescription().c_str());
  if (const char* env = std::getenv("DT_GEMM"); env != nullptr && *env != '\0') {
    std::printf("  DT_GEMM=%s is set: the picked column is that backend\n", env);
  }
  const std::string cache = dt::ops::cpu::tune::CachePath();
  std::printf("\ndispatcher (tuner cache %s):\n", cache.empty() ? "none: no HOME" : cache.c_str());
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const gemm::ShapeClass c : gemm::kAllShapeClasses) {
      const absl::StatusOr<gemm::Decision> d = gemm::Decide(dtype, c);
      if (!d.ok()) {
        std::fprintf(stderr, "bench_gemm: %s\n", d.status().ToString().c_str());
        return 1;
      }
      std::printf("  %-5s %-7s -> %-9s %s\n", dt::DTypeName(dtype).data(), gemm::ShapeClassName(c),
                  gemm::BackendName(d->backend), d->why.c_str());
    }
  }

  std::vector<Result> results;
  if (!TunerRows(gemm_only, results)) return 1;
  // The picked path against the best one measured, worst row: GEMM rows and decode rows apart.
  double worst_gemm = 1e9, worst_decode = 1e9;
  std::string worst_gemm_row, worst_decode_row;
  auto track = [](double& worst, std::string& worst_row, const std::string& name, double ratio) {
    if (ratio < worst) worst = ratio, worst_row = name;
  };

  struct Shape {
    int64_t m, n, k;
    bool linear;
    const char* tag;  // RESULT metric part, or null
  };
  std::vector<Shape> shapes = {{1024, 1024, 1024, false, "1024"},
                               {4096, 4096, 1024, false, "4096x4096x1024"},
                               {512, 1536, 512, true, nullptr}};
  std::printf("\nGEMM, T=%d threads each (GFLOP/s = 2MNK / median time): Matmul on each backend and as "
              "picked; oneDNN's matmul on %d OpenMP threads (dnnl-omp); OpenBLAS on its own %d threads "
              "(blas-own-T); x.wT: Linear's layout\n", threads, threads, threads);
  PrintGemmHeader();
  double f32_1024 = 0, bf16_1024 = 0;
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const Shape& s : shapes) {
      const GemmRow r = Gemm(dtype, s.m, s.n, s.k, s.linear, threads, reps);
      PrintGemmRow(r);
      track(worst_gemm, worst_gemm_row, r.name, r.paths.choice(r.picked));
      if (s.tag != nullptr && dtype == DType::kF32) {
        results.push_back({std::string("gemm_f32_") + s.tag + "_vs_openblas", r.picked_gflops / r.openblas_native, 1.0});
        results.push_back({std::string("gemm_f32_") + s.tag + "_vs_onednn", r.picked_gflops / r.dnnl_native, 1.0});
      }
      if (s.m == 1024 && s.n == 1024) (dtype == DType::kF32 ? f32_1024 : bf16_1024) = r.picked_gflops;
    }
  }
  // bf16 must never be slower than f32, and where the CPU multiplies bf16 natively (AVX512_BF16 or
  // AMX) it should be half the work.
  const bool native_bf16 = cpu.avx512_bf16 || cpu.amx_bf16_granted;
  results.push_back({"gemm_bf16_vs_f32_1024", bf16_1024 / f32_1024, native_bf16 ? 1.5 : 1.0});
  std::printf("the picked path against the best one measured, worst GEMM row: %s (%.2f)\n",
              worst_gemm_row.c_str(), worst_gemm);
  results.push_back({"gemm_picked_vs_best_worst_row", worst_gemm, 0.95});

  if (gemm_only) return PrintResults(results);

  std::printf("\nf32 GEMM per thread (GFLOP/s): Matmul on each backend and as picked in a 1-thread arena; "
              "Eigen 3.4 (single-threaded)\n");
  std::printf("%-22s %9s %9s %9s %9s %9s %13s\n", "MxNxK", "own", "dnnl", "openblas", "picked", "eigen",
              "picked/eigen");
  {
    const PerThreadRow r = PerThread(1024, 1024, 1024, reps);
    std::printf("%-22s", r.name.c_str());
    r.paths.Print(9);
    std::printf(" %9.1f %9.1f %13.2f\n", r.picked, r.eigen, r.picked / r.eigen);
    results.push_back({"gemm_f32_1024_picked_vs_eigen_per_thread", r.picked / r.eigen, 1.0});
  }
  Bf16VsEigenBf16(1024, 1024, 1024, Reps{quick ? 2 : 3, 0.0});

  std::printf("\ndecode: Linear(x [M, K], w [N, K]) with cold weights, T=%d threads; GB/s of weights "
              "read on each backend and as picked; memcpy GB/s (bytes copied, 64 MiB, T threads, "
              "interleaved with the row); pick/best: the picked backend's figure over the best (Note "
              "[Picked against best])\n", threads);
  std::printf("%-34s %8s %8s %8s %14s %8s %9s %12s\n", "dtype w [N, K] M", "own", "dnnl", "openblas", "picked",
              "memcpy", "pick/best", "pick/memcpy");
  const DecodeShape decode_shapes[] = {
      {"q_proj 576x576", 576, 576},     {"k_proj 192x576", 192, 576},
      {"up_proj 1536x576", 1536, 576},  {"down_proj 576x1536", 576, 1536},
      {"lm_head 49152x576", 49152, 576}, {"4096x4096", 4096, 4096}};
  const std::vector<int64_t> ms =
      quick ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 2, 4, 8};
  double worst[2] = {1e9, 1e9};
  auto print_decode = [&](const DecodeRow& r) {
    std::printf("%-34s", r.name.c_str());
    r.paths.Print(8);
    std::printf(" %5s %8.1f %8.1f %9.2f %12.2f\n", gemm::BackendName(r.picked), r.picked_gbs, r.memcpy,
                r.paths.choice(r.picked), r.picked_gbs / r.memcpy);
  };
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const DecodeShape& s : decode_shapes) {
      for (const DecodeRow& r : Decode(s, ms, dtype, false, decode_reps)) {
        print_decode(r);
        track(worst_decode, worst_decode_row, r.name, r.paths.choice(r.picked));
        double& w = worst[dtype == DType::kBF16 ? 1 : 0];
        w = std::min(w, r.picked_gbs / r.memcpy);
      }
    }
  }
  // The other layout (x [M, K] . w [K, N], w rows along N: the skinny axpy kernels).
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    const DecodeRow r = Decode({"up_proj 1536x576", 1536, 576}, {1}, dtype, true, decode_reps)[0];
    print_decode(r);
    track(worst_decode, worst_decode_row, r.name, r.paths.choice(r.picked));
  }
  // Quantized weights (GB/s of their blocks; Note [Quantized GEMM] in ops/local/cpu/qgemm.cc): the
  // k-quants only where K is whole 256-element super-blocks.
  std::printf("\ndecode with quantized weights (x f32), T=%d threads, %s kernels; GB/s of blocks read\n",
              threads, dt::ops::cpu::qgemm::IsaName(dt::ops::cpu::qgemm::ActiveIsa()));
  double worst_q = 1e9;
  for (const DType dtype : {DType::kQ4_1, DType::kQ4_K, DType::kQ8_0, DType::kQ2_K, DType::kQ3_K,
                            DType::kIQ4_NL, DType::kIQ4_XS}) {
    for (const DecodeShape& s : decode_shapes) {
      if (s.k % dt::DTypeBlock(dtype) != 0) continue;
      for (const DecodeRow& r : Decode(s, ms, dtype, false, decode_reps)) {
        std::printf("%-34s %8.1f %8.1f %12.2f\n", r.name.c_str(), r.picked_gbs, r.memcpy,
                    r.picked_gbs / r.memcpy);
        if (r.name.ends_with(" M=1")) worst_q = std::min(worst_q, r.picked_gbs / r.memcpy);
      }
    }
  }
  results.push_back({"qgemv_m1_vs_memcpy_worst_row", worst_q, 0.6});
  std::printf(
      "\nbatched decode with quantized weights (x f32), T=%d threads: GB/s of blocks with the "
      "panels packed per call and kept (Note [Packed quantized weights]), interleaved, "
      "weights cold; kept MiB: panels held\n",
      threads);
  std::printf("%-6s %-22s %-5s %10s %10s %8s %10s\n", "dtype", "w [N, K]", "M", "per call", "kept",
              "kept/pc", "kept MiB");
  const std::vector<int64_t> batched_ms =
      quick ? std::vector<int64_t>{16} : std::vector<int64_t>{8, 16};
  double worst_kept = 1e9;
  for (const DType dtype :
       quick ? std::vector<DType>{DType::kQ4_1, DType::kQ4_K, DType::kQ2_K}
             : std::vector<DType>{DType::kQ4_1, DType::kQ4_K, DType::kQ8_0, DType::kQ2_K,
                                  DType::kQ3_K, DType::kIQ4_NL, DType::kIQ4_XS}) {
    for (const DecodeShape& s : {DecodeShape{"up_proj 1536x576", 1536, 576},
                                 DecodeShape{"down_proj 576x1536", 576, 1536}}) {
      if (s.k % dt::DTypeBlock(dtype) != 0) continue;
      for (const double r : BatchedQuantized(s, batched_ms, dtype, decode_reps)) {
        worst_kept = std::min(worst_kept, r);
      }
    }
  }
  results.push_back({"qgemm_batched_kept_vs_per_call_worst_row", worst_kept, 1.0});
  std::printf(
      "\nprefill on oneDNN with kept weights, T=%d threads: GFLOP/s with the weights plain (copied "
      "into oneDNN's layout per call) and their layout kept (Note [oneDNN weights layout]), "
      "interleaved, weights warm; kept MiB: layouts held\n",
      threads);
  for (const DType dtype : {DType::kBF16, DType::kF32}) {
    const dt::ops::cpu::tune::Knob& knob = gemm::DnnlWeightsKnob(dtype);
    const dt::ops::cpu::tune::Choice pick = dt::ops::cpu::tune::Explain(knob).value();
    std::printf("%s: the knob picks %s (%s)\n", knob.name.c_str(), knob.candidates[pick.index].c_str(),
                pick.why.c_str());
    std::printf("%-6s %-22s %-6s %10s %10s %8s %10s\n", "dtype", "w [N, K]", "M", "plain", "kept", "kept/pl",
                "kept MiB");
    double pick_sum = 0, best_sum = 0, ratio_sum = 0;
    int rows = 0;
    for (const DecodeShape& s : {DecodeShape{"q_proj 576x576", 576, 576}, DecodeShape{"up_proj 1536x576", 1536, 576},
                                 DecodeShape{"down_proj 576x1536", 576, 1536}, DecodeShape{"2048x2048", 2048, 2048}}) {
      for (const double r : PrefillKeptWeights(dtype, s, quick ? std::vector<int64_t>{128, 512}
                                                               : std::vector<int64_t>{128, 256, 512},
                                               reps, pick_sum, best_sum)) {
        ratio_sum += std::log(r);
        ++rows;
      }
    }
    std::printf("kept/plain, geometric mean over the rows: %.3f\n", std::exp(ratio_sum / rows));
    results.push_back({absl::StrCat("gemm_", dt::DTypeName(dtype), "_dnnl_weights_pick_vs_best"),
                       std::exp((pick_sum - best_sum) / rows), 0.95});
  }

  results.push_back({"gemv_f32_vs_memcpy_worst_row", worst[0], 0.7});
  results.push_back({"gemv_bf16_vs_memcpy_worst_row", worst[1], 0.7});
  std::printf("\nthe picked path against the best one measured, worst decode row: %s (%.2f)\n",
              worst_decode_row.c_str(), worst_decode);
  results.push_back({"decode_picked_vs_best_worst_row", worst_decode, 0.95});
  return PrintResults(results);
}
