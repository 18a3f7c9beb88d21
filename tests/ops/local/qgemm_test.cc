// Linear with a quantized weight (ops/local/cpu/qgemm.cc) on every quantized dtype and every
// instruction set this CPU has (the others forced off), odd shapes, against the weight dequantized
// (core/quant.h, ggml's reference) and multiplied in double. The tolerance is derived from the
// 16-bit activations (Note [Activation blocks]): each activation is off by at most d/2 of its
// 32-block (d = max|x| / 32767), so |got - want| <= sum_b d_b / 2 * sum_{p in b} |w_p|, plus f32
// rounding. A wrong block, scale, nibble order or offset term is off by about sum |w x|, far
// beyond that. M <= 4 takes the decode kernel (Dot), M > 8 the panels, the M between as the tuner
// picks (Note [Dot or panels]).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "absl/strings/str_cat.h"
#include "dtensor/core/quant.h"
#include "dtensor/ops/local/cpu/qgemm.h"
#include "dtensor/ops/local/cpu/tuner.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/ops/local/test_util.h"

namespace dt::ops {
namespace {

using cpu::qgemm::Isa;

std::vector<Isa> SupportedIsas() {
  return testing::SupportedIsas(cpu::qgemm::kAllIsas, cpu::qgemm::IsaSupported);
}

using ForceIsa = testing::Forced<Isa, cpu::qgemm::SetIsaForTesting>;

Tensor Normal(const Shape& shape, DType dtype, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> v(static_cast<size_t>(Numel(shape)));
  for (double& x : v) x = normal(rng);
  return Tensor::FromDoubles(shape, v, dtype).value();
}

// "" when y = Linear(x, w, bias) is within the derived bound of the dequantized product, else the
// first offending element.
std::string Check(const Tensor& x, const Tensor& w, const Tensor& bias) {
  absl::StatusOr<Tensor> got_or = Linear(x, w, bias);
  if (!got_or.ok()) return std::string(got_or.status().ToString());
  const Tensor got = got_or->To(DType::kF32).value();
  const int64_t n = w.size(0), k = w.size(1), m = x.numel() / k;
  const std::vector<double> xv = x.ToDoubles(), wv = w.ToDoubles(), gv = got.ToDoubles();
  const std::vector<double> bv = bias.defined() ? bias.ToDoubles() : std::vector<double>();
  // The rounding of a bf16/f16 result adds half an ulp of it.
  const double out_ulp = x.dtype() == DType::kBF16 ? 1.0 / 256 : x.dtype() == DType::kF16 ? 1.0 / 2048 : 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = bv.empty() ? 0.0 : bv[j], bound = 0, mag = std::abs(want);
      for (int64_t b = 0; b < k / 32; ++b) {
        double amax = 0, wabs = 0, wmax = 0, xabs = 0;
        for (int64_t p = 32 * b; p < 32 * (b + 1); ++p) {
          const double xp = xv[i * k + p], wp = wv[j * k + p];
          want += xp * wp;
          mag += std::abs(xp * wp);
          amax = std::max(amax, std::abs(xp));
          wabs += std::abs(wp);
          wmax = std::max(wmax, std::abs(wp));
          xabs += std::abs(xp);
        }
        // 16-bit activations (half a step of max|x| / 32767 each); f32 arithmetic on the exact
        // integer sums and on the per-block offsets, whose terms are at most a few max|w| * sum|x|
        // of the block (d * q and m each at most about 2 max|w|).
        bound += amax / cpu::qgemm::kActivationMax / 2 * wabs * (1 + 1e-3) + 5e-6 * wmax * xabs;
      }
      bound += 1e-6 * mag + out_ulp * (std::abs(want) + bound) + 1e-6;
      const double g = gv[i * n + j];
      if (!(std::abs(g - want) <= bound)) {
        return absl::StrCat("y[", i, ", ", j, "] = ", g, ", want ", want, " +- ", bound, " (", DTypeName(w.dtype()),
                            " w [", n, ", ", k, "], ", m, " rows of x ", DTypeName(x.dtype()), ")");
      }
    }
  }
  return "";
}

