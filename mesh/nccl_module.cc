// The nccl backend as the program sees it: libdtensor_nccl.so, loaded by the first nccl world
// (Note [CUDA module] in core/cuda_module.h).

#include "dtensor/core/cuda_module.h"
#include "dtensor/mesh/backends.h"
#include "dtensor/mesh/collective.h"
#include "dtensor/mesh/communicator.h"
#include "dtensor/mesh/tcp_store.h"

namespace dt::internal {

// The dt_mesh objects libdtensor_nccl.so calls into besides this one's caller, backends.cc
// (communicator, collective, tcp_store), one function of each, so that a program that makes
// worlds links them (as kCudaModuleCallees in core/cuda_module.cc; core's are referenced there).
extern const void* const kNcclModuleCallees[];
const void* const kNcclModuleCallees[] = {reinterpret_cast<const void*>(&Work::Done),
                                          reinterpret_cast<const void*>(&Offsets),
                                          reinterpret_cast<const void*>(&StartRendezvous)};

absl::StatusOr<std::shared_ptr<World>> MakeNcclWorld(const LaunchInfo& info, const WorldOptions& options) {
  static constexpr ModuleSpec kNcclModule = {
      "dtensor_nccl", "dtensor_nccl_module_v1",
      "this build has no NCCL (configure with -DDT_CUDA=ON on a machine with CUDA and NCCL)",
      absl::StatusCode::kUnimplemented};
  absl::StatusOr<const ModuleHeader*> loaded = LoadModule(kNcclModule);
  if (!loaded.ok()) return InContext(loaded.status(), "backend nccl");
  return reinterpret_cast<const NcclModule*>(*loaded)->make_world(info, options);
}

}  // namespace dt::internal
