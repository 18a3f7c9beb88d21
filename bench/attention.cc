// bench_attention: the CPU attention kernel (Note [Flash attention on the CPU] in
// ops/local/cpu/attention.cc) on Llama shapes, against its own other path in the same run.
//
//   rows     shapes                                  ours                  baseline
//   prefill  causal, batch 1, Sq = Skv = 512, 2048;  ScaledDotProductAttn  the score-row path
//            heads / KV heads / head dim 8/4/64      as the model calls    (flash_min_rows past
//            (bench_llama's model), 32/8/64,         it: the flash path    the call's rows)
//            32/8/128; f32, bf16
//   decode   1 query against 512, 2048 cached keys;  the same: the path    the other path
//            the same heads and dtypes               AttentionTuning picks forced
//   sweep    (--rows=...,sweep) the prefill shapes over q_block x kv_block (AttentionTuning): the
//            figures behind the defaults
//   options  (--rows=...,options) the attention options (Note [Attention options]) on 32/8/128:
//            prefill of the longest length and decode against it, each option against the plain
//            call in the same run: softcap 50, window 512, sinks, and softcap + window (Gemma 2)
//
// Every side runs on T oneTBB threads (--threads, default: all cores). q, k, v are contiguous
// [B, H, S, D], standard normal, scale 1/sqrt(D). GFLOP/s counts the products a causal pass needs
// (4 Sq Skv' D per query head, Skv' the keys a query sees on average), the same for both sides.
// Timing: each function is called once to warm up, then the functions take turns in ABBA order
// until each ran min_reps times and min_seconds passed; medians are reported.
// tools/reference/sdpa_bench.py runs this program and PyTorch's scaled_dot_product_attention on the
// same shapes, dtypes and threads, interleaved, and compares them.
//
// --cpu-time times each call by the calling thread's CPU time: with --threads=1 the calling thread
// does all the work, so that variants compare on a machine that other processes load (the wall
// clock there measures the scheduler as much as the kernel).
//
// Usage: bench_attention [--quick] [--threads T] [--rows=prefill,decode,sweep,options] [--cpu-time]
// Ends with one line per target: RESULT <metric> <value> <target> PASS|FAIL.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <tbb/task_arena.h>

#include "absl/flags/flag.h"
#include "dtensor/bench/bench_util.h"
#include "dtensor/core/tensor.h"
#include "dtensor/ops/local/cpu/attention.h"
#include "dtensor/ops/local/cpu/attention_kernels.h"
#include "dtensor/ops/local/cpu/cpu_info.h"
#include "dtensor/ops/local/ops.h"

ABSL_FLAG(int, threads, 0, "oneTBB threads (0: all cores)");
ABSL_FLAG(std::vector<std::string>, rows, std::vector<std::string>({"prefill", "decode"}),
          "sections to run, comma-separated: prefill, decode, sweep (the prefill shapes over "
          "q_block x kv_block), options (each attention option against the plain call)");
ABSL_FLAG(
    bool, cpu_time, false,
    "time calls by the calling thread's CPU time instead of the wall clock (with --threads=1, "
    "where the calling thread does all the work: comparisons that hold on a loaded machine)");

