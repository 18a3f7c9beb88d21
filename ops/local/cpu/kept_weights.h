#pragma once
// Internal to the CPU kernels: layouts of weights made once and kept for every later product, under
// one byte budget for the process (Note [Kept weights] in kept_weights.cc): the quantized GEMM's
// panels (qgemm.cc) and the layout oneDNN's matmul asks for (gemm_dnnl.cc).

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "dtensor/core/storage.h"

namespace dt::ops::cpu::kept {

// The layout kept under `key` (which names the weight's address, shape, type and whatever else the
// layout depends on), made on first use by `make` into `bytes` of fresh memory (it returns false
// when it could not make it: nothing is kept then, and this call gets nothing); `weight` is held
// while the layout lives. Undefined when the process keeps none (budget 0), when it does not fit,
// or when making it failed: the caller then makes its layout per call. Thread-safe: the first
// caller makes it, concurrent ones wait for it. The returned Storage keeps the layout alive for
// the call even if the budget drops it meanwhile.
Storage Layout(const Storage& weight, const std::string& key, int64_t bytes,
               absl::FunctionRef<bool(void* out)> make);

// Whether any layout may be kept now (the budget is above 0): callers skip the work of a key then.
bool Keeping();

// At most `bytes` of layouts kept in this process (0 keeps none and drops those kept); the default
// is DT_QGEMM_PACKED_MB MiB from the environment, else 0. Bytes: those kept now.
void SetBudget(int64_t bytes);
int64_t Bytes();

}  // namespace dt::ops::cpu::kept
