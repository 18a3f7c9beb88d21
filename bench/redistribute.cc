// bench_redistribute: what DTensor::Redistribute costs beyond the collective it runs.
//
// Usage: bench_redistribute [--quick] [--backends threads,gloo,mpi] [--ranks 2,4] [--sizes 16,64]
//   (shm is accepted in --backends too)
//   (--quick: fewer repetitions, under a minute)
//
// 1. Overhead per call (one process): a cached plan + dispatch for Redistribute to the same
//    placements (an empty plan) and for R -> S(0) (one local step, a view) on a small tensor.
//    PyTorch DTensor spends 24-90 us per op in dispatch (reference §4-5).
// 2. Bandwidth: S(0)->R, P->R, P->S(0) and S(0)->S(1) of a 16 and a 64 MiB f32 global tensor on 2
//    and 4 ranks, beside the raw collective of the same bytes on preallocated buffers in the same
//    run (all_gather, all_reduce, reduce_scatter, all_to_all), alternating the two, best of the
//    repetitions. threads runs in this process; shm, gloo and mpi re-launch this program as
//    workers under dtrun (next to this binary) and mpirun.
//    P->R uses the rvalue form (std::move(x).Redistribute), which reduces in place like the raw
//    all_reduce; the copying lvalue form is shown too. S(0)->S(1) sends every peer a strided block
//    (x[:, cols(g)]) through one all_to_all_views (Note [Shard to shard in one pass]); its raw
//    baseline stays the all_to_all of contiguous blocks of the same bytes, which transposes
//    nothing (PyTorch packs with movedim+contiguous first).
//    Freed buffers are kept by malloc (mallopt M_MMAP_MAX 0, M_TRIM_THRESHOLD) in this program, as
//    a caching allocator would, so that both columns pay for data movement, not for page faults.
//
// Ends with one line per target: RESULT <metric> <value> <target> PASS|FAIL — the overhead, and per
// kind of redistribution the geometric mean of raw/ours over backends, rank counts and sizes (the
// table shows every configuration and the lowest one).

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/flags/flag.h"
#include "dtensor/bench/bench_util.h"
#include "dtensor/core/status.h"
#include "dtensor/dtensor/dtensor.h"
#include "dtensor/mesh/world.h"

ABSL_FLAG(bool, worker, false, "run as one rank (what the driver launches)");
ABSL_FLAG(std::string, backends, "threads,gloo,mpi", "backends to measure, comma-separated");
ABSL_FLAG(std::string, ranks, "2,4", "rank counts, comma-separated");
ABSL_FLAG(std::string, sizes, "16,64", "tensor sizes in MiB, comma-separated");

namespace dt {
namespace {

using Clock = std::chrono::steady_clock;

using bench::Median;
using bench::Verdict;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

Placements Pl(const char* text) { return ParsePlacements(text).value(); }

// ---- 1. overhead -------------------------------------------------------------------------------

// Time per Redistribute call without communication, on one thread: a plan-cache hit, the
// executor and a new spec/DTensor. The mesh is abstract (rank 1 of 4): no step of these plans
// communicates, so no world is needed and no other thread competes.
absl::StatusOr<double> MeasureOverhead(const char* from, const char* to, bool quick) {
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, DeviceMesh::Abstract({4}, {}, /*rank=*/1));
  DT_ASSIGN_OR_RETURN(DTensor x, DTensor::Zeros({64, 64}, mesh, Pl(from)));
  const Placements dst = Pl(to);
  const int n = quick ? 200000 : 1000000;
  for (int i = 0; i < 1000; ++i) DT_RETURN_IF_ERROR(x.Redistribute(dst).status());  // warm
  std::vector<double> samples;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    for (int i = 0; i < n / 5; ++i) {
      auto y = x.Redistribute(dst);
      if (!y.ok()) return y.status();
    }
    samples.push_back(Seconds(t0, Clock::now()) * 1e6 / (n / 5));
  }
  return Median(samples);
}

// ---- 2. bandwidth ------------------------------------------------------------------------------

struct Row {
  std::string backend, op;
  int ranks = 0;
  int64_t mib = 0;
  double ours_ms = 0, raw_ms = 0;
  bool counted = true;  // part of the bandwidth RESULT
};

