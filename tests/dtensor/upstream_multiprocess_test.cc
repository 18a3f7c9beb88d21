// The upstream cases (upstream_cases.h) as a multi-process program: every rank runs this binary
// under dtrun (DT_BACKEND=gloo or shm) or mpirun (DT_BACKEND=mpi); the cases whose world size matches the
// job run, the others are skipped.
#include "gtest/gtest.h"
#include "dtensor/mesh/world.h"
#include "dtensor/tests/dtensor/upstream_cases.h"
#include "dtensor/tests/test_world.h"

namespace dt::testing {
namespace {

class UpstreamMultiprocess : public ::testing::TestWithParam<UpstreamCase> {};

TEST_P(UpstreamMultiprocess, Passes) {
  const UpstreamCase& c = GetParam();
  std::shared_ptr<World> world = TheWorld().shared_from_this();
  if (world->size() != c.world_size) {
    GTEST_SKIP() << c.name << " needs " << c.world_size << " ranks; this job has " << world->size();
  }
  const absl::Status s = c.run(world);
  EXPECT_TRUE(s.ok()) << "rank " << world->rank() << ": " << s;
}

INSTANTIATE_TEST_SUITE_P(Cases, UpstreamMultiprocess, ::testing::ValuesIn(UpstreamCases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace dt::testing
