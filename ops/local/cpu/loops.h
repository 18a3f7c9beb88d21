#pragma once
// Internal to the CPU kernels: f32 conversion, strided loop nests over several operands and
// per-lane iteration along one dim, parallelised with oneTBB.

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "dtensor/core/dtype.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/strided.h"
#include "dtensor/core/tensor.h"

// DT_OPS_DISPATCH_FLOAT / DT_OPS_DISPATCH_NUMERIC(dtype, T, body): like DT_DISPATCH_DTYPE over the
// float dtypes, or every dtype but bool. The caller has validated the dtype.
#define DT_OPS_DISPATCH_FLOAT(dtype, T, ...)                                           \
  [&] {                                                                                \
    switch (dtype) {                                                                   \
      case ::dt::DType::kF16: { using T = ::dt::Float16; return __VA_ARGS__(); }       \
      case ::dt::DType::kBF16: { using T = ::dt::BFloat16; return __VA_ARGS__(); }     \
      default: { using T = float; return __VA_ARGS__(); }                              \
    }                                                                                  \
  }()
#define DT_OPS_DISPATCH_NUMERIC(dtype, T, ...)                                         \
  [&] {                                                                                \
    switch (dtype) {                                                                   \
      case ::dt::DType::kF16: { using T = ::dt::Float16; return __VA_ARGS__(); }       \
      case ::dt::DType::kBF16: { using T = ::dt::BFloat16; return __VA_ARGS__(); }     \
      case ::dt::DType::kI64: { using T = int64_t; return __VA_ARGS__(); }             \
      case ::dt::DType::kI32: { using T = int32_t; return __VA_ARGS__(); }             \
      case ::dt::DType::kU8: { using T = uint8_t; return __VA_ARGS__(); }              \
      default: { using T = float; return __VA_ARGS__(); }                              \
    }                                                                                  \
  }()

namespace dt::ops::cpu {

template <typename T>
inline constexpr bool kIsHalf = std::is_same_v<T, BFloat16> || std::is_same_v<T, Float16>;
template <typename T>
inline constexpr bool kIsFloat = std::is_same_v<T, float> || kIsHalf<T>;

// The type arithmetic runs in: f32 for float dtypes, the type itself for integers.
template <typename T>
using Compute = std::conditional_t<kIsHalf<T>, float, T>;

template <typename T>
inline Compute<T> Load(T v) {
  return static_cast<Compute<T>>(v);
}
template <typename T>
inline T Store(Compute<T> v) {
  if constexpr (kIsHalf<T>) {
    return T(v);
  } else {
    return v;
  }
}

// Element offset of flat index `i` (row-major over `shape`) for each operand's strides.
template <size_t N>
inline std::array<int64_t, N> Offsets(int64_t i, IntSpan shape, const std::array<Shape, N>& strides) {
  std::array<int64_t, N> off{};
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    const int64_t idx = i % shape[d];
    i /= shape[d];
    for (size_t k = 0; k < N; ++k) off[k] += idx * strides[k][d];
  }
  return off;
}

// Runs fn(lo, hi) over [0, n) split across cores when n * cost_per_item is large.
template <typename F>
void ParallelFor(int64_t n, int64_t cost_per_item, F&& fn) {
  constexpr int64_t kSerialWork = 1 << 15;
  if (n <= 1 || n * cost_per_item <= kSerialWork) {
    if (n > 0) fn(int64_t{0}, n);
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kSerialWork / std::max<int64_t>(1, cost_per_item));
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, grain),
                    [&](const tbb::blocked_range<int64_t>& r) { fn(r.begin(), r.end()); });
}

// A loop nest over `shape` for N operands given their strides (in elements): size-1 dims are
// dropped and neighbouring dims merged where every operand is contiguous across them, so the
// innermost run is as long as possible.
template <size_t N>
struct Nest {
  Shape shape;                  // coalesced, innermost last; never empty
  std::array<Shape, N> strides;

  Nest(IntSpan full_shape, const std::array<IntSpan, N>& full_strides) {
    internal::CoalesceDims<N>(full_shape, full_strides, &shape, &strides);
    if (shape.empty()) {
      shape.push_back(1);
      for (size_t k = 0; k < N; ++k) strides[k].push_back(1);
    }
  }

  int64_t inner() const { return shape.back(); }
  int64_t inner_stride(size_t k) const { return strides[k].back(); }

  // fn(offsets, n) for each innermost run (of inner() elements, strides inner_stride(k)), or for
  // each piece of one: runs longer than 2 * kPiece are cut into pieces when there are few of them,
  // so that an op on a contiguous tensor (one run) is spread over the cores too.
  template <typename F>
  void ForEachRun(F&& fn) const {
    constexpr int64_t kPiece = int64_t{1} << 14;
    const int64_t n = inner();
    const IntSpan outer(shape.data(), shape.size() - 1);
    std::array<Shape, N> outer_strides;
    for (size_t k = 0; k < N; ++k) outer_strides[k].assign(strides[k].begin(), strides[k].end() - 1);
    const int64_t runs = Numel(outer);
    const int64_t pieces = runs < 64 && n > 2 * kPiece ? (n + kPiece - 1) / kPiece : 1;
    const int64_t len = (n + pieces - 1) / pieces;
    ParallelFor(runs * pieces, len, [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        std::array<int64_t, N> off = Offsets<N>(t / pieces, outer, outer_strides);
        const int64_t start = t % pieces * len;
        for (size_t k = 0; k < N; ++k) off[k] += start * strides[k].back();
        fn(off, std::min(len, n - start));
      }
    });
  }
};

// For every position of `shape` with `dim` removed (a "lane" along dim), calls
// fn(offsets) with each operand's element offset of the lane's first element; lanes run in
// parallel. `strides` are the operands' full strides (use 0 for an operand without `dim`).
template <size_t N, typename F>
void ForEachLane(IntSpan shape, int dim, const std::array<IntSpan, N>& strides, F&& fn) {
  Shape outer;
  std::array<Shape, N> outer_strides;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    if (d == dim) continue;
    outer.push_back(shape[d]);
    for (size_t k = 0; k < N; ++k) outer_strides[k].push_back(strides[k][d]);
  }
  ParallelFor(Numel(outer), std::max<int64_t>(1, shape[dim]) * 8, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) fn(Offsets<N>(r, outer, outer_strides));
  });
}

// Lane of n elements at `stride` from `p` (of dtype `dtype`) converted to f32, and back.
void LoadF32(DType dtype, const void* p, int64_t n, int64_t stride, float* dst);
void StoreF32(DType dtype, void* p, int64_t n, int64_t stride, const float* src);

// Pointer to element `offset` of a tensor's data, as bytes.
inline char* ElementPtr(const Tensor& t, int64_t offset) {
  return static_cast<char*>(t.raw_data()) + offset * DTypeSize(t.dtype());
}

}  // namespace dt::ops::cpu
