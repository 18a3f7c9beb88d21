// bench_serve_engine: the serving engine's aggregate decode rate (nn/models/engine.h: continuous
// batching over paged KV caches) with 1, 4 and 16 sequences decoding together, against one
// sequence's CausalLM::Generate on the same threads in the same process, on SmolLM2-135M-Instruct
// Q4_1 (its quantized weights kept, as `dtensor serve` and generate run it), one rank.
//
// Each round runs, one after the other: Generate of one prompt (its decode tokens/s, the prefill
// excluded), then the engine with N sequences of distinct prompts submitted at once, all
// prefilled in the first step, each decoding --decode tokens after it: the aggregate rate is the
// N · decode tokens of the steps after the first over their time. Rounds alternate the rows so
// that a load that comes and goes on a shared machine touches them alike; medians over --reps.
//
// Targets (issue 48): 16 sequences >= 3x Generate's rate (the GEMMs of a step read each weight
// once for all 16 rows); 1 sequence within 5 % of Generate (>= 0.95x: the engine's own costs,
// the plan, the paged attention, the per-step bookkeeping, are that small).

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <tbb/task_arena.h>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "dtensor/bench/bench_util.h"
#include "dtensor/core/status.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/models/causal_lm.h"
#include "dtensor/nn/models/engine.h"
#include "dtensor/ops/local/cpu/qgemm.h"

ABSL_FLAG(std::string, smollm2, "",
          "the GGUF (default: <build>/models/SmolLM2-135M-Instruct.Q4_1.gguf; skipped when absent)");
ABSL_FLAG(int64_t, prompt, 32, "prompt tokens of each sequence");
ABSL_FLAG(int64_t, decode, 64, "decode tokens of each sequence (--quick: at most 24)");
ABSL_FLAG(int64_t, packed_weights_mb, 1024,
          "MiB of quantized weights' panels kept, as dtensor serve's flag (0: packed per call)");
ABSL_FLAG(int, reps, 5, "rounds; medians are reported (--quick: at most 2)");