// Rows marked "vs ..." are informational (not in RESULT): the lvalue P->R copies its input, and
// "S(0)->S(1) vs AG" compares our all_to_all path with PyTorch's CPU/gloo fallback, an all_gather of
// the whole tensor (then a local chunk).
const char* kOps[] = {"S(0)->R", "P->R", "P->R (lvalue copy)", "P->S(0)", "S(0)->S(1)",
                      "S(0)->S(1) vs AG"};

// Runs one op pair on this rank of `world`; every rank calls it. Returns rank-0 times (ms).
absl::StatusOr<Row> MeasureOp(const std::shared_ptr<World>& world, const std::string& op, int64_t mib,
                              int reps) {
  const int k = world->size();
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(world, {k}));
  DT_ASSIGN_OR_RETURN(CommPtr comm, mesh.Comm(0));
  DT_ASSIGN_OR_RETURN(CommPtr all, world->WorldGroup());
  const int64_t side = mib == 16 ? 2048 : mib == 64 ? 4096 : static_cast<int64_t>(512 * std::sqrt(mib));
  const Shape shape = {side, side};
  const int64_t numel = side * side;
  Row row;
  row.backend = std::string(world->backend());
  row.op = op;
  row.ranks = k;
  row.mib = numel * 4 >> 20;
  row.counted = op != "P->R (lvalue copy)" && op != "S(0)->S(1) vs AG";

  // Inputs and raw buffers.
  std::function<absl::Status()> ours, raw;
  DTensor keep;
  Tensor buf, raw_in, raw_out;
  if (op == "S(0)->R") {
    DT_ASSIGN_OR_RETURN(keep, DTensor::Zeros(shape, mesh, Pl("S(0)")));
    DT_ASSIGN_OR_RETURN(raw_in, Tensor::Zeros({numel / k}));
    DT_ASSIGN_OR_RETURN(raw_out, Tensor::Empty({numel}));
    ours = [&] { return keep.Redistribute(Pl("R")).status(); };
    raw = [&] { return comm->AllGather(raw_in, raw_out); };
  } else if (op == "P->R") {
    DT_ASSIGN_OR_RETURN(buf, Tensor::Zeros(shape));
    DT_ASSIGN_OR_RETURN(raw_in, Tensor::Zeros({numel}));
    ours = [&]() -> absl::Status {
      DT_ASSIGN_OR_RETURN(DTensor p, DTensor::FromLocal(std::move(buf), mesh, Pl("P(sum)")));
      DT_ASSIGN_OR_RETURN(DTensor r, std::move(p).Redistribute(Pl("R")));
      buf = r.ToLocal();
      return absl::OkStatus();
    };
    raw = [&] { return comm->AllReduce(raw_in, ReduceOp::kSum); };
  } else if (op == "P->R (lvalue copy)") {
    DT_ASSIGN_OR_RETURN(keep, DTensor::FromLocal(Tensor::Zeros(shape).value(), mesh, Pl("P(sum)")));
    DT_ASSIGN_OR_RETURN(raw_in, Tensor::Zeros({numel}));
    ours = [&] { return keep.Redistribute(Pl("R")).status(); };
    raw = [&] { return comm->AllReduce(raw_in, ReduceOp::kSum); };
  } else if (op == "P->S(0)") {
    DT_ASSIGN_OR_RETURN(keep, DTensor::FromLocal(Tensor::Zeros(shape).value(), mesh, Pl("P(sum)")));
    DT_ASSIGN_OR_RETURN(raw_in, Tensor::Zeros({numel}));
    DT_ASSIGN_OR_RETURN(raw_out, Tensor::Empty({numel / k}));
    ours = [&] { return keep.Redistribute(Pl("S(0)")).status(); };
    raw = [&] { return comm->ReduceScatter(raw_in, raw_out, ReduceOp::kSum); };
  } else if (op == "S(0)->S(1) vs AG") {
    DT_ASSIGN_OR_RETURN(keep, DTensor::Zeros(shape, mesh, Pl("S(0)")));
    DT_ASSIGN_OR_RETURN(raw_in, Tensor::Zeros({numel / k}));
    DT_ASSIGN_OR_RETURN(raw_out, Tensor::Empty({numel}));
    ours = [&] { return keep.Redistribute(Pl("S(1)")).status(); };
    raw = [&] { return comm->AllGather(raw_in, raw_out); };
  } else {
    DT_ASSIGN_OR_RETURN(keep, DTensor::Zeros(shape, mesh, Pl("S(0)")));
    DT_ASSIGN_OR_RETURN(raw_in, Tensor::Zeros({numel / k}));
    DT_ASSIGN_OR_RETURN(raw_out, Tensor::Empty({numel / k}));
    ours = [&] { return keep.Redistribute(Pl("S(1)")).status(); };
    raw = [&] { return comm->AllToAll(raw_in, raw_out); };
  }
  auto timed = [&](const std::function<absl::Status()>& f) -> absl::StatusOr<double> {
    DT_RETURN_IF_ERROR(all->Barrier());
    const auto t0 = Clock::now();
    DT_RETURN_IF_ERROR(f());
    DT_RETURN_IF_ERROR(all->Barrier());
    return Seconds(t0, Clock::now()) * 1e3;
  };
  DT_RETURN_IF_ERROR(timed(raw).status());  // warm both paths (and the plan cache)
  DT_RETURN_IF_ERROR(timed(ours).status());
  std::vector<double> o, r;
  for (int i = 0; i < reps; ++i) {  // alternate which goes first, so neither inherits warm caches
    double tr = 0, to = 0;
    if (i % 2 == 0) {
      DT_ASSIGN_OR_RETURN(tr, timed(raw));
      DT_ASSIGN_OR_RETURN(to, timed(ours));
    } else {
      DT_ASSIGN_OR_RETURN(to, timed(ours));
      DT_ASSIGN_OR_RETURN(tr, timed(raw));
    }
    r.push_back(tr);
    o.push_back(to);
  }
  // The fastest repetition of each: this VM's other tenants add noise that only ever slows a run.
  row.ours_ms = *std::min_element(o.begin(), o.end());
  row.raw_ms = *std::min_element(r.begin(), r.end());
  return row;
}

