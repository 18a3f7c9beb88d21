// build/bin/generate (examples/llama_generate.cc) on issue 45's hostile command lines and models:
//   GenerateFlags.*  every numeric flag out of range, and --prompt-ids / --truncate / --dtype /
//                    --kv-dtype
//                    malformed, refused (exit 2, naming the flag and the value) before the model
//                    is loaded (the model path does not exist); the prompt against the context
//                    and the vocab refused before any weight is read (the model has no weights);
//                    a checkpoint tensor the model does not read refused unless
//                    --allow-unused-weights;
//   GenerateRanks.*  non-finite logits fail the run at the step they appear, at tp 1, 2 and 3
//                    under dtrun, greedy and sampled (every rank that prints an error prints the
//                    same), --check-finite naming the layer and the weight;
//                    generation stopped at the context, and --truncate, with --check agreeing
//                    with one rank.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "dtensor/tests/mesh/process_runner.h"
#include "dtensor/tests/models/patched_fixtures.h"
#include "dtensor/tests/test_util.h"
#include "gtest/gtest.h"

namespace dt::nn::testing {
namespace {

using dt::testing::Contains;
using dt::testing::ProcessResult;
using dt::testing::RunCommand;

const std::string& Scratch() {
  static dt::testing::ScratchDir dir("generate_cli");
  return dir.path;
}

// generate with `args`, on `n` shm ranks under dtrun (n > 1) or without a launcher.
ProcessResult Generate(const std::string& args, int n = 1) {
  const std::string program = absl::StrCat(DT_GENERATE, " ", args);
  return RunCommand(n == 1 ? program
                           : absl::StrCat("DT_BACKEND=shm ", DT_DTRUN, " --nproc-per-node ", n,
                                          " ", program));
}

TEST(GenerateFlags, OutOfRangeValuesAreRefusedBeforeTheModelLoads) {
  struct Case {
    std::string flags, message;
  };
  const std::vector<Case> cases = {
      {"--max-new-tokens -1", "--max-new-tokens must be an integer >= 0, got -1"},
      {"--temperature NaN", "--temperature must be a finite number > 0, got nan"},
      {"--temperature inf", "--temperature must be a finite number > 0, got inf"},
      {"--temperature 0", "--temperature must be a finite number > 0, got 0"},
      {"--top-p 2", "--top-p must be in (0, 1], got 2"},
      {"--top-p 0", "--top-p must be in (0, 1], got 0"},
      {"--top-p nan", "--top-p must be in (0, 1], got nan"},
      {"--top-k -1", "--top-k must be an integer >= 0, got -1"},
      {"--seed -5", "--seed must be an integer >= 0, got -5"},
      {"--ep-size 0", "--ep-size must be an integer >= 1, got 0"},
      {"--prompt-ids ,", "--prompt-ids must be token ids >= 0 separated by commas, got ',' (id 1 "
                         "of 2 is empty)"},
      {"--prompt-ids 1,,2", "got '1,,2' (id 2 of 3 is empty)"},
      {"--prompt-ids 1,-3", "got '1,-3' (id 2 of 2 is '-3')"},
      {"--prompt-ids 7x", "(id 1 of 1 is '7x')"},
      {"--prompt-ids ''", "got '' (id 1 of 1 is empty)"},
      {"--truncate middle", "--truncate must be none, left or right, got middle"},
      {"--dtype i64", "--dtype must be f32, bf16 or f16, got i64"},
      {"--kv-dtype q8_0", "--kv-dtype must be f32, bf16 or f16, got q8_0"},
  };
  for (const Case& c : cases) {
    const ProcessResult r = Generate(absl::StrCat("--model /no/such/model ", c.flags));
    EXPECT_EQ(r.status, 2) << c.flags << ": " << r.output;
    EXPECT_TRUE(Contains(r.output, c.message)) << c.flags;
    EXPECT_FALSE(Contains(r.output, "/no/such/model")) << c.flags;
  }
}

// A model directory with llama-tiny's config (context 8) and no weights: what is refused here is
// refused before any weight is read.
TEST(GenerateFlags, ThePromptIsCheckedAgainstTheConfigBeforeAnyWeightIsRead) {
  const std::string dir = FixtureWithContext(Scratch(), "llama-tiny", "config-only", 8);
  std::filesystem::remove(dir + "/model.safetensors");
  ProcessResult r = Generate(absl::StrCat("--model ", dir, " --prompt-ids 1,2,3,4,5,6,7,8,9"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(Contains(r.output, "the prompt has 9 tokens, more than the model's context of 8"));
  r = Generate(absl::StrCat("--model ", dir, " --prompt-ids 1,384"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(
      Contains(r.output, "prompt position 1: token id 384 is outside the model's vocab [0, 384)"));
}

// A checkpoint holding a tensor the model does not read (a norm a family forgot) is refused,
// naming it, unless --allow-unused-weights, which loads with a warning (Note [Every tensor is
// used]).
TEST(GenerateFlags, UnusedCheckpointTensorsAreRefusedUnlessAllowed) {
  const std::string dir =
      FixtureWithExtraTensor(Scratch(), "zoo/qwen3-tiny", "unused",
                             "model.layers.0.post_feedforward_layernorm.weight");
  const std::string run =
      absl::StrCat("--model ", dir, " --prompt-ids 1,15,27 --max-new-tokens 2 --quiet");
  ProcessResult r = Generate(run);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(Contains(r.output, "1 tensor is not used by Qwen3ForCausalLM: "
                                 "model.layers.0.post_feedforward_layernorm.weight"))
      << r.output;
  r = Generate(absl::StrCat(run, " --allow-unused-weights"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "not used by Qwen3ForCausalLM")) << r.output;  // the warning
  EXPECT_TRUE(Contains(Generate("--help").output, "--allow-unused-weights"));
}

// A checkpoint holding a NaN or an infinity is refused at load on every rank that reads it, naming
// the file, the tensor and the element (Note [Non-finite weights] in loaders/read_util.h), greedy
// or sampled, with --check-finite or not: the replicated final norm on every rank, the embedding
// row of token 378 where --shard-embedding puts it. What goes non-finite after loading (an
// overflow) is caught by the logits check and --check-finite: NonFinite.* in
// generate_limits_test.cc.
TEST(GenerateRanks, NonFiniteWeightsAreRefusedAtLoadOnEveryRank) {
  const std::string nan_norm =
      FixtureWith(Scratch(), "llama-tiny", "nan-norm", "model.norm.weight", 3, NAN);
  const std::string inf_embed = FixtureWith(Scratch(), "llama-tiny", "inf-embed",
                                            "model.embed_tokens.weight", 378 * 64 + 5, INFINITY);
  // qwen2-tiny: 9 heads over 3 KV heads, for tp 3.
  const std::string qwen =
      FixtureWith(Scratch(), "zoo/qwen2-tiny", "qwen-nan-norm", "model.norm.weight", 0, NAN);
  const std::string golden = "--prompt-ids 1,15,27,100,200,5,7,300,42,11";  // llama-tiny's
  const std::string short_prompt = "--prompt-ids 1,15,27";
  const std::string norm_nan = "tensor 'model.norm.weight' F32[64]: element [3] is nan; weights must be finite";
  struct Case {
    std::string model;
    int n;
    std::string flags, message;
  };
  const std::vector<Case> cases = {
      {nan_norm, 1, short_prompt, norm_nan},
      {nan_norm, 2, short_prompt + " --temperature 0.8 --seed 1", norm_nan},
      {qwen, 3, short_prompt + " --check-finite", "tensor 'model.norm.weight' F32["},
      {inf_embed, 2, golden + " --shard-embedding",
       "tensor 'model.embed_tokens.weight' F32[384, 64]: element [378, 5] is inf; weights must be finite"},
  };
  for (const Case& c : cases) {
    const ProcessResult r =
        Generate(absl::StrCat("--model ", c.model, " --quiet ", c.flags), c.n);
    SCOPED_TRACE(absl::StrCat(c.model, " on ", c.n, " ranks ", c.flags, ":\n", r.output));
    EXPECT_EQ(r.status, 1);
    EXPECT_TRUE(Contains(r.output, absl::StrCat("generate: INVALID_ARGUMENT: parameter '")));
    EXPECT_TRUE(Contains(r.output, c.message));
    // dtrun stops the other ranks once one fails, so the others may not get to print; what any
    // rank prints is the same error, and no rank prints tokens.
    for (absl::string_view line : absl::StrSplit(r.output, '\n')) {
      if (Contains(line, "generate: ")) {
        EXPECT_TRUE(Contains(line, c.message));
      }
    }
    EXPECT_FALSE(Contains(r.output, "generated ids"));
  }
}

// --max-new-tokens 10^12 stops at the context (it used to grow the KV cache until killed), the
// tokens those of a single rank (--check); --truncate left keeps the prompt's end.
TEST(GenerateRanks, TheContextEndsGenerationAndTruncationFitsThePrompt) {
  const std::string dir = FixtureWithContext(Scratch(), "llama-tiny", "context14", 14);
  ProcessResult r = Generate(absl::StrCat("--model ", dir, " --prompt-ids "
                                          "1,15,27,100,200,5,7,300,42,11 --max-new-tokens "
                                          "1000000000000 --quiet --check"),
                             2);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "generated ids [78,378,363,378]"));
  EXPECT_TRUE(Contains(r.output, "stopped at the model's context of 14 tokens (10 prompt + 4 new), "
                                 "before --max-new-tokens 1000000000000"));
  EXPECT_TRUE(Contains(r.output, "check: the 4 tokens equal the single-rank run"));
  r = Generate(absl::StrCat("--model ", dir, " --prompt-ids "
                            "9,9,9,9,9,9,1,15,27,100,200,5,7,300,42,11 --max-new-tokens 4 "
                            "--truncate left --quiet --check"),
               2);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "--truncate left: the prompt's 16 tokens were cut to their last "
                                 "10 to fit the model's context of 14 with the new tokens"));
  EXPECT_TRUE(Contains(r.output, "prompt ids [1,15,27,100,200,5,7,300,42,11]"));
  EXPECT_TRUE(Contains(r.output, "generated ids [78,378,363,378]"));
  EXPECT_TRUE(Contains(r.output, "check: the 4 tokens equal the single-rank run"));
}

}  // namespace
}  // namespace dt::nn::testing
