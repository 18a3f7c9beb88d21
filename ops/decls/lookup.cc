// The declarations (ops/op_decl.h) of Embedding. For each op, in this order: its shape rule
// (Infer), its sharding candidates (Cand), any whole-strategy check, its local run, and its row.

#include "dtensor/ops/decls/rules.h"

namespace dt::ops::internal::rules {

// ---- Embedding ------------------------------------------------------------------------------

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

absl::StatusOr<LocalOutputs> RunEmbedding(const OpCall& call, const LocalArgs& a) {
  // A vocab-split table looks up the ids in its rows only; the others give zero rows and the
  // result is Partial(sum) (PyTorch's _MaskPartial).
  return Out(ops::Embedding(a.local(0), a.local(1), a.OffsetAlong(0, 0)));
}

const OpDecl kEmbeddingDecl{.op = OpId::kEmbedding, .name = "Embedding",
                            .input_names = {"table", "ids"}, .attrs = kAttrsIndex<NoAttrs>,
                            .infer = InferEmbedding, .candidates = CandEmbedding,
                            .run = RunEmbedding, .cuda = "cuda::Embedding"};

}  // namespace dt::ops::internal::rules
