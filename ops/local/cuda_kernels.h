#pragma once
// Internal: the `cuda::` kernels of kernels.h as the table libdtensor_cuda.so hands over
// (Note [CUDA module] in core/cuda_module.h). Programs reach a CUDA kernel only through this
// table (DT_OPS_KERNEL in checks.h), so they never link the kernels or CUDA.

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dtensor/core/device.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::internal {

// One field per row of DT_LOCAL_KERNELS (kernels.h).
struct CudaKernels {
#define DT_CUDA_KERNEL_FIELD_(name, params) decltype(&cuda::name) name;
  DT_LOCAL_KERNELS(DT_CUDA_KERNEL_FIELD_)
#undef DT_CUDA_KERNEL_FIELD_
};

// The module's kernels, loaded on the first call; errors read "<op> on <device>: <why>".
absl::StatusOr<const CudaKernels*> LoadCudaKernels(absl::string_view op, Device device);

// f(kernels), or the load error.
template <typename F>
absl::Status RunCuda(absl::string_view op, Device device, F&& f) {
  absl::StatusOr<const CudaKernels*> kernels = LoadCudaKernels(op, device);
  if (!kernels.ok()) return kernels.status();
  return std::forward<F>(f)(**kernels);
}

}  // namespace dt::ops::internal
