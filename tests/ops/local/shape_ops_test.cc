#include <algorithm>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/ops/local/test_util.h"
#include "dtensor/tests/test_util.h"

namespace dt::ops {
namespace {

using testing::RandomShape;
using testing::RandomTensor;

DType AnyDType() {
  return *rc::gen::elementOf(std::vector<DType>(std::begin(kAllDTypes), std::end(kAllDTypes)));
}

RC_GTEST_PROP(CatTest, AgreesWithIndexArithmetic, ()) {
  const DType dtype = AnyDType();
  const int rank = *rc::gen::inRange(1, 4);
  const Shape base = RandomShape(rank, 0, 4);
  const int d = *rc::gen::inRange(0, rank);
  const int count = *rc::gen::inRange(1, 5);
  std::vector<Tensor> ts;
  std::vector<std::vector<double>> vals;
  Shape out_shape = base;
  out_shape[d] = 0;
  for (int i = 0; i < count; ++i) {
    Shape s = base;
    s[d] = *rc::gen::inRange<int64_t>(0, 4);
    out_shape[d] += s[d];
    ts.push_back(RandomTensor(s, dtype));
    vals.push_back(ts.back().ToDoubles());
  }
  std::vector<double> want(static_cast<size_t>(Numel(out_shape)));
  for (int64_t o = 0; o < Numel(out_shape); ++o) {
    Shape idx = testing::Unravel(o, out_shape);
    int t = 0;
    while (idx[d] >= ts[t].size(d)) idx[d] -= ts[t++].size(d);
    want[o] = vals[t][testing::FlatIndex(idx, ts[t].shape())];
  }
  const Tensor got = Cat(ts, *rc::gen::arbitrary<bool>() ? d : d - rank).value();
  RC_ASSERT(got.dtype() == dtype);
  RC_ASSERT(testing::Mismatch(got, out_shape, want) == "");
}

RC_GTEST_PROP(SplitTest, PiecesAreViewsOfConsecutiveRanges, ()) {
  const int rank = *rc::gen::inRange(1, 4);
  const Shape shape = RandomShape(rank, 0, 7);
  const int d = *rc::gen::inRange(0, rank);
  const Tensor x = RandomTensor(shape, DType::kF32);
  // Random sizes summing to shape[d]: the gaps between sorted random cut points.
  std::vector<int64_t> cuts = {0, shape[d]};
  for (int c = *rc::gen::inRange(0, 4); c > 0; --c) cuts.push_back(*rc::gen::inRange<int64_t>(0, shape[d] + 1));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int64_t> sizes;
  for (size_t i = 1; i < cuts.size(); ++i) sizes.push_back(cuts[i] - cuts[i - 1]);
  const std::vector<Tensor> pieces = Split(x, sizes, d).value();
  RC_ASSERT(pieces.size() == sizes.size());
  const std::vector<double> xv = x.ToDoubles();
  int64_t start = 0;
  for (size_t p = 0; p < pieces.size(); ++p) {
    Shape ps = shape;
    ps[d] = sizes[p];
    std::vector<double> want;
    for (int64_t i = 0; i < Numel(ps); ++i) {
      Shape idx = testing::Unravel(i, ps);
      idx[d] += start;
      want.push_back(xv[testing::FlatIndex(idx, shape)]);
    }
    RC_ASSERT(testing::Mismatch(pieces[p], ps, want) == "");
    const bool is_view = pieces[p].storage().data() == x.storage().data();
    RC_ASSERT(is_view);
    start += sizes[p];
  }
}

RC_GTEST_PROP(ChunkTest, FollowsTorchChunk, ()) {
  const int64_t n = *rc::gen::inRange<int64_t>(0, 12), chunks = *rc::gen::inRange<int64_t>(1, 6);
  const Tensor x = RandomTensor({2, n}, DType::kF32);
  const std::vector<Tensor> pieces = Chunk(x, chunks, 1).value();
  // torch.chunk: ceil(n / chunks) per piece, as many pieces as needed; n == 0 gives `chunks` empties.
  std::vector<int64_t> want;
  if (n == 0) {
    want.assign(static_cast<size_t>(chunks), 0);
  } else {
    const int64_t c = (n + chunks - 1) / chunks;
    for (int64_t left = n; left > 0; left -= c) want.push_back(std::min(c, left));
  }
  std::vector<int64_t> got;
  for (const Tensor& p : pieces) got.push_back(p.size(1));
  RC_ASSERT(got == want);
  RC_ASSERT(Equal(Cat(pieces, 1).value(), x.Contiguous().value()));
}

TEST(ChunkTest, Golden) {
  auto sizes = [](int64_t n, int64_t chunks) {
    const std::vector<Tensor> pieces = Chunk(Tensor::Arange(0, n).value(), chunks, 0).value();
    std::vector<int64_t> s;
    for (const Tensor& p : pieces) s.push_back(p.size(0));
    return s;
  };
  EXPECT_EQ(sizes(6, 3), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(sizes(5, 4), (std::vector<int64_t>{2, 2, 1}));
  EXPECT_EQ(sizes(1, 3), (std::vector<int64_t>{1}));
  EXPECT_EQ(sizes(0, 2), (std::vector<int64_t>{0, 0}));
}

RC_GTEST_PROP(PadTest, AgreesWithIndexArithmetic, ()) {
  const DType dtype = AnyDType();
  const int rank = *rc::gen::inRange(1, 4);
  const Shape shape = RandomShape(rank, 0, 4);
  const int d = *rc::gen::inRange(0, rank);
  const int64_t before = *rc::gen::inRange<int64_t>(0, 3), after = *rc::gen::inRange<int64_t>(0, 3);
  const double value = dtype == DType::kBool ? 1.0 : 7.0;
  const Tensor x = RandomTensor(shape, dtype);
  Shape out_shape = shape;
  out_shape[d] += before + after;
  const std::vector<double> xv = x.ToDoubles();
  std::vector<double> want;
  for (int64_t o = 0; o < Numel(out_shape); ++o) {
    Shape idx = testing::Unravel(o, out_shape);
    idx[d] -= before;
    want.push_back(idx[d] < 0 || idx[d] >= shape[d] ? value : xv[testing::FlatIndex(idx, shape)]);
  }
  RC_ASSERT(testing::Mismatch(Pad(x, d, before, after, value).value(), out_shape, want) == "");
}

TEST(ShapeOpsTest, Errors) {
  const Tensor a = Tensor::Zeros({2, 3}).value(), b = Tensor::Zeros({3, 3}).value();
  auto s = Cat({a, b}, 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dt::testing::Contains(s, "Cat: tensors[1] f32[3, 3] cpu does not match tensors[0] f32[2, 3] cpu"));
  EXPECT_TRUE(dt::testing::Contains(Cat({a, Tensor::Zeros({2, 3}, DType::kBF16).value()}, 0).status(), "Cat:"));
  EXPECT_TRUE(dt::testing::Contains(Cat({}, 0).status(), "Cat: no tensors"));
  s = Split(a, {1, 1}, 1).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Split: sizes [1, 1] do not partition dim 1 of f32[2, 3] cpu"));
  s = Chunk(a, 0, 0).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Chunk: chunks must be >= 1, got 0"));
  s = Pad(a, 0, -1, 0).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Pad: before -1 and after 0 must be >= 0"));
  s = Pad(a, 2, 1, 1).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Pad: dim 2 is out of range"));
}

}  // namespace
}  // namespace dt::ops
