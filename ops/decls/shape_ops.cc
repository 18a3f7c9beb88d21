// The declarations (ops/op_decl.h) of the shape ops: View (Reshape, Flatten), Permute (Transpose),
// Unsqueeze, Squeeze, Cat, Split (Chunk). For each op, in this order: its shape rule (Infer), its
// sharding candidates (Cand), any whole-strategy check, its local run, and its row.

#include "dtensor/ops/decls/rules.h"

namespace dt::ops::internal::rules {

// ---- View -----------------------------------------------------------------------------------

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
    // A group that only adds or drops size-1 dims keeps interleaved and unit shards too.
    if (g.in_inner == 1 && g.out_inner == 1 && cur.is_any_shard(g.in_lead) &&
        cur != Placement::Shard(g.in_lead)) {
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

absl::StatusOr<LocalOutputs> RunView(const OpCall& call, const LocalArgs& a) {
  const Shape& whole = call.Attr<ViewAttrs>().shape;
  return Out(a.local(0).Reshape(a.distributed() ? a.OutLocalShape(0) : whole));
}

const OpDecl kViewDecl{.op = OpId::kView, .name = "View", .input_names = {"x"},
                       .attrs = kAttrsIndex<ViewAttrs>, .infer = InferView, .candidates = CandView,
                       .check = CheckView, .run = RunView, .cuda = kMetadataOnly};

// ---- Permute --------------------------------------------------------------------------------

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
  AddMoveOptions(call, std::move(m), i, options);
}

absl::StatusOr<LocalOutputs> RunPermute(const OpCall& call, const LocalArgs& a) {
  return Out(a.local(0).Permute(call.Attr<PermuteAttrs>().perm));
}

const OpDecl kPermuteDecl{.op = OpId::kPermute, .name = "Permute", .input_names = {"x"},
                          .attrs = kAttrsIndex<PermuteAttrs>, .infer = InferPermute,
                          .candidates = CandPermute, .run = RunPermute, .cuda = kMetadataOnly};

// ---- Unsqueeze and Squeeze ------------------------------------------------------------------

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
  AddMoveOptions(call, std::move(m), i, options);
}

absl::StatusOr<LocalOutputs> RunUnsqueeze(const OpCall& call, const LocalArgs& a) {
  return Out(a.local(0).Unsqueeze(call.Attr<DimAttrs>().dim));
}

absl::StatusOr<LocalOutputs> RunSqueeze(const OpCall& call, const LocalArgs& a) {
  return Out(a.local(0).Squeeze(call.Attr<DimAttrs>().dim));
}

const OpDecl kUnsqueezeDecl{.op = OpId::kUnsqueeze, .name = "Unsqueeze", .input_names = {"x"},
                            .attrs = kAttrsIndex<DimAttrs>, .infer = InferUnsqueeze,
                            .candidates = CandSqueezeLike, .run = RunUnsqueeze,
                            .cuda = kMetadataOnly};
const OpDecl kSqueezeDecl{.op = OpId::kSqueeze, .name = "Squeeze", .input_names = {"x"},
                          .attrs = kAttrsIndex<DimAttrs>, .infer = InferSqueeze,
                          .candidates = CandSqueezeLike, .run = RunSqueeze, .cuda = kMetadataOnly};

// ---- Cat ------------------------------------------------------------------------------------

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
    const Placement p = cur.is_any_shard(dim) && cur.unit() == 1 ? cur : Placement::Shard(dim);
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

// At most one mesh dim (of size > 1) may split `dim` in `pl`: "the <what> dim is split by more than
// one mesh dim" otherwise.
absl::Status SplitByOneMeshDimAtMost(const OpCall& call, absl::Span<const Placement> pl, int dim,
                                     absl::string_view what) {
  const IntSpan mesh = In(call, 0).mesh().shape();
  int n = 0;
  for (size_t i = 0; i < pl.size(); ++i) n += mesh[i] > 1 && pl[i].is_any_shard(dim);
  if (n <= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the ", what, " dim is split by more than one mesh dim"));
}

absl::Status CheckCat(const OpCall& call, const OutputMetas& outs, const Strategy& s) {
  return SplitByOneMeshDimAtMost(call, s.outputs[0], call.Attr<DimAttrs>().dim, "cat");
}

absl::StatusOr<LocalOutputs> RunCat(const OpCall& call, const LocalArgs& a) {
  std::vector<Tensor> locals;
  for (int j = 0; j < call.num_inputs(); ++j) locals.push_back(a.local(j));
  return Out(ops::Cat(locals, call.Attr<DimAttrs>().dim));
}

const OpDecl kCatDecl{.op = OpId::kCat, .name = "Cat", .input_names = {"tensors"},
                      .attrs = kAttrsIndex<DimAttrs>, .infer = InferCat, .candidates = CandCat,
                      .check = CheckCat, .run = RunCat,
                      .cuda = "none: strided device copies (Tensor::CopyFrom)"};

// ---- Split ----------------------------------------------------------------------------------

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
  if (!cur.is_any_shard(dim) || cur.unit() != 1) return;
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
  return SplitByOneMeshDimAtMost(call, s.inputs[0], call.Attr<SplitAttrs>().dim, "split");
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

const OpDecl kSplitDecl{.op = OpId::kSplit, .name = "Split", .input_names = {"x"},
                        .attrs = kAttrsIndex<SplitAttrs>, .infer = InferSplit,
                        .candidates = CandSplit, .check = CheckSplit, .run = RunSplit,
                        .cuda = kMetadataOnly};

}  // namespace dt::ops::internal::rules
