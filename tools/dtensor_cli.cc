// dtensor: explain and verify layouts and redistributions from the command line, and serve a model.
//
//   dtensor explain | verify | calibrate | styles | inspect | tokenize | serve [flags]
//
// `dtensor --help` lists the subcommands, `dtensor <subcommand> --help` its flags with their
// defaults and meanings (tools/flags.h). explain is pure (an abstract mesh: no processes, any
// number of ranks). verify distributes random data, redistributes it and checks every rank's piece
// against the direct distribution; with --backend gloo or mpi it must run under a launcher with one
// process per rank:
//   dtrun --nproc-per-node 8 dtensor verify --mesh 4x2 ... --backend gloo
//   mpirun -np 8 dtensor verify --mesh 4x2 ... --backend mpi
// calibrate prints the kernel tuner's choices on this CPU (ops/local/cpu/tuner.h), or fits a cost
// model file (dtensor/cost_model.h) to a bench/collectives run. styles prints
// the tensor-parallel style registry (nn/style_registry.h). serve answers the OpenAI API over the
// ranks of its launcher (docs/serve.md):
//   dtrun --nproc-per-node 3 dtensor serve --model SmolLM2-135M-Instruct.Q4_1.gguf --port 8000
//
// Exit status: 0 success (verify: every rank matches); 1 verify found a mismatch; 2 a bad command
// line or an illegal request (e.g. Shard -> Partial), with a message on stderr.

#include "dtensor/tools/dtensor_cli.h"

#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "dtensor/core/status.h"
#include "dtensor/dtensor/verify.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/models/style_users.h"
#include "dtensor/nn/style_registry.h"
#include "dtensor/tools/flags.h"

// Flags of explain and verify (and --ranks-per-host of calibrate); each subcommand's own beside it.
ABSL_FLAG(std::string, mesh, "", "mesh sizes, e.g. 4x2 (required)");
ABSL_FLAG(std::string, names, "", "mesh dim names, e.g. dp,tp (default: d0,d1,...)");
ABSL_FLAG(std::string, shape, "", "the global tensor shape, e.g. 13,2 ('scalar' for none; required)");
ABSL_FLAG(std::string, dtype, "f32", "the element type: f32, f16, bf16, i64, i32, u8, bool");
ABSL_FLAG(std::string, strategy, "best", "planner strategy: best, greedy or search");
ABSL_FLAG(std::string, cost_model, "", "a cost model file (dtensor calibrate) to price plans with");
ABSL_FLAG(std::string, ranks_per_host, "",
          "host h holds ranks h*N .. h*N+N-1 (0: one host); overrides the cost model file's");
ABSL_FLAG(std::string, to, "", "the target placements, e.g. 'R,R'");
ABSL_FLAG(std::string, from, "", "verify: the source placements, e.g. 'S(0),S(0)' (required)");
ABSL_FLAG(std::string, backend, "threads", "verify: threads, shm, gloo or mpi (not threads: under a launcher)");
ABSL_FLAG(std::string, seed, "0", "verify: the seed of the random data");
// tokenize and serve.
ABSL_FLAG(std::string, model, "",
          "the model: a directory (config.json, safetensors, tokenizer.json) or a GGUF file (required)");

namespace dt::cli {

Flags Flags::Parse(const std::string& command, int argc, char** argv, const std::vector<std::string>& names,
                   absl::string_view usage) {
  std::vector<char*> args = {const_cast<char*>(command.c_str())};
  args.insert(args.end(), argv, argv + argc);
  Flags f;
  f.positional_ = ParseFlags(static_cast<int>(args.size()), args.data(), usage, {.only = names});
  f.positional_.erase(f.positional_.begin());
  for (const std::string& name : names) {
    if (!Given(name)) continue;
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    const std::string value = flag->CurrentValue();
    if (flag->IsOfType<bool>() && value == "false") continue;  // --nojson
    f.values_[absl::StrReplaceAll(name, {{"_", "-"}})] = value;
  }
  return f;
}

std::string Flags::Get(const std::string& key, const std::string& fallback) const {
  auto it = values_.find(key);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<std::string> Flags::Required(const std::string& key) const {
  if (!Has(key)) return absl::InvalidArgumentError(absl::StrCat("missing --", key));
  return Get(key);
}

absl::StatusOr<std::vector<int64_t>> Flags::Mesh() const {
  DT_ASSIGN_OR_RETURN(std::string text, Required("mesh"));
  std::vector<int64_t> mesh;
  for (absl::string_view part : absl::StrSplit(text, absl::ByAnyChar("x,"))) {
    int64_t k = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &k) || k < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad --mesh '", text, "': expected sizes >= 1 like 4x2"));
    }
    mesh.push_back(k);
  }
  return mesh;
}

