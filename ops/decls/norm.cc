// The declarations (ops/op_decl.h) of RmsNorm, LayerNorm and ApplyRotary. For each op, in this
// order: its shape rule (Infer), its sharding candidates (Cand), any whole-strategy check, its
// local run, and its row.

#include "dtensor/ops/decls/rules.h"

namespace dt::ops::internal::rules {

// ---- RmsNorm and LayerNorm ------------------------------------------------------------------

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
  AddElementwiseOptions(call, outs, i, options, {last});
}

absl::StatusOr<LocalOutputs> RunRmsNorm(const OpCall& call, const LocalArgs& a) {
  return Out(ops::RmsNorm(a.local(0), a.has(1) ? a.local(1) : Tensor(),
                          call.Attr<NormAttrs>().eps));
}

absl::StatusOr<LocalOutputs> RunLayerNorm(const OpCall& call, const LocalArgs& a) {
  return Out(ops::LayerNorm(a.local(0), a.has(1) ? a.local(1) : Tensor(),
                            a.has(2) ? a.local(2) : Tensor(),
                            call.Attr<NormAttrs>().eps));
}

const OpDecl kRmsNormDecl{.op = OpId::kRmsNorm, .name = "RmsNorm", .input_names = {"x", "weight"},
                          .attrs = kAttrsIndex<NormAttrs>, .infer = InferNorm,
                          .candidates = CandNorm, .run = RunRmsNorm, .cuda = "cuda::RmsNorm"};
const OpDecl kLayerNormDecl{.op = OpId::kLayerNorm, .name = "LayerNorm",
                            .input_names = {"x", "weight", "bias"}, .attrs = kAttrsIndex<NormAttrs>,
                            .infer = InferNorm, .candidates = CandNorm, .run = RunLayerNorm,
                            .cuda = "cuda::LayerNorm"};

// ---- ApplyRotary ----------------------------------------------------------------------------

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
  AddElementwiseOptions(call, outs, i, options, {last});
  AddLinearPartial(call, 0, i, 1, options);  // rotation is linear in x
}

absl::StatusOr<LocalOutputs> RunRotary(const OpCall& call, const LocalArgs& a) {
  return Out(ops::ApplyRotary(a.local(0), a.local(1), a.local(2),
                              call.Attr<RotaryAttrs>().style));
}

const OpDecl kRotaryDecl{.op = OpId::kRotary, .name = "ApplyRotary",
                         .input_names = {"x", "cos", "sin"}, .attrs = kAttrsIndex<RotaryAttrs>,
                         .infer = InferRotary, .candidates = CandRotary, .run = RunRotary,
                         .cuda = "cuda::ApplyRotary"};

}  // namespace dt::ops::internal::rules
