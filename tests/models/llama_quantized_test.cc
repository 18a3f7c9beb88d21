// Llama with its GGUF weights kept quantized (LlamaLoadOptions::keep_quantized; Note [Quantized
// dtypes] in core/quant.h) against the same model dequantized to f32 (today's path, itself checked
// against transformers in llama_gguf_test.cc): llama-tiny.gguf holds one quant type per weight (all
// eight, plus F16/BF16/F32), so every kernel runs inside a real forward at tp = 1, 2 and 4.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/tokenizer.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/models/llama.h"
#include "dtensor/tests/models/golden_checks.h"
#include "dtensor/tests/models/llama_util.h"
#include "dtensor/tests/test_util.h"
#include "gtest/gtest.h"

namespace dt::nn::testing {
namespace {

const std::string kTiny = std::string(DT_FIXTURES_DIR) + "/gguf/llama-tiny.gguf";
const std::vector<int64_t> kPrompt = {1, 15, 27, 100, 7, 300, 2, 9, 41, 77, 5, 18};

// The logits at every position of `prompt` of the model at `path` on `tp` thread ranks (rank
// 0's), its weights kept quantized or not.
Tensor RunLogits(const std::string& path, int tp, bool quantized, const std::vector<int64_t>& prompt,
                 LlamaLoadReport* report0 = nullptr) {
  Tensor out;
  absl::Status s = World::RunThreads(tp, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {tp}, {"tp"}));
    LlamaLoadOptions o;
    o.keep_quantized = quantized;
    o.unused_tensors = PlanCheck::kIgnore;
    LlamaLoadReport report;
    DT_ASSIGN_OR_RETURN(auto m, LlamaForCausalLM::FromPretrained(path, mesh, o, &report));
    DT_ASSIGN_OR_RETURN(Tensor l, PromptLogits(*m, prompt));
    if (w.rank() == 0) {
      out = l;
      if (report0 != nullptr) *report0 = report;
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// llama-tiny.gguf's logits of kPrompt.
Tensor RunTiny(int tp, bool quantized, LlamaLoadReport* report0 = nullptr) {
  return RunLogits(kTiny, tp, quantized, kPrompt, report0);
}

// 16-bit activations leave the quantized path ~1e-4 of the logits' range from the dequantized one
// (measured 8e-5 at tp = 1, 2.4e-4 at tp = 2, where one more weight is dequantized and the partial
// sums are added in another order); a wrong block or scale anywhere gives O(1).
TEST(LlamaQuantized, TinyKeepsItsBlocksAndMatchesDequantized) {
  const Tensor want = RunTiny(1, false);
  ASSERT_TRUE(want.defined());
  for (int tp : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("tp=", tp));
    LlamaLoadReport report;
    const Tensor got = RunTiny(tp, true, &report);
    ASSERT_TRUE(got.defined());
    const double d = MaxRelativeDiff(got, want).value();
    EXPECT_LT(d, 1e-3) << "quantized logits vs dequantized, relative to their range";
    int quantized = 0;
    int64_t read = 0, held = 0;
    for (const LlamaLoadReport::Param& p : report.params) {
      quantized += IsQuantized(p.dtype);
      if (IsQuantized(p.dtype)) {
        read += p.read_bytes;
        held += p.local_bytes;
        // A sharded quantized weight: this rank's blocks only.
        if (p.sharded && tp > 1) {
          EXPECT_EQ(p.local_bytes * tp, p.full_bytes) << p.name;
        }
      }
    }
    EXPECT_EQ(read, held) << "a quantized weight is read as exactly the blocks it keeps";
    // Every Linear and the embedding of the fixture, but the F16/BF16 ones, stay quantized; at
    // tp = 2 layer 1's q4_k o_proj (256 columns, 128 per rank) cannot and is dequantized.
    EXPECT_EQ(quantized, tp == 1 ? 14 : 13) << report.QuantizedSummary();
    EXPECT_EQ(report.dequantized.size(), tp == 1 ? 0u : 1u) << report.QuantizedSummary();
  }
}

TEST(LlamaQuantized, MisfitShardsAreRefusedBeforeAnyRead) {
  absl::Status s = World::RunThreads(2, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {2}, {"tp"}));
    LlamaLoadOptions o;
    o.keep_quantized = true;
    o.quantized_misfit = QuantizedMisfit::kRefuse;
    o.unused_tensors = PlanCheck::kIgnore;
    LlamaLoadReport report;
    absl::Status st = LlamaForCausalLM::FromPretrained(kTiny, mesh, o, &report).status();
    if (report.stats.bytes_read() != 0) return absl::InternalError("read before refusing");
    return st;
  });
  EXPECT_TRUE(dt::testing::Contains(s, "model.layers.1.self_attn.o_proj.weight")) << s;
  EXPECT_TRUE(dt::testing::Contains(s, "256-element q4_k blocks")) << s;
  EXPECT_TRUE(dt::testing::Contains(s, "tp=2")) << s;
}

