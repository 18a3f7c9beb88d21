#pragma once
// Internal to the CPU kernels: every kernel choice whose best value depends on the CPU (a prefetch
// hint, a GEMM backend per shape class, ...) is a Knob, decided on the machine that runs it: timed
// at first use on work shaped like the real one, cached per CPU and library versions, printed by
// `dtensor calibrate`, forced with DT_TUNE (Note [Tuner] in tuner.cc).

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dt::ops::cpu::tune {

// A knob's candidates run on work shaped like the real one. Made once per measurement (it may
// allocate and fill buffers larger than the last-level cache), then Run(i) is timed `rounds` times
// per candidate, the candidates interleaved.
class Trial {
 public:
  virtual ~Trial() = default;
  // One run of candidate i; an error leaves the candidate out of the choice.
  virtual absl::Status Run(int candidate) = 0;
  // The work of one run in the knob's unit (bytes for GB/s, flops for GFLOP/s).
  virtual double Work() const = 0;
  // How many threads a run uses, for the figures' text.
  virtual int Threads() const = 0;
};

// One CPU-dependent choice. Declared once, as a function-local static beside the kernel it steers
// (`const Knob& QdotPrefetchKnob()`), and listed in AllKnobs().
struct Knob {
  std::string name;                     // "qdot.prefetch": letters, digits, '.', '_'
  std::string what;                     // one line for `dtensor calibrate`
  std::vector<std::string> candidates;  // [0]: the choice when nothing can be measured
  std::string unit;                     // "GB/s" or "GFLOP/s"
  int rounds = 7;
  // Candidate 0 stays unless another measures faster than it by more than this factor (1: the
  // fastest wins; 1.03: candidate 0 unless another is over 3 % faster).
  double keep_first = 1.0;
  // A rule that settles the knob on this CPU without measuring, with its reason.
  std::function<std::optional<std::pair<int, std::string>>()> rule;
  std::function<absl::StatusOr<std::unique_ptr<Trial>>()> make_trial;

  // The tuner's state (tuner.cc): the chosen index, or -1 before the first Pick; a test's override.
  mutable std::atomic<int> picked{-1};
  mutable std::atomic<int> forced{-1};
};

// The knob's candidate for this process: a test's override, else DT_TUNE, else its rule, else the
// cache file's figures, else a measurement now (written to the cache). After the first call a
// relaxed atomic load. Fails only when DT_TUNE is malformed (naming it).
inline absl::StatusOr<int> Pick(const Knob& knob);

// A choice with the figures behind it.
struct Choice {
  int index = 0;
  // "forced by a test", "DT_TUNE", "rule: ...", "measured (GB/s, 2 threads): nta 18.2 t0 19.9 ...",
  // "cached (...)": where the choice came from.
  std::string why;
  std::vector<double> figures;  // per candidate, in the knob's unit; 0 where not measured
  int threads = 0;              // of the measurement; 0 when none
};

// What Pick decides, with its reason and figures.
absl::StatusOr<Choice> Explain(const Knob& knob);
// Measures every candidate now, decides from the figures, and neither changes the process's choice
// nor the cache (benches: the pick against the best in the same run).
absl::StatusOr<Choice> MeasureNow(const Knob& knob);
// Measures again, makes it the process's choice and rewrites its line of the cache
// (`dtensor calibrate --again`).
absl::StatusOr<Choice> Remeasure(const Knob& knob);

// Every knob, in the order `dtensor calibrate` prints them.
const std::vector<const Knob*>& AllKnobs();

// The cache file of this machine and these libraries: $XDG_CACHE_HOME/dtensor/ or
// $HOME/.cache/dtensor/tuning-<hash of the key>.txt; "" when neither variable is set (choices are
// then kept in memory only).
std::string CachePath();
// The key the cache file must carry: CPU, library versions, our kernels' instruction sets.
std::string CacheKey();

// DT_TUNE's text ("qdot.prefetch=t0/2k,gemm.f32.large=dnnl") to (knob, candidate index) pairs;
// InvalidArgument naming DT_TUNE, the part and what is accepted for an unknown knob or candidate.
absl::StatusOr<std::vector<std::pair<const Knob*, int>>> ParseTuneEnv(const char* value);

// Tests and benches: force `index` for `knob` (nullopt: back to the choice).
void ForceForTesting(const Knob& knob, std::optional<int> index);
// Tests: the load average per core the tuner sees (nullopt: /proc/loadavg's).
void SetLoadForTesting(std::optional<double> load_per_core);
// Tests: forget every choice and DT_TUNE, so that the next Pick reads them again.
void ResetForTesting();

// The last-level cache this core shares, in bytes (Note [Last-level cache] in tuner.cc).
int64_t LastLevelCacheBytes();
// Bytes of weights a trial streams so that each run finds them in memory, not in cache: twice the
// last-level cache, at least 64 MiB and at most 512 MiB.
int64_t ColdBytes();

// The knob's candidate as this process has settled it (a test's override, else the choice of an
// earlier Pick), else its first; never measures nor waits: for a trial's kernels, which run inside
// another knob's measurement.
inline int Settled(const Knob& knob) {
  if (const int f = knob.forced.load(std::memory_order_relaxed); f >= 0) return f;
  return std::max(knob.picked.load(std::memory_order_acquire), 0);
}

namespace internal {
absl::StatusOr<int> Resolve(const Knob& knob);
}  // namespace internal

inline absl::StatusOr<int> Pick(const Knob& knob) {
  if (const int f = knob.forced.load(std::memory_order_relaxed); f >= 0) return f;
  if (const int p = knob.picked.load(std::memory_order_acquire); p >= 0) return p;
  return internal::Resolve(knob);
}

}  // namespace dt::ops::cpu::tune
