#pragma once
// Internal to mesh/: element-wise reductions on host buffers, shared by the CPU backends (the
// threads backend, and gloo/mpi for the half types they cannot reduce natively).
//
//   op    f32 / i64 / i32 / u8            f16 / bf16
//   sum   a + b (integers wrap)           float(a) + float(b), rounded back per element pair
//   prod  a * b                           likewise
//   min   smaller; NaN wins (floats)      likewise, compared as float
//   max   larger; NaN wins (floats)       likewise
//   avg   accumulated as sum; DivideInPlace(size) at the end (integers: truncating division)
// bool is not reducible (the communicator rejects it before we get here).

#include <cstdint>

#include "absl/status/status.h"
#include "dtensor/core/dtype.h"
#include "dtensor/core/tensor.h"
#include "dtensor/core/reduce_op.h"

namespace dt::internal {

// acc[i] = acc[i] op src[i] for i < n.
void ReduceInto(void* acc, const void* src, int64_t n, DType dtype, ReduceOp op);
// out = a op b elementwise, in one pass; out may be a (in place) but must not overlap b otherwise.
void Reduce3(void* out, const void* a, const void* b, int64_t n, DType dtype, ReduceOp op);
// acc[i] /= divisor for i < n.
void DivideInPlace(void* acc, int64_t n, DType dtype, int64_t divisor);
// The same on a contiguous tensor on any device (device memory through the host: averages and
// Partial splits are never hot paths there); bool is left alone (a 0/1 average is not
// representable).
absl::Status DivideInPlace(const Tensor& t, int64_t divisor);

}  // namespace dt::internal
