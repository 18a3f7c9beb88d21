// Flux2 tensor parallelism with one process per rank: run under dtrun (DT_BACKEND=gloo). Every
// rank loads only its shards (several ranges of each packed weight) and must reproduce diffusers'
// `sample` (tools/reference/make_flux2_fixtures.py); the loader's peak per rank stays under
// (full/tp + replicated) x 1.2. A fixture whose heads the world size does not divide is skipped
// here (its refusal is tested in flux2_test.cc).
#include "dtensor/core/status.h"
#include "dtensor/mesh/comm_counter.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/models/flux2.h"
#include "dtensor/tests/models/flux2_util.h"
#include "dtensor/tests/models/golden_checks.h"
#include "dtensor/tests/test_world.h"
#include "gtest/gtest.h"

namespace dt::nn::testing {
namespace {

class Flux2Multiprocess : public dt::testing::OnTheWorld<const char*> {};

TEST_P(Flux2Multiprocess, MatchesDiffusers) {
  auto config = loaders::LoadFlux2Config(Flux2Fixture(GetParam()));
  ASSERT_TRUE(config.ok()) << config.status();
  if (config->num_attention_heads % world.size() != 0) {
    GTEST_SKIP() << GetParam() << " has " << config->num_attention_heads << " heads";
  }
  auto mesh = InitDeviceMesh(world.shared_from_this(), {world.size()}, {"tp"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  LoadReport report;
  auto model = Flux2Transformer2DModel::FromPretrained(Flux2Fixture(GetParam()), *mesh, {}, &report);
  ASSERT_TRUE(model.ok()) << "rank " << world.rank() << ": " << model.status();
  auto in = FixtureInputs(GetParam());
  ASSERT_TRUE(in.ok()) << in.status();
  auto want = FixtureTensor(GetParam(), "outputs.safetensors", "sample");
  ASSERT_TRUE(want.ok()) << want.status();
  CommCounter counter;
  auto sample = (*model)->Run(*in);
  ASSERT_TRUE(sample.ok()) << sample.status();
  auto err = RelativeError(*sample, *want);
  ASSERT_TRUE(err.ok()) << err.status();
  EXPECT_LE(*err, 1e-4) << "rank " << world.rank();
  EXPECT_EQ(counter.counts().all_reduce, 4 * config->num_layers + config->num_single_layers);
  const absl::Status bound = WithinLoadBound(report, world.size(), world.rank());
  EXPECT_TRUE(bound.ok()) << bound;
  for (const LoadReport::Param& p : report.params) {
    if (p.sharded) {
      EXPECT_LT(p.read_bytes, p.full_bytes) << p.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Flux2Multiprocess, ::testing::Values("flux2-tiny", "flux2-pipe"),
                         FixtureParamName);

}  // namespace
}  // namespace dt::nn::testing
