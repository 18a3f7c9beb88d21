// The kernel tuner (Note [Tuner] in ops/local/cpu/tuner.cc): how a knob decides (DT_TUNE, rule,
// cache, measurement), the cache file it keeps, and that every candidate of the real knobs computes
// the same products. Every test sets XDG_CACHE_HOME to a fresh directory, so that nothing reads or
// writes the user's cache.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "dtensor/core/quant.h"
#include "dtensor/ops/local/cpu/attention_kernels.h"
#include "dtensor/ops/local/cpu/gemm_kernels.h"
#include "dtensor/ops/local/cpu/gemm_paths.h"
#include "dtensor/ops/local/cpu/gemm_dispatch.h"
#include "dtensor/ops/local/cpu/qgemm.h"
#include "dtensor/ops/local/cpu/tuner.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/test_util.h"

namespace dt::ops {
namespace {

namespace tune = cpu::tune;

// A scratch cache directory and DT_TUNE for one test, on a quiet machine whatever else runs beside
// the test; every choice is forgotten after.
class TuneEnv : public testing::ScopedCache {
 public:
  explicit TuneEnv(const char* dt_tune)
      : ScopedCache(
            "DT_TUNE", dt_tune,
            [] {
              tune::ResetForTesting();
              tune::SetLoadForTesting(0.0);
            },
            [] {
              tune::SetLoadForTesting(std::nullopt);
              tune::ResetForTesting();
            }) {}
};

// A trial whose candidate i takes sleep_ms[i] milliseconds (negative: fails), counting its runs.
class SleepTrial : public tune::Trial {
 public:
  SleepTrial(std::vector<int> sleep_ms, int* runs) : sleep_ms_(std::move(sleep_ms)), runs_(runs) {}
  absl::Status Run(int candidate) override {
    ++*runs_;
    if (sleep_ms_[candidate] < 0) return absl::InternalError("cannot run here");
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_[candidate]));
    return absl::OkStatus();
  }
  double Work() const override { return 1e9; }  // 1 "GB" per run: the figure is runs per second
  int Threads() const override { return 1; }

 private:
  std::vector<int> sleep_ms_;
  int* runs_;
};

// A knob over three candidates timed by a SleepTrial (a fresh object per test: Pick keeps its
// choice in the knob).
std::unique_ptr<tune::Knob> SleepKnob(const std::string& name, std::vector<int> sleep_ms, int* runs,
                                      double keep_first = 1.0) {
  auto knob = std::make_unique<tune::Knob>();
  knob->name = name;
  knob->what = "a test knob";
  knob->candidates = {"a", "b", "c"};
  knob->unit = "GB/s";
  knob->rounds = 3;
  knob->keep_first = keep_first;
  knob->make_trial = [sleep_ms, runs]() -> absl::StatusOr<std::unique_ptr<tune::Trial>> {
    return std::make_unique<SleepTrial>(sleep_ms, runs);
  };
  return knob;
}