absl::StatusOr<std::vector<Row>> MeasureAll(const std::shared_ptr<World>& world,
                                            const std::vector<int64_t>& sizes, bool quick) {
  std::vector<Row> rows;
  for (int64_t mib : sizes) {
    for (const char* op : kOps) {
      if (quick && std::string(op) == "P->R (lvalue copy)") continue;  // informational only
      const int reps = quick ? (mib >= 64 ? 7 : 15) : 21;
      DT_ASSIGN_OR_RETURN(Row row, MeasureOp(world, op, mib, reps));
      rows.push_back(row);
    }
  }
  return rows;
}

std::string Encode(const Row& r) {
  return absl::StrCat("ROW|", r.backend, "|", r.op, "|", r.ranks, "|", r.mib, "|", r.ours_ms, "|",
                      r.raw_ms, "|", r.counted ? 1 : 0);
}

bool Decode(absl::string_view line, Row* r) {
  const size_t at = line.find("ROW|");
  if (at == absl::string_view::npos) return false;
  std::vector<std::string> f = absl::StrSplit(line.substr(at), '|');
  if (f.size() != 8) return false;
  r->backend = f[1];
  r->op = f[2];
  int counted = 1;
  return absl::SimpleAtoi(f[3], &r->ranks) && absl::SimpleAtoi(f[4], &r->mib) &&
         absl::SimpleAtod(f[5], &r->ours_ms) && absl::SimpleAtod(f[6], &r->raw_ms) &&
         absl::SimpleAtoi(f[7], &counted) && ((r->counted = counted != 0), true);
}

