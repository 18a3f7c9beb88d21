#pragma once
// Internal to the CPU kernels: the instruction set a kernel family uses, among those CPUID says
// the CPU runs, picked by the family's tuner knob and overridable by tests and benchmarks (Note
// [GEMM kernels] in gemm_kernels.cc).
//
// Note [Tuned instruction set]
// Which of the SIMD sets a CPU runs serves a kernel family best is the CPU's to say, not the
// widest set's by rule: AVX-512's 512-bit vectors halve the instructions of a product, but Zen 4
// issues them as two 256-bit halves, and some Intel cores lower their clock while they run them.
// So each family has a knob (`gemm.isa` for the float GEMM and the attention kernels that share
// its sets, `qgemm.isa` for the quantized GEMM) whose candidates are the sets the CPU runs, from
// the most preferred down to AVX2, timed on the family's compute-bound products (a decode product
// reads its weights at the memory's speed whatever the width); the most preferred stays unless
// another is more than 3 % faster. The tuner's cache key names the most preferred set (or a
// test's), not the pick, so that the knob is read from the file its key names; a test's
// SetIsaForTesting overrides the knob.

#include <array>
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/core/status.h"
#include "dtensor/ops/local/cpu/cpu_info.h"
#include "dtensor/ops/local/cpu/tuner.h"

namespace dt::ops::cpu {

// One instruction set of a family: its name and whether this CPU (and this build) runs it.
template <typename Isa>
struct IsaEntry {
  Isa isa;
  const char* name;
  bool supported;
};

// `Isa` is an enum of the family's N sets, 0 to N - 1 from the plainest (generic, always
// supported) to the most preferred; `sets` lists them in that order. Active() is the most
// preferred supported set unless Force() chose another.
template <typename Isa, size_t N>
class IsaChoice {
 public:
  explicit IsaChoice(const std::array<IsaEntry<Isa>, N>& sets) : sets_(sets) {
    for (size_t i = 0; i < N; ++i) DT_CHECK(static_cast<size_t>(sets_[i].isa) == i, "IsaChoice: ", sets_[i].name);
    for (const IsaEntry<Isa>& s : sets_) {
      if (s.supported) detected_ = s.isa;
    }
  }
  const char* Name(Isa isa) const { return InRange(isa) ? sets_[static_cast<size_t>(isa)].name : "?"; }
  bool Supported(Isa isa) const { return InRange(isa) && sets_[static_cast<size_t>(isa)].supported; }
  // The set a test forced, else tuned() (the family's knob, Note [Tuned instruction set]).
  Isa Active(Isa (*tuned)()) const {
    const int forced = forced_.load(std::memory_order_relaxed);
    return forced < 0 ? tuned() : static_cast<Isa>(forced);
  }
  // The set a test forced, else the most preferred one the CPU runs: what the tuner's cache key
  // names.
  Isa Base() const {
    const int forced = forced_.load(std::memory_order_relaxed);
    return forced < 0 ? detected_ : static_cast<Isa>(forced);
  }
  // The candidates of the family's knob: the detected set, then the other supported ones below
  // it but the plain C++ one (which a SIMD set always beats), most preferred first.
  std::vector<Isa> Candidates() const {
    std::vector<Isa> v;
    for (size_t i = static_cast<size_t>(detected_) + 1; i-- > 0;) {
      if (sets_[i].supported && (i > 0 || v.empty())) v.push_back(sets_[i].isa);
    }
    return v;
  }
  // nullopt: back to the knob's set. A set this CPU does not run is a bug of the caller.
  void Force(std::optional<Isa> isa) {
    DT_CHECK(!isa.has_value() || Supported(*isa));
    forced_.store(isa.has_value() ? static_cast<int>(*isa) : -1, std::memory_order_relaxed);
  }

 private:
  static bool InRange(Isa isa) { return static_cast<size_t>(isa) < N; }

  const std::array<IsaEntry<Isa>, N> sets_;
  Isa detected_ = sets_[0].isa;
  std::atomic<int> forced_{-1};
};

// The sets of the float kernel families (GEMM, attention), whose `Isa` is {kGeneric, kAvx2, kAvx512,
// kAvx512Bf16}; `x86`: whether this build compiled their x86 kernels.
template <typename Isa>
std::array<IsaEntry<Isa>, 4> FloatIsaSets(bool x86) {
  const CpuInfo& cpu = ThisCpu();
  return {{{Isa::kGeneric, "generic", true},
           {Isa::kAvx2, "avx2", x86 && cpu.avx2},
           {Isa::kAvx512, "avx512", x86 && cpu.avx512},
           {Isa::kAvx512Bf16, "avx512-bf16", x86 && cpu.avx512 && cpu.avx512_bf16}}};
}

// The knob that picks a family's set among `candidates` (IsaChoice::Candidates(); Note [Tuned
// instruction set]), timed by make_trial, whose Run(i) runs candidate i's kernels; a CPU with one
// candidate settles it by rule.
template <typename Isa>
tune::Knob* MakeIsaKnob(std::string name, std::string what, std::string unit,
                        const std::vector<Isa>& candidates, const char* (*name_of)(Isa),
                        std::function<absl::StatusOr<std::unique_ptr<tune::Trial>>()> make_trial) {
  auto* knob = new tune::Knob{  // reachable until exit, like every knob
      .name = std::move(name),
      .what = std::move(what),
      .unit = std::move(unit),
      .keep_first = 1.0 / 0.97,
      .make_trial = std::move(make_trial),
  };
  for (const Isa isa : candidates) knob->candidates.push_back(name_of(isa));
  if (candidates.size() == 1) {
    knob->rule = [] {
      return std::make_optional(std::make_pair(0, std::string("the one set this CPU runs")));
    };
  }
  return knob;
}

// The candidate `knob` picks (the first where DT_TUNE is malformed: every product that asks another
// knob reports that).
template <typename Isa>
Isa PickedIsa(const tune::Knob& knob, const std::vector<Isa>& candidates) {
  const absl::StatusOr<int> i = tune::Pick(knob);
  return candidates[i.ok() ? static_cast<size_t>(*i) : 0];
}

}  // namespace dt::ops::cpu

// Defines, in a kernel family's namespace, the functions its header declares over one IsaChoice
// of `sets` (an std::array<IsaEntry<IsaType>, N>), made on first use:
//   const char* IsaName(IsaType);  bool IsaSupported(IsaType);
//   IsaType ActiveIsa();     // a test's set, else `tuned()`: the family's knob's
//   IsaType BaseIsa();       // a test's set, else the most preferred one (the tuner's cache key)
//   std::vector<IsaType> IsaCandidates();  // the knob's candidates
//   void SetIsaForTesting(std::optional<IsaType>);  // nullopt: the knob's set again
#define DT_ISA_FUNCTIONS(IsaType, sets, tuned)                                                \
  static auto& FamilyIsaChoice() {                                                            \
    static ::dt::ops::cpu::IsaChoice choice(sets);                                            \
    return choice;                                                                            \
  }                                                                                           \
  const char* IsaName(IsaType isa) { return FamilyIsaChoice().Name(isa); }                    \
  bool IsaSupported(IsaType isa) { return FamilyIsaChoice().Supported(isa); }                 \
  IsaType ActiveIsa() { return FamilyIsaChoice().Active(tuned); }                            \
  IsaType BaseIsa() { return FamilyIsaChoice().Base(); }                                     \
  std::vector<IsaType> IsaCandidates() { return FamilyIsaChoice().Candidates(); }            \
  void SetIsaForTesting(std::optional<IsaType> isa) { FamilyIsaChoice().Force(isa); }
