// oneDNN's kept weights layouts (Note [oneDNN weights layout] in ops/local/cpu/gemm_dnnl.cc): a
// read-only weight multiplied in the layout reordered once and kept gives the plain path's result
// (its bits, or within f32 accumulation's order bound where oneDNN runs another kernel on it),
// keeps one layout per part of the output split, within the budget, and only for weights.

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "absl/strings/str_cat.h"

#include "dtensor/ops/local/cpu/gemm_backends.h"
#include "dtensor/ops/local/cpu/gemm_dispatch.h"
#include "dtensor/ops/local/cpu/kept_weights.h"
#include "dtensor/ops/local/cpu/tuner.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/ops/local/test_util.h"

namespace dt::ops {
namespace {

using cpu::gemm::Backend;
using ForceBackend = testing::Forced<Backend, cpu::gemm::SetBackendForTesting>;

Tensor Normal(const Shape& shape, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(static_cast<size_t>(Numel(shape)));
  for (double& x : v) x = normal(rng);
  return Tensor::FromDoubles(shape, v, dtype).value();
}

// t's elements behind a read-only Storage, as a checkpoint's mapped weights are.
Tensor ReadOnly(const Tensor& t) {
  const Storage& s = t.storage();
  return Tensor(Storage::Alias(s, s.data(), s.nbytes(), /*read_only=*/true), t.shape(), t.strides(),
                t.storage_offset(), t.dtype());
}

// oneDNN with its weights prepacked (the knob forced) and a budget for the scope; plain after.
class Prepacked {
 public:
  explicit Prepacked(int64_t budget) {
    for (const DType t : {DType::kF32, DType::kBF16}) {
      cpu::tune::ForceForTesting(cpu::gemm::DnnlWeightsKnob(t), 1);
    }
    cpu::kept::SetBudget(budget);
  }
  ~Prepacked() {
    cpu::kept::SetBudget(0);
    for (const DType t : {DType::kF32, DType::kBF16}) {
      cpu::tune::ForceForTesting(cpu::gemm::DnnlWeightsKnob(t), std::nullopt);
    }
  }
};

// "" when got and want, two results of x · wᵀ + bias accumulated in f32 in different orders, differ
// by at most what that allows: per element 2·γ_K·Σ_k |x_ik·w_jk| (+ |bias_j|), γ_K = K·u / (1 - K·u)
// with u = 2⁻²⁴ (each order's error bound, twice), plus one ulp of the output type where it rounds
// to bf16; else the first element past it. Sets `worst` to the largest |got - want| / bound.
std::string WithinOrderBound(const Tensor& got, const Tensor& want, const Tensor& x, const Tensor& w,
                             const Tensor& bias, double& worst) {
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  const std::vector<double> g = got.ToDoubles(), e = want.ToDoubles(), xv = x.ToDoubles(), wv = w.ToDoubles();
  const std::vector<double> bv = bias.defined() ? bias.ToDoubles() : std::vector<double>(n, 0.0);
  const double u = std::ldexp(1.0, -24), gamma = k * u / (1 - k * u);
  const double out_ulp = got.dtype() == DType::kBF16 ? std::ldexp(1.0, -7) : 0.0;
  worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = std::abs(bv[j]);
      for (int64_t p = 0; p < k; ++p) sum += std::abs(xv[i * k + p] * wv[j * k + p]);
      const double d = std::abs(g[i * n + j] - e[i * n + j]);
      const double bound = 2 * gamma * sum + out_ulp * std::abs(e[i * n + j]);
      if (d > 0) worst = std::max(worst, d / bound);
      if (d > bound) {
        return absl::StrCat("(", i, ", ", j, "): ", g[i * n + j], " against ", e[i * n + j], ", bound ", bound);
      }
    }
  }
  return "";
}