TEST(Tuner, MeasuresTheFastestWritesTheCacheAndReadsItBack) {
  TuneEnv env(nullptr);
  int runs = 0;
  auto knob = SleepKnob("test.sleep", {120, 1, 40}, &runs);
  EXPECT_EQ(tune::Pick(*knob).value(), 1);
  EXPECT_EQ(runs, 3 * (1 + 3));  // a warm-up and three rounds each
  const tune::Choice c = tune::Explain(*knob).value();
  EXPECT_EQ(c.index, 1);
  EXPECT_TRUE(c.why.starts_with("measured (GB/s, 1 thread): a ")) << c.why;
  EXPECT_GT(c.figures[1], c.figures[2]);
  EXPECT_GT(c.figures[2], c.figures[0]);
  const std::string text = testing::ReadFileBytes(tune::CachePath());
  EXPECT_NE(text.find("key " + tune::CacheKey() + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\ntest.sleep GB/s threads 1 quiet a "), std::string::npos) << text;

  // Another process (here: the same one, its choices forgotten) reads the figures, measuring nothing.
  auto again = SleepKnob("test.sleep", {120, 1, 40}, &runs);
  tune::ResetForTesting();
  runs = 0;
  EXPECT_EQ(tune::Pick(*again).value(), 1);
  EXPECT_EQ(runs, 0);
  EXPECT_TRUE(tune::Explain(*again)->why.starts_with("cached (GB/s, 1 thread): a ")) << tune::Explain(*again)->why;

  // A knob whose candidates changed (the code changed) is measured again; the other lines stay.
  auto changed = SleepKnob("test.sleep", {120, 1, 40}, &runs);
  changed->candidates = {"a", "b", "d"};
  auto other = SleepKnob("test.other", {1, 40, 40}, &runs);
  tune::ResetForTesting();
  EXPECT_EQ(tune::Pick(*other).value(), 0);
  EXPECT_EQ(tune::Pick(*changed).value(), 1);
  EXPECT_GT(runs, 0);
  const std::string text2 = testing::ReadFileBytes(tune::CachePath());
  EXPECT_NE(text2.find("\ntest.sleep GB/s threads 1 quiet a "), std::string::npos) << text2;
  EXPECT_NE(text2.find(" d "), std::string::npos) << text2;
  EXPECT_NE(text2.find("\ntest.other GB/s threads 1 quiet a "), std::string::npos) << text2;
}

// A measurement taken on a busy machine is used, says so, and is measured again by the first
// process that finds the machine quiet.
TEST(Tuner, BusyMeasurementsAreMeasuredAgainWhenQuiet) {
  TuneEnv env(nullptr);
  int runs = 0;
  tune::SetLoadForTesting(1.5);
  auto knob = SleepKnob("test.busy", {40, 1, 40}, &runs);
  EXPECT_TRUE(tune::Explain(*knob)->why.starts_with("measured on a busy machine (GB/s")) << tune::Explain(*knob)->why;
  EXPECT_NE(testing::ReadFileBytes(tune::CachePath()).find("\ntest.busy GB/s threads 1 busy a "), std::string::npos);
  // Still busy: the figures are read.
  auto busy = SleepKnob("test.busy", {40, 1, 40}, &runs);
  tune::ResetForTesting();
  runs = 0;
  EXPECT_TRUE(tune::Explain(*busy)->why.starts_with("cached on a busy machine")) << tune::Explain(*busy)->why;
  EXPECT_EQ(runs, 0);
  // Quiet: measured again, and the line says so.
  tune::SetLoadForTesting(0.1);
  auto quiet = SleepKnob("test.busy", {40, 1, 40}, &runs);
  tune::ResetForTesting();
  EXPECT_TRUE(tune::Explain(*quiet)->why.starts_with("measured (GB/s")) << tune::Explain(*quiet)->why;
  EXPECT_GT(runs, 0);
  EXPECT_NE(testing::ReadFileBytes(tune::CachePath()).find("\ntest.busy GB/s threads 1 quiet a "), std::string::npos);
}

TEST(Tuner, FirstCandidateStaysWithinKeepFirst) {
  TuneEnv env(nullptr);
  int runs = 0;
  // b is about 3x faster than a: it wins with keep_first 1.0, a stays with keep_first 6. (Gaps of
  // tens of milliseconds: a loaded machine wakes a sleeper that much late.)
  auto fastest = SleepKnob("test.keep1", {60, 20, 150}, &runs, 1.0);
  auto keep = SleepKnob("test.keep2", {60, 20, 150}, &runs, 6.0);
  EXPECT_EQ(tune::Pick(*fastest).value(), 1);
  EXPECT_EQ(tune::Pick(*keep).value(), 0);
}

TEST(Tuner, CandidatesThatFailAreLeftOutAndATrialThatCannotRunGivesTheFirst) {
  TuneEnv env(nullptr);
  int runs = 0;
  auto knob = SleepKnob("test.fails", {-1, 60, 1}, &runs);
  const tune::Choice c = tune::Explain(*knob).value();
  EXPECT_EQ(c.index, 2);
  EXPECT_EQ(c.figures[0], 0.0);
  EXPECT_NE(c.why.find(" a - "), std::string::npos) << c.why;

  auto none = SleepKnob("test.none", {-1, -1, -1}, &runs);
  const tune::Choice d = tune::Explain(*none).value();
  EXPECT_EQ(d.index, 0);
  EXPECT_NE(d.why.find("measurement failed"), std::string::npos) << d.why;
}

// A trial whose kernels ask for another knob from other threads (as oneTBB's workers do) must not
// wait on the measurement that runs it (Note [Picks during a measurement]): the inner knob answers
// its first candidate meanwhile, is neither measured nor kept then, and is measured at its first
// Pick after.
TEST(Tuner, APickFromAnotherThreadDuringATrialDoesNotWait) {
  TuneEnv env(nullptr);
  int inner_runs = 0, outer_runs = 0;
  auto inner = SleepKnob("test.inner", {5, 1, 5}, &inner_runs);
  auto outer = SleepKnob("test.outer", {1, 2, 3}, &outer_runs);
  std::vector<int> seen;
  outer->make_trial = [&]() -> absl::StatusOr<std::unique_ptr<tune::Trial>> {
    class Asking : public SleepTrial {
     public:
      Asking(const tune::Knob& inner, std::vector<int>& seen, int* runs)
          : SleepTrial({1, 2, 3}, runs), inner_(inner), seen_(seen) {}
      absl::Status Run(int candidate) override {
        std::thread worker([&] { seen_.push_back(tune::Pick(inner_).value()); });
        worker.join();
        return SleepTrial::Run(candidate);
      }

     private:
      const tune::Knob& inner_;
      std::vector<int>& seen_;
    };
    return std::make_unique<Asking>(*inner, seen, &outer_runs);
  };
  EXPECT_EQ(tune::Pick(*outer).value(), 0);
  ASSERT_FALSE(seen.empty());
  for (const int i : seen) EXPECT_EQ(i, 0);
  EXPECT_EQ(inner_runs, 0);
  EXPECT_EQ(tune::Pick(*inner).value(), 1);  // measured now
  EXPECT_GT(inner_runs, 0);
}

// Note [Last-level cache]: the cache a trial outgrows is the one this core shares, at least its L2
// and never more than glibc's figure for the whole package; trials stream twice it, within 64 and
// 512 MiB.
TEST(Tuner, TrialsOutgrowTheCacheThisCoreShares) {
  const int64_t llc = tune::LastLevelCacheBytes();
  ASSERT_GT(llc, 0);
  if (const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE); l2 > 0) {
    EXPECT_GE(llc, l2);
  }
  if (const long l3 = ::sysconf(_SC_LEVEL3_CACHE_SIZE); l3 > 0) {
    EXPECT_LE(llc, l3);
  }
  EXPECT_EQ(tune::ColdBytes(), std::clamp<int64_t>(2 * llc, int64_t{64} << 20, int64_t{512} << 20));
}

TEST(Tuner, RuleDecidesWithoutMeasuring) {
  TuneEnv env(nullptr);
  int runs = 0;
  auto knob = SleepKnob("test.rule", {1, 1, 1}, &runs);
  knob->rule = [] { return std::optional<std::pair<int, std::string>>({2, "what this CPU is"}); };
  EXPECT_EQ(tune::Pick(*knob).value(), 2);
  EXPECT_EQ(tune::Explain(*knob)->why, "rule: what this CPU is");
  EXPECT_EQ(runs, 0);
}

TEST(Tuner, DtTuneForcesAndNamesWhatIsWrong) {
  const tune::Knob& qdot = cpu::qgemm::DotPrefetchKnob();
  {
    TuneEnv env("qgemm.dot_prefetch=t0/2k,gemm.f32.large=openblas");
    EXPECT_EQ(qdot.candidates[tune::Pick(qdot).value()], "t0/2k");
    EXPECT_EQ(tune::Explain(qdot)->why, "DT_TUNE=qgemm.dot_prefetch=t0/2k");
    EXPECT_EQ(cpu::gemm::Decide(DType::kF32, cpu::gemm::ShapeClass::kLarge)->backend,
              cpu::gemm::Backend::kOpenBlas);
    // Nothing was measured.
    EXPECT_FALSE(std::filesystem::exists(tune::CachePath()));
  }
  for (const char* bad : {"qgemm.dot_prefetch=t5/2k", "nosuch.knob=a", "qgemm.dot_prefetch", "=t0/2k"}) {
    TuneEnv env(bad);
    const absl::StatusOr<int> r = tune::Pick(qdot);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string msg(r.status().message());
    EXPECT_NE(msg.find(std::string("DT_TUNE='") + bad + "'"), std::string::npos) << msg;
    // A product that asks fails with the same message.
    const Tensor x = Tensor::Ones({1, 64}).value();
    const Tensor w = Tensor::Ones({4, 64}).value();
    const absl::StatusOr<Tensor> y = Linear(x, w);
    ASSERT_FALSE(y.ok());
    EXPECT_NE(y.status().message().find("DT_TUNE="), absl::string_view::npos) << y.status();
  }
  // Every knob's name is accepted with every one of its candidates.
  for (const tune::Knob* k : tune::AllKnobs()) {
    for (size_t i = 0; i < k->candidates.size(); ++i) {
      const std::string text = k->name + "=" + k->candidates[i];
      const auto parsed = tune::ParseTuneEnv(text.c_str());
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      ASSERT_EQ(parsed->size(), 1u);
      EXPECT_EQ((*parsed)[0].first, k);
      EXPECT_EQ((*parsed)[0].second, static_cast<int>(i));
    }
  }
}

// The prefetch knobs change where bytes are asked for, the panels' chunk which thread computes
// which outputs, never a result: every candidate gives the same bits as the first, for quantized
// and float products of several shapes (the chunk's: 480, 288, 128 or 64 of the 2000 weight rows
// a chunk on two threads, the last chunk partial).
TEST(Tuner, EveryPrefetchAndChunkCandidateComputesTheSameProduct) {
  TuneEnv env(nullptr);
  struct Case {
    const tune::Knob* knob;
    DType w_dtype;
    int64_t m, n, k;
  };
  const Case cases[] = {{&cpu::qgemm::DotPrefetchKnob(), DType::kQ4_1, 1, 67, 576},
                        {&cpu::qgemm::DotPrefetchKnob(), DType::kQ6_K, 3, 40, 512},
                        {&cpu::qgemm::DotPrefetchKnob(), DType::kQ8_0, 4, 129, 96},
                        {&cpu::qgemm::PanelChunkKnob(), DType::kQ4_1, 40, 2000, 2048},
                        {&cpu::qgemm::PanelChunkKnob(), DType::kQ6_K, 9, 1000, 4096},
                        {&cpu::gemm::SkinnyPrefetchKnob(), DType::kF32, 1, 300, 1000},
                        {&cpu::gemm::SkinnyPrefetchKnob(), DType::kBF16, 5, 77, 4100},
                        {&cpu::gemm::SkinnyPrefetchKnob(), DType::kF16, 8, 33, 200}};
  for (const Case& c : cases) {
    const Tensor x = Tensor::Randn({c.m, c.k}, 1).value();
    const Tensor w = IsQuantized(c.w_dtype) ? RandomQuantized(c.w_dtype, {c.n, c.k}, 2).value()
                                            : Tensor::Randn({c.n, c.k}, 2).value().To(c.w_dtype).value();
    const Tensor xin = IsQuantized(c.w_dtype) ? x : x.To(c.w_dtype).value();
    std::optional<Tensor> first;
    for (size_t i = 0; i < c.knob->candidates.size(); ++i) {
      tune::ForceForTesting(*c.knob, static_cast<int>(i));
      const Tensor y = Linear(xin, w).value().To(DType::kF32).value();
      if (!first) {
        first = y;
      } else {
        EXPECT_TRUE(Equal(y, *first))
            << c.knob->name << " " << c.knob->candidates[i] << " on " << DTypeName(c.w_dtype);
      }
    }
    tune::ForceForTesting(*c.knob, std::nullopt);
  }
}

// The split knobs (Note [Decode split]) change which thread reads which rows, never a result in
// the dot layout (a Linear's weight: each output is one thread's sum), whose every candidate gives
// the first one's bits; in the axpy layout (x . w) the threads sum partial outputs over chunks of
// K, so the chunking moves each output within f32 rounding of its sum (K * 2^-23 * sum |x w|, plus
// an output's own rounding in bf16). Float decode products of each size class, 1 to 8 rows. (The
// quantized ones: QuantizedLinearTest.SiblingsEqualOneByOne.)
TEST(Tuner, EverySplitCandidateComputesTheSameProduct) {
  TuneEnv env(nullptr);
  struct Case {
    DType dtype;
    int64_t n, k;  // small, medium, large
  };
  const Case cases[] = {{DType::kF32, 40, 700}, {DType::kBF16, 300, 1000}, {DType::kF32, 700, 1000}};
  const std::vector<const tune::Knob*>& knobs = cpu::gemm::SkinnySplitKnobs();
  for (const Case& c : cases) {
    for (const int64_t m : {1, 3, 8}) {
      const Tensor x = Tensor::Randn({m, c.k}, 1).value().To(c.dtype).value();
      const Tensor w = Tensor::Randn({c.n, c.k}, 2).value().To(c.dtype).value();
      const Tensor wt = Tensor::Randn({c.k, c.n}, 3).value().To(c.dtype).value();
      // sum_p |x[i, p] wt[p, j]| per output of the axpy layout.
      const std::vector<double> xs = x.ToDoubles(), ws = wt.ToDoubles();
      std::vector<double> magnitude(static_cast<size_t>(m * c.n), 0.0);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t p = 0; p < c.k; ++p) {
          for (int64_t j = 0; j < c.n; ++j) {
            magnitude[i * c.n + j] += std::abs(xs[i * c.k + p] * ws[p * c.n + j]);
          }
        }
      }
      std::optional<Tensor> first_dot;
      std::vector<double> first_axpy;
      for (size_t i = 0; i < knobs[0]->candidates.size(); ++i) {
        for (const tune::Knob* k : knobs) tune::ForceForTesting(*k, static_cast<int>(i));
        const std::string what = absl::StrCat(knobs[0]->candidates[i], " on ", DTypeName(c.dtype), " [", c.n,
                                              ", ", c.k, "] M=", m);
        const Tensor dot = Linear(x, w).value();
        const std::vector<double> axpy = Matmul(x, wt).value().ToDoubles();
        if (!first_dot) {
          first_dot = dot;
          first_axpy = axpy;
          continue;
        }
        EXPECT_TRUE(Equal(dot, *first_dot)) << what;
        for (size_t e = 0; e < axpy.size(); ++e) {
          const double bound = static_cast<double>(c.k) * std::ldexp(magnitude[e], -23) +
                               (c.dtype == DType::kBF16 ? std::ldexp(std::abs(first_axpy[e]), -7) : 0.0);
          ASSERT_LE(std::abs(axpy[e] - first_axpy[e]), bound) << what << " axpy, output " << e;
        }
      }
      for (const tune::Knob* k : knobs) tune::ForceForTesting(*k, std::nullopt);
    }
  }
}