absl::StatusOr<std::vector<std::string>> Flags::Names() const {
  if (!Has("names")) return std::vector<std::string>{};
  return std::vector<std::string>(absl::StrSplit(Get("names"), ','));
}

absl::StatusOr<Shape> Flags::TensorShape() const {
  DT_ASSIGN_OR_RETURN(std::string text, Required("shape"));
  if (text == "''" || text == "scalar") return Shape{};
  return ParseShape(text);
}

absl::StatusOr<Placements> Flags::PlacementList(const std::string& key) const {
  DT_ASSIGN_OR_RETURN(std::string text, Required(key));
  auto p = ParsePlacements(text);
  if (!p.ok())
    return absl::InvalidArgumentError(absl::StrCat("--", key, ": ", p.status().message()));
  return p;
}

absl::StatusOr<DType> Flags::Dtype() const { return ParseDType(Get("dtype", "f32")); }

absl::StatusOr<PlannerOptions> Flags::Planner() const {
  PlannerOptions options;
  options.allow_partial = true;  // the CLI explains and verifies every plan, internal ones too
  const std::string s = Get("strategy", "best");
  if (s == "best") {
    options.strategy = PlannerOptions::Strategy::kBest;
  } else if (s == "greedy") {
    options.strategy = PlannerOptions::Strategy::kGreedy;
  } else if (s == "search") {
    options.strategy = PlannerOptions::Strategy::kSearch;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("bad --strategy '", s, "': expected best, greedy or search"));
  }
  if (Has("cost-model")) {
    DT_ASSIGN_OR_RETURN(options.cost, LoadCostModel(Get("cost-model")));
  }
  if (Has("ranks-per-host")) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(Get("ranks-per-host"), &n) || n < 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad --ranks-per-host '",
                                                     Get("ranks-per-host"),
                                                     "': expected an integer >= 0 (0: one host)"));
    }
    options.cost.ranks_per_host = n;
  }
  return options;
}

namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "dtensor: %s\n", std::string(s.message()).c_str());
  return 2;
}

void PrintReport(const VerifyRequest& req, const VerifyReport& report, int world_size,
                 absl::string_view backend) {
  std::printf("verify %s%s %s on mesh %s (%d ranks, %s)\n", DTypeName(req.dtype).data(),
              ShapeToString(req.shape).c_str(), PlacementsToString(req.from).c_str(),
              absl::StrJoin(req.mesh, "x").c_str(), world_size, std::string(backend).c_str());
  std::printf("plan: %s\n", report.plan.c_str());
  std::printf("collectives: %s\n", report.counts.ToString().c_str());
}

}  // namespace

