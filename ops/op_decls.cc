#include "dtensor/ops/op_decl.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <variant>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/ops/view_math.h"

namespace dt::dops {
namespace {

// ---- messages ------------------------------------------------------------------------------------

// "x f32[4, 6]"
std::string Arg(const OpCall& call, int j) {
  const DTensorSpec& s = *call.inputs[j];
  return absl::StrCat(InputName(call, j), " ", DTypeName(s.dtype()), ShapeToString(s.shape()));
}

absl::Status Bad(const OpCall& call, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(OpName(call), ": ", what));
}

const DTensorSpec& In(const OpCall& call, int j) { return *call.inputs[j]; }
bool Has(const OpCall& call, int j) { return call.inputs[j] != nullptr; }

absl::Status NeedFloat(const OpCall& call, int j) {
  if (IsFloating(In(call, j).dtype())) return absl::OkStatus();
  return Bad(call, absl::StrCat(Arg(call, j), ": expected a floating dtype (f32, bf16, f16)"));
}
absl::Status NeedNotBool(const OpCall& call, int j) {
  if (In(call, j).dtype() != DType::kBool) return absl::OkStatus();
  return Bad(call, absl::StrCat(Arg(call, j), ": bool is not supported"));
}
absl::Status NeedSameDType(const OpCall& call, int a, int b) {
  if (In(call, a).dtype() == In(call, b).dtype()) return absl::OkStatus();
  return Bad(call, absl::StrCat(Arg(call, a), " and ", Arg(call, b),
                                ": dtypes differ (cast first with Cast)"));
}

OutputMetas One(Shape shape, DType dtype) {
  OutputMetas m;
  m.push_back({std::move(shape), dtype});
  return m;
}

// ---- option helpers ------------------------------------------------------------------------------

// Linearity: input j keeps its Partial placement on mesh dim i, every other input is replicated,
// and every output is Partial(out_op).
void AddPartialOf(const OpCall& call, int j, int i, int n_out, ReduceOp out_op,
                  DimOptions* options) {
  DimOption o = ReplicateOption(call.num_inputs(), n_out);
  o.in[j] = call.inputs[j]->placements()[i];
  for (auto& p : o.out) p = Placement::Partial(out_op);
  options->push_back(std::move(o));
}
// The usual case: input j's Partial(sum|avg) passes through.
void AddLinearPartial(const OpCall& call, int j, int i, int n_out, DimOptions* options) {
  const auto op = PartialOf(call, j, i);
  if (op && IsSumLike(*op)) AddPartialOf(call, j, i, n_out, *op, options);
}
// Data movement: any Partial passes through; all present inputs must carry the same one.
void AddAnyPartial(const OpCall& call, int i, int n_out, DimOptions* options) {
  const auto op = PartialOf(call, 0, i);
  if (!op) return;
  DimOption o = ReplicateOption(call.num_inputs(), n_out);
  for (int j = 0; j < call.num_inputs(); ++j) {
    if (Has(call, j)) o.in[j] = Placement::Partial(*op);
  }
  for (auto& p : o.out) p = Placement::Partial(*op);
  options->push_back(std::move(o));
}

ReduceOp Swapped(ReduceOp op) {
  if (op == ReduceOp::kMax) return ReduceOp::kMin;
  if (op == ReduceOp::kMin) return ReduceOp::kMax;
  return op;
}

// ---- Matmul --------------------------------------------------------------------------------------

absl::StatusOr<OutputMetas> InferMatmul(const OpCall& call) {
  const DTensorSpec& a = In(call, 0);
  const DTensorSpec& b = In(call, 1);
  const bool ta = call.Attr<MatmulAttrs>().trans_a, tb = call.Attr<MatmulAttrs>().trans_b;
  if (a.ndim() < 2 || b.ndim() < 2) {
    return Bad(call, absl::StrCat(Arg(call, 0), ", ", Arg(call, 1), ": both need at least 2 dims"));
  }
  DT_RETURN_IF_ERROR(NeedFloat(call, 0));
  DT_RETURN_IF_ERROR(NeedSameDType(call, 0, 1));
  const int ra = a.ndim(), rb = b.ndim();
  const int64_t m = ta ? a.shape()[ra - 1] : a.shape()[ra - 2];
  const int64_t ka = ta ? a.shape()[ra - 2] : a.shape()[ra - 1];
  const int64_t kb = tb ? b.shape()[rb - 1] : b.shape()[rb - 2];
  const int64_t n = tb ? b.shape()[rb - 2] : b.shape()[rb - 1];
  if (ka != kb) {
    return Bad(call, absl::StrCat("inner dims differ: ", Arg(call, 0), ", ", Arg(call, 1), " (", ka,
                                  " vs ", kb, ")"));
  }
  auto batch = BroadcastShapes(IntSpan(a.shape()).subspan(0, ra - 2),
                               IntSpan(b.shape()).subspan(0, rb - 2));
  if (!batch.ok()) return Bad(call, absl::StrCat("batch dims: ", batch.status().message()));
  Shape out = *batch;
  out.push_back(m);
  out.push_back(n);
  return One(std::move(out), a.dtype());
}

LabelMap MatmulLabels(const OpCall& call, const Shape& out) {
  const bool ta = call.Attr<MatmulAttrs>().trans_a, tb = call.Attr<MatmulAttrs>().trans_b;
  const int nb = static_cast<int>(out.size()) - 2;
  LabelMap m;
  for (int o = 0; o < nb + 2; ++o) m.AddLabel(LabelKind::kFree);
  const int kM = nb, kN = nb + 1;
  const int kK = m.AddLabel(LabelKind::kSum);
  auto operand = [&](const DTensorSpec& s, int l0, int l1) {
    absl::InlinedVector<int, 6> dims;
    const int r = s.ndim();
    for (int d = 0; d < r - 2; ++d) {
      const int o = nb - (r - 2) + d;
      dims.push_back(s.shape()[d] == out[o] ? o : -1);
    }
    dims.push_back(l0);
    dims.push_back(l1);
    return dims;
  };
  m.in.push_back(operand(In(call, 0), ta ? kK : kM, ta ? kM : kK));
  m.in.push_back(operand(In(call, 1), tb ? kN : kK, tb ? kK : kN));
  absl::InlinedVector<int, 6> o;
  for (int d = 0; d < nb + 2; ++d) o.push_back(d);
  m.out.push_back(o);
  return m;
}

void CandMatmul(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  options->push_back(ReplicateOption(2, 1));
  AddShardOptions(call, MatmulLabels(call, outs[0].shape), i, options);
  AddLinearPartial(call, 0, i, 1, options);
  AddLinearPartial(call, 1, i, 1, options);
}

// ---- Linear --------------------------------------------------------------------------------------

absl::StatusOr<OutputMetas> InferLinear(const OpCall& call) {
  const DTensorSpec& x = In(call, 0);
  const DTensorSpec& w = In(call, 1);
  if (x.ndim() < 1 || w.ndim() != 2) {
    return Bad(call, absl::StrCat(Arg(call, 0), ", ", Arg(call, 1),
                                  ": expected x [..., in] and w [out, in]"));
  }
  DT_RETURN_IF_ERROR(NeedFloat(call, 0));
  // A quantized weight (Note [Quantized dtypes]) multiplies activations of any float dtype.
  if (!IsQuantized(w.dtype())) DT_RETURN_IF_ERROR(NeedSameDType(call, 0, 1));
  if (x.shape().back() != w.shape()[1]) {
    return Bad(call, absl::StrCat("in features differ: ", Arg(call, 0), ", ", Arg(call, 1), " (",
                                  x.shape().back(), " vs ", w.shape()[1], ")"));
  }
  if (Has(call, 2)) {
    const DTensorSpec& b = In(call, 2);
    DT_RETURN_IF_ERROR(NeedSameDType(call, 0, 2));
    if (b.ndim() != 1 || b.shape()[0] != w.shape()[0]) {
      return Bad(call, absl::StrCat(Arg(call, 2), ": expected [", w.shape()[0], "] for ",
                                    Arg(call, 1)));
    }
  }
  Shape out = x.shape();
  out.back() = w.shape()[0];
  return One(std::move(out), x.dtype());
}

void CandLinear(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  const int r = In(call, 0).ndim();
  LabelMap m;
  for (int d = 0; d < r - 1; ++d) m.AddLabel(LabelKind::kFree);
  const int n = m.AddLabel(LabelKind::kFree);
  const int k = m.AddLabel(LabelKind::kSum);
  absl::InlinedVector<int, 6> x, out;
  for (int d = 0; d < r - 1; ++d) {
    x.push_back(d);
    out.push_back(d);
  }
  x.push_back(k);
  out.push_back(n);
  m.in = {x, {n, k}, Has(call, 2) ? absl::InlinedVector<int, 6>{n} : absl::InlinedVector<int, 6>{}};
  m.out = {out};
  options->push_back(ReplicateOption(3, 1));
  AddShardOptions(call, m, i, options);
  // Linear in x (w, bias replicated) and in w (x, bias replicated); the bias is added once (sum) or
  // on every rank (avg) by the local runner. See Note [Adding a replicated term to a Partial].
  AddLinearPartial(call, 0, i, 1, options);
  AddLinearPartial(call, 1, i, 1, options);
}

// ---- pointwise -----------------------------------------------------------------------------------

absl::StatusOr<OutputMetas> InferBinary(const OpCall& call) {
  const auto op = call.Attr<BinaryAttrs>().op;
  DT_RETURN_IF_ERROR(NeedSameDType(call, 0, 1));
  if (op == ops::BinaryOp::kDiv) {
    DT_RETURN_IF_ERROR(NeedFloat(call, 0));
  } else {
    DT_RETURN_IF_ERROR(NeedNotBool(call, 0));
  }
  auto shape = BroadcastShapes(In(call, 0).shape(), In(call, 1).shape());
  if (!shape.ok()) {
    return Bad(call, absl::StrCat(Arg(call, 0), ", ", Arg(call, 1), ": ", shape.status().message()));
  }
  return One(*std::move(shape), In(call, 0).dtype());
}

void CandBinary(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  const auto op = call.Attr<BinaryAttrs>().op;
  options->push_back(ReplicateOption(2, 1));
  AddShardOptions(call, BroadcastLabels(call, outs[0].shape, 1), i, options);
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

absl::StatusOr<OutputMetas> InferBinaryScalar(const OpCall& call) {
  const auto op = call.Attr<BinaryScalarAttrs>().op;
  if (op == ops::BinaryOp::kDiv) {
    DT_RETURN_IF_ERROR(NeedFloat(call, 0));
  } else {
    DT_RETURN_IF_ERROR(NeedNotBool(call, 0));
  }
  const double s = call.Attr<BinaryScalarAttrs>().scalar;
  if (!IsFloating(In(call, 0).dtype()) && s != std::trunc(s)) {
    return Bad(call, absl::StrCat(Arg(call, 0), ": the scalar ", s, " is not integral"));
  }
  return One(In(call, 0).shape(), In(call, 0).dtype());
}

void CandBinaryScalar(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  const auto op = call.Attr<BinaryScalarAttrs>().op;
  const double s = call.Attr<BinaryScalarAttrs>().scalar;
  options->push_back(ReplicateOption(1, 1));
  AddShardOptions(call, BroadcastLabels(call, outs[0].shape, 1), i, options);
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

absl::StatusOr<OutputMetas> InferUnary(const OpCall& call) {
  const auto op = call.Attr<UnaryAttrs>().op;
  if (op == ops::UnaryOp::kNeg) {
    DT_RETURN_IF_ERROR(NeedNotBool(call, 0));
  } else {
    DT_RETURN_IF_ERROR(NeedFloat(call, 0));
  }
  return One(In(call, 0).shape(), In(call, 0).dtype());
}

void CandUnary(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  options->push_back(ReplicateOption(1, 1));
  AddShardOptions(call, BroadcastLabels(call, outs[0].shape, 1), i, options);
  const auto p = PartialOf(call, 0, i);
  if (p && call.Attr<UnaryAttrs>().op == ops::UnaryOp::kNeg &&
      *p != ReduceOp::kProd) {
    AddPartialOf(call, 0, i, 1, Swapped(*p), options);  // -max(x) = min(-x)
  }
}

absl::StatusOr<OutputMetas> InferCast(const OpCall& call) {
  return One(In(call, 0).shape(), call.Attr<CastAttrs>().dtype);
}

void CandCast(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  options->push_back(ReplicateOption(1, 1));
  AddShardOptions(call, BroadcastLabels(call, outs[0].shape, 1), i, options);
  const auto p = PartialOf(call, 0, i);
  // float -> float rounds each term (like a reduction in the target dtype would); monotone, so max
  // and min pass too. Casts to or from integers do not commute with the reduction.
  if (p && *p != ReduceOp::kProd && IsFloating(In(call, 0).dtype()) &&
      IsFloating(outs[0].dtype)) {
    AddPartialOf(call, 0, i, 1, *p, options);
  }
}

// ---- modulate -----------------------------------------------------------------------------------

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
  options->push_back(ReplicateOption(3, 1));
  AddShardOptions(call, BroadcastLabels(call, outs[0].shape, 1), i, options);
}

// ---- reductions ----------------------------------------------------------------------------------

absl::StatusOr<OutputMetas> InferReduce(const OpCall& call) {
  const auto op = call.Attr<ReduceAttrs>().op;
  const int dim = call.Attr<ReduceAttrs>().dim;
  const bool keepdim = call.Attr<ReduceAttrs>().keepdim;
  const DTensorSpec& x = In(call, 0);
  DType dtype = x.dtype();
  switch (op) {
    case ops::Reduction::kSum:
      DT_RETURN_IF_ERROR(NeedNotBool(call, 0));
      if (!IsFloating(dtype)) dtype = DType::kI64;
      break;
    case ops::Reduction::kMean:
      DT_RETURN_IF_ERROR(NeedFloat(call, 0));
      break;
    case ops::Reduction::kMax:
    case ops::Reduction::kArgmax:
      DT_RETURN_IF_ERROR(NeedNotBool(call, 0));
      if (x.shape()[dim] == 0) {
        return Bad(call, absl::StrCat(Arg(call, 0), ": dim ", dim, " has size 0"));
      }
      if (op == ops::Reduction::kArgmax) dtype = DType::kI64;
      break;
  }
  Shape out;
  for (int d = 0; d < x.ndim(); ++d) {
    if (d != dim) out.push_back(x.shape()[d]);
    else if (keepdim) out.push_back(1);
  }
  return One(std::move(out), dtype);
}

void CandReduce(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  const auto op = call.Attr<ReduceAttrs>().op;
  const int dim = call.Attr<ReduceAttrs>().dim;
  const bool keepdim = call.Attr<ReduceAttrs>().keepdim;
  const int r = In(call, 0).ndim();
  LabelMap m;
  absl::InlinedVector<int, 6> in, out;
  for (int d = 0; d < r; ++d) {
    if (d != dim) {
      const int l = m.AddLabel(LabelKind::kFree);
      in.push_back(l);
      out.push_back(l);
      continue;
    }
    switch (op) {
      case ops::Reduction::kSum:
      case ops::Reduction::kMean: in.push_back(m.AddLabel(LabelKind::kSum)); break;
      case ops::Reduction::kMax: in.push_back(m.AddLabel(LabelKind::kMax)); break;
      case ops::Reduction::kArgmax: in.push_back(-1); break;
    }
    if (keepdim) out.push_back(-1);
  }
  m.in = {in};
  m.out = {out};
  options->push_back(ReplicateOption(1, 1));
  AddShardOptions(call, m, i, options);
  const auto p = PartialOf(call, 0, i);
  if (!p) return;
  if ((op == ops::Reduction::kSum || op == ops::Reduction::kMean) && IsSumLike(*p)) {
    AddPartialOf(call, 0, i, 1, *p, options);
  } else if (op == ops::Reduction::kMax && *p == ReduceOp::kMax) {
    AddPartialOf(call, 0, i, 1, *p, options);
  }
}

// ---- softmax, norms, rotary ----------------------------------------------------------------------

absl::StatusOr<OutputMetas> InferSoftmax(const OpCall& call) {
  DT_RETURN_IF_ERROR(NeedFloat(call, 0));
  return One(In(call, 0).shape(), In(call, 0).dtype());
}

void CandSoftmax(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  const int dim = call.Attr<SoftmaxAttrs>().dim;
  options->push_back(ReplicateOption(1, 1));
  AddShardOptions(call, BroadcastLabels(call, outs[0].shape, 1, {dim}), i, options);
}

absl::StatusOr<OutputMetas> InferNorm(const OpCall& call) {
  const DTensorSpec& x = In(call, 0);
  if (x.ndim() < 1) return Bad(call, absl::StrCat(Arg(call, 0), ": needs at least 1 dim"));
  DT_RETURN_IF_ERROR(NeedFloat(call, 0));
  for (int j = 1; j < call.num_inputs(); ++j) {
    if (!Has(call, j)) continue;
    DT_RETURN_IF_ERROR(NeedSameDType(call, 0, j));
    if (In(call, j).shape() != Shape{x.shape().back()}) {
      return Bad(call, absl::StrCat(Arg(call, j), ": expected [", x.shape().back(), "] for ",
                                    Arg(call, 0)));
    }
  }
  return One(x.shape(), x.dtype());
}

void CandNorm(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  const int last = In(call, 0).ndim() - 1;
  options->push_back(ReplicateOption(call.num_inputs(), 1));
  AddShardOptions(call, BroadcastLabels(call, outs[0].shape, 1, {last}), i, options);
}

absl::StatusOr<OutputMetas> InferRotary(const OpCall& call) {
  const DTensorSpec& x = In(call, 0);
  if (x.ndim() < 1 || x.shape().back() % 2 != 0) {
    return Bad(call, absl::StrCat(Arg(call, 0), ": the last dim must be even"));
  }
  DT_RETURN_IF_ERROR(NeedFloat(call, 0));
  for (int j = 1; j < 3; ++j) {
    DT_RETURN_IF_ERROR(NeedFloat(call, j));
    auto b = BroadcastShapes(x.shape(), In(call, j).shape());
    if (!b.ok() || *b != x.shape()) {
      return Bad(call, absl::StrCat(Arg(call, j), " does not broadcast to ", Arg(call, 0)));
    }
  }
  return One(x.shape(), x.dtype());
}

void CandRotary(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  const int last = In(call, 0).ndim() - 1;
  options->push_back(ReplicateOption(3, 1));
  AddShardOptions(call, BroadcastLabels(call, outs[0].shape, 1, {last}), i, options);
  AddLinearPartial(call, 0, i, 1, options);  // rotation is linear in x
}

// ---- attention -----------------------------------------------------------------------------------

absl::StatusOr<OutputMetas> InferAttention(const OpCall& call) {
  const DTensorSpec& q = In(call, 0);
  const DTensorSpec& k = In(call, 1);
  const DTensorSpec& v = In(call, 2);
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4) {
    return Bad(call, absl::StrCat(Arg(call, 0), ", ", Arg(call, 1), ", ", Arg(call, 2),
                                  ": expected [B, H, S, D] each"));
  }
  DT_RETURN_IF_ERROR(NeedFloat(call, 0));
  DT_RETURN_IF_ERROR(NeedSameDType(call, 0, 1));
  DT_RETURN_IF_ERROR(NeedSameDType(call, 0, 2));
  const Shape &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  if (qs[0] != ks[0] || qs[0] != vs[0] || ks[1] != vs[1] || ks[2] != vs[2] || qs[3] != ks[3] ||
      ks[1] == 0 || qs[1] % ks[1] != 0) {
    return Bad(call, absl::StrCat(Arg(call, 0), ", ", Arg(call, 1), ", ", Arg(call, 2),
                                  ": expected q [B, Hq, Sq, D], k [B, Hkv, Skv, D], "
                                  "v [B, Hkv, Skv, Dv] with Hq % Hkv == 0"));
  }
  return One({qs[0], qs[1], qs[2], vs[3]}, q.dtype());
}

void CandAttention(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  auto opt = [&](Placement q, Placement kv, Placement out) {
    DimOption o;
    o.in = {q, kv, kv};
    o.out = {out};
    options->push_back(std::move(o));
  };
  const Placement r = Placement::Replicate();
  opt(r, r, r);
  opt(Placement::Shard(0), Placement::Shard(0), Placement::Shard(0));  // batch
  opt(Placement::Shard(1), Placement::Shard(1), Placement::Shard(1));  // heads (GQA-checked)
  opt(Placement::Shard(1), r, Placement::Shard(1));  // query heads; kv heads picked locally
  opt(Placement::Shard(2), r, Placement::Shard(2));  // queries; causal offsets shifted
  const auto p = PartialOf(call, 2, i);               // linear in v
  if (p && IsSumLike(*p)) {
    DimOption o = ReplicateOption(3, 1);
    o.in[2] = Placement::Partial(*p);
    o.out = {Placement::Partial(*p)};
    options->push_back(std::move(o));
  }
}

// The one contiguous range of `rl` (empty: {n, n}); nullopt when there are several.
std::optional<IndexRange> Contiguous(const RangeList& rl, int64_t n) {
  if (rl.empty()) return IndexRange{n, n};
  if (rl.size() != 1) return std::nullopt;
  return rl[0];
}

// Every rank's query heads need kv heads it holds: q heads [a, b) use kv heads [a/r, ceil(b/r)).
// Batch pieces of q, k and v agree; k and v hold the same heads.
absl::Status AttentionPiecesFit(const OpCall& call, absl::Span<const Placements> pl) {
  const DTensorSpec& q = In(call, 0);
  const DTensorSpec& k = In(call, 1);
  const DTensorSpec& v = In(call, 2);
  const int64_t hq = q.shape()[1], hkv = k.shape()[1], rep = hq / hkv;
  const IntSpan mesh = q.mesh().shape();
  return ForEachCoord(mesh, [&](IntSpan c) -> absl::Status {
    const DimRanges rq = ShardRanges(q.shape(), mesh, pl[0], c);
    const DimRanges rk = ShardRanges(k.shape(), mesh, pl[1], c);
    const DimRanges rv = ShardRanges(v.shape(), mesh, pl[2], c);
    if (rq[0] != rk[0] || rk[0] != rv[0] || rk[1] != rv[1]) {
      return absl::InvalidArgumentError(
          absl::StrCat(RankAt(q.mesh(), c), ": q, k and v pieces differ in batch or heads"));
    }
    const auto qh = Contiguous(rq[1], hq);
    const auto kh = Contiguous(rk[1], hkv);
    if (!qh || !kh) return absl::InvalidArgumentError("heads must be split into contiguous ranges");
    if (qh->size() == 0) return absl::OkStatus();
    const int64_t need_a = qh->start / rep, need_b = (qh->stop + rep - 1) / rep;
    if (need_a < kh->start || need_b > kh->stop) {
      return absl::InvalidArgumentError(absl::StrCat(
          RankAt(q.mesh(), c), " holds q heads [", qh->start, ", ", qh->stop,
          ") but kv heads [", kh->start, ", ", kh->stop, ") (it needs [", need_a, ", ", need_b,
          "))"));
    }
    return absl::OkStatus();
  });
}

absl::Status CheckAttention(const OpCall& call, const OutputMetas& outs, const Strategy& s) {
  return AttentionPiecesFit(call, s.inputs);
}

// Inputs that already split the heads of q and of k (or v) on one mesh dim must do so consistently:
// silently gathering kv heads would hide a broken tensor-parallel plan.
absl::Status PrecheckAttention(const OpCall& call) {
  const DTensorSpec& q = In(call, 0);
  bool both = false;
  for (int i = 0; i < q.mesh().ndim(); ++i) {
    if (q.mesh().Size(i) <= 1 || !q.placements()[i].is_any_shard(1)) continue;
    for (int j = 1; j < 3; ++j) {
      if (In(call, j).placements()[i].is_any_shard(1)) both = true;
    }
  }
  if (!both) return absl::OkStatus();
  Placements pq = q.placements(), pk = In(call, 1).placements(), pv = In(call, 2).placements();
  // Only the head split matters here: treat every other shard as replicated.
  for (Placements* pl : {&pq, &pk, &pv}) {
    for (Placement& p : *pl) {
      if (!p.is_any_shard(1)) p = Placement::Replicate();
    }
  }
  absl::Status st = AttentionPiecesFit(call, {pq, pk, pv});
  if (st.ok()) return st;
  return Bad(call, absl::StrCat(
                       "q ", PlacementsToString(q.placements()), ", k ",
                       PlacementsToString(In(call, 1).placements()), " and v ",
                       PlacementsToString(In(call, 2).placements()), " on ", q.mesh().ToString(),
                       " split the heads inconsistently for GQA (q heads ", q.shape()[1],
                       ", kv heads ", In(call, 1).shape()[1], "): ", st.message()));
}

// ---- embedding -----------------------------------------------------------------------------------

absl::StatusOr<OutputMetas> InferEmbedding(const OpCall& call) {
  const DTensorSpec& t = In(call, 0);
  const DTensorSpec& ids = In(call, 1);
  if (t.ndim() != 2) return Bad(call, absl::StrCat(Arg(call, 0), ": expected [V, H]"));
  if (ids.dtype() != DType::kI64 && ids.dtype() != DType::kI32) {
    return Bad(call, absl::StrCat(Arg(call, 1), ": expected i64 or i32 ids"));
  }
  Shape out = ids.shape();
  out.push_back(t.shape()[1]);
  // A quantized table's rows come out dequantized (ops::Embedding).
  return One(std::move(out), IsQuantized(t.dtype()) ? DType::kF32 : t.dtype());
}

void CandEmbedding(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  const int r = In(call, 1).ndim();
  LabelMap m;
  absl::InlinedVector<int, 6> ids, out;
  for (int d = 0; d < r; ++d) {
    const int l = m.AddLabel(LabelKind::kFree);
    ids.push_back(l);
    out.push_back(l);
  }
  const int v = m.AddLabel(LabelKind::kMasked);
  const int h = m.AddLabel(LabelKind::kFree);
  out.push_back(h);
  m.in = {{v, h}, ids};
  m.out = {out};
  options->push_back(ReplicateOption(2, 1));
  AddShardOptions(call, m, i, options);
  // Row selection commutes with every reduction: a Partial table gives a Partial lookup.
  if (const auto p = PartialOf(call, 0, i)) AddPartialOf(call, 0, i, 1, *p, options);
}

// ---- view ----------------------------------------------------------------------------------------

absl::StatusOr<OutputMetas> InferView(const OpCall& call) {
  const DTensorSpec& x = In(call, 0);
  Shape out = call.Attr<ViewAttrs>().shape;
  if (Numel(out) != Numel(x.shape())) {
    return Bad(call, absl::StrCat(Arg(call, 0), ": cannot view as ", ShapeToString(out), " (",
                                  Numel(x.shape()), " vs ", Numel(out), " elements)"));
  }
  return One(std::move(out), x.dtype());
}

void CandView(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  const DTensorSpec& x = In(call, 0);
  options->push_back(ReplicateOption(1, 1));
  AddAnyPartial(call, i, 1, options);
  if (Numel(x.shape()) == 0) return;
  const Placement& cur = x.placements()[i];
  for (const ViewGroup& g : ViewGroups(x.shape(), outs[0].shape)) {
    if (g.in_lead < 0) continue;
    DimOption o;
    o.in = {Placement::Shard(g.in_lead)};
    o.out = {Placement::Shard(g.out_lead)};
    options->push_back(o);
    // A group that only adds or drops size-1 dims keeps interleaved shards too.
    if (g.in_inner == 1 && g.out_inner == 1 && cur.is_strided_shard() && cur.dim() == g.in_lead) {
      o.in = {cur};
      o.out = {cur.WithDim(g.out_lead)};
      options->push_back(std::move(o));
    }
  }
}

absl::Status CheckView(const OpCall& call, const OutputMetas& outs, const Strategy& s) {
  const DTensorSpec& x = In(call, 0);
  return ViewPiecesMatch(x.shape(), outs[0].shape, x.mesh().shape(), s.inputs[0], s.outputs[0]);
}

// ---- permute, unsqueeze, squeeze -----------------------------------------------------------------

absl::StatusOr<OutputMetas> InferPermute(const OpCall& call) {
  const DTensorSpec& x = In(call, 0);
  Shape out;
  for (int64_t d : call.Attr<PermuteAttrs>().perm) out.push_back(x.shape()[d]);
  return One(std::move(out), x.dtype());
}

void CandPermute(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  LabelMap m;
  const int r = In(call, 0).ndim();
  absl::InlinedVector<int, 6> in(static_cast<size_t>(r)), out;
  for (int o = 0; o < r; ++o) {
    const int l = m.AddLabel(LabelKind::kFree);
    in[call.Attr<PermuteAttrs>().perm[o]] = l;
    out.push_back(l);
  }
  m.in = {in};
  m.out = {out};
  options->push_back(ReplicateOption(1, 1));
  AddShardOptions(call, m, i, options);
  AddAnyPartial(call, i, 1, options);
}

absl::StatusOr<OutputMetas> InferUnsqueeze(const OpCall& call) {
  Shape out = In(call, 0).shape();
  out.insert(out.begin() + call.Attr<DimAttrs>().dim, 1);
  return One(std::move(out), In(call, 0).dtype());
}

absl::StatusOr<OutputMetas> InferSqueeze(const OpCall& call) {
  const int dim = call.Attr<DimAttrs>().dim;
  Shape out = In(call, 0).shape();
  if (out[dim] != 1) {
    return Bad(call, absl::StrCat(Arg(call, 0), ": dim ", dim, " has size ", out[dim], ", not 1"));
  }
  out.erase(out.begin() + dim);
  return One(std::move(out), In(call, 0).dtype());
}

// Unsqueeze and Squeeze: every other dim keeps its label; the inserted or removed dim has none.
void CandSqueezeLike(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  const bool unsqueeze = call.op == OpId::kUnsqueeze;
  const int dim = call.Attr<DimAttrs>().dim;
  const int r = In(call, 0).ndim();
  LabelMap m;
  absl::InlinedVector<int, 6> in, out;
  for (int d = 0; d < r; ++d) {
    if (!unsqueeze && d == dim) {
      in.push_back(-1);
      continue;
    }
    if (unsqueeze && d == dim) out.push_back(-1);
    const int l = m.AddLabel(LabelKind::kFree);
    in.push_back(l);
    out.push_back(l);
  }
  if (unsqueeze && dim == r) out.push_back(-1);
  m.in = {in};
  m.out = {out};
  options->push_back(ReplicateOption(1, 1));
  AddShardOptions(call, m, i, options);
  AddAnyPartial(call, i, 1, options);
}

// ---- cat, split ----------------------------------------------------------------------------------

absl::StatusOr<OutputMetas> InferCat(const OpCall& call) {
  const int dim = call.Attr<DimAttrs>().dim;
  const DTensorSpec& x0 = In(call, 0);
  Shape out = x0.shape();
  out[dim] = 0;
  for (int j = 0; j < call.num_inputs(); ++j) {
    const DTensorSpec& x = In(call, j);
    DT_RETURN_IF_ERROR(NeedSameDType(call, 0, j));
    bool ok = x.ndim() == x0.ndim();
    for (int d = 0; ok && d < x.ndim(); ++d) ok = d == dim || x.shape()[d] == x0.shape()[d];
    if (!ok) {
      return Bad(call, absl::StrCat(Arg(call, 0), " and ", Arg(call, j), ": sizes differ off dim ",
                                    dim));
    }
    out[dim] += x.shape()[dim];
  }
  return One(std::move(out), x0.dtype());
}

void CandCat(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  const int dim = call.Attr<DimAttrs>().dim;
  const int n = call.num_inputs();
  const int r = In(call, 0).ndim();
  LabelMap m;
  absl::InlinedVector<int, 6> dims;
  for (int d = 0; d < r; ++d) dims.push_back(d == dim ? -1 : m.AddLabel(LabelKind::kFree));
  for (int j = 0; j < n; ++j) m.in.push_back(dims);
  m.out = {dims};
  options->push_back(ReplicateOption(n, 1));
  AddShardOptions(call, m, i, options);
  // Sharded along dim: every rank concatenates its pieces, which is the interleaved shard whose
  // blocks are the inputs (their own blocks, for inputs that are interleaved already).
  DimOption o;
  std::vector<int64_t> blocks;
  for (int j = 0; j < n; ++j) {
    const Placement& cur = In(call, j).placements()[i];
    const Placement p = cur.is_any_shard(dim) ? cur : Placement::Shard(dim);
    for (int64_t b : p.BlockSizes(In(call, j).shape()[dim])) blocks.push_back(b);
    o.in.push_back(p);
  }
  o.out = {blocks.size() == 1 ? Placement::Shard(dim) : Placement::BlockShard(dim, blocks)};
  options->push_back(std::move(o));
  // Partial: all inputs carry the same one.
  const auto p = PartialOf(call, 0, i);
  bool same = p.has_value();
  for (int j = 1; same && j < n; ++j) same = PartialOf(call, j, i) == p;
  if (same) AddAnyPartial(call, i, 1, options);
}

// The mesh dims (of size > 1) whose placement in `pl` shards `dim`.
int CountShardingDims(IntSpan mesh, absl::Span<const Placement> pl, int dim) {
  int n = 0;
  for (size_t i = 0; i < pl.size(); ++i) n += mesh[i] > 1 && pl[i].is_any_shard(dim);
  return n;
}

absl::Status CheckCat(const OpCall& call, const OutputMetas& outs, const Strategy& s) {
  const int dim = call.Attr<DimAttrs>().dim;
  if (CountShardingDims(In(call, 0).mesh().shape(), s.outputs[0], dim) > 1) {
    return absl::InvalidArgumentError("the cat dim is split by more than one mesh dim");
  }
  return absl::OkStatus();
}

absl::StatusOr<OutputMetas> InferSplit(const OpCall& call) {
  const DTensorSpec& x = In(call, 0);
  const int dim = call.Attr<SplitAttrs>().dim;
  int64_t total = 0;
  OutputMetas outs;
  for (const int64_t n : call.Attr<SplitAttrs>().sizes) {
    if (n < 0) return Bad(call, absl::StrCat(Arg(call, 0), ": negative split size ", n));
    total += n;
    Shape s = x.shape();
    s[dim] = n;
    outs.push_back({std::move(s), x.dtype()});
  }
  if (total != x.shape()[dim]) {
    return Bad(call, absl::StrCat(Arg(call, 0), ": split sizes sum to ", total, ", dim ", dim,
                                  " has ", x.shape()[dim]));
  }
  return outs;
}

void CandSplit(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  const int dim = call.Attr<SplitAttrs>().dim;
  const int n_out = static_cast<int>(outs.size());
  const DTensorSpec& x = In(call, 0);
  LabelMap m;
  absl::InlinedVector<int, 6> dims;
  for (int d = 0; d < x.ndim(); ++d) dims.push_back(d == dim ? -1 : m.AddLabel(LabelKind::kFree));
  m.in = {dims};
  for (int k = 0; k < n_out; ++k) m.out.push_back(dims);
  options->push_back(ReplicateOption(1, n_out));
  AddShardOptions(call, m, i, options);
  AddAnyPartial(call, i, n_out, options);
  // Split along an interleaved shard at block boundaries: every piece is a run of whole blocks,
  // and every rank's piece of it is its chunks of those blocks.
  const Placement& cur = x.placements()[i];
  if (!cur.is_any_shard(dim)) return;
  const auto blocks = cur.BlockSizes(x.shape()[dim]);
  DimOption o;
  o.in = {cur};
  size_t b = 0;
  for (int k = 0; k < n_out; ++k) {
    int64_t want = outs[k].shape[dim];
    std::vector<int64_t> mine;
    while (want > 0 && b < blocks.size() && blocks[b] <= want) {
      want -= blocks[b];
      mine.push_back(blocks[b++]);
    }
    if (want != 0) return;  // a piece boundary falls inside a block
    o.out.push_back(mine.size() <= 1 ? Placement::Shard(dim) : Placement::BlockShard(dim, mine));
  }
  options->push_back(std::move(o));
}

absl::Status CheckSplit(const OpCall& call, const OutputMetas& outs, const Strategy& s) {
  const int dim = call.Attr<SplitAttrs>().dim;
  if (CountShardingDims(In(call, 0).mesh().shape(), s.inputs[0], dim) > 1) {
    return absl::InvalidArgumentError("the split dim is split by more than one mesh dim");
  }
  return absl::OkStatus();
}

// ---- topk ----------------------------------------------------------------------------------------

absl::StatusOr<OutputMetas> InferTopK(const OpCall& call) {
  const DTensorSpec& x = In(call, 0);
  const int64_t k = call.Attr<TopKAttrs>().k;
  const int dim = call.Attr<TopKAttrs>().dim;
  DT_RETURN_IF_ERROR(NeedNotBool(call, 0));
  if (k < 0 || k > x.shape()[dim]) {
    return Bad(call, absl::StrCat(Arg(call, 0), ": k ", k, " is out of range for dim ", dim,
                                  " of size ", x.shape()[dim]));
  }
  Shape s = x.shape();
  s[dim] = k;
  OutputMetas outs;
  outs.push_back({s, x.dtype()});
  outs.push_back({s, DType::kI64});
  return outs;
}

void CandTopK(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  const int dim = call.Attr<TopKAttrs>().dim;
  options->push_back(ReplicateOption(1, 2));
  AddShardOptions(call, BroadcastLabels(call, outs[0].shape, 2, {dim}), i, options);
}

// ---- local runners: this rank's pieces in, this rank's pieces out -------------------------------

LocalOutputs Out(Tensor t) {
  LocalOutputs o;
  o.push_back(std::move(t));
  return o;
}

// The lowest value of a dtype (the identity of max).
double Lowest(DType t) {
  switch (t) {
    case DType::kI64: return static_cast<double>(std::numeric_limits<int64_t>::min());
    case DType::kI32: return static_cast<double>(std::numeric_limits<int32_t>::min());
    case DType::kU8: return 0;
    case DType::kBool: return 0;
    default: return -std::numeric_limits<double>::infinity();
  }
}

absl::StatusOr<LocalOutputs> RunMatmul(const OpCall& call, const LocalArgs& a) {
  const auto& at = call.Attr<MatmulAttrs>();
  DT_ASSIGN_OR_RETURN(Tensor y, ops::Matmul(a.local(0), a.local(1), at.trans_a, at.trans_b));
  return Out(std::move(y));
}

absl::StatusOr<LocalOutputs> RunLinear(const OpCall& call, const LocalArgs& a) {
  // A Partial(sum) result gets the bias from one rank only (Note [Adding a replicated term to a
  // Partial] in dispatch.cc).
  const Tensor b = a.has(2) && a.TermIncludes(2, 0) ? a.local(2) : Tensor();
  DT_ASSIGN_OR_RETURN(Tensor y, ops::Linear(a.local(0), a.local(1), b));
  return Out(std::move(y));
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

absl::StatusOr<LocalOutputs> RunBinaryScalar(const OpCall& call, const LocalArgs& a) {
  const auto& at = call.Attr<BinaryScalarAttrs>();
  const bool additive = at.op == ops::BinaryOp::kAdd || at.op == ops::BinaryOp::kSub;
  if (additive && !a.TermIncludes(-1, 0)) {
    DT_ASSIGN_OR_RETURN(Tensor y, a.local(0).Clone());
    return Out(std::move(y));
  }
  DT_ASSIGN_OR_RETURN(Tensor y, ops::Binary(at.op, a.local(0), at.scalar));
  return Out(std::move(y));
}

absl::StatusOr<LocalOutputs> RunUnary(const OpCall& call, const LocalArgs& a) {
  DT_ASSIGN_OR_RETURN(Tensor y, ops::Unary(call.Attr<UnaryAttrs>().op, a.local(0)));
  return Out(std::move(y));
}

absl::StatusOr<LocalOutputs> RunCast(const OpCall& call, const LocalArgs& a) {
  DT_ASSIGN_OR_RETURN(Tensor y, ops::Cast(a.local(0), call.Attr<CastAttrs>().dtype));
  return Out(std::move(y));
}

absl::StatusOr<LocalOutputs> RunReduce(const OpCall& call, const LocalArgs& a) {
  const auto& at = call.Attr<ReduceAttrs>();
  const Tensor& v = a.local(0);
  const bool split = a.Sharded(0, at.dim);  // the result is Partial over the split
  Tensor y;
  if (at.op == ops::Reduction::kMean && split) {
    DT_ASSIGN_OR_RETURN(Tensor s, ops::Sum(v, at.dim, at.keepdim));
    DT_ASSIGN_OR_RETURN(y, ops::Div(s, static_cast<double>(a.global_shape(0)[at.dim])));
  } else if (at.op == ops::Reduction::kMax && split && v.size(at.dim) == 0) {
    DT_ASSIGN_OR_RETURN(y, Tensor::Full(a.OutLocalShape(0), Lowest(v.dtype()), v.dtype(),
                                        v.device()));
  } else {
    DT_ASSIGN_OR_RETURN(y, ops::Reduce(at.op, v, at.dim, at.keepdim));
  }
  return Out(std::move(y));
}

absl::StatusOr<LocalOutputs> RunSoftmax(const OpCall& call, const LocalArgs& a) {
  const auto& at = call.Attr<SoftmaxAttrs>();
  DT_ASSIGN_OR_RETURN(Tensor y, at.log ? ops::LogSoftmax(a.local(0), at.dim)
                                       : ops::Softmax(a.local(0), at.dim));
  return Out(std::move(y));
}

absl::StatusOr<LocalOutputs> RunRmsNorm(const OpCall& call, const LocalArgs& a) {
  DT_ASSIGN_OR_RETURN(Tensor y, ops::RmsNorm(a.local(0), a.has(1) ? a.local(1) : Tensor(),
                                             call.Attr<NormAttrs>().eps));
  return Out(std::move(y));
}

absl::StatusOr<LocalOutputs> RunLayerNorm(const OpCall& call, const LocalArgs& a) {
  DT_ASSIGN_OR_RETURN(Tensor y, ops::LayerNorm(a.local(0), a.has(1) ? a.local(1) : Tensor(),
                                               a.has(2) ? a.local(2) : Tensor(),
                                               call.Attr<NormAttrs>().eps));
  return Out(std::move(y));
}

absl::StatusOr<LocalOutputs> RunRotary(const OpCall& call, const LocalArgs& a) {
  DT_ASSIGN_OR_RETURN(Tensor y, ops::ApplyRotary(a.local(0), a.local(1), a.local(2),
                                                 call.Attr<RotaryAttrs>().style));
  return Out(std::move(y));
}

absl::StatusOr<LocalOutputs> RunAttention(const OpCall& call, const LocalArgs& a) {
  const auto& at = call.Attr<AttentionAttrs>();
  const Tensor &ql = a.local(0), &kl = a.local(1), &vl = a.local(2);
  const Shape &q = a.global_shape(0), &k = a.global_shape(1);
  ops::AttentionOptions opts{at.causal, at.scale, at.kv_length, at.q_offset};
  if (a.distributed() && ql.numel() == 0) {  // no query heads or rows here
    DT_ASSIGN_OR_RETURN(Tensor y, Tensor::Empty(a.OutLocalShape(0), ql.dtype(), ql.device()));
    return Out(std::move(y));
  }
  // Queries split along the sequence: this rank's first query sits at its offset.
  if (a.Sharded(0, 2)) {
    const int64_t kv_len = at.kv_length.value_or(k[2]);
    opts.kv_length = kv_len;
    opts.q_offset = at.q_offset.value_or(kv_len - q[2]) + a.OffsetAlong(0, 2);
  }
  // Heads: query head h uses kv head h / rep (GQA). Keep the kv heads this rank's query heads
  // need; when its query heads do not start and end on group boundaries, give every query head
  // its own kv head.
  const int64_t rep = q[1] / k[1];
  const int64_t qa = a.OffsetAlong(0, 1), qb = qa + ql.size(1);
  const int64_t ka = a.OffsetAlong(1, 1);
  Tensor kk, vv;
  if (qa % rep == 0 && qb % rep == 0) {
    DT_ASSIGN_OR_RETURN(kk, kl.Narrow(1, qa / rep - ka, (qb - qa) / rep));
    DT_ASSIGN_OR_RETURN(vv, vl.Narrow(1, qa / rep - ka, (qb - qa) / rep));
  } else {
    std::vector<Tensor> ks, vs;
    for (int64_t h = qa; h < qb; ++h) {
      DT_ASSIGN_OR_RETURN(Tensor kh, kl.Narrow(1, h / rep - ka, 1));
      DT_ASSIGN_OR_RETURN(Tensor vh, vl.Narrow(1, h / rep - ka, 1));
      ks.push_back(std::move(kh));
      vs.push_back(std::move(vh));
    }
    DT_ASSIGN_OR_RETURN(kk, ops::Cat(ks, 1));
    DT_ASSIGN_OR_RETURN(vv, ops::Cat(vs, 1));
  }
  DT_ASSIGN_OR_RETURN(Tensor y, ops::ScaledDotProductAttention(ql, kk, vv, opts));
  return Out(std::move(y));
}

absl::StatusOr<LocalOutputs> RunEmbedding(const OpCall& call, const LocalArgs& a) {
  // A vocab-split table looks up the ids in its rows only; the others give zero rows and the
  // result is Partial(sum) (PyTorch's _MaskPartial).
  DT_ASSIGN_OR_RETURN(Tensor y, ops::Embedding(a.local(0), a.local(1), a.OffsetAlong(0, 0)));
  return Out(std::move(y));
}

absl::StatusOr<LocalOutputs> RunView(const OpCall& call, const LocalArgs& a) {
  const Shape& whole = call.Attr<ViewAttrs>().shape;
  DT_ASSIGN_OR_RETURN(Tensor y, a.local(0).Reshape(a.distributed() ? a.OutLocalShape(0) : whole));
  return Out(std::move(y));
}

absl::StatusOr<LocalOutputs> RunPermute(const OpCall& call, const LocalArgs& a) {
  DT_ASSIGN_OR_RETURN(Tensor y, a.local(0).Permute(call.Attr<PermuteAttrs>().perm));
  return Out(std::move(y));
}

absl::StatusOr<LocalOutputs> RunUnsqueeze(const OpCall& call, const LocalArgs& a) {
  DT_ASSIGN_OR_RETURN(Tensor y, a.local(0).Unsqueeze(call.Attr<DimAttrs>().dim));
  return Out(std::move(y));
}

absl::StatusOr<LocalOutputs> RunSqueeze(const OpCall& call, const LocalArgs& a) {
  DT_ASSIGN_OR_RETURN(Tensor y, a.local(0).Squeeze(call.Attr<DimAttrs>().dim));
  return Out(std::move(y));
}

absl::StatusOr<LocalOutputs> RunCat(const OpCall& call, const LocalArgs& a) {
  std::vector<Tensor> locals;
  for (int j = 0; j < call.num_inputs(); ++j) locals.push_back(a.local(j));
  DT_ASSIGN_OR_RETURN(Tensor y, ops::Cat(locals, call.Attr<DimAttrs>().dim));
  return Out(std::move(y));
}

absl::StatusOr<LocalOutputs> RunSplit(const OpCall& call, const LocalArgs& a) {
  const auto& at = call.Attr<SplitAttrs>();
  std::vector<int64_t> sizes(at.sizes.begin(), at.sizes.end());
  if (a.distributed()) {
    for (size_t k = 0; k < sizes.size(); ++k) sizes[k] = a.OutLocalShape(static_cast<int>(k))[at.dim];
  }
  DT_ASSIGN_OR_RETURN(std::vector<Tensor> pieces, ops::Split(a.local(0), sizes, at.dim));
  return LocalOutputs(pieces.begin(), pieces.end());
}

absl::StatusOr<LocalOutputs> RunModulate(const OpCall& call, const LocalArgs& a) {
  DT_ASSIGN_OR_RETURN(Tensor y, ops::Modulate(a.local(0), a.local(1), a.local(2)));
  return Out(std::move(y));
}

absl::StatusOr<LocalOutputs> RunTopK(const OpCall& call, const LocalArgs& a) {
  const auto& at = call.Attr<TopKAttrs>();
  DT_ASSIGN_OR_RETURN(ops::TopKResult r, ops::TopK(a.local(0), at.k, at.dim, at.largest));
  LocalOutputs o;
  o.push_back(std::move(r.values));
  o.push_back(std::move(r.indices));
  return o;
}

// ---- the declarations -----------------------------------------------------------------------------

// "cuda::X": the CUDA kernel in ops/local/kernels.h that ops:: reaches; otherwise why none is
// needed. tests/ops/op_decl_test.cc checks both.
constexpr const char* kMetadataOnly = "none: a view of the local piece (metadata only)";

const OpDecl kDecls[] = {
    {OpId::kMatmul, "Matmul", {"a", "b"}, kAttrsIndex<MatmulAttrs>, InferMatmul, CandMatmul, nullptr,
     nullptr, RunMatmul, "cuda::Matmul"},
    {OpId::kLinear, "Linear", {"x", "w", "bias"}, kAttrsIndex<NoAttrs>, InferLinear, CandLinear,
     nullptr, nullptr, RunLinear, "cuda::Matmul"},
    {OpId::kBinary, "Binary", {"a", "b"}, kAttrsIndex<BinaryAttrs>, InferBinary, CandBinary, nullptr,
     nullptr, RunBinary, "cuda::Binary"},
    {OpId::kBinaryScalar, "BinaryScalar", {"x"}, kAttrsIndex<BinaryScalarAttrs>, InferBinaryScalar,
     CandBinaryScalar, nullptr, nullptr, RunBinaryScalar, "cuda::BinaryScalar"},
    {OpId::kUnary, "Unary", {"x"}, kAttrsIndex<UnaryAttrs>, InferUnary, CandUnary, nullptr, nullptr,
     RunUnary, "cuda::Unary"},
    {OpId::kCast, "Cast", {"x"}, kAttrsIndex<CastAttrs>, InferCast, CandCast, nullptr, nullptr, RunCast,
     "none: the device's dtype conversion (core/tensor To/Cast copies)"},
    {OpId::kReduce, "Reduce", {"x"}, kAttrsIndex<ReduceAttrs>, InferReduce, CandReduce, nullptr,
     nullptr, RunReduce, "cuda::Reduce"},
    {OpId::kSoftmax, "Softmax", {"x"}, kAttrsIndex<SoftmaxAttrs>, InferSoftmax, CandSoftmax, nullptr,
     nullptr, RunSoftmax, "cuda::Softmax"},
    {OpId::kRmsNorm, "RmsNorm", {"x", "weight"}, kAttrsIndex<NormAttrs>, InferNorm, CandNorm, nullptr,
     nullptr, RunRmsNorm, "cuda::RmsNorm"},
    {OpId::kLayerNorm, "LayerNorm", {"x", "weight", "bias"}, kAttrsIndex<NormAttrs>, InferNorm,
     CandNorm, nullptr, nullptr, RunLayerNorm, "cuda::LayerNorm"},
    {OpId::kRotary, "ApplyRotary", {"x", "cos", "sin"}, kAttrsIndex<RotaryAttrs>, InferRotary,
     CandRotary, nullptr, nullptr, RunRotary, "cuda::ApplyRotary"},
    {OpId::kAttention, "ScaledDotProductAttention", {"q", "k", "v"}, kAttrsIndex<AttentionAttrs>,
     InferAttention, CandAttention, CheckAttention, PrecheckAttention, RunAttention,
     "cuda::Attention"},
    {OpId::kEmbedding, "Embedding", {"table", "ids"}, kAttrsIndex<NoAttrs>, InferEmbedding,
     CandEmbedding, nullptr, nullptr, RunEmbedding, "cuda::Embedding"},
    {OpId::kView, "View", {"x"}, kAttrsIndex<ViewAttrs>, InferView, CandView, CheckView, nullptr,
     RunView, kMetadataOnly},
    {OpId::kPermute, "Permute", {"x"}, kAttrsIndex<PermuteAttrs>, InferPermute, CandPermute, nullptr,
     nullptr, RunPermute, kMetadataOnly},
    {OpId::kUnsqueeze, "Unsqueeze", {"x"}, kAttrsIndex<DimAttrs>, InferUnsqueeze, CandSqueezeLike,
     nullptr, nullptr, RunUnsqueeze, kMetadataOnly},
    {OpId::kSqueeze, "Squeeze", {"x"}, kAttrsIndex<DimAttrs>, InferSqueeze, CandSqueezeLike, nullptr,
     nullptr, RunSqueeze, kMetadataOnly},
    {OpId::kCat, "Cat", {"tensors"}, kAttrsIndex<DimAttrs>, InferCat, CandCat, CheckCat, nullptr,
     RunCat, "none: strided device copies (Tensor::CopyFrom)"},
    {OpId::kSplit, "Split", {"x"}, kAttrsIndex<SplitAttrs>, InferSplit, CandSplit, CheckSplit, nullptr,
     RunSplit, kMetadataOnly},
    {OpId::kTopK, "TopK", {"x"}, kAttrsIndex<TopKAttrs>, InferTopK, CandTopK, nullptr, nullptr, RunTopK,
     "cuda::TopK"},
    {OpId::kModulate, "Modulate", {"x", "scale", "shift"}, kAttrsIndex<NoAttrs>, InferModulate,
     CandModulate, nullptr, nullptr, RunModulate, "cuda::Modulate"},
};

}  // namespace

const OpDecl& DeclOf(OpId op) {
  const OpDecl& d = kDecls[static_cast<int>(op)];
  DT_CHECK(d.op == op, "declaration table out of order at ", static_cast<int>(op));
  return d;
}

absl::Span<const OpDecl> AllOps() { return kDecls; }

const char* OpName(const OpCall& call) {
  return call.name != nullptr ? call.name : DeclOf(call.op).name;
}

std::string InputName(const OpCall& call, int j) {
  const OpDecl& rule = DeclOf(call.op);
  if (call.op == OpId::kCat) return absl::StrCat("tensors[", j, "]");
  return j < static_cast<int>(rule.input_names.size()) ? rule.input_names[j] : absl::StrCat("#", j);
}

std::string DescribeInputs(const OpCall& call) {
  std::vector<std::string> parts;
  for (int j = 0; j < call.num_inputs(); ++j) {
    if (!Has(call, j)) continue;
    parts.push_back(absl::StrCat(InputName(call, j), " ", PlacementsToString(In(call, j).placements())));
  }
  return absl::StrCat(absl::StrJoin(parts, ", "), " on ", call.first().mesh().ToString());
}

}  // namespace dt::dops
