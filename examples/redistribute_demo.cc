// Redistribute tour on 4 ranks: a (2, 2) mesh (dp, tp), one tensor moved through several layouts,
// each step's plan printed by rank 0 and every result checked against the original on every rank.
//
//   build/bin/dtrun --nproc-per-node 4 build/bin/redistribute_demo        (shm: shared memory)
//   DT_BACKEND=mpi mpirun --allow-run-as-root -np 4 build/bin/redistribute_demo
//   build/bin/redistribute_demo --threads 4                               (in one process)
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "dtensor/tools/flags.h"

#include "dtensor/dtensor/dtensor.h"
#include "dtensor/mesh/world.h"

namespace {

absl::Status Tour(dt::World& world) {
  const bool lead = world.rank() == 0;
  auto log = [&](const std::string& s) {
    if (lead) std::printf("%s\n", s.c_str());
  };
  DT_ASSIGN_OR_RETURN(dt::DeviceMesh mesh,
                      dt::InitDeviceMesh(world.shared_from_this(), {2, 2}, {"dp", "tp"}));
  // The same seeded 7x6 tensor on every rank (uneven on purpose: 7 rows over 2 and over 4).
  DT_ASSIGN_OR_RETURN(dt::Tensor full, dt::Tensor::Randn({7, 6}, /*seed=*/42));
  log("redistribute demo: " + std::to_string(world.size()) + " ranks on " +
      std::string(world.backend()) + ", mesh " + mesh.ToString() + ", tensor f32[7, 6]");

  const char* layouts[] = {"S(0),S(1)", "R,S(0)", "S(1),S(0)", "S(0),S(0)", "R,R", "S(0),_S(1,[2,4])", "R,R"};
  DT_ASSIGN_OR_RETURN(dt::Placements first, dt::ParsePlacements(layouts[0]));
  DT_ASSIGN_OR_RETURN(dt::DTensor x, dt::DTensor::Distribute(full, mesh, first));
  std::printf("rank %d coordinate (%lld, %lld) holds %s of %s\n", world.rank(),
              static_cast<long long>((*mesh.Coordinate())[0]), static_cast<long long>((*mesh.Coordinate())[1]),
              dt::ShapeToString(x.ToLocal().shape()).c_str(), x.spec().ToString().c_str());
  for (size_t i = 1; i < sizeof(layouts) / sizeof(layouts[0]); ++i) {
    DT_ASSIGN_OR_RETURN(dt::Placements to, dt::ParsePlacements(layouts[i]));
    DT_ASSIGN_OR_RETURN(auto plan, dt::CachedPlan(x.spec(), to));
    log("  " + plan->ToString());
    DT_ASSIGN_OR_RETURN(x, x.Redistribute(to));
    DT_ASSIGN_OR_RETURN(dt::Tensor back, x.FullTensor());
    if (!dt::Equal(back, full)) {
      return absl::InternalError("rank " + std::to_string(world.rank()) + ": FullTensor differs after " + layouts[i]);
    }
  }
  // Partial: every rank contributes its rank number; P(sum) -> R gives 0+1+2+3 per dp row... per group.
  DT_ASSIGN_OR_RETURN(dt::Tensor ones, dt::Tensor::Full({4, 4}, static_cast<double>(world.rank())));
  DT_ASSIGN_OR_RETURN(dt::Placements partial, dt::ParsePlacements("R,P(sum)"));
  DT_ASSIGN_OR_RETURN(dt::DTensor p, dt::DTensor::FromLocal(ones, mesh, partial));
  DT_ASSIGN_OR_RETURN(dt::Placements rs, dt::ParsePlacements("R,S(0)"));
  DT_ASSIGN_OR_RETURN(auto plan, dt::CachedPlan(p.spec(), rs));
  log("  " + plan->ToString());
  DT_ASSIGN_OR_RETURN(dt::DTensor s, p.Redistribute(rs));
  const double want = world.rank() < 2 ? 0 + 1 : 2 + 3;  // the tp group's ranks summed
  for (double v : s.ToLocal().ToDoubles()) {
    if (v != want) return absl::InternalError("P(sum) -> S(0) gave " + std::to_string(v));
  }
  log("every rank matched the original tensor after every step: OK");
  return absl::OkStatus();
}

}  // namespace

ABSL_FLAG(int, threads, 0, "run the ranks as this many threads of one process (0: the launcher's processes)");

int main(int argc, char** argv) {
  dt::cli::ParseFlags(argc, argv, "usage: redistribute_demo [--threads N]\na redistribution tour on a (2, 2) mesh");
  absl::Status s;
  if (const int threads = absl::GetFlag(FLAGS_threads); threads > 0) {
    s = dt::World::RunThreads(threads, Tour);
  } else {
    auto world = dt::World::FromEnv();
    s = world.ok() ? Tour(**world) : world.status();
  }
  if (!s.ok()) {
    std::fprintf(stderr, "redistribute_demo: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
