// Every style case (style_cases.h) with one process per rank: run under dtrun (DT_BACKEND=gloo or shm),
// the tp mesh spans the job's ranks.
#include "dtensor/core/status.h"
#include "gtest/gtest.h"
#include "dtensor/mesh/world.h"
#include "dtensor/tests/nn/style_cases.h"
#include "dtensor/tests/test_world.h"

namespace dt::nn::testing {
namespace {

using dt::testing::TheWorld;

class StylesMultiprocess : public ::testing::TestWithParam<StyleCase> {};

TEST_P(StylesMultiprocess, MatchesUnparallelized) {
  World& world = TheWorld();
  const absl::Status s = GetParam().run(world);
  EXPECT_TRUE(s.ok()) << "rank " << world.rank() << " of " << world.size() << ": " << s;
}

INSTANTIATE_TEST_SUITE_P(Cases, StylesMultiprocess, ::testing::ValuesIn(StyleCases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace dt::nn::testing
