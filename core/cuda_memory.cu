// CUDA side of core/: device memory, byte copies, strided copies with dtype conversion and fills.
// Part of libdtensor_cuda.so (Note [CUDA module] in core/cuda_module.h), which hands these
// functions to core as CudaMemoryFunctions(); the public headers never include cuda_runtime.h.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "dtensor/core/cuda_module.h"
#include "dtensor/core/tensor.h"

namespace dt {

namespace {

absl::Status CudaError(cudaError_t e, absl::string_view what) {
  return absl::InternalError(absl::StrCat("CUDA error in ", what, ": ", cudaGetErrorString(e)));
}

constexpr int kMaxDims = 8;
struct Layout {
  int ndim;
  int64_t shape[kMaxDims];
  int64_t dst_strides[kMaxDims];
  int64_t src_strides[kMaxDims];
};

template <typename T> struct DevType { using type = T; };
template <> struct DevType<BFloat16> { using type = __nv_bfloat16; };
template <> struct DevType<Float16> { using type = __half; };

template <typename D, typename S>
__device__ inline D DevConvert(S v) {
  if constexpr (std::is_same_v<D, S>) return v;
  else return static_cast<D>(static_cast<float>(v));
}

template <typename D, typename S>
__global__ void StridedCopyKernel(D* dst, const S* src, Layout l, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r = i, od = 0, os = 0;
    for (int d = l.ndim - 1; d >= 0; --d) {
      const int64_t idx = r % l.shape[d];
      r /= l.shape[d];
      od += idx * l.dst_strides[d];
      os += idx * l.src_strides[d];
    }
    dst[od] = DevConvert<D>(src[os]);
  }
}

template <typename T>
__global__ void FillKernel(T* dst, T value, Layout l, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r = i, od = 0;
    for (int d = l.ndim - 1; d >= 0; --d) {
      od += (r % l.shape[d]) * l.dst_strides[d];
      r /= l.shape[d];
    }
    dst[od] = value;
  }
}

int Blocks(int64_t n) { return static_cast<int>(std::min<int64_t>((n + 255) / 256, 65535)); }

absl::StatusOr<Layout> MakeLayout(const Tensor& dst, const Tensor* src) {
  Layout l{};
  if (dst.dim() > kMaxDims) {
    return absl::UnimplementedError(absl::StrCat("CUDA copy of ", dst.Describe(), ": more than ", kMaxDims, " dims"));
  }
  l.ndim = dst.dim();
  for (int d = 0; d < dst.dim(); ++d) {
    l.shape[d] = dst.size(d);
    l.dst_strides[d] = dst.stride(d);
    l.src_strides[d] = src ? src->stride(d) : 0;
  }
  if (l.ndim == 0) {
    l.ndim = 1;
    l.shape[0] = 1;
    l.dst_strides[0] = l.src_strides[0] = 1;
  }
  return l;
}

template <typename D>
absl::Status LaunchCopyFrom(const Tensor& dst, const Tensor& src, const Layout& l) {
  using DD = typename DevType<D>::type;
  const int64_t n = dst.numel();
  auto* d = static_cast<DD*>(dst.raw_data());
  switch (src.dtype()) {
    case DType::kF32: StridedCopyKernel<<<Blocks(n), 256>>>(d, static_cast<const float*>(src.raw_data()), l, n); break;
    case DType::kBF16: StridedCopyKernel<<<Blocks(n), 256>>>(d, static_cast<const __nv_bfloat16*>(src.raw_data()), l, n); break;
    case DType::kF16: StridedCopyKernel<<<Blocks(n), 256>>>(d, static_cast<const __half*>(src.raw_data()), l, n); break;
    default: return absl::UnimplementedError("CUDA conversion from a non-float dtype");
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status LaunchSameType(const Tensor& dst, const Tensor& src, const Layout& l) {
  const int64_t n = dst.numel();
  StridedCopyKernel<<<Blocks(n), 256>>>(static_cast<T*>(dst.raw_data()), static_cast<const T*>(src.raw_data()), l, n);
  return absl::OkStatus();
}

// Same dtype: a copy by element size; floats: a converting copy.
absl::Status Launch(const Tensor& dst, const Tensor& src, const Layout& l) {
  if (dst.dtype() == src.dtype()) {
    switch (DTypeSize(dst.dtype())) {
      case 1: return LaunchSameType<uint8_t>(dst, src, l);
      case 2: return LaunchSameType<uint16_t>(dst, src, l);
      case 4: return LaunchSameType<uint32_t>(dst, src, l);
      default: return LaunchSameType<uint64_t>(dst, src, l);
    }
  }
  switch (dst.dtype()) {
    case DType::kF32: return LaunchCopyFrom<float>(dst, src, l);
    case DType::kBF16: return LaunchCopyFrom<BFloat16>(dst, src, l);
    default: return LaunchCopyFrom<Float16>(dst, src, l);
  }
}

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

absl::StatusOr<void*> Allocate(int64_t nbytes, int device) {
  if (cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("cannot use cuda:", device, " (", DeviceCount(),
                                                      " CUDA devices visible)"));
  }
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(nbytes, 1)));
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat("cudaMalloc of ", nbytes, " bytes on cuda:", device,
                                                     ": ", cudaGetErrorString(e)));
  }
  return p;
}