TEST(QuantizedLinearTest, EveryTypeEveryIsaOddShapes) {
  uint64_t seed = 1;
  for (const Isa isa : SupportedIsas()) {
    ForceIsa force(isa);
    for (const DType q : kQuantizedDTypes) {
      const int64_t qk = DTypeBlock(q);
      for (const int64_t m : {1, 2, 3, 5, 8, 9, 13}) {
        for (const int64_t n : {1, 3, 17}) {
          // 9 blocks: a whole group of eight and a partial one (Note [Quantized dot groups]).
          for (const int64_t kb : {1, 3, 9}) {
            const int64_t k = kb * qk;
            const Tensor w = RandomQuantized(q, {n, k}, seed++).value();
            const Tensor x = Normal({m, k}, DType::kF32, seed++);
            EXPECT_EQ(Check(x, w, Tensor()), "") << "on " << cpu::qgemm::IsaName(isa);
          }
        }
      }
    }
  }
}

// Random blocks, shapes, batch dims, activation dtypes, scales and biases on a random supported
// instruction set.
RC_GTEST_PROP(QuantizedLinearTest, RandomBlocksAgreeWithDequantized, ()) {
  const std::vector<Isa> isas = SupportedIsas();
  ForceIsa force(*rc::gen::elementOf(isas));
  const DType q = *rc::gen::elementOf(std::vector<DType>(std::begin(kQuantizedDTypes),
                                                         std::end(kQuantizedDTypes)));
  const int64_t k = DTypeBlock(q) * *rc::gen::inRange<int64_t>(1, DTypeBlock(q) == 32 ? 12 : 4);
  const int64_t n = *rc::gen::inRange<int64_t>(1, 70);
  const Shape lead = *rc::gen::oneOf(rc::gen::just(Shape{}), rc::gen::just(Shape{2}),
                                     rc::gen::just(Shape{*rc::gen::inRange<int64_t>(1, 30)}),
                                     rc::gen::just(Shape{2, 3}));
  Shape xs = lead;
  xs.push_back(k);
  const DType xd = *rc::gen::element(DType::kF32, DType::kBF16, DType::kF16);
  const double scale = *rc::gen::element(1e-3, 1.0, 30.0);
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  const Tensor w = RandomQuantized(q, {n, k}, seed).value();
  const Tensor x = Normal(xs, xd, seed + 1, scale);
  const Tensor bias = *rc::gen::arbitrary<bool>() ? Normal({n}, xd, seed + 2) : Tensor();
  const std::string err = Check(x, w, bias);
  RC_ASSERT(err == "");
}

// Forces a knob's candidate for the scope.
class ForceKnob {
 public:
  ForceKnob(const cpu::tune::Knob& knob, int index) : knob_(knob) {
    cpu::tune::ForceForTesting(knob, index);
  }
  ~ForceKnob() { cpu::tune::ForceForTesting(knob_, std::nullopt); }

 private:
  const cpu::tune::Knob& knob_;
};

// Note [Sibling projections]: Linears over quantized weights of any types and sizes (split among
// the threads by any candidate of the split knobs, Note [Decode split]) equals one Linear
// per weight, for decode and prefill rows alike; a float weight among them takes the one-by-one
// path with the same answer.
RC_GTEST_PROP(QuantizedLinearTest, SiblingsEqualOneByOne, ()) {
  const int64_t k = 256 * *rc::gen::inRange<int64_t>(1, 4);
  const int64_t count = *rc::gen::inRange<int64_t>(1, 4);
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  const bool with_float = *rc::gen::arbitrary<bool>();
  std::vector<Tensor> ws;
  for (int64_t i = 0; i < count; ++i) {
    const DType q = *rc::gen::elementOf(std::vector<DType>(std::begin(kQuantizedDTypes),
                                                           std::end(kQuantizedDTypes)));
    const int64_t n = *rc::gen::element<int64_t>(1, 7, 64, 192, 700);
    ws.push_back(RandomQuantized(q, {n, k}, seed + i).value());
  }
  const DType xd = *rc::gen::element(DType::kF32, DType::kBF16);
  if (with_float) ws.push_back(Normal({5, k}, xd, seed + 10));
  const int64_t m = *rc::gen::element<int64_t>(1, 3, 4, 9);
  const Tensor x = Normal({1, m, k}, xd, seed + 20);
  // One split candidate for every size class, the same for the siblings and the one-by-one calls.
  std::vector<int> splits(cpu::qgemm::DotSplitKnobs()[0]->candidates.size());
  std::iota(splits.begin(), splits.end(), 0);
  const int split = *rc::gen::elementOf(splits);
  std::vector<std::unique_ptr<ForceKnob>> force;
  for (const cpu::tune::Knob* knob : cpu::qgemm::DotSplitKnobs()) {
    force.push_back(std::make_unique<ForceKnob>(*knob, split));
  }
  RC_TAG(cpu::qgemm::DotSplitKnobs()[0]->candidates[split]);
  const std::vector<Tensor> got = Linears(x, ws).value();
  RC_ASSERT(got.size() == ws.size());
  for (size_t i = 0; i < ws.size(); ++i) {
    const std::vector<double> one = Linear(x, ws[i]).value().ToDoubles();
    RC_ASSERT(got[i].shape() == (Shape{1, m, ws[i].size(0)}));
    const std::vector<double> g = got[i].ToDoubles();
    for (size_t j = 0; j < g.size(); ++j) {
      if (g[j] != one[j]) {
        RC_FAIL(absl::StrCat("weight ", i, " (", DTypeName(ws[i].dtype()), ") element ", j, ": ",
                             g[j], " vs ", one[j], " one by one"));
      }
    }
  }
}

