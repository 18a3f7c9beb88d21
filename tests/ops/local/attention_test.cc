#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "dtensor/ops/local/cpu/attention.h"
#include "dtensor/ops/local/cpu/attention_kernels.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/ops/local/test_util.h"
#include "dtensor/tests/test_util.h"

namespace dt::ops {
namespace {

using testing::RandomTensor;

RC_GTEST_PROP(AttentionTest, AgreesWithNaiveLoops, ()) {
  const DType dtype = testing::RandomFloatDType();
  const int64_t b = *rc::gen::inRange<int64_t>(0, 3), hkv = *rc::gen::inRange<int64_t>(1, 4);
  const int64_t hq = hkv * *rc::gen::inRange<int64_t>(1, 4);
  const int64_t sq = *rc::gen::inRange<int64_t>(0, 6), skv = *rc::gen::inRange<int64_t>(0, 7);
  const int64_t d = *rc::gen::inRange<int64_t>(1, 6), dv = *rc::gen::inRange<int64_t>(0, 6);
  AttentionOptions opt;
  opt.causal = *rc::gen::arbitrary<bool>();
  if (*rc::gen::arbitrary<bool>()) opt.kv_length = *rc::gen::inRange<int64_t>(0, skv + 1);
  if (*rc::gen::arbitrary<bool>()) opt.q_offset = *rc::gen::inRange<int64_t>(-2, skv + 2);
  if (*rc::gen::arbitrary<bool>()) opt.scale = *rc::gen::inRange(1, 20) / 10.0;
  const Tensor q = RandomTensor({b, hq, sq, d}, dtype);
  const Tensor k = RandomTensor({b, hkv, skv, d}, dtype);
  const Tensor v = RandomTensor({b, hkv, skv, dv}, dtype);
  const int64_t kv_length = opt.kv_length.value_or(skv);
  const std::vector<double> want =
      testing::NaiveAttention(q, k, v, {.causal = opt.causal,
                                        .scale = opt.scale.value_or(1 / std::sqrt(static_cast<double>(d))),
                                        .kv_length = kv_length,
                                        .q_offset = opt.q_offset.value_or(kv_length - sq)});
  const Tensor got = ScaledDotProductAttention(q, k, v, opt).value();
  RC_ASSERT(got.dtype() == dtype);
  RC_ASSERT(testing::Mismatch(got, {b, hq, sq, dv}, want, testing::TolFor(dtype, 3)) == "");
}

// Decode shapes: a few queries of every query head of a group stacked against a long cache (Note
// [Query heads share their KV head's pass]), causal prefixes, GQA, and one dtype of cache that is
// read in place and one that is not.
RC_GTEST_PROP(AttentionTest, FewQueriesAgainstManyKeys, ()) {
  const DType dtype = *rc::gen::element(DType::kF32, DType::kBF16);
  const int64_t hkv = *rc::gen::inRange<int64_t>(1, 3), hq = hkv * *rc::gen::inRange<int64_t>(1, 4);
  const int64_t sq = *rc::gen::inRange<int64_t>(1, 4), skv = *rc::gen::inRange<int64_t>(128, 700);
  const int64_t d = *rc::gen::inRange<int64_t>(1, 20), dv = *rc::gen::inRange<int64_t>(1, 20);
  AttentionOptions opt;
  opt.causal = *rc::gen::arbitrary<bool>();
  opt.kv_length = *rc::gen::inRange<int64_t>(0, skv + 1);
  opt.q_offset = *rc::gen::inRange<int64_t>(-2, *opt.kv_length + 1);
  const Tensor q = RandomTensor({1, hq, sq, d}, dtype);
  const Tensor k = RandomTensor({1, hkv, skv, d}, dtype);
  const Tensor v = RandomTensor({1, hkv, skv, dv}, dtype);
  const std::vector<double> want =
      testing::NaiveAttention(q, k, v, {.causal = opt.causal, .scale = 1 / std::sqrt(static_cast<double>(d)),
                                        .kv_length = *opt.kv_length, .q_offset = *opt.q_offset});
  RC_ASSERT(testing::Mismatch(ScaledDotProductAttention(q, k, v, opt).value(), {1, hq, sq, dv}, want,
                              testing::TolFor(dtype, 3)) == "");
}

// Keys and values of a dtype other than q's (Note [A KV cache of its own dtype] in
// ops/local/attention.cc) on both paths: the score rows read them in place, the flash path
// converts them per task; either agrees with the loops on the same values within q's rounding.
RC_GTEST_PROP(AttentionTest, KeysAndValuesOfTheirOwnDType, ()) {
  const DType dtype = *rc::gen::element(DType::kF32, DType::kBF16, DType::kF16);
  const DType kv_dtype = *rc::gen::element(DType::kF32, DType::kBF16, DType::kF16);
  const bool score_rows = *rc::gen::arbitrary<bool>();
  RC_TAG(std::string(DTypeName(dtype)), std::string(DTypeName(kv_dtype)),
         score_rows ? "score rows" : "flash");
  const int64_t hkv = *rc::gen::inRange<int64_t>(1, 3), hq = hkv * *rc::gen::inRange<int64_t>(1, 4);
  const int64_t sq = *rc::gen::inRange<int64_t>(1, 20), skv = *rc::gen::inRange<int64_t>(1, 300);
  const int64_t d = *rc::gen::inRange<int64_t>(1, 70), dv = *rc::gen::inRange<int64_t>(1, 70);
  AttentionParams p;
  p.causal = *rc::gen::arbitrary<bool>();
  p.kv_length = *rc::gen::inRange<int64_t>(0, skv + 1);
  p.q_offset = p.kv_length - sq;
  p.scale = static_cast<float>(1 / std::sqrt(static_cast<double>(d)));
  const Tensor q = RandomTensor({1, hq, sq, d}, dtype);
  const Tensor k = RandomTensor({1, hkv, skv, d}, kv_dtype);
  const Tensor v = RandomTensor({1, hkv, skv, dv}, kv_dtype);
  const std::vector<double> want = testing::NaiveAttention(
      q, k, v, {.causal = p.causal, .scale = p.scale, .kv_length = p.kv_length,
                .q_offset = p.q_offset});
  cpu::AttentionTuning tuning;
  tuning.flash_min_rows = tuning.flash_min_rows_bf16 = score_rows ? int64_t{1} << 20 : 0;
  const Tensor out = Tensor::Empty({1, hq, sq, dv}, dtype).value();
  const absl::Status st = cpu::AttentionTuned(q, k, v, p, tuning, out);
  if (!st.ok()) RC_FAIL(st.ToString());
  // bf16 q on the flash path rounds f32 and f16 keys to bf16 (products of bf16 pairs).
  const DType coarsest = dtype == DType::kBF16 || kv_dtype == DType::kBF16 ? DType::kBF16 : dtype;
  RC_ASSERT(testing::Mismatch(out, {1, hq, sq, dv}, want, testing::TolFor(coarsest, 3)) == "");
}

// More queries than one block of the kernel, a KV-cache prefix, GQA, non-contiguous k/v.
TEST(AttentionTest, LongSequenceWithCache) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> normal;
  auto make = [&](const Shape& s) {
    std::vector<double> v(static_cast<size_t>(Numel(s)));
    for (double& x : v) x = normal(rng);
    return Tensor::FromDoubles(s, v).value();
  };
  const Tensor q = make({1, 4, 150, 8});
  const Tensor k = make({1, 200, 2, 8}).Transpose(1, 2).value();  // [1, 2, 200, 8], strided
  const Tensor v = make({1, 2, 200, 6});
  AttentionOptions opt;
  opt.causal = true;
  opt.kv_length = 170;  // q_offset defaults to 20
  const std::vector<double> want =
      testing::NaiveAttention(q, k, v, {.scale = 1 / std::sqrt(8.0), .kv_length = 170, .q_offset = 20});
  EXPECT_EQ(testing::Mismatch(ScaledDotProductAttention(q, k, v, opt).value(), {1, 4, 150, 6}, want,
                              {1e-5, 1e-5}),
            "");
}

using cpu::attention::Isa;

std::vector<Isa> SupportedIsas() {
  return testing::SupportedIsas({Isa::kGeneric, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16},
                                cpu::attention::IsaSupported);
}

// Forces the flash path's instruction set for one scope.
using ForceIsa = testing::Forced<Isa, cpu::attention::SetIsaForTesting>;

// The CPU kernel with `tuning` on q [B, Hq, Sq, D], k, v: out [B, Hq, Sq, Dv], contiguous or (when
// `transposed_out`) a [B, Sq, Hq, Dv] buffer seen as [B, Hq, Sq, Dv].
Tensor RunTuned(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                const cpu::AttentionTuning& tuning, bool transposed_out) {
  const int64_t b = q.size(0), hq = q.size(1), sq = q.size(2), dv = v.size(3);
  const Tensor out = transposed_out
                         ? Tensor::Empty({b, sq, hq, dv}, q.dtype()).value().Transpose(1, 2).value()
                         : Tensor::Empty({b, hq, sq, dv}, q.dtype()).value();
  const absl::Status st = cpu::AttentionTuned(q, k, v, p, tuning, out);
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

// The flash path (and, for few stacked rows, the score-row path) against the definition in double
// over random shapes up to Llama's head dims, GQA groups, KV-cache prefixes and offsets, random
// memory layouts of q, k, v and out, random block sizes (edge tiles of every kernel: blocks of one
// key or query, blocks not dividing the sequence, odd head dims) and every instruction set of this
// CPU. Tolerances: f32 accumulates in f32 (TolFor's f32 bound, x3 for the scores' error over up to
// 256 products); bf16 rounds the probabilities to bf16 before P·V (relative error 2^-9 on each
// weight, so at most 2^-9 max|v| < 0.01 on the output, for |v| < 5) and the output once
// (TolFor's bf16 bound); f16 runs in f32 and rounds the output once.
RC_GTEST_PROP(AttentionTest, TunedKernelAgreesWithDouble, ()) {
  const DType dtype = *rc::gen::element(DType::kF32, DType::kBF16, DType::kBF16, DType::kF16);
  const int64_t b = *rc::gen::inRange<int64_t>(1, 3), hkv = *rc::gen::inRange<int64_t>(1, 3);
  const int64_t hq = hkv * *rc::gen::inRange<int64_t>(1, 5);
  // Head dims up to 256 with the sequences kept short enough for the double reference; sizes
  // uniform over their ranges (not scaled down in the early cases as inRange alone is), so that
  // most cases have several blocks of keys and of stacked rows.
  const auto uniform = [](int64_t lo, int64_t hi) {
    return *rc::gen::resize(rc::kNominalSize, rc::gen::inRange<int64_t>(lo, hi));
  };
  const bool wide = *rc::gen::inRange(0, 4) == 0;
  const int64_t d = wide ? uniform(65, 257) : uniform(1, 65);
  const int64_t dv = wide ? uniform(1, 257) : uniform(1, 65);
  const int64_t sq = uniform(1, wide ? 24 : 70);
  const int64_t skv = uniform(1, wide ? 60 : 150);
  AttentionParams p;
  p.causal = *rc::gen::arbitrary<bool>();
  p.kv_length = *rc::gen::element(skv, *rc::gen::inRange<int64_t>(0, skv + 1));
  p.q_offset = *rc::gen::element(p.kv_length - sq, *rc::gen::inRange<int64_t>(-3, skv + 3));
  p.scale = static_cast<float>(*rc::gen::element(1 / std::sqrt(static_cast<double>(d)),
                                                  *rc::gen::inRange(1, 20) / 10.0));
  cpu::AttentionTuning tuning;
  tuning.q_block = *rc::gen::element(int64_t{64}, *rc::gen::inRange<int64_t>(1, 130));
  tuning.kv_block = *rc::gen::element(int64_t{64}, *rc::gen::inRange<int64_t>(1, 100));
  tuning.flash_min_rows = *rc::gen::element<int64_t>(0, 16, 1 << 20);
  tuning.flash_min_rows_bf16 = *rc::gen::element<int64_t>(0, 16, 1 << 20);
  const Isa isa = *rc::gen::elementOf(SupportedIsas());
  const Tensor q = testing::RandomTensor({b, hq, sq, d}, dtype);
  const Tensor k = testing::RandomTensor({b, hkv, skv, d}, dtype);
  const Tensor v = testing::RandomTensor({b, hkv, skv, dv}, dtype);
  const bool transposed_out = *rc::gen::arbitrary<bool>();
  RC_TAG(std::string(DTypeName(dtype)), std::string(cpu::attention::IsaName(isa)));
  const std::vector<double> want = testing::NaiveAttention(
      q, k, v, {.causal = p.causal, .scale = p.scale, .kv_length = p.kv_length, .q_offset = p.q_offset});
  ForceIsa force(isa);
  const Tensor got = RunTuned(q, k, v, p, tuning, transposed_out);
  RC_ASSERT(testing::Mismatch(got, {b, hq, sq, dv}, want, testing::TolFor(dtype, 3)) == "");
}

// A prefill of the tiny bench_llama shape (8 query heads on 4 KV heads, head dim 64), causal, on
// every instruction set: the default blocks, full tiles of every kernel.
TEST(AttentionTest, FlashPrefillOnEveryIsa) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal;
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    auto make = [&](const Shape& s) {
      std::vector<double> x(static_cast<size_t>(Numel(s)));
      for (double& e : x) e = normal(rng);
      return Tensor::FromDoubles(s, x, dtype).value();
    };
    // q and k as the model's projections make them: [B, S, H, D] seen as [B, H, S, D].
    const Tensor q = make({1, 200, 8, 64}).Transpose(1, 2).value();
    const Tensor k = make({1, 200, 4, 64}).Transpose(1, 2).value();
    const Tensor v = make({1, 4, 200, 64});
    const std::vector<double> want = testing::NaiveAttention(q, k, v, {.scale = 0.125, .kv_length = 200});
    AttentionParams p;
    p.causal = true, p.scale = 0.125f, p.kv_length = 200, p.q_offset = 0;
    for (const Isa isa : SupportedIsas()) {
      ForceIsa force(isa);
      EXPECT_EQ(testing::Mismatch(RunTuned(q, k, v, p, {}, false), {1, 8, 200, 64}, want,
                                  testing::TolFor(dtype, 3)),
                "")
          << DTypeName(dtype) << " " << cpu::attention::IsaName(isa);
    }
  }
}

