#pragma once
// The process's World for tests launched by dtrun or mpirun (World::FromEnv, made on first use and
// kept for the whole test binary; a failure to join aborts).
#include <memory>

#include "dtensor/core/status.h"
#include "dtensor/mesh/world.h"

namespace dt::testing {

inline World& TheWorld() {
  static std::shared_ptr<World> world = [] {
    auto w = World::FromEnv();
    DT_CHECK_OK(w);
    return *w;
  }();
  return *world;
}

}  // namespace dt::testing
