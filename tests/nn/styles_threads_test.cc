// Every style case (style_cases.h) on 1-4 ranks running as threads.
#include <chrono>
#include <ostream>

#include "gtest/gtest.h"
#include "dtensor/mesh/world.h"
#include "dtensor/tests/nn/style_cases.h"

namespace dt::nn::testing {
namespace {

struct Param {
  StyleCase c;
  int ranks;
};

void PrintTo(const Param& p, std::ostream* os) { *os << p.c.name << " on " << p.ranks << " ranks"; }

class StylesThreads : public ::testing::TestWithParam<Param> {};

TEST_P(StylesThreads, MatchesUnparallelized) {
  WorldOptions options;
  options.timeout = std::chrono::seconds(60);
  const absl::Status s = World::RunThreads(GetParam().ranks, GetParam().c.run, options);
  EXPECT_TRUE(s.ok()) << s;
}

std::vector<Param> AllParams() {
  std::vector<Param> out;
  for (const StyleCase& c : StyleCases()) {
    for (int n = 1; n <= 4; ++n) out.push_back({c, n});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cases, StylesThreads, ::testing::ValuesIn(AllParams()),
                         [](const auto& info) {
                           return info.param.c.name + "_tp" + std::to_string(info.param.ranks);
                         });

}  // namespace
}  // namespace dt::nn::testing
