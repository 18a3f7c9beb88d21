// An outside project using the installed dtensor: a DTensor on a 2-rank mesh, redistributed and
// gathered back. Without a launcher the two ranks are threads; under the installed dtrun they are
// two gloo processes (World::FromEnv).
#include <cstdio>
#include <cstdlib>

#include "dtensor/dtensor/dtensor.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/nn.h"

namespace {

absl::Status Run(dt::World& world) {
  DT_ASSIGN_OR_RETURN(dt::DeviceMesh mesh, dt::InitDeviceMesh(world.shared_from_this(), {2}, {"tp"}));
  DT_ASSIGN_OR_RETURN(dt::Tensor full, dt::Tensor::Arange(0, 12));
  DT_ASSIGN_OR_RETURN(full, full.View({3, 4}));
  DT_ASSIGN_OR_RETURN(dt::Placements s0, dt::ParsePlacements("S(0)"));
  DT_ASSIGN_OR_RETURN(dt::DTensor x, dt::DTensor::Distribute(full, mesh, s0));
  DT_ASSIGN_OR_RETURN(dt::Placements s1, dt::ParsePlacements("S(1)"));
  DT_ASSIGN_OR_RETURN(dt::DTensor y, x.Redistribute(s1));
  DT_ASSIGN_OR_RETURN(dt::Tensor back, y.FullTensor());
  if (!dt::Equal(back, full)) return absl::InternalError("round trip differs");
  if (world.rank() == 0) std::printf("consumer OK: %s\n", y.ToString().c_str());
  return absl::OkStatus();
}

}  // namespace

int main() {
  absl::Status s;
  if (std::getenv("RANK") != nullptr) {
    auto world = dt::World::FromEnv();
    s = world.ok() ? Run(**world) : world.status();
  } else {
    s = dt::World::RunThreads(2, Run);
  }
  if (!s.ok()) {
    std::fprintf(stderr, "consumer: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("styles registered: %zu\n", dt::nn::StyleNames().size());
  return 0;
}
