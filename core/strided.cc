#include "dtensor/core/strided.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

namespace dt::internal {

StridedLoop::StridedLoop(IntSpan shp, IntSpan s0, IntSpan s1) {
  const Shape zeros(shp.size(), 0);
  std::array<Shape, 2> st;
  CoalesceDims<2>(shp, {s0, s1.empty() ? IntSpan(zeros) : s1}, &shape, &st);
  strides[0] = std::move(st[0]);
  strides[1] = std::move(st[1]);
  if (shape.empty()) {
    shape.push_back(1);
    strides[0].push_back(1);
    strides[1].push_back(1);
  }
}

int64_t StridedLoop::rows() const {
  int64_t r = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) r *= shape[i];
  return r;
}

void StridedLoop::RowOffsets(int64_t r, int64_t* off0, int64_t* off1) const {
  int64_t o0 = 0, o1 = 0;
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
    const int64_t idx = r % shape[i];
    r /= shape[i];
    o0 += idx * strides[0][i];
    o1 += idx * strides[1][i];
  }
  *off0 = o0;
  *off1 = o1;
}

void StridedLoop::ForEachRun(const std::function<void(int64_t, int64_t, int64_t)>& fn) const {
  const int64_t n_rows = rows();
  const int64_t n = inner();
  if (n_rows == 0 || n == 0) return;
  auto body = [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      int64_t o0, o1;
      RowOffsets(r, &o0, &o1);
      fn(o0, o1, n);
    }
  };
  constexpr int64_t kParallelElements = 1 << 18;
  if (n_rows > 1 && n_rows * n >= kParallelElements) {
    const int64_t grain = std::max<int64_t>(1, kParallelElements / 4 / std::max<int64_t>(n, 1));
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n_rows, grain),
                      [&](const tbb::blocked_range<int64_t>& r) { body(r.begin(), r.end()); });
  } else {
    body(0, n_rows);
  }
}

}  // namespace dt::internal
