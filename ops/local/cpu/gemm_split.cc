// The backends' names and dtypes, and the split of one product's output over the oneTBB arena for
// the library backends.
//
// Note [Library threads]
// oneDNN and OpenBLAS run single-threaded, each call on a part of the output, and oneTBB spreads
// the parts over the arena as it does our own kernels' tasks. Both libraries could thread by
// themselves, but not well beside oneTBB:
//   - Debian builds oneDNN on OpenMP (DNNL_CPU_RUNTIME OMP): a call from a thread starts or reuses
//     that thread's OpenMP team, whose threads then spin-wait (libgomp's default) on the cores the
//     next oneTBB op wants; a call from inside a oneTBB task (batched products, rank threads of
//     the `threads` backend) starts one team per calling thread, cores x callers threads.
//   - OpenBLAS (pthread build) has one pool for the process, serialises concurrent callers on it,
//     and its thread count is process-wide.
// So each call runs with one thread (omp_set_num_threads(1) on the calling thread: a per-thread
// OpenMP setting; openblas_set_num_threads(1) once), and the budget of threads is the arena's, capped
// like our kernels' by Note [One core budget per node]. The price: each part packs its own panels
// of the operand it shares with the other parts of its row or column. The grid of parts is chosen
// to keep that small: for r x c parts of an M x N output the shared panels cost r·N·K + c·M·K, so
// a tall product is cut into row blocks and a wide one into column blocks.

#include <algorithm>
#include <mutex>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include "dtensor/ops/local/cpu/gemm_backends.h"
#include "dtensor/ops/local/cpu/gemm_scratch.h"

namespace dt::ops::cpu::gemm {

namespace {

// A product below this many flops runs as one part.
constexpr double kMinSplitFlops = 4e6;
// Parts per thread, so that oneTBB can rebalance when another process takes a core.
constexpr int kPartsPerThread = 2;
// Parts are at least this many rows / columns (whole ones, except the last).
constexpr int64_t kRowQuantum = 16, kColQuantum = 64;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

const char* BackendName(Backend b) {
  switch (b) {
    case Backend::kOwn: return "own";
    case Backend::kDnnl: return "dnnl";
    case Backend::kOpenBlas: return "openblas";
  }
  return "?";
}

bool BackendRuns(Backend b, DType dtype) {
  switch (b) {
    case Backend::kOwn: return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
    case Backend::kDnnl: return dtype == DType::kF32 || dtype == DType::kBF16;
    case Backend::kOpenBlas: return dtype == DType::kF32;
  }
  return false;
}

absl::Status SplitOutput(const Problem& p, bool parallel,
                         absl::FunctionRef<absl::Status(const Problem& part)> part) {
  const int threads = parallel ? AvailableThreads() : 1;
  const double flops = 2.0 * static_cast<double>(p.m) * p.n * p.k;
  if (threads <= 1 || flops < kMinSplitFlops) return part(p);
  // The grid r x c with about `target` parts that packs the least (Note [Library threads]).
  const int64_t target = int64_t{threads} * kPartsPerThread;
  const int64_t max_r = std::max<int64_t>(1, p.m / kRowQuantum);
  const int64_t max_c = std::max<int64_t>(1, p.n / kColQuantum);
  int64_t best_r = 1, best_c = 1;
  double best_cost = -1;
  for (int64_t r = 1; r <= std::min(target, max_r); ++r) {
    const int64_t c = std::min(max_c, CeilDiv(target, r));
    // Fewer parts than threads leaves threads idle: count it as the time it costs.
    const double idle = static_cast<double>(threads) / std::min<int64_t>(threads, r * c);
    const double cost = idle * (static_cast<double>(r) * p.n + static_cast<double>(c) * p.m);
    if (best_cost < 0 || cost < best_cost) best_cost = cost, best_r = r, best_c = c;
  }
  const int64_t rows = CeilDiv(CeilDiv(p.m, best_r), kRowQuantum) * kRowQuantum;
  const int64_t cols = CeilDiv(CeilDiv(p.n, best_c), kColQuantum) * kColQuantum;
  const int64_t nr = CeilDiv(p.m, rows), nc = CeilDiv(p.n, cols);
  if (nr * nc == 1) return part(p);
  const int64_t size = DTypeSize(p.dtype);
  std::mutex mu;
  absl::Status status;
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, nr * nc, 1),
      [&](const tbb::blocked_range<int64_t>& range) {
        for (int64_t t = range.begin(); t != range.end(); ++t) {
          const int64_t i0 = t / nc * rows, j0 = t % nc * cols;
          Problem q = p;
          q.m = std::min(rows, p.m - i0);
          q.n = std::min(cols, p.n - j0);
          q.a = static_cast<const char*>(p.a) + i0 * p.a_rs * size;
          q.b = static_cast<const char*>(p.b) + j0 * p.b_cs * size;
          q.out = static_cast<char*>(p.out) + (i0 * p.ldo + j0) * size;
          if (p.bias != nullptr) q.bias = p.bias + j0;
          absl::Status s = part(q);
          if (!s.ok()) {
            std::lock_guard<std::mutex> lock(mu);
            status.Update(s);
          }
        }
      },
      tbb::simple_partitioner());
  return status;
}

}  // namespace dt::ops::cpu::gemm
