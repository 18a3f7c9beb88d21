// bench_flux2: one denoising step (transformer forward + Euler step) of a Flux2-shaped model with
// random weights — D = 512 (4 heads x 128), M = 1536, 4 double and 8 single blocks, 256 image +
// 64 text tokens, f32, guidance on — on 1 rank and at tp = 2, as threads of this process and as
// processes under dtrun (the backend dtrun picks; this program re-launched, dtrun must sit next to
// it). tools/reference/flux2_step_bench.py runs diffusers' step on the same model and threads and
// compares it with this program's tp=1 row.
//
//   bench_flux2 [--quick] [--no-processes]      (--help lists every flag)
//
// Per row: the median step time, the weight bytes this rank holds, and the collectives of one
// step. The expected bytes per rank come from the config alone (Flux2Config::NumParameters and
// the plan's sharded part: 8D² + 6MD per double block, 4D² + 3MD per single block), not from the
// model, so the RESULT line checks that load-time placement gives each rank 1/tp of the sharded
// part plus the replicated part.
//
// RESULT lines: per-rank weight bytes at tp=2 within 2% of that figure; tp=2 step time on threads
// no worse than 1.1x tp=1 (on this 2-core machine one rank's GEMMs already use both cores, so
// the target bounds what tensor parallelism costs rather than promising a speedup).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "dtensor/bench/bench_util.h"
#include "dtensor/core/status.h"
#include "dtensor/mesh/comm_counter.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/init.h"
#include "dtensor/nn/models/flow_match.h"
#include "dtensor/nn/models/flux2.h"

namespace {

using dt::DeviceMesh;
using dt::Tensor;
using dt::World;
using dt::bench::Median;
using dt::nn::Flux2Transformer2DModel;

constexpr int64_t kImageTokens = 256, kTextTokens = 64;

dt::loaders::Flux2Config BenchConfig() {
  dt::loaders::Flux2Config c;
  c.in_channels = c.out_channels = 64;
  c.num_layers = 4;
  c.num_single_layers = 8;
  c.attention_head_dim = 128;
  c.num_attention_heads = 4;
  c.joint_attention_dim = 512;
  c.timestep_guidance_channels = 256;
  c.mlp_ratio = 3.0;
  c.axes_dims_rope = {32, 32, 32, 32};
  c.guidance_embeds = true;
  return c;
}

// Bytes (f32) a rank should hold at `tp`, from the config alone.
double ExpectedBytesPerRank(const dt::loaders::Flux2Config& c, int tp) {
  const double d = double(c.inner_dim()), m = double(c.mlp_hidden_dim());
  const double sharded =
      c.num_layers * (8 * d * d + 6 * m * d) + c.num_single_layers * (4 * d * d + 3 * m * d);
  const double total = double(c.NumParameters());
  return 4.0 * ((total - sharded) + sharded / tp);
}

struct Row {
  double step_ms = 0;       // median
  double weight_bytes = 0;  // this rank's parameters
  std::string collectives;  // of one step
};

absl::StatusOr<Row> MeasureOn(World& w, int reps) {
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, dt::InitDeviceMesh(w.shared_from_this(), {w.size()}, {"tp"}));
  const dt::loaders::Flux2Config c = BenchConfig();
  Flux2Transformer2DModel model(c, dt::DType::kF32);
  DT_RETURN_IF_ERROR(model.Parallelize(mesh, Flux2Transformer2DModel::TPPlan(c)));
  DT_RETURN_IF_ERROR(dt::nn::InitRandom(model, 7));
  Row row;
  for (const auto& [name, p] : model.NamedParameters()) {
    row.weight_bytes += double(p->value().ToLocal().nbytes());
  }
  dt::nn::FlowMatchEulerScheduler scheduler(dt::loaders::FlowMatchSchedulerConfig::Flux2());
  DT_RETURN_IF_ERROR(scheduler.SetTimesteps(4, dt::nn::Flux2EmpiricalMu(kImageTokens, 4)));
  dt::nn::Flux2Inputs in;
  DT_ASSIGN_OR_RETURN(in.hidden_states, Tensor::Randn({1, kImageTokens, c.in_channels}, 1));
  DT_ASSIGN_OR_RETURN(in.encoder_hidden_states,
                      Tensor::Randn({1, kTextTokens, c.joint_attention_dim}, 2));
  DT_ASSIGN_OR_RETURN(in.img_ids, dt::nn::Flux2LatentIds(16, 16));
  DT_ASSIGN_OR_RETURN(in.txt_ids, dt::nn::Flux2TextIds(kTextTokens));
  DT_ASSIGN_OR_RETURN(in.guidance, Tensor::FromVector<float>({1}, {4.0f}));
  DT_ASSIGN_OR_RETURN(in.timestep,
                      Tensor::FromVector<float>({1}, {scheduler.timesteps()[0] / 1000.0f}));
  std::vector<double> ms;
  for (int r = 0; r <= reps; ++r) {  // the first is a warm-up (strategy caches)
    dt::CommCounter counter;
    const auto t0 = std::chrono::steady_clock::now();
    DT_ASSIGN_OR_RETURN(Tensor v, model.Run(in));
    DT_ASSIGN_OR_RETURN(Tensor x, scheduler.Step(v, 0, in.hidden_states));
    const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!std::isfinite(x.ToVector<float>()[0])) return absl::InternalError("non-finite latents");
    if (r > 0) ms.push_back(t);
    row.collectives = counter.counts().ToString();
  }
  row.step_ms = Median(ms);
  return row;
}

