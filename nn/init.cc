#include "dtensor/nn/init.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/dtensor/dtensor.h"
#include "dtensor/ops/local/ops.h"

namespace dt::nn {
namespace {

absl::StatusOr<const DTensorSpec*> PlacedSpec(const std::string& name, const Parameter& p) {
  if (!p.placed()) {
    return absl::FailedPreconditionError(
        absl::StrCat("parameter '", name, "' (", p.Describe(),
                     ") is not placed on a mesh; call ParallelizeModule or ReplicateModule first"));
  }
  return &p.spec();
}

absl::Status Annotate(const std::string& name, absl::Status s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("parameter '", name, "': ", s.message()));
}

}  // namespace

uint64_t ParameterSeed(uint64_t seed, absl::string_view name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a, then a splitmix64 finalizer
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  uint64_t z = h ^ (seed + 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

absl::Status MaterializeParameters(Module& module, const LocalPieceFn& fn) {
  for (auto& [name, p] : module.NamedParameters()) {
    DT_ASSIGN_OR_RETURN(const DTensorSpec* spec, PlacedSpec(name, *p));
    absl::StatusOr<Tensor> local = fn(name, *spec);
    DT_RETURN_IF_ERROR(Annotate(name, local.status()));
    FromLocalOptions options;
    options.shape = spec->shape();
    absl::StatusOr<DTensor> d =
        DTensor::FromLocal(*std::move(local), spec->mesh(), spec->placements(), options);
    DT_RETURN_IF_ERROR(Annotate(name, d.status()));
    DT_RETURN_IF_ERROR(p->Set(*std::move(d)));
  }
  return absl::OkStatus();
}

absl::Status LoadFullTensors(Module& module, const FullTensorFn& fn) {
  for (auto& [name, p] : module.NamedParameters()) {
    DT_ASSIGN_OR_RETURN(const DTensorSpec* spec, PlacedSpec(name, *p));
    absl::StatusOr<Tensor> full = fn(name, *p);
    DT_RETURN_IF_ERROR(Annotate(name, full.status()));
    if (full->shape() != p->shape() || full->dtype() != p->dtype()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "': expected ", DTypeName(p->dtype()), ShapeToString(p->shape()),
          ", got ", DTypeName(full->dtype()), ShapeToString(full->shape())));
    }
    absl::StatusOr<DTensor> d =
        DTensor::Distribute(*full, spec->mesh(), spec->placements(), std::nullopt);
    DT_RETURN_IF_ERROR(Annotate(name, d.status()));
    DT_RETURN_IF_ERROR(p->Set(*std::move(d)));
  }
  return absl::OkStatus();
}

absl::Status InitRandom(Module& module, uint64_t seed) {
  return MaterializeParameters(
      module, [seed](absl::string_view name, const DTensorSpec& spec) -> absl::StatusOr<Tensor> {
        DT_ASSIGN_OR_RETURN(DTensor u, DTensor::Rand(spec.shape(), ParameterSeed(seed, name),
                                                     spec.mesh(), spec.placements(), DType::kF32,
                                                     spec.mesh().device()));
        // Elementwise on the local piece: the same as transforming the full tensor, then cutting.
        const bool matrix = spec.shape().size() >= 2;
        const double bound =
            matrix ? 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(1, spec.shape().back())))
                   : 0.5;
        DT_ASSIGN_OR_RETURN(Tensor local, ops::Mul(u.ToLocal(), 2 * bound));
        DT_ASSIGN_OR_RETURN(local, ops::Add(local, matrix ? -bound : 0.5));
        return ops::Cast(local, spec.dtype());
      });
}

absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> GatherParameters(Module& module) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, p] : module.NamedParameters()) {
    if (!p->materialized()) {
      return absl::FailedPreconditionError(
          absl::StrCat("parameter '", name, "' is not materialized (", p->Describe(), ")"));
    }
    absl::StatusOr<Tensor> full = p->value().FullTensor();
    DT_RETURN_IF_ERROR(Annotate(name, full.status()));
    out.emplace_back(name, *std::move(full));
  }
  return out;
}

}  // namespace dt::nn