// The threaded split (weights of the medium and large split classes) and a prefill-sized x.
TEST(QuantizedLinearTest, LargeShapesAgree) {
  for (const Isa isa : SupportedIsas()) {
    ForceIsa force(isa);
    uint64_t seed = 100;
    for (const DType q : {DType::kQ4_1, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K, DType::kQ2_K,
                          DType::kQ3_K, DType::kIQ4_NL, DType::kIQ4_XS}) {
      const Tensor w = RandomQuantized(q, {700, 1536}, seed++).value();
      for (const int64_t m : {1, 8, 67}) {
        EXPECT_EQ(Check(Normal({m, 1536}, DType::kF32, seed++), w, Tensor()), "")
            << "on " << cpu::qgemm::IsaName(isa);
      }
    }
  }
}

// The prefetches of the decode dot and of the panels (the tuner's knobs, Notes [Quantized dot
// prefetch] and [Panels prefetch]) steer every type through the same kernel, and change where
// bytes are asked for, never a result: every candidate gives the first one's bits on every type
// and instruction set, the dot at 3 rows of x, the panels at 13 (a partial register tile) against
// 3 groups of weight rows (a partial pair, whose prefetch stops at the panels' end).
TEST(QuantizedLinearTest, EveryPrefetchGivesTheSameBits) {
  struct Case {
    const cpu::tune::Knob* knob;
    int64_t m;
  };
  const Case cases[] = {{&cpu::qgemm::DotPrefetchKnob(), 3}, {&cpu::qgemm::PanelsPrefetchKnob(), 13}};
  uint64_t seed = 300;
  for (const Isa isa : SupportedIsas()) {
    ForceIsa force(isa);
    for (const DType q : kQuantizedDTypes) {
      const Tensor w = RandomQuantized(q, {37, 2 * DTypeBlock(q)}, seed++).value();
      for (const Case& c : cases) {
        const Tensor x = Normal({c.m, 2 * DTypeBlock(q)}, DType::kF32, seed++);
        std::optional<Tensor> first;
        for (size_t i = 0; i < c.knob->candidates.size(); ++i) {
          cpu::tune::ForceForTesting(*c.knob, static_cast<int>(i));
          const Tensor y = Linear(x, w).value();
          if (!first) {
            first = y;
          } else {
            EXPECT_TRUE(Equal(y, *first)) << c.knob->name << " " << c.knob->candidates[i] << " on "
                                          << DTypeName(q) << ", " << cpu::qgemm::IsaName(isa);
          }
        }
        cpu::tune::ForceForTesting(*c.knob, std::nullopt);
      }
    }
  }
}

// The 512-bit dot (Note [512-bit quantized dot]) gives the 256-bit dot's bits: every type (the
// 32-element ones decode pairs, the super-block types join 256-bit halves) on every instruction
// set that has it, 1 to 4 rows of x, rows of 1, 2, 3, 9 and 17 blocks (an odd last block alone in
// its pair; whole and partial groups). A set without it would compare the 256-bit dot with itself.
TEST(QuantizedLinearTest, EveryDotWidthGivesTheSameBits) {
  const cpu::tune::Knob& width = cpu::qgemm::DotWidthKnob();
  std::vector<Isa> wide;
  for (const Isa isa : SupportedIsas()) {
    if (cpu::qgemm::KernelsFor(isa).dot_wide != nullptr) wide.push_back(isa);
  }
  if (wide.empty()) GTEST_SKIP() << "no instruction set here has the 512-bit quantized dot";
  uint64_t seed = 700;
  for (const Isa isa : wide) {
    ForceIsa force(isa);
    for (const DType q : kQuantizedDTypes) {
      for (const int64_t blocks : {1, 2, 3, 9, 17}) {
        const int64_t k = blocks * DTypeBlock(q);
        const Tensor w = RandomQuantized(q, {19, k}, seed++).value();
        for (const int64_t m : {1, 2, 3, 4}) {
          const Tensor x = Normal({m, k}, DType::kF32, seed++);
          ForceKnob narrow(width, 0);
          const Tensor want = Linear(x, w).value();
          ForceKnob wide(width, 1);
          EXPECT_TRUE(Equal(Linear(x, w).value(), want))
              << DTypeName(q) << " [19, " << k << "], " << m << " rows, "
              << cpu::qgemm::IsaName(isa);
        }
      }
    }
  }
}

