#pragma once
// Internal to the CPU kernels: the instruction set a kernel family uses, detected once from CPUID
// and overridable by tests and benchmarks (Note [GEMM kernels] in gemm_kernels.cc).

#include <array>
#include <atomic>
#include <cstddef>
#include <optional>

#include "dtensor/core/status.h"
#include "dtensor/ops/local/cpu/cpu_info.h"

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
  Isa Active() const {
    const int forced = forced_.load(std::memory_order_relaxed);
    return forced < 0 ? detected_ : static_cast<Isa>(forced);
  }
  // nullopt: back to the detected set. A set this CPU does not run is a bug of the caller.
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

}  // namespace dt::ops::cpu

// Defines, in a kernel family's namespace, the four functions its header declares over one
// IsaChoice of `sets` (an std::array<IsaEntry<IsaType>, N>), made on first use:
//   const char* IsaName(IsaType);  bool IsaSupported(IsaType);  IsaType ActiveIsa();
//   void SetIsaForTesting(std::optional<IsaType>);  // nullopt: the detected set again
#define DT_ISA_FUNCTIONS(IsaType, sets)                                                       \
  static auto& FamilyIsaChoice() {                                                            \
    static ::dt::ops::cpu::IsaChoice choice(sets);                                            \
    return choice;                                                                            \
  }                                                                                           \
  const char* IsaName(IsaType isa) { return FamilyIsaChoice().Name(isa); }                    \
  bool IsaSupported(IsaType isa) { return FamilyIsaChoice().Supported(isa); }                 \
  IsaType ActiveIsa() { return FamilyIsaChoice().Active(); }                                 \
  void SetIsaForTesting(std::optional<IsaType> isa) { FamilyIsaChoice().Force(isa); }