int Verify(const Flags& flags) {
  VerifyRequest req;
  auto parse = [&]() -> absl::Status {
    DT_ASSIGN_OR_RETURN(req.mesh, flags.Mesh());
    DT_ASSIGN_OR_RETURN(req.names, flags.Names());
    DT_ASSIGN_OR_RETURN(req.shape, flags.TensorShape());
    DT_ASSIGN_OR_RETURN(req.from, flags.PlacementList("from"));
    DT_ASSIGN_OR_RETURN(req.to, flags.PlacementList("to"));
    DT_ASSIGN_OR_RETURN(req.dtype, flags.Dtype());
    DT_ASSIGN_OR_RETURN(req.planner, flags.Planner());
    if (!absl::SimpleAtoi(flags.Get("seed", "0"), &req.seed)) {
      return absl::InvalidArgumentError(absl::StrCat("bad --seed '", flags.Get("seed"), "'"));
    }
    // Validate the request before starting any rank: an illegal one is a clear error (exit 2).
    DT_ASSIGN_OR_RETURN(DeviceMesh abstract, DeviceMesh::Abstract(req.mesh, req.names));
    DT_ASSIGN_OR_RETURN(DTensorSpec src,
                        DTensorSpec::Create(abstract, req.from, req.shape, req.dtype));
    DT_ASSIGN_OR_RETURN(DTensorSpec dst,
                        DTensorSpec::Create(abstract, req.to, req.shape, req.dtype));
    return PlanRedistribute(src, dst, req.planner).status();
  };
  if (absl::Status s = parse(); !s.ok()) return Fail(s);
  const std::string backend = flags.Get("backend", "threads");
  int64_t n = 1;
  for (int64_t k : req.mesh) n *= k;

  WorldOptions options;
  options.backend = backend;
  options.timeout = std::chrono::seconds(60);
  std::mutex mu;
  std::vector<std::string> errors;
  std::optional<VerifyReport> first;
  int world_size = static_cast<int>(n);
  bool print = true;
  auto run = [&](const std::shared_ptr<World>& world) -> absl::Status {
    DT_ASSIGN_OR_RETURN(VerifyReport report, VerifyRedistribute(world, req));
    std::lock_guard<std::mutex> lock(mu);
    if (world->rank() == 0 || backend != "threads") first = report;
    errors.insert(errors.end(), report.errors.begin(), report.errors.end());
    return absl::OkStatus();
  };
  absl::Status status;
  if (backend == "threads") {
    status = World::RunThreads(
        static_cast<int>(n), [&](World& w) { return run(w.shared_from_this()); }, options);
  } else {
    auto world = World::FromEnv(options);
    if (!world.ok()) return Fail(world.status());
    world_size = (*world)->size();
    print = (*world)->rank() == 0;
    if (world_size != n) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("mesh ", absl::StrJoin(req.mesh, "x"), " needs ", n, " ranks but this ",
                       backend, " job has ", world_size, "; launch with: ",
                       backend == "mpi" ? absl::StrCat("mpirun -np ", n)
                                        : absl::StrCat("dtrun --nproc-per-node ", n),
                       " dtensor verify ... --backend ", backend)));
    }
    status = run(*world);
    if (status.ok() && !print) {  // other ranks: report their own mismatches (dtrun prefixes them)
      for (const std::string& e : errors) std::fprintf(stderr, "  %s\n", e.c_str());
      return first->ok ? 0 : 1;
    }
  }
  if (!status.ok()) return Fail(status);
  if (!first) return Fail(absl::InternalError("rank 0 produced no report"));
  if (print) {
    PrintReport(req, *first, world_size, backend);
    for (const std::string& e : errors) std::printf("  %s\n", e.c_str());
    if (first->ok) {
      std::printf("OK: every rank's piece of %s equals the direct distribution (%d ranks)\n",
                  PlacementsToString(req.to).c_str(), world_size);
    } else {
      std::printf("FAILED: %d of %d ranks differ from the direct distribution\nreproduce: %s\n",
                  first->failing_ranks, world_size, VerifyCommand(req, backend).c_str());
    }
  }
  return first->ok ? 0 : 1;
}

}  // namespace dt::cli

