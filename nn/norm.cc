#include "dtensor/nn/norm.h"

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/dtensor_ops.h"
#include "dtensor/ops/value_ops.h"

namespace dt::nn {

RMSNorm::RMSNorm(int64_t hidden_size, double eps, DType dtype, RMSNormForm form)
    : LastDimNorm("RMSNorm", hidden_size, eps), form_(form) {
  RegisterParameter("weight", {hidden_size}, dtype);
}

std::string RMSNorm::ExtraRepr() const {
  return absl::StrCat(hidden_, ", eps=", eps_,
                      form_ == RMSNormForm::kScaleThenRound  ? ", scale in f32"
                      : form_ == RMSNormForm::kOnePlusWeight ? ", 1 + weight"
                                                             : "");
}

namespace {

// The weight as the form applies it after rounding-free normalization: f32, plus one for Gemma.
absl::StatusOr<Value> F32Scale(const Value& w, RMSNormForm form) {
  DT_ASSIGN_OR_RETURN(Value wf, ops::Cast(w, DType::kF32));
  if (form != RMSNormForm::kOnePlusWeight) return wf;
  if (wf.is_dtensor()) {
    DT_ASSIGN_OR_RETURN(DTensor one_plus, ops::Add(wf.dtensor(), 1.0));
    return Value(std::move(one_plus));
  }
  DT_ASSIGN_OR_RETURN(Tensor one_plus, ops::Add(wf.local(), 1.0));
  return Value(std::move(one_plus));
}

// The mesh dim whose placement shards the last dim of `whole` (plain Shard), or -1.
int LastDimShard(const DTensor& whole) {
  const int last = static_cast<int>(whole.shape().size()) - 1;
  const Placements& p = whole.placements();
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i].is_shard() && p[i].dim() == last) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

absl::StatusOr<Values> RMSNorm::Forward(Values inputs) {
  DT_ASSIGN_OR_RETURN(Value x, SingleInput(*this, inputs));
  DT_ASSIGN_OR_RETURN(Value w, ParamValue("weight"));
  if (const DTensor* whole = x.piece_of(); whole != nullptr && w.is_local() &&
                                           w.local().size(0) == x.shape().back() &&
                                           LastDimShard(*whole) >= 0) {
    DT_ASSIGN_OR_RETURN(Value y, ShardedForward(x, *whole, w));
    return Values{std::move(y)};
  }
  if (form_ == RMSNormForm::kRoundThenScale) {
    DT_ASSIGN_OR_RETURN(Value y, ops::RmsNorm(x, w, eps_));
    return Values{std::move(y)};
  }
  // In f32 the rounding after normalizing is none, so ops::RmsNorm's product is the f32 one.
  DT_ASSIGN_OR_RETURN(Value xf, ops::Cast(x, DType::kF32));
  DT_ASSIGN_OR_RETURN(Value wf, F32Scale(w, form_));
  DT_ASSIGN_OR_RETURN(Value y, ops::RmsNorm(xf, wf, eps_));
  DT_ASSIGN_OR_RETURN(y, ops::Cast(y, x.dtype()));
  return Values{std::move(y)};
}

absl::StatusOr<Value> RMSNorm::ShardedForward(const Value& x, const DTensor& whole,
                                              const Value& w) {
  const Tensor& local = x.local();
  const int last = local.dim() - 1;
  const int mesh_dim = LastDimShard(whole);
  const int64_t offset = whole.spec().Offset()[last], width = local.size(last);
  DT_ASSIGN_OR_RETURN(Tensor xf, ops::Cast(local, DType::kF32));
  DT_ASSIGN_OR_RETURN(Tensor squares, ops::Mul(xf, xf));
  DT_ASSIGN_OR_RETURN(Tensor sum, ops::Sum(squares, last, /*keepdim=*/true));
  // This rank's sum is a Partial of the whole dim's over the mesh dim that splits it; the other
  // mesh dims keep the input's placements of the other dims.
  Placements partial = whole.placements(), replicated = whole.placements();
  partial[mesh_dim] = Placement::Partial();
  replicated[mesh_dim] = Placement::Replicate();
  FromLocalOptions sums;
  sums.shape = whole.shape();
  sums.shape->back() = 1;
  DT_ASSIGN_OR_RETURN(DTensor p, DTensor::FromLocal(std::move(sum), whole.mesh(), partial, sums));
  DT_ASSIGN_OR_RETURN(DTensor total, p.Redistribute(replicated));
  DT_ASSIGN_OR_RETURN(Tensor mean, ops::Div(total.ToLocal(), static_cast<double>(x.shape().back())));
  DT_ASSIGN_OR_RETURN(Tensor rstd, ops::Add(mean, eps_));
  DT_ASSIGN_OR_RETURN(rstd, ops::Rsqrt(rstd));
  DT_ASSIGN_OR_RETURN(Tensor y, ops::Mul(xf, rstd));
  DT_ASSIGN_OR_RETURN(Tensor slice, w.local().Narrow(0, offset, width));
  if (form_ == RMSNormForm::kRoundThenScale) {
    DT_ASSIGN_OR_RETURN(y, ops::Cast(y, local.dtype()));
    DT_ASSIGN_OR_RETURN(y, ops::Mul(y, slice));
  } else {
    DT_ASSIGN_OR_RETURN(Value scale, F32Scale(Value(slice), form_));
    DT_ASSIGN_OR_RETURN(y, ops::Mul(y, scale.local()));
    DT_ASSIGN_OR_RETURN(y, ops::Cast(y, local.dtype()));
  }
  FromLocalOptions layout;
  layout.shape = whole.shape();
  DT_ASSIGN_OR_RETURN(DTensor out, DTensor::FromLocal(std::move(y), whole.mesh(),
                                                      whole.placements(), layout));
  return Value::Piece(std::move(out), FullName());
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
