// CPU pointwise kernels: Binary, BinaryScalar, Unary, GatedActivation, SoftCap (Modulate:
// cpu/modulate.cc).

#include <algorithm>
#include <cmath>

#include "dtensor/ops/local/cpu/loops.h"
#include "dtensor/ops/local/cpu/vec_math.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::cpu {

namespace {

// Integer arithmetic wraps (two's complement) instead of overflowing.
template <typename C, typename F>
inline C Wrapping(C a, C b, F f) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(f(static_cast<U>(a), static_cast<U>(b)));
  } else {
    return f(a, b);
  }
}

struct AddFn { template <typename C> C operator()(C a, C b) const { return Wrapping(a, b, [](auto x, auto y) { return x + y; }); } };
struct SubFn { template <typename C> C operator()(C a, C b) const { return Wrapping(a, b, [](auto x, auto y) { return x - y; }); } };
struct MulFn { template <typename C> C operator()(C a, C b) const { return Wrapping(a, b, [](auto x, auto y) { return x * y; }); } };
struct DivFn { template <typename C> C operator()(C a, C b) const { return a / b; } };

// Calls body(fn) with the functor of `op`; kDiv only for float T.
template <typename T, typename Body>
void WithBinaryFn(BinaryOp op, Body&& body) {
  switch (op) {
    case BinaryOp::kAdd: return body(AddFn{});
    case BinaryOp::kSub: return body(SubFn{});
    case BinaryOp::kMul: return body(MulFn{});
    case BinaryOp::kDiv:
      if constexpr (kIsFloat<T>) return body(DivFn{});
      return;
  }
}

// out[i] = f(a[i], b[i]) over strided operands, computing in Compute<T>.
template <typename T, typename F>
void Map2(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  Nest<3> nest(out.shape(), {IntSpan(out.strides()), IntSpan(a.strides()), IntSpan(b.strides())});
  T* po = out.data<T>();
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  const int64_t so = nest.inner_stride(0), sa = nest.inner_stride(1), sb = nest.inner_stride(2);
  nest.ForEachRun([&](const std::array<int64_t, 3>& off, int64_t n) {
    T* o = po + off[0];
    const T* x = pa + off[1];
    const T* y = pb + off[2];
    if (so == 1 && sa == 1 && sb == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = Store<T>(f(Load(x[i]), Load(y[i])));
    } else if (so == 1 && sa == 1 && sb == 0) {
      const Compute<T> yv = Load(y[0]);
      for (int64_t i = 0; i < n; ++i) o[i] = Store<T>(f(Load(x[i]), yv));
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * so] = Store<T>(f(Load(x[i * sa]), Load(y[i * sb])));
    }
  });
}

// out[i] = f(x[i]).
template <typename T, typename F>
void Map1(const Tensor& x, const Tensor& out, F f) {
  Nest<2> nest(out.shape(), {IntSpan(out.strides()), IntSpan(x.strides())});
  T* po = out.data<T>();
  const T* px = x.data<T>();
  const int64_t so = nest.inner_stride(0), sx = nest.inner_stride(1);
  nest.ForEachRun([&](const std::array<int64_t, 2>& off, int64_t n) {
    T* o = po + off[0];
    const T* v = px + off[1];
    if (so == 1 && sx == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = Store<T>(f(Load(v[i])));
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * so] = Store<T>(f(Load(v[i * sx])));
    }
  });
}

// out = fn(x) through f32 arrays: fn(const float* in, float* out, n) (vec_math.h), directly on f32
// runs with unit strides, else through a block buffer converted on the way in and out.
template <typename F>
void MapF32Runs(const Tensor& x, const Tensor& out, F fn) {
  Nest<2> nest(out.shape(), {IntSpan(out.strides()), IntSpan(x.strides())});
  const int64_t so = nest.inner_stride(0), sx = nest.inner_stride(1);
  const bool direct = x.dtype() == DType::kF32 && out.dtype() == DType::kF32 && so == 1 && sx == 1;
  nest.ForEachRun([&](const std::array<int64_t, 2>& off, int64_t n) {
    if (direct) return fn(x.data<float>() + off[1], out.data<float>() + off[0], n);
    constexpr int64_t kBlock = 512;
    float buf[kBlock];
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t len = std::min(kBlock, n - i);
      LoadF32(x.dtype(), ElementPtr(x, off[1] + i * sx), len, sx, buf);
      fn(buf, buf, len);
      StoreF32(out.dtype(), ElementPtr(out, off[0] + i * so), len, so, buf);
    }
  });
}

// y[i] = op(x[i]) for a float op, i < n: the vectorized f32 functions Unary uses for Silu, Exp and
// Tanh,
// the row's formula for the others (so that each value is Unary's). y may be x.
#define DT_CPU_UNARY_F32_(name, formula)                  \
  case UnaryOp::k##name:                                  \
    for (int64_t i = 0; i < n; ++i) {                     \
      const float v = x[i];                               \
      y[i] = formula;                                     \
    }                                                     \
    return;
