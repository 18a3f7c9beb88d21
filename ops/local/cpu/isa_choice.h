#pragma once
// Internal to the CPU kernels: the instruction set a kernel family uses, detected once from CPUID
// and overridable by tests and benchmarks (Note [GEMM kernels] in gemm_kernels.cc).

#include <atomic>
#include <optional>

namespace dt::ops::cpu {

// `Isa` is an enum of the family's sets. Active() is the detected set unless Force() chose another.
template <typename Isa>
class IsaChoice {
 public:
  explicit IsaChoice(Isa detected) : detected_(detected) {}
  Isa detected() const { return detected_; }
  Isa Active() const {
    const int forced = forced_.load(std::memory_order_relaxed);
    return forced < 0 ? detected_ : static_cast<Isa>(forced);
  }
  void Force(std::optional<Isa> isa) {
    forced_.store(isa.has_value() ? static_cast<int>(*isa) : -1, std::memory_order_relaxed);
  }

 private:
  const Isa detected_;
  std::atomic<int> forced_{-1};
};

}  // namespace dt::ops::cpu
