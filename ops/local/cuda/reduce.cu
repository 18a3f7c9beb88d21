// CUDA kernels along one dim: Reduce and Softmax. Each lane (a position of every other dim) is
// handled by 1, 32 or 256 threads (ChooseLaneLaunch); partial results combine with LaneReduce.
// Float sums accumulate in f64 like the CPU reference; Max/Argmax order NaN above every number and
// break ties by the lower index, which makes the parallel combine match the CPU's left-to-right
// scan exactly.

#include <climits>
#include <limits>

#include "dtensor/ops/local/cuda/cuda_util.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::cuda {

namespace {

template <typename C>
__device__ __forceinline__ bool IsNan(C v) {
  if constexpr (std::is_floating_point_v<C>) {
    return isnan(v);
  } else {
    return false;
  }
}

// Below or equal to every value of C (NaN aside).
template <typename C>
constexpr C kLowest = std::is_floating_point_v<C> ? -std::numeric_limits<C>::infinity()
                                                  : std::numeric_limits<C>::lowest();

// A candidate maximum: NaN beats every number, then the larger value, then the lower index.
template <typename C>
struct Best {
  C v;
  int64_t i;

  __device__ static Best Worst() { return {kLowest<C>, LLONG_MAX}; }
  __device__ static Best ShflXor(const Best& b, int mask) {
    return {ShflXorValue(b.v, mask), __shfl_xor_sync(0xffffffffu, b.i, mask)};
  }
  __device__ static C ShflXorValue(C v, int mask) {
    if constexpr (sizeof(C) < 4) {
      return static_cast<C>(__shfl_xor_sync(0xffffffffu, static_cast<int>(v), mask));
    } else {
      return __shfl_xor_sync(0xffffffffu, v, mask);
    }
  }
};

template <typename C>
struct BetterOf {
  __device__ Best<C> operator()(const Best<C>& a, const Best<C>& b) const {
    const bool an = IsNan(a.v), bn = IsNan(b.v);
    if (an != bn) return an ? a : b;
    if (!an && a.v != b.v) return a.v > b.v ? a : b;
    return a.i <= b.i ? a : b;
  }
};

struct Plus {
  template <typename V>
  __device__ V operator()(V a, V b) const {
    return a + b;
  }
};
struct MaxF {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Room for LaneReduce's per-warp partials (8 per lane row; only blocks with one lane row use it).
#define DT_LANE_SMEM(type, name) __shared__ type name[8]

template <typename T>
__global__ void ReduceKernel(Reduction op, const T* x, void* out, LaneIndexer<2> li) {
  using C = Compute<T>;
  DT_LANE_SMEM(double, smem_f);
  DT_LANE_SMEM(unsigned long long, smem_i);
  DT_LANE_SMEM(Best<C>, smem_b);
  const int64_t n = li.n, xs = li.lane_stride[0];
  ForEachLane(li, [&](const int64_t* off) {
    const T* v = x + off[0];
    if (op == Reduction::kSum || op == Reduction::kMean) {
      if constexpr (kIsFloat<T>) {
        double acc = 0;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
          acc += static_cast<double>(Load(v[j * xs]));
        acc = LaneReduce(acc, Plus{}, smem_f);
        if (op == Reduction::kMean) acc /= static_cast<double>(n);
        if (threadIdx.x == 0) static_cast<T*>(out)[off[1]] = Store<T>(static_cast<float>(acc));
      } else {
        unsigned long long acc = 0;  // wraps
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
          acc += static_cast<unsigned long long>(static_cast<int64_t>(v[j * xs]));
        }
        acc = LaneReduce(acc, Plus{}, smem_i);
        if (threadIdx.x == 0) static_cast<int64_t*>(out)[off[1]] = static_cast<int64_t>(acc);
      }
    } else {
      Best<C> best = Best<C>::Worst();
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        best = BetterOf<C>{}(best, Best<C>{Load(v[j * xs]), j});
      }
      best = LaneReduce(best, BetterOf<C>{}, smem_b);
      if (threadIdx.x == 0) {
        if (op == Reduction::kMax) {
          static_cast<T*>(out)[off[1]] = Store<T>(best.v);
        } else {
          static_cast<int64_t*>(out)[off[1]] = best.i;
        }
      }
    }
  });
}

template <typename T>
__global__ void SoftmaxKernel(const T* x, T* out, bool log, LaneIndexer<2> li) {
  DT_LANE_SMEM(float, smem);
  const int64_t n = li.n, xs = li.lane_stride[0], os = li.lane_stride[1];
  ForEachLane(li, x, out, [&](const T* v, T* o) {
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, Load(v[j * xs]));
    mx = LaneReduce(mx, MaxF{}, smem);
    float sum = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += expf(Load(v[j * xs]) - mx);
    sum = LaneReduce(sum, Plus{}, smem);
    if (log) {
      const float shift = mx + logf(sum);
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        o[j * os] = Store<T>(Load(v[j * xs]) - shift);
    } else {
      const float inv = 1.0f / sum;
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        o[j * os] = Store<T>(expf(Load(v[j * xs]) - mx) * inv);
      }
    }
  });
}

}  // namespace

absl::Status Reduce(Reduction op, const Tensor& x, int dim, const Tensor& out) {
  constexpr absl::string_view kKernel = "Reduce";
  DT_RETURN_IF_ERROR(UseDevice(out, kKernel));
  const Shape ostr = StridesWithDim(out, dim);
  DT_ASSIGN_OR_RETURN(LaneIndexer<2> li, MakeLaneIndexer<2>(kKernel, x.shape(), dim,
                                                            {IntSpan(x.strides()), IntSpan(ostr)}));
  const LaneLaunch l = ChooseLaneLaunch(li.lanes, li.n, x.stride(dim) == 1);
  return DT_CUDA_DISPATCH_NUMERIC(x.dtype(), T, [&] {
    return Launch(kKernel, ReduceKernel<T>, l.grid, l.block, 0, op, x.raw_data(), out.raw_data(),
                  li);
  });
}

absl::Status Softmax(const Tensor& x, int dim, bool log, const Tensor& out) {
  constexpr absl::string_view kKernel = "Softmax";
  DT_RETURN_IF_ERROR(UseDevice(out, kKernel));
  DT_ASSIGN_OR_RETURN(
      LaneIndexer<2> li,
      MakeLaneIndexer<2>(kKernel, x.shape(), dim, {IntSpan(x.strides()), IntSpan(out.strides())}));
  const LaneLaunch l = ChooseLaneLaunch(li.lanes, li.n, x.stride(dim) == 1);
  return DT_CUDA_DISPATCH_FLOAT(x.dtype(), T, [&] {
    return Launch(kKernel, SoftmaxKernel<T>, l.grid, l.block, 0, x.raw_data(), out.raw_data(), log,
                  li);
  });
}

}  // namespace dt::ops::cuda
