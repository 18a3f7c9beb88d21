// ScaledDotProductAttentionInto (ops/local/ops.h): the attention written into a given layout is
// ScaledDotProductAttention's result, bit for bit, and its argument errors name it.

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/ops/local/test_util.h"
#include "dtensor/tests/test_util.h"

namespace dt::ops {
namespace {

using testing::RandomTensor;

// Into the transpose of a [B, Sq, Hq, Dv] tensor (what an attention layer passes, so that o_proj
// reads the heads' rows joined), any shapes, GQA groups, masks and dtypes: the same bits as the
// fresh output.
RC_GTEST_PROP(AttentionIntoTest, EqualsTheFreshOutput, ()) {
  const DType dtype = testing::RandomFloatDType();
  const int64_t b = *rc::gen::inRange<int64_t>(1, 3), hkv = *rc::gen::inRange<int64_t>(1, 4);
  const int64_t hq = hkv * *rc::gen::inRange<int64_t>(1, 4);
  const int64_t sq = *rc::gen::inRange<int64_t>(1, 9), skv = sq + *rc::gen::inRange<int64_t>(0, 9);
  const int64_t d = *rc::gen::inRange<int64_t>(1, 40), dv = *rc::gen::inRange<int64_t>(1, 40);
  AttentionOptions opt;
  opt.causal = *rc::gen::arbitrary<bool>();
  const Tensor q = RandomTensor({b, sq, hq, d}, dtype).Transpose(1, 2).value();
  const Tensor k = RandomTensor({b, hkv, skv, d}, dtype);
  const Tensor v = RandomTensor({b, skv, hkv, dv}, dtype).Transpose(1, 2).value();
  const Tensor rows = Tensor::Empty({b, sq, hq, dv}, dtype).value();
  const absl::Status st =
      ScaledDotProductAttentionInto(rows.Transpose(1, 2).value(), q, k, v, opt);
  if (!st.ok()) RC_FAIL(st.ToString());
  const Tensor want = ScaledDotProductAttention(q, k, v, opt).value();
  RC_ASSERT(Equal(rows.Transpose(1, 2).value().Contiguous().value(), want));
}

TEST(AttentionIntoTest, Errors) {
  const Tensor q = Tensor::Zeros({1, 2, 3, 4}).value();
  const Tensor out = Tensor::Zeros({1, 2, 3, 4}).value();
  EXPECT_TRUE(dt::testing::Contains(
      ScaledDotProductAttentionInto(Tensor::Zeros({1, 2, 3, 5}).value(), q, q, q),
      "ScaledDotProductAttentionInto: out must have shape [1, 2, 3, 4], got f32[1, 2, 3, 5] cpu"));
  EXPECT_TRUE(dt::testing::Contains(
      ScaledDotProductAttentionInto(Tensor::Zeros({1, 2, 3, 4}, DType::kBF16).value(), q, q, q),
      "ScaledDotProductAttentionInto: dtypes differ: q f32[1, 2, 3, 4] cpu, out bf16"));
  EXPECT_TRUE(dt::testing::Contains(
      ScaledDotProductAttentionInto(Tensor::Zeros({1, 2, 4, 3}).value().Transpose(2, 3).value(),
                                    q, q, q),
      "ScaledDotProductAttentionInto: out f32[1, 2, 3, 4] cpu must be writable with a unit stride "
      "along its last dim"));
  EXPECT_TRUE(dt::testing::Contains(ScaledDotProductAttentionInto(q, q, out, out),
                                    "ScaledDotProductAttentionInto: out f32[1, 2, 3, 4] cpu shares "
                                    "its storage with q"));
  EXPECT_TRUE(dt::testing::Contains(
      ScaledDotProductAttentionInto(out, Tensor::Zeros({1, 2, 3}).value(), q, q),
      "ScaledDotProductAttentionInto: expected q [B, Hq, Sq, D]"));
}

}  // namespace
}  // namespace dt::ops
