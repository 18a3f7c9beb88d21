// Reading rank/world/master from dtrun/torchrun, OpenMPI and Slurm variables.

#include <map>

#include "gtest/gtest.h"
#include "mesh/backends.h"

namespace dt::internal {
namespace {

absl::StatusOr<LaunchInfo> Read(const std::map<std::string, std::string>& env) {
  return ReadLaunchEnv([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(LaunchEnv, NoLauncherIsOneRank) {
  LaunchInfo info = Read({}).value();
  EXPECT_EQ(info.launcher, "none");
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
}

TEST(LaunchEnv, DtrunAndTorchrun) {
  LaunchInfo info = Read({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                          {"NODE_RANK", "1"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}})
                         .value();
  EXPECT_EQ(info.launcher, "dtrun");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_size, 4);
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_EQ(info.master_addr, "10.0.0.1");
  EXPECT_EQ(info.master_port, 29500);
  // torchrun names the node GROUP_RANK.
  EXPECT_EQ(Read({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"GROUP_RANK", "3"}}).value().node_rank, 3);
}

TEST(LaunchEnv, OpenMpi) {
  LaunchInfo info = Read({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                          {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                          {"OMPI_MCA_ess_base_jobid", "1234"}})
                        .value();
  EXPECT_EQ(info.launcher, "openmpi");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.master_addr, "127.0.0.1");  // one node
  EXPECT_GE(info.master_port, 20000);
  EXPECT_LT(info.master_port, 40000);
  // Same job, same port on every rank.
  LaunchInfo other = Read({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                           {"OMPI_MCA_ess_base_jobid", "1234"}})
                         .value();
  EXPECT_EQ(other.master_port, info.master_port);
}

TEST(LaunchEnv, Slurm) {
  LaunchInfo info = Read({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"},
                          {"SLURM_TASKS_PER_NODE", "4(x2)"}, {"SLURM_NODEID", "1"},
                          {"SLURM_JOB_NODELIST", "gpu[07-08]"}, {"SLURM_JOB_ID", "4242"}})
                         .value();
  EXPECT_EQ(info.launcher, "slurm");
  EXPECT_EQ(info.rank, 6);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 2);
  EXPECT_EQ(info.local_size, 4);
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_EQ(info.master_addr, "gpu07");
  EXPECT_EQ(info.master_port, 24242);
  EXPECT_EQ(FirstSlurmHost("a,b"), "a");
  EXPECT_EQ(FirstSlurmHost("node[3,5-9]"), "node3");
  EXPECT_EQ(FirstSlurmHost("rack1-n[001-004],x"), "rack1-n001");
}

TEST(LaunchEnv, BadValuesAreErrors) {
  EXPECT_EQ(Read({{"RANK", "x"}, {"WORLD_SIZE", "2"}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Read({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Read({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status st = Read({{"RANK", "abc"}, {"WORLD_SIZE", "2"}}).status();
  EXPECT_EQ(std::string(st.message()), "environment variable RANK='abc' is not an integer");
}

TEST(World, FromEnvWithoutALauncherIsOneThreadRank) {
  auto world = World::FromEnv().value();
  EXPECT_EQ(world->rank(), 0);
  EXPECT_EQ(world->size(), 1);
  EXPECT_EQ(world->backend(), "threads");
  CommPtr c = world->WorldGroup().value();
  Tensor x = Tensor::Full({4}, 3.0).value();
  EXPECT_TRUE(c->AllReduce(x, ReduceOp::kAvg).ok());
  EXPECT_EQ(x.ToVector<float>(), std::vector<float>(4, 3.0f));
  WorldOptions bad;
  bad.backend = "carrier-pigeon";
  EXPECT_EQ(World::FromEnv(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dt::internal
