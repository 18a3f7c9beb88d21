// CPU kernels along one dim: Reduce, Softmax, TopK.

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "dtensor/ops/local/cpu/loops.h"
#include "dtensor/ops/local/cpu/vec_math.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::cpu {

namespace {

// Strides of `out` (which lacks `dim`) as strides over the full shape, 0 at `dim`.
Shape StridesWithDim(const Tensor& out, int dim) {
  Shape s = out.strides();
  s.insert(s.begin() + dim, 0);
  return s;
}

template <typename K>
inline bool IsNan(K v) {
  if constexpr (std::is_floating_point_v<K>) {
    return std::isnan(v);
  } else {
    return false;
  }
}

// a > b with NaN above every number (and NaN == NaN).
template <typename K>
inline bool Greater(K a, K b) {
  if (IsNan(a)) return !IsNan(b);
  if (IsNan(b)) return false;
  return a > b;
}

template <typename T>
void ReduceLane(Reduction op, const T* v, int64_t n, int64_t st, char* out) {
  using C = Compute<T>;
  switch (op) {
    case Reduction::kSum:
    case Reduction::kMean:
      if constexpr (kIsFloat<T>) {
        double acc = 0;
        for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(Load(v[i * st]));
        if (op == Reduction::kMean) acc /= static_cast<double>(n);
        *reinterpret_cast<T*>(out) = Store<T>(static_cast<float>(acc));
      } else {
        uint64_t acc = 0;  // wraps
        for (int64_t i = 0; i < n; ++i) acc += static_cast<uint64_t>(static_cast<int64_t>(v[i * st]));
        *reinterpret_cast<int64_t*>(out) = static_cast<int64_t>(acc);
      }
      return;
    case Reduction::kMax:
    case Reduction::kArgmax: {
      C best = Load(v[0]);
      int64_t best_i = 0;
      for (int64_t i = 1; i < n && !IsNan(best); ++i) {
        const C x = Load(v[i * st]);
        if (Greater(x, best)) {
          best = x;
          best_i = i;
        }
      }
      if (op == Reduction::kMax) {
        *reinterpret_cast<T*>(out) = Store<T>(best);
      } else {
        *reinterpret_cast<int64_t*>(out) = best_i;
      }
      return;
    }
  }
}

}  // namespace

absl::Status Reduce(Reduction op, const Tensor& x, int dim, const Tensor& out) {
  const Shape ostr = StridesWithDim(out, dim);
  const int64_t n = x.size(dim), st = x.stride(dim), osz = DTypeSize(out.dtype());
  DT_OPS_DISPATCH_NUMERIC(x.dtype(), T, [&] {
    const T* px = x.data<T>();
    char* po = static_cast<char*>(out.raw_data());
    ForEachLane<2>(x.shape(), dim, {IntSpan(x.strides()), IntSpan(ostr)},
                   [&](const std::array<int64_t, 2>& off) {
                     ReduceLane<T>(op, px + off[0], n, st, po + off[1] * osz);
                   });
  });
  return absl::OkStatus();
}

absl::Status Softmax(const Tensor& x, int dim, bool log, const Tensor& out) {
  const int64_t n = x.size(dim), xs = x.stride(dim), os = out.stride(dim);
  ForEachLane<2>(x.shape(), dim, {IntSpan(x.strides()), IntSpan(out.strides())},
                 [&](const std::array<int64_t, 2>& off) {
                   thread_local std::vector<float> buf;
                   buf.resize(static_cast<size_t>(2 * n));
                   float* v = buf.data();
                   LoadF32(x.dtype(), ElementPtr(x, off[0]), n, xs, v);
                   float mx = -std::numeric_limits<float>::infinity();
                   for (int64_t i = 0; i < n; ++i) mx = std::max(mx, v[i]);
                   float* e = v + n;
                   for (int64_t i = 0; i < n; ++i) e[i] = v[i] - mx;
                   ExpF32(e, e, n);
                   float sum = 0;
                   for (int64_t i = 0; i < n; ++i) sum += e[i];
                   if (log) {
                     const float shift = mx + std::log(sum);
                     for (int64_t i = 0; i < n; ++i) v[i] -= shift;
                   } else {
                     const float inv = 1.0f / sum;
                     for (int64_t i = 0; i < n; ++i) v[i] = e[i] * inv;
                   }
                   StoreF32(out.dtype(), ElementPtr(out, off[1]), n, os, v);
                 });
  return absl::OkStatus();
}

absl::Status TopK(const Tensor& x, int64_t k, int dim, bool largest, const Tensor& values,
                  const Tensor& indices) {
  const int64_t n = x.size(dim), xs = x.stride(dim), vs = values.stride(dim), is = indices.stride(dim);
  DT_OPS_DISPATCH_NUMERIC(x.dtype(), T, [&] {
    using C = Compute<T>;
    const T* px = x.data<T>();
    T* pv = values.data<T>();
    int64_t* pi = indices.data<int64_t>();
    ForEachLane<3>(x.shape(), dim,
                   {IntSpan(x.strides()), IntSpan(values.strides()), IntSpan(indices.strides())},
                   [&](const std::array<int64_t, 3>& off) {
                     thread_local std::vector<std::pair<C, int64_t>> buf;
                     buf.resize(static_cast<size_t>(n));
                     for (int64_t i = 0; i < n; ++i) buf[i] = {Load(px[off[0] + i * xs]), i};
                     auto before = [largest](const std::pair<C, int64_t>& a,
                                             const std::pair<C, int64_t>& b) {
                       const bool first = largest ? Greater(a.first, b.first) : Greater(b.first, a.first);
                       const bool second = largest ? Greater(b.first, a.first) : Greater(a.first, b.first);
                       return first || (!second && a.second < b.second);
                     };
                     std::partial_sort(buf.begin(), buf.begin() + k, buf.end(), before);
                     for (int64_t i = 0; i < k; ++i) {
                       pv[off[1] + i * vs] = Store<T>(buf[i].first);
                       pi[off[2] + i * is] = buf[i].second;
                     }
                   });
  });
  return absl::OkStatus();
}

}  // namespace dt::ops::cpu
