// A GPT-2-style model written against the public nn API as a new user would: learned positions,
// LayerNorm with bias, causal attention without RoPE through one fused c_attn (q | k | v), a GELU
// MLP. Its tensor-parallel plan is validated with nn::CheckParallel at tp = 1, 2 and 4: the sharded
// model against the replicated one on the same seeded weights. Exits 0 only when they agree.
//
//   dtrun --nproc-per-node 4 build/bin/custom_gpt2     (gloo processes; without dtrun: 4 threads)
#include <memory>

#include "check_example.h"  // main() and the loop over tp sizes, beside this file
#include "dtensor/mesh/world.h"
#include "dtensor/nn/nn.h"

namespace nn = dt::nn;
namespace ops = dt::ops;

struct GPT2Config {
  int64_t vocab = 256, positions = 64, hidden = 64, heads = 4, layers = 2;
};

// x + attn(ln_1(x)), then + mlp(ln_2(x)): GPT-2's pre-norm block.
class GPT2Block : public nn::Module {
 public:
  // Each child is registered under its Hugging Face name and kept as the typed reference
  // AddModule returns: the forward calls it directly, no lookup by name. Members are initialized
  // in declaration order, which is therefore the registration (and parameter) order.
  explicit GPT2Block(const GPT2Config& c)
      : Module("GPT2Block"),
        ln_1_(AddModule<nn::LayerNorm>("ln_1", c.hidden)),
        attn_(AddModule<nn::Attention>("attn",
                                       nn::AttentionOptions{.hidden_size = c.hidden,
                                                            .num_heads = c.heads,
                                                            .bias = true,
                                                            .causal = true,
                                                            .fused_qkv = true,  // c_attn: q | k | v
                                                            .o_name = "c_proj",
                                                            .qkv_name = "c_attn"})),
        ln_2_(AddModule<nn::LayerNorm>("ln_2", c.hidden)),
        mlp_(AddModule<nn::MLP>("mlp", nn::MLPOptions{.hidden_size = c.hidden,
                                                      .intermediate_size = 4 * c.hidden,
                                                      .activation = nn::Activation::kGeluTanh,
                                                      .up_name = "c_fc",
                                                      .down_name = "c_proj"})) {}

 protected:
  absl::StatusOr<dt::Values> Forward(dt::Values in) override {
    dt::Value x = in[0];
    DT_ASSIGN_OR_RETURN(dt::Value h, ln_1_.CallOne({x}));
    DT_ASSIGN_OR_RETURN(h, attn_.CallOne({h}));  // no cos/sin: no RoPE
    DT_ASSIGN_OR_RETURN(x, ops::Add(x, h));
    DT_ASSIGN_OR_RETURN(h, ln_2_.CallOne({x}));
    DT_ASSIGN_OR_RETURN(h, mlp_.CallOne({h}));
    DT_ASSIGN_OR_RETURN(x, ops::Add(x, h));
    return dt::Values{x};
  }

 private:
  nn::LayerNorm& ln_1_;
  nn::Attention& attn_;
  nn::LayerNorm& ln_2_;
  nn::MLP& mlp_;
};

// {ids [B, S]} -> {logits [B, S, vocab]}; names as in Hugging Face's GPT2LMHeadModel.transformer.
class GPT2 : public nn::Module {
 public:
  explicit GPT2(const GPT2Config& c)
      : Module("GPT2"),
        wte_(AddModule<nn::Embedding>("wte", c.vocab, c.hidden)),
        wpe_(AddModule<nn::LearnedPositionEmbedding>("wpe", c.positions, c.hidden)),
        h_(AddModule<nn::ModuleList>("h")),
        ln_f_(AddModule<nn::LayerNorm>("ln_f", c.hidden)),
        lm_head_(AddModule<nn::Linear>("lm_head", c.hidden, c.vocab)) {
    for (int64_t i = 0; i < c.layers; ++i) h_.Append(std::make_unique<GPT2Block>(c));
  }

  static nn::ParallelPlan Plan() {
    return {
        {"wte", "embedding_rowwise"},         // vocab rows sharded, one all_reduce
        {"h.*.attn.c_attn", "packed_colwise"},  // each rank: its heads of q, k and v
        {"h.*.attn.c_proj", "rowwise"},         // one all_reduce
        {"h.*.mlp.c_fc", "colwise"},
        {"h.*.mlp.c_proj", "rowwise"},          // one all_reduce
        {"lm_head", "colwise_gather_output"},   // vocab columns, gathered
        {"wpe", "replicate"},                   // small: replicated on purpose
        {"h.*.ln_1", "replicate"},
        {"h.*.ln_2", "replicate"},
        {"ln_f", "replicate"},
    };
  }

 protected:
  absl::StatusOr<dt::Values> Forward(dt::Values in) override {
    DT_ASSIGN_OR_RETURN(dt::Value x, wte_.CallOne({in[0]}));
    DT_ASSIGN_OR_RETURN(x, wpe_.CallOne({x}));  // x + wpe[0..S)
    for (int64_t i = 0; i < h_.size(); ++i) {
      DT_ASSIGN_OR_RETURN(x, h_.at(i).CallOne({x}));
    }
    DT_ASSIGN_OR_RETURN(x, ln_f_.CallOne({x}));
    DT_ASSIGN_OR_RETURN(x, lm_head_.CallOne({x}));
    return dt::Values{x};
  }

 private:
  nn::Embedding& wte_;
  nn::LearnedPositionEmbedding& wpe_;
  nn::ModuleList& h_;
  nn::LayerNorm& ln_f_;
  nn::Linear& lm_head_;
};

int main(int argc, char** argv) {
  return dt::examples::Main(
      argc, argv, "custom_gpt2",
      "a GPT-2-style model sharded by its plan, checked against the same model unsharded",
      [](dt::World& world) -> absl::Status {
        const GPT2Config config;
        DT_ASSIGN_OR_RETURN(dt::Tensor ids, dt::examples::SampleIds(config.vocab));
        auto make = [&] { return std::make_unique<GPT2>(config); };
        return dt::examples::CheckAtTpSizes(world, "custom_gpt2", make, GPT2::Plan(), {ids});
      });
}
