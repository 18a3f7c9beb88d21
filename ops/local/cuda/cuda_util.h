#pragma once
// Internal to the CUDA kernels (ops/local/cuda/*.cu only; never included by a public header):
// error handling, dtype dispatch onto device types, f32 conversions, strided index arithmetic for
// up to kMaxDims (coalesced) dims, and lane reductions.
//
// Note [CUDA streams and errors]
// Every kernel runs on the legacy default stream of the tensors' device, so kernels are ordered
// with each other and with core's copies (cudaMemcpy, which also makes the host wait for the
// results). Kernels do not synchronise: a launch error is returned at once as an InternalError
// naming the kernel ("CUDA error in Softmax: ..."); an error raised while a kernel runs surfaces at
// the next synchronising call (e.g. the copy that reads the result back), which core reports.
// Scratch buffers are ordinary device tensors: freeing one (cudaFree) waits for the device, so a
// buffer is never released while a queued kernel still uses it.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/strided.h"
#include "dtensor/core/tensor.h"

namespace dt::ops::cuda {

// ---- errors and device selection -------------------------------------------------------------

inline absl::Status CudaError(cudaError_t e, absl::string_view kernel) {
  return absl::InternalError(absl::StrCat("CUDA error in ", kernel, ": ", cudaGetErrorName(e), " (",
                                          cudaGetErrorString(e), ")"));
}

// Returns the error of the last launch (clearing it), or OK.
inline absl::Status CheckLaunch(absl::string_view kernel) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? absl::OkStatus() : CudaError(e, kernel);
}

// Launches kernel<<<grid, block, smem>>>(args...) on the default stream (the one place that does)
// and returns its launch error naming `name`.
template <typename... Params, typename... Args>
absl::Status Launch(absl::string_view name, void (*kernel)(Params...), dim3 grid, dim3 block,
                    size_t smem, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "Launch: wrong number of kernel arguments");
  kernel<<<grid, block, smem>>>(static_cast<Params>(std::forward<Args>(args))...);
  return CheckLaunch(name);
}

// Makes t's device current for the calling thread (like core's copies do).
inline absl::Status UseDevice(const Tensor& t, absl::string_view kernel) {
  const cudaError_t e = cudaSetDevice(t.device().index);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return CudaError(e, absl::StrCat(kernel, " (selecting ", t.device().ToString(), ")"));
  }
  return absl::OkStatus();
}

inline absl::StatusOr<int> DeviceAttribute(cudaDeviceAttr attr, const Tensor& t,
                                           absl::string_view kernel) {
  int v = 0;
  const cudaError_t e = cudaDeviceGetAttribute(&v, attr, t.device().index);
  if (e != cudaSuccess) return CudaError(e, kernel);
  return v;
}

// An uninitialised device buffer of `bytes` bytes on t's device (kept alive by the tensor).
inline absl::StatusOr<Tensor> Scratch(int64_t bytes, const Tensor& t) {
  return Tensor::Empty({bytes}, DType::kU8, t.device());
}

// Blocks of `threads` threads for a grid-stride loop over n items.
inline unsigned GridFor(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > (1 << 20) ? (1 << 20) : blocks));
}

// ---- dtypes ------------------------------------------------------------------------------------

// Device storage types: f32 float, f16 __half, bf16 __nv_bfloat16, integers as themselves.
// clang-format off
#define DT_CUDA_DISPATCH_FLOAT(dtype, T, ...)                                          \
  [&] {                                                                                \
    switch (dtype) {                                                                   \
      case ::dt::DType::kF16: { using T = __half; return __VA_ARGS__(); }              \
      case ::dt::DType::kBF16: { using T = __nv_bfloat16; return __VA_ARGS__(); }      \
      default: { using T = float; return __VA_ARGS__(); }                              \
    }                                                                                  \
  }()
#define DT_CUDA_DISPATCH_NUMERIC(dtype, T, ...)                                        \
  [&] {                                                                                \
    switch (dtype) {                                                                   \
      case ::dt::DType::kI64: { using T = int64_t; return __VA_ARGS__(); }             \
      case ::dt::DType::kI32: { using T = int32_t; return __VA_ARGS__(); }             \
      case ::dt::DType::kU8: { using T = uint8_t; return __VA_ARGS__(); }              \
      default: return DT_CUDA_DISPATCH_FLOAT(dtype, T, __VA_ARGS__);                   \
    }                                                                                  \
  }()
// clang-format on

template <typename T>
inline constexpr bool kIsHalf = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
template <typename T>
inline constexpr bool kIsFloat = std::is_same_v<T, float> || kIsHalf<T>;

// The type arithmetic runs in: f32 for float dtypes, the type itself for integers (as on the CPU).
template <typename T>
using Compute = std::conditional_t<kIsHalf<T>, float, T>;

