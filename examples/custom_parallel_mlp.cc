// A new tensor-parallel model through the public nn API: two pre-norm residual MLP blocks, the
// up projections column-sharded and the down projections row-sharded (one all_reduce per block).
// nn::CheckParallel runs it sharded and replicated on the same seeded weights; exits 0 only when
// the outputs agree.
//
//   dtrun --nproc-per-node 4 build/bin/custom_parallel_mlp  (shm; DT_BACKEND picks another; without
//                                                           dtrun: 4 threads)
#include <cstdio>
#include <memory>

#include "check_example.h"  // main(), beside this file
#include "dtensor/mesh/world.h"
#include "dtensor/nn/nn.h"

namespace nn = dt::nn;
namespace ops = dt::ops;

// y = x + down(gelu(up(norm(x))))
class Block : public nn::Module {
 public:
  // The children, kept as the typed references AddModule returns (registered in declaration
  // order): the forward calls them directly, no lookup by name.
  Block(int64_t hidden, int64_t inner)
      : Module("Block"),
        norm_(AddModule<nn::LayerNorm>("norm", hidden)),
        up_(AddModule<nn::Linear>("up", hidden, inner, /*bias=*/true)),
        down_(AddModule<nn::Linear>("down", inner, hidden, /*bias=*/true)) {}

 protected:
  absl::StatusOr<dt::Values> Forward(dt::Values in) override {
    DT_ASSIGN_OR_RETURN(dt::Value h, norm_.CallOne({in[0]}));
    DT_ASSIGN_OR_RETURN(h, up_.CallOne({h}));  // this rank's columns
    DT_ASSIGN_OR_RETURN(h, ops::Gelu(h, dt::ops::GeluApproximation::kTanh));
    DT_ASSIGN_OR_RETURN(h, down_.CallOne({h}));  // all_reduce inside
    DT_ASSIGN_OR_RETURN(dt::Value y, ops::Add(in[0], h));
    return dt::Values{y};
  }

 private:
  nn::LayerNorm& norm_;
  nn::Linear& up_;
  nn::Linear& down_;
};

class Net : public nn::Module {
 public:
  Net() : Module("Net"), blocks_(AddModule<nn::ModuleList>("blocks")) {
    for (int i = 0; i < 2; ++i) blocks_.Append(std::make_unique<Block>(64, 256));
  }
  const nn::ModuleList& blocks() const { return blocks_; }

 protected:
  absl::StatusOr<dt::Values> Forward(dt::Values in) override {
    for (int64_t i = 0; i < blocks_.size(); ++i) {
      DT_ASSIGN_OR_RETURN(in, blocks_.at(i).Call(in));
    }
    return in;
  }

 private:
  nn::ModuleList& blocks_;
};

absl::Status Run(dt::World& world) {
  DT_ASSIGN_OR_RETURN(dt::DeviceMesh tp,
                      dt::InitDeviceMesh(world.shared_from_this(), {world.size()}, {"tp"}));
  const nn::ParallelPlan plan = {{"blocks.*.up", "colwise"},
                                 {"blocks.*.down", "rowwise"},
                                 {"blocks.*.norm", "replicate"}};  // replicated on purpose

  Net model;  // the sharded model, printed
  DT_RETURN_IF_ERROR(nn::ParallelizeModule(model, tp, plan));
  DT_RETURN_IF_ERROR(nn::InitRandom(model, 0));
  DT_ASSIGN_OR_RETURN(dt::Tensor x, dt::Tensor::Randn({4, 16, 64}, 7));
  auto make = [] { return std::make_unique<Net>(); };
  DT_ASSIGN_OR_RETURN(nn::ParallelCheck report, nn::CheckParallel(make, tp, plan, {x}));
  if (world.rank() == 0) {
    std::printf("%s\n", model.blocks().at(0).ToString().c_str());
    std::printf("custom_parallel_mlp: %s\n", report.ToString().c_str());
  }
  return report.status();
}

int main(int argc, char** argv) {
  return dt::examples::Main(
      argc, argv, "custom_parallel_mlp",
      "two tensor-parallel MLP blocks, checked against the same blocks unsharded", Run);
}
