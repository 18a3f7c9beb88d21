// CausalLM's limits (issue 45): non-finite values fail every rank alike at the step they appear,
// with --check-finite naming the layer and the weight (Note [Non-finite values]); the context
// (Note [The context limit]): a longer prompt refused before any work or truncated, generation
// stopped at it, Logits refusing positions past it. The models are the tiny fixtures with one
// weight element set to NaN or Inf after loading (what an overflow leaves; files holding them are
// refused at load), or copies with a smaller context written in a scratch directory; thread ranks
// at tp 1, 2 and 4.
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/models/llama.h"
#include "dtensor/tests/models/golden_checks.h"
#include "dtensor/tests/models/llama_util.h"
#include "dtensor/tests/models/patched_fixtures.h"
#include "dtensor/tests/test_util.h"
#include "gtest/gtest.h"

namespace dt::nn::testing {
namespace {

using dt::testing::Contains;
using dt::testing::ReadFileBytes;
using dt::testing::WriteFileBytes;

const std::string& Scratch() {
  static dt::testing::ScratchDir dir("generate_limits");
  return dir.path;
}

// One weight element of the loaded model set to a value (PokeLoaded).
struct Poke {
  std::string tensor;
  int64_t index = 0;
  float value = 0;
};

// llama-tiny with max_position_embeddings `context`.
std::string LlamaWithContext(int64_t context) {
  return FixtureWithContext(Scratch(), "llama-tiny", absl::StrCat("context", context), context);
}

// Every rank's Generate outcome at `tp` (thread ranks): "tokens [..]" or the error.
std::vector<std::string> GenerateOnRanks(int tp, const std::string& dir,
                                         const std::vector<int64_t>& prompt,
                                         const GenerateOptions& g, bool check_finite = false,
                                         const std::vector<Poke>& pokes = {}) {
  std::vector<std::string> out(tp);
  std::mutex mu;
  const absl::Status s = OnThreadRanks<LlamaForCausalLM>(
      tp, dir, LlamaLoadOptions(), [&](int rank, LlamaForCausalLM& m, const LoadReport&) -> absl::Status {
        for (const Poke& p : pokes) DT_RETURN_IF_ERROR(PokeLoaded(m, p.tensor, p.index, p.value));
        m.set_check_finite(check_finite);
        absl::StatusOr<GenerateResult> r = m.Generate(prompt, g);
        std::lock_guard<std::mutex> lock(mu);
        out[rank] = r.ok() ? absl::StrCat("tokens [", absl::StrJoin(r->tokens, ","), "]")
                           : r.status().ToString();
        return absl::OkStatus();
      });
  if (!s.ok()) out.assign(tp, absl::StrCat("the run failed: ", s.ToString()));
  return out;
}

GenerateOptions Greedy(int64_t n = 8) {
  GenerateOptions g;
  g.max_new_tokens = n;
  return g;
}

GenerateOptions Sampled(int64_t n = 8) {
  GenerateOptions g = Greedy(n);
  g.sampling.greedy = false;
  g.sampling.temperature = 0.8;
  g.sampling.top_k = 40;
  g.sampling.seed = 1;
  return g;
}

// With `pokes` on llama-tiny, every rank of every tp returns `needles`' error, the same on each rank
// of a tp.
void ExpectSameErrorEverywhere(const std::vector<Poke>& pokes, const std::vector<int64_t>& prompt,
                               const GenerateOptions& g, bool check_finite,
                               const std::vector<std::string>& needles) {
  for (int tp : {1, 2, 4}) {
    const std::vector<std::string> got =
        GenerateOnRanks(tp, FixtureDir("llama-tiny"), prompt, g, check_finite, pokes);
    for (int r = 0; r < tp; ++r) {
      SCOPED_TRACE(absl::StrCat("tp ", tp, " rank ", r));
      EXPECT_EQ(got[r], got[0]);
      for (const std::string& n : needles) EXPECT_TRUE(Contains(got[r], n));
    }
  }
}

const std::vector<int64_t> kPrompt = {1, 15, 27, 100, 200, 5, 7, 300, 42, 11};  // golden.json's

// ---- non-finite values --------------------------------------------------------------------------

// A NaN in the final norm's weight: every logit is NaN from the prefill on; greedy and sampled
// decoding used to print [0,0,0,...] or fail on one rank only.
TEST(NonFinite, NaNOutputNormFailsEveryRankAtTheFirstStep) {
  for (const GenerateOptions& g : {Greedy(), Sampled()}) {
    ExpectSameErrorEverywhere({{"model.norm.weight", 3, NAN}}, kPrompt, g, false,
                              {"INVALID_ARGUMENT: Generate: step 0: the logits are not finite: "
                               "logit 0 of 384 is NaN",
                               "--check-finite"});
  }
}

// An Inf in the embedding row of token 378, which greedy decoding produces at step 1
// (golden.json: 78, 378, 363, ...): steps 0 and 1 are finite, step 2 feeds it and fails.
TEST(NonFinite, InfEmbeddingFailsAtTheStepThatReadsIt) {
  const std::vector<Poke> inf_embed = {{"model.embed_tokens.weight", 378 * 64 + 5, INFINITY}};
  ExpectSameErrorEverywhere(inf_embed, kPrompt, Greedy(), false,
                            {"Generate: step 2: the logits are not finite"});
  // --check-finite names the embedding and its weight.
  ExpectSameErrorEverywhere(
      inf_embed, kPrompt, Greedy(), true,
      {"Generate: step 2: model.embed_tokens: its output holds +inf",
       "non-finite values in model.embed_tokens.weight"});
}

// A NaN in one column of layer 2's down_proj: at tp > 1 a single rank holds it (rowwise, S(1));
// the all_reduce spreads it, and every rank names the same layer and weight.
TEST(NonFinite, CheckFiniteNamesTheFirstLayerAndWeight) {
  ExpectSameErrorEverywhere({{"model.layers.2.mlp.down_proj.weight", 7 * 172 + 150, NAN}}, kPrompt,
                            Sampled(), true,
                            {"Generate: step 0: model.layers.2.mlp: its output holds NaN",
                             "non-finite values in model.layers.2.mlp.down_proj.weight"});
  ExpectSameErrorEverywhere({{"model.norm.weight", 3, NAN}}, kPrompt, Greedy(), true,
                            {"model.norm: its output holds NaN",
                             "non-finite values in model.norm.weight"});
}

// On healthy weights the checks change nothing: the tokens are transformers' (golden.json) with
// --check-finite on, and after it is turned off again.
TEST(NonFinite, CheckFiniteKeepsTheGoldenTokens) {
  const Golden golden = LoadGolden("llama-tiny");
  const std::string want =
      absl::StrCat("tokens [", absl::StrJoin(golden.f32.greedy_tokens, ","), "]");
  for (int tp : {1, 2}) {
    const std::vector<std::string> got =
        GenerateOnRanks(tp, FixtureDir("llama-tiny"), golden.prompt,
                        Greedy(static_cast<int64_t>(golden.f32.greedy_tokens.size())), true);
    for (const std::string& g : got) EXPECT_EQ(g, want) << "tp " << tp;
  }
  const absl::Status s = OnThreadRanks<LlamaForCausalLM>(
      1, FixtureDir("llama-tiny"), LlamaLoadOptions(),
      [&](int, LlamaForCausalLM& m, const LoadReport&) -> absl::Status {
        m.set_check_finite(true);
        m.set_check_finite(false);
        EXPECT_FALSE(m.check_finite());
        DT_ASSIGN_OR_RETURN(GenerateResult r, m.Generate(golden.prompt, Greedy(4)));
        EXPECT_EQ(r.tokens, std::vector<int64_t>(golden.f32.greedy_tokens.begin(),
                                                 golden.f32.greedy_tokens.begin() + 4));
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

// ---- the context --------------------------------------------------------------------------------

TEST(Context, FitPromptToContext) {
  const std::vector<int64_t> p = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(FitPromptToContext(p, 32, 10, PromptTruncation::kNone).value(), p);
  const absl::Status s = FitPromptToContext(p, 0, 9, PromptTruncation::kNone).status();
  EXPECT_TRUE(absl::IsOutOfRange(s)) << s;
  EXPECT_TRUE(Contains(s, "the prompt has 10 tokens, more than the model's context of 9"));
  // Room for the new tokens...
  EXPECT_EQ(FitPromptToContext(p, 2, 8, PromptTruncation::kLeft).value(),
            (std::vector<int64_t>{5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(FitPromptToContext(p, 2, 8, PromptTruncation::kRight).value(),
            (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  // ... but never less than half the context of prompt, nor more than it has.
  EXPECT_EQ(FitPromptToContext(p, 1000, 8, PromptTruncation::kLeft).value(),
            (std::vector<int64_t>{7, 8, 9, 10}));
  EXPECT_EQ(FitPromptToContext({4, 5}, 1000, 8, PromptTruncation::kLeft).value(),
            (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(FitPromptToContext(p, 1000, 1, PromptTruncation::kRight).value(),
            (std::vector<int64_t>{1}));
  EXPECT_EQ(ParsePromptTruncation("left").value(), PromptTruncation::kLeft);
  EXPECT_FALSE(ParsePromptTruncation("middle").ok());
}

// A prompt longer than the context is refused with both numbers before any work (no KV cache
// entry), at every tp; the options and ids likewise.
TEST(Context, RefusedBeforeAnyWork) {
  const std::string dir = LlamaWithContext(8);
  const std::vector<int64_t> nine = {1, 15, 27, 100, 200, 5, 7, 300, 42};
  auto refused = [&](const std::vector<int64_t>& prompt, const GenerateOptions& g,
                     const std::string& needle) {
    for (int tp : {1, 2}) {
      const absl::Status s = OnThreadRanks<LlamaForCausalLM>(
          tp, dir, LlamaLoadOptions(), [&](int, LlamaForCausalLM& m, const LoadReport&) {
            const absl::StatusOr<GenerateResult> r = m.Generate(prompt, g);
            EXPECT_TRUE(Contains(r.status(), needle)) << "tp " << tp;
            EXPECT_EQ(m.cache_length(), 0);
            return absl::OkStatus();
          });
      EXPECT_TRUE(s.ok()) << s;
    }
  };
  refused(nine, Greedy(), "Generate: the prompt has 9 tokens, more than the model's context of 8");
  GenerateOptions g = Sampled();
  g.sampling.temperature = NAN;
  refused(kPrompt, g, "temperature must be finite and > 0, got nan");
  g = Sampled();
  g.sampling.top_p = 2;
  refused(kPrompt, g, "top_p must be in (0, 1], got 2");
  refused({1, 384}, Greedy(), "prompt position 1: token id 384 is outside the vocab [0, 384)");
  refused({1, -1}, Greedy(), "prompt position 1: token id -1 is outside");
  refused({1}, Greedy(-1), "max_new_tokens must be >= 0, got -1");
}

// Generation stops at the context, whatever max_new_tokens asks (it used to grow the KV cache
// until killed), with the tokens of an unlimited run up to there.
TEST(Context, GenerationStopsAtTheContext) {
  const Golden golden = LoadGolden("llama-tiny");
  const std::vector<int64_t>& want = golden.f32.greedy_tokens;
  const std::string dir = LlamaWithContext(14);
  const std::string one = LlamaWithContext(1);
  for (int tp : {1, 2}) {
    const absl::Status s = World::RunThreads(tp, [&](World& w) -> absl::Status {
      DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {tp}, {"tp"}));
      DT_ASSIGN_OR_RETURN(auto m, LlamaForCausalLM::FromPretrained(dir, mesh));
      EXPECT_EQ(m->context_length(), 14);
      DT_ASSIGN_OR_RETURN(GenerateResult r, m->Generate(golden.prompt, Greedy(int64_t{1} << 40)));
      EXPECT_EQ(r.stop, StopReason::kContext);
      EXPECT_EQ(r.tokens, std::vector<int64_t>(want.begin(), want.begin() + 4));
      EXPECT_LE(m->cache_length(), 14);
      // max_new_tokens first, and a stop token first, say so.
      DT_ASSIGN_OR_RETURN(r, m->Generate(golden.prompt, Greedy(2)));
      EXPECT_EQ(r.stop, StopReason::kMaxNewTokens);
      GenerateOptions g = Greedy(4);
      g.stop_token_ids = {want[2]};
      DT_ASSIGN_OR_RETURN(r, m->Generate(golden.prompt, g));
      EXPECT_EQ(r.stop, StopReason::kStopToken);
      EXPECT_EQ(r.tokens.size(), 3u);
      // Logits past the context are refused, naming it.
      m->ResetCache();
      DT_ASSIGN_OR_RETURN(Tensor ids,
                          Tensor::FromVector<int64_t>({1, 15}, std::vector<int64_t>(15, 1)));
      EXPECT_TRUE(Contains(
          m->Logits(ids).status(),
          "positions up to 15 (0 cached + 15 new) exceed the model's context of 14"));
      // A context of one position: the prompt fills it, no token (it used to generate 64).
      DT_ASSIGN_OR_RETURN(auto tiny, LlamaForCausalLM::FromPretrained(one, mesh));
      DT_ASSIGN_OR_RETURN(r, tiny->Generate({1}, Greedy(64)));
      EXPECT_TRUE(r.tokens.empty());
      EXPECT_EQ(r.stop, StopReason::kContext);
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << "tp " << tp << ": " << s;
  }
}

// --truncate: the kept part of the prompt gives the tokens that part gives untruncated.
TEST(Context, TruncationKeepsTheChosenEnd) {
  const std::string dir = LlamaWithContext(12);
  const absl::Status s = OnThreadRanks<LlamaForCausalLM>(
      2, dir, LlamaLoadOptions(), [&](int, LlamaForCausalLM& m, const LoadReport&) -> absl::Status {
        GenerateOptions g = Greedy(4);  // room for 4: the prompt keeps 8 of its 10
        for (PromptTruncation t : {PromptTruncation::kLeft, PromptTruncation::kRight}) {
          g.truncate = t;
          DT_ASSIGN_OR_RETURN(GenerateResult cut, m.Generate(kPrompt, g));
          EXPECT_EQ(cut.prompt_tokens, 8);
          EXPECT_EQ(cut.truncated_tokens, 2);
          EXPECT_EQ(cut.stop, StopReason::kMaxNewTokens);
          const bool left = t == PromptTruncation::kLeft;
          const std::vector<int64_t> kept(kPrompt.begin() + (left ? 2 : 0),
                                          kPrompt.end() - (left ? 0 : 2));
          DT_ASSIGN_OR_RETURN(GenerateResult whole, m.Generate(kept, Greedy(4)));
          EXPECT_EQ(cut.tokens, whole.tokens);
          EXPECT_EQ(whole.truncated_tokens, 0);
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

// GGUF's context_length is the limit too: the tiny GGUF with context_length 1 generates nothing.
TEST(Context, GgufContextLength) {
  const std::string path = Scratch() + "/context1.gguf";
  std::string bytes = ReadFileBytes(FixtureDir("gguf/llama-tiny.gguf"));
  const std::string key = "llama.context_length";
  const size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  uint32_t type;
  std::memcpy(&type, bytes.data() + at + key.size(), 4);
  ASSERT_EQ(type, 4u);  // GGUF's UINT32
  const uint32_t one = 1;
  std::memcpy(bytes.data() + at + key.size() + 4, &one, 4);
  WriteFileBytes(path, bytes);
  const absl::Status s = OnThreadRanks<LlamaForCausalLM>(
      1, path, LlamaLoadOptions(),
      [&](int, LlamaForCausalLM& m, const LoadReport&) -> absl::Status {
        EXPECT_EQ(m.context_length(), 1);
        DT_ASSIGN_OR_RETURN(GenerateResult r, m.Generate({1}, Greedy(64)));
        EXPECT_TRUE(r.tokens.empty());
        EXPECT_EQ(r.stop, StopReason::kContext);
        EXPECT_TRUE(Contains(m.Generate({1, 2}, Greedy(64)).status(),
                             "the prompt has 2 tokens, more than the model's context of 1"));
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace dt::nn::testing
