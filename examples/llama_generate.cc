// build/bin/generate (also build/bin/llama_generate): text generation with tensor parallelism for
// every decoder family (Llama, Mistral, Qwen2, Qwen3, Phi-3: nn/models/causal_lm.h), from a
// Hugging Face checkpoint or a GGUF file sharded at load time: each rank reads only its own
// rows/columns of every weight (docs/llama.md).
//
//   dtrun --nproc-per-node 3 build/bin/generate --model SmolLM2-135M-Instruct.Q4_1.gguf
//       --chat --prompt "What is the capital of France?"
//   dtrun --nproc-per-node 4 build/bin/generate --model tests/fixtures/zoo/qwen3-tiny
//       --prompt-ids 1,15,27 --max-new-tokens 32 [--greedy | --temperature 0.8 --top-k 40 --seed 1]
//
// `generate --help` lists every flag with its default and meaning.
//
// With a text prompt the answer is streamed as tokens arrive (a character split over tokens is
// held until complete); prefill and decode tokens/s are printed at the end.
//
// Every flag is checked before anything is loaded (exit 2 naming the flag and the value), and the
// prompt against the model's context and vocab before any weight is read (exit 1): a prompt
// longer than the context is refused naming both lengths unless --truncate left|right cuts it;
// generation stops at the context with a message (Note [The context limit] in
// nn/models/causal_lm.h). Non-finite logits fail every rank at the step they appear;
// --check-finite names the first layer whose output is not finite (Note [Non-finite values]).
//
// The world comes from the launcher (dtrun/torchrun, mpirun, srun; DT_BACKEND picks the backend);
// without one it runs on a single rank.
#include <cstdio>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/tokenizer.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/models/llama.h"
#include "dtensor/tools/flags.h"

ABSL_FLAG(std::string, model, "",
          "DIR (config.json + safetensors [+ tokenizer.json]) or FILE.gguf (with its vocabulary) "
          "(required)");
ABSL_FLAG(std::string, prompt, "",
          "TEXT, tokenized by the model's tokenizer (BOS first when it adds one); the answer is "
          "streamed and stops at EOS / end of turn");
ABSL_FLAG(bool, chat, false, "--prompt TEXT is a user message in the checkpoint's chat template");
ABSL_FLAG(std::string, system, "", "a system message before --prompt TEXT (implies --chat)");
ABSL_FLAG(std::string, prompt_ids, "",
          "the prompt as token ids a,b,c (no tokenizer needed); neither this nor --prompt: id 1");
ABSL_FLAG(int64_t, max_new_tokens, 32,
          "tokens to generate after the prompt (>= 0; generation stops earlier at the model's "
          "context)");
ABSL_FLAG(std::string, truncate, "none",
          "none|left|right: a prompt that leaves no room for --max-new-tokens in the model's "
          "context is refused (none), or loses its first (left) or last (right) tokens until "
          "they fit, keeping at least half the context");
ABSL_FLAG(bool, check_finite, false,
          "check every layer's output for NaN/inf and name the first layer and weight that is not "
          "finite (the logits are checked at every step regardless)");
ABSL_FLAG(bool, greedy, false,
          "argmax (the default unless --temperature, --top-k or --top-p is given)");
ABSL_FLAG(double, temperature, 1.0, "sampling temperature (finite, > 0; turns sampling on)");
ABSL_FLAG(int64_t, top_k, 0, "sample among the K most likely tokens (0: all; turns sampling on)");
ABSL_FLAG(double, top_p, 1.0, "nucleus sampling threshold in (0, 1] (turns sampling on)");
ABSL_FLAG(int64_t, seed, 0,
          "seed (>= 0) of the sampler's counter-based RNG: the same tokens on any number of ranks");
ABSL_FLAG(std::string, dtype, "",
          "compute dtype f32|bf16 (empty: the checkpoint's; for a GGUF its quantized weights stay "
          "quantized as their blocks and the rest computes in f32, while --dtype dequantizes "
          "every weight to that dtype)");
ABSL_FLAG(std::string, kv_dtype, "",
          "the KV cache's dtype f32|bf16|f16 (empty: the compute dtype); f16 under an f32 compute "
          "dtype halves what each decode step reads of the cache, as llama.cpp's default f16 "
          "cache does (CPU only)");
