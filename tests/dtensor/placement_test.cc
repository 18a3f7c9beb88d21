#include "dtensor/dtensor/placement.h"

#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "dtensor/tests/test_util.h"

namespace dt {
namespace {

TEST(PlacementTest, CanonicalTextRoundTrips) {
  for (const char* text : {"R", "S(0)", "S(3)", "S(-1)", "P(sum)", "P(avg)", "P(min)", "P(max)",
                           "P(prod)", "S(0,unit=64)", "S(-1,unit=3)",
                           "_S(0,2)", "_S(1,[3072,3072,3072,9216,9216])", "_S(0,[0,5])"}) {
    auto p = ParsePlacement(text);
    ASSERT_TRUE(p.ok()) << text << ": " << p.status();
    EXPECT_EQ(p->ToString(), text);
  }
}

TEST(PlacementTest, LongFormsParseToCanonical) {
  const std::pair<const char*, const char*> cases[] = {
      {"Replicate()", "R"},        {"Shard(1)", "S(1)"},          {"Partial()", "P(sum)"},
      {"P", "P(sum)"},             {"Partial(max)", "P(max)"},    {"Partial(product)", "P(prod)"},
      {"Partial(reduce_op='avg')", "P(avg)"},                    {" S( 2 ) ", "S(2)"},
      {"_StridedShard(0, sf=2)", "_S(0,2)"},                     {"_S(0, split_factor=3)", "_S(0,3)"},
      {"_S(0, [1, 2 ,3])", "_S(0,[1,2,3])"},                     {"_S(0,1)", "S(0)"},
      {"Shard(1, unit=64)", "S(1,unit=64)"},                     {"S(0,unit=1)", "S(0)"},
  };
  for (const auto& [in, want] : cases) {
    auto p = ParsePlacement(in);
    ASSERT_TRUE(p.ok()) << in << ": " << p.status();
    EXPECT_EQ(p->ToString(), want) << in;
  }
}

TEST(PlacementTest, BadTextIsAnErrorNamingTheInput) {
  for (const char* text : {"", "Q", "S", "S(x)", "P(mean)", "_S(0)", "_S(0,0)", "_S(0,[1,-2])",
                           "_S(0,[1,2)", "S(0", "R(1)", "S(0,64)", "S(0,unit=0)",
                           "S(0,unit=2,3)"}) {
    auto p = ParsePlacement(text);
    ASSERT_FALSE(p.ok()) << text;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(dt::testing::Contains(p.status(), "bad placement"));
  }
}

TEST(PlacementTest, ListsParseWithOrWithoutBrackets) {
  auto a = ParsePlacements("S(0),R");
  auto b = ParsePlacements("[S(0), R]");
  auto c = ParsePlacements("[_S(0,[3,5]), P(avg), R]");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(PlacementsToString(*a), "[S(0), R]");
  EXPECT_EQ(PlacementsToCompactString(*c), "_S(0,[3,5]),P(avg),R");
  EXPECT_FALSE(ParsePlacements("").ok());
  EXPECT_FALSE(ParsePlacements("[S(0), R").ok());
  EXPECT_FALSE(ParsePlacements("S(0),,R").ok());
}

TEST(PlacementTest, EqualityAndHashAreStructural) {
  EXPECT_EQ(Placement::Shard(0), *ParsePlacement("S(0)"));
  EXPECT_NE(Placement::Shard(0), Placement::Shard(1));
  EXPECT_NE(Placement::Shard(0), Placement::StridedShard(0, 2));
  EXPECT_NE(Placement::StridedShard(0, 2), Placement::BlockShard(0, {4, 4}));
  EXPECT_EQ(Placement::BlockShard(0, {4, 4}), Placement::BlockShard(0, {4, 4}));
  EXPECT_EQ(Placement::BlockShard(0, {4, 4}).Hash(), Placement::BlockShard(0, {4, 4}).Hash());
  EXPECT_NE(Placement::Partial(ReduceOp::kSum), Placement::Partial(ReduceOp::kAvg));
  EXPECT_EQ(Placement(), Placement::Replicate());
  EXPECT_EQ(Placement::Shard(0, 1), Placement::Shard(0));
  EXPECT_NE(Placement::Shard(0, 64), Placement::Shard(0));
  EXPECT_NE(Placement::Shard(0, 64), Placement::Shard(0, 32));
  EXPECT_NE(Placement::Shard(0, 64).Hash(), Placement::Shard(0).Hash());
  EXPECT_TRUE(Placement::Shard(0, 64).is_shard());
  EXPECT_EQ(Placement::Shard(0, 64).WithDim(1), Placement::Shard(1, 64));
}

TEST(PlacementTest, ChunkFollowsTorchChunk) {
  // torch.chunk(arange(5), 4) -> sizes [2, 2, 1, 0]; the empty chunk's offset is 5.
  const Chunk want[] = {{0, 2}, {2, 2}, {4, 1}, {5, 0}};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ChunkOf(5, 4, r).offset, want[r].offset);
    EXPECT_EQ(ChunkOf(5, 4, r).size, want[r].size);
  }
  EXPECT_EQ(ChunkOf(0, 4, 0).size, 0);
  EXPECT_EQ(ChunkOf(0, 4, 0).offset, 0);
  EXPECT_EQ(ChunkOf(7, 1, 0).size, 7);
}

