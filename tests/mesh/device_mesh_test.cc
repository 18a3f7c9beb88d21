// DeviceMesh: coordinates, groups, slicing, flattening and printing (abstract meshes), then the
// communicators along mesh dims on the threads backend, meshes smaller than the world, and the
// invalid meshes that must give InvalidArgument.

#include "dtensor/mesh/device_mesh.h"

#include <functional>
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

// A threads rank that claims the launcher layout of a multi-node job: node and local rank are
// functions of the global rank; everything else is the threads world's.
class NodeView final : public World {
 public:
  using Layout = std::function<int(int rank)>;
  NodeView(World& inner, Layout node_of, Layout local_of, int nodes)
      : inner_(inner.shared_from_this()), node_of_(std::move(node_of)), local_of_(std::move(local_of)), nodes_(nodes) {
    options_ = inner.options();
  }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  int local_rank() const override { return local_of_(rank()); }
  int local_size() const override {
    int n = 0;
    for (int r = 0; r < size(); ++r) n += node_of_(r) == node_rank();
    return n;
  }
  int node_rank() const override { return node_of_(rank()); }
  int num_nodes() const override { return nodes_; }
  absl::string_view backend() const override { return inner_->backend(); }
  Device device() const override { return inner_->device(); }
  absl::StatusOr<CommPtr> Group(absl::Span<const int> ranks) override { return inner_->Group(ranks); }

 private:
  std::shared_ptr<World> inner_;
  Layout node_of_, local_of_;
  int nodes_;
};

// The ranks of `mesh` as rows (one per index of dim 0).
std::vector<std::vector<int>> Rows(const DeviceMesh& mesh) {
  std::vector<std::vector<int>> rows(mesh.Size(0));
  for (size_t i = 0; i < mesh.ranks().size(); ++i) rows[i / mesh.Size(1)].push_back(mesh.ranks()[i]);
  return rows;
}

TEST(DeviceMesh, NodeLocalMeshOfBlocks) {
  // 2 nodes x 3 ranks, in blocks (dtrun, srun --distribution block): all_reduce along "local"
  // sums the ranks of one node, along "node" the same local rank of every node.
  absl::Status st = World::RunThreads(6, [](World& w) -> absl::Status {
    auto view = std::make_shared<NodeView>(w, [](int r) { return r / 3; }, [](int r) { return r % 3; }, 2);
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitNodeLocalMesh(view));
    EXPECT_EQ(mesh.ToString(), "mesh(node=2, local=3)");
    EXPECT_EQ(Rows(mesh), (std::vector<std::vector<int>>{{0, 1, 2}, {3, 4, 5}}));
    EXPECT_EQ(*mesh.Coordinate(), (std::vector<int64_t>{w.rank() / 3, w.rank() % 3}));
    DT_ASSIGN_OR_RETURN(CommPtr local, mesh.Comm(1));
    Tensor x = Tensor::Full({2}, w.rank()).value();
    DT_RETURN_IF_ERROR(local->AllReduce(x, ReduceOp::kSum));
    EXPECT_EQ(x.ToVector<float>(), std::vector<float>(2, w.rank() < 3 ? 0 + 1 + 2 : 3 + 4 + 5));
    DT_ASSIGN_OR_RETURN(CommPtr node, mesh.Comm(0));
    Tensor y = Tensor::Full({1}, w.rank()).value();
    DT_RETURN_IF_ERROR(node->AllReduce(y, ReduceOp::kSum));
    EXPECT_EQ(y.Item(), 2 * (w.rank() % 3) + 3);  // r % 3 + (r % 3 + 3)
    return absl::OkStatus();
  });
  EXPECT_TRUE(st.ok()) << st;
}

TEST(DeviceMesh, NodeLocalMeshFollowsOtherLayouts) {
  // Round robin over 2 nodes (mpirun --map-by node): node = rank % 2, local = rank / 2.
  absl::Status st = World::RunThreads(4, [](World& w) -> absl::Status {
    auto view = std::make_shared<NodeView>(w, [](int r) { return r % 2; }, [](int r) { return r / 2; }, 2);
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitNodeLocalMesh(view, {"host", "gpu"}));
    EXPECT_EQ(mesh.ToString(), "mesh(host=2, gpu=2)");
    EXPECT_EQ(Rows(mesh), (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
    EXPECT_EQ(mesh.GroupRanks(1).value(), (w.rank() % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}));
    return absl::OkStatus();
  });
  EXPECT_TRUE(st.ok()) << st;
  // The threads backend is one node.
  st = World::RunThreads(3, [](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitNodeLocalMesh(w.shared_from_this()));
    EXPECT_EQ(mesh.ToString(), "mesh(node=1, local=3)");
    EXPECT_EQ(mesh.ranks(), (std::vector<int>{0, 1, 2}));
    return absl::OkStatus();
  });
  EXPECT_TRUE(st.ok()) << st;
}

TEST(DeviceMesh, NodeLocalMeshErrorsAreTheSameOnEveryRank) {
  // Nodes of 3 and 1 ranks; two ranks claiming one position; a wrong number of names. Every rank
  // gets InvalidArgument (none is left waiting in a collective).
  struct Case {
    std::function<int(int)> node, local;
    std::vector<std::string> names;
    std::string message;
  };
  const std::vector<Case> cases{
      {[](int r) { return r < 3 ? 0 : 1; }, [](int r) { return r < 3 ? r : 0; }, {"node", "local"},
       "InitNodeLocalMesh(world of 4, names [node, local]): the nodes have different numbers of ranks: node 0 has 3 "
       "([0, 1, 2]), node 1 has 1 ([3]); a (node, local) mesh needs the same number on every node"},
      {[](int r) { return r / 2; }, [](int r) { return r == 1 ? 0 : r % 2; }, {"node", "local"},
       "InitNodeLocalMesh(world of 4, names [node, local]): global ranks 0 and 1 both say node 0, local rank 0"},
      {[](int r) { return r / 2; }, [](int r) { return r % 2; }, {"local"},
       "InitNodeLocalMesh(world of 4, names [local]): needs 2 dim names, got 1"},
  };
  for (const Case& c : cases) {
    absl::Status st = World::RunThreads(4, [&](World& w) -> absl::Status {
      auto view = std::make_shared<NodeView>(w, c.node, c.local, 2);
      absl::Status got = InitNodeLocalMesh(view, c.names).status();
      EXPECT_EQ(got.code(), absl::StatusCode::kInvalidArgument) << got;
      EXPECT_EQ(std::string(got.message()), c.message);
      return absl::OkStatus();
    });
    EXPECT_TRUE(st.ok()) << st;
  }
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
