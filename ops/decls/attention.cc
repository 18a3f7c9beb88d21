// The declarations (ops/op_decl.h) of ScaledDotProductAttention. For each op, in this order: its
// shape rule (Infer), its sharding candidates (Cand), any whole-strategy check, its local run, and
// its row.

#include "dtensor/ops/decls/rules.h"

namespace dt::ops::internal::rules {

// ---- ScaledDotProductAttention --------------------------------------------------------------

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
  return Out(ops::ScaledDotProductAttention(ql, kk, vv, opts));
}

const OpDecl kAttentionDecl{.op = OpId::kAttention, .name = "ScaledDotProductAttention",
                            .input_names = {"q", "k", "v"}, .attrs = kAttrsIndex<AttentionAttrs>,
                            .infer = InferAttention, .candidates = CandAttention,
                            .check = CheckAttention, .precheck = PrecheckAttention,
                            .run = RunAttention, .cuda = "cuda::Attention"};

}  // namespace dt::ops::internal::rules