TEST(PlacementTest, BlockSizes) {
  using V = absl::InlinedVector<int64_t, 8>;
  EXPECT_EQ(Placement::StridedShard(0, 2).BlockSizes(9), (V{5, 4}));
  EXPECT_EQ(Placement::StridedShard(0, 4).BlockSizes(5), (V{2, 2, 1, 0}));
  EXPECT_EQ(Placement::BlockShard(0, {3, 5}).BlockSizes(8), (V{3, 5}));
  EXPECT_EQ(Placement::Shard(0).BlockSizes(8), (V{8}));
}

// Independent torch.chunk: sizes from repeated ceil division as PyTorch's docstring states it.
RC_GTEST_PROP(PlacementProp, ChunksPartitionTheDim, ()) {
  const int64_t n = *rc::gen::inRange<int64_t>(0, 200);
  const int64_t k = *rc::gen::inRange<int64_t>(1, 20);
  int64_t next = 0;
  bool seen_short = false;
  for (int64_t r = 0; r < k; ++r) {
    const Chunk c = ChunkOf(n, k, r);
    if (c.size == 0) {
      RC_ASSERT(c.offset == n);
      continue;
    }
    RC_ASSERT(!seen_short);
    RC_ASSERT(c.offset == next);
    RC_ASSERT(c.size == (n + k - 1) / k || c.offset + c.size == n);
    seen_short = c.size != (n + k - 1) / k;
    next += c.size;
  }
  RC_ASSERT(next == n);
}

RC_GTEST_PROP(PlacementProp, PrintParseRoundTrip, ()) {
  const int kind = *rc::gen::inRange(0, 5);
  const int dim = *rc::gen::inRange(-3, 6);
  Placement p;
  switch (kind) {
    case 0: p = Placement::Replicate(); break;
    case 1: p = Placement::Shard(dim); break;
    case 2: p = Placement::Partial(static_cast<ReduceOp>(*rc::gen::inRange(0, 5))); break;
    case 3: p = Placement::StridedShard(dim, *rc::gen::inRange<int64_t>(1, 9)); break;
    default:
      p = Placement::BlockShard(
          dim, *rc::gen::nonEmpty(rc::gen::container<std::vector<int64_t>>(
                   rc::gen::inRange<int64_t>(0, 10000))));
  }
  auto q = ParsePlacement(p.ToString());
  RC_ASSERT(q.ok());
  RC_ASSERT(*q == p);
  RC_ASSERT(q->Hash() == p.Hash());
}

}  // namespace
}  // namespace dt