namespace {

constexpr const char* kUsage =
    "usage: dtensor explain | verify | calibrate | styles | inspect | tokenize | serve [flags]\n"
    "  explain    a layout and a redistribution plan on an abstract mesh (text, --json, --svg)\n"
    "  verify     redistribute random data on real ranks and check every piece\n"
    "  calibrate  this CPU's kernel choices (--again: measured again); with --bench, a cost model\n"
    "             file from the output of bench/collectives\n"
    "  styles     the tensor-parallel style registry\n"
    "  inspect    PATH: a checkpoint's tensors; with --tp, each rank's sharded reads\n"
    "  tokenize   TEXT: its token ids as a JSON list (--decode: the text of ids 1,2,3)\n"
    "  serve      the OpenAI API (completions, chat, streaming) over the ranks of its launcher\n"
    "`dtensor <subcommand> --help` lists its flags.\n"
    "placements: R, S(dim), P(sum|avg|min|max|prod), _S(dim,split_factor), _S(dim,[b0,b1,...])";

struct Subcommand {
  const char* name;
  const char* usage;
  std::vector<std::string> flags;  // abseil names
};

const std::vector<std::string> kLayoutFlags = {"mesh",     "names",      "shape",         "dtype",
                                               "strategy", "cost_model", "ranks_per_host"};

std::vector<std::string> Plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  using dt::cli::Flags;
  const std::string cmd = argc >= 2 ? argv[1] : "";
  if (argc < 2 || cmd == "--help" || cmd == "-h") {
    std::fprintf(argc < 2 ? stderr : stdout, "%s\n", kUsage);
    return argc < 2 ? 2 : 0;
  }
  const std::vector<Subcommand> subcommands = {
      {"explain",
       "usage: dtensor explain --mesh 4x2 --shape 13,2 --placements 'S(0),S(0)' [--to 'R,R'] [flags]\n"
       "a layout and, with --to, the redistribution plan, on an abstract mesh (no processes)",
       Plus(kLayoutFlags, {"placements", "to", "svg", "max_ranks", "json"})},
      {"verify",
       "usage: dtensor verify --mesh 4x2 --shape 13,2 --from 'S(0),S(0)' --to 'R,R' [flags]\n"
       "redistributes random data on real ranks and checks every rank's piece",
       Plus(kLayoutFlags, {"from", "to", "backend", "seed"})},
      {"calibrate",
       "usage: dtensor calibrate [--again] | --bench FILE|- [flags]\n"
       "this CPU's kernel choices and the figures behind them (Note [Tuner]; --again measures every\n"
       "knob again); with --bench, a cost model file from the output of bench/collectives",
       {"again", "bench", "intra", "inter", "ranks_per_host", "description", "out"}},
      {"styles", "usage: dtensor styles\nthe tensor-parallel style registry", {}},
      {"inspect", "usage: dtensor inspect PATH [--tp N] [--plan auto]\na checkpoint's tensors; with --tp, each rank's reads",
       {"tp", "plan"}},
      {"tokenize",
       "usage: dtensor tokenize --model DIR|FILE.gguf [--decode] [--bos] TEXT\n"
       "TEXT's token ids as a JSON list; with --decode, the text of the ids in TEXT",
       {"model", "decode", "bos"}},
      {"serve",
       "usage: [dtrun --nproc-per-node N] dtensor serve --model DIR|FILE.gguf [--port 8000] [flags]\n"
       "the OpenAI API (POST /v1/completions, /v1/chat/completions; GET /v1/models, /health,\n"
       "/metrics) in front of the continuous-batching engine; rank 0 answers HTTP (docs/serve.md)",
       {"model", "name", "host", "port", "max_running", "max_queue", "kv_pages", "page_tokens", "kv_dtype", "step_tokens",
        "max_request_bytes", "request_timeout", "http_threads", "shard_embedding", "replicate_kv", "uneven_heads", "ep_size"}},
  };
  for (const Subcommand& sub : subcommands) {
    if (cmd != sub.name) continue;
    const std::string program = std::string("dtensor ") + sub.name;
    // With no flags to allow, only --help passes: `only` must not be empty.
    std::vector<std::string> only = sub.flags.empty() ? std::vector<std::string>{"help"} : sub.flags;
    Flags flags = Flags::Parse(program, argc - 2, argv + 2, only, sub.usage);
    const std::vector<std::string>& rest = flags.positional();
    const bool wants_one = cmd == "inspect" || cmd == "tokenize";
    if (rest.size() != (wants_one ? 1u : 0u)) {
      std::fprintf(stderr, "%s: %s (see %s --help)\n", program.c_str(),
                   wants_one ? (rest.empty() ? "needs one positional argument" : "takes one positional argument")
                             : absl::StrCat("unexpected argument '", rest.front(), "'").c_str(),
                   program.c_str());
      return 2;
    }
    if (cmd == "explain") return dt::cli::Explain(flags);
    if (cmd == "verify") return dt::cli::Verify(flags);
    if (cmd == "calibrate") return dt::cli::Calibrate(flags);
    if (cmd == "inspect") return dt::cli::Inspect(rest.front(), flags);
    if (cmd == "tokenize") return dt::cli::Tokenize(rest.front(), flags);
    if (cmd == "serve") return dt::cli::Serve(flags);
    std::fputs(dt::nn::FormatStylesTable().c_str(), stdout);
    std::fputs(("\n" + dt::nn::FormatStyleUsers()).c_str(), stdout);
    return 0;
  }
  std::fprintf(stderr, "dtensor: unknown command '%s'\n%s\n", cmd.c_str(), kUsage);
  return 2;
}