// SaveGathered on the quantized model at tp = 2: every quantized weight is dequantized on its own
// rank and gathered, so the checkpoint is the GGUF's weights in f32 (the same reference
// dequantization as the loader's): reloaded at tp = 1 it gives the dequantized path's logits
// exactly.
TEST(LlamaQuantized, SaveGatheredWritesTheDequantizedWeights) {
  namespace fs = std::filesystem;
  const fs::path out = fs::temp_directory_path() / absl::StrCat("dt_qsave_", ::getpid());
  absl::Status s = World::RunThreads(2, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {2}, {"tp"}));
    LlamaLoadOptions o;
    o.keep_quantized = true;
    o.unused_tensors = PlanCheck::kIgnore;
    DT_ASSIGN_OR_RETURN(auto m, LlamaForCausalLM::FromPretrained(kTiny, mesh, o));
    return SaveGathered(*m, out.string(), m->save_options());
  });
  ASSERT_TRUE(s.ok()) << s;
  const Tensor got = RunLogits(out.string(), 1, /*quantized=*/false, kPrompt);
  std::error_code ec;
  fs::remove_all(out, ec);
  ASSERT_TRUE(got.defined());
  EXPECT_TRUE(Equal(got, RunTiny(1, false)));
}

// ---- SmolLM2-135M-Instruct (label model) -----------------------------------------------------------

// A fixed English text of more than 128 tokens (SmolLM2's tokenizer), teacher-forced.
constexpr char kText[] =
    "The history of the bicycle begins in the early nineteenth century, when inventors in Europe "
    "tried to build a machine that a person could ride without a horse. The first designs had no "
    "pedals at all: the rider sat between two wooden wheels and pushed against the ground with "
    "both feet. Later, a French workshop attached cranks and pedals to the front wheel, and the "
    "machine became popular in Paris and London. Because the pedals turned the front wheel "
    "directly, makers built ever larger front wheels to go faster, which made the bicycles tall "
    "and dangerous. The safety bicycle solved this problem with two wheels of equal size and a "
    "chain that drove the rear wheel, and the pneumatic tyre made the ride comfortable. Within a "
    "few years millions of people, many of them women, could travel cheaply and freely.";

TEST(SmolLM2Quantized, TeacherForcedAgreesWithDequantized) {
  if (!std::filesystem::exists(DT_SMOLLM2_GGUF)) GTEST_SKIP() << DT_SMOLLM2_GGUF << " not cached";
  auto tok = loaders::Tokenizer::Load(DT_SMOLLM2_GGUF).value();
  std::vector<int64_t> ids = tok->Encode(kText, /*add_bos=*/false).value();
  ASSERT_GE(ids.size(), 128u);
  ids.resize(128);
  auto logits = [&](bool quantized) { return RunLogits(DT_SMOLLM2_GGUF, 1, quantized, ids); };
  const Tensor q = logits(true), f = logits(false);
  ASSERT_TRUE(q.defined() && f.defined());
  const int64_t v = q.size(-1), n = 128;
  const std::vector<float> qv = q.ToVector<float>(), fv = f.ToVector<float>();
  int agree = 0;
  double kl = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float* a = fv.data() + t * v;  // the reference distribution p
    const float* b = qv.data() + t * v;  // the quantized path's q
    agree += std::max_element(a, a + v) - a == std::max_element(b, b + v) - b;
    const double ma = *std::max_element(a, a + v), mb = *std::max_element(b, b + v);
    double za = 0, zb = 0;
    for (int64_t i = 0; i < v; ++i) {
      za += std::exp(a[i] - ma);
      zb += std::exp(b[i] - mb);
    }
    for (int64_t i = 0; i < v; ++i) {
      const double la = a[i] - ma - std::log(za), lb = b[i] - mb - std::log(zb);
      kl += std::exp(la) * (la - lb);
    }
  }
  kl /= n;
  std::printf("argmax agreement %d / %lld, mean KL(f32 || quantized) %.5f\n", agree,
              static_cast<long long>(n), kl);
  EXPECT_GE(agree, 0.98 * n);
  EXPECT_LE(kl, 0.01);
}

// Greedy chat answers on the quantized path: the capital of France, at tp = 1 and on 3 thread
// ranks, the tokens identical.
TEST(SmolLM2Quantized, ChatAnswerNamesParisAtTp1AndTp3) {
  if (!std::filesystem::exists(DT_SMOLLM2_GGUF)) GTEST_SKIP() << DT_SMOLLM2_GGUF << " not cached";
  auto tok = loaders::Tokenizer::Load(DT_SMOLLM2_GGUF).value();
  const std::string text =
      tok->ApplyChatTemplate({{"user", "What is the capital of France?"}}).value();
  const std::vector<int64_t> ids = tok->Encode(text, /*add_bos=*/false).value();
  std::vector<std::vector<int64_t>> answers;
  for (int tp : {1, 3}) {
    absl::Status s = World::RunThreads(tp, [&](World& w) -> absl::Status {
      DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {tp}, {"tp"}));
      LlamaLoadOptions o;
      o.keep_quantized = true;
      o.shard_embedding = tp > 1;
      o.unused_tensors = PlanCheck::kIgnore;
      DT_ASSIGN_OR_RETURN(auto m, LlamaForCausalLM::FromPretrained(DT_SMOLLM2_GGUF, mesh, o));
      GenerateOptions g;
      g.max_new_tokens = 24;
      g.stop_token_ids = tok->stop_ids();
      DT_ASSIGN_OR_RETURN(GenerateResult r, m->Generate(ids, g));
      if (w.rank() == 0) answers.push_back(r.tokens);
      return absl::OkStatus();
    });
    ASSERT_TRUE(s.ok()) << s;
  }
  ASSERT_EQ(answers.size(), 2u);
  const std::string answer = tok->Decode(answers[0]).value();
  std::printf("answer: %s\n", answer.c_str());
  EXPECT_NE(answer.find("Paris"), std::string::npos) << answer;
  EXPECT_EQ(answers[0], answers[1]) << "tp=3 tokens differ from tp=1";
}

}  // namespace
}  // namespace dt::nn::testing
