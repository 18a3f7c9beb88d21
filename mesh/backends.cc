#include "dtensor/mesh/backends.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <set>

#include <sched.h>
#include <tbb/global_control.h>

#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/env.h"
#include "dtensor/mesh/collective.h"

// The factory of worlds (World::FromEnv, World::RunThreads) beside the backends it makes, and what
// the backends' worlds share (BackendWorld): world.cc stays below them (Note [Include graph]).

namespace dt {
namespace {

// Fills in the backend and the timeout from the environment where the caller left the defaults.
absl::StatusOr<WorldOptions> Resolve(WorldOptions options, const internal::LaunchInfo& info) {
  DT_RETURN_IF_ERROR(env::CheckAll());  // every DT_* variable, also those read later (core/env.h)
  if (options.timeout == WorldOptions{}.timeout) {
    DT_ASSIGN_OR_RETURN(std::optional<int64_t> ms, env::Int("DT_TIMEOUT_MS"));
    if (ms) options.timeout = std::chrono::milliseconds(*ms);
  }
  if (options.timeout.count() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("timeout ", options.timeout.count(), " ms is not positive"));
  }
  if (!options.verify.has_value()) {
    DT_ASSIGN_OR_RETURN(options.verify, env::Flag("DT_VERIFY_COLLECTIVES"));  // unset: the backend's default
  }
  if (options.backend.empty()) {
    DT_ASSIGN_OR_RETURN(std::optional<std::string> b, env::Choice("DT_BACKEND"));
    if (b) options.backend = *b;
  }
  if (options.backend.empty()) {
    if (info.launcher == "openmpi") {
      options.backend = "mpi";
    } else {
      options.backend = info.world_size > 1 ? "shm" : "threads";
    }
  }
  // DT_SHM=0 keeps every group on gloo, whoever asked for shm (an operator's switch).
  DT_ASSIGN_OR_RETURN(std::optional<bool> shm, env::Flag("DT_SHM"));
  if (shm == false && options.backend == "shm") options.backend = "gloo";
  return options;
}

absl::StatusOr<std::shared_ptr<World>> Make(const internal::LaunchInfo& info, const WorldOptions& options);

}  // namespace

namespace {

// Note [One core budget per node]
// Every rank computes with oneTBB, which by default starts a thread per core. With N ranks on a
// node of C cores that is N·C busy threads on C cores: on a 2-core machine three SmolLM2 ranks
// decoded at 0.7x one rank, the ranks preempting each other in the middle of every GEMV while the
// others wait for them at the next all_reduce. Each rank gets C / N threads (at least one) unless
// DT_NUM_THREADS or WorldOptions::num_threads says otherwise; torchrun does the same for OpenMP
// (OMP_NUM_THREADS=1 per rank). The cap is process-wide and lasts as long as the process. An
// explicit count applies to every world, the threads backend's too: a one-rank run with
// DT_NUM_THREADS=1 once computed on every core, so a "1 thread" comparison against llama.cpp
// compared our two threads with its one.
absl::Status ApplyThreadBudget(const internal::LaunchInfo& info, int requested) {
  int threads = requested;
  if (threads == 0) {
    DT_ASSIGN_OR_RETURN(std::optional<int64_t> env_threads, env::Int("DT_NUM_THREADS"));
    if (env_threads) threads = static_cast<int>(*env_threads);
  }
  if (threads == 0) {
    if (info.local_size <= 1) return absl::OkStatus();
    cpu_set_t set;
    int cores = 0;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
    if (cores <= 0) cores = 1;
    threads = std::max(1, cores / info.local_size);
  }
  if (threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_threads must be >= 0, got ", threads));
  }
  static std::unique_ptr<tbb::global_control> cap;
  cap = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                              static_cast<size_t>(threads));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<World>> World::FromEnv(WorldOptions options) {
  DT_ASSIGN_OR_RETURN(internal::LaunchInfo info, internal::ReadLaunchEnv([](const char* n) { return std::getenv(n); }));
  DT_ASSIGN_OR_RETURN(options, Resolve(std::move(options), info));
  const std::string& b = options.backend;
  // One multi-process world per process (it owns the store, the MPI state, the devices): while it
  // is alive, FromEnv returns it again.
  static std::mutex mu;
  static std::weak_ptr<World> current;
  std::lock_guard<std::mutex> lock(mu);
  if (std::shared_ptr<World> w = current.lock()) {
    if (w->backend() != b) {
      return absl::FailedPreconditionError(absl::StrCat("World::FromEnv: a ", w->backend(),
                                                        " world is alive in this process; cannot also start ", b));
    }
    return w;
  }
  DT_RETURN_IF_ERROR(ApplyThreadBudget(info, options.num_threads));
  absl::StatusOr<std::shared_ptr<World>> made = Make(info, options);
  if (made.ok() && b != "threads") current = *made;
  return made;
}

namespace {
absl::StatusOr<std::shared_ptr<World>> Make(const internal::LaunchInfo& info, const WorldOptions& options) {
  const std::string& b = options.backend;
  if (b == "threads") {
    if (info.world_size != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "backend threads runs every rank as a thread of one process (World::RunThreads), but ",
          info.launcher, " started this process as rank ", info.rank, " of ", info.world_size,
          "; choose shm, gloo, mpi or nccl (DT_BACKEND)"));
    }
    return internal::MakeSingleThreadWorld(options);
  }
  if (b == "gloo" || b == "shm") return internal::MakeGlooWorld(info, options);
  if (b == "mpi") return internal::MakeMpiWorld(info, options);
  if (b == "nccl") return internal::MakeNcclWorld(info, options);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend '", b, "': expected threads, shm, gloo, mpi or nccl"));
}
}  // namespace