ABSL_FLAG(bool, shard_embedding, false,
          "embed_tokens as embedding_rowwise (vocab rows split, masked lookup + all_reduce)");
ABSL_FLAG(bool, replicate_kv, false,
          "k_proj / v_proj replicated: any tp that divides the query heads (SmolLM2's 9 heads / 3 "
          "KV heads on 9 ranks)");
ABSL_FLAG(bool, uneven_heads, false,
          "at a tp that does not divide the query heads, split them unevenly in whole heads "
          "(SmolLM2's 9 on 2 ranks: 5 + 4; the load report states the imbalance)");
ABSL_FLAG(bool, allow_unused_weights, false,
          "load a checkpoint that holds tensors the model does not read, with a warning naming "
          "them (refused by default: such a model computes something else; Note [Every tensor "
          "is used])");
ABSL_FLAG(bool, stop_at_eos, false,
          "with --prompt-ids, stop at the config's EOS (a text prompt always stops at EOS and the "
          "chat format's end of turn)");
ABSL_FLAG(bool, print_ids, false, "print the prompt and generated ids with a text prompt too");
ABSL_FLAG(bool, check, false,
          "rank 0 reruns on one rank in-process; every rank exits 1 unless the tokens are equal");
ABSL_FLAG(bool, quiet, false, "no table of parameters, no per-step progress");
ABSL_FLAG(std::string, save_to, "",
          "after loading, write the tensor-parallel model here as one HF checkpoint, gathered "
          "tensor by tensor (nn/save.h)");
ABSL_FLAG(int64_t, ep_size, 1,
          "mixture-of-experts families: experts split over N ranks (N = the ranks: the dense "
          "layers split over the same ranks, else an (N, ranks / N) mesh: Note [Expert-parallel "
          "layouts])");

