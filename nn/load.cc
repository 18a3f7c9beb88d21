#include "dtensor/nn/load.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "dtensor/core/progress.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/gguf_quants.h"
#include "dtensor/nn/distributed.h"
#include "dtensor/nn/expert_parallel.h"
#include "dtensor/nn/init.h"
#include "dtensor/nn/linear.h"
#include "dtensor/nn/log.h"

namespace dt::nn {
namespace {

std::string SourceOf(const SourceNameFn& source, absl::string_view name) {
  return source ? source(name) : std::string(name);
}

}  // namespace

absl::Status CheckCheckpoint(const Module& module, const loaders::Checkpoint& checkpoint,
                             absl::string_view model, PlanCheck unused,
                             const SourceNameFn& source,
                             const std::vector<std::string>& config_tensors) {
  for (const auto& [name, p] : module.NamedParameters()) {
    const std::string from = SourceOf(source, name);
    absl::StatusOr<const loaders::TensorInfo*> info = checkpoint.Info(from);
    if (!info.ok()) {
      return absl::NotFoundError(absl::StrCat("checkpoint '", checkpoint.path(),
                                              "' has no tensor '", from, "' (parameter '", name,
                                              "' ", DTypeName(p->dtype()),
                                              ShapeToString(p->shape()), ")"));
    }
    if ((*info)->shape != p->shape()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", from, "': expected ",
                                                     ShapeToString(p->shape()), ", got ",
                                                     ShapeToString((*info)->shape)));
    }
    const std::optional<DType> stored = (*info)->dtype;
    if (IsQuantized(p->dtype()) && stored != p->dtype()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", from, "' has dtype ",
                                                     (*info)->dtype_name, "; parameter '", name,
                                                     "' is ", DTypeName(p->dtype())));
    }
    if (!stored || !(IsFloating(*stored) || IsQuantized(*stored))) {
      const std::string supported =
          checkpoint.gguf() != nullptr ? loaders::DequantizableGgmlTypes() : "F32, BF16, F16";
      return absl::UnimplementedError(absl::StrCat(
          "checkpoint '", checkpoint.path(), "': tensor '", from, "' has dtype ",
          (*info)->dtype_name, ", which ", model, " cannot read (supported: ", supported, ")"));
    }
  }
  if (unused == PlanCheck::kIgnore) return absl::OkStatus();
  const std::vector<std::string> names = UnusedTensors(module, checkpoint, source, config_tensors);
  if (names.empty()) return absl::OkStatus();
  const size_t shown = std::min<size_t>(names.size(), 8);
  // Named as the file spells them, with the name the model would have read them by.
  std::vector<std::string> listed;
  for (size_t i = 0; i < shown; ++i) {
    const std::string stored = checkpoint.NameInFile(names[i]);
    listed.push_back(stored == names[i] ? stored : absl::StrCat(stored, " (", names[i], ")"));
  }
  const std::string what =
      absl::StrCat("checkpoint '", checkpoint.path(), "': ", names.size(), " tensor",
                   names.size() == 1 ? " is" : "s are", " not used by ", model, ": ",
                   absl::StrJoin(listed, ", "), names.size() > shown ? ", ..." : "");
  if (unused == PlanCheck::kWarn) {
    LogWarning(what);
    return absl::OkStatus();
  }
  // Note [Every tensor is used]
  return absl::InvalidArgumentError(absl::StrCat(
      what, "; a model that leaves checkpoint weights unread computes something other than "
            "the checkpoint's model (load anyway: unused_tensors = kWarn, "
            "--allow-unused-weights)"));
}

std::vector<std::string> UnusedTensors(const Module& module, const loaders::Checkpoint& checkpoint,
                                       const SourceNameFn& source,
                                       const std::vector<std::string>& config_tensors) {
  std::set<std::string> used(config_tensors.begin(), config_tensors.end());
  for (const auto& [name, p] : module.NamedParameters()) used.insert(SourceOf(source, name));
  std::vector<std::string> unused;
  for (const std::string& n : checkpoint.names()) {
    if (!used.count(n)) unused.push_back(n);
  }
  return unused;
}

