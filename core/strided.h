#pragma once
// Internal: iteration over strided element runs shared by copies, fills and kernels.

#include <array>
#include <cstdint>
#include <functional>

#include "dtensor/core/shape.h"

namespace dt::internal {

// The one dim-coalescing rule every strided loop uses (core's copies, the CPU kernels' Nest, the
// CUDA kernels' Indexer): size-1 dims are dropped and dim d is merged into the one before it when
// every operand is contiguous across the two (stride[before] == stride[d] * size[d]). All-size-1
// shapes give an empty result.
template <size_t N>
void CoalesceDims(IntSpan shape, const std::array<IntSpan, N>& strides, Shape* out_shape,
                  std::array<Shape, N>* out_strides) {
  out_shape->clear();
  for (auto& s : *out_strides) s.clear();
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !out_shape->empty();
    for (size_t k = 0; k < N && merge; ++k) {
      merge = (*out_strides)[k].back() == strides[k][d] * shape[d];
    }
    if (merge) {
      out_shape->back() *= shape[d];
      for (size_t k = 0; k < N; ++k) (*out_strides)[k].back() = strides[k][d];
    } else {
      out_shape->push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) (*out_strides)[k].push_back(strides[k][d]);
    }
  }
}

// A loop nest over `shape` for up to two operands: dims are coalesced where both operands are
// contiguous across them and size-1 dims are dropped, so that the innermost run is as long as
// possible.
struct StridedLoop {
  Shape shape;        // coalesced, innermost last; never empty (a scalar becomes [1])
  Shape strides[2];   // per operand, elements

  StridedLoop(IntSpan shape, IntSpan strides0, IntSpan strides1);
  int64_t inner() const { return shape.back(); }
  int64_t rows() const;  // product of all dims but the innermost
  // Element offsets of the start of row `r` for each operand.
  void RowOffsets(int64_t r, int64_t* off0, int64_t* off1) const;
  // Calls fn(off0, off1, n) for every run, in parallel (oneTBB) when the work is large.
  void ForEachRun(const std::function<void(int64_t, int64_t, int64_t)>& fn) const;
};

}  // namespace dt::internal
