// The "C++ API in five minutes" example of docs/dtensor.md, compiled and run (keep them in sync).
#include "gtest/gtest.h"

// ---- begin docs/dtensor.md example ----
#include "dtensor/dtensor/dtensor.h"
#include "dtensor/dtensor/executor.h"  // CommCounter
#include "dtensor/mesh/world.h"
#include "dtensor/mesh/comm_counter.h"

absl::Status Tour(dt::World& world) {
  using namespace dt;
  // 8 ranks as a 2x4 mesh: dp (data parallel) x tp (tensor parallel).
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(world.shared_from_this(), {2, 4}, {"dp", "tp"}));

  // A global 13x6 tensor, rows split over dp, replicated over tp. Uneven: 7 + 6 rows.
  DT_ASSIGN_OR_RETURN(Tensor full, Tensor::Rand({13, 6}, /*seed=*/1));
  DT_ASSIGN_OR_RETURN(Placements rows, ParsePlacements("S(0),R"));
  DT_ASSIGN_OR_RETURN(DTensor x, DTensor::Distribute(full, mesh, rows));
  // x.ToLocal() is [7, 6] on dp=0 and [6, 6] on dp=1; the spec says where every piece lives.
  std::printf("rank %d: %s offset %s\n", world.rank(), x.ToLocal().Describe().c_str(),
              ShapeToString(x.spec().Offset()).c_str());

  // Columns over tp as well: one planned, cached redistribution (here: a local slice).
  DT_ASSIGN_OR_RETURN(Placements grid, ParsePlacements("S(0),S(1)"));
  CommCounter counter;  // counts the collectives this thread issues
  DT_ASSIGN_OR_RETURN(DTensor y, x.Redistribute(grid));
  DT_ASSIGN_OR_RETURN(DTensor z, y.Redistribute(ParsePlacements("S(1),S(0)").value()));
  std::printf("rank %d: %s\n", world.rank(), counter.counts().ToString().c_str());
  if (counter.counts().ToString() != "all_gather=1 all_to_all=1") {  // the same on every rank
    return absl::InternalError("unexpected collectives: " + counter.counts().ToString());
  }

  // Partial sums (e.g. a row-parallel matmul's output) reduce with one reduce_scatter.
  DT_ASSIGN_OR_RETURN(DTensor partial, DTensor::Ones({8, 4}, mesh, ParsePlacements("R,P(sum)").value()));
  DT_ASSIGN_OR_RETURN(DTensor summed, std::move(partial).Redistribute(ParsePlacements("R,S(0)").value()));
  if (counter.counts().reduce_scatter != 1) return absl::InternalError("expected one reduce_scatter");
  // Ones with P(sum) over tp: every rank holds a term of 1/4; the sums are ones.
  DT_ASSIGN_OR_RETURN(Tensor sums, summed.FullTensor());
  DT_ASSIGN_OR_RETURN(Tensor ones, Tensor::Ones({8, 4}));
  if (!Equal(sums, ones)) return absl::InternalError("the partial sums are not ones");

  // A fused Flux2-style weight [q|k|v|mlp_in|mlp_gate] sharded block by block; gathering it gives
  // the checkpoint layout back.
  DT_ASSIGN_OR_RETURN(Tensor w, Tensor::Rand({24, 3}, /*seed=*/2));
  DT_ASSIGN_OR_RETURN(DTensor fused,
                      DTensor::Distribute(w, mesh, ParsePlacements("R,_S(0,[4,4,4,6,6])").value()));
  DT_ASSIGN_OR_RETURN(Tensor back, fused.FullTensor());
  if (!Equal(back, w) || !Equal(z.FullTensor().value(), full)) {
    return absl::InternalError("round trip failed");
  }
  return absl::OkStatus();
}

// main(): dt::World::RunThreads(8, Tour) on one machine, or under dtrun/mpirun:
//   auto world = dt::World::FromEnv().value(); return Tour(*world).ok() ? 0 : 1;
// ---- end docs/dtensor.md example ----

TEST(DocsExample, Runs) {
  const absl::Status s = dt::World::RunThreads(8, Tour);
  EXPECT_TRUE(s.ok()) << s;
}