namespace {

using dt::DType;
using dt::Tensor;
namespace cpu = dt::ops::cpu;

struct Reps {
  int min_reps;
  double min_seconds;
};

// Seconds on the steady clock, or (cpu_time) of this thread's CPU time.
double Now(bool cpu_time) {
  if (cpu_time) {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median seconds per call of each function, after one warm-up call each, the functions taking
// turns in ABBA order so that each sees the same machine load.
std::vector<double> Time(const Reps& reps, const std::vector<std::function<void()>>& fns) {
  const bool cpu_time = absl::GetFlag(FLAGS_cpu_time);
  for (const auto& f : fns) f();
  const size_t n = fns.size();
  std::vector<std::vector<double>> t(n);
  double total = 0;
  for (int round = 0; static_cast<int>(t[0].size()) < reps.min_reps || total < reps.min_seconds;
       ++round) {
    for (size_t o = 0; o < n; ++o) {
      const size_t i = round % 2 == 0 ? o : n - 1 - o;
      const double start = Now(cpu_time);
      fns[i]();
      const double s = Now(cpu_time) - start;
      t[i].push_back(s);
      total += s / n;
    }
  }
  std::vector<double> medians;
  for (auto& v : t) medians.push_back(dt::bench::Median(std::move(v)));
  return medians;
}

struct Heads {
  int64_t hq, hkv, d;
};

struct Inputs {
  Tensor q, k, v;
  dt::ops::AttentionOptions options;
  dt::ops::AttentionParams params;
};

Inputs Make(DType dtype, const Heads& h, int64_t sq, int64_t skv) {
  Inputs in;
  in.q = Tensor::Randn({1, h.hq, sq, h.d}, 1, dtype).value();
  in.k = Tensor::Randn({1, h.hkv, skv, h.d}, 2, dtype).value();
  in.v = Tensor::Randn({1, h.hkv, skv, h.d}, 3, dtype).value();
  in.options.causal = true;
  in.params.causal = true;
  in.params.scale = static_cast<float>(1 / std::sqrt(static_cast<double>(h.d)));
  in.params.kv_length = skv;
  in.params.q_offset = skv - sq;
  return in;
}

// The op as a model calls it.
void Ours(const Inputs& in) {
  const absl::StatusOr<Tensor> out =
      dt::ops::ScaledDotProductAttention(in.q, in.k, in.v, in.options);
  if (!out.ok()) {
    std::fprintf(stderr, "bench_attention: %s\n", out.status().ToString().c_str());
    std::exit(1);
  }
}

// The kernel with `tuning`, allocating its output as the op does.
void Tuned(const Inputs& in, const cpu::AttentionTuning& tuning) {
  const Tensor out =
      Tensor::Empty({in.q.size(0), in.q.size(1), in.q.size(2), in.v.size(3)}, in.q.dtype()).value();
  const absl::Status st = cpu::AttentionTuned(in.q, in.k, in.v, in.params, tuning, out);
  if (!st.ok()) {
    std::fprintf(stderr, "bench_attention: %s\n", st.ToString().c_str());
    std::exit(1);
  }
}

// Products of one causal pass: 2 (q kᵀ) + 2 (p v) multiply-adds per visible (query, key, dim).
double Gflop(const Heads& h, int64_t sq, int64_t skv) {
  double visible = 0;  // keys seen by each query, summed (bottom-right aligned)
  for (int64_t i = 0; i < sq; ++i) visible += static_cast<double>(skv - sq + i + 1);
  return 4.0 * h.hq * visible * h.d / 1e9;
}

std::string ShapeName(const Heads& h) {
  return std::to_string(h.hq) + "/" + std::to_string(h.hkv) + "/" + std::to_string(h.d);
}

struct Result {
  std::string metric;
  double value, target;
};

struct Setup {
  bool quick;
  Reps reps;
  cpu::AttentionTuning defaults;
  std::vector<Heads> heads;
  std::vector<int64_t> lengths;
};

std::string Tokens(int64_t sq, int64_t skv) {
  return std::to_string(sq) + "x" + std::to_string(skv);
}

// Prefill: the op as the model calls it (the flash path) against the score-row path.
void PrefillRows(const Setup& setup, std::vector<Result>& results) {
  std::printf(
      "\nprefill (causal, batch 1; ms = median per call; GFLOP/s = 4 x visible (query, key) "
      "pairs x D x Hq / time)\n");
  std::printf("%-7s %-5s %-9s %-10s %9s %9s %12s %9s\n", "rows", "dtype", "heads", "SqxSkv", "ms",
              "GFLOP/s", "score-rows", "ratio");
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const int64_t s : setup.lengths) {
      double worst = 1e9;
      for (const Heads& h : setup.heads) {
        const Inputs in = Make(dtype, h, s, s);
        cpu::AttentionTuning old = setup.defaults;
        old.flash_min_rows = old.flash_min_rows_bf16 = INT64_MAX;
        // The score-row path at 2048 tokens takes seconds a call: fewer repetitions there.
        const std::vector<double> t =
            Time(s > 512 ? Reps{2, 0.0} : setup.reps, {[&] { Ours(in); }, [&] { Tuned(in, old); }});
        const double ratio = t[1] / t[0];
        worst = std::min(worst, ratio);
        // Parsed by tools/reference/sdpa_bench.py: rows, dtype, heads, Sq x Skv, ms.
        std::printf("%-7s %-5s %-9s %-10s %9.3f %9.1f %12.3f %9.2f\n", "prefill",
                    dt::DTypeName(dtype).data(), ShapeName(h).c_str(), Tokens(s, s).c_str(),
                    t[0] * 1e3, Gflop(h, s, s) / t[0], t[1] * 1e3, ratio);
        std::fflush(stdout);
      }
      results.push_back({std::string("attention_prefill_") + dt::DTypeName(dtype).data() + "_" +
                             std::to_string(s) + "_vs_score_rows",
                         worst, 1.0});
    }
  }
}

// Decode: the path the defaults pick against the other one.
void DecodeRows(const Setup& setup, std::vector<Result>& results) {
  std::printf(
      "\ndecode (1 query, causal, against Skv cached keys; ms = median per call; path = the one "
      "the defaults pick; other = the other path forced)\n");
  std::printf("%-7s %-5s %-9s %-10s %9s %9s %-6s %12s %9s\n", "rows", "dtype", "heads", "SqxSkv",
              "ms", "GB/s", "path", "other", "ratio");
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const int64_t s : setup.lengths) {
      double worst = 1e9;
      for (const Heads& h : setup.heads) {
        const Inputs in = Make(dtype, h, 1, s);
        const int64_t min_rows = dtype == DType::kBF16 ? setup.defaults.flash_min_rows_bf16
                                                       : setup.defaults.flash_min_rows;
        const bool flash = h.hq / h.hkv >= min_rows;
        cpu::AttentionTuning other = setup.defaults;
        other.flash_min_rows = other.flash_min_rows_bf16 = flash ? INT64_MAX : 0;
        const std::vector<double> t = Time(setup.quick ? Reps{20, 0.1} : Reps{50, 0.5},
                                           {[&] { Ours(in); }, [&] { Tuned(in, other); }});
        const double ratio = t[1] / t[0];
        worst = std::min(worst, ratio);
        const double bytes = 2.0 * h.hkv * s * h.d * static_cast<double>(dt::DTypeSize(dtype));
        std::printf("%-7s %-5s %-9s %-10s %9.4f %9.1f %-6s %12.4f %9.2f\n", "decode",
                    dt::DTypeName(dtype).data(), ShapeName(h).c_str(), Tokens(1, s).c_str(),
                    t[0] * 1e3, bytes / t[0] / 1e9, flash ? "flash" : "score", t[1] * 1e3, ratio);
        std::fflush(stdout);
      }
      // The path the defaults pick for decode against the other: at least level with it.
      results.push_back({std::string("attention_decode_") + dt::DTypeName(dtype).data() + "_" +
                             std::to_string(s) + "_vs_other_path",
                         worst, 0.95});
    }
  }
}

