// The declarations (ops/op_decl.h) of Matmul and Linear. For each op, in this order: its shape rule
// (Infer), its sharding candidates (Cand), any whole-strategy check, its local run, and its row.

#include "dtensor/ops/decls/rules.h"

namespace dt::ops::internal::rules {

// ---- Matmul ---------------------------------------------------------------------------------

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

absl::StatusOr<LocalOutputs> RunMatmul(const OpCall& call, const LocalArgs& a) {
  const auto& at = call.Attr<MatmulAttrs>();
  return Out(ops::Matmul(a.local(0), a.local(1), at.trans_a, at.trans_b));
}

const OpDecl kMatmulDecl{.op = OpId::kMatmul, .name = "Matmul", .input_names = {"a", "b"},
                         .attrs = kAttrsIndex<MatmulAttrs>, .infer = InferMatmul,
                         .candidates = CandMatmul, .run = RunMatmul, .cuda = "cuda::Matmul"};

// ---- Linear ---------------------------------------------------------------------------------

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

absl::StatusOr<LocalOutputs> RunLinear(const OpCall& call, const LocalArgs& a) {
  // A Partial(sum) result gets the bias from one rank only (Note [Adding a replicated term to a
  // Partial] in dispatch.cc).
  const Tensor b = a.has(2) && a.TermIncludes(2, 0) ? a.local(2) : Tensor();
  return Out(ops::Linear(a.local(0), a.local(1), b));
}

const OpDecl kLinearDecl{.op = OpId::kLinear, .name = "Linear", .input_names = {"x", "w", "bias"},
                         .attrs = kAttrsIndex<NoAttrs>, .infer = InferLinear,
                         .candidates = CandLinear, .run = RunLinear, .cuda = "cuda::Matmul"};

}  // namespace dt::ops::internal::rules
