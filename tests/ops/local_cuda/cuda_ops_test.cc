// The CUDA kernels against the CPU reference (the oracle): every public op of ops/local/ops.h runs
// on the same random inputs on the host and on cuda:0, with the same memory layouts (contiguous,
// transposed, padded and offset views, broadcast), and the results must agree: exactly for data
// movement, integers, Embedding and TopK; within a tolerance of the dtype for float arithmetic.
// Every test skips when no CUDA device is present.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/tensor.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/test_util.h"

namespace dt::ops {
namespace {

#define DT_SKIP_WITHOUT_CUDA() \
  if (!::dt::CudaAvailable()) GTEST_SKIP() << "no CUDA device: " << ::dt::CudaUnavailableReason()

constexpr Device kGpu = Device::CUDA(0);
constexpr DType kFloatTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
constexpr DType kNumericTypes[] = {DType::kF32, DType::kBF16, DType::kF16,
                                   DType::kI64, DType::kI32,  DType::kU8};

enum class Values { kNormal, kPositive, kSmallInts, kSpecials };
enum class Layout { kContiguous, kStrided };

// One input on both devices: the same values in the same memory layout.
struct Pair {
  Tensor cpu, gpu;
};

// A tensor of `shape` whose layout is either contiguous or random (the dims of a padded buffer in
// a random order, narrowed at a random offset and permuted back: transposed, padded and offset
// views in one). kSmallInts gives many ties; kSpecials mixes in NaN, ±inf and ±0 (floats only).
Pair Random(IntSpan shape, DType dtype, std::mt19937_64& rng, Layout layout = Layout::kStrided,
            Values values = Values::kNormal) {
  const int nd = static_cast<int>(shape.size());
  std::vector<int64_t> perm(static_cast<size_t>(nd)), pad(static_cast<size_t>(nd), 0);
  std::iota(perm.begin(), perm.end(), 0);
  if (layout == Layout::kStrided) {
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int d = 0; d < nd; ++d) pad[d] = static_cast<int64_t>(rng() % 3);
  }
  Shape base_shape(static_cast<size_t>(nd));
  for (int i = 0; i < nd; ++i) base_shape[i] = shape[perm[i]] + pad[perm[i]];
  std::vector<double> v(static_cast<size_t>(Numel(base_shape)));
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> positive(0.1, 3.0);
  std::uniform_int_distribution<int> small(-4, 4), ints(-50, 50), u8(0, 255), bit(0, 1), pick(0, 9);
  const double specials[] = {std::numeric_limits<double>::quiet_NaN(), -0.0, 0.0,
                             std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity()};
  for (double& x : v) {
    if (dtype == DType::kBool)
      x = bit(rng);
    else if (dtype == DType::kU8)
      x = values == Values::kSmallInts ? small(rng) + 4 : u8(rng);
    else if (values == Values::kSmallInts)
      x = small(rng);
    else if (!IsFloating(dtype))
      x = ints(rng);
    else if (values == Values::kPositive)
      x = positive(rng);
    else if (values == Values::kSpecials && pick(rng) < 3)
      x = specials[rng() % 5];
    else if (values == Values::kSpecials)
      x = small(rng);
    else
      x = normal(rng);
  }
  Tensor base = Tensor::FromDoubles(base_shape, v, dtype).value();
  Tensor views[2] = {base, base.To(kGpu).value()};
  std::vector<int64_t> inv(static_cast<size_t>(nd));
  for (int i = 0; i < nd; ++i) inv[perm[i]] = i;
  Shape offsets(static_cast<size_t>(nd));
  for (int i = 0; i < nd; ++i)
    offsets[i] = pad[perm[i]] > 0 ? static_cast<int64_t>(rng() % (pad[perm[i]] + 1)) : 0;
  for (Tensor& t : views) {
    for (int i = 0; i < nd; ++i) t = t.Narrow(i, offsets[i], shape[perm[i]]).value();
    t = t.Permute(inv).value();
  }
  return {views[0], views[1]};
}

struct Tol {
  double atol, rtol;
};

// A result rounded once to dtype after f32 arithmetic, where host and device may differ in the
// order of f32 operations: magnitudes up to `scale`.
Tol TolFor(DType dtype, double scale = 1.0) {
  switch (dtype) {
    case DType::kBF16: return {1e-2 * scale, 8e-3};
    case DType::kF16: return {1e-3 * scale, 1e-3};
    case DType::kF32: return {2e-5 * scale, 2e-5};
    default: return {0, 0};
  }
}

// got (on the device) has want's dtype, shape and values within tol (NaNs must match).
::testing::AssertionResult Close(const absl::StatusOr<Tensor>& got,
                                 const absl::StatusOr<Tensor>& want, Tol tol = {0, 0}) {
  if (!want.ok()) return ::testing::AssertionFailure() << "cpu: " << want.status();
  if (!got.ok()) return ::testing::AssertionFailure() << "cuda: " << got.status();
  if (!got->device().is_cuda())
    return ::testing::AssertionFailure() << "result on " << got->device().ToString();
  if (got->dtype() != want->dtype()) {
    return ::testing::AssertionFailure()
           << "dtype: got " << got->Describe() << ", want " << want->Describe();
  }
  const absl::Status s = AllClose(got->To(kCPU).value(), *want, tol.atol, tol.rtol);
  if (!s.ok()) return ::testing::AssertionFailure() << s.message() << " in " << want->Describe();
  return ::testing::AssertionSuccess();
}

std::string Name(IntSpan shape, DType dtype) {
  return absl::StrCat(DTypeName(dtype), ShapeToString(shape));
}

// ---- GEMM
// ----------------------------------------------------------------------------------------

TEST(CudaOpsTest, MatmulMatchesCpu) {
  DT_SKIP_WITHOUT_CUDA();
  struct Case {
    Shape a, b;
    bool ta, tb;
  };
  const Case cases[] = {
      {{1, 1}, {1, 1}, false, false},          {{2, 3}, {3, 4}, false, false},
      {{33, 17}, {17, 65}, false, false},      {{17, 33}, {65, 17}, true, true},
      {{8, 2, 3}, {3, 4}, false, false},       {{5, 1, 2, 3}, {7, 4, 3}, false, true},
      {{3, 1, 9, 5}, {2, 5, 6}, false, false}, {{2, 3, 7, 5}, {2, 3, 7, 6}, true, false},
      {{64, 96}, {96, 80}, false, false},      {{4, 128, 64}, {4, 96, 64}, false, true},
      {{1, 300}, {300, 1}, false, false},      {{256, 384}, {384, 512}, false, false},
      {{0, 5}, {5, 3}, false, false},          {{4, 0}, {0, 3}, false, false},
  };
  std::mt19937_64 rng(1);
  for (const Case& c : cases) {
    for (DType dtype : kFloatTypes) {
      for (Layout layout : {Layout::kContiguous, Layout::kStrided}) {
        SCOPED_TRACE(absl::StrCat(Name(c.a, dtype), " x ", Name(c.b, dtype), c.ta ? " ta" : "",
                                  c.tb ? " tb" : "", layout == Layout::kStrided ? " strided" : ""));
        const Pair a = Random(c.a, dtype, rng, layout), b = Random(c.b, dtype, rng, layout);
        const int64_t k = c.ta ? c.a[c.a.size() - 2] : c.a.back();
        EXPECT_TRUE(Close(Matmul(a.gpu, b.gpu, c.ta, c.tb), Matmul(a.cpu, b.cpu, c.ta, c.tb),
                          TolFor(dtype, std::sqrt(static_cast<double>(std::max<int64_t>(k, 1))))));
      }
    }
  }
}

TEST(CudaOpsTest, LinearWithBiasMatchesCpu) {
  DT_SKIP_WITHOUT_CUDA();
  struct Case {
    Shape x;
    int64_t out;
  };
  const Case cases[] = {{{5}, 3}, {{4, 7}, 9}, {{2, 3, 16}, 24}, {{128, 256}, 384}, {{3, 0}, 4}};
  std::mt19937_64 rng(2);
  for (const Case& c : cases) {
    for (DType dtype : kFloatTypes) {
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(absl::StrCat(Name(c.x, dtype), " -> ", c.out, with_bias ? " +bias" : ""));
        const int64_t in = c.x.back();
        const Pair x = Random(c.x, dtype, rng), w = Random({c.out, in}, dtype, rng);
        const Pair b = with_bias ? Random({c.out}, dtype, rng) : Pair{};
        EXPECT_TRUE(
            Close(Linear(x.gpu, w.gpu, b.gpu), Linear(x.cpu, w.cpu, b.cpu),
                  TolFor(dtype, std::sqrt(static_cast<double>(std::max<int64_t>(in, 1))) + 1)));
      }
    }
  }
}