template <typename T>
__device__ __forceinline__ Compute<T> Load(T v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(v);
  } else {
    return v;
  }
}

// Rounds to nearest even for the half types.
template <typename T>
__device__ __forceinline__ T Store(Compute<T> v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    return v;
  }
}

// v rounded to T and back (identity for f32).
template <typename T>
__device__ __forceinline__ float RoundTo(float v) {
  return Load<T>(Store<T>(v));
}

// Element `off` of a float tensor whose dtype is only known at run time (secondary operands).
__device__ __forceinline__ float LoadAnyFloat(const void* p, DType dtype, int64_t off) {
  switch (dtype) {
    case DType::kF16: return __half2float(static_cast<const __half*>(p)[off]);
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[off]);
    default: return static_cast<const float*>(p)[off];
  }
}

// ---- 16-byte vector access
// ------------------------------------------------------------------------

// Elements of T in one 16-byte load.
template <typename T>
inline constexpr int kVec = static_cast<int>(16 / sizeof(T));

// True when every lane of t along `dim` can be read with 16-byte loads: stride 1 along dim, a
// multiple of the vector width long, and every lane's start 16-byte aligned.
inline bool VectorLanes(const Tensor& t, int dim) {
  const int64_t v = 16 / DTypeSize(t.dtype());
  if (t.stride(dim) != 1 || t.size(dim) % v != 0) return false;
  if (reinterpret_cast<uintptr_t>(t.raw_data()) % 16 != 0) return false;
  for (int d = 0; d < t.dim(); ++d) {
    if (d != dim && t.size(d) > 1 && t.stride(d) % v != 0) return false;
  }
  return true;
}

// kVec<T> consecutive elements at p (16-byte aligned) as f32, and back (rounded once).
template <typename T>
__device__ __forceinline__ void LoadVec(const T* p, float (&v)[kVec<T>]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int u = 0; u < kVec<T>; ++u) v[u] = Load(e[u]);
}
template <typename T>
__device__ __forceinline__ void StoreVec(T* p, const float (&v)[kVec<T>]) {
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int u = 0; u < kVec<T>; ++u) e[u] = Store<T>(v[u]);
  *reinterpret_cast<uint4*>(p) = raw;
}

// ---- strided index arithmetic
// --------------------------------------------------------------------

constexpr int kMaxDims = 8;

// Element offsets of N operands at flat (row-major) index i of a coalesced index space.
template <int N>
struct Indexer {
  int ndim = 0;  // 0: a single element
  int64_t sizes[kMaxDims];
  int64_t strides[N][kMaxDims];

  __device__ __forceinline__ void Offsets(int64_t i, int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t size = sizes[d];
      const int64_t q = i / size, idx = i - q * size;
      i = q;
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += idx * strides[k][d];
    }
  }
  // True when every operand is contiguous over the whole space (offset == flat index).
  bool contiguous() const {
    if (ndim > 1) return false;
    for (int k = 0; k < N; ++k) {
      if (ndim == 1 && strides[k][0] != 1) return false;
    }
    return true;
  }
};

// `shape` with N operands' strides: size-1 dims are dropped and neighbouring dims merged where
// every operand is contiguous across them. More than kMaxDims dims left gives Unimplemented.
template <int N>
absl::StatusOr<Indexer<N>> MakeIndexer(absl::string_view kernel, IntSpan shape,
                                       const std::array<IntSpan, N>& strides) {
  Indexer<N> ix;
  Shape sizes;
  std::array<Shape, N> st;
  std::array<IntSpan, N> spans;
  for (int k = 0; k < N; ++k) spans[k] = strides[k];
  internal::CoalesceDims<N>(shape, spans, &sizes, &st);
  const int nd = static_cast<int>(sizes.size());
  if (nd > kMaxDims) {
    return absl::UnimplementedError(absl::StrCat(kernel, " on CUDA: ", ShapeToString(shape),
                                                 " has more than ", kMaxDims,
                                                 " dims after merging contiguous ones"));
  }
  ix.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    ix.sizes[d] = sizes[d];
    for (int k = 0; k < N; ++k) ix.strides[k][d] = st[k][d];
  }
  return ix;
}

// Lanes along one dim: `outer` indexes the positions of every other dim (the lanes), `lane_stride`
// is each operand's stride along the dim, `n` the lane length.
template <int N>
struct LaneIndexer {
  Indexer<N> outer;
  int64_t lanes = 0;
  int64_t n = 0;
  int64_t lane_stride[N];
};

