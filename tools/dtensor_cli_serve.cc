// `dtensor serve --model DIR|FILE.gguf [--port 8000] [flags]`: the model behind an OpenAI-compatible
// HTTP server (docs/serve.md), its requests decoded together by the continuous-batching engine
// (nn/models/engine.h) over the ranks of the launcher:
//
//   dtrun --nproc-per-node 3 build/bin/dtensor serve --model build/models/SmolLM2-135M-Instruct.Q4_1.gguf
//
// Every rank loads the model as `generate` does (CausalLM::FromPretrained over the world's ranks,
// a GGUF's quantized weights kept as their blocks) and makes its engine with the same options.
// Rank 0 answers HTTP (tools/serve_http.h) and steps the engine, telling the other ranks each
// step's batch; they step until it says stop.
//
// Signals: SIGTERM or SIGINT on rank 0 drains (new requests get 503, the running ones finish,
// then every rank exits 0); a second one stops at once. Under dtrun, which forwards them to every
// rank, the other ranks ignore them and follow rank 0; give dtrun a --grace-period as long as a
// drain may take. A failed step (a rank died or timed out: DT_TIMEOUT_MS) ends the open requests
// with 503 and exits 1.
//
// Exit status: 0 after a drain or stop; 1 when the model, the port or a step fails; 2 for a bad
// command line.

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/tokenizer.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/models/causal_lm.h"
#include "dtensor/nn/models/engine.h"
#include "dtensor/ops/local/cpu/qgemm.h"
#include "dtensor/tools/dtensor_cli.h"
#include "dtensor/tools/serve_http.h"

ABSL_FLAG(std::string, name, "", "the model name requests give (default: --model's file or directory name)");
ABSL_FLAG(std::string, host, "127.0.0.1", "the address to listen on (0.0.0.0: every interface)");
ABSL_FLAG(int, port, 8000, "the port to listen on (0: a free one, printed)");
ABSL_FLAG(int64_t, max_running, 16, "sequences decoded together in one step (max concurrent sequences)");
ABSL_FLAG(int64_t, max_queue, 64, "requests waiting beyond the running ones; past it a request gets 429");
ABSL_FLAG(int64_t, kv_pages, 0, "KV cache pages per rank (0: enough for --max-running full contexts)");
ABSL_FLAG(int64_t, page_tokens, 16, "positions per KV cache page");
ABSL_FLAG(std::string, kv_dtype, "",
          "the KV pages' dtype f32|bf16|f16 (empty: the compute dtype); f16 holds twice the "
          "positions in the same memory and halves what a decode step reads of them");
ABSL_FLAG(int64_t, step_tokens, 256, "tokens per engine step: one per running sequence, the rest prefill");
ABSL_FLAG(int64_t, packed_weights_mb, 1024,
          "MiB of weights' layouts each rank keeps, made at first use: quantized weights' prefill "
          "panels (a batch of more rows than the dot's runs on panels) and oneDNN's reordered "
          "weights where the tuner picks them; 0: made per call (Note [Kept weights])");
ABSL_FLAG(int64_t, max_request_bytes, 1 << 20, "the largest request body; a larger one gets 413");
ABSL_FLAG(double, request_timeout, 600, "seconds a request may take from arrival to its last token; then 504");
ABSL_FLAG(int, http_threads, 0,
          "connections answered at once (0: --max-running + --max-queue + 16); more wait for a thread");
ABSL_FLAG(bool, shard_embedding, false, "embed_tokens as embedding_rowwise (vocab rows split over the ranks)");
ABSL_FLAG(bool, replicate_kv, false, "k_proj / v_proj replicated: any tp that divides the query heads");
ABSL_FLAG(bool, allow_unused_weights, false,
          "serve a checkpoint that holds tensors the model does not read, with a warning naming them "
          "(refused by default, as generate's; Note [Every tensor is used])");
ABSL_FLAG(bool, uneven_heads, false,
          "split the query heads unevenly in whole heads at a tp that does not divide them (9 on 2 "
          "ranks: 5 + 4)");
ABSL_FLAG(int64_t, ep_size, 1, "mixture-of-experts families: experts split over N ranks (as generate's)");

