// CUDA kernels over the last dim: RmsNorm, LayerNorm (one lane per row, statistics in f64 as in the
// CPU reference) and ApplyRotary (one thread per output element).

#include "dtensor/ops/local/cuda/cuda_util.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::cuda {

namespace {

struct Plus {
  __device__ double operator()(double a, double b) const { return a + b; }
};

// A [H] parameter: pointer and stride, or null.
template <typename T>
struct Param {
  const T* p = nullptr;
  int64_t stride = 0;
};

template <typename T>
Param<T> ParamOf(const Tensor& t) {
  if (!t.defined()) return {};
  return {static_cast<const T*>(t.raw_data()), t.stride(0)};
}

// Rows of x [..., H]: n = x * rsqrt(mean(x²) + eps) in f32; with a weight, w * round(n), rounded
// again on store (see ops::RmsNorm).
// With `vec`, rows are read and written with 16-byte vectors (VectorLanes).
template <typename T>
__global__ void RmsNormKernel(const T* x, Param<T> w, float eps, T* out, LaneIndexer<2> li,
                              bool vec) {
  constexpr int kV = kVec<T>;
  __shared__ double smem[8];
  const int64_t h = li.n, xs = li.lane_stride[0], os = li.lane_stride[1];
  ForEachLane(li, x, out, [&](const T* v, T* o) {
    double ss = 0;
    if (vec) {
      for (int64_t j = threadIdx.x * kV; j < h; j += blockDim.x * kV) {
        float e[kV];
        LoadVec(v + j, e);
#pragma unroll
        for (int u = 0; u < kV; ++u) ss += static_cast<double>(e[u]) * e[u];
      }
    } else {
      for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
        const float e = Load(v[j * xs]);
        ss += static_cast<double>(e) * e;
      }
    }
    ss = LaneReduce(ss, Plus{}, smem);
    const float r = 1.0f / sqrtf(static_cast<float>(ss / static_cast<double>(h)) + eps);
    auto normed = [&](float e, int64_t j) {
      const float y = e * r;
      return w.p != nullptr ? Load(w.p[j * w.stride]) * RoundTo<T>(y) : y;
    };
    if (vec) {
      for (int64_t j = threadIdx.x * kV; j < h; j += blockDim.x * kV) {
        float e[kV];
        LoadVec(v + j, e);
#pragma unroll
        for (int u = 0; u < kV; ++u) e[u] = normed(e[u], j + u);
        StoreVec(o + j, e);
      }
    } else {
      for (int64_t j = threadIdx.x; j < h; j += blockDim.x)
        o[j * os] = Store<T>(normed(Load(v[j * xs]), j));
    }
  });
}

// Rows of x [..., H]: (x - mean) / sqrt(var + eps) * w + b with the biased variance, rounded once.
template <typename T>
__global__ void LayerNormKernel(const T* x, Param<T> w, Param<T> b, float eps, T* out,
                                LaneIndexer<2> li) {
  __shared__ double smem[8];
  const int64_t h = li.n, xs = li.lane_stride[0], os = li.lane_stride[1];
  ForEachLane(li, x, out, [&](const T* v, T* o) {
    double sum = 0;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) sum += Load(v[j * xs]);
    sum = LaneReduce(sum, Plus{}, smem);
    const float mean = static_cast<float>(sum / static_cast<double>(h));
    double ss = 0;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
      const float d = Load(v[j * xs]) - mean;
      ss += static_cast<double>(d) * d;
    }
    ss = LaneReduce(ss, Plus{}, smem);
    const float rstd = 1.0f / sqrtf(static_cast<float>(ss / static_cast<double>(h)) + eps);
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
      float y = (Load(v[j * xs]) - mean) * rstd;
      if (w.p != nullptr) y *= Load(w.p[j * w.stride]);
      if (b.p != nullptr) y += Load(b.p[j * b.stride]);
      o[j * os] = Store<T>(y);
    }
  });
}

// A cos/sin table expanded to x's shape, in any float dtype.
struct Table {
  const void* p;
  DType dtype;
  int64_t last_stride;
};

