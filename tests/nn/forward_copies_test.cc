// The host copies a Llama forward makes per layer (Note [Host copy counter] in core/tensor.h):
// prefill and one decode step, f32 and bf16, on 1 and 2 tensor-parallel thread ranks (each rank
// counts its own). A layer's count is the difference between a model of 4 layers and one of 2,
// halved, so the copies made once per forward (the rotary tables' cast, the logits) drop out.
//
// What a layer may copy: the new values into its KV cache (the keys are rotated into it: Note
// [Keys are rotated into the cache] in nn/attention.cc), one copy of [S, kv heads x head_dim];
// and under tensor parallelism each of its two all_reduces stages its input in a pooled buffer
// (dtensor/executor.cc, AllReduce of an input it does not own). Nothing else: the rotary, the
// attention output's heads (ScaledDotProductAttentionInto), SiLU·up (GatedActivation) and the
// norms all write their results where the next op reads them.

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "dtensor/core/status.h"
#include "dtensor/core/tensor.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/init.h"
#include "dtensor/nn/models/llama.h"
#include "gtest/gtest.h"

namespace dt::nn {
namespace {

constexpr int64_t kHidden = 128, kKvHeads = 4, kHeadDim = 16, kPrompt = 24;

loaders::LlamaConfig SmallLlama(int64_t layers) {
  loaders::LlamaConfig c;
  c.vocab_size = 256;
  c.hidden_size = kHidden;
  c.intermediate_size = 344;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 8;
  c.num_key_value_heads = kKvHeads;
  c.head_dim = kHeadDim;
  c.max_position_embeddings = 512;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000;
  return c;
}

struct StepCopies {
  CopyCount prefill, decode;
};

CopyCount Minus(const CopyCount& a, const CopyCount& b) {
  return {a.copies - b.copies, a.bytes - b.bytes};
}

// The copies of a prefill of kPrompt tokens and of the decode step after it, on this thread, for
// a model of `layers` layers on `mesh`.
absl::StatusOr<StepCopies> CountCopies(int64_t layers, DType dtype, const DeviceMesh& mesh) {
  LlamaForCausalLM model(SmallLlama(layers), dtype);
  DT_RETURN_IF_ERROR(model.Parallelize(mesh));
  DT_RETURN_IF_ERROR(InitRandom(model, 5));
  std::vector<int64_t> ids(kPrompt);
  for (int64_t i = 0; i < kPrompt; ++i) ids[i] = (i * 37 + 11) % 256;
  DT_ASSIGN_OR_RETURN(Tensor prompt, Tensor::FromVector<int64_t>({1, kPrompt}, ids));
  DT_ASSIGN_OR_RETURN(Tensor next, Tensor::FromVector<int64_t>({1, 1}, {7}));
  StepCopies c;
  // The first round warms the caches (strategies, GEMM choices); the second is counted.
  for (int round = 0; round < 2; ++round) {
    model.ResetCache(kPrompt + 4);
    const CopyCount a = HostCopies();
    DT_RETURN_IF_ERROR(model.Logits(prompt, /*last_only=*/true).status());
    const CopyCount b = HostCopies();
    DT_RETURN_IF_ERROR(model.Logits(next, /*last_only=*/true).status());
    c = {Minus(b, a), Minus(HostCopies(), b)};
  }
  return c;
}

// The copies of one layer: (4 layers - 2 layers) / 2.
CopyCount PerLayer(const CopyCount& two, const CopyCount& four) {
  return {(four.copies - two.copies) / 2, (four.bytes - two.bytes) / 2};
}

TEST(ForwardCopies, OnlyTheValuesAndTheAllReducesCopyPerLayer) {
  for (int tp : {1, 2}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const absl::Status s = World::RunThreads(tp, [&](World& w) -> absl::Status {
        DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {tp}, {"tp"}));
        DT_ASSIGN_OR_RETURN(const StepCopies two, CountCopies(2, dtype, mesh));
        DT_ASSIGN_OR_RETURN(const StepCopies four, CountCopies(4, dtype, mesh));
        const int64_t size = DTypeSize(dtype);
        for (const bool decode : {false, true}) {
          const int64_t tokens = decode ? 1 : kPrompt;
          const CopyCount layer = PerLayer(decode ? two.decode : two.prefill,
                                           decode ? four.decode : four.prefill);
          // The rank's value heads, and the [tokens, hidden] input of each all_reduce.
          const int64_t values = tokens * kKvHeads / tp * kHeadDim * size;
          const int64_t all_reduces = tp > 1 ? 2 : 0;
          const int64_t want_bytes = values + all_reduces * tokens * kHidden * size;
          if (w.rank() == 0) {
            std::printf("tp %d %s %s: %lld copies, %lld bytes per layer\n", tp,
                        std::string(DTypeName(dtype)).c_str(), decode ? "decode" : "prefill",
                        static_cast<long long>(layer.copies), static_cast<long long>(layer.bytes));
          }
          EXPECT_EQ(layer.copies, 1 + all_reduces)
              << "tp " << tp << " " << DTypeName(dtype) << (decode ? " decode" : " prefill");
          EXPECT_EQ(layer.bytes, want_bytes)
              << "tp " << tp << " " << DTypeName(dtype) << (decode ? " decode" : " prefill");
        }
        return absl::OkStatus();
      });
      ASSERT_TRUE(s.ok()) << s;
    }
  }
}

}  // namespace
}  // namespace dt::nn