// ---- pointwise
// -----------------------------------------------------------------------------------

TEST(CudaOpsTest, BinaryMatchesCpu) {
  DT_SKIP_WITHOUT_CUDA();
  const std::pair<Shape, Shape> shapes[] = {
      {{7}, {7}},   {{4, 1, 3}, {2, 1}}, {{3, 5, 6}, {3, 5, 6}},
      {{}, {4}},    {{1000}, {1}},       {{2, 3, 4, 5, 6}, {3, 1, 5, 1}},
      {{0, 3}, {3}}};
  std::mt19937_64 rng(3);
  for (const auto& [as, bs] : shapes) {
    for (DType dtype : kNumericTypes) {
      for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv}) {
        if (op == BinaryOp::kDiv && !IsFloating(dtype)) continue;
        SCOPED_TRACE(
            absl::StrCat(Name(as, dtype), " op ", static_cast<int>(op), " ", Name(bs, dtype)));
        const Values values = op == BinaryOp::kDiv ? Values::kPositive : Values::kNormal;
        const Pair a = Random(as, dtype, rng, Layout::kStrided, values);
        const Pair b = Random(bs, dtype, rng, Layout::kStrided, values);
        EXPECT_TRUE(Close(Binary(op, a.gpu, b.gpu), Binary(op, a.cpu, b.cpu), TolFor(dtype, 1e-3)));
        const double s = IsFloating(dtype) ? 1.75 : 3.0;
        EXPECT_TRUE(Close(Binary(op, a.gpu, s), Binary(op, a.cpu, s), TolFor(dtype, 1e-3)));
      }
    }
  }
}