// Weight rows read two at a time (Note [Quantized dot pairs]) give the bits of rows read one at a
// time: every type, every instruction set, both dot widths where there are two, one row of x
// against 19 weight rows (the last one alone) of 1, 2, 3, 9 and 17 blocks, every candidate bound
// (2k pairs every row here but the largest q8_0 and k-quant ones).
TEST(QuantizedLinearTest, DotPairsGiveTheSameBits) {
  const cpu::tune::Knob& pairs = cpu::qgemm::DotPairsKnob();
  const cpu::tune::Knob& width = cpu::qgemm::DotWidthKnob();
  uint64_t seed = 900;
  for (const Isa isa : SupportedIsas()) {
    ForceIsa force(isa);
    const int widths = cpu::qgemm::KernelsFor(isa).dot_wide != nullptr ? 2 : 1;
    for (const DType q : kQuantizedDTypes) {
      for (const int64_t blocks : {1, 2, 3, 9, 17}) {
        const int64_t k = blocks * DTypeBlock(q);
        const Tensor w = RandomQuantized(q, {19, k}, seed++).value();
        const Tensor x = Normal({1, k}, DType::kF32, seed++);
        for (int wd = 0; wd < widths; ++wd) {
          ForceKnob dot_width(width, wd);
          std::optional<Tensor> want;
          for (int c = 0; c < static_cast<int>(pairs.candidates.size()); ++c) {
            ForceKnob bound(pairs, c);
            const Tensor got = Linear(x, w).value();
            if (!want) {
              want = got;
              continue;
            }
            EXPECT_TRUE(Equal(got, *want))
                << DTypeName(q) << " [19, " << k << "], pairs " << pairs.candidates[c] << ", "
                << width.candidates[wd] << " bits, " << cpu::qgemm::IsaName(isa);
          }
        }
      }
    }
  }
}

// Keeps panels for the scope (Note [Packed quantized weights]), none after.
class KeepPanels {
 public:
  explicit KeepPanels(int64_t bytes) { cpu::qgemm::SetPackedBudget(bytes); }
  ~KeepPanels() { cpu::qgemm::SetPackedBudget(0); }
};

// Kept panels (Note [Packed quantized weights]) give the bits of panels packed per call: on the
// call that makes them and on the next one that reuses them, for every type (the k-quants with
// per-16 scales, q2_k, q3_k, and the codebook types iq4_nl, iq4_xs among them), random shapes,
// row views of a weight (their own panels: another address or row count) and every instruction
// set; and on the decode rows, which never use them.
RC_GTEST_PROP(QuantizedLinearTest, KeptPanelsGiveThePerCallBits, ()) {
  const std::vector<Isa> isas = SupportedIsas();
  ForceIsa force(*rc::gen::elementOf(isas));
  const DType q = *rc::gen::elementOf(
      std::vector<DType>(std::begin(kQuantizedDTypes), std::end(kQuantizedDTypes)));
  const int64_t k = DTypeBlock(q) * *rc::gen::inRange<int64_t>(1, DTypeBlock(q) == 32 ? 24 : 6);
  const int64_t n = *rc::gen::inRange<int64_t>(1, 300);
  const int64_t m = *rc::gen::inRange<int64_t>(1, 40);
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  const Tensor whole = RandomQuantized(q, {n, k}, seed).value();
  const int64_t first = *rc::gen::inRange<int64_t>(0, n);
  const Tensor w =
      *rc::gen::arbitrary<bool>()
          ? whole
          : whole.Narrow(0, first, *rc::gen::inRange<int64_t>(1, n - first + 1)).value();
  const Tensor x = Normal({m, k}, *rc::gen::element(DType::kF32, DType::kBF16), seed + 1);
  // Any pick of where the panels start (Note [Dot or panels]), the same with panels kept or not.
  const cpu::tune::Knob& dot_rows = cpu::qgemm::DotMaxRowsKnob(/*kept_panels=*/false);
  const int pick = *rc::gen::inRange<int>(0, static_cast<int>(dot_rows.candidates.size()));
  ForceKnob force_rows(dot_rows, pick);
  ForceKnob force_kept_rows(cpu::qgemm::DotMaxRowsKnob(/*kept_panels=*/true), pick);
  const Tensor per_call = Linear(x, w).value();
  KeepPanels keep(int64_t{1} << 30);
  for (const char* call : {"making", "reusing"}) {
    const Tensor kept = Linear(x, w).value();
    RC_ASSERT(Equal(kept, per_call));
    RC_TAG(call);
  }
  const bool packs = m > std::stoi(dot_rows.candidates[pick]) &&
                     cpu::qgemm::KernelsFor(cpu::qgemm::ActiveIsa()).pack != nullptr;
  RC_ASSERT((cpu::qgemm::PackedBytes() > 0) == packs);
}

