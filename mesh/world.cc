#include "dtensor/mesh/world.h"

#include <numeric>
#include <vector>

// World::FromEnv and World::RunThreads make the backends' worlds: they are in backends.cc.

namespace dt {

absl::StatusOr<CommPtr> World::WorldGroup() {
  std::vector<int> all(size());
  std::iota(all.begin(), all.end(), 0);
  return Group(all);
}

}  // namespace dt