absl::StatusOr<Row> MeasureThreads(int tp, int reps) {
  Row row;
  DT_RETURN_IF_ERROR(World::RunThreads(tp, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(Row mine, MeasureOn(w, reps));
    if (w.rank() == 0) row = mine;
    return absl::OkStatus();
  }));
  return row;
}

// This program as `tp` processes under dtrun; rank 0 prints "FLUX2_ROW <ms> <bytes> <collectives>".
absl::StatusOr<Row> MeasureProcesses(int tp, int reps, std::string* backend) {
  DT_ASSIGN_OR_RETURN(const std::string me, dt::bench::SelfPath());
  const std::string dir = me.substr(0, me.rfind('/'));
  const std::string cmd = absl::StrCat("'", dir, "/dtrun' --nproc-per-node ", tp, " '", me,
                                       "' --worker ", reps, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return absl::UnavailableError(absl::StrCat("cannot run: ", cmd));
  std::string log;
  std::optional<Row> row;
  char line[4096];
  while (fgets(line, sizeof(line), p)) {
    double ms = 0, bytes = 0;
    char counts[512] = {0}, be[64] = {0};
    const char* at = std::strstr(line, "FLUX2_ROW ");
    if (at != nullptr && std::sscanf(at, "FLUX2_ROW %lf %lf %63s %511[^\n]", &ms, &bytes, be, counts) == 4) {
      row = Row{ms, bytes, counts};
      *backend = be;
    } else {
      log += line;
    }
  }
  if (pclose(p) != 0 || !row) {
    return absl::UnavailableError(absl::StrCat(tp, " processes failed (", cmd, "):\n", log));
  }
  return *row;
}

int Worker(int reps) {
  absl::StatusOr<std::shared_ptr<World>> world = World::FromEnv();
  if (!world.ok()) {
    std::fprintf(stderr, "worker: %s\n", world.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<Row> row = MeasureOn(**world, reps);
  if (!row.ok()) {
    std::fprintf(stderr, "worker: %s\n", row.status().ToString().c_str());
    return 1;
  }
  if ((*world)->rank() == 0) {
    std::printf("FLUX2_ROW %.3f %.0f %s %s\n", row->step_ms, row->weight_bytes,
                std::string((*world)->backend()).c_str(), row->collectives.c_str());
  }
  return 0;
}

void Print(const char* name, const Row& r, const Row& base, double expected) {
  std::printf("%-28s %10.1f %8.2fx %12.2f %12.2f  %s\n", name, r.step_ms, base.step_ms / r.step_ms,
              r.weight_bytes / 1e6, expected / 1e6, r.collectives.c_str());
}

}  // namespace

ABSL_FLAG(bool, processes, true, "the rows of processes under dtrun (--no-processes skips them)");
ABSL_FLAG(int, worker, 0,
          "run as one rank with this many repetitions (what the driver launches under dtrun)");

int main(int argc, char** argv) {
  const bool quick =
      dt::bench::ParseBenchFlags(argc, argv, "usage: bench_flux2 [--quick] [--no-processes]");
  if (absl::GetFlag(FLAGS_worker) > 0) return Worker(absl::GetFlag(FLAGS_worker));
  const bool processes = absl::GetFlag(FLAGS_processes);
  const int reps = quick ? 3 : 9;
  const dt::loaders::Flux2Config c = BenchConfig();
  std::printf("bench_flux2: one denoising step, %s, %.1fM parameters, %lld image + %lld text "
              "tokens, f32, %d reps (median)\n",
              c.Summary().c_str(), c.NumParameters() / 1e6, static_cast<long long>(kImageTokens),
              static_cast<long long>(kTextTokens), reps);
  std::printf("%-28s %10s %9s %12s %12s  %s\n", "row", "step ms", "vs 1", "MB / rank", "expected",
              "collectives per step");
  absl::StatusOr<Row> one = MeasureThreads(1, reps);
  absl::StatusOr<Row> two = MeasureThreads(2, reps);
  if (!one.ok() || !two.ok()) {
    std::fprintf(stderr, "bench_flux2: %s\n",
                 (!one.ok() ? one.status() : two.status()).ToString().c_str());
    return 1;
  }
  Print("tp=1", *one, *one, ExpectedBytesPerRank(c, 1));
  Print("tp=2 threads", *two, *one, ExpectedBytesPerRank(c, 2));
  if (processes) {
    std::string backend;
    absl::StatusOr<Row> p2 = MeasureProcesses(2, reps, &backend);
    if (p2.ok()) {
      Print(absl::StrCat("tp=2 processes (", backend, ")").c_str(), *p2, *one,
            ExpectedBytesPerRank(c, 2));
    } else {
      std::printf("tp=2 processes: skipped (%s)\n", std::string(p2.status().message()).c_str());
    }
  }
  const double want = ExpectedBytesPerRank(c, 2);
  const double bytes_ratio = two->weight_bytes / want;
  const double step_ratio = two->step_ms / one->step_ms;
  std::printf("RESULT flux2_tp2_weight_bytes_vs_expected %.4f 1.00+-0.02 %s\n", bytes_ratio,
              dt::bench::Verdict(std::abs(bytes_ratio - 1.0) <= 0.02));
  std::printf("RESULT flux2_tp2_threads_step_vs_tp1 %.2f 1.1 %s\n", step_ratio,
              dt::bench::Verdict(step_ratio <= 1.1));
  return 0;
}
