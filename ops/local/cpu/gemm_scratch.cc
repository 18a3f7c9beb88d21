#include "dtensor/ops/local/cpu/gemm_scratch.h"
#include "dtensor/ops/local/cpu/vec_math.h"

#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>


namespace dt::ops::cpu::gemm {

int AvailableThreads() {
  const size_t cap =
      tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism);
  return static_cast<int>(
      std::min<size_t>(static_cast<size_t>(tbb::this_task_arena::max_concurrency()), cap));
}


namespace {

float* AlignedFloats(size_t bytes) {
  return static_cast<float*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
}

}  // namespace

struct ScratchBuffer::Slot {
  float* data = nullptr;
  size_t bytes = 0;
  bool busy = false;
  ~Slot() { std::free(data); }
};

ScratchBuffer::ScratchBuffer(ScratchSlot slot, int64_t floats) {
  thread_local std::array<Slot, static_cast<size_t>(ScratchSlot::kCount)> slots;
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(floats, 1)) * sizeof(float);
  Slot& s = slots[static_cast<size_t>(slot)];
  if (s.busy || bytes > kMaxCachedBytes) {
    data_ = AlignedFloats(bytes);
    return;
  }
  if (s.bytes < bytes) {
    std::free(s.data);
    s.data = AlignedFloats(bytes);
    s.bytes = s.data != nullptr ? bytes : 0;
    if (s.data == nullptr) return;
  }
  s.busy = true;
  slot_ = &s;
  data_ = s.data;
}

ScratchBuffer::~ScratchBuffer() {
  if (slot_ != nullptr) {
    slot_->busy = false;
  } else {
    std::free(data_);
  }
}

void FinishRows(int64_t rows, int64_t cols, float* c, int64_t ldc, const float* bias, DType dtype,
                void* out, int64_t ldo) {
  for (int64_t i = 0; i < rows; ++i) {
    float* ci = c + i * ldc;
    if (bias != nullptr) {
      for (int64_t j = 0; j < cols; ++j) ci[j] += bias[j];
    }
    switch (dtype) {
      case DType::kBF16:
        F32ToBf16(ci, static_cast<uint16_t*>(out) + i * ldo, cols);
        break;
      case DType::kF16: {
        uint16_t* o = static_cast<uint16_t*>(out) + i * ldo;
        for (int64_t j = 0; j < cols; ++j) o[j] = Float16::FromFloat(ci[j]);
        break;
      }
      default: {
        float* o = static_cast<float*>(out) + i * ldo;
        if (o != ci) std::memcpy(o, ci, static_cast<size_t>(cols) * sizeof(float));
      }
    }
  }
}

}  // namespace dt::ops::cpu::gemm
