#pragma once
// The process's World for tests launched by dtrun or mpirun (World::FromEnv, made on first use and
// kept for the whole test binary; a failure to join aborts), and a test fixture that holds it.
#include <memory>

#include "dtensor/core/status.h"
#include "dtensor/mesh/world.h"
#include "gtest/gtest.h"

namespace dt::testing {

inline World& TheWorld() {
  static std::shared_ptr<World> world = [] {
    auto w = World::FromEnv();
    DT_CHECK_OK(w);
    return *w;
  }();
  return *world;
}

// A parameterized test on this process's world (one process per rank): `world` in the body.
template <typename Param>
class OnTheWorld : public ::testing::TestWithParam<Param> {
 protected:
  World& world = TheWorld();
};

}  // namespace dt::testing
