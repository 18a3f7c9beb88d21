// DeviceMesh: coordinates, groups, slicing, flattening and printing (abstract meshes), then the
// communicators along mesh dims on the threads backend, meshes smaller than the world, and the
// invalid meshes that must give InvalidArgument.

#include "mesh/device_mesh.h"

#include <set>

#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"

namespace dt {
namespace {

DeviceMesh Abstract(std::vector<int64_t> shape, std::vector<std::string> names, int rank) {
  return DeviceMesh::Abstract(std::move(shape), std::move(names), rank).value();
}

TEST(DeviceMesh, CoordinatesAndGroupsOfATwoByFourMesh) {
  // The table in mesh/device_mesh.h.
  DeviceMesh m = Abstract({2, 4}, {"dp", "tp"}, 6);
  EXPECT_EQ(m.ToString(), "mesh(dp=2, tp=4)");
  EXPECT_EQ(m.ndim(), 2);
  EXPECT_EQ(m.Size(), 8);
  EXPECT_EQ(m.Size(0), 2);
  EXPECT_EQ(m.Size(1), 4);
  EXPECT_EQ(m.Size(-1), 4);
  EXPECT_EQ(m.Size(5), 0);
  EXPECT_EQ(*m.Coordinate(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(m.GroupRanks(1).value(), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(m.GroupRanks(0).value(), (std::vector<int>{2, 6}));
  EXPECT_EQ(m.LocalRank(1).value(), 2);
  EXPECT_EQ(m.LocalRank(0).value(), 1);
  EXPECT_EQ(m.DimIndex("tp").value(), 1);
  EXPECT_EQ(m.CoordinateOf(3).value(), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(m.CoordinateOf(9).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(m.LocalRank(2).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status unknown = m.DimIndex("pp").status();
  EXPECT_EQ(std::string(unknown.message()), "mesh(dp=2, tp=4) has no dim named 'pp' (dims: dp, tp)");
  // Abstract meshes have no communicators.
  EXPECT_EQ(m.Comm(0).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(DeviceMesh, UnnamedDimsPrintAsIndices) {
  DeviceMesh m = Abstract({3}, {}, 0);
  EXPECT_EQ(m.ToString(), "mesh(d0=3)");
  EXPECT_TRUE(m.names().empty());
}

TEST(DeviceMesh, SlicingByNames) {
  DeviceMesh m = Abstract({2, 2, 2}, {"pp", "dp", "tp"}, 5);  // coordinate (1, 0, 1)
  DeviceMesh tp = m["tp"].value();
  EXPECT_EQ(tp.ToString(), "mesh(tp=2)");
  EXPECT_EQ(tp.ranks(), (std::vector<int>{4, 5}));
  EXPECT_EQ(*tp.Coordinate(), (std::vector<int64_t>{1}));
  const std::string dp_tp[] = {"dp", "tp"};
  DeviceMesh sub = m.Slice(dp_tp).value();
  EXPECT_EQ(sub.ToString(), "mesh(dp=2, tp=2)");
  EXPECT_EQ(sub.ranks(), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(*sub.Coordinate(), (std::vector<int64_t>{0, 1}));
  // Any order: a transposed slice.
  const std::string tp_pp[] = {"tp", "pp"};
  DeviceMesh t = m.Slice(tp_pp).value();
  EXPECT_EQ(t.ranks(), (std::vector<int>{0, 4, 1, 5}));  // dp fixed at 0
  EXPECT_EQ(*t.Coordinate(), (std::vector<int64_t>{1, 1}));
  // Slicing a slice.
  EXPECT_EQ(sub["dp"].value().ranks(), (std::vector<int>{5, 7}));
  // Errors.
  EXPECT_EQ(m["ep"].status().code(), absl::StatusCode::kInvalidArgument);
  const std::string twice[] = {"dp", "dp"};
  EXPECT_EQ(m.Slice(twice).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sub["pp"].status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeviceMesh, FlattenAndSliceByTheFlattenedName) {
  DeviceMesh m = Abstract({2, 2, 2}, {"pp", "dp", "cp"}, 6);  // coordinate (1, 1, 0)
  const std::string dp_cp[] = {"dp", "cp"};
  DeviceMesh flat = m.Slice(dp_cp).value().Flatten({0, 1}).value();
  EXPECT_EQ(flat.ToString(), "mesh(dp_cp=4)");
  EXPECT_EQ(flat.ranks(), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(*flat.Coordinate(), (std::vector<int64_t>{2}));
  // Reachable from the root by name, alone or beside other dims.
  EXPECT_EQ(m["dp_cp"].value(), flat);
  const std::string pp_dpcp[] = {"pp", "dp_cp"};
  DeviceMesh two = m.Slice(pp_dpcp).value();
  EXPECT_EQ(two.ToString(), "mesh(pp=2, dp_cp=4)");
  EXPECT_EQ(two.ranks(), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  // Flatten with an explicit name, and a name clash.
  EXPECT_EQ(m.Flatten({0, 2}, "pc").value().ranks(), (std::vector<int>{2, 3, 6, 7}));  // dp fixed at 1
  EXPECT_EQ(m.Flatten({0, 1}, "dp_cp").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Flatten({0, 1}, "cp").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Flatten({0, 0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Flatten({3}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeviceMesh, RankOutsideTheMeshHasNoCoordinate) {
  DeviceMesh m = Abstract({2, 2}, {"dp", "tp"}, 7);
  EXPECT_FALSE(m.Coordinate().has_value());
  EXPECT_EQ(m.LocalRank(0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.GroupRanks(1).status().code(), absl::StatusCode::kFailedPrecondition);
  DeviceMesh tp = m["tp"].value();  // a slice is fine, and still excludes us
  EXPECT_FALSE(tp.Coordinate().has_value());
}

TEST(DeviceMesh, InvalidMeshesAreRejected) {
  auto code = [](auto s) { return s.status().code(); };
  constexpr auto kBad = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code(DeviceMesh::Abstract({2, 2}, {"dp"})), kBad);          // names of the wrong count
  EXPECT_EQ(code(DeviceMesh::Abstract({2, 2}, {"dp", "dp"})), kBad);    // duplicate names
  EXPECT_EQ(code(DeviceMesh::Abstract({2, 2}, {"dp", ""})), kBad);      // empty name
  EXPECT_EQ(code(DeviceMesh::Abstract({2, 0})), kBad);                  // empty dim
  EXPECT_EQ(code(DeviceMesh::Abstract({})), kBad);                      // no dims
  absl::Status st = World::RunThreads(4, [&](World& w) -> absl::Status {
    std::shared_ptr<World> world = w.shared_from_this();
    EXPECT_EQ(code(DeviceMesh::Create(world, {2, 2}, {0, 1, 2, 2})), kBad);  // duplicate rank
    EXPECT_EQ(code(DeviceMesh::Create(world, {2, 2}, {0, 1, 2})), kBad);     // shape vs rank count
    EXPECT_EQ(code(DeviceMesh::Create(world, {2}, {0, 9})), kBad);           // outside the world
    EXPECT_EQ(code(DeviceMesh::Create(nullptr, {1}, {0})), kBad);
    EXPECT_EQ(code(InitDeviceMesh(world, {2, 4})), kBad);                    // bigger than the world
    absl::Status dup = DeviceMesh::Create(world, {2, 2}, {0, 1, 2, 2}).status();
    EXPECT_EQ(std::string(dup.message()), "DeviceMesh(shape [2, 2], 4 ranks): rank 2 appears twice");
    return absl::OkStatus();
  });
  EXPECT_TRUE(st.ok()) << st;
}

TEST(DeviceMesh, CommunicatorsAlongDimsOnThreads) {
  // mesh(dp=2, tp=4) on 8 threads: all_reduce along tp sums 4 ranks, along dp 2; the flattened
  // mesh spans all 8; Comm is cached per dim and shared by copies.
  absl::Status st = World::RunThreads(8, [](World& w) -> absl::Status {
    std::shared_ptr<World> world = w.shared_from_this();
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(world, {2, 4}, {"dp", "tp"}));
    DT_ASSIGN_OR_RETURN(CommPtr tp, mesh.Comm(1));
    DeviceMesh copy = mesh;
    DT_ASSIGN_OR_RETURN(CommPtr tp_again, copy.Comm(1));
    EXPECT_EQ(tp.get(), tp_again.get());
    EXPECT_EQ(tp->global_ranks(), mesh.GroupRanks(1).value());
    EXPECT_EQ(tp->rank(), mesh.LocalRank(1).value());
    Tensor x = Tensor::Full({3}, w.rank()).value();
    DT_RETURN_IF_ERROR(tp->AllReduce(x, ReduceOp::kSum));
    const float row = w.rank() < 4 ? 0 + 1 + 2 + 3 : 4 + 5 + 6 + 7;
    EXPECT_EQ(x.ToVector<float>(), std::vector<float>(3, row));
    DT_ASSIGN_OR_RETURN(CommPtr dp, mesh["dp"].value().Comm(0));
    Tensor y = Tensor::Full({2}, w.rank()).value();
    DT_RETURN_IF_ERROR(dp->AllReduce(y, ReduceOp::kMax));
    EXPECT_EQ(y.ToVector<float>(), std::vector<float>(2, w.rank() % 4 + 4));
    DT_ASSIGN_OR_RETURN(DeviceMesh flat, mesh.Flatten({0, 1}));
    DT_ASSIGN_OR_RETURN(CommPtr all, flat.Comm(0));
    EXPECT_EQ(all->size(), 8);
    const int both[] = {0, 1};
    DT_ASSIGN_OR_RETURN(CommPtr all2, mesh.Comm(absl::Span<const int>(both)));
    EXPECT_EQ(all.get(), all2.get());  // the world caches groups by rank list
    Tensor z = Tensor::Ones({1}).value();
    DT_RETURN_IF_ERROR(all->AllReduce(z, ReduceOp::kSum));
    EXPECT_EQ(z.Item(), 8);
    return absl::OkStatus();
  });
  EXPECT_TRUE(st.ok()) << st;
}

TEST(DeviceMesh, MeshSmallerThanTheWorld) {
  // mesh(tp=2) over ranks {1, 3} of a world of 4: ranks 0 and 2 do nothing.
  absl::Status st = World::RunThreads(4, [](World& w) -> absl::Status {
    std::shared_ptr<World> world = w.shared_from_this();
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, DeviceMesh::Create(world, {2}, {1, 3}, {"tp"}));
    if (w.rank() % 2 == 0) {
      EXPECT_FALSE(mesh.Coordinate().has_value());
      EXPECT_EQ(mesh.Comm(0).status().code(), absl::StatusCode::kFailedPrecondition);
      return absl::OkStatus();
    }
    DT_ASSIGN_OR_RETURN(CommPtr tp, mesh.Comm(0));
    Tensor x = Tensor::Full({2}, w.rank()).value();
    DT_RETURN_IF_ERROR(tp->AllReduce(x, ReduceOp::kSum));
    EXPECT_EQ(x.ToVector<float>(), std::vector<float>(2, 4.0f));
    DT_ASSIGN_OR_RETURN(DeviceMesh init, InitDeviceMesh(world, {3}));  // ranks 0..2 of 4
    EXPECT_EQ(init.Coordinate().has_value(), w.rank() < 3);
    return absl::OkStatus();
  });
  EXPECT_TRUE(st.ok()) << st;
}

// Every rank appears in exactly one group along each dim, and the groups along a dim partition the
// mesh; slicing all names gives the mesh back.
RC_GTEST_PROP(DeviceMeshProperties, GroupsPartitionTheMesh, ()) {
  const int ndim = *rc::gen::inRange(1, 4);
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  int64_t total = 1;
  for (int d = 0; d < ndim; ++d) {
    shape.push_back(*rc::gen::inRange<int64_t>(1, 4));
    names.push_back(std::string(1, static_cast<char>('a' + d)));
    total *= shape.back();
  }
  for (int d = 0; d < ndim; ++d) {
    std::set<std::vector<int>> groups;
    for (int r = 0; r < total; ++r) {
      DeviceMesh m = DeviceMesh::Abstract(shape, names, r).value();
      std::vector<int> g = m.GroupRanks(d).value();
      RC_ASSERT(static_cast<int64_t>(g.size()) == shape[d]);
      RC_ASSERT(g[m.LocalRank(d).value()] == r);
      RC_ASSERT(m.CoordinateOf(r).value() == *m.Coordinate());
      groups.insert(g);
      RC_ASSERT(m.Slice(names).value() == m);
      DeviceMesh sliced = m[names[d]].value();
      RC_ASSERT(sliced.ranks() == g);
    }
    RC_ASSERT(static_cast<int64_t>(groups.size()) * shape[d] == total);
  }
}

}  // namespace
}  // namespace dt
