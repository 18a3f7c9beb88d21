#include "dtensor/nn/check.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "dtensor/core/status.h"
#include "dtensor/dtensor/dtensor.h"
#include "dtensor/nn/init.h"

namespace dt::nn {
namespace {

// The whole value of an output on the CPU.
absl::StatusOr<Tensor> Whole(const Value& v) {
  DT_ASSIGN_OR_RETURN(Tensor full, WholeTensor(v));
  return full.To(kCPU);
}

// {max |a - b|, 1 if any element is out of tolerance} on this rank.
std::pair<double, bool> Compare(const Tensor& got, const Tensor& want, double atol, double rtol) {
  const std::vector<double> a = got.ToDoubles(), b = want.ToDoubles();
  double max_diff = 0;
  bool bad = false;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = std::fabs(a[i] - b[i]);
    if (std::isnan(d)) d = std::numeric_limits<double>::infinity();
    max_diff = std::max(max_diff, d);
    bad = bad || d > atol + rtol * std::fabs(b[i]);
  }
  return {max_diff, bad};
}

// The element-wise max of `values` over the ranks of `mesh` (a P(max) -> R redistribution).
absl::StatusOr<std::vector<float>> MaxOverRanks(std::vector<float> values, const DeviceMesh& mesh) {
  DT_ASSIGN_OR_RETURN(Tensor t,
                      Tensor::FromVector<float>({static_cast<int64_t>(values.size())}, values));
  DT_ASSIGN_OR_RETURN(
      DTensor partial,
      DTensor::FromLocal(t, mesh, Placements(mesh.ndim(), Placement::Partial(ReduceOp::kMax))));
  DT_ASSIGN_OR_RETURN(DTensor r,
                      partial.Redistribute(Placements(mesh.ndim(), Placement::Replicate())));
  DT_ASSIGN_OR_RETURN(Tensor local, r.ToLocal().To(kCPU));
  return local.ToVector<float>();
}

}  // namespace

bool ParallelCheck::ok() const {
  return std::all_of(outputs.begin(), outputs.end(), [](const OutputCheck& o) { return o.ok; });
}

double ParallelCheck::max_abs_diff() const {
  double d = 0;
  for (const OutputCheck& o : outputs) d = std::max(d, o.max_abs_diff);
  return d;
}

std::string ParallelCheck::ToString() const {
  std::string out;
  for (const OutputCheck& o : outputs) {
    absl::StrAppend(&out, out.empty() ? "" : "\n",
                    absl::StrFormat("tp=%d %s: output %d %s max |diff| %.2e %s", tp_size, mesh,
                                    o.index, o.describe, o.max_abs_diff,
                                    o.ok ? "ok" : "OUT OF TOLERANCE"));
  }
  return out;
}

absl::Status ParallelCheck::status() const {
  std::string bad;
  for (const OutputCheck& o : outputs) {
    if (o.ok) continue;
    absl::StrAppend(&bad, bad.empty() ? "" : "; ",
                    absl::StrFormat("output %d %s differs by up to %.3g", o.index, o.describe,
                                    o.max_abs_diff));
  }
  if (bad.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat(
      "the tensor-parallel model on %s does not compute what the replicated one does: %s "
      "(tolerance %g + %g * |ref|); look for a fused projection cut by a plain style, a rowwise "
      "layer fed the wrong slices or a missing reduction in the plan",
      mesh, bad, atol, rtol));
}

absl::StatusOr<ParallelCheck> CheckParallel(const ModelFactory& make_model, const DeviceMesh& mesh,
                                            const ParallelPlan& plan, const Values& inputs,
                                            const CheckParallelOptions& options) {
  if (!make_model) return absl::InvalidArgumentError("CheckParallel: no model factory");
  std::unique_ptr<Module> tp = make_model(), ref = make_model();
  if (tp == nullptr || ref == nullptr) {
    return absl::InvalidArgumentError("CheckParallel: the model factory returned nullptr");
  }
  DT_RETURN_IF_ERROR(ParallelizeModule(*tp, mesh, plan, options.parallelize));
  DT_RETURN_IF_ERROR(ReplicateModule(*ref, mesh));
  DT_RETURN_IF_ERROR(InitRandom(*tp, options.seed));
  DT_RETURN_IF_ERROR(InitRandom(*ref, options.seed));
  DT_ASSIGN_OR_RETURN(Values want, ref->Call(inputs));
  DT_ASSIGN_OR_RETURN(Values got, tp->Call(inputs));
  if (got.size() != want.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CheckParallel: the tensor-parallel ", tp->type_name(), " returned ", got.size(),
        " outputs, the replicated one ", want.size()));
  }

  ParallelCheck report;
  report.tp_size = mesh.Size();
  report.mesh = mesh.ToString();
  report.atol = options.atol;
  report.rtol = options.rtol;
  std::vector<float> local;  // per output: max diff, out of tolerance (0/1)
  for (size_t i = 0; i < got.size(); ++i) {
    OutputCheck o;
    o.index = static_cast<int>(i);
    if (!want[i].defined() || !got[i].defined()) {
      if (want[i].defined() != got[i].defined()) {
        return absl::InvalidArgumentError(
            absl::StrCat("CheckParallel: output ", i, " is undefined in only one of the models"));
      }
      o.describe = "undefined";
      report.outputs.push_back(o);
      local.insert(local.end(), {0.0f, 0.0f});
      continue;
    }
    DT_ASSIGN_OR_RETURN(Tensor w, Whole(want[i]));
    DT_ASSIGN_OR_RETURN(Tensor g, Whole(got[i]));
    o.describe = absl::StrCat(DTypeName(w.dtype()), ShapeToString(w.shape()));
    if (g.shape() != w.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CheckParallel: output ", i, " of the tensor-parallel ", tp->type_name(), " is ",
          got[i].Describe(), " but the replicated model gives ", want[i].Describe(),
          got[i].is_local() ? "; a local output must be whole to compare: gather it (e.g. "
                              "colwise_gather_output on the last layer) or keep DTensors"
                            : ""));
    }
    const auto [diff, bad] = Compare(g, w, options.atol, options.rtol);
    local.push_back(static_cast<float>(diff));
    local.push_back(bad ? 1.0f : 0.0f);
    report.outputs.push_back(o);
  }
  DT_ASSIGN_OR_RETURN(std::vector<float> all, MaxOverRanks(std::move(local), mesh));
  for (size_t i = 0; i < report.outputs.size(); ++i) {
    report.outputs[i].max_abs_diff = all[2 * i];
    report.outputs[i].ok = all[2 * i + 1] == 0.0f;
  }
  return report;
}

}  // namespace dt::nn
