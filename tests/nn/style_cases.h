#pragma once
// Forward-equivalence cases for every tensor-parallel style: a module with random weights is
// parallelized on the world's ranks (a 1-D "tp" mesh over all of them) and its forward output is
// compared with the same module unparallelized (every parameter replicated, the forward run on
// whole tensors) within 1e-5 (f32). Each case also checks that every parameter gathers back to the
// bytes it was loaded from (packed weights included). Shared by the threads test (1-4 ranks as
// threads) and the multi-process test (1-4 processes under dtrun, gloo).

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dtensor/mesh/world.h"

namespace dt::nn::testing {

struct StyleCase {
  std::string name;
  std::function<absl::Status(World& world)> run;  // called on every rank
};

std::vector<StyleCase> StyleCases();

inline void PrintTo(const StyleCase& c, std::ostream* os) { *os << c.name; }

}  // namespace dt::nn::testing
