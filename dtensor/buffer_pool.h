#pragma once
// Recycled host buffers for the redistribute executor's outputs and packing buffers.
//
// Note [Executor buffers]
// Every redistribution allocates its result (and sometimes a pack buffer) of up to the size of the
// tensor. A fresh multi-MiB host allocation is a fresh mapping, and writing it costs a page fault
// per 4 KiB page: for a 16 MiB all_gather on the threads backend that is ~4000 faults, more time
// than the copy itself. So buffers the executor hands out return, when the last Tensor using them
// goes away, to a process-wide pool keyed by exact byte size, and the next redistribution of the
// same shape reuses one — the host-side analogue of PyTorch's CUDA caching allocator. The pool
// keeps at most PoolLimitBytes() (default 1 GiB, or $DT_BUFFER_POOL_MB); buffers beyond that are
// freed. Only cpu buffers are pooled; other devices allocate normally.

#include <cstdint>

#include "absl/status/statusor.h"
#include "dtensor/core/tensor.h"

namespace dt {

// Like Tensor::Empty, from the pool (cpu) or plain (other devices).
absl::StatusOr<Tensor> PooledEmpty(IntSpan shape, DType dtype, Device device);

int64_t PoolLimitBytes();
void SetPoolLimitBytes(int64_t bytes);  // 0 disables pooling (and frees what is cached)
int64_t PoolCachedBytes();
void ReleasePool();  // frees every cached buffer

}  // namespace dt
