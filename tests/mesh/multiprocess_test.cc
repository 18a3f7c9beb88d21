// The collectives of a multi-process backend against the oracle. Every rank runs this program
// (under dtrun with DT_BACKEND=shm or gloo, or under mpirun with DT_BACKEND=mpi) and every rank runs
// the same tests in the same order, so the collectives line up. With shm, groups within a host are
// shared-memory communicators and groups across hosts gloo ones (tests/multinode runs this program
// on simulated hosts); the last test checks that no segment name is left in /dev/shm.

#include <dirent.h>
#include <sched.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/world.h"
#include "dtensor/tests/mesh/collective_oracle.h"

// In the oracle's namespace: AllCases, CollectiveCase and RunCase unqualified.
namespace dt::testing {
namespace {

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

// The backend of a group: the world's, except that an shm world's groups across hosts are gloo.
std::string GroupBackend(const World& w, bool crosses_hosts) {
  return w.backend() == "shm" && crosses_hosts ? "gloo" : std::string(w.backend());
}

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

// Note [One core budget per node]: each rank computes with cores / ranks-on-this-node threads (at
// least one), or DT_NUM_THREADS when set.
TEST(MultiProcess, RanksShareTheNodesCores) {
  DT_WORLD_OR_SKIP(w);
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  size_t want = w->local_size() > 1 ? std::max(1, CPU_COUNT(&set) / w->local_size())
                                    : tbb::global_control::active_value(
                                          tbb::global_control::max_allowed_parallelism);
  if (const char* env = std::getenv("DT_NUM_THREADS")) want = std::atoi(env);
  EXPECT_EQ(tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism), want)
      << w->local_size() << " ranks on this node, " << CPU_COUNT(&set) << " cores";
}

TEST(MultiProcess, NodeLocalMeshMixesBackends) {
  // shm: the `local` dim (one host) on shared memory, the `node` dim (across hosts) on gloo; both
  // give the oracle's results.
  DT_WORLD_OR_SKIP(w);
  DeviceMesh mesh = InitNodeLocalMesh(w).value();
  CommPtr node = mesh.Comm(0).value(), local = mesh.Comm(1).value();
  EXPECT_EQ(local->backend(), GroupBackend(*w, false));
  EXPECT_EQ(node->backend(), GroupBackend(*w, node->size() > 1));
  for (const CollectiveCase& c : {CollectiveCase{Kind::kAllReduce, DType::kF32, ReduceOp::kSum, 1000, 3},
                                  CollectiveCase{Kind::kAllGatherV, DType::kBF16, ReduceOp::kSum, 300, 4},
                                  CollectiveCase{Kind::kReduceScatterV, DType::kI64, ReduceOp::kMax, 40, 5},
                                  CollectiveCase{Kind::kAllToAllV, DType::kU8, ReduceOp::kSum, 9, 6},
                                  CollectiveCase{Kind::kSend, DType::kF16, ReduceOp::kSum, 17, 7}}) {
    for (CommPtr comm : {local, node}) {
      absl::Status st = RunCase(*comm, c, w->device());
      EXPECT_TRUE(st.ok()) << comm->Describe() << ": " << st;
    }
  }
}

TEST(MultiProcess, EveryCollectiveMatchesTheOracle) {
  DT_WORLD_OR_SKIP(w);
  CommPtr comm = w->WorldGroup().value();
  EXPECT_EQ(comm->backend(), GroupBackend(*w, w->num_nodes() > 1));
  for (const CollectiveCase& c : AllCases(w->size(), 11)) {
    absl::Status st = RunCase(*comm, c, w->device());
    EXPECT_TRUE(st.ok()) << st;
  }
}

TEST(MultiProcess, LargeBuffers) {
  DT_WORLD_OR_SKIP(w);
  CommPtr comm = w->WorldGroup().value();
  for (Kind kind : {Kind::kAllReduce, Kind::kAllGather, Kind::kReduceScatter, Kind::kReduceScatterV, Kind::kAllToAll,
                    Kind::kAllGatherV, Kind::kAllToAllV, Kind::kAllToAllViews, Kind::kBroadcast}) {
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

// Last (gtest runs tests in file order): every group made above has unlinked its segment's name
// (the memory lives on, unnamed, while mapped). dtrun's DT_JOB_ID names this job's segments.
TEST(MultiProcess, ZzNoSharedMemoryNameLeft) {
  DT_WORLD_OR_SKIP(w);
  const char* job = std::getenv("DT_JOB_ID");
  if (job == nullptr || w->backend() != "shm") GTEST_SKIP() << "not an shm job under dtrun";
  const std::string prefix = std::string("dtshm.") + job + ".";
  ASSERT_TRUE(w->WorldGroup().value()->Barrier().ok());  // every rank is done creating groups
  DIR* dir = ::opendir("/dev/shm");
  ASSERT_NE(dir, nullptr);
  std::vector<std::string> left;
  while (const dirent* e = ::readdir(dir)) {
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) left.push_back(e->d_name);
  }
  ::closedir(dir);
  EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << left.front();
}

}  // namespace
}  // namespace dt::testing
