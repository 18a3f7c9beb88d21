#pragma once
// Helpers for the ops/local property tests: random tensors with random memory layouts, plain
// row-major index arithmetic for the naive references, and tolerant comparison.

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <rapidcheck.h>

#include "absl/strings/str_cat.h"
#include "dtensor/core/tensor.h"

namespace dt::testing {

enum class Values { kNormal, kPositive, kSmallInts };

// A tensor of `shape` and `dtype` whose memory layout is random: a buffer with the dims in a random
// order and random padding per dim, narrowed at a random offset and permuted back. Values come from
// std::mt19937_64 (independent of core's RNG): kNormal ~ N(0, 1), kPositive in [0.1, 3),
// kSmallInts integers in [-4, 4] (many ties). Integer dtypes get integers in [-50, 50] ([0, 100]
// for u8, {0, 1} for bool) unless kSmallInts.
inline Tensor RandomTensor(IntSpan shape, DType dtype, Values values = Values::kNormal,
                           bool contiguous = false) {
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  std::mt19937_64 rng(seed);
  const int nd = static_cast<int>(shape.size());
  std::vector<int64_t> perm(static_cast<size_t>(nd)), pad(static_cast<size_t>(nd), 0);
  std::iota(perm.begin(), perm.end(), 0);
  if (!contiguous) {
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int d = 0; d < nd; ++d) pad[d] = static_cast<int64_t>(rng() % 4) / 2;  // 0, 0, 1, 1
  }
  Shape base_shape(static_cast<size_t>(nd));
  for (int i = 0; i < nd; ++i) base_shape[i] = shape[perm[i]] + pad[perm[i]];
  std::vector<double> v(static_cast<size_t>(Numel(base_shape)));
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> positive(0.1, 3.0);
  std::uniform_int_distribution<int> small(-4, 4), ints(-50, 50), u8(0, 100), bit(0, 1);
  for (double& x : v) {
    if (dtype == DType::kBool) x = bit(rng);
    else if (values == Values::kSmallInts) x = small(rng);
    else if (dtype == DType::kU8) x = u8(rng);
    else if (!IsFloating(dtype)) x = ints(rng);
    else if (values == Values::kPositive) x = positive(rng);
    else x = normal(rng);
  }
  Tensor t = Tensor::FromDoubles(base_shape, v, dtype).value();
  for (int i = 0; i < nd; ++i) {
    const int64_t off = pad[perm[i]] > 0 ? static_cast<int64_t>(rng() % 2) : 0;
    t = t.Narrow(i, off, shape[perm[i]]).value();
  }
  std::vector<int64_t> inv(static_cast<size_t>(nd));
  for (int i = 0; i < nd; ++i) inv[perm[i]] = i;
  return t.Permute(inv).value();
}

// A random shape of `rank` dims, each in [lo, hi]; one case in ten has one dim in [300, 3000]
// instead, so that the kernels' multi-threaded paths run too.
inline Shape RandomShape(int rank, int64_t lo, int64_t hi) {
  Shape s;
  for (int i = 0; i < rank; ++i) s.push_back(*rc::gen::inRange<int64_t>(lo, hi + 1));
  if (rank > 0 && *rc::gen::inRange(0, 10) == 0) {
    s[*rc::gen::inRange(0, rank)] = *rc::gen::inRange<int64_t>(300, 3001);
  }
  return s;
}

inline DType RandomFloatDType() { return *rc::gen::element(DType::kF32, DType::kBF16, DType::kF16); }

// Row-major index arithmetic.
inline int64_t FlatIndex(IntSpan idx, IntSpan shape) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + idx[d];
  return f;
}
inline Shape Unravel(int64_t flat, IntSpan shape) {
  Shape idx(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return idx;
}
// Index into a broadcast operand of `shape` (trailing-aligned) from an output index.
inline int64_t BroadcastFlat(IntSpan out_idx, IntSpan shape) {
  const size_t lead = out_idx.size() - shape.size();
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + (shape[d] == 1 ? 0 : out_idx[lead + d]);
  return f;
}

// v rounded to dtype (the result an exact op would store).
inline double RoundTo(DType dtype, double v) {
  switch (dtype) {
    case DType::kF32: return static_cast<float>(v);
    case DType::kBF16: return static_cast<float>(BFloat16(static_cast<float>(v)));
    case DType::kF16: return static_cast<float>(Float16(static_cast<float>(v)));
    default: return v;
  }
}

// Tolerances for a result rounded once to dtype after f32 arithmetic.
struct Tol {
  double atol, rtol;
};
inline Tol TolFor(DType dtype, double scale = 1.0) {
  switch (dtype) {
    case DType::kBF16: return {1e-2 * scale, 8e-3};
    case DType::kF16: return {1e-3 * scale, 1e-3};
    case DType::kF32: return {1e-5 * scale, 1e-5};
    default: return {0, 0};
  }
}

// "" when `got` has `shape` and is elementwise within atol + rtol*|want| of `want` (NaNs must match),
// else a description of the first mismatch.
inline std::string Mismatch(const Tensor& got, IntSpan shape, const std::vector<double>& want,
                            Tol tol = {0, 0}) {
  if (got.shape() != Shape(shape.begin(), shape.end())) {
    return absl::StrCat("shape: got ", ShapeToString(got.shape()), ", want ", ShapeToString(shape));
  }
  const std::vector<double> g = got.ToDoubles();
  if (g.size() != want.size()) return absl::StrCat("size: got ", g.size(), ", want ", want.size());
  for (size_t i = 0; i < g.size(); ++i) {
    const bool ok = (std::isnan(g[i]) && std::isnan(want[i])) || g[i] == want[i] ||
                    std::abs(g[i] - want[i]) <= tol.atol + tol.rtol * std::abs(want[i]);
    if (!ok) {
      return absl::StrCat("at ", ShapeToString(Unravel(static_cast<int64_t>(i), shape)), ": got ", g[i],
                          ", want ", want[i], " (atol ", tol.atol, ", rtol ", tol.rtol, ") in ",
                          got.Describe());
    }
  }
  return "";
}

// The instruction sets of `all` that this CPU runs (`supported`): what a kernel test tries each of.
template <typename Isa, typename Range = std::initializer_list<Isa>>
std::vector<Isa> SupportedIsas(const Range& all, bool (*supported)(Isa)) {
  std::vector<Isa> out;
  for (Isa isa : all) {
    if (supported(isa)) out.push_back(isa);
  }
  return out;
}

// Forces a kernel choice (an instruction set, a backend) for one scope: `Set(value)` at the start,
// `Set(std::nullopt)` (the detected choice) at the end.
template <typename T, void (*Set)(std::optional<T>)>
class Forced {
 public:
  explicit Forced(T value) { Set(value); }
  Forced(const Forced&) = delete;
  Forced& operator=(const Forced&) = delete;
  ~Forced() { Set(std::nullopt); }
};

}  // namespace dt::testing
