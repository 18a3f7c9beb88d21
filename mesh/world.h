#pragma once
// World: this process's membership in a distributed job — its global rank, the world size, the
// backend, and a factory for communicators over subsets of the ranks.
//
//   auto world = World::FromEnv().value();           // dtrun/torchrun, mpirun or srun variables
//   CommPtr tp = world->Group({0, 1, 2, 3}).value();  // collective over the members only
//
// Groups are created lazily and cached by their rank list; Group() must be called by every member
// of the list (and only by them) in the same order, like torch.distributed.new_group.
// The threads backend runs N ranks as threads of one process: World::RunThreads(N, fn); inside fn,
// `world.shared_from_this()` gives the shared_ptr that DeviceMesh wants:
//
//   World::RunThreads(8, [](World& w) -> absl::Status {
//     DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {2, 4}, {"dp", "tp"}));
//     ...
//   });
//
// Backends (WorldOptions::backend or $DT_BACKEND): threads, shm, gloo, mpi, nccl — see docs/mesh.md.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dtensor/core/device.h"
#include "dtensor/mesh/communicator.h"

namespace dt {

struct WorldOptions {
  // "threads", "shm", "gloo", "mpi", "nccl". Empty: $DT_BACKEND; else mpi under mpirun, shm under
  // any other launcher (gloo's world; groups within one host on shared memory, the others on gloo),
  // threads (one rank) without a launcher. $DT_SHM=0 turns shm into gloo.
  std::string backend;
  // Every collective and group creation; $DT_TIMEOUT_MS replaces the default (not an explicit value).
  std::chrono::milliseconds timeout{300'000};
  // Before every collective, all-gather what each member passed (kind, dtype, op, root, sizes: a
  // few dozen bytes) and fail every member with InvalidArgument when they disagree — instead of
  // gloo aborting the process, MPI hanging or NCCL reading garbage. Empty: $DT_VERIFY_COLLECTIVES
  // (0 or 1), else the backend's default: on for mpi (about a microsecond), off for gloo and nccl
  // (one more round trip per collective: milliseconds for gloo on a loaded machine; turn it on
  // while developing). The threads backend always checks, at no cost.
  std::optional<bool> verify;
  // Compute threads (oneTBB) of this process. 0: $DT_NUM_THREADS, else the cores this process may
  // use divided by the ranks the launcher started on this node (at least 1), as torchrun caps
  // OMP_NUM_THREADS — Note [One core budget per node]. The division applies to multi-process worlds
  // only; an explicit count to every world.
  int num_threads = 0;
};

class World : public std::enable_shared_from_this<World> {
 public:
  virtual ~World() = default;
  // Reads rank/world/master from dtrun/torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
  // MASTER_PORT), OpenMPI (OMPI_COMM_WORLD_*) or Slurm (SLURM_PROCID, SLURM_NTASKS, ...).
  // Without any launcher: a world of one rank (threads backend unless one is asked for).
  // A process has one gloo/mpi/nccl world: while it is alive FromEnv returns it again (its options
  // are those of the first call). Errors: a malformed variable, an unknown backend, a launcher
  // that disagrees with MPI, a missing GPU (nccl), an unreachable store (gloo, nccl).
  static absl::StatusOr<std::shared_ptr<World>> FromEnv(WorldOptions options = {});
  // Runs fn(world) on `n` threads, one rank each, on the threads backend; returns the first error
  // any rank returned (the others are unblocked with an error instead of hanging).
  static absl::Status RunThreads(int n, const std::function<absl::Status(World&)>& fn,
                                 WorldOptions options = {});

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;   // rank on this node
  virtual int local_size() const = 0;   // ranks on this node
  // This node's index in [0, num_nodes()) and the number of nodes (machines) of the job, as the
  // launcher sees them: dtrun/torchrun NODE_RANK (GROUP_RANK) and GROUP_WORLD_SIZE, Slurm
  // SLURM_NODEID and SLURM_NNODES; under OpenMPI the mpi backend asks MPI (which processes share
  // memory), gloo/nccl derive them from the local rank and size (ranks in blocks per node). The
  // threads backend is one node. See InitNodeLocalMesh (mesh/device_mesh.h).
  virtual int node_rank() const = 0;
  virtual int num_nodes() const = 0;
  virtual absl::string_view backend() const = 0;
  virtual Device device() const = 0;    // cpu, or cuda:local_rank for nccl
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  const WorldOptions& options() const { return options_; }

  // The communicator over `ranks` (global ranks, in group order); cached.
  virtual absl::StatusOr<CommPtr> Group(absl::Span<const int> ranks) = 0;
  absl::StatusOr<CommPtr> WorldGroup();

 protected:
  WorldOptions options_;
};

}  // namespace dt
