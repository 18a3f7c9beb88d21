// The collectives of a multi-process backend against the oracle. Every rank runs this program
// (under dtrun with DT_BACKEND=gloo, or under mpirun with DT_BACKEND=mpi) and every rank runs the
// same tests in the same order, so the collectives line up.

#include <chrono>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/world.h"
#include "dtensor/tests/mesh/collective_oracle.h"

namespace dt {
namespace {

using testing::AllCases;
using testing::CollectiveCase;
using testing::RunCase;
using Kind = internal::CollectiveKind;

// The world, or a skip (nccl without enough GPUs or without NCCL), or a failure.
absl::StatusOr<std::shared_ptr<World>> TheWorld() {
  static absl::StatusOr<std::shared_ptr<World>> world = [] {
    WorldOptions o;
    o.timeout = std::chrono::seconds(60);
    return World::FromEnv(o);
  }();
  return world;
}

// Only a missing GPU backend skips: DT_BACKEND=nccl on a machine without GPUs or built without
// NCCL. Any other failure to join (gloo or mpi misconfigured, MPI without MPI_THREAD_MULTIPLE, a
// launcher/MPI rank mismatch) is a test failure, not a skip.
inline bool BackendAbsent(const absl::Status& s) {
  const char* backend = std::getenv("DT_BACKEND");
  return backend != nullptr && std::string(backend) == "nccl" &&
         (s.code() == absl::StatusCode::kFailedPrecondition ||
          s.code() == absl::StatusCode::kUnimplemented);
}

#define DT_WORLD_OR_SKIP(w)                                                   \
  absl::StatusOr<std::shared_ptr<World>> w##_or = TheWorld();                 \
  if (!w##_or.ok() && BackendAbsent(w##_or.status())) GTEST_SKIP() << w##_or.status(); \
  ASSERT_TRUE(w##_or.ok()) << w##_or.status();                                \
  std::shared_ptr<World> w = *w##_or

TEST(MultiProcess, WorldMatchesTheLauncher) {
  DT_WORLD_OR_SKIP(w);
  const char* backend = std::getenv("DT_BACKEND");
  if (backend != nullptr) {
    EXPECT_EQ(w->backend(), backend);
  }
  EXPECT_GE(w->size(), 1);
  EXPECT_LT(w->rank(), w->size());
  EXPECT_LT(w->local_rank(), w->local_size());
  // Nodes as the launcher sees them: dtrun's variables; mpirun (the mpi backend asks MPI) on one
  // machine here.
  if (const char* node = std::getenv("NODE_RANK")) {
    EXPECT_EQ(w->node_rank(), std::atoi(node));
  }
  if (const char* nodes = std::getenv("GROUP_WORLD_SIZE")) {
    EXPECT_EQ(w->num_nodes(), std::atoi(nodes));
  }
  const char* ompi_local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (ompi_local != nullptr && std::atoi(ompi_local) == w->size()) {
    EXPECT_EQ(w->node_rank(), 0);
    EXPECT_EQ(w->num_nodes(), 1);
  }
  absl::StatusOr<DeviceMesh> mesh = InitNodeLocalMesh(w);  // collective: every rank
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->shape(), (std::vector<int64_t>{w->num_nodes(), w->local_size()}));
  EXPECT_EQ(*mesh->Coordinate(), (std::vector<int64_t>{w->node_rank(), w->local_rank()}));
}

TEST(MultiProcess, EveryCollectiveMatchesTheOracle) {
  DT_WORLD_OR_SKIP(w);
  CommPtr comm = w->WorldGroup().value();
  EXPECT_EQ(comm->backend(), w->backend());
  for (const CollectiveCase& c : AllCases(w->size(), 11)) {
    absl::Status st = RunCase(*comm, c, w->device());
    EXPECT_TRUE(st.ok()) << st;
  }
}

TEST(MultiProcess, LargeBuffers) {
  DT_WORLD_OR_SKIP(w);
  CommPtr comm = w->WorldGroup().value();
  for (Kind kind : {Kind::kAllReduce, Kind::kAllGather, Kind::kReduceScatter, Kind::kReduceScatterV, Kind::kAllToAll,
                    Kind::kAllGatherV, Kind::kAllToAllV, Kind::kAllToAllViews}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      absl::Status st = RunCase(*comm, {kind, dt, ReduceOp::kSum, (1 << 18) + 3, 5}, w->device());
      EXPECT_TRUE(st.ok()) << st;
    }
  }
}

TEST(MultiProcess, AllToAllViewsThroughTheStagedPath) {
  // The default all_to_all_views (pack, all_to_all_v, unpack; nccl's) on this backend too.
  DT_WORLD_OR_SKIP(w);
  CommPtr comm = w->WorldGroup().value();
  auto* backend = comm.get();
  ASSERT_NE(backend, nullptr);
  backend->set_stage_views(true);
  for (const CollectiveCase& c : AllCases(w->size(), 17)) {
    if (c.kind != Kind::kAllToAllViews) continue;
    absl::Status st = RunCase(*comm, c, w->device());
    EXPECT_TRUE(st.ok()) << st;
  }
  absl::Status large = RunCase(*comm, {Kind::kAllToAllViews, DType::kBF16, ReduceOp::kSum, (1 << 18) + 3, 5}, w->device());
  EXPECT_TRUE(large.ok()) << large;
  backend->set_stage_views(false);
}

TEST(MultiProcess, SubgroupsAndMeshDims) {
  DT_WORLD_OR_SKIP(w);
  const int n = w->size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  // Even and odd ranks in separate groups at once.
  std::vector<int> mine;
  for (int r = w->rank() % 2; r < n; r += 2) mine.push_back(r);
  CommPtr sub = w->Group(mine).value();
  EXPECT_EQ(sub->size(), static_cast<int>(mine.size()));
  for (const CollectiveCase& c : {CollectiveCase{Kind::kAllReduce, DType::kF32, ReduceOp::kMax, 100, 3},
                                  CollectiveCase{Kind::kReduceScatterV, DType::kI32, ReduceOp::kSum, 10, 4},
                                  CollectiveCase{Kind::kAllGatherV, DType::kF16, ReduceOp::kSum, 10, 4}}) {
    absl::Status st = RunCase(*sub, c, w->device());
    EXPECT_TRUE(st.ok()) << st;
  }
  if (n % 2 != 0) return;
  DeviceMesh mesh = InitDeviceMesh(w, {2, n / 2}, {"dp", "tp"}).value();
  Tensor x = Tensor::Full({5}, w->rank(), DType::kF32, w->device()).value();
  ASSERT_TRUE(mesh.Comm(1).value()->AllReduce(x, ReduceOp::kSum).ok());
  float row = 0;
  const std::vector<int> tp_ranks = mesh.GroupRanks(1).value();
  for (int r : tp_ranks) row += r;
  EXPECT_EQ(x.ToVector<float>(), std::vector<float>(5, row));
  DeviceMesh flat = mesh.Flatten({0, 1}).value();
  Tensor y = Tensor::Ones({3}, DType::kF32, w->device()).value();
  ASSERT_TRUE(flat.Comm(0).value()->AllReduce(y, ReduceOp::kSum).ok());
  EXPECT_EQ(y.ToVector<float>(), std::vector<float>(3, n));
}

TEST(MultiProcess, AsyncCollectivesOverlap) {
  DT_WORLD_OR_SKIP(w);
  CommPtr comm = w->WorldGroup().value();
  std::vector<Tensor> xs;
  std::vector<WorkPtr> works;
  for (int i = 0; i < 8; ++i) {
    xs.push_back(Tensor::Full({1000}, i + w->rank(), DType::kF32, w->device()).value());
    works.push_back(comm->AllReduceAsync(xs.back(), ReduceOp::kSum));
  }
  const int n = w->size();
  for (int i = 7; i >= 0; --i) {  // waiting out of order is fine
    ASSERT_TRUE(works[i]->Wait().ok());
    EXPECT_EQ(xs[i].ToVector<float>()[0], n * i + n * (n - 1) / 2);
  }
}

}  // namespace
}  // namespace dt