// The row order of the float decode GEMV (gemm.skinny_rows, Note [Skinny dot order]) changes how
// each output's sum is grouped (one row's four chains, or one chain per row side by side), so every
// candidate gives each output within f32 rounding of the first's (K * 2^-23 * sum |x w|, plus the
// output's own rounding in a half dtype). One row of x against rows of 1.2 to 16.8 KiB, on either
// side of every candidate's threshold, a partial tile of rows at the end.
TEST(Tuner, EveryRowOrderComputesTheProductWithinRounding) {
  TuneEnv env(nullptr);
  struct Case {
    DType dtype;
    int64_t n, k;
  };
  const Case cases[] = {{DType::kF32, 37, 300},   {DType::kBF16, 45, 600},  {DType::kF32, 29, 700},
                        {DType::kBF16, 23, 2100}, {DType::kF16, 19, 2100}, {DType::kF32, 21, 1000},
                        {DType::kBF16, 13, 4100}, {DType::kF32, 11, 2100}, {DType::kBF16, 7, 8300},
                        {DType::kF32, 9, 4200}};
  const tune::Knob& knob = cpu::gemm::SkinnyRowsKnob();
  for (const Case& c : cases) {
    const Tensor x = Tensor::Randn({1, c.k}, 1).value().To(c.dtype).value();
    const Tensor w = Tensor::Randn({c.n, c.k}, 2).value().To(c.dtype).value();
    const std::vector<double> xs = x.ToDoubles(), ws = w.ToDoubles();
    std::vector<double> first;
    for (size_t i = 0; i < knob.candidates.size(); ++i) {
      tune::ForceForTesting(knob, static_cast<int>(i));
      const std::vector<double> y = Linear(x, w).value().ToDoubles();
      if (first.empty()) {
        first = y;
        continue;
      }
      for (int64_t j = 0; j < c.n; ++j) {
        double magnitude = 0;
        for (int64_t p = 0; p < c.k; ++p) magnitude += std::abs(xs[p] * ws[j * c.k + p]);
        const double bound = static_cast<double>(c.k) * std::ldexp(magnitude, -23) +
                             (c.dtype == DType::kF32 ? 0.0 : std::ldexp(std::abs(first[j]), -7));
        ASSERT_LE(std::abs(y[j] - first[j]), bound)
            << knob.candidates[i] << " on " << DTypeName(c.dtype) << " [" << c.n << ", " << c.k
            << "], output " << j;
      }
    }
    tune::ForceForTesting(knob, std::nullopt);
  }
}