TEST(CudaOpsTest, IntegerArithmeticWraps) {
  DT_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::kI64, DType::kI32, DType::kU8}) {
    const double big = dtype == DType::kI64 ? 9.0e18 : (dtype == DType::kI32 ? 2.0e9 : 250.0);
    const Tensor a = Tensor::Full({5}, big, dtype).value();
    for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " op ", static_cast<int>(op)));
      EXPECT_TRUE(Close(Binary(op, a.To(kGpu).value(), a.To(kGpu).value()), Binary(op, a, a)));
      EXPECT_TRUE(Close(Binary(op, a.To(kGpu).value(), 7.0), Binary(op, a, 7.0)));
    }
    EXPECT_TRUE(Close(Neg(a.To(kGpu).value()), Neg(a)));
  }
}

TEST(CudaOpsTest, UnaryMatchesCpu) {
  DT_SKIP_WITHOUT_CUDA();
  const Shape shapes[] = {{1}, {5, 7}, {3, 4, 5}, {4097}, {0, 2}};
  std::mt19937_64 rng(4);
  for (const Shape& shape : shapes) {
    for (DType dtype : kNumericTypes) {
      for (UnaryOp op : kAllUnaryOps) {
        if (op != UnaryOp::kNeg && !IsFloating(dtype)) continue;
        SCOPED_TRACE(absl::StrCat(Name(shape, dtype), " ", UnaryOpName(op)));
        const bool positive = op == UnaryOp::kRsqrt || op == UnaryOp::kSqrt;
        const Pair x = Random(shape, dtype, rng, Layout::kStrided,
                              positive ? Values::kPositive : Values::kNormal);
        EXPECT_TRUE(Close(Unary(op, x.gpu), Unary(op, x.cpu), TolFor(dtype, 1e-2)));
      }
    }
  }
}

