#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/ops/local/test_util.h"
#include "dtensor/tests/test_util.h"

namespace dt::ops {
namespace {

RC_GTEST_PROP(EmbeddingTest, MaskedLookupAgreesWithNaiveLoops, ()) {
  const DType dtype = *rc::gen::elementOf(std::vector<DType>(std::begin(kAllDTypes), std::end(kAllDTypes)));
  const int64_t vocab = *rc::gen::inRange<int64_t>(0, 7), h = *rc::gen::inRange<int64_t>(0, 5);
  const int64_t offset = *rc::gen::inRange<int64_t>(-3, 6);
  const Shape ids_shape = testing::RandomShape(*rc::gen::inRange(0, 4), 0, 4);
  const DType id_dtype = *rc::gen::element(DType::kI64, DType::kI32);
  std::vector<double> ids_v(static_cast<size_t>(Numel(ids_shape)));
  for (double& i : ids_v) i = *rc::gen::inRange<int64_t>(offset - 2, offset + vocab + 2);
  Tensor ids = Tensor::FromDoubles(ids_shape, ids_v, id_dtype).value();
  if (ids.dim() >= 2) ids = ids.Transpose(0, 1).value();  // strided ids
  const Tensor table = testing::RandomTensor({vocab, h}, dtype);
  const std::vector<double> tv = table.ToDoubles(), iv = ids.ToDoubles();
  std::vector<double> want;
  for (double id : iv) {
    const int64_t row = static_cast<int64_t>(id) - offset;
    for (int64_t j = 0; j < h; ++j) want.push_back(row >= 0 && row < vocab ? tv[row * h + j] : 0.0);
  }
  Shape out_shape = ids.shape();
  out_shape.push_back(h);
  const Tensor got = Embedding(table, ids, offset).value();
  RC_ASSERT(got.dtype() == dtype);
  RC_ASSERT(testing::Mismatch(got, out_shape, want) == "");
}

TEST(EmbeddingTest, GoldenAndErrors) {
  // A shard holding rows 10..12 of the vocabulary.
  const Tensor table = Tensor::FromVector<float>({2, 2}, {1, 2, 3, 4}).value();
  const Tensor ids = Tensor::FromVector<int64_t>({4}, {10, 11, 9, 12}).value();
  EXPECT_EQ(Embedding(table, ids, 10).value().ToVector<float>(),
            (std::vector<float>{1, 2, 3, 4, 0, 0, 0, 0}));
  EXPECT_EQ(Embedding(table, Tensor::FromVector<int64_t>({1}, {INT64_MIN}).value(), 1).value().ToVector<float>(),
            (std::vector<float>{0, 0}));
  auto s = Embedding(table, Tensor::Zeros({2}).value()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dt::testing::Contains(s, "Embedding: ids must be i64 or i32, got f32[2] cpu"));
  s = Embedding(Tensor::Zeros({4}).value(), ids).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Embedding: table must have shape [V, H]"));
}

}  // namespace
}  // namespace dt::ops
