#pragma once
// Index ranges and boxes: which global indices of a tensor a piece holds, per dim, and copying
// the elements of a box between tensors that hold different index sets. The shard math
// (dtensor/spec.h) produces ranges; the redistribute executor, Distribute/FromLocal and the
// checkpoint loaders copy by them. Nothing here knows about meshes or placements.
//
//   piece of a [9, 4] tensor holding rows {0, 1, 5} and every column:
//     DimRanges{{[0, 2), [5, 6)}, {[0, 4)}}   shape RangesShape(...) = [3, 4]
//   SliceRanges(full, ranges): that piece cut from the whole tensor, contiguous.

#include <cstdint>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/tensor.h"

namespace dt {

// [start, stop) of global indices along one dim.
struct IndexRange {
  int64_t start = 0;
  int64_t stop = 0;
  int64_t size() const { return stop - start; }
  friend bool operator==(const IndexRange&, const IndexRange&) = default;
};
// Ascending, disjoint, non-empty ranges.
using RangeList = absl::InlinedVector<IndexRange, 2>;
using DimRanges = absl::InlinedVector<RangeList, 4>;  // one RangeList per tensor dim

int64_t RangesSize(const RangeList& ranges);
// "[0, 2), [5, 6)"; "empty" for no ranges.
std::string RangesToString(const RangeList& ranges);
// [0, n) (no range when n is 0); every index of `shape`.
RangeList FullRange(int64_t n);
DimRanges FullRanges(IntSpan shape);
// The indices in both lists.
RangeList IntersectRanges(const RangeList& a, const RangeList& b);
// The sizes: the shape of a piece holding `ranges`.
Shape RangesShape(const DimRanges& ranges);

// Copying the indices `box` along one dim from a tensor holding `src_have` into one holding
// `dst_have` (box is a subset of both) is a list of runs contiguous in both: positions in the
// source and the destination, and a length.
struct IndexRun {
  int64_t src, dst, len;
};
using IndexRuns = absl::InlinedVector<IndexRun, 4>;
IndexRuns DimRuns(const RangeList& src_have, const RangeList& dst_have, const RangeList& box);

// Copies the elements at global indices `box` (per dim) from `src` (holding `src_have`) into `dst`
// (holding `dst_have`); any strides on both sides.
absl::Status CopyBox(const Tensor& dst, const DimRanges& dst_have, const Tensor& src,
                     const DimRanges& src_have, const DimRanges& box);

// The elements of `full` (the whole tensor) at `ranges`, as a new contiguous tensor.
absl::StatusOr<Tensor> SliceRanges(const Tensor& full, const DimRanges& ranges);

}  // namespace dt
