// CUDA pointwise kernels: Binary, BinaryScalar, Unary, GatedActivation, Modulate, SoftCap. One instantiation per dtype; the op is a
// run-time switch (uniform across the grid, so it costs no divergence).

#include <cmath>

#include "dtensor/ops/local/cuda/cuda_util.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::cuda {

namespace {

// Integer arithmetic wraps (two's complement): computed on the unsigned type of the same width.
template <typename C>
__device__ __forceinline__ C Apply(BinaryOp op, C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    const U x = static_cast<U>(a), y = static_cast<U>(b);
    switch (op) {
      case BinaryOp::kAdd: return static_cast<C>(static_cast<U>(x + y));
      case BinaryOp::kSub: return static_cast<C>(static_cast<U>(x - y));
      case BinaryOp::kMul: return static_cast<C>(static_cast<U>(x * y));
      case BinaryOp::kDiv: return C{0};  // excluded by the public layer
    }
    return C{0};
  } else {
    switch (op) {
      case BinaryOp::kAdd: return a + b;
      case BinaryOp::kSub: return a - b;
      case BinaryOp::kMul: return a * b;
      case BinaryOp::kDiv: return a / b;
    }
    return a;
  }
}

template <typename C>
__device__ __forceinline__ C ApplyUnary(UnaryOp op, C v) {
  if constexpr (std::is_integral_v<C>) {
    return Apply<C>(BinaryOp::kSub, C{0}, v);  // only kNeg reaches integers
  } else {
    switch (op) {
      case UnaryOp::kNeg: return 0.0f - v;  // as on the CPU: Neg(-0) is +0
#define DT_CUDA_UNARY_(name, formula) \
  case UnaryOp::k##name: return formula;
      DT_GELU_OPS(DT_CUDA_UNARY_)
      DT_UNARY_OPS(DT_CUDA_UNARY_)
#undef DT_CUDA_UNARY_
    }
    return v;
  }
}

// out (contiguous) [i] = a[i] op b[i].
template <typename T>
__global__ void BinaryKernel(BinaryOp op, const T* a, const T* b, T* out, Indexer<2> ix,
                             bool contiguous, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[2] = {i, i};
    if (!contiguous) ix.Offsets(i, off);
    out[i] = Store<T>(Apply<Compute<T>>(op, Load(a[off[0]]), Load(b[off[1]])));
  }
}

// out[i] = x[i] op s; s is given as f32 (float dtypes) and as an integer (integer dtypes).
template <typename T>
__global__ void ScalarKernel(BinaryOp op, const T* x, float sf, int64_t si, T* out, Indexer<1> ix,
                             bool contiguous, int64_t n) {
  using C = Compute<T>;
  C s;
  if constexpr (kIsFloat<T>) {
    s = sf;
  } else {
    s = static_cast<C>(si);
  }
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[1] = {i};
    if (!contiguous) ix.Offsets(i, off);
    out[i] = Store<T>(Apply<C>(op, Load(x[off[0]]), s));
  }
}

template <typename T>
__global__ void UnaryKernel(UnaryOp op, const T* x, T* out, Indexer<1> ix, bool contiguous,
                            int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[1] = {i};
    if (!contiguous) ix.Offsets(i, off);
    out[i] = Store<T>(ApplyUnary<Compute<T>>(op, Load(x[off[0]])));
  }
}

// out (contiguous) [i] = round(round(act(gate[i])) * up[i]) (see ops::GatedActivation).
template <typename T>
__global__ void GatedKernel(UnaryOp act, const T* gate, const T* up, T* out, Indexer<2> ix,
                            bool contiguous, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[2] = {i, i};
    if (!contiguous) ix.Offsets(i, off);
    const float a = Load(Store<T>(ApplyUnary<float>(act, Load(gate[off[0]]))));
    out[i] = Store<T>(__fmul_rn(a, static_cast<float>(Load(up[off[1]]))));
  }
}

// out (contiguous) [i] = round(round(x * round(1 + scale)) + shift) (see ops::Modulate).
template <typename T>
__global__ void ModulateKernel(const T* x, const T* scale, const T* shift, T* out, Indexer<3> ix,
                               bool contiguous, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[3] = {i, i, i};
    if (!contiguous) ix.Offsets(i, off);
    // Never contracted into an FMA: Note [Modulate rounds every step] (cpu/modulate.cc).
    const float f = Load(Store<T>(__fadd_rn(1.0f, static_cast<float>(Load(scale[off[1]])))));
    const float p = Load(Store<T>(__fmul_rn(static_cast<float>(Load(x[off[0]])), f)));
    out[i] = Store<T>(__fadd_rn(p, static_cast<float>(Load(shift[off[2]]))));
  }
}

// out (contiguous) [i] = cap · tanh(x / cap) in f32, rounded once (see ops::SoftCap).
template <typename T>
__global__ void SoftCapKernel(const T* x, float cap, T* out, Indexer<1> ix, bool contiguous,
                              int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[1] = {i};
    if (!contiguous) ix.Offsets(i, off);
    out[i] = Store<T>(cap * tanhf(static_cast<float>(Load(x[off[0]])) / cap));
  }
}

