// Reading rank, world and master from the launcher's environment (see mesh/backends.h).

#include <algorithm>
#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "dtensor/mesh/backends.h"

namespace dt::internal {
namespace {

class Env {
 public:
  explicit Env(const GetEnvFn& getenv_fn) : getenv_(getenv_fn) {}
  bool Has(const char* name) const {
    const char* v = getenv_(name);
    return v != nullptr && *v != '\0';
  }
  std::string Str(const char* name) const { return Has(name) ? getenv_(name) : ""; }
  // The variable as an integer, `fallback` when unset, an error when malformed.
  absl::StatusOr<int> Int(const char* name, int fallback) const {
    if (!Has(name)) return fallback;
    int v = 0;
    if (!absl::SimpleAtoi(getenv_(name), &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable ", name, "='", getenv_(name), "' is not an integer"));
    }
    return v;
  }

 private:
  const GetEnvFn& getenv_;
};

int CeilDiv(int a, int b) { return (a + b - 1) / b; }

// OpenMPI and Slurm: the launcher's name, and the rank, world size and local rank read from the
// variables it names them by.
absl::Status ReadRanks(const Env& env, const char* launcher, const char* rank, const char* size,
                       const char* local_rank, LaunchInfo* info) {
  info->launcher = launcher;
  DT_ASSIGN_OR_RETURN(info->rank, env.Int(rank, 0));
  DT_ASSIGN_OR_RETURN(info->world_size, env.Int(size, 1));
  DT_ASSIGN_OR_RETURN(info->local_rank, env.Int(local_rank, 0));
  return absl::OkStatus();
}

}  // namespace

int SlurmTasksOnNode(absl::string_view tasks_per_node, int node, int fallback) {
  int first = 0;  // index of the first node of the current entry
  for (absl::string_view entry : absl::StrSplit(tasks_per_node, ',')) {
    int count = 0, repeat = 1;
    const size_t paren = entry.find('(');
    if (!absl::SimpleAtoi(entry.substr(0, paren), &count)) return fallback;
    if (paren != absl::string_view::npos) {
      absl::string_view rep = entry.substr(paren + 1);  // "x2)"
      if (!absl::ConsumePrefix(&rep, "x") || !absl::ConsumeSuffix(&rep, ")") || !absl::SimpleAtoi(rep, &repeat) ||
          repeat < 1) {
        return fallback;
      }
    }
    if (node < first + repeat) return node >= first ? count : fallback;
    first += repeat;
  }
  return fallback;
}

std::string FirstSlurmHost(absl::string_view nodelist) {
  std::string out;
  for (size_t i = 0; i < nodelist.size(); ++i) {
    const char ch = nodelist[i];
    if (ch == ',') break;
    if (ch == '[') {  // prefix[03-05,9]: the first number of the range
      for (++i; i < nodelist.size() && nodelist[i] != '-' && nodelist[i] != ',' && nodelist[i] != ']'; ++i) {
        out.push_back(nodelist[i]);
      }
      size_t close = nodelist.find(']', i);
      if (close == absl::string_view::npos) break;
      i = close;
      continue;
    }
    out.push_back(ch);
  }
  return out;
}

absl::StatusOr<LaunchInfo> ReadLaunchEnv(const GetEnvFn& getenv_fn) {
  Env env(getenv_fn);
  LaunchInfo info;
  if (env.Has("RANK") && env.Has("WORLD_SIZE")) {
    info.launcher = "dtrun";
    DT_ASSIGN_OR_RETURN(info.rank, env.Int("RANK", 0));
    DT_ASSIGN_OR_RETURN(info.world_size, env.Int("WORLD_SIZE", 1));
    DT_ASSIGN_OR_RETURN(info.local_rank, env.Int("LOCAL_RANK", info.rank));
    DT_ASSIGN_OR_RETURN(info.local_size, env.Int("LOCAL_WORLD_SIZE", info.world_size));
    DT_ASSIGN_OR_RETURN(info.node_rank, env.Int(env.Has("NODE_RANK") ? "NODE_RANK" : "GROUP_RANK", 0));
    DT_ASSIGN_OR_RETURN(info.num_nodes, env.Int("GROUP_WORLD_SIZE", 0));
    if (info.num_nodes == 0 && info.local_size > 0) info.num_nodes = CeilDiv(info.world_size, info.local_size);
    if (env.Str("TORCHELASTIC_USE_AGENT_STORE") == "True") {
      info.launcher = "torchrun";
      info.agent_store = true;
      info.run_id = env.Str("TORCHELASTIC_RUN_ID");
      DT_ASSIGN_OR_RETURN(info.restart_count, env.Int("TORCHELASTIC_RESTART_COUNT", 0));
    }
  } else if (env.Has("OMPI_COMM_WORLD_RANK")) {
    DT_RETURN_IF_ERROR(ReadRanks(env, "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                 "OMPI_COMM_WORLD_LOCAL_RANK", &info));
    DT_ASSIGN_OR_RETURN(info.local_size, env.Int("OMPI_COMM_WORLD_LOCAL_SIZE", 1));
    if (info.local_size > 0) {
      info.node_rank = (info.rank - info.local_rank) / info.local_size;
      info.num_nodes = CeilDiv(info.world_size, info.local_size);
    }
    if (info.local_size == info.world_size) info.master_addr = "127.0.0.1";
    // Every rank of one mpirun sees the same job id; derive a port from it.
    std::string job = env.Str("OMPI_MCA_ess_base_jobid");
    if (job.empty()) job = env.Str("PMIX_NAMESPACE");
    if (!job.empty()) info.master_port = 20000 + static_cast<int>(std::hash<std::string>()(job) % 20000);
  } else if (env.Has("SLURM_PROCID")) {
    DT_RETURN_IF_ERROR(ReadRanks(env, "slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", &info));
    DT_ASSIGN_OR_RETURN(info.node_rank, env.Int("SLURM_NODEID", 0));
    const std::string per_node = env.Has("SLURM_STEP_TASKS_PER_NODE") ? env.Str("SLURM_STEP_TASKS_PER_NODE")
                                                                      : env.Str("SLURM_TASKS_PER_NODE");
    info.local_size = SlurmTasksOnNode(per_node, info.node_rank, 1);
    DT_ASSIGN_OR_RETURN(info.num_nodes,
                        env.Int(env.Has("SLURM_STEP_NUM_NODES") ? "SLURM_STEP_NUM_NODES" : "SLURM_NNODES", 1));
    std::string nodes = env.Has("SLURM_STEP_NODELIST") ? env.Str("SLURM_STEP_NODELIST") : env.Str("SLURM_JOB_NODELIST");
    info.master_addr = FirstSlurmHost(nodes);
    DT_ASSIGN_OR_RETURN(int job, env.Int("SLURM_JOB_ID", 0));
    info.master_port = 20000 + job % 20000;
  }
  if (env.Has("MASTER_ADDR")) info.master_addr = env.Str("MASTER_ADDR");
  if (env.Has("MASTER_PORT")) {
    DT_ASSIGN_OR_RETURN(info.master_port, env.Int("MASTER_PORT", 0));
  }
  if (env.Has("DT_STORE_FD")) {
    DT_ASSIGN_OR_RETURN(info.store_fd, env.Int("DT_STORE_FD", -1));
  }
  if (info.world_size < 1 || info.rank < 0 || info.rank >= info.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("launcher ", info.launcher, ": rank ", info.rank,
                                                   " is not in a world of size ", info.world_size));
  }
  if (info.local_size < 1 || info.local_rank < 0 || info.local_rank >= info.local_size) {
    return absl::InvalidArgumentError(absl::StrCat("launcher ", info.launcher, ": local rank ", info.local_rank,
                                                   " is not in a node of ", info.local_size, " ranks"));
  }
  if (info.node_rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat("launcher ", info.launcher, ": node rank ", info.node_rank,
                                                   " is negative"));
  }
  info.num_nodes = std::max(info.num_nodes, info.node_rank + 1);
  if (info.master_port < 0 || info.master_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("MASTER_PORT ", info.master_port, " is not a TCP port"));
  }
  return info;
}

}  // namespace dt::internal
