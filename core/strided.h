#pragma once
// Internal: iteration over strided element runs shared by copies, fills and kernels.

#include <cstdint>
#include <functional>

#include "dtensor/core/shape.h"

namespace dt::internal {

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
