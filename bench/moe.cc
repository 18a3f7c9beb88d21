// bench_moe: a Mixtral-shaped random model (nn/moe.h: 8 experts of intermediate 704, top-2, hidden
// 512, 4 layers, GQA 8 / 4 heads, vocab 4096, f32: 42M parameters, 35M of them in the experts)
// decoding and prefilling on shm processes (this program re-launched under dtrun, which must sit
// next to it): 1 rank, tensor parallel at tp 2 and 4 (every expert split), expert parallel at ep 2
// and 4 on the same ranks as tp (whole experts per rank, tokens dispatched with all_to_all, the
// dense layers split by the tp plan: Note [Expert-parallel layouts] in nn/distributed.h). Each
// process computes with cores / ranks threads (Note [One core budget per node]).
//
//   bench_moe [--quick] [--prompt N] [--decode N] [--reps N]
//
// Per row: prefill and decode tokens/s (rank 0, median of the reps) and their ratio to one rank;
// the all_to_all bytes one rank sends per sparse layer (a decode step, the prefill: the rows it
// dispatches plus the results it returns); the bytes of parameters each rank holds, the experts'
// among them; and each rank's peak RSS.
//
// Targets (RESULT lines):
//   moe_ep4_bytes_vs_share      the bytes a rank holds at ep = 4 against a quarter of the experts
//                               plus the dense part the same rank holds at tp = 4 (the same tp
//                               plan splits it): within 2% (each rank holds its two experts and no
//                               piece of another's)
//   moe_decode_ep2_vs_tp2       ep = 2 decode >= 0.8x tp = 2 decode, same run
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "dtensor/bench/bench_util.h"
#include "dtensor/core/process_stats.h"
#include "dtensor/core/status.h"
#include "dtensor/mesh/comm_counter.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/init.h"
#include "dtensor/nn/models/causal_lm.h"

ABSL_FLAG(bool, worker, false, "run as one rank (what the driver launches under dtrun)");
ABSL_FLAG(int64_t, ep, 1, "worker: the expert-parallel size (tp is the rest of the ranks)");
ABSL_FLAG(int64_t, prompt, 128, "prompt tokens (--quick: at most 64)");
ABSL_FLAG(int64_t, decode, 64, "decoded tokens (--quick: at most 24)");
ABSL_FLAG(int64_t, reps, 5, "repetitions; the median is reported (--quick: at most 3)");

using namespace dt;      // NOLINT: bench brevity
using namespace dt::nn;  // NOLINT