TEST(CudaOpsTest, GatedActivationMatchesCpu) {
  DT_SKIP_WITHOUT_CUDA();
  const Shape shapes[] = {{1}, {5, 7}, {3, 4, 5}, {4097}, {0, 2}};
  std::mt19937_64 rng(14);
  for (const Shape& shape : shapes) {
    for (DType dtype : kFloatTypes) {
      for (UnaryOp act :
           {UnaryOp::kSilu, UnaryOp::kGeluTanh, UnaryOp::kGeluErf, UnaryOp::kRelu}) {
        SCOPED_TRACE(absl::StrCat(Name(shape, dtype), " ", UnaryOpName(act)));
        const Pair gate = Random(shape, dtype, rng), up = Random(shape, dtype, rng);
        EXPECT_TRUE(Close(GatedActivation(gate.gpu, up.gpu, act),
                          GatedActivation(gate.cpu, up.cpu, act), TolFor(dtype, 4)));
      }
    }
  }
}

// ---- reductions, softmax
// -------------------------------------------------------------------------

TEST(CudaOpsTest, ReduceMatchesCpu) {
  DT_SKIP_WITHOUT_CUDA();
  // Lane lengths and counts that select each launch shape (1, 32 and 256 threads per lane).
  const Shape shapes[] = {{6}, {3, 4, 5}, {2, 10000}, {64, 4100}, {5, 0, 3}, {1, 1}};
  std::mt19937_64 rng(5);
  for (const Shape& shape : shapes) {
    for (int dim = 0; dim < static_cast<int>(shape.size()); ++dim) {
      for (DType dtype : kNumericTypes) {
        for (Reduction op : {Reduction::kSum, Reduction::kMean, Reduction::kMax, Reduction::kArgmax}) {
          if (op == Reduction::kMean && !IsFloating(dtype)) continue;
          if ((op == Reduction::kMax || op == Reduction::kArgmax) && shape[dim] == 0) continue;
          for (Values values : {Values::kNormal, Values::kSmallInts, Values::kSpecials}) {
            if (values == Values::kSpecials &&
                (!IsFloating(dtype) || op == Reduction::kSum || op == Reduction::kMean)) {
              continue;
            }
            SCOPED_TRACE(absl::StrCat(Name(shape, dtype), " reduce ", static_cast<int>(op), " dim ",
                                      dim, " values ", static_cast<int>(values)));
            const Pair x = Random(shape, dtype, rng, Layout::kStrided, values);
            const double n = static_cast<double>(std::max<int64_t>(1, shape[dim]));
            const Tol tol = op == Reduction::kSum ? TolFor(dtype, std::sqrt(n)) : TolFor(dtype);
            EXPECT_TRUE(Close(Reduce(op, x.gpu, dim), Reduce(op, x.cpu, dim), tol));
          }
        }
      }
    }
  }
}

TEST(CudaOpsTest, SoftmaxMatchesCpu) {
  DT_SKIP_WITHOUT_CUDA();
  const Shape shapes[] = {{5}, {3, 7}, {2, 3, 40}, {2, 5000}, {300, 20}, {0, 4}};
  std::mt19937_64 rng(6);
  for (const Shape& shape : shapes) {
    for (int dim = 0; dim < static_cast<int>(shape.size()); ++dim) {
      for (DType dtype : kFloatTypes) {
        SCOPED_TRACE(absl::StrCat(Name(shape, dtype), " dim ", dim));
        const Pair x = Random(shape, dtype, rng);
        EXPECT_TRUE(Close(Softmax(x.gpu, dim), Softmax(x.cpu, dim), TolFor(dtype)));
        EXPECT_TRUE(Close(LogSoftmax(x.gpu, dim), LogSoftmax(x.cpu, dim), TolFor(dtype, 10)));
      }
    }
  }
}