// The instruction-set knobs (Note [Tuned instruction set]): their candidates are the sets this
// CPU runs, most preferred first; the candidate forced is the set the kernels run (the attention
// kernels' the GEMM's), a test's SetIsaForTesting wins over the knob, and the cache key names the
// most preferred set whatever the knob picks.
template <typename Isa>
void ExpectIsaKnobSteers(const tune::Knob& knob, const std::vector<Isa>& sets, Isa (*active)(),
                         void (*set_for_testing)(std::optional<Isa>), bool (*supported)(Isa),
                         const char* (*name)(Isa)) {
  ASSERT_EQ(knob.candidates.size(), sets.size());
  const std::string key = tune::CacheKey();
  // Every set of the family above the first candidate (name() is "?" past the family's last).
  for (int above = static_cast<int>(sets[0]) + 1; std::string(name(static_cast<Isa>(above))) != "?";
       ++above) {
    EXPECT_FALSE(supported(static_cast<Isa>(above))) << knob.name << ": a preferred set left out";
  }
  for (size_t i = 0; i < sets.size(); ++i) {
    EXPECT_TRUE(supported(sets[i]));
    EXPECT_EQ(knob.candidates[i], name(sets[i]));
    if (i > 0) {
      EXPECT_LT(sets[i], sets[i - 1]);
    }
    tune::ForceForTesting(knob, static_cast<int>(i));
    EXPECT_EQ(active(), sets[i]) << knob.name;
    if (&knob == &cpu::gemm::IsaKnob()) {
      EXPECT_EQ(knob.candidates[i], cpu::attention::IsaName(cpu::attention::ActiveIsa()));
    }
    EXPECT_EQ(tune::CacheKey(), key);
  }
  set_for_testing(sets.back());
  tune::ForceForTesting(knob, 0);
  EXPECT_EQ(active(), sets.back()) << knob.name << ": a test's set wins";
  set_for_testing(std::nullopt);
  tune::ForceForTesting(knob, std::nullopt);
}