namespace {

loaders::DecoderConfig BenchConfig() {
  loaders::DecoderConfig c;
  c.model_type = "mixtral";
  c.vocab_size = 4096;
  c.hidden_size = 512;
  c.intermediate_size = 704;
  c.moe_intermediate_size = 704;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 64;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.norm_topk_prob = true;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 1e6;
  return c;
}

// What one rank measured (rank 0's speeds and bytes; every rank's holdings and RSS).
struct Row {
  double prefill = 0, decode = 0;                       // tokens/s
  int64_t a2a_prefill = 0, a2a_decode = 0;              // all_to_all bytes per sparse layer
  std::vector<int64_t> held, experts, peak_rss;         // per rank
  int64_t experts_full = 0, dense_full = 0;             // the model's parameter bytes
};

// One rank under dtrun: builds the model on (ep, tp), measures, prints MOE_RANK and (rank 0)
// MOE_ROW lines.
absl::Status Worker(int64_t ep, int64_t prompt_len, int64_t decode, int64_t reps) {
  DT_ASSIGN_OR_RETURN(std::shared_ptr<World> world, World::FromEnv());
  DistributedConfig dist;
  dist.ep_size = ep;
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, ModelMesh(world, dist));
  const loaders::DecoderConfig c = BenchConfig();
  CausalLM model(c, DType::kF32);
  DT_RETURN_IF_ERROR(model.Parallelize(mesh, CausalLM::TPPlan(c),
                                       ep > 1 ? CausalLM::EPPlan(c) : ParallelPlan()));
  DT_RETURN_IF_ERROR(InitRandom(model, 7));
  int64_t held = 0, experts = 0, experts_full = 0, dense_full = 0;
  for (const auto& [name, p] : model.NamedParameters()) {
    const int64_t local = p->value().ToLocal().nbytes();
    const int64_t full = Numel(p->shape()) * DTypeSize(p->dtype());
    const bool expert = absl::StrContains(name, ".mlp.experts.");
    held += local;
    if (expert) {
      experts += local;
      experts_full += full;
    } else {
      dense_full += full;
    }
  }
  std::vector<int64_t> prompt(prompt_len);
  for (int64_t i = 0; i < prompt_len; ++i) prompt[i] = (i * 37 + 11) % c.vocab_size;
  GenerateOptions o;
  o.max_new_tokens = 4;
  DT_RETURN_IF_ERROR(model.Generate(prompt, o).status());  // warm-up (strategy caches)
  // The all_to_all bytes of the prefill and of one decode step, per sparse layer.
  int64_t a2a_prefill = 0, a2a_decode = 0;
  {
    model.ResetCache();
    DT_ASSIGN_OR_RETURN(Tensor ids, Tensor::FromVector<int64_t>({1, prompt_len}, prompt));
    CommCounter counter;
    DT_RETURN_IF_ERROR(model.Logits(ids, /*last_only=*/true).status());
    a2a_prefill = counter.counts().all_to_all_bytes / c.num_hidden_layers;
    DT_ASSIGN_OR_RETURN(Tensor next, Tensor::FromVector<int64_t>({1, 1}, {prompt[0]}));
    CommCounter step;
    DT_RETURN_IF_ERROR(model.Logits(next, /*last_only=*/true).status());
    a2a_decode = step.counts().all_to_all_bytes / c.num_hidden_layers;
  }
  DT_ASSIGN_OR_RETURN(bench::GenerateFigures rates,
                      bench::TimeGenerate(model, prompt, o, decode, reps));
  std::printf("MOE_RANK %d %lld %lld %lld\n", world->rank(), static_cast<long long>(held),
              static_cast<long long>(experts), static_cast<long long>(PeakResidentBytes()));
  std::fflush(stdout);
  DT_ASSIGN_OR_RETURN(CommPtr all, mesh.Comm(mesh.ndim() == 2 ? std::vector<int>{0, 1}
                                                                : std::vector<int>{0}));
  DT_RETURN_IF_ERROR(all->Barrier());
  if (world->rank() == 0) {
    std::printf("MOE_ROW %.3f %.3f %lld %lld %lld %lld\n", rates.prefill, rates.decode,
                static_cast<long long>(a2a_prefill), static_cast<long long>(a2a_decode),
                static_cast<long long>(experts_full), static_cast<long long>(dense_full));
  }
  return absl::OkStatus();
}

// This program on `ranks` shm processes with ep = `ep` (tp the rest).
absl::StatusOr<Row> Measure(int ranks, int64_t ep, int64_t prompt_len, int64_t decode,
                            int64_t reps) {
  DT_ASSIGN_OR_RETURN(const std::string me, bench::SelfPath());
  const std::string dir = me.substr(0, me.rfind('/'));
  const std::string cmd =
      absl::StrCat("DT_BACKEND=shm '", dir, "/dtrun' --nproc-per-node ", ranks, " '", me,
                   "' --worker --ep ", ep, " --prompt ", prompt_len, " --decode ", decode,
                   " --reps ", reps, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return absl::UnavailableError(absl::StrCat("cannot run: ", cmd));
  Row row;
  row.held.assign(ranks, -1);
  row.experts.assign(ranks, -1);
  row.peak_rss.assign(ranks, -1);
  bool got_row = false;
  std::string log;
  char line[4096];
  while (fgets(line, sizeof(line), p)) {
    long long a = 0, b = 0, d = 0, e = 0;
    int r = -1;
    double f = 0, g = 0;
    if (const char* s = std::strstr(line, "MOE_RANK ");
        s != nullptr && std::sscanf(s, "MOE_RANK %d %lld %lld %lld", &r, &a, &b, &d) == 4 &&
        r >= 0 && r < ranks) {
      row.held[r] = a;
      row.experts[r] = b;
      row.peak_rss[r] = d;
    } else if (const char* s2 = std::strstr(line, "MOE_ROW ");
               s2 != nullptr && std::sscanf(s2, "MOE_ROW %lf %lf %lld %lld %lld %lld", &f, &g, &a,
                                            &b, &d, &e) == 6) {
      row.prefill = f;
      row.decode = g;
      row.a2a_prefill = a;
      row.a2a_decode = b;
      row.experts_full = d;
      row.dense_full = e;
      got_row = true;
    } else {
      log += line;
    }
  }
  if (pclose(p) != 0 || !got_row) {
    return absl::UnavailableError(absl::StrCat("shm x", ranks, " ep ", ep, " failed (", cmd,
                                               "):\n", log));
  }
  return row;
}

std::string MB(int64_t bytes) { return absl::StrFormat("%.1f MB", bytes / 1e6); }

}  // namespace