namespace dt::cli {
namespace {

// SIGTERM and SIGINT received by rank 0 (Note [Serving states] in tools/serve_http.h).
std::atomic<int> g_signals{0};

void CountSignal(int) { g_signals.fetch_add(1); }

std::string MB(int64_t bytes) { return absl::StrFormat("%.2f MB", bytes / 1e6); }

struct Config {
  std::string model;
  std::string name;
  nn::EngineOptions engine;
  serve::ServerOptions server;
  nn::CausalLMLoadOptions load;
  nn::DistributedConfig dist;
  int64_t packed_weights_mb = 0;
};

absl::StatusOr<Config> ParseConfig(const Flags& flags) {
  auto bad = [](absl::string_view flag, absl::string_view want, const auto& got) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be ", want, ", got ", got));
  };
  Config c;
  c.model = flags.Get("model");
  if (c.model.empty()) return absl::InvalidArgumentError("--model DIR|FILE.gguf is required");
  c.name = absl::GetFlag(FLAGS_name);
  if (c.name.empty()) {
    std::filesystem::path p(c.model);
    if (!p.has_filename()) p = p.parent_path();  // "dir/"
    c.name = absl::EndsWith(p.filename().string(), ".gguf") ? p.stem().string() : p.filename().string();
  }
  c.engine.max_running = absl::GetFlag(FLAGS_max_running);
  c.engine.max_waiting = absl::GetFlag(FLAGS_max_queue);
  c.engine.kv_pages = absl::GetFlag(FLAGS_kv_pages);
  c.engine.page_tokens = absl::GetFlag(FLAGS_page_tokens);
  c.engine.step_tokens = absl::GetFlag(FLAGS_step_tokens);
  if (c.engine.max_running < 1) return bad("max-running", "an integer >= 1", c.engine.max_running);
  if (c.engine.max_waiting < 0) return bad("max-queue", "an integer >= 0", c.engine.max_waiting);
  c.packed_weights_mb = absl::GetFlag(FLAGS_packed_weights_mb);
  if (c.packed_weights_mb < 0 || c.packed_weights_mb > (1 << 20)) {
    return bad("packed-weights-mb", "an integer in [0, 1048576]", c.packed_weights_mb);
  }
  if (c.engine.kv_pages < 0) return bad("kv-pages", "an integer >= 0 (0: derived)", c.engine.kv_pages);
  if (c.engine.page_tokens < 1) return bad("page-tokens", "an integer >= 1", c.engine.page_tokens);
  if (c.engine.step_tokens < c.engine.max_running) {
    return bad("step-tokens", absl::StrCat("at least --max-running (", c.engine.max_running, ")"),
               c.engine.step_tokens);
  }
  c.server.host = absl::GetFlag(FLAGS_host);
  c.server.port = absl::GetFlag(FLAGS_port);
  if (c.server.port < 0 || c.server.port > 65535) return bad("port", "in [0, 65535]", c.server.port);
  c.server.max_request_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  if (c.server.max_request_bytes < 1) return bad("max-request-bytes", "an integer >= 1", c.server.max_request_bytes);
  const double timeout = absl::GetFlag(FLAGS_request_timeout);
  if (!(timeout > 0) || timeout > 86400 * 7) return bad("request-timeout", "in (0, 604800] seconds", timeout);
  c.server.request_timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000));
  const int threads = absl::GetFlag(FLAGS_http_threads);
  if (threads < 0 || threads > 4096) return bad("http-threads", "in [0, 4096] (0: derived)", threads);
  c.server.http_threads =
      threads > 0 ? threads : static_cast<int>(std::min<int64_t>(4096, c.engine.max_running + c.engine.max_waiting + 16));
  c.server.signals = &g_signals;
  c.load.keep_quantized = true;  // as generate without --dtype: a GGUF's blocks stay as they are
  if (const std::string d = absl::GetFlag(FLAGS_kv_dtype); !d.empty()) {
    absl::StatusOr<DType> kv = ParseDType(d);
    if (!kv.ok() || !IsFloating(*kv)) return bad("kv-dtype", "f32, bf16 or f16", d);
    c.load.kv_dtype = *kv;
  }
  c.load.shard_embedding = absl::GetFlag(FLAGS_shard_embedding);
  c.load.replicate_kv = absl::GetFlag(FLAGS_replicate_kv);
  c.load.unused_tensors =
      absl::GetFlag(FLAGS_allow_unused_weights) ? nn::PlanCheck::kWarn : nn::PlanCheck::kError;
  c.load.uneven_heads = absl::GetFlag(FLAGS_uneven_heads);
  c.dist.ep_size = absl::GetFlag(FLAGS_ep_size);
  if (c.dist.ep_size < 1) return bad("ep-size", "an integer >= 1", c.dist.ep_size);
  return c;
}

