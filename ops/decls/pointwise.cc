// The declarations (ops/op_decl.h) of the elementwise ops: Add Sub Mul Div (tensor and scalar), the
// unary ops, Cast, Modulate, GatedActivation and SoftCap. For each op, in this order: its shape rule (Infer), its sharding
// candidates (Cand), any whole-strategy check, its local run, and its row.

#include "dtensor/ops/decls/rules.h"
#include "dtensor/ops/local/checks.h"

namespace dt::ops::internal::rules {

// ---- Binary ---------------------------------------------------------------------------------

absl::StatusOr<OutputMetas> InferBinary(const OpCall& call) {
  const auto op = call.Attr<BinaryAttrs>().op;
  DT_RETURN_IF_ERROR(NeedSameDType(call, 0, 1));
  DT_RETURN_IF_ERROR(NeedFloatOrNotBool(call, 0, op == ops::BinaryOp::kDiv));
  auto shape = BroadcastShapes(In(call, 0).shape(), In(call, 1).shape());
  if (!shape.ok()) {
    return Bad(call, absl::StrCat(Arg(call, 0), ", ", Arg(call, 1), ": ", shape.status().message()));
  }
  return One(*std::move(shape), In(call, 0).dtype());
}

void CandBinary(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  const auto op = call.Attr<BinaryAttrs>().op;
  AddElementwiseOptions(call, outs, i, options);
  const auto pa = PartialOf(call, 0, i), pb = PartialOf(call, 1, i);
  const bool additive = op == ops::BinaryOp::kAdd || op == ops::BinaryOp::kSub;
  // P op R (add/sub: R added once, see Note [Adding a replicated term to a Partial]; mul/div:
  // scaled), R op P (add/sub/mul), P op P with one op (add/sub).
  AddLinearPartial(call, 0, i, 1, options);
  if (op != ops::BinaryOp::kDiv) AddLinearPartial(call, 1, i, 1, options);
  if (additive && pa && pb && *pa == *pb && IsSumLike(*pa)) {
    DimOption o = ReplicateOption(2, 1);
    o.in = {Placement::Partial(*pa), Placement::Partial(*pa)};
    o.out = {Placement::Partial(*pa)};
    options->push_back(std::move(o));
  }
}

absl::StatusOr<LocalOutputs> RunBinary(const OpCall& call, const LocalArgs& a) {
  const ops::BinaryOp op = call.Attr<BinaryAttrs>().op;
  Tensor x = a.local(0), y = a.local(1);
  if (op == ops::BinaryOp::kAdd || op == ops::BinaryOp::kSub) {
    if (!a.TermIncludes(0, 0)) {
      DT_ASSIGN_OR_RETURN(x, Tensor::Zeros(x.shape(), x.dtype(), x.device()));
    }
    if (!a.TermIncludes(1, 0)) {
      DT_ASSIGN_OR_RETURN(y, Tensor::Zeros(y.shape(), y.dtype(), y.device()));
    }
  }
  DT_ASSIGN_OR_RETURN(Tensor z, ops::Binary(op, x, y));
  return Out(std::move(z));
}

const OpDecl kBinaryDecl{.op = OpId::kBinary, .name = "Binary", .input_names = {"a", "b"},
                         .attrs = kAttrsIndex<BinaryAttrs>, .infer = InferBinary,
                         .candidates = CandBinary, .run = RunBinary, .cuda = "cuda::Binary"};

// ---- BinaryScalar ---------------------------------------------------------------------------

absl::StatusOr<OutputMetas> InferBinaryScalar(const OpCall& call) {
  const auto op = call.Attr<BinaryScalarAttrs>().op;
  DT_RETURN_IF_ERROR(NeedFloatOrNotBool(call, 0, op == ops::BinaryOp::kDiv));
  const double s = call.Attr<BinaryScalarAttrs>().scalar;
  if (!IsFloating(In(call, 0).dtype()) && s != std::trunc(s)) {
    return Bad(call, absl::StrCat(Arg(call, 0), ": the scalar ", s, " is not integral"));
  }
  return One(In(call, 0).shape(), In(call, 0).dtype());
}

void CandBinaryScalar(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  const auto op = call.Attr<BinaryScalarAttrs>().op;
  const double s = call.Attr<BinaryScalarAttrs>().scalar;
  AddElementwiseOptions(call, outs, i, options);
  const auto p = PartialOf(call, 0, i);
  if (!p || std::isnan(s)) return;
  const bool extreme = *p == ReduceOp::kMax || *p == ReduceOp::kMin;
  if (!IsSumLike(*p) && !extreme) return;
  switch (op) {
    case ops::BinaryOp::kAdd:
    case ops::BinaryOp::kSub:
      // sum: s added by one rank of the group; avg, max, min: by every rank.
      AddPartialOf(call, 0, i, 1, *p, options);
      break;
    case ops::BinaryOp::kMul:
      AddPartialOf(call, 0, i, 1, extreme && s < 0 ? Swapped(*p) : *p, options);
      break;
    case ops::BinaryOp::kDiv:
      // x/0 does not distribute over the terms' signs; keep Partial only for s != 0.
      if (s != 0) AddPartialOf(call, 0, i, 1, extreme && s < 0 ? Swapped(*p) : *p, options);
      break;
  }
}

absl::StatusOr<LocalOutputs> RunBinaryScalar(const OpCall& call, const LocalArgs& a) {
  const auto& at = call.Attr<BinaryScalarAttrs>();
  const bool additive = at.op == ops::BinaryOp::kAdd || at.op == ops::BinaryOp::kSub;
  if (additive && !a.TermIncludes(-1, 0)) {
    DT_ASSIGN_OR_RETURN(Tensor y, a.local(0).Clone());
    return Out(std::move(y));
  }
  return Out(ops::Binary(at.op, a.local(0), at.scalar));
}

const OpDecl kBinaryScalarDecl{.op = OpId::kBinaryScalar, .name = "BinaryScalar",
                               .input_names = {"x"}, .attrs = kAttrsIndex<BinaryScalarAttrs>,
                               .infer = InferBinaryScalar, .candidates = CandBinaryScalar,
                               .run = RunBinaryScalar, .cuda = "cuda::BinaryScalar"};

// ---- Unary ----------------------------------------------------------------------------------

absl::StatusOr<OutputMetas> InferUnary(const OpCall& call) {
  const auto op = call.Attr<UnaryAttrs>().op;
  DT_RETURN_IF_ERROR(NeedFloatOrNotBool(call, 0, op != ops::UnaryOp::kNeg));
  return One(In(call, 0).shape(), In(call, 0).dtype());
}

void CandUnary(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  AddElementwiseOptions(call, outs, i, options);
  const auto p = PartialOf(call, 0, i);
  if (p && call.Attr<UnaryAttrs>().op == ops::UnaryOp::kNeg &&
      *p != ReduceOp::kProd) {
    AddPartialOf(call, 0, i, 1, Swapped(*p), options);  // -max(x) = min(-x)
  }
}

absl::StatusOr<LocalOutputs> RunUnary(const OpCall& call, const LocalArgs& a) {
  return Out(ops::Unary(call.Attr<UnaryAttrs>().op, a.local(0)));
}

const OpDecl kUnaryDecl{.op = OpId::kUnary, .name = "Unary", .input_names = {"x"},
                        .attrs = kAttrsIndex<UnaryAttrs>, .infer = InferUnary,
                        .candidates = CandUnary, .run = RunUnary, .cuda = "cuda::Unary"};

// ---- Cast -----------------------------------------------------------------------------------

absl::StatusOr<OutputMetas> InferCast(const OpCall& call) {
  return One(In(call, 0).shape(), call.Attr<CastAttrs>().dtype);
}

void CandCast(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  AddElementwiseOptions(call, outs, i, options);
  const auto p = PartialOf(call, 0, i);
  // float -> float rounds each term (like a reduction in the target dtype would); monotone, so max
  // and min pass too. Casts to or from integers do not commute with the reduction.
  if (p && *p != ReduceOp::kProd && IsFloating(In(call, 0).dtype()) &&
      IsFloating(outs[0].dtype)) {
    AddPartialOf(call, 0, i, 1, *p, options);
  }
}

absl::StatusOr<LocalOutputs> RunCast(const OpCall& call, const LocalArgs& a) {
  return Out(ops::Cast(a.local(0), call.Attr<CastAttrs>().dtype));
}

const OpDecl kCastDecl{.op = OpId::kCast, .name = "Cast", .input_names = {"x"},
                       .attrs = kAttrsIndex<CastAttrs>, .infer = InferCast, .candidates = CandCast,
                       .run = RunCast,
                       .cuda = "none: the device's dtype conversion (core/tensor To/Cast copies)"};

// ---- Modulate -------------------------------------------------------------------------------

absl::StatusOr<OutputMetas> InferModulate(const OpCall& call) {
  const DTensorSpec& x = In(call, 0);
  DT_RETURN_IF_ERROR(NeedFloat(call, 0));
  for (int j = 1; j < 3; ++j) {
    DT_RETURN_IF_ERROR(NeedSameDType(call, 0, j));
    auto b = BroadcastShapes(x.shape(), In(call, j).shape());
    if (!b.ok() || *b != x.shape()) {
      return Bad(call, absl::StrCat(Arg(call, j), " does not broadcast to ", Arg(call, 0)));
    }
  }
  return One(x.shape(), x.dtype());
}

// Elementwise over x's shape: any shard common to the three (broadcast dims replicated). Not
// linear (shift is added, 1 + scale multiplies), so Partial inputs are reduced first.
void CandModulate(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  AddElementwiseOptions(call, outs, i, options);
}

absl::StatusOr<LocalOutputs> RunModulate(const OpCall& call, const LocalArgs& a) {
  return Out(ops::Modulate(a.local(0), a.local(1), a.local(2)));
}

const OpDecl kModulateDecl{.op = OpId::kModulate, .name = "Modulate",
                           .input_names = {"x", "scale", "shift"}, .attrs = kAttrsIndex<NoAttrs>,
                           .infer = InferModulate, .candidates = CandModulate, .run = RunModulate,
                           .cuda = "cuda::Modulate"};

// ---- GatedActivation ------------------------------------------------------------------------

absl::StatusOr<OutputMetas> InferGated(const OpCall& call) {
  DT_RETURN_IF_ERROR(NeedFloat(call, 0));
  DT_RETURN_IF_ERROR(NeedSameDType(call, 0, 1));
  if (In(call, 0).shape() != In(call, 1).shape()) {
    return Bad(call, absl::StrCat(Arg(call, 0), " and ", Arg(call, 1), ": shapes differ"));
  }
  return One(In(call, 0).shape(), In(call, 0).dtype());
}

// Elementwise: any shard common to gate and up. Linear in up, so a Partial up times a replicated
// gate stays Partial (as Mul's P * R); a Partial gate is reduced first.
void CandGated(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  AddElementwiseOptions(call, outs, i, options);
  AddLinearPartial(call, 1, i, 1, options);
}

absl::StatusOr<LocalOutputs> RunGated(const OpCall& call, const LocalArgs& a) {
  return Out(ops::GatedActivation(a.local(0), a.local(1), call.Attr<UnaryAttrs>().op));
}

const OpDecl kGatedActivationDecl{.op = OpId::kGatedActivation, .name = "GatedActivation",
                                  .input_names = {"gate", "up"}, .attrs = kAttrsIndex<UnaryAttrs>,
                                  .infer = InferGated, .candidates = CandGated, .run = RunGated,
                                  .cuda = "cuda::GatedActivation"};

// ---- SoftCap --------------------------------------------------------------------------------

absl::StatusOr<OutputMetas> InferSoftCap(const OpCall& call) {
  DT_RETURN_IF_ERROR(NeedFloat(call, 0));
  const double cap = call.Attr<SoftCapAttrs>().cap;
  if (!(cap > 0) || !std::isfinite(cap)) {
    return Bad(call, absl::StrCat("cap ", cap, ": expected a finite number > 0"));
  }
  return One(In(call, 0).shape(), In(call, 0).dtype());
}

// Elementwise: any shard of x. Not linear (cap·tanh(a/cap) + cap·tanh(b/cap) is not
// cap·tanh((a + b)/cap)), so no Partial candidate: a Partial x is reduced first.
void CandSoftCap(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  AddElementwiseOptions(call, outs, i, options);
}

absl::StatusOr<LocalOutputs> RunSoftCap(const OpCall& call, const LocalArgs& a) {
  const Tensor& x = a.local(0);
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(x.shape(), x.dtype(), x.device()));
  if (out.numel() > 0) {
    DT_RETURN_IF_ERROR(
        DT_OPS_KERNEL(out.device(), SoftCap, x, call.Attr<SoftCapAttrs>().cap, out));
  }
  return Out(std::move(out));
}

const OpDecl kSoftCapDecl{.op = OpId::kSoftCap, .name = "SoftCap", .input_names = {"x"},
                          .attrs = kAttrsIndex<SoftCapAttrs>, .infer = InferSoftCap,
                          .candidates = CandSoftCap, .run = RunSoftCap, .cuda = "cuda::SoftCap"};

}  // namespace dt::ops::internal::rules
