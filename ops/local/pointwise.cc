// Pointwise ops: validation and broadcasting; the loops are kernels.

#include <cmath>

#include "absl/strings/str_cat.h"
#include "dtensor/ops/local/checks.h"
#include "dtensor/ops/local/kernels.h"
#include "dtensor/ops/local/ops.h"

namespace dt::ops {

const char* BinaryOpName(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd: return "Add";
    case BinaryOp::kSub: return "Sub";
    case BinaryOp::kMul: return "Mul";
    case BinaryOp::kDiv: return "Div";
  }
  return "Binary";
}

const char* UnaryOpName(UnaryOp op) {
  switch (op) {
    case UnaryOp::kNeg: return "Neg";
    case UnaryOp::kGeluTanh: return "Gelu(tanh)";
    case UnaryOp::kGeluErf: return "Gelu";
#define DT_UNARY_NAME_(name, formula) case UnaryOp::k##name: return #name;
      DT_UNARY_OPS(DT_UNARY_NAME_)
#undef DT_UNARY_NAME_
  }
  return "Unary";
}

namespace {

absl::Status CheckBinaryOperand(BinaryOp op, absl::string_view name, const Tensor& t) {
  return op == BinaryOp::kDiv ? internal::CheckFloat(BinaryOpName(op), name, t)
                              : internal::CheckNotBool(BinaryOpName(op), name, t);
}

}  // namespace

absl::StatusOr<Tensor> Binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const absl::string_view name = BinaryOpName(op);
  DT_RETURN_IF_ERROR(CheckBinaryOperand(op, "a", a));
  DT_RETURN_IF_ERROR(CheckBinaryOperand(op, "b", b));
  DT_RETURN_IF_ERROR(internal::CheckSameDType(name, "a", a, "b", b));
  DT_RETURN_IF_ERROR(internal::CheckSameDevice(name, {{"a", &a}, {"b", &b}}));
  auto shape = BroadcastShapes(a.shape(), b.shape());
  if (!shape.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": a ", a.Describe(), " and b ", b.Describe(),
                                                   " do not broadcast"));
  }
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(*shape, a.dtype(), a.device()));
  if (out.numel() == 0) return out;
  DT_ASSIGN_OR_RETURN(Tensor a_e, a.Expand(*shape));
  DT_ASSIGN_OR_RETURN(Tensor b_e, b.Expand(*shape));
  DT_RETURN_IF_ERROR(DT_OPS_KERNEL(out.device(), Binary, op, a_e, b_e, out));
  return out;
}

absl::StatusOr<Tensor> Binary(BinaryOp op, const Tensor& x, double s) {
  const absl::string_view name = BinaryOpName(op);
  DT_RETURN_IF_ERROR(CheckBinaryOperand(op, "x", x));
  if (!IsFloating(x.dtype()) && !(std::isfinite(s) && std::trunc(s) == s)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": scalar ", s, " is not an integer, x is ",
                                                   x.Describe(), " (cast x to a float dtype first)"));
  }
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(x.shape(), x.dtype(), x.device()));
  if (out.numel() == 0) return out;
  DT_RETURN_IF_ERROR(DT_OPS_KERNEL(out.device(), BinaryScalar, op, x, s, out));
  return out;
}

absl::StatusOr<Tensor> Modulate(const Tensor& x, const Tensor& scale, const Tensor& shift) {
  constexpr absl::string_view kName = "Modulate";
  DT_RETURN_IF_ERROR(internal::CheckFloat(kName, "x", x));
  DT_RETURN_IF_ERROR(internal::CheckSameDType(kName, "x", x, "scale", scale));
  DT_RETURN_IF_ERROR(internal::CheckSameDType(kName, "x", x, "shift", shift));
  DT_RETURN_IF_ERROR(
      internal::CheckSameDevice(kName, {{"x", &x}, {"scale", &scale}, {"shift", &shift}}));
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"scale", &scale},
                                {"shift", &shift}}) {
    auto b = BroadcastShapes(x.shape(), t->shape());
    if (!b.ok() || *b != x.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(kName, ": ", name, " ", t->Describe(),
                                                     " does not broadcast to x ", x.Describe()));
    }
  }
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(x.shape(), x.dtype(), x.device()));
  if (out.numel() == 0) return out;
  DT_ASSIGN_OR_RETURN(Tensor scale_e, scale.Expand(x.shape()));
  DT_ASSIGN_OR_RETURN(Tensor shift_e, shift.Expand(x.shape()));
  DT_RETURN_IF_ERROR(DT_OPS_KERNEL(out.device(), Modulate, x, scale_e, shift_e, out));
  return out;
}

