// CPU kernels over the last dim: RmsNorm, LayerNorm, ApplyRotary.

#include <array>
#include <cmath>
#include <vector>

#include "dtensor/ops/local/cpu/loops.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::cpu {

namespace {

// A [H] parameter as f32 (empty when undefined).
std::vector<float> LoadParam(const Tensor& t) {
  std::vector<float> v;
  if (!t.defined()) return v;
  v.resize(static_cast<size_t>(t.size(0)));
  LoadF32(t.dtype(), t.raw_data(), t.size(0), t.stride(0), v.data());
  return v;
}

// Sums over v[0, n) in double, as 8 interleaved partial sums: the compiler vectorizes the 8 lanes
// without reassociating anything (f32 products are exact in double).
template <typename F>
inline double SumF64(const float* v, int64_t n, F term) {
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += term(static_cast<double>(v[i + j]));
  }
  for (; i < n; ++i) acc[i % 8] += term(static_cast<double>(v[i]));
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// For every row of x along its last dim: the row's h values in f32 (a per-thread buffer), which
// norm(v, h) rewrites in place, stored into the same row of out.
template <typename F>
void ForEachRowF32(const Tensor& x, const Tensor& out, F norm) {
  const int last = x.dim() - 1;
  const int64_t h = x.size(last), xs = x.stride(last);
  ForEachLane<2>(x.shape(), last, {IntSpan(x.strides()), IntSpan(out.strides())},
                 [&](const std::array<int64_t, 2>& off) {
                   thread_local std::vector<float> buf;
                   buf.resize(static_cast<size_t>(h));
                   float* v = buf.data();
                   LoadF32(x.dtype(), ElementPtr(x, off[0]), h, xs, v);
                   norm(v, h);
                   StoreF32(out.dtype(), ElementPtr(out, off[1]), h, 1, v);
                 });
}

}  // namespace

absl::Status RmsNorm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  const std::vector<float> w = LoadParam(weight);
  ForEachRowF32(x, out, [&](float* v, int64_t h) {
    const double ss = SumF64(v, h, [](double a) { return a * a; });
    const float r = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(h)) + eps);
    for (int64_t i = 0; i < h; ++i) v[i] *= r;
    if (!w.empty()) {
      // The normalized x rounded to its dtype, then times the weight (ops::RmsNorm).
      if (x.dtype() != DType::kF32) {
        thread_local std::vector<uint16_t> half;
        half.resize(static_cast<size_t>(h));
        StoreF32(x.dtype(), half.data(), h, 1, v);
        LoadF32(x.dtype(), half.data(), h, 1, v);
      }
      for (int64_t i = 0; i < h; ++i) v[i] *= w[i];
    }
  });
  return absl::OkStatus();
}

absl::Status LayerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       const Tensor& out) {
  const std::vector<float> w = LoadParam(weight), b = LoadParam(bias);
  ForEachRowF32(x, out, [&](float* v, int64_t h) {
    const double sum = SumF64(v, h, [](double a) { return a; });
    const float mean = static_cast<float>(sum / static_cast<double>(h));
    // (v - mean) in f32 first, as before: the same deviations, summed in double.
    const double ss = SumF64(v, h, [mean](double a) {
      const double d = static_cast<float>(a) - mean;
      return d * d;
    });
    const float rstd = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(h)) + eps);
    for (int64_t i = 0; i < h; ++i) {
      float y = (v[i] - mean) * rstd;
      if (!w.empty()) y *= w[i];
      if (!b.empty()) y += b[i];
      v[i] = y;
    }
  });
  return absl::OkStatus();
}

namespace {

// One lane of d values (unit strides): y from x, c (cos) and s (sin), as ops::ApplyRotary says,
// loaded and stored as their types (the loops vectorize; no per-lane buffer or dtype switch).
template <typename T, typename C>
void RotaryLane(const T* x, const C* c, const C* s, T* y, int64_t d, RotaryStyle style) {
  if (style == RotaryStyle::kHalf) {
    const int64_t half = d / 2;
    for (int64_t i = 0; i < half; ++i) {
      const float a = Load(x[i]), b = Load(x[i + half]);
      y[i] = Store<T>(a * Load(c[i]) - b * Load(s[i]));
      y[i + half] = Store<T>(b * Load(c[i + half]) + a * Load(s[i + half]));
    }
  } else {
    for (int64_t i = 0; i < d; i += 2) {
      const float a = Load(x[i]), b = Load(x[i + 1]);
      y[i] = Store<T>(a * Load(c[i]) - b * Load(s[i]));
      y[i + 1] = Store<T>(b * Load(c[i + 1]) + a * Load(s[i + 1]));
    }
  }
}

}  // namespace

absl::Status ApplyRotary(const Tensor& x, const Tensor& cos, const Tensor& sin, RotaryStyle style,
                         const Tensor& out) {
  const int last = x.dim() - 1;
  const int64_t d = x.size(last);
  const std::array<IntSpan, 4> strides = {IntSpan(x.strides()), IntSpan(cos.strides()),
                                          IntSpan(sin.strides()), IntSpan(out.strides())};
  if (x.stride(last) == 1 && cos.stride(last) == 1 && sin.stride(last) == 1 &&
      cos.dtype() == sin.dtype()) {
    // Every lane of unit stride: typed lanes. out's last stride is 1 (the kernel contract).
    DT_OPS_DISPATCH_FLOAT(x.dtype(), T, [&] {
      DT_OPS_DISPATCH_FLOAT(cos.dtype(), C, [&] {
        const T* px = x.data<T>();
        const C* pc = cos.data<C>();
        const C* ps = sin.data<C>();
        T* py = out.data<T>();
        ForEachLane<4>(x.shape(), last, strides, [&](const std::array<int64_t, 4>& off) {
          RotaryLane(px + off[0], pc + off[1], ps + off[2], py + off[3], d, style);
        });
      });
    });
    return absl::OkStatus();
  }
  // Strided lanes or tables of two dtypes: through f32 buffers.
  ForEachLane<4>(x.shape(), last, strides, [&](const std::array<int64_t, 4>& off) {
    thread_local std::vector<float> buf;
    buf.resize(static_cast<size_t>(4 * d));
    float* v = buf.data();
    float* c = v + d;
    float* s = c + d;
    float* y = s + d;
    LoadF32(x.dtype(), ElementPtr(x, off[0]), d, x.stride(last), v);
    LoadF32(cos.dtype(), ElementPtr(cos, off[1]), d, cos.stride(last), c);
    LoadF32(sin.dtype(), ElementPtr(sin, off[2]), d, sin.stride(last), s);
    RotaryLane(v, c, s, y, d, style);
    StoreF32(out.dtype(), ElementPtr(out, off[3]), d, 1, y);
  });
  return absl::OkStatus();
}

}  // namespace dt::ops::cpu
