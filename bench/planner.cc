// bench_planner: how long PlanRedistribute takes (cold: no plan cache) against mesh dims and size.
//
//   bench_planner [--quick] [--samples N] [--ranks-per-host H]
//
// For each mesh (1 to 5 dims, 8 to 10^4 ranks; a 6-dim and a 10^5-rank mesh for information) it
// plans random (src, dst) pairs: every mesh dim draws R, S(d), _S(d,sf), _S(d,[blocks]) or P (one
// op per pair among sum, avg, max; dst keeps a source Partial or drops it) on uneven 1- to 3-dim
// shapes, with the host-aware cost model (8 ranks per host by default, so every step is also
// classified intra-/cross-host). Each pair is timed as the best of 3 cold plans, so that a
// preempted run on a busy machine does not count; the table shows the median, p99 and max over
// pairs, and beside them the same pairs planned greedy-only (PyTorch's order, the baseline).
//
// RESULT plan_time_ms_max_<d>d <max over the pairs of the <d>-dim meshes> 10 PASS|FAIL  (d = 1..5)
// RESULT plan_time_ms_1e4_ranks <max over the pairs of the 10^4-rank meshes of <= 5 dims> 10 ...

#include "dtensor/dtensor/planner.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/flags/flag.h"
#include "dtensor/bench/bench_util.h"
#include "dtensor/dtensor/spec.h"

namespace dt {
namespace {

using Clock = std::chrono::steady_clock;

struct MeshCase {
  std::vector<int64_t> shape;
  bool info = false;  // shown, not part of the RESULT lines
};

struct Pair {
  DTensorSpec src, dst;
};

Placement RandomPlacement(std::mt19937& rng, const Shape& shape, bool partial, ReduceOp op) {
  const int kind = std::uniform_int_distribution<int>(0, partial ? 5 : 4)(rng);
  const int d = std::uniform_int_distribution<int>(0, static_cast<int>(shape.size()) - 1)(rng);
  switch (kind) {
    case 0:
      return Placement::Replicate();
    case 1:
    case 2:
      return Placement::Shard(d);
    case 3:
      return Placement::StridedShard(d, std::uniform_int_distribution<int64_t>(2, 4)(rng));
    case 4: {
      // A fused-weight block list over the whole tensor dim: valid when no mesh dim left of this
      // one splits d (otherwise the spec is rejected and the pair drawn again).
      std::vector<int64_t> blocks;
      int64_t left = shape[d];
      const int nb = std::uniform_int_distribution<int>(2, 5)(rng);
      for (int b = 0; b + 1 < nb; ++b) {
        blocks.push_back(std::uniform_int_distribution<int64_t>(0, left)(rng));
        left -= blocks.back();
      }
      blocks.push_back(left);
      return Placement::BlockShard(d, std::move(blocks));
    }
    default:
      return Placement::Partial(op);
  }
}

// Random legal pairs on `mesh`.
std::vector<Pair> MakePairs(const std::vector<int64_t>& mesh_shape, int count, uint32_t seed) {
  std::mt19937 rng(seed);
  const DeviceMesh mesh = DeviceMesh::Abstract(mesh_shape).value();
  const int m = static_cast<int>(mesh_shape.size());
  std::vector<Pair> pairs;
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};
  for (int attempt = 0; static_cast<int>(pairs.size()) < count && attempt < count * 50; ++attempt) {
    const int ndim = std::uniform_int_distribution<int>(1, 3)(rng);
    Shape shape;
    for (int d = 0; d < ndim; ++d) {
      // Mostly uneven sizes (odd, often prime-like), sometimes a power of two.
      const bool even = std::uniform_int_distribution<int>(0, 3)(rng) == 0;
      shape.push_back(even ? int64_t{1} << std::uniform_int_distribution<int>(3, 13)(rng)
                           : 2 * std::uniform_int_distribution<int64_t>(1, 4000)(rng) + 1);
    }
    const ReduceOp op = ops[std::uniform_int_distribution<int>(0, 2)(rng)];
    Placements src, dst;
    for (int i = 0; i < m; ++i) {
      src.push_back(RandomPlacement(rng, shape, true, op));
      const bool keep_partial = src.back().is_partial() || src.back().is_replicate();
      dst.push_back(RandomPlacement(rng, shape, keep_partial, op));
    }
    auto s = DTensorSpec::Create(mesh, src, shape, DType::kF32);
    auto t = DTensorSpec::Create(mesh, dst, shape, DType::kF32);
    if (!s.ok() || !t.ok()) continue;
    pairs.push_back({*s, *t});
  }
  return pairs;
}

// Best of `reps` cold plans, in milliseconds; false when planning failed.
bool TimePlan(const Pair& p, const PlannerOptions& options, int reps, double* ms) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    auto plan = PlanRedistribute(p.src, p.dst, options);
    const double t = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (!plan.ok()) {
      std::fprintf(stderr, "bench_planner: %s\n", std::string(plan.status().message()).c_str());
      return false;
    }
    best = std::min(best, t);
  }
  *ms = best;
  return true;
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return v[i];
}