// Runs f(off) for every lane this thread's block row handles (a grid-stride loop over the lanes,
// one lane per block row): off[k] is the lane's first element in operand k. Every thread of a
// block row runs the same lanes, so f may synchronize them (LaneReduce).
template <int N, typename F>
__device__ __forceinline__ void ForEachLane(const LaneIndexer<N>& li, F&& f) {
  for (int64_t lane = blockIdx.x * static_cast<int64_t>(blockDim.y) + threadIdx.y; lane < li.lanes;
       lane += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    int64_t off[N];
    li.outer.Offsets(lane, off);
    f(static_cast<const int64_t*>(off));
  }
}
// The same for a kernel that reads lanes of x and writes lanes of out: f(x's lane, out's lane).
template <typename T, typename F>
__device__ __forceinline__ void ForEachLane(const LaneIndexer<2>& li, const T* x, T* out, F&& f) {
  ForEachLane(li, [&](const int64_t* off) { f(x + off[0], out + off[1]); });
}

// Operand strides are given over the full shape (use 0 for an operand without `dim`).
template <int N>
absl::StatusOr<LaneIndexer<N>> MakeLaneIndexer(absl::string_view kernel, IntSpan shape, int dim,
                                               const std::array<IntSpan, N>& strides) {
  Shape outer_shape;
  std::array<Shape, N> outer_strides;
  LaneIndexer<N> li;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    if (d == dim) continue;
    outer_shape.push_back(shape[d]);
    for (int k = 0; k < N; ++k) outer_strides[k].push_back(strides[k][d]);
  }
  std::array<IntSpan, N> spans;
  for (int k = 0; k < N; ++k) {
    spans[k] = IntSpan(outer_strides[k]);
    li.lane_stride[k] = strides[k][dim];
  }
  DT_ASSIGN_OR_RETURN(li.outer, MakeIndexer<N>(kernel, outer_shape, spans));
  li.lanes = Numel(outer_shape);
  li.n = shape[dim];
  return li;
}

// Strides of `t` (which lacks `dim`) over the full shape, 0 at `dim`.
inline Shape StridesWithDim(const Tensor& t, int dim) {
  Shape s = t.strides();
  s.insert(s.begin() + dim, 0);
  return s;
}

// ---- lane launch shapes and reductions
// -------------------------------------------------------------

// A block of blockDim.x * blockDim.y threads handles blockDim.y lanes with blockDim.x threads each
// (1, 32 or 256); lanes advance by gridDim.x * blockDim.y.
struct LaneLaunch {
  dim3 grid, block;
};

// Threads per lane: one for short lanes, or transposed ones when there are many (neighbouring
// threads then read neighbouring elements); 256 for long contiguous lanes (a block's lane stays
// in L1 between passes); a warp otherwise, or 256 when there are few long lanes.
inline LaneLaunch ChooseLaneLaunch(int64_t lanes, int64_t n, bool lane_contiguous) {
  int per_lane = 256;
  if (n < 16 || (!lane_contiguous && lanes >= 4096 && n <= 4096)) {
    per_lane = 1;
  } else if (lane_contiguous && n >= 1024) {
    per_lane = 256;
  } else if (n <= 4096 || lanes >= 4096) {
    per_lane = 32;
  }
  const int lanes_per_block = 256 / per_lane;
  const int64_t blocks = (lanes + lanes_per_block - 1) / lanes_per_block;
  return {dim3(static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 1 << 20))),
          dim3(static_cast<unsigned>(per_lane), static_cast<unsigned>(lanes_per_block))};
}

// v from the thread whose lane id is this one's xor `mask`: arithmetic types directly, other
// types through their static `ShflXor`.
template <typename V>
__device__ __forceinline__ V ShflXor(const V& v, int mask) {
  if constexpr (std::is_arithmetic_v<V>) {
    return __shfl_xor_sync(0xffffffffu, v, mask);
  } else {
    return V::ShflXor(v, mask);
  }
}

// Reduces v over the blockDim.x threads of this lane with the associative, commutative `op`; every
// thread of the lane gets the result. All threads of the block must call it (it synchronises when
// blockDim.x > 32). `smem` holds at least blockDim.y * 8 values.
template <typename V, typename Op>
__device__ __forceinline__ V LaneReduce(V v, Op op, V* smem) {
  const unsigned width = blockDim.x;
  if (width == 1) return v;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = op(v, ShflXor(v, o));
  if (width <= 32) return v;
  const unsigned warp = threadIdx.x / 32, warps = width / 32;
  __syncthreads();  // smem may still be read by a previous call
  if (threadIdx.x % 32 == 0) smem[threadIdx.y * 8 + warp] = v;
  __syncthreads();
  V r = smem[threadIdx.y * 8];
  for (unsigned w = 1; w < warps; ++w) r = op(r, smem[threadIdx.y * 8 + w]);
  return r;
}

}  // namespace dt::ops::cuda