absl::Status LoadCheckpoint(Module& module, const loaders::Checkpoint& checkpoint,
                            const loaders::ReadOptions& read, bool progress, LoadReport* report,
                            const SourceNameFn& source) {
  const auto t0 = std::chrono::steady_clock::now();
  LoadReport local;
  LoadReport& r = report != nullptr ? *report : local;
  auto dequantized = std::move(r.dequantized);  // FitQuantized's, before this load
  r = LoadReport();
  r.dequantized = std::move(dequantized);
  int64_t total_bytes = 0, total_params = 0;
  for (const auto& [name, p] : module.NamedParameters()) {
    total_bytes += DTypeBytes(p->dtype(), Numel(p->shape()));
    ++total_params;
  }
  ProgressBar bar("loading", total_bytes, total_params, "tensors", progress);
  DT_RETURN_IF_ERROR(MaterializeParameters(
      module, [&](absl::string_view name, const DTensorSpec& spec) -> absl::StatusOr<Tensor> {
        const int64_t before = r.stats.bytes_read();
        LoadReport::Param p;
        p.name = std::string(name);
        p.checkpoint = SourceOf(source, name);
        p.spec = spec.ToString();
        p.full_bytes = DTypeBytes(spec.dtype(), Numel(spec.shape()));
        p.sharded = spec.NumShards() > 0;
        p.dtype = spec.dtype();
        DT_ASSIGN_OR_RETURN(Tensor piece, checkpoint.ReadLocal(p.checkpoint, spec, read, &r.stats));
        p.local_bytes = piece.nbytes();
        p.read_bytes = r.stats.bytes_read() - before;
        r.full_bytes += p.full_bytes;
        (p.sharded ? r.sharded_full_bytes : r.replicated_bytes) += p.full_bytes;
        r.local_bytes += p.local_bytes;
        r.params.push_back(std::move(p));
        bar.Update(r.full_bytes, static_cast<int64_t>(r.params.size()));
        return piece;
      }));
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return absl::OkStatus();
}

absl::Status CheckBlockCount(const loaders::Checkpoint& checkpoint, absl::string_view prefix,
                             absl::string_view field, int64_t want) {
  std::set<int64_t> seen;
  for (const std::string& name : checkpoint.names()) {
    absl::string_view rest = name;
    if (!absl::ConsumePrefix(&rest, prefix)) continue;
    int64_t i = 0;
    if (absl::SimpleAtoi(rest.substr(0, rest.find('.')), &i) && i >= 0) seen.insert(i);
  }
  const int64_t n = static_cast<int64_t>(seen.size());
  const bool dense = seen.empty() || (*seen.begin() == 0 && *seen.rbegin() == n - 1);
  if (dense && n == want) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "config ", field, " ", want, " does not match checkpoint '", checkpoint.path(),
      "', which holds ", n, " ", prefix, "N blocks", dense ? "" : " (with gaps)"));
}

absl::Status LoadPretrained(Module& module, const DeviceMesh& mesh,
                            const loaders::Checkpoint& checkpoint, const PretrainedLoad& how,
                            LoadReport* report) {
  const bool lead = mesh.my_rank() == mesh.ranks().front();
  const bool quantized = how.keep_quantized && !how.load_whole;
  // Note [One rank runs without the plan's hooks]
  const bool one_rank = mesh.ndim() == 1 && how.ep_plan.empty() && mesh.ranks().size() == 1;
  if (how.keep_quantized && how.load_whole) {
    return absl::InvalidArgumentError(
        absl::StrCat(how.model, ": quantized weights are kept only when each rank reads its own "
                                "blocks, not with load_whole"));
  }
  if (quantized) DT_RETURN_IF_ERROR(KeepQuantized(module, checkpoint, how.source).status());
  // 1-2. The plan's checks, then the placements (Note [One loading path]).
  if (mesh.ndim() == 2 || !how.ep_plan.empty()) {
    if (how.load_whole) {
      return absl::UnimplementedError(absl::StrCat(
          how.model, ": loading whole and sharding afterwards is not implemented on an expert-",
          "parallel mesh ", mesh.ToString(), "; load with the plan (each rank reads its experts)"));
    }
    DT_RETURN_IF_ERROR(
        ParallelizeModuleWithEP(module, mesh, how.plan, how.ep_plan, how.parallelize));
  } else if (how.load_whole || one_rank) {
    DT_RETURN_IF_ERROR(ValidatePlan(module, mesh, how.plan, how.parallelize));
    DT_RETURN_IF_ERROR(ReplicateModule(module, mesh));
  } else {
    DT_RETURN_IF_ERROR(ParallelizeModule(module, mesh, how.plan, how.parallelize));
  }
  if (quantized) DT_RETURN_IF_ERROR(FitQuantized(module, how.quantized_misfit, how.compute, report));
  // 3. The checkpoint, reading nothing.
  if (how.check) DT_RETURN_IF_ERROR(how.check(checkpoint));
  // Every rank refuses alike; one warns.
  const PlanCheck unused =
      how.unused_tensors == PlanCheck::kWarn && !lead ? PlanCheck::kIgnore : how.unused_tensors;
  DT_RETURN_IF_ERROR(CheckCheckpoint(module, checkpoint, how.model, unused, how.source,
                                     how.config_tensors));
  // 4. Each rank's ranges (everything when loading whole).
  DT_RETURN_IF_ERROR(LoadCheckpoint(module, checkpoint, how.read, lead, report, how.source));
  if (!how.load_whole || one_rank) return absl::OkStatus();
  // 5. Sharded in place; the plan's warnings were given in step 1.
  ParallelizeOptions quiet = how.parallelize;
  if (quiet.unused_rules == PlanCheck::kWarn) quiet.unused_rules = PlanCheck::kIgnore;
  if (quiet.uncovered_params == PlanCheck::kWarn) quiet.uncovered_params = PlanCheck::kIgnore;
  return ShardLoaded(module, how.plan, quiet);
}

