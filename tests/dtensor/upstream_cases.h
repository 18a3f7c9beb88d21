#pragma once
// The 36 upstream PyTorch redistribute cases (../shared/reference/pytorch-dtensor.md §3), ported
// as functions that run on every rank of a world of the stated size: values against independent
// expectations and collective counts. Shared by the threads test (upstream_threads_test.cc) and the
// multi-process program (upstream_multiprocess_test.cc) that runs under dtrun/gloo and mpirun.
//
// Where upstream asserts a collective count, we assert that count or fewer; where our planner does
// better (PyTorch falls back to all_gather for S(i) -> S(j) on CPU, or all-reduces where two
// reduce_scatters would do), the case says what we issue.

#include <functional>
#include <ostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dtensor/mesh/world.h"

namespace dt::testing {

struct UpstreamCase {
  std::string name;  // "Case01_ShardToReplicate"
  int world_size;
  std::function<absl::Status(const std::shared_ptr<World>&)> run;
};

const std::vector<UpstreamCase>& UpstreamCases();

// gtest prints parameters with this.
inline void PrintTo(const UpstreamCase& c, std::ostream* os) { *os << c.name; }

}  // namespace dt::testing
