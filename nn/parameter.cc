#include "dtensor/nn/parameter.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "dtensor/core/quant.h"
#include "dtensor/core/status.h"

namespace dt::nn {

Parameter::Parameter(Module* owner, std::string name, Shape shape, DType dtype)
    : owner_(owner), name_(std::move(name)), shape_(std::move(shape)), dtype_(dtype) {}

const DTensorSpec& Parameter::spec() const {
  DT_CHECK(placed(), "parameter '", FullName(), "' is not placed");
  return *spec_;
}

const DTensor& Parameter::value() const {
  DT_CHECK(materialized(), "parameter '", FullName(), "' is not materialized");
  return value_;
}

absl::Status Parameter::Place(const DeviceMesh& mesh, absl::Span<const Placement> placements) {
  auto spec = DTensorSpec::Create(mesh, placements, shape_, dtype_);
  if (!spec.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter '", FullName(), "': ", spec.status().message()));
  }
  if (materialized()) {
    if (!(value_.mesh() == mesh)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", FullName(), "' holds data on ", value_.mesh().ToString(),
          "; it cannot be placed on ", mesh.ToString(), " (place it before loading it)"));
    }
    if (value_.placements() != spec->placements()) {
      auto moved = value_.Redistribute(spec->placements());
      if (!moved.ok()) {
        return absl::Status(moved.status().code(), absl::StrCat("parameter '", FullName(),
                                                                "': ", moved.status().message()));
      }
      value_ = *std::move(moved);
    }
  }
  spec_ = *std::move(spec);
  return absl::OkStatus();
}

absl::Status Parameter::SetDType(DType dtype) {
  if (materialized()) {
    return absl::FailedPreconditionError(absl::StrCat("parameter '", FullName(), "' ",
                                                      Describe(), ": its dtype cannot change once "
                                                      "it holds data"));
  }
  if (IsQuantized(dtype)) {
    absl::Status st = CheckQuantizedShape(dtype, shape_);
    if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("parameter '", FullName(), "': ", st.message()));
  }
  if (spec_) {
    DT_ASSIGN_OR_RETURN(DTensorSpec spec, DTensorSpec::Create(spec_->mesh(), spec_->placements(),
                                                              shape_, dtype));
    spec_ = std::move(spec);
  }
  dtype_ = dtype;
  return absl::OkStatus();
}

absl::Status Parameter::Set(DTensor value) {
  if (!value.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter '", FullName(), "': the value is undefined"));
  }
  if (value.shape() != shape_ || value.dtype() != dtype_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter '", FullName(), "': expected ", DTypeName(dtype_), ShapeToString(shape_),
        ", got ", DTypeName(value.dtype()), ShapeToString(value.shape())));
  }
  if (placed() && value.spec() != *spec_) {
    return absl::InvalidArgumentError(absl::StrCat("parameter '", FullName(), "': expected ",
                                                   spec_->Describe(), ", got ",
                                                   value.spec().Describe()));
  }
  spec_ = value.spec();
  value_ = std::move(value);
  return absl::OkStatus();
}

std::string Parameter::Describe() const {
  std::string s = absl::StrCat(DTypeName(dtype_), ShapeToString(shape_));
  if (!placed()) return absl::StrCat(s, " (not placed)");
  absl::StrAppend(&s, " ", spec_->ToString());
  if (!materialized()) absl::StrAppend(&s, " (placeholder)");
  return s;
}

}  // namespace dt::nn
