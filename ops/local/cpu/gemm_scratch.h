#pragma once
// Internal to the CPU GEMM: reusable per-thread scratch buffers and the shared output epilogue.

#include <cstddef>
#include <cstdint>

#include "dtensor/core/dtype.h"

namespace dt::ops::cpu::gemm {

// The threads a GEMM may split its work over: the current arena's, capped by any
// tbb::global_control (the per-rank budget of Note [One core budget per node], mesh/backends.cc).
int AvailableThreads();

// Which of a thread's cached buffers a ScratchBuffer uses: one per role, so that one thread can
// hold a packed B block, a packed A block (its own or one shared by the tasks) and a C block at once (kQuant: the quantized GEMM's
// activations or dequantized weights, around a float GEMM's own buffers: cpu/qgemm.cc).
enum class ScratchSlot : uint8_t { kPackedB, kPackedA, kSharedA, kC, kX, kQuant, kCount };

// A 64-byte aligned float buffer of at least `floats` elements, taken from the calling thread's
// cache for `slot` and given back on destruction, so that repeated GEMMs neither allocate nor
// fault in fresh pages. A buffer already in use on this thread (a oneTBB worker that, waiting inside
// one GEMM, runs a task of another) or one larger than the cache keeps (kMaxCachedBytes) is
// allocated privately and freed on destruction instead. data() is null when memory ran out.
class ScratchBuffer {
 public:
  static constexpr size_t kMaxCachedBytes = size_t{16} << 20;

  ScratchBuffer(ScratchSlot slot, int64_t floats);
  ~ScratchBuffer();
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;

  float* data() const { return data_; }

 private:
  struct Slot;
  Slot* slot_ = nullptr;  // the cached slot leased, or null when data_ is private
  float* data_ = nullptr;
};

// Finishes rows [0, rows) x columns [0, cols) of a product held in f32 at c (rows ldc apart): adds
// bias[0, cols) (if not null) and stores into out (rows ldo apart) as `dtype`, rounding to nearest
// even for bf16/f16. With dtype f32, c may be out itself (the bias is then added in place).
void FinishRows(int64_t rows, int64_t cols, float* c, int64_t ldc, const float* bias, DType dtype,
                void* out, int64_t ldo);

}  // namespace dt::ops::cpu::gemm