void UnaryF32(UnaryOp op, const float* x, float* y, int64_t n) {
  if (op == UnaryOp::kSilu) return SiluF32(x, y, n);
  if (op == UnaryOp::kExp) return ExpF32(x, y, n);
  if (op == UnaryOp::kTanh) return TanhF32(x, y, n);
  switch (op) {
    case UnaryOp::kNeg:
      for (int64_t i = 0; i < n; ++i) y[i] = 0.0f - x[i];
      return;
    DT_GELU_OPS(DT_CPU_UNARY_F32_)
    DT_UNARY_OPS(DT_CPU_UNARY_F32_)
  }
}
#undef DT_CPU_UNARY_F32_

// y[i] *= u[i] for i < n (separate arrays, so the loop vectorizes).
void MulInPlace(float* __restrict y, const float* __restrict u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= u[i];
}

}  // namespace

absl::Status Binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  DT_OPS_DISPATCH_NUMERIC(out.dtype(), T, [&] {
    WithBinaryFn<T>(op, [&](auto fn) { Map2<T>(a, b, out, fn); });
  });
  return absl::OkStatus();
}

absl::Status BinaryScalar(BinaryOp op, const Tensor& x, double s, const Tensor& out) {
  DT_OPS_DISPATCH_NUMERIC(out.dtype(), T, [&] {
    const Compute<T> sv = kIsFloat<T> ? static_cast<Compute<T>>(static_cast<float>(s))
                                      : static_cast<Compute<T>>(static_cast<int64_t>(s));
    WithBinaryFn<T>(op, [&](auto fn) { Map1<T>(x, out, [&](Compute<T> v) { return fn(v, sv); }); });
  });
  return absl::OkStatus();
}

// A row of DT_UNARY_OPS or DT_GELU_OPS (ops.h), one element at a time.
#define DT_CPU_UNARY_(name, formula)                          \
  case UnaryOp::k##name:                                      \
    Map1<T>(x, out, [](float v) -> float { return formula; }); \
    break;

absl::Status Unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  DT_OPS_DISPATCH_NUMERIC(out.dtype(), T, [&] {
    using C = Compute<T>;
    if (op == UnaryOp::kNeg) {
      Map1<T>(x, out, [](C v) { return Wrapping(C{0}, v, [](auto p, auto q) { return p - q; }); });
      return;
    }
    if constexpr (kIsFloat<T>) {
      // Vectorized f32 runs where we have them, else the row's formula.
      if (op == UnaryOp::kSilu) return MapF32Runs(x, out, SiluF32);
      if (op == UnaryOp::kExp) return MapF32Runs(x, out, ExpF32);
      if (op == UnaryOp::kTanh) return MapF32Runs(x, out, TanhF32);
      switch (op) {
        case UnaryOp::kNeg: break;
        DT_GELU_OPS(DT_CPU_UNARY_)
        DT_UNARY_OPS(DT_CPU_UNARY_)
      }
    }
  });
  return absl::OkStatus();
}
#undef DT_CPU_UNARY_

// out = cap · tanh(x / cap) in f32 (TanhF32: Note [Vector tanh]), rounded once.
absl::Status SoftCap(const Tensor& x, double cap, const Tensor& out) {
  const float c = static_cast<float>(cap);
  MapF32Runs(x, out, [c](const float* in, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = in[i] / c;
    TanhF32(y, y, n);
    for (int64_t i = 0; i < n; ++i) y[i] *= c;
  });
  return absl::OkStatus();
}

absl::Status GatedActivation(UnaryOp act, const Tensor& gate, const Tensor& up, const Tensor& out) {
  Nest<3> nest(out.shape(),
               {IntSpan(out.strides()), IntSpan(gate.strides()), IntSpan(up.strides())});
  const int64_t so = nest.inner_stride(0), sg = nest.inner_stride(1), su = nest.inner_stride(2);
  const DType dtype = out.dtype();
  // f32 runs of unit stride are read and written where they lie; others through f32 blocks.
  const bool direct = dtype == DType::kF32 && so == 1 && sg == 1 && su == 1;
  nest.ForEachRun([&](const std::array<int64_t, 3>& off, int64_t n) {
    constexpr int64_t kBlock = 512;
    float g[kBlock], u[kBlock];
    uint16_t half[kBlock];
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t len = std::min(kBlock, n - i);
      if (direct) {
        float* o = out.data<float>() + off[0] + i;
        UnaryF32(act, gate.data<float>() + off[1] + i, o, len);
        MulInPlace(o, up.data<float>() + off[2] + i, len);
        continue;
      }
      LoadF32(dtype, ElementPtr(gate, off[1] + i * sg), len, sg, g);
      UnaryF32(act, g, g, len);
      if (dtype != DType::kF32) {  // act(gate) rounded as Unary's output is
        StoreF32(dtype, half, len, 1, g);
        LoadF32(dtype, half, len, 1, g);
      }
      LoadF32(dtype, ElementPtr(up, off[2] + i * su), len, su, u);
      MulInPlace(g, u, len);
      StoreF32(dtype, ElementPtr(out, off[0] + i * so), len, so, g);
    }
  });
  return absl::OkStatus();
}

}  // namespace dt::ops::cpu