// Each option against the plain call (Note [Attention options]): what it costs, or saves (a window
// shorter than the keys skips blocks).
void OptionRows(const Setup& setup, std::vector<Result>& results) {
  std::printf(
      "\noptions (32/8/128, causal; ms = median per call; ratio = plain / with the option)\n");
  std::printf("%-7s %-5s %-10s %-16s %9s %9s %9s\n", "rows", "dtype", "SqxSkv", "option", "ms",
              "plain", "ratio");
  const Heads h{32, 8, 128};
  const int64_t s = setup.lengths.back();
  const Tensor sinks = Tensor::Randn({h.hq}, 4).value();
  // target: the least ratio a RESULT line asks (0: none; a window computes less). softcap costs
  // a tanh per score: within 15 % of the plain call; sinks within 10 %. Each call takes the path
  // the plain one takes.
  struct Option {
    const char* name;
    std::function<void(dt::ops::AttentionOptions&)> set;
    double target;
  };
  const std::vector<Option> options = {
      {"softcap", [](dt::ops::AttentionOptions& o) { o.softcap = 50.0; }, 0.85},
      {"window", [](dt::ops::AttentionOptions& o) { o.window = 512; }, 0},
      {"sinks", [&](dt::ops::AttentionOptions& o) { o.sinks = sinks; }, 0.9},
      {"softcap+window", [](dt::ops::AttentionOptions& o) { o.softcap = 50.0, o.window = 512; },
       0}};
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const int64_t sq : {s, int64_t{1}}) {
      const Inputs plain = Make(dtype, h, sq, s);
      for (const Option& opt : options) {
        Inputs with = plain;
        opt.set(with.options);
        const std::vector<double> t =
            Time(sq == 1 ? Reps{20, 0.1} : setup.reps, {[&] { Ours(plain); }, [&] { Ours(with); }});
        const double ratio = t[0] / t[1];
        const char* rows = sq == 1 ? "decode" : "prefill";
        std::printf("%-7s %-5s %-10s %-16s %9.3f %9.3f %9.2f\n", rows, dt::DTypeName(dtype).data(),
                    Tokens(sq, s).c_str(), opt.name, t[1] * 1e3, t[0] * 1e3, ratio);
        std::fflush(stdout);
        if (opt.target > 0) {
          results.push_back({std::string("attention_option_") + opt.name + "_" + rows + "_" +
                                 dt::DTypeName(dtype).data() + "_vs_plain",
                             ratio, opt.target});
        }
      }
    }
  }
}

