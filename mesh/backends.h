#pragma once
// Internal to mesh/: how World::FromEnv and World::RunThreads reach the backends, and the launcher
// environment they read.
//
//   launcher          rank / world / local rank / local size / node / nodes  master (gloo, nccl store)
//   dtrun, torchrun   RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE NODE_RANK (or GROUP_RANK)
//                     GROUP_WORLD_SIZE (else WORLD_SIZE / LOCAL_WORLD_SIZE, rounded up)
//                                                    MASTER_ADDR MASTER_PORT
//   OpenMPI mpirun    OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}; node = the rank's block
//                     (rank - local rank) / local size, nodes = size / local size rounded up
//                     (OMPI_COMM_WORLD_NODE_RANK is a per-node index, not the node's; the mpi
//                     backend asks MPI instead)
//                                                    MASTER_*; else 127.0.0.1 on one node and a port
//                                                    derived from the job id
//   Slurm srun        SLURM_PROCID SLURM_NTASKS SLURM_LOCALID, this node's entry of
//                     SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE), SLURM_NODEID,
//                     SLURM_STEP_NUM_NODES (or SLURM_NNODES)
//                                                    MASTER_*; else the first host of
//                                                    SLURM_JOB_NODELIST and a port from SLURM_JOB_ID
//   none              a world of one rank
// The first launcher whose rank variable is set wins, in this order. num_nodes is at least
// node_rank + 1.

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dtensor/core/cuda_module.h"
#include "dtensor/mesh/world.h"

namespace dt::internal {

struct LaunchInfo {
  std::string launcher = "none";  // "dtrun", "torchrun", "openmpi", "slurm", "none"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 1;
  int node_rank = 0;
  int num_nodes = 1;
  std::string master_addr;  // empty when the launcher gives none
  int master_port = 0;      // 0 when unknown
  // DT_STORE_FD: rank 0 under dtrun gets the store's listening socket, already bound to
  // MASTER_PORT (Note [dtrun holds the store's port] in tools/dtrun.cc); -1 otherwise.
  int store_fd = -1;
  // torchrun (TORCHELASTIC_USE_AGENT_STORE=True): MASTER_ADDR:MASTER_PORT is the agent's c10d
  // store, which we join instead of serving (Note [Joining torchrun's store], mesh/agent_store.h).
  bool agent_store = false;
  std::string run_id;     // TORCHELASTIC_RUN_ID
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT
};

using GetEnvFn = std::function<const char*(const char*)>;
absl::StatusOr<LaunchInfo> ReadLaunchEnv(const GetEnvFn& getenv_fn);
// The first host of a Slurm node list: "node[03-05,9]" -> "node03", "a,b" -> "a".
std::string FirstSlurmHost(absl::string_view nodelist);
// The task count of node `node` in a Slurm tasks-per-node list: ("4(x2),3", 2) -> 3; `fallback`
// when the list is malformed or shorter.
int SlurmTasksOnNode(absl::string_view tasks_per_node, int node, int fallback);

// InvalidArgument unless `ranks` is a non-empty list of distinct ranks of [0, world_size) that
// contains `my_rank`.
absl::Status CheckGroupRanks(absl::Span<const int> ranks, int world_size, int my_rank,
                             absl::string_view backend);

// What every backend's World shares: the ranks as the launcher gave them, and Group(), which checks
// the ranks and returns the communicator made earlier for the same member list, or has MakeGroup()
// make it under the lock (so a group is made once, in the order the callers asked; a failure
// caches nothing). ClearGroups() drops them, for destructors that must do so before the world's
// transport goes away.
class BackendWorld : public World {
 public:
  BackendWorld(const LaunchInfo& info, const WorldOptions& options) : info_(info) { options_ = options; }
  int rank() const final { return info_.rank; }
  int size() const final { return info_.world_size; }
  int local_rank() const final { return info_.local_rank; }
  int local_size() const final { return info_.local_size; }
  int node_rank() const final { return info_.node_rank; }
  int num_nodes() const final { return info_.num_nodes; }
  absl::StatusOr<CommPtr> Group(absl::Span<const int> ranks) final;

 protected:
  // A communicator over `ranks` (checked, this rank among them), called under the groups' lock.
  virtual absl::StatusOr<CommPtr> MakeGroup(const std::vector<int>& ranks) = 0;
  void ClearGroups();
  // This rank's index in `ranks`.
  int IndexIn(const std::vector<int>& ranks) const;

  const LaunchInfo info_;

 private:
  std::mutex mu_;
  std::map<std::vector<int>, CommPtr> groups_;
};

// Backends. Each returns a World whose options() hold the resolved backend and timeout.
absl::Status RunThreadsJob(int n, const std::function<absl::Status(World&)>& fn,
                           const WorldOptions& options);
std::shared_ptr<World> MakeSingleThreadWorld(const WorldOptions& options);
// gloo and shm (options.backend): shm is the gloo world whose groups within one host run on shared
// memory (Note [Shm groups] in gloo_backend.cc).
absl::StatusOr<std::shared_ptr<World>> MakeGlooWorld(const LaunchInfo& info, const WorldOptions& options);
absl::StatusOr<std::shared_ptr<World>> MakeMpiWorld(const LaunchInfo& info, const WorldOptions& options);
// nccl: the libdtensor_nccl.so module's (mesh/nccl_module.cc loads it; Unimplemented in a build
// without NCCL, FailedPrecondition when the module cannot be loaded).
absl::StatusOr<std::shared_ptr<World>> MakeNcclWorld(const LaunchInfo& info, const WorldOptions& options);
// The table libdtensor_nccl.so hands over (mesh/nccl_backend.cc; Note [CUDA module] in
// core/cuda_module.h).
struct NcclModule {
  ModuleHeader header;
  absl::StatusOr<std::shared_ptr<World>> (*make_world)(const LaunchInfo& info, const WorldOptions& options);
};

class TcpStore;
// The shared-memory communicator over `ranks` (all on this host; this process is member `me`),
// made through `store` under the group's key `gid`: the first member creates the segment
// (/dev/shm/<ShmNamePrefix(job)><gid>.<k>), the others map it, and the name is unlinked once
// everyone has it. `p2p` (gloo, same members) carries send/recv. FailedPrecondition, the same on
// every member, when shared memory cannot be used (the caller then uses `p2p` for everything);
// other errors when the store fails. `what` prefixes errors.
absl::StatusOr<CommPtr> MakeShmGroup(TcpStore& store, const std::string& gid, const std::vector<int>& ranks, int me,
                                     std::chrono::milliseconds timeout, CommPtr p2p, absl::string_view what);
// "dtshm.<job_id>.": the start of every segment name of a job (dtrun removes what is left).
std::string ShmNamePrefix(absl::string_view job_id);

}  // namespace dt::internal
