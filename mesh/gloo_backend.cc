#include "mesh/backends.h"

namespace dt::internal {

absl::StatusOr<std::shared_ptr<World>> MakeGlooWorld(const LaunchInfo& info, const WorldOptions& options) {
  return absl::UnimplementedError("backend gloo: not yet built");
}

}  // namespace dt::internal
