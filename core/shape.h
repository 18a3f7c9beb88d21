#pragma once
// Shapes and strides (PyTorch dimension order: dim 0 outermost), in elements.

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dt {

using Shape = absl::InlinedVector<int64_t, 6>;
using IntSpan = absl::Span<const int64_t>;

int64_t Numel(IntSpan shape);
Shape ContiguousStrides(IntSpan shape);
std::string ShapeToString(IntSpan shape);  // "[4, 1024]"
absl::StatusOr<Shape> ParseShape(absl::string_view text);  // "4,1024" or "[4, 1024]" or "4x1024"
// Wraps a possibly negative dim into [0, ndim); error names the op and both values.
absl::StatusOr<int> NormalizeDim(int64_t dim, int64_t ndim, absl::string_view what = "dim");
// `shape` for a tensor of `numel` elements with its one -1 (if any) resolved. Errors name `op`:
// more than one -1, another negative size, a -1 that cannot be inferred, a size mismatch.
absl::StatusOr<Shape> InferShape(IntSpan shape, int64_t numel, absl::string_view op);
// The shape of flattening dims [start_dim, end_dim] (negative dims count from the end) into one; a
// 0-dim shape flattens to [1]. Errors name `what` (the tensor) when start_dim is after end_dim.
absl::StatusOr<Shape> FlattenShape(IntSpan shape, int64_t start_dim, int64_t end_dim,
                                   absl::string_view what);
// torch.chunk's piece sizes for n elements in `chunks` (>= 1) pieces: ceil(n / chunks) each, the
// last shorter, fewer pieces when they run out; n == 0 gives `chunks` empty pieces.
std::vector<int64_t> ChunkSizes(int64_t n, int64_t chunks);
// The broadcast of two shapes (numpy rules) or InvalidArgument naming both.
absl::StatusOr<Shape> BroadcastShapes(IntSpan a, IntSpan b);

}  // namespace dt
