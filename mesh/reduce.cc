#include "dtensor/mesh/reduce.h"

#include <type_traits>
#include <utility>

namespace dt::internal {
namespace {

template <typename T>
inline T Apply(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return static_cast<T>(a + b);
    case ReduceOp::kProd:
      return static_cast<T>(a * b);
    case ReduceOp::kMin:
      return (a < b || a != a) ? a : b;  // a != a: NaN propagates
    case ReduceOp::kMax:
      return (a > b || a != a) ? a : b;
  }
  return a;
}

// One loop per op so the compiler vectorises the common (f32 sum) case. out may be a (in place)
// but may not overlap b. The in-place case has a loop of its own, with every pointer restrict: a
// loop where out and a may alias gets a run-time overlap check, which out == a fails.
template <typename T, ReduceOp kOp>
void Loop(T* __restrict out, const T* __restrict a, const T* __restrict b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = Apply<T>(a[i], b[i], kOp);
}
template <typename T, ReduceOp kOp>
void InPlaceLoop(T* __restrict acc, const T* __restrict b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] = Apply<T>(acc[i], b[i], kOp);
}

template <typename H, ReduceOp kOp>
void HalfLoop(H* __restrict out, const H* __restrict a, const H* __restrict b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = H(Apply<float>(static_cast<float>(a[i]), static_cast<float>(b[i]), kOp));
  }
}
template <typename H, ReduceOp kOp>
void HalfInPlaceLoop(H* __restrict acc, const H* __restrict b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    acc[i] = H(Apply<float>(static_cast<float>(acc[i]), static_cast<float>(b[i]), kOp));
  }
}

template <typename T>
void Dispatch(void* out, const void* a, const void* b, int64_t n, ReduceOp op) {
  auto run = [&](auto op_tag) {
    constexpr ReduceOp kOp = decltype(op_tag)::value;
    T* o = static_cast<T*>(out);
    const T* x = static_cast<const T*>(a);
    const T* y = static_cast<const T*>(b);
    if (o == y) std::swap(x, y);  // the ops commute
    if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
      o == x ? HalfInPlaceLoop<T, kOp>(o, y, n) : HalfLoop<T, kOp>(o, x, y, n);
    } else {
      o == x ? InPlaceLoop<T, kOp>(o, y, n) : Loop<T, kOp>(o, x, y, n);
    }
  };
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return run(std::integral_constant<ReduceOp, ReduceOp::kSum>{});
    case ReduceOp::kProd: return run(std::integral_constant<ReduceOp, ReduceOp::kProd>{});
    case ReduceOp::kMin: return run(std::integral_constant<ReduceOp, ReduceOp::kMin>{});
    case ReduceOp::kMax: return run(std::integral_constant<ReduceOp, ReduceOp::kMax>{});
  }
}

}  // namespace

void Reduce3(void* out, const void* a, const void* b, int64_t n, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kF32: return Dispatch<float>(out, a, b, n, op);
    case DType::kF16: return Dispatch<Float16>(out, a, b, n, op);
    case DType::kBF16: return Dispatch<BFloat16>(out, a, b, n, op);
    case DType::kI64: return Dispatch<int64_t>(out, a, b, n, op);
    case DType::kI32: return Dispatch<int32_t>(out, a, b, n, op);
    case DType::kU8: return Dispatch<uint8_t>(out, a, b, n, op);
    case DType::kBool: DT_CHECK(false, "bool reductions are rejected by the communicator");
    default: DT_CHECK(false, "quantized tensors are rejected by the communicator");
  }
}

void ReduceInto(void* acc, const void* src, int64_t n, DType dtype, ReduceOp op) {
  Reduce3(acc, acc, src, n, dtype, op);
}

void DivideInPlace(void* acc, int64_t n, DType dtype, int64_t divisor) {
  auto run = [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
      for (int64_t i = 0; i < n; ++i) p[i] = T(static_cast<float>(p[i]) / static_cast<float>(divisor));
    } else if constexpr (std::is_floating_point_v<T>) {
      const T d = static_cast<T>(divisor);
      for (int64_t i = 0; i < n; ++i) p[i] = p[i] / d;
    } else {
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(static_cast<int64_t>(p[i]) / divisor);
    }
  };
  switch (dtype) {
    case DType::kF32: return run(static_cast<float*>(acc));
    case DType::kF16: return run(static_cast<Float16*>(acc));
    case DType::kBF16: return run(static_cast<BFloat16*>(acc));
    case DType::kI64: return run(static_cast<int64_t*>(acc));
    case DType::kI32: return run(static_cast<int32_t*>(acc));
    case DType::kU8: return run(static_cast<uint8_t*>(acc));
    case DType::kBool: DT_CHECK(false, "bool reductions are rejected by the communicator");
    default: DT_CHECK(false, "quantized tensors are rejected by the communicator");
  }
}

absl::Status DivideInPlace(const Tensor& t, int64_t divisor) {
  if (divisor == 1 || t.numel() == 0 || t.dtype() == DType::kBool) return absl::OkStatus();
  if (t.device().is_cpu()) {
    DivideInPlace(t.raw_data(), t.numel(), t.dtype(), divisor);
    return absl::OkStatus();
  }
  DT_ASSIGN_OR_RETURN(Tensor host, t.To(kCPU));
  DivideInPlace(host.raw_data(), host.numel(), host.dtype(), divisor);
  return t.CopyFrom(host);
}

}  // namespace dt::internal