int Run(bool quick, int samples, int64_t ranks_per_host) {
  if (samples <= 0) samples = quick ? 1000 : 10000;
  const std::vector<MeshCase> meshes = {
      {{8}},
      {{1024}},
      {{10000}},  // 1 dim
      {{8, 8}},
      {{128, 64}},
      {{100, 100}},  // 2
      {{16, 16, 16}},
      {{32, 16, 16}},
      {{10, 10, 100}},  // 3
      {{8, 8, 8, 8}},
      {{16, 8, 8, 8}},
      {{10, 10, 10, 10}},  // 4
      {{4, 4, 4, 4, 4}},
      {{8, 8, 8, 4, 4}},
      {{4, 5, 5, 10, 10}},  // 5
      {{4, 4, 4, 4, 4, 4}, true},
      {{10, 10, 10, 10, 10}, true},  // info
  };
  PlannerOptions best;
  best.cost.ranks_per_host = ranks_per_host;
  // The random targets include Partial placements (R -> P is how ops plan internally); the
  // planner refuses them unless asked, and every pair must plan for the timing to count.
  best.allow_partial = true;
  PlannerOptions greedy = best;
  greedy.strategy = PlannerOptions::Strategy::kGreedy;

  std::printf(
      "bench_planner: %d random (src, dst) pairs per mesh, best of 3 cold plans each, "
      "%lld ranks per host\n",
      samples, static_cast<long long>(ranks_per_host));
  std::printf("%-18s %4s %7s %7s %10s %10s %10s %12s %8s\n", "mesh", "dims", "ranks", "pairs",
              "median ms", "p99 ms", "max ms", "greedy med", "ratio");
  std::map<int, double> max_by_dims;
  double max_1e4 = 0;
  bool ok = true;
  for (size_t c = 0; c < meshes.size(); ++c) {
    const MeshCase& mc = meshes[c];
    int64_t ranks = 1;
    for (int64_t k : mc.shape) ranks *= k;
    const std::vector<Pair> pairs = MakePairs(mc.shape, samples, 1234 + static_cast<uint32_t>(c));
    std::vector<double> t_best, t_greedy;
    for (const Pair& p : pairs) {
      double a = 0, b = 0;
      if (!TimePlan(p, best, 3, &a) || !TimePlan(p, greedy, 3, &b)) {
        ok = false;
        continue;
      }
      t_best.push_back(a);
      t_greedy.push_back(b);
    }
    const double med = Quantile(t_best, 0.5), p99 = Quantile(t_best, 0.99);
    const double mx = t_best.empty() ? 0 : *std::max_element(t_best.begin(), t_best.end());
    const double gmed = Quantile(t_greedy, 0.5);
    const int dims = static_cast<int>(mc.shape.size());
    std::printf("%-18s %4d %7lld %7zu %10.4f %10.4f %10.4f %12.4f %8.2f%s\n",
                absl::StrJoin(mc.shape, "x").c_str(), dims, static_cast<long long>(ranks),
                t_best.size(), med, p99, mx, gmed, gmed > 0 ? med / gmed : 0.0,
                mc.info ? "  (info)" : "");
    if (static_cast<int>(t_best.size()) < samples / 2) {
      std::fprintf(stderr, "bench_planner: only %zu pairs for mesh %s\n", t_best.size(),
                   absl::StrJoin(mc.shape, "x").c_str());
      ok = false;
    }
    if (mc.info) continue;
    max_by_dims[dims] = std::max(max_by_dims[dims], mx);
    if (ranks >= 10000) max_1e4 = std::max(max_1e4, mx);
  }
  std::printf("ratio: median of ours (greedy + min-cost search, merging, hosts) / greedy only\n");
  constexpr double kTargetMs = 10;
  for (const auto& [dims, mx] : max_by_dims) {
    std::printf("RESULT plan_time_ms_max_%dd %.4f %g %s\n", dims, mx, kTargetMs,
                bench::Verdict(ok && mx < kTargetMs));
  }
  std::printf("RESULT plan_time_ms_1e4_ranks %.4f %g %s\n", max_1e4, kTargetMs,
              bench::Verdict(ok && max_1e4 < kTargetMs));
  return 0;
}

}  // namespace
}  // namespace dt

ABSL_FLAG(int, samples, 0, "random cases to plan (0: the mode's default)");
ABSL_FLAG(int64_t, ranks_per_host, 8, "host h holds ranks h*N .. h*N+N-1 in the cost model");

int main(int argc, char** argv) {
  const bool quick = dt::bench::ParseBenchFlags(argc, argv, "usage: bench_planner [--quick] [--samples N] [--ranks-per-host H]\n"
                                                            "the planner's speed and plan quality");
  return dt::Run(quick, absl::GetFlag(FLAGS_samples), absl::GetFlag(FLAGS_ranks_per_host));
}