// out (rows of d with unit stride) from x, cos, sin; `ix` gives the row offsets of x, cos, sin
// and out.
template <typename T>
__global__ void RotaryKernel(const T* x, int64_t xs, Table c, Table s, T* out, Indexer<4> ix,
                             int64_t d, bool interleaved, int64_t n) {
  const int64_t half = d / 2;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / d, j = i - row * d;
    int64_t off[4];
    ix.Offsets(row, off);
    // y[j] = x[j] * cos[j] + sign * x[partner] * sin[j]
    int64_t partner;
    float sign;
    if (interleaved) {
      partner = (j % 2 == 0) ? j + 1 : j - 1;
      sign = (j % 2 == 0) ? -1.0f : 1.0f;
    } else {
      partner = j < half ? j + half : j - half;
      sign = j < half ? -1.0f : 1.0f;
    }
    const float v = Load(x[off[0] + j * xs]), p = Load(x[off[0] + partner * xs]);
    const float cv = LoadAnyFloat(c.p, c.dtype, off[1] + j * c.last_stride);
    const float sv = LoadAnyFloat(s.p, s.dtype, off[2] + j * s.last_stride);
    out[off[3] + j] = Store<T>(sign < 0 ? v * cv - p * sv : v * cv + p * sv);
  }
}

// The rows of x along its last dim (out's offsets alongside) and how to launch over them.
struct Rows {
  LaneIndexer<2> li;
  LaneLaunch launch;
};
absl::StatusOr<Rows> RowsOf(absl::string_view kernel, const Tensor& x, const Tensor& out) {
  DT_RETURN_IF_ERROR(UseDevice(out, kernel));
  const int last = x.dim() - 1;
  DT_ASSIGN_OR_RETURN(
      LaneIndexer<2> li,
      MakeLaneIndexer<2>(kernel, x.shape(), last, {IntSpan(x.strides()), IntSpan(out.strides())}));
  const LaneLaunch launch = ChooseLaneLaunch(li.lanes, li.n, x.stride(last) == 1);
  return Rows{li, launch};
}

}  // namespace

absl::Status RmsNorm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  constexpr absl::string_view kKernel = "RmsNorm";
  DT_ASSIGN_OR_RETURN(const Rows r, RowsOf(kKernel, x, out));
  return DT_CUDA_DISPATCH_FLOAT(x.dtype(), T, [&] {
    return Launch(kKernel, RmsNormKernel<T>, r.launch.grid, r.launch.block, 0, x.raw_data(),
                  ParamOf<T>(weight), eps, out.raw_data(), r.li, VectorLanes(x, x.dim() - 1));
  });
}

absl::Status LayerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       const Tensor& out) {
  constexpr absl::string_view kKernel = "LayerNorm";
  DT_ASSIGN_OR_RETURN(const Rows r, RowsOf(kKernel, x, out));
  return DT_CUDA_DISPATCH_FLOAT(x.dtype(), T, [&] {
    return Launch(kKernel, LayerNormKernel<T>, r.launch.grid, r.launch.block, 0, x.raw_data(),
                  ParamOf<T>(weight), ParamOf<T>(bias), eps, out.raw_data(), r.li);
  });
}

absl::Status ApplyRotary(const Tensor& x, const Tensor& cos, const Tensor& sin, RotaryStyle style,
                         const Tensor& out) {
  constexpr absl::string_view kKernel = "ApplyRotary";
  DT_RETURN_IF_ERROR(UseDevice(out, kKernel));
  const int last = x.dim() - 1;
  const IntSpan rows(x.shape().data(), static_cast<size_t>(last));
  DT_ASSIGN_OR_RETURN(Indexer<4> ix, MakeIndexer<4>(kKernel, rows,
                                                    {IntSpan(x.strides()).subspan(0, last),
                                                     IntSpan(cos.strides()).subspan(0, last),
                                                     IntSpan(sin.strides()).subspan(0, last),
                                                     IntSpan(out.strides()).subspan(0, last)}));
  const int64_t n = out.numel(), d = x.size(last);
  const Table c{cos.raw_data(), cos.dtype(), cos.stride(last)};
  const Table s{sin.raw_data(), sin.dtype(), sin.stride(last)};
  return DT_CUDA_DISPATCH_FLOAT(x.dtype(), T, [&] {
    return Launch(kKernel, RotaryKernel<T>, GridFor(n, 256), 256, 0, x.raw_data(), x.stride(last),
                  c, s, out.raw_data(), ix, d, style == RotaryStyle::kInterleaved, n);
  });
}

}  // namespace dt::ops::cuda
