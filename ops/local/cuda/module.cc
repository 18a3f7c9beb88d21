// The entry point of libdtensor_cuda.so: core's device memory and the CUDA kernels as one table
// (Note [CUDA module] in core/cuda_module.h).

#include "dtensor/core/cuda_module.h"
#include "dtensor/ops/local/cuda_kernels.h"

extern "C" __attribute__((visibility("default"))) const dt::internal::ModuleHeader* dtensor_cuda_module_v1() {
  static const dt::ops::internal::CudaKernels kernels = {
#define DT_CUDA_KERNEL_ADDRESS_(name, params) &dt::ops::cuda::name,
      DT_LOCAL_KERNELS(DT_CUDA_KERNEL_ADDRESS_)
#undef DT_CUDA_KERNEL_ADDRESS_
  };
  static const dt::internal::CudaModule module = {DT_MODULE_HEADER, dt::internal::CudaMemoryFunctions(), &kernels};
  return &module.header;
}
