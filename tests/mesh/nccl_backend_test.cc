// The nccl backend on this machine's GPU (a world of one rank; several GPUs run the multi-process
// program under dtrun, see CMakeLists.txt). Skips cleanly without a CUDA device.

#include "gtest/gtest.h"
#include "dtensor/mesh/world.h"
#include "dtensor/tests/mesh/collective_oracle.h"

namespace dt {
namespace {

TEST(NcclBackend, WithoutAGpuFromEnvIsAnErrorNotACrash) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is present";
  WorldOptions o;
  o.backend = "nccl";
  absl::Status st = World::FromEnv(o).status();
  EXPECT_TRUE(st.code() == absl::StatusCode::kFailedPrecondition || st.code() == absl::StatusCode::kUnimplemented)
      << st;
  // With NCCL in the build, the answer comes from the loaded libdtensor_nccl.so (Note [CUDA module]).
  if (st.code() == absl::StatusCode::kFailedPrecondition) {
    EXPECT_NE(st.message().find("usable CUDA device"), absl::string_view::npos) << st;
  }
}

TEST(NcclBackend, EveryCollectiveOnOneGpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << CudaUnavailableReason();
  WorldOptions o;
  o.backend = "nccl";
  o.timeout = std::chrono::seconds(60);
  absl::StatusOr<std::shared_ptr<World>> w = World::FromEnv(o);
  if (w.status().code() == absl::StatusCode::kUnimplemented) GTEST_SKIP() << w.status();
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE((*w)->device().is_cuda());
  CommPtr comm = (*w)->WorldGroup().value();
  for (const testing::CollectiveCase& c : testing::AllCases(1, 5)) {
    absl::Status st = testing::RunCase(*comm, c, (*w)->device());
    EXPECT_TRUE(st.ok()) << st;
  }
}

}  // namespace
}  // namespace dt