// The program lives in dt::nn (no using-directives): the library's names read unqualified here.
namespace dt::nn {
namespace {

struct Args {
  std::string model;
  std::vector<int64_t> prompt;
  std::string text;  // --prompt
  std::string system;
  bool chat = false;
  bool print_ids = false;
  std::vector<int64_t> stop_ids;  // filled once the tokenizer is known
  int64_t max_new_tokens = 32;
  SamplingOptions sampling;
  std::optional<DType> dtype;
  std::optional<DType> kv_dtype;
  bool shard_embedding = false;
  bool replicate_kv = false;
  bool uneven_heads = false;
  bool allow_unused_weights = false;
  bool stop_at_eos = false;
  PromptTruncation truncate = PromptTruncation::kNone;
  int64_t truncated = 0;  // tokens --truncate cut from the prompt
  bool check_finite = false;
  bool check = false;
  bool quiet = false;
  std::string save_to;
  int64_t ep_size = 1;
};

absl::StatusOr<Args> ParseArgs(int argc, char** argv) {
  const std::vector<std::string> positional = cli::ParseFlags(
      argc, argv,
      "usage: generate --model DIR|FILE.gguf [--prompt TEXT [--chat] [--system TEXT] | "
      "--prompt-ids a,b,c] [flags]\n"
      "text generation with tensor parallelism for every decoder family, sharded at load (under "
      "dtrun: one rank per process)");
  if (positional.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", positional[1], "' (every option is a --flag)"));
  }
  // Every numeric flag in its range, whether given or not (the defaults are).
  auto bad = [](absl::string_view flag, absl::string_view want, const auto& got) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " must be ", want, ", got ", got));
  };
  Args a;
  a.model = absl::GetFlag(FLAGS_model);
  const std::string ids = absl::GetFlag(FLAGS_prompt_ids);
  if (cli::Given("prompt_ids")) {
    const std::vector<absl::string_view> pieces = absl::StrSplit(ids, ',');
    for (size_t i = 0; i < pieces.size(); ++i) {
      int64_t id;
      if (!absl::SimpleAtoi(pieces[i], &id) || id < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--prompt-ids must be token ids >= 0 separated by commas, got '", ids, "' (id ",
            i + 1, " of ", pieces.size(), " is ", pieces[i].empty() ? "empty" : "'", pieces[i],
            pieces[i].empty() ? "" : "'", ")"));
      }
      a.prompt.push_back(id);
    }
  }
  a.text = absl::GetFlag(FLAGS_prompt);
  a.system = absl::GetFlag(FLAGS_system);
  a.chat = absl::GetFlag(FLAGS_chat);
  a.print_ids = absl::GetFlag(FLAGS_print_ids);
  a.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  if (a.max_new_tokens < 0) return bad("--max-new-tokens", "an integer >= 0", a.max_new_tokens);
  // Sampling is on when any of its knobs is given; --greedy with one of them is a contradiction.
  const bool sampled = cli::Given("temperature") || cli::Given("top_k") || cli::Given("top_p");
  if (sampled && absl::GetFlag(FLAGS_greedy)) {
    return absl::InvalidArgumentError(
        "--greedy picks the argmax: give it or --temperature/--top-k/--top-p, not both");
  }
  a.sampling.greedy = !sampled;
  a.sampling.temperature = absl::GetFlag(FLAGS_temperature);
  a.sampling.top_p = absl::GetFlag(FLAGS_top_p);
  a.sampling.top_k = absl::GetFlag(FLAGS_top_k);
  const int64_t seed = absl::GetFlag(FLAGS_seed);
  if (!(a.sampling.temperature > 0) || !std::isfinite(a.sampling.temperature)) {
    return bad("--temperature", "a finite number > 0", a.sampling.temperature);
  }
  if (!(a.sampling.top_p > 0) || a.sampling.top_p > 1) {
    return bad("--top-p", "in (0, 1]", a.sampling.top_p);
  }
  if (a.sampling.top_k < 0) return bad("--top-k", "an integer >= 0", a.sampling.top_k);
  if (seed < 0) return bad("--seed", "an integer >= 0", seed);
  a.sampling.seed = static_cast<uint64_t>(seed);
  if (const std::string d = absl::GetFlag(FLAGS_dtype); !d.empty()) {
    absl::StatusOr<DType> dtype = ParseDType(d);
    if (!dtype.ok() || !IsFloating(*dtype)) return bad("--dtype", "f32, bf16 or f16", d);
    a.dtype = *dtype;
  }
  if (const std::string d = absl::GetFlag(FLAGS_kv_dtype); !d.empty()) {
    absl::StatusOr<DType> dtype = ParseDType(d);
    if (!dtype.ok() || !IsFloating(*dtype)) return bad("--kv-dtype", "f32, bf16 or f16", d);
    a.kv_dtype = *dtype;
  }
  const std::string truncation = absl::GetFlag(FLAGS_truncate);
  absl::StatusOr<PromptTruncation> truncate = ParsePromptTruncation(truncation);
  if (!truncate.ok()) return bad("--truncate", "none, left or right", truncation);
  a.truncate = *truncate;
  a.check_finite = absl::GetFlag(FLAGS_check_finite);
  a.shard_embedding = absl::GetFlag(FLAGS_shard_embedding);
  a.replicate_kv = absl::GetFlag(FLAGS_replicate_kv);
  a.uneven_heads = absl::GetFlag(FLAGS_uneven_heads);
  a.allow_unused_weights = absl::GetFlag(FLAGS_allow_unused_weights);
  a.stop_at_eos = absl::GetFlag(FLAGS_stop_at_eos);
  a.check = absl::GetFlag(FLAGS_check);
  a.quiet = absl::GetFlag(FLAGS_quiet);
  a.save_to = absl::GetFlag(FLAGS_save_to);
  a.ep_size = absl::GetFlag(FLAGS_ep_size);
  if (a.ep_size < 1) return bad("--ep-size", "an integer >= 1", a.ep_size);
  if (a.model.empty()) return absl::InvalidArgumentError("--model DIR|FILE.gguf is required");
  if (!a.text.empty() && !a.prompt.empty()) {
    return absl::InvalidArgumentError("give --prompt TEXT or --prompt-ids, not both");
  }
  if ((a.chat || !a.system.empty()) && a.text.empty()) {
    return absl::InvalidArgumentError("--chat and --system need --prompt TEXT");
  }
  if (!a.system.empty()) a.chat = true;
  if (a.text.empty() && !cli::Given("prompt_ids")) a.prompt = {1};
  return a;
}

std::string MB(int64_t bytes) {
  return bytes < 1000000 ? absl::StrFormat("%.1f KB", bytes / 1e3)
                         : absl::StrFormat("%.2f MB", bytes / 1e6);
}