TEST(Tuner, IsaKnobsSteerTheKernels) {
  TuneEnv env(nullptr);
  namespace gemm = cpu::gemm;
  namespace qgemm = cpu::qgemm;
  ExpectIsaKnobSteers(gemm::IsaKnob(), gemm::IsaCandidates(), &gemm::ActiveIsa,
                      &gemm::SetIsaForTesting, &gemm::IsaSupported, &gemm::IsaName);
  ExpectIsaKnobSteers(qgemm::IsaKnob(), qgemm::IsaCandidates(), &qgemm::ActiveIsa,
                      &qgemm::SetIsaForTesting, &qgemm::IsaSupported, &qgemm::IsaName);
}

// The real knobs measure on this machine: every candidate runs and the choice is the fastest.
TEST(Tuner, RealKnobsMeasureEveryCandidate) {
  TuneEnv env(nullptr);
  const cpu::qgemm::Kernels& qks = cpu::qgemm::KernelsFor(cpu::qgemm::ActiveIsa());
  const bool panels = qks.pack != nullptr;
  std::vector<const tune::Knob*> knobs = {
      &cpu::qgemm::IsaKnob(), &cpu::qgemm::DotPrefetchKnob(), &cpu::qgemm::DotPairsKnob(),
      &cpu::qgemm::PanelsPrefetchKnob(), &cpu::qgemm::PanelChunkKnob(),
      &cpu::qgemm::DotMaxRowsKnob(false),
      &cpu::qgemm::DotMaxRowsKnob(true), &cpu::gemm::IsaKnob(),
      &cpu::gemm::SkinnyPrefetchKnob(), &cpu::gemm::SkinnyRowsKnob()};
  for (const tune::Knob* k : cpu::qgemm::DotSplitKnobs()) knobs.push_back(k);
  for (const tune::Knob* k : cpu::gemm::SkinnySplitKnobs()) knobs.push_back(k);
  if (qks.dot_wide != nullptr) knobs.push_back(&cpu::qgemm::DotWidthKnob());  // else a rule
  for (const tune::Knob* k : knobs) {
    const bool times_panels = k->name.starts_with("qgemm.dot_max_rows") ||
                              k->name.starts_with("qgemm.panel") || k->name == "qgemm.isa";
    if (!panels && times_panels) continue;  // no panels to time
    const tune::Choice c = tune::MeasureNow(*k).value();
    for (size_t i = 0; i < k->candidates.size(); ++i) EXPECT_GT(c.figures[i], 0) << k->name << " " << k->candidates[i];
    // The fastest, or the first within keep_first of it.
    const double best = *std::max_element(c.figures.begin(), c.figures.end());
    EXPECT_GE(c.figures[c.index] * k->keep_first, best) << c.why;
  }
}

}  // namespace
}  // namespace dt::ops
