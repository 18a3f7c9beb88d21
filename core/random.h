#pragma once
// Counter-based random numbers (Philox-4x32-10). The value at a global flat index depends only on
// (seed, index), so any rank can generate any slice of a global random tensor without
// communication, and a sharded random tensor equals the sharded full random tensor exactly.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dtensor/core/tensor.h"

namespace dt {

enum class Distribution : uint8_t { kUniform, kNormal };

// Uniform in [0, 1) and standard normal for one counter.
float UniformAt(uint64_t seed, uint64_t index);
float NormalAt(uint64_t seed, uint64_t index);

// The elements of the global random tensor of `global_shape` whose coordinates along dim d are
// `indices[d]` (a list of global indices per dim), as a contiguous tensor of shape
// [indices[0].size(), ...].
absl::StatusOr<Tensor> RandomSlice(IntSpan global_shape,
                                   absl::Span<const std::vector<int64_t>> indices, uint64_t seed,
                                   Distribution dist, DType dtype = DType::kF32,
                                   Device device = kCPU);

}  // namespace dt
