#include "dtensor/nn/norm.h"

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/value_ops.h"

namespace dt::nn {

RMSNorm::RMSNorm(int64_t hidden_size, double eps, DType dtype)
    : LastDimNorm("RMSNorm", hidden_size, eps) {
  RegisterParameter("weight", {hidden_size}, dtype);
}

std::string RMSNorm::ExtraRepr() const { return absl::StrCat(hidden_, ", eps=", eps_); }

absl::StatusOr<Values> RMSNorm::Forward(Values inputs) {
  DT_ASSIGN_OR_RETURN(Value x, SingleInput(*this, inputs));
  DT_ASSIGN_OR_RETURN(Value w, ParamValue("weight"));
  DT_ASSIGN_OR_RETURN(Value y, ops::RmsNorm(x, w, eps_));
  return Values{std::move(y)};
}

LayerNorm::LayerNorm(int64_t hidden_size, double eps, bool elementwise_affine, bool bias,
                     DType dtype)
    : LastDimNorm("LayerNorm", hidden_size, eps) {
  if (elementwise_affine) {
    RegisterParameter("weight", {hidden_size}, dtype);
    if (bias) RegisterParameter("bias", {hidden_size}, dtype);
  }
}

std::string LayerNorm::ExtraRepr() const {
  return absl::StrCat(hidden_, ", eps=", eps_,
                      ", elementwise_affine=", FindParameter("weight") ? "true" : "false");
}

absl::StatusOr<Values> LayerNorm::Forward(Values inputs) {
  DT_ASSIGN_OR_RETURN(Value x, SingleInput(*this, inputs));
  Value w, b;
  if (FindParameter("weight") != nullptr) {
    DT_ASSIGN_OR_RETURN(w, ParamValue("weight"));
  }
  if (FindParameter("bias") != nullptr) {
    DT_ASSIGN_OR_RETURN(b, ParamValue("bias"));
  }
  DT_ASSIGN_OR_RETURN(Value y, ops::LayerNorm(x, w, b, eps_));
  return Values{std::move(y)};
}

}  // namespace dt::nn
