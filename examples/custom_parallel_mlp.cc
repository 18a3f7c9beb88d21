// A new tensor-parallel model through the public nn API: two pre-norm residual MLP blocks, the
// up projections column-sharded and the down projections row-sharded (one all_reduce per block).
// Exits 0 only when the tensor-parallel output equals the unparallelized one.
//
//   dtrun --nproc-per-node 4 build/bin/custom_parallel_mlp      (shm; DT_BACKEND picks another)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "dtensor/mesh/world.h"
#include "dtensor/nn/nn.h"

using namespace dt;      // NOLINT: example brevity
using namespace dt::nn;  // NOLINT

// y = x + down(gelu(up(norm(x))))
class Block : public Module {
 public:
  Block(int64_t hidden, int64_t inner) : Module("Block") {
    AddModule<LayerNorm>("norm", hidden);
    AddModule<Linear>("up", hidden, inner, /*bias=*/true);
    AddModule<Linear>("down", inner, hidden, /*bias=*/true);
  }

 protected:
  absl::StatusOr<Values> Forward(Values in) override {
    DT_ASSIGN_OR_RETURN(Value h, FindChild("norm")->CallOne({in[0]}));
    DT_ASSIGN_OR_RETURN(h, FindChild("up")->CallOne({h}));  // this rank's columns
    DT_ASSIGN_OR_RETURN(h, vops::Gelu(h, ops::GeluApproximation::kTanh));
    DT_ASSIGN_OR_RETURN(h, FindChild("down")->CallOne({h}));  // all_reduce inside
    DT_ASSIGN_OR_RETURN(Value y, vops::Add(in[0], h));
    return Values{y};
  }
};

class Net : public Module {
 public:
  Net() : Module("Net") {
    auto& blocks = AddModule<ModuleList>("blocks");
    for (int i = 0; i < 2; ++i) blocks.Append(std::make_unique<Block>(64, 256));
  }

 protected:
  absl::StatusOr<Values> Forward(Values in) override {
    for (const auto& [name, block] : FindChild("blocks")->children()) {
      DT_ASSIGN_OR_RETURN(in, block->Call(in));
    }
    return in;
  }
};

absl::Status Run() {
  DT_ASSIGN_OR_RETURN(std::shared_ptr<World> world, World::FromEnv());
  DT_ASSIGN_OR_RETURN(DeviceMesh tp, InitDeviceMesh(world, {world->size()}, {"tp"}));

  Net model, reference;
  ParallelizeOptions options;
  options.warn = false;  // the norms stay replicated on purpose
  DT_RETURN_IF_ERROR(ParallelizeModule(
      model, tp, {{"blocks.*.up", "colwise"}, {"blocks.*.down", "rowwise"}}, options));
  DT_RETURN_IF_ERROR(ReplicateModule(reference, tp));  // every rank runs it whole
  DT_RETURN_IF_ERROR(InitRandom(model, 42));           // same global weights in both
  DT_RETURN_IF_ERROR(InitRandom(reference, 42));

  DT_ASSIGN_OR_RETURN(Tensor x, Tensor::Randn({4, 16, 64}, 7));
  DT_ASSIGN_OR_RETURN(Value y, model.CallOne({x}));
  DT_ASSIGN_OR_RETURN(Value want, reference.CallOne({x}));

  const std::vector<float> a = y.local().ToVector<float>(), b = want.local().ToVector<float>();
  float max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) max_diff = std::max(max_diff, std::fabs(a[i] - b[i]));
  DT_RETURN_IF_ERROR(AllClose(y.local(), want.local(), 1e-5, 1e-5));
  if (world->rank() == 0) {
    std::printf("%s\n", model.GetSubmodule("blocks.0").value()->ToString().c_str());
    std::printf(
        "custom_parallel_mlp: tp=%d, output %s equals the unparallelized forward "
        "(max |diff| %.2e)\n",
        world->size(), ShapeToString(y.shape()).c_str(), max_diff);
  }
  return absl::OkStatus();
}

int main() {
  const absl::Status s = Run();
  if (!s.ok()) std::fprintf(stderr, "custom_parallel_mlp: %s\n", s.ToString().c_str());
  return s.ok() ? 0 : 1;
}