// Rank 0: HTTP in front of the engine until a drain, a stop or a failure.
absl::Status Lead(nn::Engine& engine, const Config& c, serve::ModelInfo info, int ranks) {
  serve::Server server(engine, std::move(info), c.server);
  if (absl::Status s = server.Start(); !s.ok()) {
    engine.Stop();  // the other ranks stop with us
    (void)engine.Step();
    return s;
  }
  std::printf("serve: %s on http://%s:%d (%d rank%s, --max-running %lld, --max-queue %lld)\n", c.name.c_str(),
              c.server.host.c_str(), server.port(), ranks, ranks == 1 ? "" : "s",
              static_cast<long long>(c.engine.max_running), static_cast<long long>(c.engine.max_waiting));
  std::fflush(stdout);
  DT_RETURN_IF_ERROR(server.Run());
  std::printf("serve: stopped\n");
  return absl::OkStatus();
}

absl::Status Run(const Config& c) {
  DT_ASSIGN_OR_RETURN(std::shared_ptr<const loaders::Tokenizer> tok, loaders::Tokenizer::Load(c.model));
  DT_ASSIGN_OR_RETURN(std::shared_ptr<World> world, World::FromEnv());
  const bool lead = world->rank() == 0;
  // Rank 0 decides when to stop; the others follow it (and dtrun forwards signals to every rank).
  struct sigaction sa = {};
  sa.sa_handler = lead ? CountSignal : SIG_IGN;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  ops::cpu::qgemm::SetPackedBudget(c.packed_weights_mb << 20);
  nn::LoadReport report;
  DT_ASSIGN_OR_RETURN(std::unique_ptr<nn::CausalLM> model,
                      nn::CausalLM::FromPretrained(c.model, world, c.dist, c.load, &report));
  std::printf("rank %d holds %s of %s; loaded in %.1f ms\n", world->rank(), MB(report.local_bytes).c_str(),
              MB(report.full_bytes).c_str(), report.seconds * 1e3);
  std::fflush(stdout);
  DT_ASSIGN_OR_RETURN(std::unique_ptr<nn::Engine> engine, nn::MakeBatchingEngine(*model, c.engine));
  if (!lead) {
    while (true) {
      absl::StatusOr<std::vector<nn::EngineEvent>> step = engine->Step();
      if (absl::IsCancelled(step.status())) return absl::OkStatus();  // rank 0 stopped the engine
      DT_RETURN_IF_ERROR(step.status());
    }
  }
  serve::ModelInfo info;
  info.name = c.name;
  info.context_length = model->context_length();
  info.vocab_size = model->config().vocab_size;
  info.tokenizer = tok;
  info.stop_ids = tok->stop_ids();
  for (int64_t id : model->config().eos_token_ids) {
    if (std::find(info.stop_ids.begin(), info.stop_ids.end(), id) == info.stop_ids.end()) info.stop_ids.push_back(id);
  }
  return Lead(*engine, c, std::move(info), world->size());
}

}  // namespace

int Serve(const Flags& flags) {
  absl::StatusOr<Config> c = ParseConfig(flags);
  if (!c.ok()) {
    std::fprintf(stderr, "dtensor serve: %s (see dtensor serve --help)\n", std::string(c.status().message()).c_str());
    return 2;
  }
  if (absl::Status s = Run(*c); !s.ok()) {
    std::fprintf(stderr, "dtensor serve: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace dt::cli
