#pragma once
// ReduceOp: how the terms of a Partial placement combine, and what a reducing collective computes.
// It lives in core because both the communicators (mesh/) and the placements (dtensor/) speak it.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dt {

enum class ReduceOp : uint8_t { kSum, kAvg, kMin, kMax, kProd };
absl::string_view ReduceOpName(ReduceOp op);  // "sum", "avg", "min", "max", "prod"
absl::StatusOr<ReduceOp> ParseReduceOp(absl::string_view name);

}  // namespace dt
