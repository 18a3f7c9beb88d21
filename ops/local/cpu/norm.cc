// CPU kernels over the last dim: RmsNorm, LayerNorm, ApplyRotary.
//
// Note [Lanes in memory order]
// These kernels work on lanes (rows along the last dim: a hidden state's 512 values, a head's 64)
// and pay per lane what they do not pay per value: finding the lane's operands, a dtype switch,
// a call. With 64-value heads that cost was most of a rotary: computing each lane's offsets by
// division from its flat index (ForEachLane), three conversions into a thread-local buffer and a
// conversion out, about 1.4 ns a value for a bf16 prefill's q on one thread (AMD EPYC Zen 4).
// OrderedLanes visits the lanes in x's memory order (its outer dims sorted by stride, largest
// first) and steps from lane to lane with an odometer (additions, no division); a chunk of lanes
// keeps its f32 buffers for all of them. The order also puts a head dim innermost when the heads
// were split from a projection ([B, S, H, D] viewed as [B, H, S, D]), and cos and sin are
// broadcast over heads (stride 0), so consecutive lanes share the tables' row, which is converted
// once for all of them.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
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

// The lanes of a shape [..., n] (one per index of its outer dims) for N operands' strides, in the
// first operand's memory order (Note [Lanes in memory order]).
template <size_t N>
class OrderedLanes {
 public:
  OrderedLanes(IntSpan shape, const std::array<IntSpan, N>& strides) {
    const int outer = static_cast<int>(shape.size()) - 1;
    std::vector<int> order(static_cast<size_t>(outer));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return strides[0][a] > strides[0][b]; });
    for (int d : order) {
      sizes_.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) strides_[k].push_back(strides[k][d]);
    }
  }

  int64_t count() const { return Numel(sizes_); }

  // fn(offsets) for lanes [lo, hi) of the order, each operand's element offset of its lane.
  template <typename F>
  void Walk(int64_t lo, int64_t hi, F&& fn) const {
    if (lo >= hi) return;
    const int nd = static_cast<int>(sizes_.size());
    std::array<int64_t, N> off = Offsets<N>(lo, sizes_, strides_);
    std::vector<int64_t> idx(static_cast<size_t>(nd));
    for (int64_t i = lo, d = nd - 1; d >= 0; --d) {
      idx[d] = i % sizes_[d];
      i /= sizes_[d];
    }
    for (int64_t lane = lo;;) {
      fn(off);
      if (++lane == hi) return;
      for (int d = nd - 1; d >= 0; --d) {
        if (++idx[d] < sizes_[d]) {
          for (size_t k = 0; k < N; ++k) off[k] += strides_[k][d];
          break;
        }
        idx[d] = 0;
        for (size_t k = 0; k < N; ++k) off[k] -= (sizes_[d] - 1) * strides_[k][d];
      }
    }
  }

 private:
  Shape sizes_;
  std::array<Shape, N> strides_;
};

// For every row of x along its last dim (OrderedLanes), norm(in, out, h) with the row's h values
// in f32 at `in` and the f32 results to write at `out`; rows are converted through buffers of
// their chunk of rows, and an f32 out row is written in place.
template <typename F>
void ForEachRowF32(const Tensor& x, const Tensor& out, F norm) {
  const int last = x.dim() - 1;
  const int64_t h = x.size(last), xs = x.stride(last);
  const OrderedLanes<2> lanes(x.shape(), {IntSpan(x.strides()), IntSpan(out.strides())});
  const bool f32_out = out.dtype() == DType::kF32;
  ParallelFor(lanes.count(), std::max<int64_t>(1, h) * 8, [&](int64_t lo, int64_t hi) {
    std::vector<float> buf(static_cast<size_t>(2 * h));
    lanes.Walk(lo, hi, [&](const std::array<int64_t, 2>& off) {
      LoadF32(x.dtype(), ElementPtr(x, off[0]), h, xs, buf.data());
      float* y = f32_out ? out.data<float>() + off[1] : buf.data() + h;
      norm(buf.data(), y, h);
      if (!f32_out) StoreF32(out.dtype(), ElementPtr(out, off[1]), h, 1, y);
    });
  });
}

// f rounded to bf16 (to nearest even, NaN kept quiet) and widened back: BFloat16(f) bit for bit
// (core/dtype.h), in integer operations the loops below vectorize.
inline float RoundBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u & 0x7fffffffu) > 0x7f800000u ? u | 0x00400000u : u + 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

