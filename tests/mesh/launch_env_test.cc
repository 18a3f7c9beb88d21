// Reading rank/world/master from dtrun/torchrun, OpenMPI and Slurm variables.

#include <map>

#include "gtest/gtest.h"
#include "dtensor/mesh/agent_store.h"
#include "dtensor/mesh/backends.h"

namespace dt::internal {
namespace {

absl::StatusOr<LaunchInfo> Read(const std::map<std::string, std::string>& env) {
  return ReadLaunchEnv([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

// What mpirun sets for rank `rank` of `size`, `local_size` of them per node, plus `more`.
absl::StatusOr<LaunchInfo> ReadOpenMpi(int rank, int size, int local_rank, int local_size,
                                       std::map<std::string, std::string> more) {
  more["OMPI_COMM_WORLD_RANK"] = std::to_string(rank);
  more["OMPI_COMM_WORLD_SIZE"] = std::to_string(size);
  more["OMPI_COMM_WORLD_LOCAL_RANK"] = std::to_string(local_rank);
  more["OMPI_COMM_WORLD_LOCAL_SIZE"] = std::to_string(local_size);
  return Read(more);
}

// Where a launcher placed this rank: every field but the launcher-specific ones at the end.
void ExpectPlacement(const LaunchInfo& got, const LaunchInfo& want) {
  EXPECT_EQ(got.launcher, want.launcher);
  EXPECT_EQ(got.rank, want.rank);
  EXPECT_EQ(got.world_size, want.world_size);
  EXPECT_EQ(got.local_rank, want.local_rank);
  EXPECT_EQ(got.local_size, want.local_size);
  EXPECT_EQ(got.node_rank, want.node_rank);
  EXPECT_EQ(got.num_nodes, want.num_nodes);
  EXPECT_EQ(got.master_addr, want.master_addr);
  EXPECT_EQ(got.master_port, want.master_port);
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
  // num_nodes: WORLD_SIZE / LOCAL_WORLD_SIZE.
  ExpectPlacement(info, {.launcher = "dtrun", .rank = 5, .world_size = 8, .local_rank = 1, .local_size = 4,
                         .node_rank = 1, .num_nodes = 2, .master_addr = "10.0.0.1", .master_port = 29500});
  // torchrun names the node GROUP_RANK and the number of nodes GROUP_WORLD_SIZE (dtrun sets both).
  LaunchInfo torchrun = Read({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"GROUP_RANK", "3"}}).value();
  EXPECT_EQ(torchrun.node_rank, 3);
  EXPECT_EQ(torchrun.num_nodes, 4);  // never below node_rank + 1
  LaunchInfo three = Read({{"RANK", "5"}, {"WORLD_SIZE", "7"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "3"},
                           {"NODE_RANK", "1"}, {"GROUP_WORLD_SIZE", "3"}})
                         .value();
  EXPECT_EQ(three.num_nodes, 3);
  EXPECT_EQ(Read({{"RANK", "0"}, {"WORLD_SIZE", "5"}, {"LOCAL_WORLD_SIZE", "2"}}).value().num_nodes, 3);
  EXPECT_EQ(Read({{"RANK", "0"}, {"WORLD_SIZE", "2"}}).value().num_nodes, 1);
}

TEST(LaunchEnv, TorchrunWithItsAgentStore) {
  // What torchrun 2.15 sets (tests/models: models_llama_generate_torchrun_np2 runs the real one).
  LaunchInfo info = Read({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                          {"GROUP_RANK", "0"}, {"GROUP_WORLD_SIZE", "1"}, {"MASTER_ADDR", "localhost"},
                          {"MASTER_PORT", "44943"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                          {"TORCHELASTIC_RUN_ID", "1bf8b31d"}, {"TORCHELASTIC_RESTART_COUNT", "2"}})
                         .value();
  EXPECT_EQ(info.launcher, "torchrun");
  EXPECT_TRUE(info.agent_store);
  EXPECT_EQ(info.master_addr, "localhost");
  EXPECT_EQ(info.master_port, 44943);
  EXPECT_EQ(AgentStoreKey(info), "/dtensor/1bf8b31d/2/store");
  // Without the agent store (torchrun --no-agent-store style launches, dtrun) we serve our own.
  EXPECT_FALSE(Read({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "False"}})
                   .value()
                   .agent_store);
  EXPECT_FALSE(Read({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_RESTART_COUNT", "x"},
                     {"TORCHELASTIC_USE_AGENT_STORE", "True"}})
                   .ok());
}

TEST(LaunchEnv, OpenMpi) {
  LaunchInfo info = ReadOpenMpi(2, 4, 2, 4, {{"OMPI_MCA_ess_base_jobid", "1234"}}).value();
  EXPECT_EQ(info.launcher, "openmpi");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.master_addr, "127.0.0.1");  // one node
  EXPECT_GE(info.master_port, 20000);
  EXPECT_LT(info.master_port, 40000);
  // Same job, same port on every rank.
  LaunchInfo other = ReadOpenMpi(0, 4, 0, 4, {{"OMPI_MCA_ess_base_jobid", "1234"}}).value();
  EXPECT_EQ(other.master_port, info.master_port);
  EXPECT_EQ(info.node_rank, 0);
  EXPECT_EQ(info.num_nodes, 1);
  // Two nodes of 4: the node is the rank's block. OMPI_COMM_WORLD_NODE_RANK is a per-node process
  // index (here 1), not the node's.
  LaunchInfo second = ReadOpenMpi(5, 8, 1, 4, {{"OMPI_COMM_WORLD_NODE_RANK", "1"}}).value();
  EXPECT_EQ(second.node_rank, 1);
  EXPECT_EQ(second.num_nodes, 2);
}

TEST(LaunchEnv, Slurm) {
  LaunchInfo info = Read({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"},
                          {"SLURM_TASKS_PER_NODE", "4(x2)"}, {"SLURM_NODEID", "1"},
                          {"SLURM_JOB_NODELIST", "gpu[07-08]"}, {"SLURM_JOB_ID", "4242"}})
                         .value();
  // num_nodes: at least node_rank + 1 without SLURM_NNODES.
  ExpectPlacement(info, {.launcher = "slurm", .rank = 6, .world_size = 8, .local_rank = 2, .local_size = 4,
                         .node_rank = 1, .num_nodes = 2, .master_addr = "gpu07", .master_port = 24242});
  // This node's own task count; the step's variables win over the job's.
  LaunchInfo last = Read({{"SLURM_PROCID", "8"}, {"SLURM_NTASKS", "11"}, {"SLURM_LOCALID", "0"},
                          {"SLURM_TASKS_PER_NODE", "4(x2),3"}, {"SLURM_NODEID", "2"}, {"SLURM_NNODES", "3"}})
                         .value();
  EXPECT_EQ(last.local_size, 3);
  EXPECT_EQ(last.num_nodes, 3);
  LaunchInfo step = Read({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"},
                          {"SLURM_TASKS_PER_NODE", "8(x4)"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                          {"SLURM_NODEID", "0"}, {"SLURM_NNODES", "4"}, {"SLURM_STEP_NUM_NODES", "2"}})
                         .value();
  EXPECT_EQ(step.local_size, 2);
  EXPECT_EQ(step.num_nodes, 2);
  EXPECT_EQ(SlurmTasksOnNode("4(x2),3", 0, -1), 4);
  EXPECT_EQ(SlurmTasksOnNode("4(x2),3", 1, -1), 4);
  EXPECT_EQ(SlurmTasksOnNode("4(x2),3", 2, -1), 3);
  EXPECT_EQ(SlurmTasksOnNode("4(x2),3", 3, -1), -1);
  EXPECT_EQ(SlurmTasksOnNode("2,5(x3)", 3, -1), 5);
  EXPECT_EQ(SlurmTasksOnNode("4(2)", 0, -1), -1);
  EXPECT_EQ(SlurmTasksOnNode("", 0, -1), -1);
  EXPECT_EQ(FirstSlurmHost("a,b"), "a");
  EXPECT_EQ(FirstSlurmHost("node[3,5-9]"), "node3");
  EXPECT_EQ(FirstSlurmHost("rack1-n[001-004],x"), "rack1-n001");
}

TEST(LaunchEnv, BadValuesAreErrors) {
  EXPECT_EQ(Read({{"RANK", "x"}, {"WORLD_SIZE", "2"}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Read({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Read({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Read({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"NODE_RANK", "-1"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status st = Read({{"RANK", "abc"}, {"WORLD_SIZE", "2"}}).status();
  EXPECT_EQ(std::string(st.message()), "environment variable RANK='abc' is not an integer");
}

TEST(World, FromEnvWithoutALauncherIsOneThreadRank) {
  auto world = World::FromEnv().value();
  EXPECT_EQ(world->rank(), 0);
  EXPECT_EQ(world->size(), 1);
  EXPECT_EQ(world->backend(), "threads");
  EXPECT_EQ(world->node_rank(), 0);
  EXPECT_EQ(world->num_nodes(), 1);
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
