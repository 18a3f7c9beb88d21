// dtensor: explain and verify layouts and redistributions from the command line.
//
//   dtensor explain   --mesh 4x2 [--names dp,tp] --shape 13,2 --placements 'S(0),S(0)'
//                     [--to 'R,R'] [--dtype f32] [--strategy best|greedy|search] [--json]
//                     [--svg FILE] [--max-ranks N|all] [--cost-model FILE] [--ranks-per-host N]
//   dtensor verify    --mesh 4x2 [--names dp,tp] --shape 13,2 --from 'S(0),S(0)' --to 'R,R'
//                     [--dtype f32] [--backend threads|shm|gloo|mpi] [--seed N]
//                     [--strategy best|greedy|search] [--cost-model FILE] [--ranks-per-host N]
//   dtensor calibrate --bench FILE|- [--intra mpi] [--inter gloo] [--ranks-per-host N]
//                     [--description TEXT] [--out FILE]
//   dtensor styles
//   dtensor inspect   PATH [--tp N] [--plan auto]
//   dtensor tokenize  --model DIR|FILE.gguf [--decode] [--bos] TEXT
//
// explain is pure (an abstract mesh: no processes, any number of ranks). verify distributes random
// data, redistributes it and checks every rank's piece against the direct distribution; with
// --backend gloo or mpi it must run under a launcher with one process per rank:
//   dtrun --nproc-per-node 8 dtensor verify --mesh 4x2 ... --backend gloo
//   mpirun -np 8 dtensor verify --mesh 4x2 ... --backend mpi
// calibrate fits a cost model file (dtensor/cost_model.h) to a bench/collectives run. styles prints
// the tensor-parallel style registry (nn/style_registry.h).
//
// Exit status: 0 success (verify: every rank matches); 1 verify found a mismatch; 2 a bad command
// line or an illegal request (e.g. Shard -> Partial), with a message on stderr.

#include "dtensor/tools/dtensor_cli.h"

#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "dtensor/core/status.h"
#include "dtensor/dtensor/verify.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/style_registry.h"

namespace dt::cli {

absl::StatusOr<Flags> Flags::Parse(int argc, char** argv, const std::vector<std::string>& known,
                                   const std::vector<std::string>& switches) {
  Flags f;
  for (int i = 0; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (!absl::ConsumePrefix(&arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string key(arg), value;
    const size_t eq = key.find('=');
    const bool is_switch = std::find(switches.begin(), switches.end(), key) != switches.end();
    if (eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (!is_switch) {
      if (i + 1 >= argc)
        return absl::InvalidArgumentError(absl::StrCat("--", key, " needs a value"));
      value = argv[++i];
    } else {
      value = "1";
    }
    if (std::find(known.begin(), known.end(), key) == known.end() &&
        std::find(switches.begin(), switches.end(), key) == switches.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", key));
    }
    f.values_[key] = value;
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
    "usage:\n"
    "  dtensor explain   --mesh 4x2 [--names dp,tp] --shape 13,2 --placements 'S(0),S(0)'\n"
    "                    [--to 'R,R'] [--dtype f32] [--strategy best|greedy|search] [--json]\n"
    "                    [--svg FILE] [--max-ranks N|all] [--cost-model FILE] [--ranks-per-host "
    "N]\n"
    "  dtensor verify    --mesh 4x2 [--names dp,tp] --shape 13,2 --from 'S(0),S(0)' --to 'R,R'\n"
    "                    [--dtype f32] [--backend threads|shm|gloo|mpi] [--seed N]\n"
    "                    [--strategy best|greedy|search] [--cost-model FILE] [--ranks-per-host N]\n"
    "  dtensor calibrate --bench FILE|- [--intra mpi] [--inter gloo] [--ranks-per-host N]\n"
    "                    [--description TEXT] [--out FILE]\n"
    "                    (a cost model file from the output of bench/collectives)\n"
    "  dtensor styles    (the tensor-parallel style registry)\n"
    "  dtensor inspect   PATH [--tp N] [--plan auto]\n"
    "                    (a checkpoint's tensors; with --tp, each rank's sharded reads)\n"
    "  dtensor tokenize  --model DIR|FILE.gguf [--decode] [--bos] TEXT\n"
    "                    (TEXT's token ids as a JSON list; --decode: the text of ids 1,2,3)\n"
    "placements: R, S(dim), P(sum|avg|min|max|prod), _S(dim,split_factor), _S(dim,[b0,b1,...])\n"
    "--ranks-per-host N: host h holds ranks h*N .. h*N+N-1; explain marks steps "
    "intra-/cross-host\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "styles") {
    std::fputs(dt::nn::FormatStylesTable().c_str(), stdout);
    return 0;
  }
  const std::vector<std::string> common = {"mesh",     "names",      "shape",         "dtype",
                                           "strategy", "cost-model", "ranks-per-host"};
  auto parse = [&](std::vector<std::string> known,
                   const std::vector<std::string>& switches) -> std::optional<dt::cli::Flags> {
    auto flags = dt::cli::Flags::Parse(argc - 2, argv + 2, known, switches);
    if (!flags.ok()) {
      std::fprintf(stderr, "dtensor %s: %s\n%s", cmd.c_str(),
                   std::string(flags.status().message()).c_str(), kUsage);
      return std::nullopt;
    }
    return *std::move(flags);
  };
  if (cmd == "explain") {
    std::vector<std::string> known = common;
    for (const char* k : {"placements", "to", "svg", "max-ranks"}) known.push_back(k);
    auto flags = parse(known, {"json"});
    return flags ? dt::cli::Explain(*flags) : 2;
  }
  if (cmd == "verify") {
    std::vector<std::string> known = common;
    for (const char* k : {"from", "to", "backend", "seed"}) known.push_back(k);
    auto flags = parse(known, {});
    return flags ? dt::cli::Verify(*flags) : 2;
  }
  if (cmd == "inspect") {
    if (argc < 3 || std::string(argv[2]).rfind("--", 0) == 0) {
      std::fprintf(stderr, "dtensor inspect: needs a PATH\n%s", kUsage);
      return 2;
    }
    auto flags = dt::cli::Flags::Parse(argc - 3, argv + 3, {"tp", "plan"}, {});
    if (!flags.ok()) {
      std::fprintf(stderr, "dtensor inspect: %s\n%s", std::string(flags.status().message()).c_str(),
                   kUsage);
      return 2;
    }
    return dt::cli::Inspect(argv[2], *flags);
  }
  if (cmd == "tokenize") return dt::cli::Tokenize(argc - 2, argv + 2);
  if (cmd == "calibrate") {
    auto flags = parse({"bench", "intra", "inter", "ranks-per-host", "description", "out"}, {});
    return flags ? dt::cli::Calibrate(*flags) : 2;
  }
  std::fprintf(stderr, "dtensor: unknown command '%s'\n%s", cmd.c_str(), kUsage);
  return 2;
}
