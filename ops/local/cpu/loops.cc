#include "dtensor/ops/local/cpu/loops.h"
#include "dtensor/ops/local/cpu/vec_math.h"

namespace dt::ops::cpu {

void LoadF32(DType dtype, const void* p, int64_t n, int64_t stride, float* dst) {
  DT_OPS_DISPATCH_FLOAT(dtype, T, [&] {
    const T* src = static_cast<const T*>(p);
    if (stride == 1) {
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i * stride]);
    }
  });
}

void StoreF32(DType dtype, void* p, int64_t n, int64_t stride, const float* src) {
  if (dtype == DType::kBF16 && stride == 1) return F32ToBf16(src, static_cast<uint16_t*>(p), n);
  DT_OPS_DISPATCH_FLOAT(dtype, T, [&] {
    T* dst = static_cast<T*>(p);
    if (stride == 1) {
      for (int64_t i = 0; i < n; ++i) dst[i] = Store<T>(src[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) dst[i * stride] = Store<T>(src[i]);
    }
  });
}

}  // namespace dt::ops::cpu
