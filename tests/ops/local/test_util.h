#pragma once
// Helpers for the ops/local property tests: random tensors with random memory layouts, plain
// row-major index arithmetic for the naive references (naive attention among them), and tolerant
// comparison.

#include <algorithm>
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

// Naive attention of q [B, Hq, Sq, D], k [B, Hkv, Skv, D] and v [B, Hkv, Skv, Dv] with the
// options, in double, straight from their definitions: out [B, Hq, Sq, Dv], row-major.
struct NaiveAttentionOptions {
  bool causal = true;
  double scale = 1, softcap = 0;
  int64_t window = 0, kv_length = 0, q_offset = 0;
  std::vector<double> sinks;  // [Hq] or empty
  std::vector<double> mask;   // [Bm, Sq, Skv] or empty
  int64_t mask_b = 0;
};
inline std::vector<double> NaiveAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const NaiveAttentionOptions& o) {
  const int64_t b = q.size(0), hq = q.size(1), sq = q.size(2), d = q.size(3);
  const int64_t hkv = k.size(1), skv = k.size(2), dv = v.size(3);
  const std::vector<double> qv = q.ToDoubles(), kv = k.ToDoubles(), vv = v.ToDoubles();
  std::vector<double> out(static_cast<size_t>(b * hq * sq * dv), 0.0);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = h / (hq / hkv);
      for (int64_t i = 0; i < sq; ++i) {
        std::vector<double> w;
        std::vector<int64_t> js;
        for (int64_t j = 0; j < o.kv_length; ++j) {
          const int64_t pos = o.q_offset + i;
          if (o.causal && j > pos) continue;
          if (o.window > 0 && j <= pos - o.window) continue;
          double s = 0;
          for (int64_t e = 0; e < d; ++e) {
            s += qv[((bi * hq + h) * sq + i) * d + e] * kv[((bi * hkv + g) * skv + j) * d + e];
          }
          s *= o.scale;
          if (o.softcap > 0) s = o.softcap * std::tanh(s / o.softcap);
          if (!o.mask.empty()) s += o.mask[((o.mask_b == 1 ? 0 : bi) * sq + i) * skv + j];
          w.push_back(s);
          js.push_back(j);
        }
        double mx = o.sinks.empty() ? -INFINITY : o.sinks[h];
        for (double s : w) mx = std::max(mx, s);
        if (mx == -INFINITY) continue;
        double sum = o.sinks.empty() ? 0 : std::exp(o.sinks[h] - mx);
        for (double& s : w) sum += s = std::exp(s - mx);
        for (int64_t e = 0; e < dv; ++e) {
          double acc = 0;
          for (size_t j = 0; j < w.size(); ++j)
            acc += w[j] / sum * vv[((bi * hkv + g) * skv + js[j]) * dv + e];
          out[((bi * hq + h) * sq + i) * dv + e] = sum > 0 ? acc : 0;
        }
      }
    }
  }
  return out;
}

}  // namespace dt::testing
