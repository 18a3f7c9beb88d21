#pragma once
// Internal to the CPU GEMM: which backend (own kernels, oneDNN, OpenBLAS) Matmul runs a product
// on, per dtype and shape class (Note [GEMM dispatch] in gemm_dispatch.cc).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dtensor/core/dtype.h"
#include "dtensor/ops/local/cpu/gemm_backends.h"

namespace dt::ops::cpu::tune {
struct Knob;
}  // namespace dt::ops::cpu::tune

namespace dt::ops::cpu::gemm {

// kSkinny: M <= kSkinnyMaxRows (decode); kSmall: under kLargeFlops; kLarge: the rest.
enum class ShapeClass : uint8_t { kSkinny, kSmall, kLarge };
inline constexpr ShapeClass kAllShapeClasses[] = {ShapeClass::kSkinny, ShapeClass::kSmall,
                                                   ShapeClass::kLarge};
inline constexpr double kLargeFlops = 3.2e7;  // 2·M·N·K: about 256³

const char* ShapeClassName(ShapeClass c);
ShapeClass ClassOf(int64_t m, int64_t n, int64_t k);

struct Decision {
  Backend backend = Backend::kOwn;
  // Why, for benches and logs: "DT_GEMM=dnnl", "rule: ...", "calibrated: own 151 dnnl 140 ...".
  std::string why;
};

// The backend for a product of `dtype` and shape class `c`: a test's override, else DT_GEMM,
// else a rule (skinny: own; f16: own), else the tuner's knob BackendKnob(dtype, c) (its own rule,
// DT_TUNE, or figures measured on first need and cached: Note [Tuner]). A forced backend that does
// not run `dtype` gives own. Fails when DT_GEMM holds something else than own, dnnl or openblas,
// or DT_TUNE is malformed.
absl::StatusOr<Decision> Decide(DType dtype, ShapeClass c);
// Decide's backend for an M x N x K product, without the text (what Matmul calls).
absl::StatusOr<Backend> Choose(DType dtype, int64_t m, int64_t n, int64_t k);

// DT_GEMM's text to a backend; nullopt for null or empty; InvalidArgument naming DT_GEMM and the
// accepted values for anything else.
absl::StatusOr<std::optional<Backend>> ParseGemmEnv(const char* value);

// The tuner's knob of f32 or bf16 products of the small or large class: candidates are the backends
// that run the dtype, own first ("own", "dnnl", "openblas").
const tune::Knob& BackendKnob(DType dtype, ShapeClass c);
// Those four knobs.
std::vector<const tune::Knob*> BackendKnobs();
// The tuner's knob for the instruction set of our float kernels, GEMM and attention (Note [Tuned
// instruction set] in isa_choice.h): candidates IsaCandidates() (gemm_kernels.h).
const tune::Knob& IsaKnob();

// Tests and benches: force `b` for every product (nullopt: back to DT_GEMM and the choice).
void SetBackendForTesting(std::optional<Backend> b);
// Tests: forget DT_GEMM and the decisions (every knob's: tune::ResetForTesting), so that the next
// product reads them again.
void ResetDispatchForTesting();

}  // namespace dt::ops::cpu::gemm