namespace dt {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// A prompt of n ids of SmolLM2's vocabulary, distinct per `seed`.
std::vector<int64_t> Prompt(int64_t n, int64_t seed) {
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = 100 + (i * 37 + seed * 101) % 4000;
  return p;
}

// The engine with `n` sequences: the aggregate tokens/s of the steps after the first (which
// prefills every prompt), or an error.
absl::StatusOr<double> EngineRate(nn::CausalLM& model, int64_t n, int64_t prompt, int64_t decode) {
  nn::EngineOptions o;
  o.max_running = std::max<int64_t>(n, 1);
  o.step_tokens = std::max<int64_t>(256, n * prompt);
  o.kv_pages = n * ((prompt + decode + o.page_tokens) / o.page_tokens);
  DT_ASSIGN_OR_RETURN(std::unique_ptr<nn::Engine> engine, nn::MakeBatchingEngine(model, o));
  for (int64_t i = 0; i < n; ++i) {
    nn::EngineRequest r;
    r.prompt = Prompt(prompt, i);
    r.max_new_tokens = decode + 1;
    DT_RETURN_IF_ERROR(engine->Submit(std::move(r)).status());
  }
  DT_ASSIGN_OR_RETURN(std::vector<nn::EngineEvent> first, engine->Step());
  if (static_cast<int64_t>(first.size()) != n) {
    return absl::InternalError(absl::StrCat("the first step gave ", first.size(), " tokens, not ", n));
  }
  int64_t tokens = 0, finished = 0;
  const Clock::time_point t0 = Clock::now();
  while (finished < n) {
    DT_ASSIGN_OR_RETURN(std::vector<nn::EngineEvent> events, engine->Step());
    for (const nn::EngineEvent& e : events) {
      if (e.finish == nn::FinishReason::kError) return absl::InternalError(e.error);
      tokens += e.token >= 0 ? 1 : 0;
      finished += e.finish != nn::FinishReason::kNone ? 1 : 0;
    }
  }
  const double seconds = Seconds(t0);
  engine->Stop();
  (void)engine->Step();
  return tokens / seconds;
}

int Run(bool quick) {
  std::string path = absl::GetFlag(FLAGS_smollm2);
  if (path.empty()) {
    absl::StatusOr<std::string> me = bench::SelfPath();
    if (me.ok()) path = me->substr(0, me->rfind("/bin/")) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  if (::access(path.c_str(), R_OK) != 0) {
    std::printf("bench_serve_engine: %s not cached (scripts/fetch-smollm2): skipped\n", path.c_str());
    return 0;
  }
  const int64_t prompt = absl::GetFlag(FLAGS_prompt);
  const int64_t packed_mb = std::max<int64_t>(0, absl::GetFlag(FLAGS_packed_weights_mb));
  dt::ops::cpu::qgemm::SetPackedBudget(packed_mb << 20);
  const int64_t decode = quick ? std::min<int64_t>(24, absl::GetFlag(FLAGS_decode))
                               : absl::GetFlag(FLAGS_decode);
  const int reps = quick ? std::min(2, absl::GetFlag(FLAGS_reps)) : absl::GetFlag(FLAGS_reps);
  const std::vector<int64_t> counts = {1, 4, 16};
  std::vector<double> alone;
  std::vector<std::vector<double>> engine(counts.size());
  absl::Status s = World::RunThreads(1, [&](World& w) -> absl::Status {
    nn::CausalLMLoadOptions lo;
    lo.keep_quantized = true;
    DT_ASSIGN_OR_RETURN(std::unique_ptr<nn::CausalLM> model,
                        nn::CausalLM::FromPretrained(path, w.shared_from_this(),
                                                     nn::DistributedConfig(), lo));
    nn::GenerateOptions go;
    go.max_new_tokens = 4;
    DT_RETURN_IF_ERROR(model->Generate(Prompt(prompt, 0), go).status());  // warm-up
    DT_RETURN_IF_ERROR(EngineRate(*model, 16, prompt, 4).status());
    std::printf("bench_serve_engine: SmolLM2-135M-Instruct Q4_1 (quantized weights kept), one rank, "
                "%d threads; prompt %lld tokens, %lld decode tokens per sequence, %d rounds\n",
                tbb::this_task_arena::max_concurrency(), static_cast<long long>(prompt),
                static_cast<long long>(decode), reps);
    for (int r = 0; r < reps; ++r) {
      DT_ASSIGN_OR_RETURN(bench::GenerateFigures g,
                          bench::TimeGenerate(*model, Prompt(prompt, 0), go, decode, 1));
      alone.push_back(g.decode);
      for (size_t i = 0; i < counts.size(); ++i) {
        DT_ASSIGN_OR_RETURN(const double rate, EngineRate(*model, counts[i], prompt, decode));
        engine[i].push_back(rate);
      }
    }
    return absl::OkStatus();
  });
  if (!s.ok()) {
    std::fprintf(stderr, "bench_serve_engine: %s\n", s.ToString().c_str());
    return 1;
  }
  const double base = bench::Median(alone);
  std::printf("%-26s %16s %12s\n", "row", "decode tok/s", "vs Generate");
  std::printf("%-26s %16.1f %12s\n", "Generate, 1 sequence", base, "1.00");
  std::vector<double> ratio(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    const double rate = bench::Median(engine[i]);
    ratio[i] = rate / base;
    std::printf("%-26s %16.1f %12.2f\n", absl::StrCat("engine, ", counts[i], counts[i] == 1 ? " sequence" : " sequences").c_str(),
                rate, ratio[i]);
  }
  std::printf("RESULT serve_engine_decode_1_vs_generate %.2f 0.95 %s\n", ratio[0],
              bench::Verdict(ratio[0] >= 0.95));
  std::printf("RESULT serve_engine_decode_16_vs_generate %.2f 3.0 %s\n", ratio[2],
              bench::Verdict(ratio[2] >= 3.0));
  return 0;
}

}  // namespace
}  // namespace dt

int main(int argc, char** argv) {
  const bool quick = dt::bench::ParseBenchFlags(
      argc, argv, "usage: bench_serve_engine [--quick] [--smollm2 PATH] [--prompt N] [--decode N] [--reps N]");
  return dt::Run(quick);
}