TEST(AttentionTest, TuningMustHaveBlocks) {
  const Tensor q = Tensor::Zeros({1, 1, 2, 4}).value();
  AttentionParams p;
  p.kv_length = 2;
  cpu::AttentionTuning tuning;
  tuning.kv_block = 0;
  const absl::Status st = cpu::AttentionTuned(q, q, q, p, tuning, Tensor::Empty({1, 1, 2, 4}).value());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dt::testing::Contains(st, "q_block (64) and kv_block (0) must be at least 1")) << st;
}

TEST(AttentionTest, Golden) {
  // One query, two keys with scores 0 and ln 3 (scale 1): weights 1/4 and 3/4.
  const Tensor q = Tensor::FromVector<float>({1, 1, 1, 1}, {1}).value();
  const Tensor k = Tensor::FromVector<float>({1, 1, 2, 1}, {0, std::log(3.0f)}).value();
  const Tensor v = Tensor::FromVector<float>({1, 1, 2, 2}, {4, 8, 0, 4}).value();
  AttentionOptions opt;
  opt.scale = 1.0;
  std::vector<float> o = ScaledDotProductAttention(q, k, v, opt).value().ToVector<float>();
  EXPECT_NEAR(o[0], 1, 1e-6);
  EXPECT_NEAR(o[1], 5, 1e-6);
  // Causal with q_offset 0: the query sees only key 0.
  opt.causal = true;
  opt.q_offset = 0;
  o = ScaledDotProductAttention(q, k, v, opt).value().ToVector<float>();
  EXPECT_EQ(o, (std::vector<float>{4, 8}));
  // No visible key: zeros.
  opt.q_offset = -1;
  EXPECT_EQ(ScaledDotProductAttention(q, k, v, opt).value().ToVector<float>(), (std::vector<float>{0, 0}));
  // GQA: query heads 0, 1 use kv head 0; heads 2, 3 use kv head 1.
  const Tensor q4 = Tensor::Ones({1, 4, 1, 1}).value();
  const Tensor k2 = Tensor::Ones({1, 2, 1, 1}).value();
  const Tensor v2 = Tensor::FromVector<float>({1, 2, 1, 1}, {10, 20}).value();
  EXPECT_EQ(ScaledDotProductAttention(q4, k2, v2).value().ToVector<float>(),
            (std::vector<float>{10, 10, 20, 20}));
}

TEST(AttentionTest, Errors) {
  const Tensor q = Tensor::Zeros({1, 3, 2, 4}).value(), k = Tensor::Zeros({1, 2, 5, 4}).value();
  auto s = ScaledDotProductAttention(q, k, k).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dt::testing::Contains(s, "ScaledDotProductAttention: shapes do not match"));
  AttentionOptions opt;
  opt.kv_length = 6;
  s = ScaledDotProductAttention(Tensor::Zeros({1, 2, 2, 4}).value(), k, k, opt).status();
  EXPECT_TRUE(dt::testing::Contains(s, "kv_length 6 is out of range for Skv 5"));
  s = ScaledDotProductAttention(Tensor::Zeros({2, 4}).value(), k, k).status();
  EXPECT_TRUE(dt::testing::Contains(s, "expected q [B, Hq, Sq, D]"));
  // Keys and values share a dtype (q's may differ on the CPU).
  s = ScaledDotProductAttention(q, k, k.To(DType::kF16).value()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dt::testing::Contains(s, "ScaledDotProductAttention")) << s;
  EXPECT_TRUE(dt::testing::Contains(s, "f16")) << s;
}

}  // namespace
}  // namespace dt::ops