void Release(void* p, int device) {
  cudaSetDevice(device);
  cudaFree(p);
}

absl::Status CopyDeviceBytes(void* dst, Device dst_device, const void* src, Device src_device, int64_t n) {
  cudaError_t e = cudaMemcpy(dst, src, static_cast<size_t>(n), cudaMemcpyDefault);
  if (e != cudaSuccess) return CudaError(e, absl::StrCat("copy ", src_device.ToString(), " -> ", dst_device.ToString()));
  return absl::OkStatus();
}

absl::Status StridedCopy(const Tensor& dst, const Tensor& src) {
  DT_ASSIGN_OR_RETURN(Layout l, MakeLayout(dst, &src));
  cudaSetDevice(dst.device().index);
  if (!(dst.dtype() == src.dtype()) && !(IsFloating(dst.dtype()) && IsFloating(src.dtype()))) {
    // Integer conversions on the device are rare (token ids): go through the host.
    DT_ASSIGN_OR_RETURN(Tensor h, src.To(kCPU));
    DT_ASSIGN_OR_RETURN(h, h.To(dst.dtype()));
    return dst.CopyFrom(h);
  }
  const absl::Status s = Launch(dst, src, l);
  DT_RETURN_IF_ERROR(s);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return CudaError(e, "strided copy");
  return absl::OkStatus();
}

absl::Status FillDevice(const Tensor& dst, double value) {
  DT_ASSIGN_OR_RETURN(Layout l, MakeLayout(dst, nullptr));
  cudaSetDevice(dst.device().index);
  const int64_t n = dst.numel();
  switch (dst.dtype()) {
    case DType::kF32: FillKernel<<<Blocks(n), 256>>>(static_cast<float*>(dst.raw_data()), static_cast<float>(value), l, n); break;
    case DType::kBF16: FillKernel<<<Blocks(n), 256>>>(static_cast<uint16_t*>(dst.raw_data()), BFloat16(static_cast<float>(value)).bits, l, n); break;
    case DType::kF16: FillKernel<<<Blocks(n), 256>>>(static_cast<uint16_t*>(dst.raw_data()), Float16(static_cast<float>(value)).bits, l, n); break;
    case DType::kI64: FillKernel<<<Blocks(n), 256>>>(static_cast<int64_t*>(dst.raw_data()), static_cast<int64_t>(value), l, n); break;
    case DType::kI32: FillKernel<<<Blocks(n), 256>>>(static_cast<int32_t*>(dst.raw_data()), static_cast<int32_t>(value), l, n); break;
    case DType::kU8: FillKernel<<<Blocks(n), 256>>>(static_cast<uint8_t*>(dst.raw_data()), static_cast<uint8_t>(value), l, n); break;
    case DType::kBool: FillKernel<<<Blocks(n), 256>>>(static_cast<uint8_t*>(dst.raw_data()), static_cast<uint8_t>(value != 0), l, n); break;
    default: return absl::UnimplementedError("CUDA fill of a quantized dtype");
  }
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return CudaError(e, "fill");
  return absl::OkStatus();
}

}  // namespace

namespace internal {

const CudaMemory& CudaMemoryFunctions() {
  static const CudaMemory memory = {DeviceCount, Allocate, Release, CopyDeviceBytes, StridedCopy, FillDevice};
  return memory;
}

}  // namespace internal
}  // namespace dt