// The prompt's ids: --prompt-ids as given (no tokenizer: nullptr), or --prompt tokenized (in the chat template with
// --chat), and the ids that end the answer.
absl::StatusOr<std::shared_ptr<const loaders::Tokenizer>> TokenizePrompt(Args& a) {
  if (a.text.empty()) return std::shared_ptr<const loaders::Tokenizer>();
  absl::StatusOr<std::shared_ptr<const loaders::Tokenizer>> tok = loaders::Tokenizer::Load(a.model);
  if (!tok.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--prompt needs the model's tokenizer: ", tok.status().message(),
        " (--prompt-ids takes ids without one)"));
  }
  std::string text = a.text;
  bool add_bos = true;
  if (a.chat) {
    std::vector<loaders::ChatMessage> messages;
    if (!a.system.empty()) messages.push_back({"system", a.system});
    messages.push_back({"user", a.text});
    DT_ASSIGN_OR_RETURN(text, (*tok)->ApplyChatTemplate(messages));
    add_bos = false;  // a template that wants BOS writes it
  }
  DT_ASSIGN_OR_RETURN(a.prompt, (*tok)->Encode(text, add_bos));
  a.stop_ids = (*tok)->stop_ids();
  return *tok;
}

// The prompt against the model's config, before any weight is read: its ids in the vocab, its
// length in the context (refused, or cut with --truncate).
absl::Status FitPrompt(Args& a) {
  DT_ASSIGN_OR_RETURN(const loaders::DecoderConfig c, loaders::LoadDecoderConfig(a.model));
  for (size_t i = 0; i < a.prompt.size(); ++i) {
    if (a.prompt[i] >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt position ", i, ": token id ", a.prompt[i],
                       " is outside the model's vocab [0, ", c.vocab_size, ")"));
    }
  }
  const int64_t n = static_cast<int64_t>(a.prompt.size());
  DT_ASSIGN_OR_RETURN(a.prompt, FitPromptToContext(a.prompt, a.max_new_tokens,
                                                   c.max_position_embeddings, a.truncate));
  a.truncated = n - static_cast<int64_t>(a.prompt.size());
  return absl::OkStatus();
}

absl::StatusOr<GenerateResult> GenerateOn(LlamaForCausalLM& model, const Args& a, bool progress,
                                          const loaders::Tokenizer* tok = nullptr) {
  GenerateOptions g;
  g.max_new_tokens = a.max_new_tokens;
  g.sampling = a.sampling;
  g.stop_token_ids = a.stop_ids;
  g.truncate = a.truncate;
  if (a.stop_at_eos) {
    for (int64_t id : model.config().eos_token_ids) g.stop_token_ids.push_back(id);
  }
  std::optional<loaders::StreamDecoder> stream;
  if (tok != nullptr) {
    stream.emplace(*tok);
    g.on_progress = [&](const GenerateProgress& p) {
      if (std::find(g.stop_token_ids.begin(), g.stop_token_ids.end(), p.token) == g.stop_token_ids.end()) {
        std::fputs(stream->Push(p.token).c_str(), stdout);
        std::fflush(stdout);
      }
    };
  } else if (progress) {
    g.on_progress = [&](const GenerateProgress& p) {
      if (p.step == 1) {
        std::printf("prefill: %zu tokens in %.1f ms, first token %lld\n", a.prompt.size(),
                    p.prefill_seconds * 1e3, static_cast<long long>(p.token));
      } else if (p.step % 8 == 0 || p.step == a.max_new_tokens) {
        std::printf("decode: %lld/%lld tokens, %.1f tokens/s\n", static_cast<long long>(p.step),
                    static_cast<long long>(a.max_new_tokens),
                    p.decode_seconds > 0 ? (p.step - 1) / p.decode_seconds : 0.0);
      }
      std::fflush(stdout);
    };
  }
  absl::StatusOr<GenerateResult> r = model.Generate(a.prompt, g);
  if (stream) std::printf("%s\n", stream->Finish().c_str());
  return r;
}

