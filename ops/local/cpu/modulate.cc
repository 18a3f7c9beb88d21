// CPU kernel of ops::Modulate: x * (1 + scale) + shift, rounded after each step.
//
// Note [Modulate rounds every step]
// Modulate must equal the three ops it fuses bit for bit (diffusers computes them separately), so
// the product is rounded before the shift is added. A compiler that contracts `x * f + shift`
// into one fused multiply-add skips that rounding (in f32, where the explicit round is a no-op),
// so this file is compiled with -ffp-contract=off (ops/local/CMakeLists.txt); the CUDA kernel uses
// the non-contracting __fmul_rn/__fadd_rn.

#include "dtensor/ops/local/cpu/loops.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::cpu {

absl::Status Modulate(const Tensor& x, const Tensor& scale, const Tensor& shift, const Tensor& out) {
  DT_OPS_DISPATCH_FLOAT(out.dtype(), T, [&] {
    // The rounding of each of the three ops this fuses (see ops::Modulate).
    auto round = [](float v) { return static_cast<float>(Load(Store<T>(v))); };
    Nest<4> nest(out.shape(), {IntSpan(out.strides()), IntSpan(x.strides()),
                               IntSpan(scale.strides()), IntSpan(shift.strides())});
    T* po = out.data<T>();
    const T* px = x.data<T>();
    const T* pa = scale.data<T>();
    const T* pb = shift.data<T>();
    const int64_t so = nest.inner_stride(0), sx = nest.inner_stride(1);
    const int64_t sa = nest.inner_stride(2), sb = nest.inner_stride(3);
    nest.ForEachRun([&](const std::array<int64_t, 4>& off, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const float f = round(1.0f + static_cast<float>(Load(pa[off[2] + i * sa])));
        const float p = round(static_cast<float>(Load(px[off[1] + i * sx])) * f);
        po[off[0] + i * so] = Store<T>(p + static_cast<float>(Load(pb[off[3] + i * sb])));
      }
    });
  });
  return absl::OkStatus();
}

}  // namespace dt::ops::cpu
