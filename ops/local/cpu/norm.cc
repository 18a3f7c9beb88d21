// CPU kernels over the last dim: RmsNorm, LayerNorm, ApplyRotary.

#include <cmath>
#include <vector>

#include "dtensor/ops/local/cpu/loops.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::cpu {

namespace {

// v rounded to `dtype` and back (identity for f32).
inline float RoundTo(DType dtype, float v) {
  switch (dtype) {
    case DType::kBF16: return static_cast<float>(BFloat16(v));
    case DType::kF16: return static_cast<float>(Float16(v));
    default: return v;
  }
}

// A [H] parameter as f32 (empty when undefined).
std::vector<float> LoadParam(const Tensor& t) {
  std::vector<float> v;
  if (!t.defined()) return v;
  v.resize(static_cast<size_t>(t.size(0)));
  LoadF32(t.dtype(), t.raw_data(), t.size(0), t.stride(0), v.data());
  return v;
}

}  // namespace

absl::Status RmsNorm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  const int last = x.dim() - 1;
  const int64_t h = x.size(last), xs = x.stride(last);
  const std::vector<float> w = LoadParam(weight);
  ForEachLane<2>(x.shape(), last, {IntSpan(x.strides()), IntSpan(out.strides())},
                 [&](const std::array<int64_t, 2>& off) {
                   thread_local std::vector<float> buf;
                   buf.resize(static_cast<size_t>(h));
                   float* v = buf.data();
                   LoadF32(x.dtype(), ElementPtr(x, off[0]), h, xs, v);
                   double ss = 0;
                   for (int64_t i = 0; i < h; ++i) ss += static_cast<double>(v[i]) * v[i];
                   const float r = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(h)) + eps);
                   for (int64_t i = 0; i < h; ++i) v[i] *= r;
                   if (!w.empty()) {
                     for (int64_t i = 0; i < h; ++i) v[i] = w[i] * RoundTo(x.dtype(), v[i]);
                   }
                   StoreF32(out.dtype(), ElementPtr(out, off[1]), h, 1, v);
                 });
  return absl::OkStatus();
}

absl::Status LayerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       const Tensor& out) {
  const int last = x.dim() - 1;
  const int64_t h = x.size(last), xs = x.stride(last);
  const std::vector<float> w = LoadParam(weight), b = LoadParam(bias);
  ForEachLane<2>(x.shape(), last, {IntSpan(x.strides()), IntSpan(out.strides())},
                 [&](const std::array<int64_t, 2>& off) {
                   thread_local std::vector<float> buf;
                   buf.resize(static_cast<size_t>(h));
                   float* v = buf.data();
                   LoadF32(x.dtype(), ElementPtr(x, off[0]), h, xs, v);
                   double sum = 0;
                   for (int64_t i = 0; i < h; ++i) sum += v[i];
                   const float mean = static_cast<float>(sum / static_cast<double>(h));
                   double ss = 0;
                   for (int64_t i = 0; i < h; ++i) ss += static_cast<double>(v[i] - mean) * (v[i] - mean);
                   const float rstd = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(h)) + eps);
                   for (int64_t i = 0; i < h; ++i) {
                     float y = (v[i] - mean) * rstd;
                     if (!w.empty()) y *= w[i];
                     if (!b.empty()) y += b[i];
                     v[i] = y;
                   }
                   StoreF32(out.dtype(), ElementPtr(out, off[1]), h, 1, v);
                 });
  return absl::OkStatus();
}

absl::Status ApplyRotary(const Tensor& x, const Tensor& cos, const Tensor& sin, RotaryStyle style,
                         const Tensor& out) {
  const int last = x.dim() - 1;
  const int64_t d = x.size(last), half = d / 2;
  ForEachLane<4>(x.shape(), last,
                 {IntSpan(x.strides()), IntSpan(cos.strides()), IntSpan(sin.strides()),
                  IntSpan(out.strides())},
                 [&](const std::array<int64_t, 4>& off) {
                   thread_local std::vector<float> buf;
                   buf.resize(static_cast<size_t>(4 * d));
                   float* v = buf.data();
                   float* c = v + d;
                   float* s = c + d;
                   float* y = s + d;
                   LoadF32(x.dtype(), ElementPtr(x, off[0]), d, x.stride(last), v);
                   LoadF32(cos.dtype(), ElementPtr(cos, off[1]), d, cos.stride(last), c);
                   LoadF32(sin.dtype(), ElementPtr(sin, off[2]), d, sin.stride(last), s);
                   if (style == RotaryStyle::kHalf) {
                     for (int64_t i = 0; i < half; ++i) {
                       y[i] = v[i] * c[i] - v[i + half] * s[i];
                       y[i + half] = v[i + half] * c[i + half] + v[i] * s[i + half];
                     }
                   } else {
                     for (int64_t i = 0; i < d; i += 2) {
                       y[i] = v[i] * c[i] - v[i + 1] * s[i];
                       y[i + 1] = v[i + 1] * c[i + 1] + v[i] * s[i + 1];
                     }
                   }
                   StoreF32(out.dtype(), ElementPtr(out, off[3]), d, 1, y);
                 });
  return absl::OkStatus();
}

}  // namespace dt::ops::cpu