// Rank 0 only: the same generation on a single rank (threads backend, in this process).
absl::StatusOr<std::vector<int64_t>> SingleRankTokens(const Args& a) {
  std::vector<int64_t> tokens;
  DT_RETURN_IF_ERROR(World::RunThreads(1, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {1}, {"tp"}));
    LlamaLoadOptions o;
    o.dtype = a.dtype;
    o.kv_dtype = a.kv_dtype;
    o.keep_quantized = !a.dtype.has_value();
    o.unused_tensors = a.allow_unused_weights ? PlanCheck::kIgnore : PlanCheck::kError;
    DT_ASSIGN_OR_RETURN(auto model, LlamaForCausalLM::FromPretrained(a.model, mesh, o));
    model->set_check_finite(a.check_finite);
    DT_ASSIGN_OR_RETURN(GenerateResult r, GenerateOn(*model, a, /*progress=*/false));
    tokens = r.tokens;
    return absl::OkStatus();
  }));
  return tokens;
}

absl::Status Run(Args a) {
  DT_ASSIGN_OR_RETURN(std::shared_ptr<const loaders::Tokenizer> tok, TokenizePrompt(a));
  DT_RETURN_IF_ERROR(FitPrompt(a));
  DT_ASSIGN_OR_RETURN(std::shared_ptr<World> world, World::FromEnv());
  DT_ASSIGN_OR_RETURN(DeviceMesh tp, InitDeviceMesh(world, {world->size()}, {"tp"}));
  DistributedConfig dist;
  dist.ep_size = a.ep_size;
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, ModelMesh(world, dist));  // tp, or (ep, tp)
  const bool lead = world->rank() == 0;
  LlamaLoadOptions o;
  o.dtype = a.dtype;
  o.kv_dtype = a.kv_dtype;
  o.keep_quantized = !a.dtype.has_value();
  o.shard_embedding = a.shard_embedding;
  o.replicate_kv = a.replicate_kv;
  o.uneven_heads = a.uneven_heads;
  o.unused_tensors = a.allow_unused_weights ? PlanCheck::kWarn : PlanCheck::kError;
  LlamaLoadReport report;
  DT_ASSIGN_OR_RETURN(auto model,
                      LlamaForCausalLM::FromPretrained(a.model, mesh, dist, o, &report));
  model->set_check_finite(a.check_finite);
  const loaders::LlamaConfig& c = model->config();
  if (lead && !a.quiet) {
    std::printf("model %s: %s, %.2fM parameters\n", a.model.c_str(), c.Summary().c_str(),
                NumParameters(c) / 1e6);
    std::printf("mesh %s, backend %s, compute %s\n", mesh.ToString().c_str(),
                std::string(world->backend()).c_str(), DTypeName(model->dtype()).data());
    for (const LlamaLoadReport::Param& p : report.params) {
      if (p.name.rfind("model.layers.0.", 0) == 0 || p.name.rfind("model.layers.", 0) != 0) {
        std::printf("  %-48s %-5s %-22s full %9s  this rank %9s\n", p.name.c_str(),
                    DTypeName(p.dtype).data(), p.spec.c_str(), MB(p.full_bytes).c_str(),
                    MB(p.local_bytes).c_str());
      }
    }
  }
  std::fflush(stdout);
  DT_RETURN_IF_ERROR(tp.Comm(0).value()->Barrier());
  // Every rank: what it holds and what it read.
  int64_t largest_full = 0, largest_sharded_read = 0;
  for (const LlamaLoadReport::Param& p : report.params) {
    if (p.sharded) {
      largest_full = std::max(largest_full, p.full_bytes);
      largest_sharded_read = std::max(largest_sharded_read, p.read_bytes);
    }
  }
  std::printf(
      "rank %d holds %s of %s (%.0f%%); read %s (mmap views %s, copied %s), peak %s; the largest "
      "sharded weight read here is %s of %s; loaded in %.1f ms\n",
      world->rank(), MB(report.local_bytes).c_str(), MB(report.full_bytes).c_str(),
      100.0 * report.local_bytes / std::max<int64_t>(1, report.full_bytes),
      MB(report.stats.bytes_read()).c_str(), MB(report.stats.bytes_viewed).c_str(),
      MB(report.stats.bytes_copied).c_str(), MB(report.stats.peak_bytes).c_str(),
      MB(largest_sharded_read).c_str(), MB(largest_full).c_str(), report.seconds * 1e3);
  if (const std::string q = report.QuantizedSummary(); !q.empty()) {
    std::printf("rank %d: %s\n", world->rank(), q.c_str());
  }
  for (const std::string& note : report.notes) {
    if (lead) std::printf("plan: %s\n", note.c_str());
  }
  std::fflush(stdout);
  DT_RETURN_IF_ERROR(tp.Comm(0).value()->Barrier());

  if (!a.save_to.empty()) {
    const absl::Time t0 = absl::Now();
    DT_RETURN_IF_ERROR(SaveGathered(*model, a.save_to, model->save_options()));
    if (lead) {
      std::printf("saved the model gathered to %s in %.1f ms\n", a.save_to.c_str(),
                  absl::ToDoubleMilliseconds(absl::Now() - t0));
    }
  }

  if (lead) {
    if (a.truncated > 0) {
      const bool left = a.truncate == PromptTruncation::kLeft;
      std::printf("--truncate %s: the prompt's %lld tokens were cut to their %s %zu to fit the "
                  "model's context of %lld with the new tokens\n",
                  left ? "left" : "right", static_cast<long long>(a.prompt.size() + a.truncated),
                  left ? "last" : "first", a.prompt.size(),
                  static_cast<long long>(c.max_position_embeddings));
    }
    if (tok == nullptr || a.print_ids) {
      std::printf("prompt ids [%s], %lld new tokens at most, %s\n",
                  absl::StrJoin(a.prompt, ",").c_str(), static_cast<long long>(a.max_new_tokens),
                  a.sampling.ToString().c_str());
    }
    if (tok != nullptr) {
      if (a.chat) {
        std::printf("> %s\n", a.text.c_str());
      } else {
        std::fputs(a.text.c_str(), stdout);  // the continuation follows the prompt
      }
    }
    std::fflush(stdout);
  }
  DT_ASSIGN_OR_RETURN(GenerateResult r,
                      GenerateOn(*model, a, lead && !a.quiet, lead ? tok.get() : nullptr));
  if (lead) {
    if (tok == nullptr || a.print_ids) {
      std::printf("generated ids [%s]\n", absl::StrJoin(r.tokens, ",").c_str());
    }
    if (r.stop == StopReason::kContext) {
      std::printf("stopped at the model's context of %lld tokens (%lld prompt + %zu new), before "
                  "--max-new-tokens %lld\n",
                  static_cast<long long>(c.max_position_embeddings),
                  static_cast<long long>(r.prompt_tokens), r.tokens.size(),
                  static_cast<long long>(a.max_new_tokens));
    }
    std::printf("%zu prompt tokens, %zu new: prefill %.1f tokens/s, decode %.1f tokens/s (%s)\n",
                a.prompt.size(), r.tokens.size(), r.prefill_tokens_per_second(),
                r.decode_tokens_per_second(),
                a.ep_size > 1 ? absl::StrCat("ep=", a.ep_size, ", tp=", world->size() / a.ep_size).c_str()
                              : absl::StrCat("tp=", world->size()).c_str());
  }
  if (!a.check) return absl::OkStatus();
  // Rank 0 compares with a single-rank run and tells everyone.
  DT_ASSIGN_OR_RETURN(Tensor verdict, Tensor::FromVector<int64_t>({1}, {0}));
  if (lead) {
    absl::StatusOr<std::vector<int64_t>> single = SingleRankTokens(a);
    const bool same = single.ok() && *single == r.tokens;
    verdict.data<int64_t>()[0] = same ? 1 : 0;
    if (same) {
      std::printf("check: the %zu tokens equal the single-rank run\n", r.tokens.size());
    } else {
      std::printf("check FAILED: single-rank run %s\n",
                  single.ok() ? absl::StrCat("[", absl::StrJoin(*single, ","), "]").c_str()
                              : single.status().ToString().c_str());
    }
  }
  DT_RETURN_IF_ERROR(tp.Comm(0).value()->Broadcast(verdict, 0));
  if (verdict.data<int64_t>()[0] != 1) {
    return absl::InternalError("tensor-parallel tokens differ from the single-rank run");
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace dt::nn

int main(int argc, char** argv) {
  absl::StatusOr<dt::nn::Args> args = dt::nn::ParseArgs(argc, argv);
  if (!args.ok()) {
    std::fprintf(stderr, "generate: %s\n", args.status().ToString().c_str());
    return 2;
  }
  const absl::Status s = dt::nn::Run(*args);
  if (!s.ok()) std::fprintf(stderr, "generate: %s\n", s.ToString().c_str());
  return s.ok() ? 0 : 1;
}
