#include "dtensor/dtensor/spec.h"

#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"

namespace dt {
namespace {

DeviceMesh Mesh(std::vector<int64_t> shape, std::vector<std::string> names = {}) {
  return DeviceMesh::Abstract(std::move(shape), std::move(names)).value();
}

DTensorSpec Spec(std::vector<int64_t> mesh, const char* placements, std::vector<int64_t> shape) {
  auto spec = DTensorSpec::Create(Mesh(mesh), ParsePlacements(placements).value(), shape, DType::kF32);
  DT_CHECK_OK(spec);
  return *spec;
}

std::vector<int64_t> Coord(const DTensorSpec& s, int rank) {
  return s.mesh().CoordinateOf(rank).value();
}

// Rows on dim 0 as local-shape-examples.md writes them: "0-1,3,13", "[]" when empty.
std::string Rows(const RangeList& ranges) {
  if (ranges.empty()) return "[]";
  std::vector<std::string> parts;
  for (const IndexRange& r : ranges) {
    parts.push_back(r.size() == 1 ? std::to_string(r.start)
                                  : std::to_string(r.start) + "-" + std::to_string(r.stop - 1));
  }
  return absl::StrJoin(parts, ",");
}

struct TableCase {
  std::vector<int64_t> shape, mesh;
  const char* placements;
  std::vector<int64_t> rows;     // local_shape[0] per rank
  std::vector<int64_t> offsets;  // global_offset[0] per rank
  std::vector<std::string> dim0;  // global rows on dim 0 per rank
};

// Every table in ../shared/reference/local-shape-examples.md.
const TableCase kTables[] = {
    {{10, 4}, {4}, "S(0)", {3, 3, 3, 1}, {0, 3, 6, 9}, {"0-2", "3-5", "6-8", "9"}},
    {{5, 4}, {4}, "S(0)", {2, 2, 1, 0}, {0, 2, 4, 5}, {"0-1", "2-3", "4", "[]"}},
    {{2, 3}, {8}, "S(0)", {1, 1, 0, 0, 0, 0, 0, 0}, {0, 1, 2, 2, 2, 2, 2, 2},
     {"0", "1", "[]", "[]", "[]", "[]", "[]", "[]"}},
    {{13, 2}, {4, 2}, "S(0),S(0)", {2, 2, 2, 2, 2, 2, 1, 0}, {0, 2, 4, 6, 8, 10, 12, 13},
     {"0-1", "2-3", "4-5", "6-7", "8-9", "10-11", "12", "[]"}},
    {{18, 2}, {4, 2}, "S(0),S(0)", {3, 2, 3, 2, 3, 2, 2, 1}, {0, 3, 5, 8, 10, 13, 15, 17},
     {"0-2", "3-4", "5-7", "8-9", "10-12", "13-14", "15-16", "17"}},
    {{9, 5}, {2, 2}, "S(0),S(1)", {5, 5, 4, 4}, {0, 0, 5, 5}, {"0-4", "0-4", "5-8", "5-8"}},
    {{8, 8}, {2, 2}, "S(0),S(0)", {2, 2, 2, 2}, {0, 2, 4, 6}, {"0-1", "2-3", "4-5", "6-7"}},
    {{8, 8}, {2, 2}, "_S(0,2),S(0)", {2, 2, 2, 2}, {0, 4, 2, 6}, {"0-1", "4-5", "2-3", "6-7"}},
    {{15, 5}, {4, 2}, "_S(0,2),S(0)", {2, 2, 2, 2, 2, 2, 2, 1}, {0, 8, 2, 10, 4, 12, 6, 14},
     {"0-1", "8-9", "2-3", "10-11", "4-5", "12-13", "6-7", "14"}},
    {{39, 2}, {4, 2}, "_S(0,3),_S(0,4)", {8, 4, 8, 4, 8, 4, 3, 0}, {0, 2, 4, 6, 8, 10, 12, 39},
     {"0-1,3,13,15-16,27-28", "2,14,26,29", "4-5,7,17,19-20,31-32", "6,18,30,33",
      "8-9,11,21,23-24,35-36", "10,22,34,37", "12,25,38", "[]"}},
    {{9, 1}, {4}, "_S(0,2)", {3, 3, 2, 1}, {0, 2, 4, 8}, {"0-1,5", "2-3,6", "4,7", "8"}},
};

TEST(SpecTest, ReproducesLocalShapeExampleTables) {
  for (const TableCase& t : kTables) {
    const DTensorSpec spec = Spec(t.mesh, t.placements, t.shape);
    SCOPED_TRACE(spec.Describe());
    for (int r = 0; r < static_cast<int>(t.rows.size()); ++r) {
      const auto c = Coord(spec, r);
      EXPECT_EQ(spec.LocalShape(c)[0], t.rows[r]) << "rank " << r;
      EXPECT_EQ(spec.Offset(c)[0], t.offsets[r]) << "rank " << r;
      if (std::string(t.placements).find("S(1)") == std::string::npos) {  // dim 1 unsharded
        EXPECT_EQ(spec.LocalShape(c)[1], t.shape[1]) << "rank " << r;
        EXPECT_EQ(spec.Offset(c)[1], 0) << "rank " << r;
      }
      EXPECT_EQ(Rows(spec.Ranges(c)[0]), t.dim0[r]) << "rank " << r;
    }
  }
}

TEST(SpecTest, TwoDimShardOffsets) {
  // local-shape-examples: [S(0), S(1)] on (2, 2), global (9, 5).
  const DTensorSpec s = Spec({2, 2}, "S(0),S(1)", {9, 5});
  const std::vector<std::vector<int64_t>> shapes = {{5, 3}, {5, 2}, {4, 3}, {4, 2}};
  const std::vector<std::vector<int64_t>> offsets = {{0, 0}, {0, 3}, {5, 0}, {5, 3}};
  for (int r = 0; r < 4; ++r) {
    const Shape local = s.LocalShape(Coord(s, r));
    const Shape offset = s.Offset(Coord(s, r));
    EXPECT_EQ(std::vector<int64_t>(local.begin(), local.end()), shapes[r]);
    EXPECT_EQ(std::vector<int64_t>(offset.begin(), offset.end()), offsets[r]);
  }
}

TEST(SpecTest, UpstreamSpecOffsetExpectations) {
  // test_dtensor.py::test_dtensor_spec_local_shard_offset: mesh (2,4), tensor (24,24).
  const DTensorSpec a = Spec({2, 4}, "S(0),R", {24, 24});
  const DTensorSpec b = Spec({2, 4}, "R,S(0)", {24, 24});
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(a.Offset(Coord(a, r))[0], 12 * (r / 4));
    EXPECT_EQ(b.Offset(Coord(b, r))[0], 6 * (r % 4));
  }
  // test_utils.py 3-D: mesh (2,2,2), (16,16), [_S(0,2), S(0), S(0)]: (2,16) at 4*m0 + 8*m1 + 2*m2.
  const DTensorSpec c = Spec({2, 2, 2}, "_S(0,2),S(0),S(0)", {16, 16});
  for (int r = 0; r < 8; ++r) {
    const auto m = Coord(c, r);
    EXPECT_EQ(c.LocalShape(m)[0], 2);
    EXPECT_EQ(c.Offset(m)[0], 4 * m[0] + 8 * m[1] + 2 * m[2]) << r;
  }
  // 4-D mesh (1,2,2,2), [_S(0,2), _S(1,2), S(0), S(1)]: local (8, 4) at (8*m2+4*m0, 8*m3+4*m1).
  const DTensorSpec d = Spec({1, 2, 2, 2}, "_S(0,2),_S(1,2),S(0),S(1)", {16, 16});
  for (int r = 0; r < 8; ++r) {
    const auto m = Coord(d, r);
    EXPECT_EQ(d.LocalShape(m)[0], 8);
    EXPECT_EQ(d.LocalShape(m)[1], 4);
    EXPECT_EQ(d.Offset(m)[0], 8 * m[2] + 4 * m[0]) << r;
    EXPECT_EQ(d.Offset(m)[1], 8 * m[3] + 4 * m[1]) << r;
  }
  // (4096,4096) on (30,8), [_S(0,8), S(0)]: dp<28 holds 18 rows at 512*tp + 18*dp; dp=28 holds 8;
  // dp=29 holds none, at offset 4096.
  const DTensorSpec e = Spec({30, 8}, "_S(0,8),S(0)", {4096, 4096});
  for (int64_t dp : {0, 5, 27, 28, 29}) {
    for (int64_t tp : {0, 3, 7}) {
      const std::vector<int64_t> m = {dp, tp};
      if (dp < 28) {
        EXPECT_EQ(e.LocalShape(m)[0], 18);
        EXPECT_EQ(e.Offset(m)[0], 512 * tp + 18 * dp);
      } else if (dp == 28) {
        EXPECT_EQ(e.LocalShape(m)[0], 8);
      } else {
        EXPECT_EQ(e.LocalShape(m)[0], 0);
        EXPECT_EQ(e.Offset(m)[0], 4096);
      }
    }
  }
}

TEST(SpecTest, BlockListShardsEveryBlock) {
  // Flux2-style fused rows [D, D, D, M, M] with D=4, M=6 on 4 ranks: each rank gets one chunk of
  // every block; M=6 is uneven (chunks 2,2,2,0).
  const DTensorSpec s = Spec({4}, "_S(0,[4,4,4,6,6])", {24, 3});
  EXPECT_EQ(Rows(s.Ranges({0})[0]), "0,4,8,12-13,18-19");
  EXPECT_EQ(Rows(s.Ranges({1})[0]), "1,5,9,14-15,20-21");
  EXPECT_EQ(Rows(s.Ranges({3})[0]), "3,7,11");
  EXPECT_EQ(s.LocalShape({3})[0], 3);
  EXPECT_EQ(s.Offset({3})[0], 3);
  // Equal blocks are _S(0, sf).
  const DTensorSpec a = Spec({4}, "_S(0,[6,6])", {12, 1});
  const DTensorSpec b = Spec({4}, "_S(0,2)", {12, 1});
  for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(a.Ranges({r}), b.Ranges({r}));
}

TEST(SpecTest, UnitShardKeepsUnitsWhole) {
  // SmolLM2's q_proj rows: 9 heads of 64 on 2 ranks are 5 + 4 heads (Note [Unit shards]); plain
  // S(0) would cut head 4 in half (288 + 288 rows).
  const DTensorSpec q = Spec({2}, "S(0,unit=64)", {576, 8});
  EXPECT_EQ(Rows(q.Ranges({0})[0]), "0-319");
  EXPECT_EQ(Rows(q.Ranges({1})[0]), "320-575");
  EXPECT_EQ(q.LocalShape({1})[0], 256);
  EXPECT_EQ(q.Offset({1})[0], 320);
  // torch.chunk over units leaves the last ranks empty: 9 units on 4 ranks are 3, 3, 3, 0.
  const DTensorSpec e = Spec({4}, "S(0,unit=2)", {18, 1});
  EXPECT_EQ(Rows(e.Ranges({2})[0]), "12-17");
  EXPECT_EQ(e.LocalShape({3})[0], 0);
  EXPECT_EQ(e.Offset({3})[0], 18);
  // Nested: the units of what the left mesh dim leaves (12 rows: 6 + 6, then 3 units of 2 over 2).
  const DTensorSpec n = Spec({2, 2}, "S(0),S(0,unit=2)", {12, 1});
  EXPECT_EQ(Rows(n.Ranges({0, 0})[0]), "0-3");
  EXPECT_EQ(Rows(n.Ranges({0, 1})[0]), "4-5");
  EXPECT_EQ(Rows(n.Ranges({1, 1})[0]), "10-11");
}

TEST(SpecTest, ValidationErrorsNameTheSpec) {
  auto mesh = Mesh({2, 4}, {"dp", "tp"});
  auto bad = [&](const char* placements, std::vector<int64_t> shape, const char* needle) {
    auto s = DTensorSpec::Create(mesh, ParsePlacements(placements).value(), shape, DType::kF32);
    ASSERT_FALSE(s.ok()) << placements;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string msg(s.status().message());
    EXPECT_NE(msg.find("mesh(dp=2, tp=4)"), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  };
  bad("S(2),R", {4, 4}, "shard dim 2 of S(2) on mesh dim dp is out of range for a tensor of 2 dims");
  bad("S(0)", {4, 4}, "expected 2 placements");
  bad("P(sum),P(max)", {4, 4}, "mixed Partial ops P(sum) (mesh dim dp) and P(max) (mesh dim tp)");
  bad("R,_S(0,[3,3])", {8, 4}, "sum to 6 but the dim they split has size 8");
  bad("S(0),_S(0,[2,2])", {9, 4}, "sum to 4 but the dim they split has size 5");
  bad("R,S(1,unit=3)", {4, 8}, "S(1,unit=3) on mesh dim tp splits a dim of size 8");
  bad("S(0),S(0,unit=2)", {10, 1}, "not a whole number of units of 2");
  // Allowed: sum with avg, negative dims (normalized), block lists that fit.
  auto ok = DTensorSpec::Create(mesh, ParsePlacements("P(sum),P(avg)").value(), {4}, DType::kF32);
  EXPECT_TRUE(ok.ok()) << ok.status();
  auto neg = DTensorSpec::Create(mesh, ParsePlacements("S(-1),R").value(), {4, 6}, DType::kF32);
  ASSERT_TRUE(neg.ok());
  EXPECT_EQ(neg->ToString(), "[S(1), R] on mesh(dp=2, tp=4)");
  EXPECT_EQ(neg->Describe(), "f32[4, 6] [S(1), R] on mesh(dp=2, tp=4)");
  EXPECT_TRUE(DTensorSpec::Create(mesh, ParsePlacements("S(0),_S(0,[2,2])").value(), {8, 1},
                                  DType::kF32).ok());
}

TEST(SpecTest, SelectPositions) {
  const RangeList list = {{0, 4}, {8, 12}};
  EXPECT_EQ(SelectPositions(list, {{2, 6}}), (RangeList{{2, 4}, {8, 10}}));
  EXPECT_EQ(SelectPositions(list, {{0, 1}, {3, 5}, {7, 8}}), (RangeList{{0, 1}, {3, 4}, {8, 9}, {11, 12}}));
  EXPECT_EQ(SelectPositions(list, {}), RangeList{});
}

// Every element of the global tensor is held by exactly one rank of each shard group: counting
// owners over all coordinates gives the number of replicas (product of non-shard mesh dims).
RC_GTEST_PROP(SpecProp, PiecesPartitionTheTensor, ()) {
  const int mesh_ndim = *rc::gen::inRange(1, 4);
  std::vector<int64_t> mesh = *rc::gen::container<std::vector<int64_t>>(
      mesh_ndim, rc::gen::inRange<int64_t>(1, 4));
  const int ndim = *rc::gen::inRange(1, 3);
  std::vector<int64_t> shape = *rc::gen::container<std::vector<int64_t>>(
      ndim, rc::gen::inRange<int64_t>(0, 12));
  Placements ps;
  int64_t replicas = 1;
  for (int i = 0; i < mesh_ndim; ++i) {
    const int kind = *rc::gen::inRange(0, 3);
    const int d = *rc::gen::inRange(0, ndim);
    if (kind == 0) {
      ps.push_back(Placement::Replicate());
      replicas *= mesh[i];
    } else if (kind == 1) {
      ps.push_back(Placement::Shard(d));
    } else {
      ps.push_back(Placement::StridedShard(d, *rc::gen::inRange<int64_t>(1, 4)));
    }
  }
  auto spec = DTensorSpec::Create(Mesh(mesh), ps, shape, DType::kF32);
  RC_ASSERT(spec.ok());
  std::vector<int64_t> owners(Numel(shape), 0);
  const Shape strides = ContiguousStrides(shape);
  for (int64_t rank = 0; rank < spec->mesh().Size(); ++rank) {
    const auto c = Coord(*spec, static_cast<int>(rank));
    const DimRanges ranges = spec->Ranges(c);
    const Shape local = spec->LocalShape(c);
    // Enumerate the Cartesian product of the per-dim index lists.
    std::vector<std::vector<int64_t>> idx(ndim);
    for (int d = 0; d < ndim; ++d) {
      for (const IndexRange& r : ranges[d]) {
        RC_ASSERT(r.start < r.stop);
        for (int64_t i = r.start; i < r.stop; ++i) idx[d].push_back(i);
      }
      RC_ASSERT(static_cast<int64_t>(idx[d].size()) == local[d]);
      RC_ASSERT(std::is_sorted(idx[d].begin(), idx[d].end()));
    }
    std::function<void(int, int64_t)> walk = [&](int d, int64_t flat) {
      if (d == ndim) {
        ++owners[flat];
        return;
      }
      for (int64_t i : idx[d]) walk(d + 1, flat + i * strides[d]);
    };
    walk(0, 0);
  }
  for (int64_t o : owners) RC_ASSERT(o == replicas);
}

}  // namespace
}  // namespace dt
