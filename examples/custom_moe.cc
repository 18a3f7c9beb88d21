// A mixture-of-experts model written against the public nn API, with LongCat-Flash's "zero
// experts": the router picks among E real experts and Z identity experts (a token routed there
// passes through unchanged, weighted), so easy tokens spend less compute. Its plan splits every
// real expert (moe_tp_experts: one all_reduce per block) and gives the identity experts
// moe_identity_expert, so that their x is added once after the reduction rather than T times. The
// plan is validated with nn::CheckParallel at tp = 1, 2 and 4: the sharded model against the
// replicated one on the same seeded weights. Exits 0 only when they agree.
//
//   dtrun --nproc-per-node 4 build/bin/custom_moe     (processes; without dtrun: 4 threads)
#include <memory>

#include "check_example.h"  // main() and the loop over tp sizes, beside this file
#include "dtensor/mesh/world.h"
#include "dtensor/nn/nn.h"

namespace nn = dt::nn;
namespace ops = dt::ops;

struct MoeConfig {
  int64_t vocab = 256, hidden = 32, layers = 2, experts = 4, zero_experts = 2, top_k = 2,
          intermediate = 64;
};

// x + moe(norm(x)).
class MoeLayer : public nn::Module {
 public:
  // The children, kept as the typed references AddModule returns (registered in declaration
  // order): the forward calls them directly, no lookup by name.
  explicit MoeLayer(const MoeConfig& c)
      : Module("MoeLayer"),
        norm_(AddModule<nn::RMSNorm>("norm", c.hidden)),
        moe_(AddModule<nn::MoeBlock>("moe", Options(c))) {}

 protected:
  absl::StatusOr<dt::Values> Forward(dt::Values in) override {
    DT_ASSIGN_OR_RETURN(dt::Value h, norm_.CallOne({in[0]}));
    DT_ASSIGN_OR_RETURN(h, moe_.CallOne({h}));
    DT_ASSIGN_OR_RETURN(dt::Value x, ops::Add(in[0], h));
    return dt::Values{x};
  }

 private:
  static nn::MoeBlockOptions Options(const MoeConfig& c) {
    nn::MoeBlockOptions o;
    o.router = {.hidden_size = c.hidden,
                .num_experts = c.experts + c.zero_experts,  // ids >= experts: identity experts
                .top_k = c.top_k,
                .normalize = true};
    o.experts = {.num_experts = c.experts,
                 .hidden_size = c.hidden,
                 .intermediate_size = c.intermediate,
                 .num_identity_experts = c.zero_experts};
    return o;
  }

  nn::RMSNorm& norm_;
  nn::MoeBlock& moe_;
};

// {ids [B, S]} -> {logits [B, S, vocab]}.
class MoeModel : public nn::Module {
 public:
  explicit MoeModel(const MoeConfig& c)
      : Module("MoeModel"),
        embed_(AddModule<nn::Embedding>("embed", c.vocab, c.hidden)),
        layers_(AddModule<nn::ModuleList>("layers")),
        norm_(AddModule<nn::RMSNorm>("norm", c.hidden)),
        lm_head_(AddModule<nn::Linear>("lm_head", c.hidden, c.vocab, /*bias=*/false)) {
    for (int64_t i = 0; i < c.layers; ++i) layers_.Append(std::make_unique<MoeLayer>(c));
  }

  static nn::ParallelPlan Plan() {
    return {
        {"layers.*.moe.experts.gate_up_proj", "packed_colwise"},  // matching gate and up rows
        {"layers.*.moe.experts.down_proj", "rowwise"},
        {"layers.*.moe.experts", "moe_tp_experts"},                // one all_reduce per block
        {"layers.*.moe.experts.identity", "moe_identity_expert"},  // x added once, not T times
        {"layers.*.moe.gate", "replicate"},                        // the router: whole
        {"layers.*.norm", "replicate"},
        {"embed", "replicate"},
        {"norm", "replicate"},
        {"lm_head", "colwise_gather_output"},
    };
  }

 protected:
  absl::StatusOr<dt::Values> Forward(dt::Values in) override {
    DT_ASSIGN_OR_RETURN(dt::Value x, embed_.CallOne({in[0]}));
    for (int64_t i = 0; i < layers_.size(); ++i) {
      DT_ASSIGN_OR_RETURN(x, layers_.at(i).CallOne({x}));
    }
    DT_ASSIGN_OR_RETURN(x, norm_.CallOne({x}));
    DT_ASSIGN_OR_RETURN(x, lm_head_.CallOne({x}));
    return dt::Values{x};
  }

 private:
  nn::Embedding& embed_;
  nn::ModuleList& layers_;
  nn::RMSNorm& norm_;
  nn::Linear& lm_head_;
};

int main(int argc, char** argv) {
  return dt::examples::Main(
      argc, argv, "custom_moe",
      "a mixture of experts with identity (zero) experts sharded by its plan, checked against the "
      "same model unsharded",
      [](dt::World& world) -> absl::Status {
        const MoeConfig config;
        DT_ASSIGN_OR_RETURN(dt::Tensor ids, dt::examples::SampleIds(config.vocab));
        auto make = [&] { return std::make_unique<MoeModel>(config); };
        return dt::examples::CheckAtTpSizes(world, "custom_moe", make, MoeModel::Plan(), {ids});
      });
}
