// CPU Matmul kernel: one GEMM per matrix of the batch on the backend the dispatcher picks (own
// kernels, skinny (M <= 8) or packed; oneDNN; OpenBLAS), spread over the cores with oneTBB.
//
// Note [Own GEMM kernels]
// Matmul hands each product to one of three backends (Note [GEMM dispatch] in gemm_dispatch.cc):
// oneDNN, OpenBLAS, or our own kernels (gemm_kernels.cc: AVX-512, AVX2 or plain C++, picked at run
// time; gemm_packed.cc for M > 8, gemm_skinny.cc for M <= 8). Ours are there because neither
// library covers what they do:
//   - bf16 and f16 everywhere. Debian's OpenBLAS 0.3.21 has no sbgemm and oneDNN no f16 GEMM on
//     these CPUs; our kernels use bf16 dot products or widen on the way (Note [bf16 GEMM]).
//   - Decode. M <= 8 products are bound by reading the weights, which must be read once, in place,
//     bf16 widened in registers (Note [Skinny GEMM]).
//   - CPUs a library does not know. OpenBLAS 0.3.21 does not recognise Zen 5 (family 0x1A) and
//     runs its Haswell AVX2 kernels, half the AVX-512 peak, unless the process sets
//     OPENBLAS_CORETYPE, which a library cannot do for its user (build-environment.md §4).
// bench_gemm keeps all three side by side, at equal threads.
//
// Note [bf16 GEMM]
// bf16 and f16 operands are never copied to f32 as a whole. Where the CPU has AVX512_BF16, bf16
// products run on vdpbf16ps, which multiplies bf16 pairs exactly and accumulates in f32 (Note [bf16
// dot products] in gemm_kernels.cc): the packed GEMM packs bf16 pairs, the skinny one reads x and
// the weights as they are. Otherwise (and for f16) operands are widened to f32 as the GEMM reads
// them (while packing, or in registers in the skinny kernels) and multiplied with f32 FMAs. Either
// way the f32 sum plus bias is rounded once (to nearest even), so a bf16 product costs at most what
// an f32 one does (about half of it with AVX512_BF16). Eigen's own bfloat16 GEMM has no SIMD kernel
// (about 6x slower than f32) and accumulates in bf16 (relative errors up to 3e-1 at K=1024;
// shared/reference/build-environment.md §4), and Debian's OpenBLAS has no bf16 GEMM.
//
// Note [GEMM threading]
// Each GEMM spreads its own work over the oneTBB arena (output row blocks x column chunks for the
// packed GEMM, column chunks for the skinny one: see their Notes). A batch of products whose
// matrices are small (under kInnerParallelFlops each) and at least as many as the threads runs one
// product per task instead, each single-threaded.


#include <algorithm>
#include <mutex>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "dtensor/ops/local/cpu/gemm_dispatch.h"
#include "dtensor/ops/local/cpu/gemm_paths.h"
#include "dtensor/ops/local/cpu/gemm_scratch.h"

#include "dtensor/ops/local/cpu/loops.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::cpu {

namespace {

// A product below this many flops runs on one thread.
constexpr double kMinParallelFlops = 4e6;
// A batch of products each below this many flops, and at least as many as threads, runs one
// product per task.
constexpr double kInnerParallelFlops = 1e8;

}  // namespace

absl::Status Matmul(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out) {
  const int nd = out.dim();
  const int64_t m = out.size(-2), n = out.size(-1), k = a.size(-1);
  const IntSpan batch(out.shape().data(), static_cast<size_t>(nd - 2));
  const int64_t batches = Numel(batch);
  const int64_t size = DTypeSize(out.dtype());

  std::vector<float> bias32;
  if (bias.defined()) {
    bias32.resize(static_cast<size_t>(n));
    LoadF32(bias.dtype(), bias.raw_data(), n, 1, bias32.data());
  }
  DT_ASSIGN_OR_RETURN(const gemm::Backend backend, gemm::Choose(out.dtype(), m, n, k));
  const gemm::Kernels& kernels = gemm::KernelsFor(gemm::ActiveIsa());
  const bool skinny = m <= gemm::kSkinnyMaxRows;
  const std::array<Shape, 3> bstrides = {Shape(a.strides().begin(), a.strides().end() - 2),
                                         Shape(b.strides().begin(), b.strides().end() - 2),
                                         Shape(out.strides().begin(), out.strides().end() - 2)};
  auto problem = [&](int64_t bi) {
    const std::array<int64_t, 3> off = Offsets<3>(bi, batch, bstrides);
    gemm::Problem p;
    p.m = m;
    p.n = n;
    p.k = k;
    p.dtype = out.dtype();
    p.a = static_cast<const char*>(a.raw_data()) + off[0] * size;
    p.a_rs = a.stride(-2);
    p.a_cs = a.stride(-1);
    p.b = static_cast<const char*>(b.raw_data()) + off[1] * size;
    p.b_rs = b.stride(-2);
    p.b_cs = b.stride(-1);
    p.out = static_cast<char*>(out.raw_data()) + off[2] * size;
    p.ldo = out.stride(-2);
    p.bias = bias32.empty() ? nullptr : bias32.data();
    return p;
  };
  auto run = [&](int64_t bi, bool parallel) {
    const gemm::Problem p = problem(bi);
    switch (backend) {
      // A read-only b never changes: oneDNN may keep its layout (Note [oneDNN weights layout]).
      case gemm::Backend::kDnnl: return gemm::RunDnnl(p, parallel, b.read_only() ? &b.storage() : nullptr);
      case gemm::Backend::kOpenBlas: return gemm::RunOpenBlas(p, parallel);
      case gemm::Backend::kOwn: break;
    }
    return skinny ? gemm::Skinny(p, kernels, parallel) : gemm::Packed(p, kernels, parallel);
  };

  const int threads = gemm::AvailableThreads();
  const double flops = 2.0 * static_cast<double>(m) * n * k;
  if (batches > 1 && batches >= threads && flops < kInnerParallelFlops &&
      flops * batches > kMinParallelFlops) {
    std::mutex mu;
    absl::Status status;
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, batches, 1),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        for (int64_t bi = r.begin(); bi != r.end(); ++bi) {
                          absl::Status s = run(bi, false);
                          if (!s.ok()) {
                            std::lock_guard<std::mutex> lock(mu);
                            status.Update(s);
                          }
                        }
                      });
    return status;
  }
  // The skinny GEMM decides by the bytes of weights it reads (Note [Skinny GEMM]).
  const bool parallel = skinny || flops > kMinParallelFlops;
  for (int64_t bi = 0; bi < batches; ++bi) DT_RETURN_IF_ERROR(run(bi, parallel));
  return absl::OkStatus();
}

}  // namespace dt::ops::cpu
