#include "dtensor/dtensor/verify.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"
#include "dtensor/dtensor/dtensor.h"

namespace dt {

std::string VerifyCommand(const VerifyRequest& r, absl::string_view backend) {
  std::string cmd = absl::StrCat("dtensor verify --mesh ", absl::StrJoin(r.mesh, "x"));
  if (!r.names.empty()) absl::StrAppend(&cmd, " --names ", absl::StrJoin(r.names, ","));
  absl::StrAppend(&cmd, " --shape ", r.shape.empty() ? "''" : absl::StrJoin(r.shape, ","),
                  " --from '", PlacementsToCompactString(r.from), "' --to '",
                  PlacementsToCompactString(r.to), "' --dtype ", DTypeName(r.dtype), " --seed ",
                  r.seed);
  if (backend != "threads") absl::StrAppend(&cmd, " --backend ", backend);
  return cmd;
}

absl::StatusOr<Tensor> VerifyTensor(IntSpan shape, DType dtype, uint64_t seed) {
  DT_ASSIGN_OR_RETURN(Tensor u, Tensor::Rand(shape, seed, DType::kF32));
  if (IsFloating(dtype)) return u.To(dtype);
  std::vector<double> v = u.ToDoubles();
  for (double& x : v) {
    x = dtype == DType::kBool ? (x < 0.5 ? 0.0 : 1.0)
        : dtype == DType::kU8 ? static_cast<double>(static_cast<int>(x * 100))
                              : static_cast<double>(static_cast<int>(x * 100) - 50);
  }
  return Tensor::FromDoubles(shape, v, dtype);
}

namespace {

// Whether redistributing from -> to reduces a Partial (so float results may round differently).
bool Reduces(const Placements& from, const Placements& to) {
  for (size_t i = 0; i < from.size(); ++i) {
    if (from[i].is_partial() && from[i] != to[i]) return true;
  }
  return false;
}

absl::Status Compare(const Tensor& got, const Tensor& want, bool tolerant) {
  if (tolerant && IsFloating(got.dtype())) {
    const double tol = got.dtype() == DType::kF32 ? 1e-5 : 2e-2;
    return AllClose(got, want, tol, tol);
  }
  if (Equal(got, want)) return absl::OkStatus();
  if (got.shape() != want.shape()) {
    return absl::InternalError(absl::StrCat("shape ", ShapeToString(got.shape()), ", want ",
                                            ShapeToString(want.shape())));
  }
  // Name the first difference.
  auto status = AllClose(got, want, 0, 0);
  return status.ok() ? absl::InternalError("bitwise difference (e.g. -0.0 vs 0.0 or NaN payload)")
                     : status;
}

}  // namespace

absl::StatusOr<VerifyReport> VerifyRedistribute(const std::shared_ptr<World>& world,
                                                const VerifyRequest& r) {
  int64_t ranks = 1;
  for (int64_t s : r.mesh) ranks *= s;
  if (ranks != world->size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "verify: mesh ", absl::StrJoin(r.mesh, "x"), " has ", ranks, " ranks but the ",
        world->backend(), " world has ", world->size(), " (launch ", ranks, " ranks)"));
  }
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(world, r.mesh, r.names));
  DT_ASSIGN_OR_RETURN(Tensor full, VerifyTensor(r.shape, r.dtype, r.seed));
  DT_ASSIGN_OR_RETURN(DTensorSpec src_spec, DTensorSpec::Create(mesh, r.from, r.shape, r.dtype));
  DT_ASSIGN_OR_RETURN(DTensorSpec dst_spec, DTensorSpec::Create(mesh, r.to, r.shape, r.dtype));
  PlannerOptions planner = r.planner;
  planner.allow_partial = true;  // verification covers the internal R -> P plans too
  DT_ASSIGN_OR_RETURN(RedistributePlan plan, PlanRedistribute(src_spec, dst_spec, planner));

  VerifyReport report;
  report.plan = plan.ToString();
  report.plan_collectives = plan.num_collectives();
  const int me = world->rank();
  auto fail = [&](absl::string_view what, const absl::Status& s) {
    report.errors.push_back(absl::StrCat("rank ", me, ": ", what, ": ", s.message()));
  };

  // The source layout, distributed with communication, must equal cutting it locally.
  DT_ASSIGN_OR_RETURN(DTensor x, DTensor::Distribute(full, mesh, r.from));
  DT_ASSIGN_OR_RETURN(DTensor x_direct, DTensor::Distribute(full, mesh, r.from, std::nullopt));
  if (absl::Status s = Compare(x.ToLocal(), x_direct.ToLocal(), false); !s.ok()) {
    fail(absl::StrCat("Distribute to ", PlacementsToCompactString(r.from)), s);
  }

  RedistributeOptions options;
  options.planner = planner;
  absl::StatusOr<DTensor> y;
  {
    CommCounter counter;
    y = x.Redistribute(r.to, options);
    report.counts = counter.counts();
  }
  DT_RETURN_IF_ERROR(y.status());
  DT_ASSIGN_OR_RETURN(DTensor want, DTensor::Distribute(full, mesh, r.to, std::nullopt));
  if (absl::Status s = Compare(y->ToLocal(), want.ToLocal(), Reduces(r.from, r.to)); !s.ok()) {
    fail(absl::StrCat("Redistribute ", PlacementsToCompactString(r.from), " -> ",
                      PlacementsToCompactString(r.to)),
         s);
  }
  DT_ASSIGN_OR_RETURN(Tensor back, y->FullTensor());
  if (absl::Status s = Compare(back, full, Reduces(r.to, Placements(r.to.size())) ||
                                               Reduces(r.from, r.to));
      !s.ok()) {
    fail("FullTensor", s);
  }

  // Share the verdict.
  DT_ASSIGN_OR_RETURN(CommPtr all, world->WorldGroup());
  DT_ASSIGN_OR_RETURN(Tensor bad, Tensor::FromVector<int64_t>({1}, {report.errors.empty() ? 0 : 1}));
  DT_RETURN_IF_ERROR(all->AllReduce(bad, ReduceOp::kSum));
  report.failing_ranks = static_cast<int>(bad.data<int64_t>()[0]);
  report.ok = report.failing_ranks == 0;
  return report;
}

}  // namespace dt