absl::Status World::RunThreads(int n, const std::function<absl::Status(World&)>& fn, WorldOptions options) {
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("RunThreads: ", n, " ranks; need at least 1"));
  internal::LaunchInfo single;
  options.backend = "threads";
  DT_ASSIGN_OR_RETURN(options, Resolve(std::move(options), single));
  DT_RETURN_IF_ERROR(ApplyThreadBudget(single, options.num_threads));
  return internal::RunThreadsJob(n, fn, options);
}

namespace internal {

absl::Status CheckGroupRanks(absl::Span<const int> ranks, int world_size, int my_rank, absl::string_view backend) {
  if (ranks.empty()) return absl::InvalidArgumentError(absl::StrCat(backend, " group: empty rank list"));
  std::set<int> seen;
  bool member = false;
  for (int r : ranks) {
    if (r < 0 || r >= world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(backend, " group ", RankList(ranks), ": rank ", r, " is outside the world of ", world_size));
    }
    if (!seen.insert(r).second) {
      return absl::InvalidArgumentError(absl::StrCat(backend, " group ", RankList(ranks), ": rank ", r, " appears twice"));
    }
    member |= r == my_rank;
  }
  if (!member) {
    return absl::InvalidArgumentError(
        absl::StrCat(backend, " group ", RankList(ranks), ": this rank (", my_rank, ") is not a member; only members create a group"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CommPtr> BackendWorld::Group(absl::Span<const int> ranks) {
  DT_RETURN_IF_ERROR(CheckGroupRanks(ranks, size(), rank(), backend()));
  std::vector<int> key(ranks.begin(), ranks.end());
  std::lock_guard<std::mutex> lock(mu_);
  auto it = groups_.find(key);
  if (it != groups_.end()) return it->second;
  DT_ASSIGN_OR_RETURN(CommPtr comm, MakeGroup(key));
  groups_.emplace(std::move(key), comm);
  return comm;
}

void BackendWorld::ClearGroups() {
  std::lock_guard<std::mutex> lock(mu_);
  groups_.clear();
}

int BackendWorld::IndexIn(const std::vector<int>& ranks) const {
  return static_cast<int>(std::find(ranks.begin(), ranks.end(), rank()) - ranks.begin());
}

}  // namespace internal
}  // namespace dt