// ---- norms, rotary
// -------------------------------------------------------------------------------

TEST(CudaOpsTest, NormsMatchCpu) {
  DT_SKIP_WITHOUT_CUDA();
  const Shape shapes[] = {{7}, {4, 64}, {2, 3, 1000}, {3, 5000}, {5000, 8}, {0, 16}};
  std::mt19937_64 rng(7);
  for (const Shape& shape : shapes) {
    for (DType dtype : kFloatTypes) {
      for (bool affine : {false, true}) {
        // Contiguous rows take the 16-byte vector path.
        const Layout layout = affine ? Layout::kStrided : Layout::kContiguous;
        SCOPED_TRACE(absl::StrCat(Name(shape, dtype), affine ? " affine strided" : " contiguous"));
        const int64_t h = shape.back();
        const Pair x = Random(shape, dtype, rng, layout);
        const Pair w = affine ? Random({h}, dtype, rng) : Pair{};
        const Pair b = affine ? Random({h}, dtype, rng) : Pair{};
        EXPECT_TRUE(
            Close(RmsNorm(x.gpu, w.gpu, 1e-6), RmsNorm(x.cpu, w.cpu, 1e-6), TolFor(dtype, 4)));
        EXPECT_TRUE(Close(LayerNorm(x.gpu, w.gpu, b.gpu, 1e-5),
                          LayerNorm(x.cpu, w.cpu, b.cpu, 1e-5), TolFor(dtype, 4)));
      }
    }
  }
}

TEST(CudaOpsTest, ApplyRotaryMatchesCpu) {
  DT_SKIP_WITHOUT_CUDA();
  struct Case {
    Shape x, table;
  };
  const Case cases[] = {{{2, 3, 5, 8}, {5, 8}},
                        {{1, 4, 7, 64}, {1, 1, 7, 64}},
                        {{6, 2}, {6, 2}},
                        {{2, 2, 3, 16}, {2, 1, 3, 16}},
                        {{0, 4}, {4}}};
  std::mt19937_64 rng(8);
  for (const Case& c : cases) {
    for (DType dtype : kFloatTypes) {
      for (DType table_dtype : {dtype, DType::kF32}) {
        for (RotaryStyle style : {RotaryStyle::kHalf, RotaryStyle::kInterleaved}) {
          SCOPED_TRACE(absl::StrCat(Name(c.x, dtype), " tables ", Name(c.table, table_dtype),
                                    " style ", static_cast<int>(style)));
          const Pair x = Random(c.x, dtype, rng), cs = Random(c.table, table_dtype, rng);
          const Pair sn = Random(c.table, table_dtype, rng);
          EXPECT_TRUE(Close(ApplyRotary(x.gpu, cs.gpu, sn.gpu, style),
                            ApplyRotary(x.cpu, cs.cpu, sn.cpu, style), TolFor(dtype, 4)));
        }
      }
    }
  }
}

// Keys rotated into a slot of a cache buffer (the buffer's other positions untouched), from the
// projection's layout.
TEST(CudaOpsTest, ApplyRotaryIntoASlotMatchesCpu) {
  DT_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(15);
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    Pair x = Random({2, 5, 3, 16}, dtype, rng, Layout::kContiguous);
    x.cpu = x.cpu.Transpose(1, 2).value();
    x.gpu = x.gpu.Transpose(1, 2).value();
    const Pair cs = Random({2, 1, 5, 16}, dtype, rng), sn = Random({2, 1, 5, 16}, dtype, rng);
    const Pair buffer = Random({2, 3, 9, 16}, dtype, rng, Layout::kContiguous);
    const RotaryStyle half = RotaryStyle::kHalf;
    const Tensor slot_cpu = buffer.cpu.Narrow(2, 3, 5).value();
    const Tensor slot_gpu = buffer.gpu.Narrow(2, 3, 5).value();
    ASSERT_TRUE(ApplyRotaryInto(slot_cpu, x.cpu, cs.cpu, sn.cpu, half).ok());
    ASSERT_TRUE(ApplyRotaryInto(slot_gpu, x.gpu, cs.gpu, sn.gpu, half).ok());
    EXPECT_TRUE(Close(buffer.gpu, buffer.cpu, TolFor(dtype, 4)));
  }
}

