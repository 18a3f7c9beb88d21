#pragma once
// Shared by the nn tests that plan on abstract meshes.
#include <cstdint>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/plan.h"

namespace dt::nn::testing {

// A 1-D "tp" mesh of n ranks that never communicates, seen from `rank`.
inline DeviceMesh Tp(int64_t n, int rank = 0) { return DeviceMesh::Abstract({n}, {"tp"}, rank).value(); }

// ParallelizeModule's checks off: rules that match nothing and parameters no rule covers pass.
inline ParallelizeOptions Quiet() {
  ParallelizeOptions o;
  o.unused_rules = o.uncovered_params = PlanCheck::kIgnore;
  return o;
}

}  // namespace dt::nn::testing
