#pragma once
// VerifyRedistribute: the end-to-end check behind `dtensor verify` and the property tests.
// Every rank builds the same random global tensor, distributes it to `from`, redistributes to
// `to`, and compares its piece with the direct distribution of the global tensor to `to` (cut
// locally, no communication); then FullTensor() must give the global tensor back.
//
//   comparison                                  when
//   bit for bit                                 no Partial mesh dim of `from` is reduced
//   |got - want| <= tol (f32 1e-5, bf16/f16     a Partial is reduced (sum/avg of floats round)
//   2e-2 relative)                              integer dtypes always compare exactly
//
// Every rank learns the verdict of all ranks (one all_reduce), so every rank returns the same.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dtensor/core/dtype.h"
#include "dtensor/core/shape.h"
#include "dtensor/dtensor/executor.h"
#include "dtensor/dtensor/placement.h"
#include "dtensor/mesh/world.h"
#include "dtensor/mesh/comm_counter.h"

namespace dt {

struct VerifyRequest {
  std::vector<int64_t> mesh;       // mesh shape; its product must equal the world size
  std::vector<std::string> names;  // optional mesh dim names
  Shape shape;
  Placements from, to;
  DType dtype = DType::kF32;
  uint64_t seed = 0;
  PlannerOptions planner;
};

struct VerifyReport {
  bool ok = false;
  std::string plan;                 // RedistributePlan::ToString()
  int plan_collectives = 0;
  CollectiveCounts counts;          // issued by Redistribute on this rank
  std::vector<std::string> errors;  // this rank's mismatches, e.g. "rank 3: at [1, 0]: got ..."
  int failing_ranks = 0;            // over all ranks
};

// "dtensor verify --mesh 2x3 --shape 5,0 --from 'S(0),R' --to 'R,S(1)' --dtype bf16 --seed 7".
std::string VerifyCommand(const VerifyRequest& request, absl::string_view backend = "threads");

// Collective over `world` (every rank calls it). Errors: an illegal request (InvalidArgument, the
// planner's message), a world size that does not match the mesh, communication failures.
absl::StatusOr<VerifyReport> VerifyRedistribute(const std::shared_ptr<World>& world,
                                                const VerifyRequest& request);

// The deterministic global test tensor of `shape` and `dtype` for `seed` (integers in [-50, 50)).
absl::StatusOr<Tensor> VerifyTensor(IntSpan shape, DType dtype, uint64_t seed);

}  // namespace dt
