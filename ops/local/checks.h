#pragma once
// Internal: argument checks shared by the public ops (every message starts with the op's name) and
// the macro that sends a validated call to the kernel of the inputs' device.

#include <initializer_list>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "dtensor/core/tensor.h"
#include "dtensor/ops/local/cuda_kernels.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::internal {

// "Softmax: x is an undefined tensor".
absl::Status CheckDefined(absl::string_view op, absl::string_view name, const Tensor& t);
// "Softmax: x must be f32, bf16 or f16, got i64[2, 3] cpu".
absl::Status CheckFloat(absl::string_view op, absl::string_view name, const Tensor& t);
// "Add: x must not be bool, got bool[3] cpu".
absl::Status CheckNotBool(absl::string_view op, absl::string_view name, const Tensor& t);
// "Matmul: dtypes differ: a f32[2, 3] cpu, b bf16[3, 4] cpu".
absl::Status CheckSameDType(absl::string_view op, absl::string_view name_a, const Tensor& a,
                            absl::string_view name_b, const Tensor& b);
// All defined tensors on the device of the first; "Add: devices differ: a ... cpu, b ... cuda:0".
absl::Status CheckSameDevice(absl::string_view op,
                             std::initializer_list<std::pair<absl::string_view, const Tensor*>> ts);
// "RmsNorm: weight must have shape [64], got f32[32] cpu".
absl::Status CheckShape(absl::string_view op, absl::string_view name, const Tensor& t,
                        IntSpan want);
// "Matmul: a must have at least 2 dims, got f32[3] cpu".
absl::Status CheckMinDims(absl::string_view op, absl::string_view name, const Tensor& t, int dims);
// The `out` of an op that writes into a given tensor (ApplyRotaryInto, ...): of `shape` and of
// `like`'s dtype and device, writable, a unit stride along its last dim (any others), and sharing
// no storage with `inputs`: "ApplyRotaryInto: out f32[2, 4] cpu shares its storage with x ...".
absl::Status CheckInto(absl::string_view op, const Tensor& out, IntSpan shape,
                       std::pair<absl::string_view, const Tensor*> like,
                       std::initializer_list<std::pair<absl::string_view, const Tensor*>> inputs);

}  // namespace dt::ops::internal

// DT_OPS_KERNEL(device, Name, args...): ops::cpu::Name(args...), or on a CUDA device the
// libdtensor_cuda.so module's ops::cuda::Name(args...), the module loaded on first use (a build or
// machine without it answers FailedPrecondition "<Name> on cuda:0: <why>").
#define DT_OPS_KERNEL(device, name, ...)                                                     \
  ((device).is_cuda()                                                                        \
       ? ::dt::ops::internal::RunCuda(#name, (device),                                       \
                                      [&](const ::dt::ops::internal::CudaKernels& kernels_) { \
                                        return kernels_.name(__VA_ARGS__);                    \
                                      })                                                     \
       : ::dt::ops::cpu::name(__VA_ARGS__))
