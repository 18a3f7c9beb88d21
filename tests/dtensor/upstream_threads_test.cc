// The upstream cases (upstream_cases.h) on the threads backend: one test per case.
#include <chrono>

#include "gtest/gtest.h"
#include "dtensor/mesh/world.h"
#include "dtensor/tests/dtensor/upstream_cases.h"

namespace dt::testing {
namespace {

class UpstreamThreads : public ::testing::TestWithParam<UpstreamCase> {};

TEST_P(UpstreamThreads, Passes) {
  const UpstreamCase& c = GetParam();
  WorldOptions options;
  options.timeout = std::chrono::seconds(30);
  const absl::Status s = World::RunThreads(
      c.world_size, [&](World& w) { return c.run(w.shared_from_this()); }, options);
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Cases, UpstreamThreads, ::testing::ValuesIn(UpstreamCases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace dt::testing