constexpr int kThreads = 256;

}  // namespace

absl::Status Modulate(const Tensor& x, const Tensor& scale, const Tensor& shift, const Tensor& out) {
  constexpr absl::string_view kKernel = "Modulate";
  DT_RETURN_IF_ERROR(UseDevice(out, kKernel));
  DT_ASSIGN_OR_RETURN(Indexer<3> ix,
                      MakeIndexer<3>(kKernel, out.shape(),
                                     {IntSpan(x.strides()), IntSpan(scale.strides()),
                                      IntSpan(shift.strides())}));
  const int64_t n = out.numel();
  return DT_CUDA_DISPATCH_FLOAT(out.dtype(), T, [&] {
    return Launch(kKernel, ModulateKernel<T>, GridFor(n, kThreads), kThreads, 0, x.raw_data(),
                  scale.raw_data(), shift.raw_data(), out.raw_data(), ix, ix.contiguous(), n);
  });
}

absl::Status SoftCap(const Tensor& x, double cap, const Tensor& out) {
  constexpr absl::string_view kKernel = "SoftCap";
  DT_RETURN_IF_ERROR(UseDevice(out, kKernel));
  DT_ASSIGN_OR_RETURN(Indexer<1> ix, MakeIndexer<1>(kKernel, out.shape(), {IntSpan(x.strides())}));
  const int64_t n = out.numel();
  return DT_CUDA_DISPATCH_FLOAT(out.dtype(), T, [&] {
    return Launch(kKernel, SoftCapKernel<T>, GridFor(n, kThreads), kThreads, 0, x.raw_data(),
                  static_cast<float>(cap), out.raw_data(), ix, ix.contiguous(), n);
  });
}

absl::Status GatedActivation(UnaryOp act, const Tensor& gate, const Tensor& up, const Tensor& out) {
  constexpr absl::string_view kKernel = "GatedActivation";
  DT_RETURN_IF_ERROR(UseDevice(out, kKernel));
  DT_ASSIGN_OR_RETURN(Indexer<2> ix, MakeIndexer<2>(kKernel, out.shape(),
                                                    {IntSpan(gate.strides()), IntSpan(up.strides())}));
  const int64_t n = out.numel();
  return DT_CUDA_DISPATCH_FLOAT(out.dtype(), T, [&] {
    return Launch(kKernel, GatedKernel<T>, GridFor(n, kThreads), kThreads, 0, act, gate.raw_data(),
                  up.raw_data(), out.raw_data(), ix, ix.contiguous(), n);
  });
}

absl::Status Binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  constexpr absl::string_view kKernel = "Binary";
  DT_RETURN_IF_ERROR(UseDevice(out, kKernel));
  DT_ASSIGN_OR_RETURN(Indexer<2> ix, MakeIndexer<2>(kKernel, out.shape(),
                                                    {IntSpan(a.strides()), IntSpan(b.strides())}));
  const int64_t n = out.numel();
  return DT_CUDA_DISPATCH_NUMERIC(out.dtype(), T, [&] {
    return Launch(kKernel, BinaryKernel<T>, GridFor(n, kThreads), kThreads, 0, op, a.raw_data(),
                  b.raw_data(), out.raw_data(), ix, ix.contiguous(), n);
  });
}

absl::Status BinaryScalar(BinaryOp op, const Tensor& x, double s, const Tensor& out) {
  constexpr absl::string_view kKernel = "BinaryScalar";
  DT_RETURN_IF_ERROR(UseDevice(out, kKernel));
  DT_ASSIGN_OR_RETURN(Indexer<1> ix, MakeIndexer<1>(kKernel, out.shape(), {IntSpan(x.strides())}));
  const int64_t n = out.numel();
  const float sf = static_cast<float>(s);
  const int64_t si = IsFloating(x.dtype()) ? 0 : static_cast<int64_t>(s);
  return DT_CUDA_DISPATCH_NUMERIC(out.dtype(), T, [&] {
    return Launch(kKernel, ScalarKernel<T>, GridFor(n, kThreads), kThreads, 0, op, x.raw_data(), sf,
                  si, out.raw_data(), ix, ix.contiguous(), n);
  });
}

absl::Status Unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  constexpr absl::string_view kKernel = "Unary";
  DT_RETURN_IF_ERROR(UseDevice(out, kKernel));
  DT_ASSIGN_OR_RETURN(Indexer<1> ix, MakeIndexer<1>(kKernel, out.shape(), {IntSpan(x.strides())}));
  const int64_t n = out.numel();
  return DT_CUDA_DISPATCH_NUMERIC(out.dtype(), T, [&] {
    return Launch(kKernel, UnaryKernel<T>, GridFor(n, kThreads), kThreads, 0, op, x.raw_data(),
                  out.raw_data(), ix, ix.contiguous(), n);
  });
}

}  // namespace dt::ops::cuda
