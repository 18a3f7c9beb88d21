#pragma once
// What the API examples share (custom_gpt2, custom_moe, custom_parallel_mlp, custom_qwen3): their
// command line, main() and, for those that validate a plan at several sizes, the loop over them. Installed beside the
// examples (share/dtensor/examples) and, like them, built on the public library alone.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/mesh/world.h"
#include "dtensor/nn/nn.h"

namespace dt::examples {

// nn::CheckParallel at tp = 1, 2 and 4 (those that divide the world): the world as (dp, tp), every
// dp group checking the same plan on its own tp ranks. Rank 0 prints each report after `name`;
// returns the first report that is not ok.
inline absl::Status CheckAtTpSizes(World& world, const char* name, const nn::ModelFactory& make,
                                   const nn::ParallelPlan& plan, const Values& inputs) {
  for (int64_t tp : {1, 2, 4}) {
    if (world.size() % tp != 0) continue;
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(world.shared_from_this(),
                                                        {world.size() / tp, tp}, {"dp", "tp"}));
    DT_ASSIGN_OR_RETURN(DeviceMesh tp_mesh, mesh["tp"]);
    DT_ASSIGN_OR_RETURN(nn::ParallelCheck report, nn::CheckParallel(make, tp_mesh, plan, inputs));
    if (world.rank() == 0) std::printf("%s: %s\n", name, report.ToString().c_str());
    DT_RETURN_IF_ERROR(report.status());
  }
  return absl::OkStatus();
}

// Token ids [2, 12] (i64) below `vocab`, the same on every rank: the inputs of a language model's
// check.
inline absl::StatusOr<Tensor> SampleIds(int64_t vocab) {
  std::vector<int64_t> tokens(2 * 12);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = (37 * static_cast<int64_t>(i) + 11) % vocab;
  }
  return Tensor::FromVector<int64_t>({2, 12}, tokens);
}

// An example's command line, read as every dtensor program reads its own (tools/flags.h) though
// the examples take no flags (they use nothing but the library, so not its parser): --help or -h
// prints `usage` and the (empty) flag list on stdout, exit 0; any other argument starting with '-',
// or more than `max_positional` arguments, is one line on stderr naming it, exit 2. Returns the
// exit status when the program ends here, nullopt when it runs.
inline std::optional<int> ParseNoFlags(int argc, char** argv, const char* name, const char* usage,
                                       int max_positional) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("%s\n\nflags:\n  (none)\n  --help\n      this text\n", usage);
      return 0;
    }
    if (arg.size() > 1 && arg[0] == '-') {
      std::fprintf(stderr, "%s: unknown flag %s (see %s --help)\n", name, arg.c_str(), name);
      return 2;
    }
    if (i > max_positional) {
      std::fprintf(stderr, "%s: unexpected argument '%s' (see %s --help)\n", name, arg.c_str(), name);
      return 2;
    }
  }
  return std::nullopt;
}

// An example's main(): it takes no arguments (ParseNoFlags; --help prints `about`). Under a
// launcher (dtrun, torchrun, mpirun, srun) the ranks are processes and `run` runs on this one;
// otherwise on 4 threads of this process. Exit 0 only when every rank succeeded.
inline int Main(int argc, char** argv, const char* name, const char* about,
                const std::function<absl::Status(World&)>& run) {
  const std::string usage = std::string("usage: ") + name + "\n" + about + " (under dtrun for several ranks)";
  if (std::optional<int> exit = ParseNoFlags(argc, argv, name, usage.c_str(), 0)) return *exit;
  absl::Status s;
  if (std::getenv("RANK") != nullptr || std::getenv("OMPI_COMM_WORLD_RANK") != nullptr ||
      std::getenv("SLURM_PROCID") != nullptr) {
    absl::StatusOr<std::shared_ptr<World>> world = World::FromEnv();
    s = world.ok() ? run(**world) : world.status();
  } else {
    s = World::RunThreads(4, run);
  }
  if (!s.ok()) std::fprintf(stderr, "%s: %s\n", name, s.ToString().c_str());
  return s.ok() ? 0 : 1;
}

}  // namespace dt::examples
