// Normalisations over the last dim and rotary position embeddings.

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/ops/local/checks.h"
#include "dtensor/ops/local/kernels.h"
#include "dtensor/ops/local/ops.h"

namespace dt::ops {

namespace {

// x float with >= 1 dim; each defined parameter [H] of x's dtype on x's device.
absl::Status CheckNormArgs(absl::string_view op, const Tensor& x, double eps,
                           std::initializer_list<std::pair<absl::string_view, const Tensor*>> params) {
  DT_RETURN_IF_ERROR(internal::CheckFloat(op, "x", x));
  DT_RETURN_IF_ERROR(internal::CheckMinDims(op, "x", x, 1));
  if (!(eps >= 0) || !std::isfinite(eps)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": eps must be finite and >= 0, got ", eps));
  }
  for (const auto& [name, t] : params) {
    if (!t->defined()) continue;
    DT_RETURN_IF_ERROR(internal::CheckSameDType(op, "x", x, name, *t));
    DT_RETURN_IF_ERROR(internal::CheckShape(op, name, *t, {x.size(-1)}));
    DT_RETURN_IF_ERROR(internal::CheckSameDevice(op, {{"x", &x}, {name, t}}));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Tensor> RmsNorm(const Tensor& x, const Tensor& weight, double eps) {
  DT_RETURN_IF_ERROR(CheckNormArgs("RmsNorm", x, eps, {{"weight", &weight}}));
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(x.shape(), x.dtype(), x.device()));
  if (out.numel() > 0) {
    DT_RETURN_IF_ERROR(DT_OPS_KERNEL(x.device(), RmsNorm, x, weight, static_cast<float>(eps), out));
  }
  return out;
}

absl::StatusOr<Tensor> LayerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                 double eps) {
  DT_RETURN_IF_ERROR(CheckNormArgs("LayerNorm", x, eps, {{"weight", &weight}, {"bias", &bias}}));
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(x.shape(), x.dtype(), x.device()));
  if (out.numel() > 0) {
    DT_RETURN_IF_ERROR(
        DT_OPS_KERNEL(x.device(), LayerNorm, x, weight, bias, static_cast<float>(eps), out));
  }
  return out;
}

std::vector<float> RopeInverseFrequencies(int64_t head_dim, double theta) {
  std::vector<float> inv(std::max<int64_t>(head_dim, 0) / 2);
  for (size_t i = 0; i < inv.size(); ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = 1.0f / std::pow(static_cast<float>(theta), exponent);
  }
  return inv;
}

namespace {

// The checks of a rotary of x by cos and sin (op: "ApplyRotary" or "ApplyRotaryInto"), and the
// tables expanded to x's shape.
absl::StatusOr<std::array<Tensor, 2>> RotaryTables(absl::string_view kOp, const Tensor& x,
                                                   const Tensor& cos, const Tensor& sin) {
  DT_RETURN_IF_ERROR(internal::CheckFloat(kOp, "x", x));
  DT_RETURN_IF_ERROR(internal::CheckFloat(kOp, "cos", cos));
  DT_RETURN_IF_ERROR(internal::CheckFloat(kOp, "sin", sin));
  DT_RETURN_IF_ERROR(internal::CheckSameDevice(kOp, {{"x", &x}, {"cos", &cos}, {"sin", &sin}}));
  DT_RETURN_IF_ERROR(internal::CheckMinDims(kOp, "x", x, 1));
  if (x.size(-1) % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": the last dim of x must be even, got ", x.Describe()));
  }
  Tensor expanded[2];
  const Tensor* tables[2] = {&cos, &sin};
  const absl::string_view names[2] = {"cos", "sin"};
  for (int i = 0; i < 2; ++i) {
    const Tensor& t = *tables[i];
    auto e = t.dim() >= 1 && t.size(-1) == x.size(-1) ? t.Expand(x.shape())
                                                       : absl::StatusOr<Tensor>(absl::UnknownError(""));
    if (!e.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(kOp, ": ", names[i], " ", t.Describe(),
                                                     " does not broadcast to x ", x.Describe(),
                                                     " (its last dim must be ", x.size(-1), ")"));
    }
    expanded[i] = *std::move(e);
  }
  return std::array<Tensor, 2>{std::move(expanded[0]), std::move(expanded[1])};
}

}  // namespace

absl::StatusOr<Tensor> ApplyRotary(const Tensor& x, const Tensor& cos, const Tensor& sin,
                                   RotaryStyle style) {
  DT_ASSIGN_OR_RETURN(const auto tables, RotaryTables("ApplyRotary", x, cos, sin));
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(x.shape(), x.dtype(), x.device()));
  if (out.numel() > 0) {
    DT_RETURN_IF_ERROR(DT_OPS_KERNEL(x.device(), ApplyRotary, x, tables[0], tables[1], style, out));
  }
  return out;
}

absl::Status ApplyRotaryInto(const Tensor& out, const Tensor& x, const Tensor& cos,
                             const Tensor& sin, RotaryStyle style) {
  constexpr absl::string_view kOp = "ApplyRotaryInto";
  DT_ASSIGN_OR_RETURN(const auto tables, RotaryTables(kOp, x, cos, sin));
  // On the CPU out may be of another float dtype than x, the rotated values rounded to it once: a
  // KV cache of its own dtype (Note [A KV cache of its own dtype] in attention.cc).
  const bool own_dtype = out.defined() && out.dtype() != x.dtype() && x.device().is_cpu();
  if (own_dtype) {
    DT_RETURN_IF_ERROR(internal::CheckFloat(kOp, "out", out));
    DT_RETURN_IF_ERROR(internal::CheckSameDevice(kOp, {{"x", &x}, {"out", &out}}));
  }
  DT_RETURN_IF_ERROR(internal::CheckInto(kOp, out, x.shape(), {own_dtype ? "out" : "x", own_dtype ? &out : &x},
                                         {{"x", &x}, {"cos", &cos}, {"sin", &sin}}));
  if (out.numel() == 0) return absl::OkStatus();
  return DT_OPS_KERNEL(x.device(), ApplyRotary, x, tables[0], tables[1], style, out);
}

}  // namespace dt::ops