// Random shapes (M from decode to prefill, N and K across oneDNN's blocks, whole and split over
// the threads), f32 and bf16, with and without a bias, a weight and a row view of it: the kept
// layout gives the plain path's result, on the call that makes it and on the one that reuses it.
// oneDNN may run another kernel on the kept layout than on the plain weight (its brgemm against
// its jit GEMM), whose order of accumulation over K differs: then the results agree within what
// f32 accumulation in any order allows (Note [oneDNN weights layout]); otherwise bit for bit.
RC_GTEST_PROP(DnnlWeightsTest, PrepackedGivesThePlainResult, ()) {
  ForceBackend force(Backend::kDnnl);
  const DType t = *rc::gen::element(DType::kF32, DType::kBF16);
  const int64_t m = *rc::gen::inRange<int64_t>(1, 300);
  const int64_t n = *rc::gen::inRange<int64_t>(1, 700);
  const int64_t k = *rc::gen::inRange<int64_t>(1, 700);
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  const Tensor whole = ReadOnly(Normal({n + 5, k}, t, seed));
  const int64_t first = *rc::gen::inRange<int64_t>(0, 6);
  const Tensor w = whole.Narrow(0, first, n).value();
  const Tensor x = Normal({m, k}, t, seed + 1);
  const Tensor bias = *rc::gen::arbitrary<bool>() ? Normal({n}, t, seed + 2) : Tensor();
  const Tensor plain = Linear(x, w, bias).value();
  Prepacked keep(int64_t{1} << 30);
  for (const char* call : {"making", "reusing"}) {
    const Tensor kept = Linear(x, w, bias).value();
    RC_TAG(call);
    if (Equal(kept, plain)) continue;
    double worst = 0;
    const std::string off = WithinOrderBound(kept, plain, x, w, bias, worst);
    RC_ASSERT(off == "");
    RC_TAG(DTypeName(t), "differs", worst < 0.01 ? "by < 1% of the bound" : "by >= 1% of the bound");
  }
  RC_TAG(cpu::kept::Bytes() > 0 ? "kept" : "plain layout asked");
}

// What is kept: nothing for a weight that may change (not read-only) or with no budget; for a
// read-only weight, its layout once whatever M (a prefill of another length reuses it); nothing
// past the budget (the plain path then, with the same bits); and the layout goes with its weight.
TEST(DnnlWeightsTest, KeptLayoutsStayWithinTheBudgetAndTheWeight) {
  ForceBackend force(Backend::kDnnl);
  const DType t = DType::kBF16;
  const Tensor x = Normal({256, 576}, t, 1), x2 = Normal({160, 576}, t, 2);
  const Tensor writable = Normal({1536, 576}, t, 3);
  Tensor w = ReadOnly(writable);
  const Tensor v = ReadOnly(Normal({1536, 576}, t, 4));
  const Tensor want = Linear(x, w).value(), want2 = Linear(x2, w).value(),
               want_v = Linear(x, v).value();
  {
    Prepacked keep(0);
    EXPECT_TRUE(Equal(Linear(x, w).value(), want));
    EXPECT_EQ(cpu::kept::Bytes(), 0);
  }
  Prepacked keep(int64_t{1} << 30);
  EXPECT_TRUE(Equal(Linear(x, writable).value(), want));
  EXPECT_EQ(cpu::kept::Bytes(), 0) << "a writable operand's layout was kept";
  EXPECT_TRUE(Equal(Linear(x, w).value(), want));
  const int64_t one = cpu::kept::Bytes();
  if (one == 0) GTEST_SKIP() << "oneDNN multiplies plain bf16 weights here: nothing to keep";
  EXPECT_GE(one, 1536 * 576 * 2);
  EXPECT_TRUE(Equal(Linear(x2, w).value(), want2));
  EXPECT_EQ(cpu::kept::Bytes(), one) << "another M made another layout";
  cpu::kept::SetBudget(0);  // drops what is kept; then room for w's layouts only
  cpu::kept::SetBudget(one);
  EXPECT_TRUE(Equal(Linear(x, w).value(), want));
  EXPECT_EQ(cpu::kept::Bytes(), one);
  EXPECT_TRUE(Equal(Linear(x, v).value(), want_v));  // over the budget: plain
  EXPECT_EQ(cpu::kept::Bytes(), one);
  w = Tensor();  // w's layouts go at the next miss, which then fits v's
  EXPECT_TRUE(Equal(Linear(x, v).value(), want_v));
  EXPECT_EQ(cpu::kept::Bytes(), one);
}

}  // namespace
}  // namespace dt::ops
