#include "mesh/backends.h"

namespace dt::internal {

absl::StatusOr<std::shared_ptr<World>> MakeMpiWorld(const LaunchInfo& info, const WorldOptions& options) {
  return absl::UnimplementedError("backend mpi: not yet built");
}

}  // namespace dt::internal