// ---- attention
// -----------------------------------------------------------------------------------

// Into the transpose of a [B, Sq, Hq, Dv] tensor (an attention layer's o_proj input): the device's
// fresh output, bit for bit.
TEST(CudaOpsTest, AttentionIntoEqualsTheFreshOutput) {
  DT_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(16);
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const Pair q = Random({1, 8, 9, 32}, dtype, rng), k = Random({1, 2, 9, 32}, dtype, rng);
    const Pair v = Random({1, 2, 9, 32}, dtype, rng);
    AttentionOptions o;
    o.causal = true;
    const Tensor rows = Tensor::Empty({1, 9, 8, 32}, dtype, kGpu).value();
    const Tensor heads = rows.Transpose(1, 2).value();
    ASSERT_TRUE(ScaledDotProductAttentionInto(heads, q.gpu, k.gpu, v.gpu, o).ok());
    const Tensor want = ScaledDotProductAttention(q.gpu, k.gpu, v.gpu, o).value();
    EXPECT_TRUE(Equal(heads.To(kCPU).value().Contiguous().value(), want.To(kCPU).value()));
  }
}

TEST(CudaOpsTest, AttentionMatchesCpu) {
  DT_SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t b, hq, hkv, sq, skv, d, dv;
    bool causal;
    std::optional<int64_t> kv_length, q_offset;
  };
  const Case cases[] = {
      {1, 1, 1, 1, 1, 4, 4, false, {}, {}},
      {2, 4, 2, 5, 7, 16, 8, false, {}, {}},
      {2, 4, 2, 5, 7, 16, 8, true, {}, {}},
      {1, 8, 2, 9, 9, 32, 32, true, {}, {}},         // prefill, GQA 4:1
      {2, 8, 8, 1, 1000, 64, 64, true, 700, {}},     // decode into a KV cache (key splits)
      {1, 32, 8, 1, 4096, 128, 128, false, {}, {}},  // decode, GQA, many splits
      {1, 2, 1, 3, 12, 8, 8, true, 10, -2},          // negative offset: first rows see nothing
      {1, 2, 2, 70, 100, 64, 32, true, 90, 5},       // prefill chunk of a cache, Dv != D
      {1, 2, 1, 4, 6, 256, 256, true, {}, {}},       // large head dim (opt-in shared memory)
      {1, 3, 3, 4, 0, 8, 8, false, {}, {}},          // no keys at all: zeros
      {2, 2, 1, 3, 5, 8, 8, false, 0, {}},           // empty cache prefix: zeros
      {1, 2, 1, 0, 5, 8, 8, false, {}, {}},          // no queries
  };
  std::mt19937_64 rng(9);
  for (const Case& c : cases) {
    for (DType dtype : kFloatTypes) {
      // Contiguous K/V (16-byte vector loads) for f32 and bf16, strided views for f16.
      const Layout layout = dtype == DType::kF16 ? Layout::kStrided : Layout::kContiguous;
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " B=", c.b, " Hq=", c.hq, " Hkv=", c.hkv,
                                " Sq=", c.sq, " Skv=", c.skv, " D=", c.d, " Dv=", c.dv,
                                c.causal ? " causal" : "", " kv_length=", c.kv_length.value_or(-1),
                                " q_offset=", c.q_offset.value_or(-999)));
      // q as the usual transposed view of a [B, S, H, D] projection.
      Pair q = Random({c.b, c.sq, c.hq, c.d}, dtype, rng, Layout::kContiguous);
      q.cpu = q.cpu.Transpose(1, 2).value();
      q.gpu = q.gpu.Transpose(1, 2).value();
      const Pair k = Random({c.b, c.hkv, c.skv, c.d}, dtype, rng, layout);
      const Pair v = Random({c.b, c.hkv, c.skv, c.dv}, dtype, rng, layout);
      AttentionOptions o;
      o.causal = c.causal;
      o.kv_length = c.kv_length;
      o.q_offset = c.q_offset;
      EXPECT_TRUE(Close(ScaledDotProductAttention(q.gpu, k.gpu, v.gpu, o),
                        ScaledDotProductAttention(q.cpu, k.cpu, v.cpu, o), TolFor(dtype, 2)));
    }
  }
}

