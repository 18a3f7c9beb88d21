// Every CPU GEMM path (skinny dot and axpy, packed, batched; K blocking, super-blocks, edge tiles,
// the threaded splits) under every instruction set this CPU supports, and on every backend (own
// kernels, oneDNN, OpenBLAS: Note [GEMM dispatch]), against naive loops in double. Matmul picks
// the path from the shapes (gemm.cc); the kernel set and the backend are forced per test.

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <tbb/parallel_for.h>

#include "dtensor/ops/local/cpu/gemm_dispatch.h"
#include "dtensor/ops/local/cpu/gemm_kernels.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/ops/local/test_util.h"

namespace dt::ops {
namespace {

using cpu::gemm::Backend;
using cpu::gemm::Isa;

std::vector<Isa> SupportedIsas() {
  return testing::SupportedIsas({Isa::kGeneric, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16},
                                cpu::gemm::IsaSupported);
}

// Force a kernel set, a backend, for one scope.
using ForceIsa = testing::Forced<Isa, cpu::gemm::SetIsaForTesting>;
using ForceBackend = testing::Forced<Backend, cpu::gemm::SetBackendForTesting>;

// A random backend and a dtype it runs (own: any float dtype; oneDNN f32 or bf16; OpenBLAS f32).
std::pair<Backend, DType> RandomBackendAndDType() {
  const Backend b = *rc::gen::element(Backend::kOwn, Backend::kDnnl, Backend::kOpenBlas);
  switch (b) {
    case Backend::kOwn: return {b, testing::RandomFloatDType()};
    case Backend::kDnnl: return {b, *rc::gen::element(DType::kF32, DType::kBF16)};
    case Backend::kOpenBlas: break;
  }
  return {b, DType::kF32};
}

// out[i, j] = sum_p a(i, p) b(p, j) (+ bias[j]) in double, for 2-D a [M, K] (or [K, M] when ta)
// and b [K, N] (or [N, K] when tb).
std::vector<double> Naive(const Tensor& a, const Tensor& b, bool ta, bool tb, const Tensor& bias) {
  const std::vector<double> av = a.ToDoubles(), bv = b.ToDoubles();
  const int64_t m = ta ? a.size(1) : a.size(0), k = ta ? a.size(0) : a.size(1);
  const int64_t n = tb ? b.size(0) : b.size(1);
  const std::vector<double> biasv = bias.defined() ? bias.ToDoubles() : std::vector<double>();
  std::vector<double> out(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = biasv.empty() ? 0.0 : biasv[j];
      for (int64_t p = 0; p < k; ++p) {
        s += av[ta ? p * m + i : i * k + p] * bv[tb ? j * k + p : p * n + j];
      }
      out[i * n + j] = s;
    }
  }
  return out;
}

// Random N(0, 1) tensor, contiguous.
Tensor Normal(const Shape& shape, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> v(static_cast<size_t>(Numel(shape)));
  for (double& x : v) x = normal(rng);
  return Tensor::FromDoubles(shape, v, dtype).value();
}

// One product through Matmul (or Linear when `linear`: b is then w [N, K] and bias may be set),
// checked against the naive loops.
std::string Check(const Tensor& a, const Tensor& b, bool ta, bool tb, const Tensor& bias, bool linear) {
  const int64_t k = ta ? a.size(0) : a.size(1);
  const std::vector<double> want = Naive(a, b, ta, tb, bias);
  const Tensor got = linear ? Linear(a, b, bias).value() : Matmul(a, b, ta, tb).value();
  const int64_t m = ta ? a.size(1) : a.size(0), n = tb ? b.size(0) : b.size(1);
  return testing::Mismatch(got, {m, n}, want,
                           testing::TolFor(a.dtype(), std::sqrt(static_cast<double>(k) + 1)));
}

// A random [m, k] x [k, n] product in `dtype` checked against the naive loops: either operand
// transposed at random; through Linear at random when b is transposed and a is not, with a bias
// always (`always_bias`) or at random.
void CheckRandomProduct(int64_t m, int64_t n, int64_t k, DType dtype, bool always_bias) {
  const bool ta = *rc::gen::arbitrary<bool>(), tb = *rc::gen::arbitrary<bool>();
  const bool linear = tb && !ta && *rc::gen::arbitrary<bool>();
  const Tensor a = testing::RandomTensor(ta ? Shape{k, m} : Shape{m, k}, dtype);
  const Tensor b = testing::RandomTensor(tb ? Shape{n, k} : Shape{k, n}, dtype);
  const bool with_bias = linear && (always_bias || *rc::gen::arbitrary<bool>());
  const Tensor bias = with_bias ? testing::RandomTensor({n}, dtype) : Tensor();
  RC_ASSERT(Check(a, b, ta, tb, bias, linear) == "");
}

// Skinny products (M <= 8): dot layout (Linear, or Matmul with b transposed) and axpy layout
// (Matmul with b as [K, N]; N of 32, 64 and 128 columns, whole vectors on both sets, with c held in
// registers: Note [Axpy in registers]); x in random layouts; K up to 2000 so that M = 5..8 takes
// the K blocks.
RC_GTEST_PROP(GemmPathsTest, SkinnyAgreesWithNaiveLoops, ()) {
  const std::vector<Isa> isas = SupportedIsas();
  const Isa isa = *rc::gen::elementOf(isas);
  ForceIsa force(isa);
  const auto [backend, dtype] = RandomBackendAndDType();
  ForceBackend force_backend(backend);
  const int64_t m = *rc::gen::inRange<int64_t>(1, 9);
  const int64_t n = *rc::gen::oneOf(rc::gen::inRange<int64_t>(1, 40),
                                    rc::gen::inRange<int64_t>(40, 300),
                                    rc::gen::element<int64_t>(32, 64, 128));
  const int64_t k = *rc::gen::oneOf(rc::gen::inRange<int64_t>(1, 70), rc::gen::inRange<int64_t>(70, 2000));
  CheckRandomProduct(m, n, k, dtype, /*always_bias=*/false);
}

// Packed products (M > 8) around the micro-tile edges (12 x 32, 6 x 16, 4 x 16).
RC_GTEST_PROP(GemmPathsTest, PackedAgreesWithNaiveLoops, ()) {
  const std::vector<Isa> isas = SupportedIsas();
  ForceIsa force(*rc::gen::elementOf(isas));
  const auto [backend, dtype] = RandomBackendAndDType();
  ForceBackend force_backend(backend);
  const int64_t m = *rc::gen::inRange<int64_t>(9, 60), n = *rc::gen::inRange<int64_t>(1, 80);
  const int64_t k = *rc::gen::inRange<int64_t>(1, 600);
  CheckRandomProduct(m, n, k, dtype, /*always_bias=*/true);
}

// Products large enough to be split over the threads (the libraries' grids of parts, Note
// [Library threads]), on a random backend, in random layouts, with a bias through Linear.
RC_GTEST_PROP(GemmPathsTest, EveryBackendSplitAgreesWithNaiveLoops, ()) {
  const auto [backend, dtype] = RandomBackendAndDType();
  ForceBackend force_backend(backend);
  const int64_t m = *rc::gen::inRange<int64_t>(1, 400), n = *rc::gen::inRange<int64_t>(1, 400);
  const int64_t k = *rc::gen::inRange<int64_t>(1, 300);
  CheckRandomProduct(m, n, k, dtype, /*always_bias=*/false);
}

// Shapes that reach the threaded splits and the blocking limits, on every kernel set.
TEST(GemmPathsTest, LargeShapesAgreeWithNaiveLoops) {
  struct Case {
    int64_t m, n, k;
    bool ta, tb;
    DType dtype;
    const char* what;
  };
  const Case cases[] = {
      {203, 301, 517, false, false, DType::kF32, "row blocks, edge tiles"},
      {20, 2100, 1030, false, true, DType::kF32, "two N blocks of packed B (K=1030)"},
      {20, 2100, 1030, true, false, DType::kBF16, "two N blocks, bf16, a transposed"},
      {13, 40, 8300, false, false, DType::kBF16, "three K super-blocks, bf16 (full f32 scratch)"},
      {13, 40, 8300, false, true, DType::kF32, "three K super-blocks, f32"},
      {8, 700, 3000, false, true, DType::kF32, "skinny dot, K blocks, threaded"},
      {7, 700, 3000, false, true, DType::kBF16, "skinny dot, K blocks, bf16"},
      {5, 999, 777, false, false, DType::kF16, "skinny axpy, K split over threads, f16"},
      {1, 3001, 1000, true, false, DType::kBF16, "skinny axpy, M=1, x transposed"},
      {1, 301, 2500, false, true, DType::kBF16, "skinny dot, M=1, long rows (the widest tile side by side)"},
      {1, 299, 1100, false, true, DType::kF32, "skinny dot, M=1, long f32 rows"},
  };
  for (const Isa isa : SupportedIsas()) {
    ForceIsa force(isa);
    uint64_t seed = 1;
    for (const Case& c : cases) {
      const Tensor a = Normal(c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, c.dtype, seed++);
      const Tensor b = Normal(c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, c.dtype, seed++);
      EXPECT_EQ(Check(a, b, c.ta, c.tb, Tensor(), false), "")
          << c.what << " on " << cpu::gemm::IsaName(isa);
    }
  }
  // The libraries on the same shapes (those of the dtypes they run).
  for (const Backend backend : {Backend::kDnnl, Backend::kOpenBlas}) {
    ForceBackend force(backend);
    uint64_t seed = 1;
    for (const Case& c : cases) {
      const Tensor a = Normal(c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, c.dtype, seed++);
      const Tensor b = Normal(c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, c.dtype, seed++);
      if (!cpu::gemm::BackendRuns(backend, c.dtype)) continue;
      EXPECT_EQ(Check(a, b, c.ta, c.tb, Tensor(), false), "")
          << c.what << " on " << cpu::gemm::BackendName(backend);
    }
  }
}

// Batches: many small products (one per task, each single-threaded), skinny ones, and a batch
// broadcast against a shared right operand; with a bias through Linear.
TEST(GemmPathsTest, BatchesAgreeWithNaiveLoops) {
  for (const Isa isa : SupportedIsas()) {
    ForceIsa force(isa);
    for (const auto& [batch, m, n, k] : std::vector<std::array<int64_t, 4>>{
             {16, 24, 40, 64}, {32, 1, 300, 64}, {6, 4, 50, 33}}) {
      const Tensor a = Normal({batch, m, k}, DType::kBF16, 3), b = Normal({batch, k, n}, DType::kBF16, 4);
      const Tensor got = Matmul(a, b).value();
      std::vector<double> want;
      for (int64_t i = 0; i < batch; ++i) {
        const std::vector<double> one =
            Naive(a.Select(0, i).value(), b.Select(0, i).value(), false, false, Tensor());
        want.insert(want.end(), one.begin(), one.end());
      }
      EXPECT_EQ(testing::Mismatch(got, {batch, m, n}, want, testing::TolFor(DType::kBF16, 8)), "")
          << batch << "x" << m << "x" << n << "x" << k << " on " << cpu::gemm::IsaName(isa);
    }
    const Tensor x = Normal({3, 5, 96}, DType::kF32, 5), w = Normal({70, 96}, DType::kF32, 6);
    const Tensor bias = Normal({70}, DType::kF32, 7);
    const std::vector<double> want = Naive(x.View({15, 96}).value(), w, false, true, bias);
    EXPECT_EQ(testing::Mismatch(Linear(x, w, bias).value(), {3, 5, 70}, want, testing::TolFor(DType::kF32, 10)), "");
  }
}

// Products run from inside oneTBB tasks, each itself threaded: a worker that waits inside one
// product may run another, whose scratch buffers must not be the first one's.
TEST(GemmPathsTest, NestedInTasks) {
  constexpr int kTasks = 16;
  std::vector<Tensor> as, bs, got(kTasks);
  for (int t = 0; t < kTasks; ++t) {
    as.push_back(Normal({t % 2 == 0 ? 40 : 4, 300}, DType::kBF16, 10 + t));
    bs.push_back(Normal({300, 500}, DType::kBF16, 30 + t));
  }
  tbb::parallel_for(0, kTasks, [&](int t) { got[t] = Matmul(as[t], bs[t]).value(); });
  for (int t = 0; t < kTasks; ++t) {
    EXPECT_EQ(testing::Mismatch(got[t], {as[t].size(0), 500},
                                Naive(as[t], bs[t], false, false, Tensor()),
                                testing::TolFor(DType::kBF16, 18)),
              "")
        << "task " << t;
  }
}

// The bias is added in f32 before the single rounding: an f32 product rounded once.
TEST(GemmPathsTest, Bf16RoundsOnce) {
  for (const Isa isa : SupportedIsas()) {
    ForceIsa force(isa);
    for (const int64_t m : {1, 3, 40}) {
      const Tensor x = Normal({m, 200}, DType::kBF16, 8), w = Normal({90, 200}, DType::kBF16, 9);
      const Tensor b = Normal({90}, DType::kBF16, 10);
      const Tensor ref = Linear(x.To(DType::kF32).value(), w.To(DType::kF32).value(),
                                b.To(DType::kF32).value()).value();
      const Tensor got = Linear(x, w, b).value();
      // Both sum the same exact products in f32 (in possibly different orders): the bf16 result
      // is the f32 one rounded, up to one bf16 ulp where the two f32 sums straddle a tie.
      const std::vector<double> g = got.ToDoubles(), r = ref.ToDoubles();
      for (size_t i = 0; i < g.size(); ++i) {
        ASSERT_NEAR(g[i], static_cast<float>(BFloat16(static_cast<float>(r[i]))),
                    std::abs(r[i]) * (1.0 / 128) + 1e-6)
            << i << " on " << cpu::gemm::IsaName(isa);
      }
    }
  }
}

}  // namespace
}  // namespace dt::ops