int main(int argc, char** argv) {
  const bool quick = dt::bench::ParseBenchFlags(
      argc, argv, "usage: bench_moe [--quick] [--prompt N] [--decode N] [--reps N]");
  int64_t prompt = absl::GetFlag(FLAGS_prompt), decode = absl::GetFlag(FLAGS_decode),
          reps = absl::GetFlag(FLAGS_reps);
  if (prompt < 1 || decode < 1 || reps < 1) {
    std::fprintf(stderr, "bench_moe: --prompt, --decode and --reps must be >= 1\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_worker)) {
    const absl::Status s = Worker(absl::GetFlag(FLAGS_ep), prompt, decode, reps);
    if (!s.ok()) {
      std::fprintf(stderr, "bench_moe worker: %s\n", s.ToString().c_str());
      return 1;
    }
    return 0;
  }
  if (quick) {
    prompt = std::min<int64_t>(prompt, 64);
    decode = std::min<int64_t>(decode, 24);
    reps = std::min<int64_t>(reps, 3);
  }
  const loaders::DecoderConfig c = BenchConfig();
  std::printf(
      "bench_moe: %s, %.1fM parameters; prompt %lld tokens, decode %lld tokens, median of %lld; "
      "shm processes under dtrun, %u hardware threads shared by the ranks of a row\n",
      c.Summary().c_str(), NumParameters(c) / 1e6, static_cast<long long>(prompt),
      static_cast<long long>(decode), static_cast<long long>(reps),
      std::thread::hardware_concurrency());
  std::printf("%-8s %13s %13s %9s %9s %15s %15s %24s %22s\n", "ranks", "prefill tok/s",
              "decode tok/s", "pre/1rk", "dec/1rk", "a2a B/layer pre", "a2a B/layer dec",
              "held per rank (experts)", "peak RSS per rank");
  struct Layout {
    const char* name;
    int ranks;
    int64_t ep;
  };
  std::map<std::string, Row> rows;
  for (const Layout& l : std::vector<Layout>{{"1 rank", 1, 1}, {"tp 2", 2, 1}, {"tp 4", 4, 1},
                                            {"ep 2", 2, 2}, {"ep 4", 4, 4}}) {
    absl::StatusOr<Row> r = Measure(l.ranks, l.ep, prompt, decode, reps);
    if (!r.ok()) {
      std::fprintf(stderr, "bench_moe: %s: %s\n", l.name, r.status().ToString().c_str());
      return 1;
    }
    const Row& one = rows.count("1 rank") ? rows.at("1 rank") : *r;
    const int64_t held = *std::max_element(r->held.begin(), r->held.end());
    const int64_t experts = *std::max_element(r->experts.begin(), r->experts.end());
    const int64_t rss = *std::max_element(r->peak_rss.begin(), r->peak_rss.end());
    std::printf("%-8s %13.1f %13.1f %9.2f %9.2f %15lld %15lld %24s %22s\n", l.name, r->prefill,
                r->decode, r->prefill / one.prefill, r->decode / one.decode,
                static_cast<long long>(r->a2a_prefill), static_cast<long long>(r->a2a_decode),
                absl::StrCat(MB(held), " (", MB(experts), ")").c_str(),
                absl::StrCat(MB(rss), " max").c_str());
    std::fflush(stdout);
    rows[l.name] = *std::move(r);
  }
  const Row& ep4 = rows.at("ep 4");
  const Row& tp4 = rows.at("tp 4");
  double worst = 1.0;
  for (size_t i = 0; i < ep4.held.size(); ++i) {
    const double share = ep4.experts_full / 4.0 + (tp4.held[i] - tp4.experts[i]);
    if (std::abs(ep4.held[i] / share - 1.0) > std::abs(worst - 1.0)) worst = ep4.held[i] / share;
  }
  std::printf("ep = 4: the experts %s, the rest %s (rank 0 holds %s of it at tp = 4); a quarter of "
              "the experts plus that is %s on rank 0\n",
              MB(ep4.experts_full).c_str(), MB(ep4.dense_full).c_str(),
              MB(tp4.held[0] - tp4.experts[0]).c_str(),
              MB(ep4.experts_full / 4 + tp4.held[0] - tp4.experts[0]).c_str());
  std::printf("RESULT moe_ep4_bytes_vs_share %.4f 1.00+-0.02 %s\n", worst,
              bench::Verdict(std::abs(worst - 1.0) <= 0.02));
  const double ep_vs_tp = rows.at("ep 2").decode / rows.at("tp 2").decode;
  std::printf("RESULT moe_decode_ep2_vs_tp2 %.2f 0.8 %s\n", ep_vs_tp,
              bench::Verdict(ep_vs_tp >= 0.8));
  return 0;
}