TEST(CudaOpsTest, AttentionHeadDimTooLargeIsAnError) {
  DT_SKIP_WITHOUT_CUDA();
  const Tensor q = Tensor::Zeros({1, 1, 1, 40000}, DType::kF32, kGpu).value();
  const auto r = ScaledDotProductAttention(q, q, q);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(dt::testing::Contains(r.status(), "Attention"));
}

// ---- lookup, top-k
// -------------------------------------------------------------------------------

TEST(CudaOpsTest, EmbeddingMatchesCpuExactly) {
  DT_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(10);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kI64, DType::kI32, DType::kU8,
                      DType::kBool}) {
    for (DType id_dtype : {DType::kI64, DType::kI32}) {
      for (const auto& [vocab, offset] :
           std::vector<std::pair<int64_t, int64_t>>{{10, 0}, {7, 5}, {0, 0}}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " ids ", DTypeName(id_dtype), " V=", vocab,
                                  " offset=", offset));
        const Pair table = Random({vocab, 6}, dtype, rng);
        // ids in [-3, offset + vocab + 3): some rows exist, some do not.
        std::vector<double> ids(24);
        for (double& id : ids)
          id = static_cast<double>(static_cast<int64_t>(rng() % (vocab + 9)) - 3 + offset);
        const Tensor ids_base = Tensor::FromDoubles({4, 6}, ids, id_dtype).value();
        const Tensor ids_cpu = ids_base.Transpose(0, 1).value();
        const Tensor ids_gpu = ids_base.To(kGpu).value().Transpose(0, 1).value();
        EXPECT_TRUE(
            Close(Embedding(table.gpu, ids_gpu, offset), Embedding(table.cpu, ids_cpu, offset)));
      }
    }
  }
}

TEST(CudaOpsTest, TopKMatchesCpuExactly) {
  DT_SKIP_WITHOUT_CUDA();
  const Shape shapes[] = {{1}, {5}, {3, 100}, {4, 7, 9}, {2, 5000}, {2, 70000}};
  std::mt19937_64 rng(11);
  for (const Shape& shape : shapes) {
    for (int dim = 0; dim < static_cast<int>(shape.size()); ++dim) {
      const int64_t n = shape[dim];
      std::vector<int64_t> ks = {1, std::min<int64_t>(3, n), n};
      if (n > 50) ks.push_back(50);
      if (n > 4096) ks.push_back(4097);  // sorted in global memory
      for (DType dtype : kNumericTypes) {
        for (Values values : {Values::kNormal, Values::kSmallInts, Values::kSpecials}) {
          if (values == Values::kSpecials && !IsFloating(dtype)) continue;
          for (int64_t k : ks) {
            for (bool largest : {true, false}) {
              SCOPED_TRACE(absl::StrCat(Name(shape, dtype), " dim ", dim, " k ", k,
                                        largest ? " largest" : " smallest", " values ",
                                        static_cast<int>(values)));
              const Pair x = Random(shape, dtype, rng, Layout::kStrided, values);
              const auto got = TopK(x.gpu, k, dim, largest);
              const auto want = TopK(x.cpu, k, dim, largest);
              ASSERT_TRUE(got.ok()) << got.status();
              ASSERT_TRUE(want.ok()) << want.status();
              EXPECT_TRUE(Close(got->values, want->values));
              EXPECT_TRUE(Close(got->indices, want->indices));
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace dt::ops