// Runs this program as `ranks` workers of `backend` and collects rank 0's rows.
absl::StatusOr<std::vector<Row>> Launch(const std::string& self, const std::string& backend, int ranks,
                                        const std::string& sizes, bool quick) {
  const std::string dir = self.substr(0, self.rfind('/'));
  std::string cmd;
  if (backend == "gloo" || backend == "shm") {
    cmd = absl::StrCat("DT_BACKEND=", backend, " '", dir, "/dtrun' --nproc-per-node ", ranks, " '", self, "'");
  } else {
    cmd = absl::StrCat("DT_BACKEND=mpi mpirun --allow-run-as-root --oversubscribe -np ", ranks, " '",
                       self, "'");
  }
  absl::StrAppend(&cmd, " --worker --sizes ", sizes, quick ? " --quick" : "", " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return absl::UnavailableError(absl::StrCat("cannot run: ", cmd));
  std::vector<Row> rows;
  std::string log;
  char line[4096];
  while (fgets(line, sizeof(line), p)) {
    Row r;
    if (Decode(line, &r)) {
      rows.push_back(r);
    } else {
      log += line;
    }
  }
  const int rc = pclose(p);
  if (rc != 0 || rows.empty()) {
    return absl::UnavailableError(absl::StrCat(backend, " x", ranks, " failed (", cmd, "):\n", log));
  }
  return rows;
}

std::vector<int64_t> Ints(const std::string& s) {
  std::vector<int64_t> v;
  for (absl::string_view p : absl::StrSplit(s, ',')) {
    int64_t x = 0;
    if (absl::SimpleAtoi(p, &x)) v.push_back(x);
  }
  return v;
}

int Main(int argc, char** argv) {
  // Keep freed large buffers in the heap (a caching allocator), see the header comment.
  mallopt(M_MMAP_MAX, 0);               // large blocks come from the heap, not fresh mmaps,
  mallopt(M_TRIM_THRESHOLD, 1 << 30);   // and freed ones stay there for the next call
  const bool quick = bench::ParseBenchFlags(argc, argv, "usage: bench_redistribute [flags]\n"
                                                       "Redistribute vs the raw collectives it plans");
  const bool worker = absl::GetFlag(FLAGS_worker);
  const std::string backends = absl::GetFlag(FLAGS_backends), ranks_text = absl::GetFlag(FLAGS_ranks),
                    sizes_text = absl::GetFlag(FLAGS_sizes);
  const std::vector<int64_t> sizes = Ints(sizes_text);
  if (worker) {
    auto world = World::FromEnv();
    if (!world.ok()) {
      std::fprintf(stderr, "worker: %s\n", world.status().ToString().c_str());
      return 1;
    }
    auto rows = MeasureAll(*world, sizes, quick);
    if (!rows.ok()) {
      std::fprintf(stderr, "worker rank %d: %s\n", (*world)->rank(), rows.status().ToString().c_str());
      return 1;
    }
    if ((*world)->rank() == 0) {
      for (const Row& r : *rows) std::printf("%s\n", Encode(r).c_str());
    }
    return 0;
  }

  std::printf("bench_redistribute%s (%ld CPUs", quick ? " --quick" : "", sysconf(_SC_NPROCESSORS_ONLN));
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {  // other tenants' load makes timings noisy
    double load = 0;
    if (std::fscanf(f, "%lf", &load) == 1) std::printf(", load average %.1f at start", load);
    std::fclose(f);
  }
  std::printf(")\n\n");
  auto overhead = MeasureOverhead("S(0)", "S(0)", quick);
  auto local_step = MeasureOverhead("R", "S(0)", quick);
  if (!overhead.ok() || !local_step.ok()) {
    std::fprintf(stderr, "overhead: %s %s\n", overhead.status().ToString().c_str(),
                 local_step.status().ToString().c_str());
    return 1;
  }
  std::printf("overhead per Redistribute call (cached plan + dispatch, no communication, 1 thread)\n");
  std::printf("  S(0) -> S(0) (empty plan)        %7.3f us\n", *overhead);
  std::printf("  R -> S(0) (one local step, view) %7.3f us\n", *local_step);
  std::printf("  PyTorch DTensor dispatch: 24-90 us per op (reference §4-5)\n\n");
  std::fflush(stdout);

  const absl::StatusOr<std::string> self = bench::SelfPath();
  if (!self.ok()) {
    std::fprintf(stderr, "bench_redistribute: %s\n", self.status().ToString().c_str());
    return 1;
  }
  std::vector<Row> rows;
  std::vector<std::string> skipped;
  for (absl::string_view b : absl::StrSplit(backends, ',')) {
    const std::string backend(b);
    for (int64_t k : Ints(ranks_text)) {
      if (backend == "threads") {
        std::vector<Row> got;
        absl::Status s = World::RunThreads(static_cast<int>(k), [&](World& w) -> absl::Status {
          DT_ASSIGN_OR_RETURN(std::vector<Row> r, MeasureAll(w.shared_from_this(), sizes, quick));
          if (w.rank() == 0) got = r;
          return absl::OkStatus();
        });
        if (!s.ok()) {
          skipped.push_back(absl::StrCat("threads x", k, ": ", s.ToString()));
          continue;
        }
        rows.insert(rows.end(), got.begin(), got.end());
      } else {
        auto got = Launch(*self, backend, static_cast<int>(k), sizes_text, quick);
        if (!got.ok()) {
          skipped.push_back(std::string(got.status().message()));
          continue;
        }
        rows.insert(rows.end(), got->begin(), got->end());
      }
    }
  }

  std::printf("%-8s %5s %-20s %5s %11s %11s %7s %12s\n", "backend", "ranks", "redistribute", "MiB",
              "ours ms", "raw ms", "raw/ours", "ours GB/s");
  // Per kind: the geometric mean of raw/ours over backends, rank counts and sizes (each already the
  // best of its repetitions), and the lowest configuration for reference.
  struct Summary {
    double log_sum = 0;
    int n = 0;
    double lowest = 1e9;
    std::string where;
  };
  std::map<std::string, Summary> by_op;
  for (const Row& r : rows) {
    const double ratio = r.raw_ms / r.ours_ms;
    const double gbps = static_cast<double>(r.mib) * (1 << 20) / (r.ours_ms * 1e-3) / 1e9;
    std::printf("%-8s %5d %-20s %5lld %11.2f %11.2f %7.2f %12.2f%s\n", r.backend.c_str(), r.ranks,
                r.op.c_str(), static_cast<long long>(r.mib), r.ours_ms, r.raw_ms, ratio, gbps,
                r.counted ? "" : "  (not in RESULT)");
    if (!r.counted) continue;
    Summary& s = by_op[r.op];
    s.log_sum += std::log(ratio);
    ++s.n;
    if (ratio < s.lowest) {
      s.lowest = ratio;
      s.where = absl::StrCat(r.backend, " x", r.ranks, " ", r.mib, " MiB");
    }
  }
  std::printf("(GB/s: global tensor bytes / time; raw: the same collective on preallocated buffers;\n"
              " S(0)->S(1) sends strided blocks, its raw all_to_all contiguous ones)\n");
  for (const std::string& s : skipped) std::printf("skipped: %s\n", s.c_str());
  const std::pair<const char*, const char*> metrics[] = {
      {"S(0)->R", "s0_to_r"}, {"P->R", "p_to_r"}, {"P->S(0)", "p_to_s0"}, {"S(0)->S(1)", "s0_to_s1"}};
  std::printf("\n%-12s %16s %10s  %s\n", "raw/ours", "geometric mean", "lowest", "at");
  for (const auto& [op, name] : metrics) {
    auto it = by_op.find(op);
    if (it == by_op.end()) continue;
    std::printf("%-12s %16.2f %10.2f  %s\n", op, std::exp(it->second.log_sum / it->second.n),
                it->second.lowest, it->second.where.c_str());
  }
  std::printf("\n");
  const double over = std::max(*overhead, *local_step);
  std::printf("RESULT redistribute_overhead_us %.3f 2 %s\n", over, Verdict(over < 2.0));
  for (const auto& [op, name] : metrics) {
    auto it = by_op.find(op);
    const double ratio = it == by_op.end() ? 0.0 : std::exp(it->second.log_sum / it->second.n);
    std::printf("RESULT redistribute_bandwidth_vs_raw_%s %.2f 0.9 %s\n", name, ratio,
                Verdict(it != by_op.end() && skipped.empty() && ratio >= 0.9));
  }
  return 0;
}

}  // namespace
}  // namespace dt

int main(int argc, char** argv) { return dt::Main(argc, argv); }