absl::StatusOr<Tensor> GatedActivation(const Tensor& gate, const Tensor& up, UnaryOp act) {
  constexpr absl::string_view kName = "GatedActivation";
  DT_RETURN_IF_ERROR(internal::CheckFloat(kName, "gate", gate));
  DT_RETURN_IF_ERROR(internal::CheckSameDType(kName, "gate", gate, "up", up));
  DT_RETURN_IF_ERROR(internal::CheckSameDevice(kName, {{"gate", &gate}, {"up", &up}}));
  if (gate.shape() != up.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(kName, ": gate ", gate.Describe(), " and up ",
                                                   up.Describe(), " differ in shape"));
  }
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(gate.shape(), gate.dtype(), gate.device()));
  if (out.numel() == 0) return out;
  DT_RETURN_IF_ERROR(DT_OPS_KERNEL(out.device(), GatedActivation, act, gate, up, out));
  return out;
}

absl::StatusOr<Tensor> Add(const Tensor& a, const Tensor& b) { return Binary(BinaryOp::kAdd, a, b); }
absl::StatusOr<Tensor> Sub(const Tensor& a, const Tensor& b) { return Binary(BinaryOp::kSub, a, b); }
absl::StatusOr<Tensor> Mul(const Tensor& a, const Tensor& b) { return Binary(BinaryOp::kMul, a, b); }
absl::StatusOr<Tensor> Div(const Tensor& a, const Tensor& b) { return Binary(BinaryOp::kDiv, a, b); }
absl::StatusOr<Tensor> Add(const Tensor& x, double s) { return Binary(BinaryOp::kAdd, x, s); }
absl::StatusOr<Tensor> Sub(const Tensor& x, double s) { return Binary(BinaryOp::kSub, x, s); }
absl::StatusOr<Tensor> Mul(const Tensor& x, double s) { return Binary(BinaryOp::kMul, x, s); }
absl::StatusOr<Tensor> Div(const Tensor& x, double s) { return Binary(BinaryOp::kDiv, x, s); }

absl::StatusOr<Tensor> Unary(UnaryOp op, const Tensor& x) {
  const absl::string_view name = UnaryOpName(op);
  DT_RETURN_IF_ERROR(op == UnaryOp::kNeg ? internal::CheckNotBool(name, "x", x)
                                         : internal::CheckFloat(name, "x", x));
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(x.shape(), x.dtype(), x.device()));
  if (out.numel() == 0) return out;
  DT_RETURN_IF_ERROR(DT_OPS_KERNEL(out.device(), Unary, op, x, out));
  return out;
}

absl::StatusOr<Tensor> Neg(const Tensor& x) { return Unary(UnaryOp::kNeg, x); }
absl::StatusOr<Tensor> Gelu(const Tensor& x, GeluApproximation approx) {
  return Unary(approx == GeluApproximation::kTanh ? UnaryOp::kGeluTanh : UnaryOp::kGeluErf, x);
}
#define DT_UNARY_FUNCTION_(name, formula) \
  absl::StatusOr<Tensor> name(const Tensor& x) { return Unary(UnaryOp::k##name, x); }
DT_UNARY_OPS(DT_UNARY_FUNCTION_)
#undef DT_UNARY_FUNCTION_

absl::StatusOr<Tensor> Cast(const Tensor& x, DType dtype) {
  DT_RETURN_IF_ERROR(internal::CheckDefined("Cast", "x", x));
  DT_ASSIGN_OR_RETURN(Tensor y, x.To(dtype));
  return y.Contiguous();
}

}  // namespace dt::ops