// The budget bounds the panels kept: a weight whose panels do not fit is packed per call (the same
// bits, nothing kept); a weight gone from the process has its panels dropped at the next miss;
// threads that race to the first product of a weight all get the bits of one packing.
TEST(QuantizedLinearTest, KeptPanelsStayWithinTheBudgetAndTheWeight) {
  const Isa isa = cpu::qgemm::ActiveIsa();
  const cpu::qgemm::Kernels& ks = cpu::qgemm::KernelsFor(isa);
  if (ks.pack == nullptr) GTEST_SKIP() << "no panels on " << cpu::qgemm::IsaName(isa);
  const Tensor x = Normal({9, 256}, DType::kF32, 1);
  // Panels of 40 bytes per row and block for q4_k and iq4_xs, 48 for q2_k (per-16 scales).
  const int64_t bytes_a = cpu::qgemm::GemmScratchBytes(ks, DType::kQ4_K, 300, 256);
  const int64_t bytes_b = cpu::qgemm::GemmScratchBytes(ks, DType::kQ2_K, 300, 256);
  ASSERT_LT(bytes_a, bytes_b);
  Tensor a = RandomQuantized(DType::kQ4_K, {300, 256}, 2).value();
  const Tensor b = RandomQuantized(DType::kQ2_K, {300, 256}, 3).value();
  const Tensor want_a = Linear(x, a).value(), want_b = Linear(x, b).value();
  KeepPanels keep(bytes_b);
  EXPECT_TRUE(Equal(Linear(x, a).value(), want_a));
  EXPECT_EQ(cpu::qgemm::PackedBytes(), bytes_a);
  EXPECT_TRUE(Equal(Linear(x, b).value(), want_b));  // over the budget: per call
  EXPECT_EQ(cpu::qgemm::PackedBytes(), bytes_a);
  a = Tensor();  // a's panels go at the next miss, which then fits b's
  EXPECT_TRUE(Equal(Linear(x, b).value(), want_b));
  EXPECT_EQ(cpu::qgemm::PackedBytes(), bytes_b);

  const Tensor c = RandomQuantized(DType::kIQ4_XS, {300, 256}, 4).value();
  const Tensor want_c = Linear(x, c).value();
  cpu::qgemm::SetPackedBudget(int64_t{1} << 30);
  std::vector<Tensor> got(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = Linear(x, c).value(); });
  }
  for (std::thread& t : threads) t.join();
  for (const Tensor& g : got) EXPECT_TRUE(Equal(g, want_c));
  EXPECT_EQ(cpu::qgemm::PackedBytes(), bytes_b + cpu::qgemm::GemmScratchBytes(ks, DType::kIQ4_XS, 300, 256));
}