// y[i] = round(v[i] * r) * w[i] (ops::RmsNorm's two roundings; the last is the store's), the
// first rounding to `dtype` (f32: none); y may be v.
void ScaleRoundWeigh(DType dtype, const float* v, float r, const float* w, float* y, int64_t n) {
  if (dtype == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) y[i] = RoundBf16(v[i] * r) * w[i];
    return;
  }
  for (int64_t i = 0; i < n; ++i) y[i] = v[i] * r;
  if (dtype != DType::kF32) {
    constexpr int64_t kBlock = 256;
    uint16_t half[kBlock];
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t len = std::min(kBlock, n - i);
      StoreF32(dtype, half, len, 1, y + i);
      LoadF32(dtype, half, len, 1, y + i);
    }
  }
  for (int64_t i = 0; i < n; ++i) y[i] *= w[i];
}

// One lane of d values: y from x, c (cos) and s (sin), as ops::ApplyRotary says; f32 arrays, y
// not overlapping the others (which lets the loops vectorize).
void RotaryLane(const float* __restrict x, const float* __restrict c, const float* __restrict s,
                float* __restrict y, int64_t d, RotaryStyle style) {
  if (style == RotaryStyle::kHalf) {
    const int64_t half = d / 2;
    for (int64_t i = 0; i < half; ++i) {
      y[i] = x[i] * c[i] - x[i + half] * s[i];
      y[i + half] = x[i + half] * c[i + half] + x[i] * s[i + half];
    }
  } else {
    for (int64_t i = 0; i < d; i += 2) {
      y[i] = x[i] * c[i] - x[i + 1] * s[i];
      y[i + 1] = x[i + 1] * c[i + 1] + x[i] * s[i + 1];
    }
  }
}

}  // namespace

absl::Status RmsNorm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  const std::vector<float> w = LoadParam(weight);
  ForEachRowF32(x, out, [&](const float* v, float* y, int64_t h) {
    const double ss = SumF64(v, h, [](double a) { return a * a; });
    const float r = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(h)) + eps);
    if (w.empty()) {
      for (int64_t i = 0; i < h; ++i) y[i] = v[i] * r;
    } else {
      ScaleRoundWeigh(x.dtype(), v, r, w.data(), y, h);
    }
  });
  return absl::OkStatus();
}

absl::Status LayerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       const Tensor& out) {
  const std::vector<float> w = LoadParam(weight), b = LoadParam(bias);
  ForEachRowF32(x, out, [&](const float* v, float* out_row, int64_t h) {
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
      out_row[i] = y;
    }
  });
  return absl::OkStatus();
}

absl::Status ApplyRotary(const Tensor& x, const Tensor& cos, const Tensor& sin, RotaryStyle style,
                         const Tensor& out) {
  const int last = x.dim() - 1;
  const int64_t d = x.size(last);
  const OrderedLanes<4> lanes(x.shape(), {IntSpan(x.strides()), IntSpan(cos.strides()),
                                          IntSpan(sin.strides()), IntSpan(out.strides())});
  // f32 lanes of unit stride are read, and an f32 out written, where they lie.
  const bool f32_in = x.dtype() == DType::kF32 && x.stride(last) == 1;
  const bool f32_out = out.dtype() == DType::kF32;
  ParallelFor(lanes.count(), std::max<int64_t>(1, d) * 8, [&](int64_t lo, int64_t hi) {
    std::vector<float> buf(static_cast<size_t>(4 * d));
    float* v = buf.data();
    float* c = v + d;
    float* s = c + d;
    float* y = s + d;
    int64_t c_at = -1, s_at = -1;  // the table rows in c and s (Note [Lanes in memory order])
    lanes.Walk(lo, hi, [&](const std::array<int64_t, 4>& off) {
      if (off[1] != c_at) {
        c_at = off[1];
        LoadF32(cos.dtype(), ElementPtr(cos, c_at), d, cos.stride(last), c);
      }
      if (off[2] != s_at) {
        s_at = off[2];
        LoadF32(sin.dtype(), ElementPtr(sin, s_at), d, sin.stride(last), s);
      }
      const float* in = v;
      if (f32_in) {
        in = x.data<float>() + off[0];
      } else {
        LoadF32(x.dtype(), ElementPtr(x, off[0]), d, x.stride(last), v);
      }
      float* res = f32_out ? out.data<float>() + off[3] : y;
      RotaryLane(in, c, s, res, d, style);
      if (!f32_out) StoreF32(out.dtype(), ElementPtr(out, off[3]), d, 1, res);
    });
  });
  return absl::OkStatus();
}

}  // namespace dt::ops::cpu