absl::StatusOr<int64_t> KeepQuantized(Module& module, const loaders::Checkpoint& checkpoint,
                                      const SourceNameFn& source) {
  int64_t kept = 0;
  for (auto& [path, m] : module.NamedModules()) {
    if (dynamic_cast<Linear*>(m) == nullptr && dynamic_cast<Embedding*>(m) == nullptr) continue;
    Parameter* w = m->FindParameter("weight");
    if (w == nullptr || w->materialized()) continue;
    absl::StatusOr<const loaders::TensorInfo*> info =
        checkpoint.Info(SourceOf(source, JoinName(path, "weight")));
    if (!info.ok() || !(*info)->dtype || !IsQuantized(*(*info)->dtype) ||
        (*info)->shape != w->shape()) {
      continue;  // CheckCheckpoint reports what is missing or wrong
    }
    DT_RETURN_IF_ERROR(w->SetDType(*(*info)->dtype));
    ++kept;
  }
  return kept;
}

absl::Status FitQuantized(Module& module, QuantizedMisfit misfit, DType compute,
                          LoadReport* report) {
  for (const auto& [name, p] : module.NamedParameters()) {
    if (!IsQuantized(p->dtype()) || !p->placed()) continue;
    absl::Status fit = loaders::QuantizedShardsFit(name, p->spec());
    if (fit.ok()) continue;
    if (misfit == QuantizedMisfit::kRefuse) return fit;
    const std::string why = absl::StrCat(
        DTypeName(p->dtype()), " -> ", DTypeName(compute), ": its ", p->spec().ToString(),
        " shards are not whole ", DTypeBlock(p->dtype()), "-element blocks");
    DT_RETURN_IF_ERROR(p->SetDType(compute));
    if (report != nullptr) report->dequantized.emplace_back(name, why);
  }
  return absl::OkStatus();
}

std::string LoadReport::QuantizedSummary() const {
  std::map<std::string, int64_t> by_dtype;
  int64_t kept = 0, bytes = 0;
  for (const Param& p : params) {
    if (!IsQuantized(p.dtype)) continue;
    ++by_dtype[std::string(DTypeName(p.dtype))];
    ++kept;
    bytes += p.local_bytes;
  }
  if (kept == 0 && dequantized.empty()) return "";
  std::vector<std::string> types;
  for (const auto& [t, n] : by_dtype) types.push_back(absl::StrCat(t, " x ", n));
  std::string s = absl::StrCat(kept, " weights kept quantized (", absl::StrJoin(types, ", "), "; ",
                               absl::StrFormat("%.2f", bytes / 1e6), " MB here)");
  if (!dequantized.empty()) {
    absl::StrAppend(&s, "; ", dequantized.size(), " dequantized: ", dequantized[0].first, " (",
                    dequantized[0].second, ")", dequantized.size() > 1 ? ", ..." : "");
  }
  return s;
}

}  // namespace dt::nn