// The prefill shapes over block sizes, the defaults first: the figures behind the defaults.
void SweepRows(const Setup& setup) {
  std::printf("\nsweep: prefill ms per call per q_block/kv_block, the defaults first\n");
  const std::vector<std::pair<int64_t, int64_t>> blocks = {
      {setup.defaults.q_block, setup.defaults.kv_block},
      {32, 32},
      {32, 64},
      {32, 128},
      {64, 32},
      {64, 128},
      {64, 256},
      {128, 32},
      {128, 64},
      {128, 128}};
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const int64_t s : setup.lengths) {
      for (const Heads& h : setup.heads) {
        const Inputs in = Make(dtype, h, s, s);
        std::vector<std::function<void()>> fns;
        for (const auto& [qb, kb] : blocks) {
          cpu::AttentionTuning tuning = setup.defaults;
          tuning.q_block = qb, tuning.kv_block = kb;
          fns.push_back([&in, tuning] { Tuned(in, tuning); });
        }
        const std::vector<double> t = Time(setup.reps, fns);
        std::printf("%-5s %-9s %-10s", dt::DTypeName(dtype).data(), ShapeName(h).c_str(),
                    Tokens(s, s).c_str());
        for (size_t i = 0; i < blocks.size(); ++i) {
          std::printf("  %lld/%lld %.2f", static_cast<long long>(blocks[i].first),
                      static_cast<long long>(blocks[i].second), t[i] * 1e3);
        }
        std::printf("\n");
        std::fflush(stdout);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = dt::bench::ParseBenchFlags(
      argc, argv,
      "usage: bench_attention [--quick] [--threads T] [--rows=prefill,decode,sweep,options] "
      "[--cpu-time]\n"
      "CPU attention on Llama shapes");
  const std::vector<std::string> sections = absl::GetFlag(FLAGS_rows);
  for (const std::string& name : sections) {
    if (name != "prefill" && name != "decode" && name != "sweep" && name != "options") {
      std::fprintf(stderr,
                   "bench_attention: --rows takes prefill, decode, sweep and options, got '%s'\n",
                   name.c_str());
      return 2;
    }
  }
  const auto run = [&](const char* name) {
    return std::find(sections.begin(), sections.end(), name) != sections.end();
  };
  const int threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads)
                                                       : tbb::this_task_arena::max_concurrency();
  const Setup setup{quick,
                    quick ? Reps{3, 0.2} : Reps{7, 1.0},
                    cpu::AttentionTuning{},
                    {{8, 4, 64}, {32, 8, 64}, {32, 8, 128}},
                    {512, 2048}};
  const cpu::AttentionTuning& d = setup.defaults;
  std::printf("bench_attention%s: T = %d threads on %s\n", quick ? " --quick" : "", threads,
              cpu::ThisCpu().Describe().c_str());
  std::printf(
      "  flash path: %s kernels; q_block %lld, kv_block %lld, flash_min_rows %lld (f32), %lld "
      "(bf16)\n",
      cpu::attention::IsaName(cpu::attention::ActiveIsa()), static_cast<long long>(d.q_block),
      static_cast<long long>(d.kv_block), static_cast<long long>(d.flash_min_rows),
      static_cast<long long>(d.flash_min_rows_bf16));
  std::printf("  timing: %s\n",
              absl::GetFlag(FLAGS_cpu_time) ? "CPU time of the calling thread" : "wall clock");
  std::vector<Result> results;
  tbb::task_arena arena(threads);
  arena.execute([&] {
    if (run("prefill")) PrefillRows(setup, results);
    if (run("decode")) DecodeRows(setup, results);
    if (run("sweep")) SweepRows(setup);
    if (run("options")) OptionRows(setup, results);
  });
  std::printf("\n");
  for (const Result& r : results) {
    std::printf("RESULT %s %.2f %.2g %s\n", r.metric.c_str(), r.value, r.target,
                dt::bench::Verdict(r.value >= r.target));
  }
  return 0;
}
