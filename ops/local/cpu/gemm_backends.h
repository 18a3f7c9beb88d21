#pragma once
// Internal to the CPU GEMM: the libraries a product can run on besides our own kernels (oneDNN's
// matmul primitive, OpenBLAS's sgemm), each called single-threaded on parts of the output that
// oneTBB spreads over the arena (Note [Library threads] in gemm_split.cc). Which one runs is the
// dispatcher's choice (gemm_dispatch.h).

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "dtensor/core/dtype.h"
#include "dtensor/ops/local/cpu/gemm_paths.h"

namespace dt {
class Storage;
}  // namespace dt

namespace dt::ops::cpu::gemm {

enum class Backend : uint8_t { kOwn, kDnnl, kOpenBlas };
inline constexpr Backend kAllBackends[] = {Backend::kOwn, Backend::kDnnl, Backend::kOpenBlas};

// "own", "dnnl", "openblas": the names DT_GEMM takes.
const char* BackendName(Backend b);

// Whether `b` computes products of `dtype`: own every float dtype, oneDNN f32 and bf16 (f32
// accumulation), OpenBLAS f32 only (Debian's 0.3.21 has no sbgemm).
bool BackendRuns(Backend b, DType dtype);

// p on oneDNN / OpenBLAS (BackendRuns must hold). With `parallel`, the output is cut into parts
// spread over the current oneTBB arena; otherwise one call on the calling thread. Same contract
// as Packed (gemm.h); fails with the library's status named when the library refuses. `weights`:
// the Storage of p.b where p.b can never change (a read-only weight), so that oneDNN may multiply
// a layout of it kept for the process (Note [oneDNN weights layout] in gemm_dnnl.cc); null runs
// the plain path. Fails also when DT_TUNE is malformed.
absl::Status RunDnnl(const Problem& p, bool parallel, const Storage* weights = nullptr);
absl::Status RunOpenBlas(const Problem& p, bool parallel);

// The library and what it runs on this CPU, e.g. "oneDNN 2.6.3 (avx512_core_bf16)",
// "OpenBLAS 0.3.21 (core Zen, DYNAMIC_ARCH ...)": for the calibration key and bench headers.
std::string DnnlDescription();
std::string OpenBlasDescription();
// Whether oneDNN runs bf16 on AMX tiles here (its effective ISA includes AMX, i.e. the CPU has it
// and the OS granted it: Note [AMX permission] in cpu_info.cc).
bool DnnlUsesAmx();
// The tuner's knob of whether oneDNN multiplies f32 or bf16 weights in a layout reordered once and
// kept ("prepacked") or as they are ("plain"): Note [oneDNN weights layout].
const tune::Knob& DnnlWeightsKnob(DType dtype);

// Runs `part` on rows [i0, i0 + m) x columns [j0, j0 + n) of p's output, as a Problem of its own
// (operands, output and bias offset), covering the output once: one part on the calling thread
// unless `parallel`, else a grid of parts over the arena (Note [Library threads]). Returns the
// first error.
absl::Status SplitOutput(const Problem& p, bool parallel,
                         absl::FunctionRef<absl::Status(const Problem& part)> part);

}  // namespace dt::ops::cpu::gemm
