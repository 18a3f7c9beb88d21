// bench_dispatch: what a DTensor op costs beyond its local kernel when its strategy is cached.
//
// Usage: bench_dispatch [--quick]   (--quick: fewer repetitions, a few seconds)
//
// On one thread, with an abstract 1-D mesh of 4 ranks seen from rank 1 (the strategies below need
// no communication, so no world is needed and nothing else competes for the cores):
//   add     ops::Add of two f32 [8, 16] DTensors sharded S(0)   vs ops::Add of the local pieces
//   linear  ops::Linear, x [4, 16] R, w [32, 16] S(0) (colwise) vs ops::Linear of the local pieces
// Both sides run the same kernel on the same tiny tensors, alternating in repetitions; the overhead
// per call is the difference of the medians: the cache hit (hashing the input specs, one probe),
// the spec of the result and the DTensor around it. PyTorch DTensor spends 24-90 us per op here
// (reference §4-5). For information, the cost of a cache miss (choosing the strategy, with the
// planner's own cache warm) is shown for Linear on 1-, 2- and 3-D abstract meshes.
//
// Ends with one line per target: RESULT <metric> <value> <target> PASS|FAIL.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "dtensor/bench/bench_util.h"
#include "dtensor/core/status.h"
#include "dtensor/dtensor/dtensor.h"
#include "dtensor/ops/dispatch.h"  // LastDecision
#include "dtensor/ops/dtensor_ops.h"
#include "dtensor/ops/local/ops.h"

namespace dt {
namespace {

using Clock = std::chrono::steady_clock;
using bench::Median;

// ns per call of fn over `n` calls.
double TimePerCall(const std::function<bool()>& fn, int n) {
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    if (!fn()) {
      std::fprintf(stderr, "bench_dispatch: the measured call failed\n");
      std::exit(1);
    }
  }
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n;
}

struct Row {
  const char* name;
  double dtensor_ns;
  double local_ns;
};

Row Measure(const char* name, const std::function<bool()>& dtensor_op,
            const std::function<bool()>& local_op, bool quick) {
  const int reps = quick ? 15 : 41;
  const int n = quick ? 20000 : 100000;
  TimePerCall(dtensor_op, 1000);  // warm: the first call fills the strategy cache
  TimePerCall(local_op, 1000);
  std::vector<double> d, l;
  for (int r = 0; r < reps; ++r) {
    d.push_back(TimePerCall(dtensor_op, n));
    l.push_back(TimePerCall(local_op, n));
  }
  return {name, Median(d), Median(l)};
}

Placements Pl(const char* text) { return ParsePlacements(text).value(); }

int Main(bool quick) {
  const DeviceMesh mesh = DeviceMesh::Abstract({4}, {"tp"}, /*rank=*/1).value();
  const DTensor a = DTensor::Rand({8, 16}, 1, mesh, Pl("S(0)")).value();
  const DTensor b = DTensor::Rand({8, 16}, 2, mesh, Pl("S(0)")).value();
  const DTensor x = DTensor::Rand({4, 16}, 3, mesh, Pl("R")).value();
  const DTensor w = DTensor::Rand({32, 16}, 4, mesh, Pl("S(0)")).value();
  const Tensor la = a.ToLocal(), lb = b.ToLocal(), lx = x.ToLocal(), lw = w.ToLocal();

  std::vector<Row> rows;
  rows.push_back(Measure(
      "add", [&] { return ops::Add(a, b).ok(); }, [&] { return ops::Add(la, lb).ok(); }, quick));
  rows.push_back(Measure(
      "linear", [&] { return ops::Linear(x, w).ok(); }, [&] { return ops::Linear(lx, lw).ok(); },
      quick));
  const ops::Decision last = ops::LastDecision();
  if (!last.cache_hit) {
    std::fprintf(stderr, "bench_dispatch: expected a cache hit, got %s\n", last.ToString().c_str());
    return 1;
  }

  std::printf("%-8s %14s %14s %14s %8s\n", "op", "dtensor ns", "local ns", "overhead ns", "ratio");
  for (const Row& r : rows) {
    std::printf("%-8s %14.0f %14.0f %14.0f %8.2f\n", r.name, r.dtensor_ns, r.local_ns,
                r.dtensor_ns - r.local_ns, r.dtensor_ns / r.local_ns);
  }
  std::printf("(%s; strategy cache: %lld hits, %lld misses)\n", last.ToString().c_str(),
              static_cast<long long>(ops::GetDispatchCacheStats().hits),
              static_cast<long long>(ops::GetDispatchCacheStats().misses));
  // Cache misses: Linear x [S(0), R, ...] w [R, ..., S(0)] (colwise, batch-split) on growing
  // meshes.
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{4}, std::vector<int64_t>{2, 4},
                                            std::vector<int64_t>{2, 2, 2}}) {
    const DeviceMesh m = DeviceMesh::Abstract(shape, {}, /*rank=*/1).value();
    Placements px(shape.size(), Placement::Replicate()), pw = px;
    if (shape.size() > 1) px[0] = Placement::Shard(0);
    pw.back() = Placement::Shard(0);
    const DTensor mx = DTensor::Zeros({8, 64}, m, px).value();
    const DTensor mw = DTensor::Zeros({64, 64}, m, pw).value();
    const int n = quick ? 200 : 1000;
    const double ns = TimePerCall(
        [&] {
          ops::ClearDispatchCache();
          return ops::Linear(mx, mw).ok();
        },
        n);
    std::printf("cache miss, Linear on %s: %.1f us\n", m.ToString().c_str(), ns / 1e3);
  }
  for (const Row& r : rows) {
    const double overhead = r.dtensor_ns - r.local_ns;
    std::printf("RESULT dispatch_%s_overhead_ns %.0f 2000 %s\n", r.name, overhead,
                bench::Verdict(overhead < 2000));
  }
  return 0;
}

}  // namespace
}  // namespace dt

int main(int argc, char** argv) {
  const std::optional<bool> flag = dt::bench::ParseQuickFlag(argc, argv);
  if (!flag.has_value()) return 2;
  const bool quick = *flag;
  return dt::Main(quick);
}
