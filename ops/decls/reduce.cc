// The declarations (ops/op_decl.h) of the reductions along one dim, Softmax and TopK. For each op,
// in this order: its shape rule (Infer), its sharding candidates (Cand), any whole-strategy check,
// its local run, and its row.

#include "dtensor/ops/decls/rules.h"

namespace dt::ops::internal::rules {

// ---- Reduce ---------------------------------------------------------------------------------

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

const OpDecl kReduceDecl{.op = OpId::kReduce, .name = "Reduce", .input_names = {"x"},
                         .attrs = kAttrsIndex<ReduceAttrs>, .infer = InferReduce,
                         .candidates = CandReduce, .run = RunReduce, .cuda = "cuda::Reduce"};

// ---- Softmax --------------------------------------------------------------------------------

absl::StatusOr<OutputMetas> InferSoftmax(const OpCall& call) {
  DT_RETURN_IF_ERROR(NeedFloat(call, 0));
  return One(In(call, 0).shape(), In(call, 0).dtype());
}

void CandSoftmax(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options) {
  const int dim = call.Attr<SoftmaxAttrs>().dim;
  AddElementwiseOptions(call, outs, i, options, {dim});
}

absl::StatusOr<LocalOutputs> RunSoftmax(const OpCall& call, const LocalArgs& a) {
  const auto& at = call.Attr<SoftmaxAttrs>();
  return Out(at.log ? ops::LogSoftmax(a.local(0), at.dim)
                    : ops::Softmax(a.local(0), at.dim));
}

const OpDecl kSoftmaxDecl{.op = OpId::kSoftmax, .name = "Softmax", .input_names = {"x"},
                          .attrs = kAttrsIndex<SoftmaxAttrs>, .infer = InferSoftmax,
                          .candidates = CandSoftmax, .run = RunSoftmax, .cuda = "cuda::Softmax"};

// ---- TopK -----------------------------------------------------------------------------------

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
  AddElementwiseOptions(call, outs, i, options, {dim});
}

absl::StatusOr<LocalOutputs> RunTopK(const OpCall& call, const LocalArgs& a) {
  const auto& at = call.Attr<TopKAttrs>();
  DT_ASSIGN_OR_RETURN(ops::TopKResult r, ops::TopK(a.local(0), at.k, at.dim, at.largest));
  LocalOutputs o;
  o.push_back(std::move(r.values));
  o.push_back(std::move(r.indices));
  return o;
}

const OpDecl kTopKDecl{.op = OpId::kTopK, .name = "TopK", .input_names = {"x"},
                       .attrs = kAttrsIndex<TopKAttrs>, .infer = InferTopK, .candidates = CandTopK,
                       .run = RunTopK, .cuda = "cuda::TopK"};

}  // namespace dt::ops::internal::rules