// The x86 quantizers give the plain C++ one's bits; a NaN or an infinity in x reaches the outputs
// of its row as NaN (not a finite guess).
TEST(QuantizedLinearTest, QuantizersAgreeAndKeepNaN) {
  const Tensor x = Normal({5, 96}, DType::kF32, 7, 3.0);
  const int64_t ld = cpu::qgemm::QRowsLd(96);
  auto quantize = [&](Isa isa) {
    std::vector<int16_t> t(5 * 96);
    std::vector<float> dsh(3 * 5 * ld);
    cpu::qgemm::KernelsFor(isa).quantize(5, 96, x.data<float>(), 96, t.data(), dsh.data(),
                                         dsh.data() + 5 * ld, dsh.data() + 10 * ld);
    return std::make_pair(t, dsh);
  };
  const auto want = quantize(Isa::kGeneric);
  for (const Isa isa : SupportedIsas()) {
    const auto got = quantize(isa);
    EXPECT_EQ(got.first, want.first) << cpu::qgemm::IsaName(isa);
    EXPECT_EQ(std::memcmp(got.second.data(), want.second.data(), got.second.size() * 4), 0)
        << cpu::qgemm::IsaName(isa);
  }
  Tensor bad = x.Clone().value();
  bad.data<float>()[96 + 40] = std::numeric_limits<float>::infinity();
  bad.data<float>()[3 * 96 + 5] = std::numeric_limits<float>::quiet_NaN();
  const Tensor w = RandomQuantized(DType::kQ4_1, {3, 96}, 1).value();
  for (const Isa isa : SupportedIsas()) {
    ForceIsa force(isa);
    for (const int64_t rows : {int64_t{5}, int64_t{13}}) {  // Dot and Gemm
      Tensor xr = rows == 5 ? bad : ops::Cat({bad, bad, bad.Narrow(0, 0, 3).value()}, 0).value();
      const std::vector<double> y = Linear(xr, w).value().ToDoubles();
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < 3; ++j) {
          EXPECT_EQ(std::isnan(y[i * 3 + j]), i % 5 == 1 || i % 5 == 3) << i << " " << j;
        }
      }
    }
  }
}

TEST(QuantizedLinearTest, RefusesWhatItCannotMultiply) {
  const Tensor w = RandomQuantized(DType::kQ4_1, {4, 64}, 1).value();
  EXPECT_NE(Linear(Normal({2, 32}, DType::kF32, 1), w).status().message().find("w must have shape [out, 32]"),
            std::string::npos);
  EXPECT_FALSE(Linear(Tensor::Zeros({2, 64}, DType::kI64).value(), w).ok());
  const Tensor wt = w.Transpose(0, 1).value();
  EXPECT_FALSE(Linear(Normal({2, 4}, DType::kF32, 1), wt).ok());
}

TEST(QuantizedLookupTest, RowsAreDequantized) {
  for (const DType q : kQuantizedDTypes) {
    const Tensor table = RandomQuantized(q, {7, DTypeBlock(q) * 2}, 3).value();
    const Tensor full = table.To(DType::kF32).value();
    const Tensor ids = Tensor::FromVector<int64_t>({2, 3}, {0, 6, 3, 9, 2, 2}).value();
    // A vocab shard [2, 9) of a larger table: ids outside it give zero rows.
    const Tensor got = Embedding(table, ids, /*index_offset=*/2).value();
    ASSERT_EQ(got.dtype(), DType::kF32);
    const Tensor want_rows = Embedding(full, ids, 2).value();
    EXPECT_TRUE(Equal(got, want_rows)) << DTypeName(q);
  }
}

TEST(QuantizedTensorTest, CopiesAndViewsAreWholeBlocks) {
  const Tensor t = RandomQuantized(DType::kQ4_K, {5, 512}, 9).value();
  EXPECT_EQ(t.nbytes(), 5 * 2 * 144);
  const Tensor rows = t.Narrow(0, 1, 3).value();
  const Tensor c = rows.Clone().value();
  EXPECT_EQ(std::memcmp(c.raw_data(), static_cast<const char*>(t.raw_data()) + 2 * 144,
                        static_cast<size_t>(c.nbytes())),
            0);
  const Tensor cols = t.Narrow(1, 256, 256).value();
  EXPECT_TRUE(Equal(cols.To(DType::kF32).value(), t.To(DType::kF32).value().Narrow(1, 256, 256).value().Contiguous().value()));
  EXPECT_FALSE(t.Narrow(1, 32, 256).ok());
  EXPECT_FALSE(t.Select(1, 3).ok());
  EXPECT_FALSE(Tensor::Empty({2, 100}, DType::kQ4_K).ok());
  EXPECT_FALSE(t.Fill(0).ok());
  EXPECT_FALSE(Tensor::Zeros({2, 32}, DType::kF32).value().To(DType::kQ8_0).ok());
}

}  // namespace
}  // namespace dt::ops
