#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "dtensor/core/shape.h"
#include "dtensor/tests/test_util.h"

namespace dt {
namespace {

RC_GTEST_PROP(ShapeTest, BroadcastFollowsNumpy, ()) {
  // Two shapes cut from one (trailing-aligned), with random dims replaced by 1.
  Shape full;
  for (int i = *rc::gen::inRange(0, 5); i > 0; --i) full.push_back(*rc::gen::inRange<int64_t>(0, 4));
  auto cut = [&] {
    Shape s(full.begin() + *rc::gen::inRange<size_t>(0, full.size() + 1), full.end());
    for (int64_t& d : s) d = *rc::gen::arbitrary<bool>() ? d : 1;
    return s;
  };
  const Shape a = cut(), b = cut();
  const Shape got = BroadcastShapes(a, b).value();
  RC_ASSERT(got.size() == std::max(a.size(), b.size()));
  for (size_t i = 0; i < got.size(); ++i) {
    const size_t from_end = got.size() - i;
    const int64_t x = from_end <= a.size() ? a[a.size() - from_end] : 1;
    const int64_t y = from_end <= b.size() ? b[b.size() - from_end] : 1;
    RC_ASSERT(got[i] == (x == 1 ? y : x));
  }
  RC_ASSERT(BroadcastShapes(b, a).value() == got);
}

TEST(ShapeTest, Basics) {
  EXPECT_EQ(Numel({}), 1);
  EXPECT_EQ(Numel({3, 0, 2}), 0);
  EXPECT_EQ(ContiguousStrides({2, 3, 4}), (Shape{12, 4, 1}));
  EXPECT_EQ(ShapeToString({4, 1024}), "[4, 1024]");
  EXPECT_EQ(ParseShape("4,1024").value(), (Shape{4, 1024}));
  EXPECT_EQ(ParseShape("[4, 1024]").value(), (Shape{4, 1024}));
  EXPECT_EQ(ParseShape("4x1024").value(), (Shape{4, 1024}));
  EXPECT_EQ(ParseShape("[]").value(), Shape{});
  EXPECT_EQ(NormalizeDim(-1, 3).value(), 2);
  auto s = ParseShape("4,-1").status();
  EXPECT_TRUE(dt::testing::Contains(s, "bad shape '4,-1': '-1' is not a non-negative integer"));
  s = NormalizeDim(3, 3, "Softmax: dim").status();
  EXPECT_TRUE(dt::testing::Contains(s, "Softmax: dim 3 is out of range for a tensor of 3 dims (expected -3..2)"));
  s = BroadcastShapes({2, 3}, {4}).status();
  EXPECT_TRUE(dt::testing::Contains(s, "shapes [2, 3] and [4] do not broadcast (dim 1: 3 vs 4)"));
}

}  // namespace
}  // namespace dt
