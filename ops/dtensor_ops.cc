#include "dtensor/ops/dtensor_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/dispatch.h"
#include "dtensor/ops/rules.h"

namespace dt::dops {
namespace {

using Inputs = std::initializer_list<const DTensor*>;

// Runs `call` on `inputs` (nullptr for an absent optional input): dispatch, then `local` on this
// rank's pieces (members only), then wrap.
template <typename Fn>
absl::StatusOr<Outputs> Run(const OpCall& call, Inputs inputs, Fn&& local) {
  int j = 0;
  for (const DTensor* x : inputs) {
    if (x != nullptr && !x->defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat(OpName(call), ": ", InputName(call, j), " is undefined"));
    }
    ++j;
  }
  Prepared p;
  DT_RETURN_IF_ERROR(Prepare(call, absl::MakeConstSpan(inputs.begin(), inputs.size()), &p));
  if (!p.member()) return p.Empty();
  DT_ASSIGN_OR_RETURN(LocalOutputs outs, local(p));
  return p.Wrap(std::move(outs));
}

template <typename Fn>
absl::StatusOr<DTensor> Run1(const OpCall& call, Inputs inputs, Fn&& local) {
  DT_ASSIGN_OR_RETURN(Outputs outs, Run(call, inputs, std::forward<Fn>(local)));
  return std::move(outs[0]);
}

LocalOutputs One(Tensor t) {
  LocalOutputs o;
  o.push_back(std::move(t));
  return o;
}

const DTensorSpec* SpecOr(const DTensor& x) { return x.defined() ? &x.spec() : nullptr; }
const DTensor* Opt(const DTensor& x) { return x.defined() ? &x : nullptr; }

absl::StatusOr<int> Dim(const char* op, const DTensor& x, int64_t dim) {
  if (!x.defined()) return absl::InvalidArgumentError(absl::StrCat(op, ": x is undefined"));
  return NormalizeDim(dim, x.spec().ndim(), absl::StrCat(op, ": dim"));
}

// True when some mesh dim of `spec` (of size > 1) shards tensor dim `dim`.
bool Sharded(const DTensorSpec& spec, int dim) {
  for (int i = 0; i < spec.mesh().ndim(); ++i) {
    if (spec.mesh().Size(i) > 1 && spec.placements()[i].is_any_shard(dim)) return true;
  }
  return false;
}

// This rank's global offset along `dim` (0 when the dim is whole); members only.
int64_t OffsetAlong(const DTensorSpec& spec, int dim) {
  return Sharded(spec, dim) ? spec.Offset(*spec.mesh().Coordinate(), dim) : 0;
}

absl::StatusOr<Tensor> ZerosLike(const Tensor& t) {
  return Tensor::Zeros(t.shape(), t.dtype(), t.device());
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

const char* BinaryName(ops::BinaryOp op) {
  switch (op) {
    case ops::BinaryOp::kAdd: return "Add";
    case ops::BinaryOp::kSub: return "Sub";
    case ops::BinaryOp::kMul: return "Mul";
    case ops::BinaryOp::kDiv: return "Div";
  }
  return "Binary";
}

const char* UnaryName(ops::UnaryOp op) {
  switch (op) {
    case ops::UnaryOp::kNeg: return "Neg";
    case ops::UnaryOp::kSilu: return "Silu";
    case ops::UnaryOp::kGeluTanh:
    case ops::UnaryOp::kGeluErf: return "Gelu";
    case ops::UnaryOp::kExp: return "Exp";
    case ops::UnaryOp::kRsqrt: return "Rsqrt";
    case ops::UnaryOp::kSqrt: return "Sqrt";
  }
  return "Unary";
}

const char* ReduceName(ops::ReduceOp op) {
  switch (op) {
    case ops::ReduceOp::kSum: return "Sum";
    case ops::ReduceOp::kMean: return "Mean";
    case ops::ReduceOp::kMax: return "Max";
    case ops::ReduceOp::kArgmax: return "Argmax";
  }
  return "Reduce";
}

}  // namespace

// ---- GEMM ----------------------------------------------------------------------------------------

absl::StatusOr<DTensor> Matmul(const DTensor& a, const DTensor& b, bool trans_a, bool trans_b) {
  OpCall call{OpId::kMatmul, {SpecOr(a), SpecOr(b)}, {{trans_a, trans_b}, {}}};
  return Run1(call, {&a, &b}, [&](const Prepared& p) -> absl::StatusOr<LocalOutputs> {
    DT_ASSIGN_OR_RETURN(Tensor y, ops::Matmul(p.local(0), p.local(1), trans_a, trans_b));
    return One(std::move(y));
  });
}

absl::StatusOr<DTensor> Linear(const DTensor& x, const DTensor& w, const DTensor& bias) {
  OpCall call{OpId::kLinear, {SpecOr(x), SpecOr(w), SpecOr(bias)}, {}};
  return Run1(call, {&x, &w, Opt(bias)}, [&](const Prepared& p) -> absl::StatusOr<LocalOutputs> {
    // A Partial(sum) result gets the bias from one rank only (Note [Adding a replicated term to a
    // Partial] in dispatch.cc).
    const Tensor b = p.has(2) && p.Counts(2, 0) ? p.local(2) : Tensor();
    DT_ASSIGN_OR_RETURN(Tensor y, ops::Linear(p.local(0), p.local(1), b));
    return One(std::move(y));
  });
}

// ---- pointwise -----------------------------------------------------------------------------------

absl::StatusOr<DTensor> Binary(ops::BinaryOp op, const DTensor& a, const DTensor& b) {
  OpCall call{OpId::kBinary, {SpecOr(a), SpecOr(b)}, {{static_cast<int64_t>(op)}, {}},
              BinaryName(op)};
  return Run1(call, {&a, &b}, [&](const Prepared& p) -> absl::StatusOr<LocalOutputs> {
    Tensor x = p.local(0), y = p.local(1);
    if (op == ops::BinaryOp::kAdd || op == ops::BinaryOp::kSub) {
      if (!p.Counts(0, 0)) {
        DT_ASSIGN_OR_RETURN(x, ZerosLike(x));
      }
      if (!p.Counts(1, 0)) {
        DT_ASSIGN_OR_RETURN(y, ZerosLike(y));
      }
    }
    DT_ASSIGN_OR_RETURN(Tensor z, ops::Binary(op, x, y));
    return One(std::move(z));
  });
}
absl::StatusOr<DTensor> Add(const DTensor& a, const DTensor& b) {
  return Binary(ops::BinaryOp::kAdd, a, b);
}
absl::StatusOr<DTensor> Sub(const DTensor& a, const DTensor& b) {
  return Binary(ops::BinaryOp::kSub, a, b);
}
absl::StatusOr<DTensor> Mul(const DTensor& a, const DTensor& b) {
  return Binary(ops::BinaryOp::kMul, a, b);
}
absl::StatusOr<DTensor> Div(const DTensor& a, const DTensor& b) {
  return Binary(ops::BinaryOp::kDiv, a, b);
}

absl::StatusOr<DTensor> Binary(ops::BinaryOp op, const DTensor& x, double s) {
  OpCall call{OpId::kBinaryScalar, {SpecOr(x)}, {{static_cast<int64_t>(op)}, {s}},
              BinaryName(op)};
  return Run1(call, {&x}, [&](const Prepared& p) -> absl::StatusOr<LocalOutputs> {
    const bool additive = op == ops::BinaryOp::kAdd || op == ops::BinaryOp::kSub;
    if (additive && !p.Counts(-1, 0)) {
      DT_ASSIGN_OR_RETURN(Tensor y, p.local(0).Clone());
      return One(std::move(y));
    }
    DT_ASSIGN_OR_RETURN(Tensor y, ops::Binary(op, p.local(0), s));
    return One(std::move(y));
  });
}
absl::StatusOr<DTensor> Add(const DTensor& x, double s) { return Binary(ops::BinaryOp::kAdd, x, s); }
absl::StatusOr<DTensor> Sub(const DTensor& x, double s) { return Binary(ops::BinaryOp::kSub, x, s); }
absl::StatusOr<DTensor> Mul(const DTensor& x, double s) { return Binary(ops::BinaryOp::kMul, x, s); }
absl::StatusOr<DTensor> Div(const DTensor& x, double s) { return Binary(ops::BinaryOp::kDiv, x, s); }

absl::StatusOr<DTensor> Unary(ops::UnaryOp op, const DTensor& x) {
  OpCall call{OpId::kUnary, {SpecOr(x)}, {{static_cast<int64_t>(op)}, {}}, UnaryName(op)};
  return Run1(call, {&x}, [&](const Prepared& p) -> absl::StatusOr<LocalOutputs> {
    DT_ASSIGN_OR_RETURN(Tensor y, ops::Unary(op, p.local(0)));
    return One(std::move(y));
  });
}
absl::StatusOr<DTensor> Neg(const DTensor& x) { return Unary(ops::UnaryOp::kNeg, x); }
absl::StatusOr<DTensor> Silu(const DTensor& x) { return Unary(ops::UnaryOp::kSilu, x); }
absl::StatusOr<DTensor> Gelu(const DTensor& x, ops::GeluApproximation approx) {
  return Unary(approx == ops::GeluApproximation::kTanh ? ops::UnaryOp::kGeluTanh
                                                       : ops::UnaryOp::kGeluErf,
               x);
}
absl::StatusOr<DTensor> Exp(const DTensor& x) { return Unary(ops::UnaryOp::kExp, x); }
absl::StatusOr<DTensor> Rsqrt(const DTensor& x) { return Unary(ops::UnaryOp::kRsqrt, x); }
absl::StatusOr<DTensor> Sqrt(const DTensor& x) { return Unary(ops::UnaryOp::kSqrt, x); }

absl::StatusOr<DTensor> Cast(const DTensor& x, DType dtype) {
  OpCall call{OpId::kCast, {SpecOr(x)}, {{static_cast<int64_t>(dtype)}, {}}};
  return Run1(call, {&x}, [&](const Prepared& p) -> absl::StatusOr<LocalOutputs> {
    DT_ASSIGN_OR_RETURN(Tensor y, ops::Cast(p.local(0), dtype));
    return One(std::move(y));
  });
}

// ---- reductions ----------------------------------------------------------------------------------

absl::StatusOr<DTensor> Reduce(ops::ReduceOp op, const DTensor& x, int64_t dim, bool keepdim) {
  const char* name = ReduceName(op);
  DT_ASSIGN_OR_RETURN(const int d, Dim(name, x, dim));
  OpCall call{OpId::kReduce, {SpecOr(x)}, {{static_cast<int64_t>(op), d, keepdim}, {}}, name};
  return Run1(call, {&x}, [&](const Prepared& p) -> absl::StatusOr<LocalOutputs> {
    const Tensor& v = p.local(0);
    const bool split = Sharded(p.spec(0), d);  // the result is Partial over the split
    Tensor y;
    if (op == ops::ReduceOp::kMean && split) {
      DT_ASSIGN_OR_RETURN(Tensor s, ops::Sum(v, d, keepdim));
      DT_ASSIGN_OR_RETURN(y, ops::Div(s, static_cast<double>(x.shape()[d])));
    } else if (op == ops::ReduceOp::kMax && split && v.size(d) == 0) {
      DT_ASSIGN_OR_RETURN(y, Tensor::Full(p.OutLocalShape(0), Lowest(v.dtype()), v.dtype(),
                                          v.device()));
    } else {
      DT_ASSIGN_OR_RETURN(y, ops::Reduce(op, v, d, keepdim));
    }
    return One(std::move(y));
  });
}
absl::StatusOr<DTensor> Sum(const DTensor& x, int64_t dim, bool keepdim) {
  return Reduce(ops::ReduceOp::kSum, x, dim, keepdim);
}
absl::StatusOr<DTensor> Mean(const DTensor& x, int64_t dim, bool keepdim) {
  return Reduce(ops::ReduceOp::kMean, x, dim, keepdim);
}
absl::StatusOr<DTensor> Max(const DTensor& x, int64_t dim, bool keepdim) {
  return Reduce(ops::ReduceOp::kMax, x, dim, keepdim);
}
absl::StatusOr<DTensor> Argmax(const DTensor& x, int64_t dim, bool keepdim) {
  return Reduce(ops::ReduceOp::kArgmax, x, dim, keepdim);
}

// ---- normalisation, rotary, attention, lookup ----------------------------------------------------

namespace {
absl::StatusOr<DTensor> SoftmaxImpl(const DTensor& x, int64_t dim, bool log) {
  const char* name = log ? "LogSoftmax" : "Softmax";
  DT_ASSIGN_OR_RETURN(const int d, Dim(name, x, dim));
  OpCall call{OpId::kSoftmax, {SpecOr(x)}, {{log, d}, {}}, name};
  return Run1(call, {&x}, [&](const Prepared& p) -> absl::StatusOr<LocalOutputs> {
    DT_ASSIGN_OR_RETURN(Tensor y, log ? ops::LogSoftmax(p.local(0), d) : ops::Softmax(p.local(0), d));
    return One(std::move(y));
  });
}
}  // namespace

absl::StatusOr<DTensor> Softmax(const DTensor& x, int64_t dim) { return SoftmaxImpl(x, dim, false); }
absl::StatusOr<DTensor> LogSoftmax(const DTensor& x, int64_t dim) {
  return SoftmaxImpl(x, dim, true);
}

absl::StatusOr<DTensor> RmsNorm(const DTensor& x, const DTensor& weight, double eps) {
  OpCall call{OpId::kRmsNorm, {SpecOr(x), SpecOr(weight)}, {{}, {eps}}};
  return Run1(call, {&x, Opt(weight)}, [&](const Prepared& p) -> absl::StatusOr<LocalOutputs> {
    DT_ASSIGN_OR_RETURN(Tensor y,
                        ops::RmsNorm(p.local(0), p.has(1) ? p.local(1) : Tensor(), eps));
    return One(std::move(y));
  });
}

absl::StatusOr<DTensor> LayerNorm(const DTensor& x, const DTensor& weight, const DTensor& bias,
                                  double eps) {
  OpCall call{OpId::kLayerNorm, {SpecOr(x), SpecOr(weight), SpecOr(bias)}, {{}, {eps}}};
  return Run1(call, {&x, Opt(weight), Opt(bias)},
              [&](const Prepared& p) -> absl::StatusOr<LocalOutputs> {
                DT_ASSIGN_OR_RETURN(Tensor y, ops::LayerNorm(p.local(0),
                                                             p.has(1) ? p.local(1) : Tensor(),
                                                             p.has(2) ? p.local(2) : Tensor(), eps));
                return One(std::move(y));
              });
}

absl::StatusOr<DTensor> ApplyRotary(const DTensor& x, const DTensor& cos, const DTensor& sin,
                                    ops::RotaryStyle style) {
  OpCall call{OpId::kRotary, {SpecOr(x), SpecOr(cos), SpecOr(sin)},
              {{static_cast<int64_t>(style)}, {}}};
  return Run1(call, {&x, &cos, &sin}, [&](const Prepared& p) -> absl::StatusOr<LocalOutputs> {
    DT_ASSIGN_OR_RETURN(Tensor y, ops::ApplyRotary(p.local(0), p.local(1), p.local(2), style));
    return One(std::move(y));
  });
}

absl::StatusOr<DTensor> ScaledDotProductAttention(const DTensor& q, const DTensor& k,
                                                  const DTensor& v,
                                                  const ops::AttentionOptions& options) {
  OpCall call{OpId::kAttention,
              {SpecOr(q), SpecOr(k), SpecOr(v)},
              {{options.causal, options.scale.has_value(), options.kv_length.has_value(),
                options.kv_length.value_or(0), options.q_offset.has_value(),
                options.q_offset.value_or(0)},
               {options.scale.value_or(0.0)}}};
  return Run1(call, {&q, &k, &v}, [&](const Prepared& p) -> absl::StatusOr<LocalOutputs> {
    const Tensor &ql = p.local(0), &kl = p.local(1), &vl = p.local(2);
    if (ql.numel() == 0) {  // no query heads or rows here
      DT_ASSIGN_OR_RETURN(Tensor y, Tensor::Empty(p.OutLocalShape(0), ql.dtype(), ql.device()));
      return One(std::move(y));
    }
    ops::AttentionOptions opts = options;
    // Queries split along the sequence: this rank's first query sits at its offset.
    if (Sharded(p.spec(0), 2)) {
      const int64_t kv_len = options.kv_length.value_or(k.shape()[2]);
      opts.kv_length = kv_len;
      opts.q_offset = options.q_offset.value_or(kv_len - q.shape()[2]) + OffsetAlong(p.spec(0), 2);
    }
    // Heads: query head h uses kv head h / rep (GQA). Keep the kv heads this rank's query heads
    // need; when its query heads do not start and end on group boundaries, give every query head
    // its own kv head.
    const int64_t rep = q.shape()[1] / k.shape()[1];
    const int64_t qa = OffsetAlong(p.spec(0), 1), qb = qa + ql.size(1);
    const int64_t ka = OffsetAlong(p.spec(1), 1);
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
    return One(std::move(y));
  });
}

absl::StatusOr<DTensor> Embedding(const DTensor& table, const DTensor& ids) {
  OpCall call{OpId::kEmbedding, {SpecOr(table), SpecOr(ids)}, {}};
  return Run1(call, {&table, &ids}, [&](const Prepared& p) -> absl::StatusOr<LocalOutputs> {
    // A vocab-split table looks up the ids in its rows only; the others give zero rows and the
    // result is Partial(sum) (PyTorch's _MaskPartial).
    DT_ASSIGN_OR_RETURN(Tensor y,
                        ops::Embedding(p.local(0), p.local(1), OffsetAlong(p.spec(0), 0)));
    return One(std::move(y));
  });
}

// ---- shape ops -----------------------------------------------------------------------------------

namespace {
absl::StatusOr<DTensor> ViewImpl(const char* name, const DTensor& x, IntSpan shape) {
  if (!x.defined()) return absl::InvalidArgumentError(absl::StrCat(name, ": x is undefined"));
  // Resolve a -1 (InferShape); a plain size mismatch is left to the view rule, whose message
  // names the layout.
  Shape out(shape.begin(), shape.end());
  if (std::any_of(shape.begin(), shape.end(), [](int64_t s) { return s < 0; })) {
    auto inferred = InferShape(shape, Numel(x.shape()), name);
    if (!inferred.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(inferred.status().message(), " (x ", x.spec().Describe(), ")"));
    }
    out = *std::move(inferred);
  }
  OpCall call{OpId::kView, {&x.spec()}, {{out.begin(), out.end()}, {}}, name};
  return Run1(call, {&x}, [&](const Prepared& p) -> absl::StatusOr<LocalOutputs> {
    DT_ASSIGN_OR_RETURN(Tensor y, p.local(0).Reshape(p.OutLocalShape(0)));
    return One(std::move(y));
  });
}

absl::StatusOr<DTensor> PermuteImpl(const char* name, const DTensor& x, IntSpan dims) {
  if (!x.defined()) return absl::InvalidArgumentError(absl::StrCat(name, ": x is undefined"));
  const int r = x.spec().ndim();
  Attrs attrs;
  std::vector<bool> seen(static_cast<size_t>(r), false);
  bool ok = static_cast<int>(dims.size()) == r;
  for (size_t i = 0; ok && i < dims.size(); ++i) {
    const int64_t d = dims[i] < 0 ? dims[i] + r : dims[i];
    ok = d >= 0 && d < r && !seen[d];
    if (ok) {
      seen[d] = true;
      attrs.ints.push_back(d);
    }
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", ShapeToString(dims),
                                                   " is not a permutation of the dims of ",
                                                   x.spec().Describe()));
  }
  OpCall call{OpId::kPermute, {&x.spec()}, std::move(attrs), name};
  const Attrs& perm = call.attrs;
  return Run1(call, {&x}, [&](const Prepared& p) -> absl::StatusOr<LocalOutputs> {
    DT_ASSIGN_OR_RETURN(Tensor y, p.local(0).Permute(perm.ints));
    return One(std::move(y));
  });
}
}  // namespace

absl::StatusOr<DTensor> View(const DTensor& x, IntSpan shape) { return ViewImpl("View", x, shape); }
absl::StatusOr<DTensor> Reshape(const DTensor& x, IntSpan shape) {
  return ViewImpl("Reshape", x, shape);
}

absl::StatusOr<DTensor> Flatten(const DTensor& x, int64_t start_dim, int64_t end_dim) {
  if (!x.defined()) return absl::InvalidArgumentError("Flatten: x is undefined");
  DT_ASSIGN_OR_RETURN(Shape out,
                      FlattenShape(x.shape(), start_dim, end_dim, x.spec().Describe()));
  return ViewImpl("Flatten", x, out);
}

absl::StatusOr<DTensor> Transpose(const DTensor& x, int64_t dim0, int64_t dim1) {
  DT_ASSIGN_OR_RETURN(const int a, Dim("Transpose", x, dim0));
  DT_ASSIGN_OR_RETURN(const int b, Dim("Transpose", x, dim1));
  std::vector<int64_t> perm(static_cast<size_t>(x.spec().ndim()));
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[a], perm[b]);
  return PermuteImpl("Transpose", x, perm);
}

absl::StatusOr<DTensor> Permute(const DTensor& x, IntSpan dims) {
  return PermuteImpl("Permute", x, dims);
}

absl::StatusOr<DTensor> Unsqueeze(const DTensor& x, int64_t dim) {
  if (!x.defined()) return absl::InvalidArgumentError("Unsqueeze: x is undefined");
  DT_ASSIGN_OR_RETURN(const int d, NormalizeDim(dim, x.spec().ndim() + 1, "Unsqueeze: dim"));
  OpCall call{OpId::kUnsqueeze, {&x.spec()}, {{d}, {}}};
  return Run1(call, {&x}, [&](const Prepared& p) -> absl::StatusOr<LocalOutputs> {
    DT_ASSIGN_OR_RETURN(Tensor y, p.local(0).Unsqueeze(d));
    return One(std::move(y));
  });
}

absl::StatusOr<DTensor> Squeeze(const DTensor& x, int64_t dim) {
  DT_ASSIGN_OR_RETURN(const int d, Dim("Squeeze", x, dim));
  OpCall call{OpId::kSqueeze, {&x.spec()}, {{d}, {}}};
  return Run1(call, {&x}, [&](const Prepared& p) -> absl::StatusOr<LocalOutputs> {
    DT_ASSIGN_OR_RETURN(Tensor y, p.local(0).Squeeze(d));
    return One(std::move(y));
  });
}

absl::StatusOr<DTensor> Cat(absl::Span<const DTensor> tensors, int64_t dim) {
  if (tensors.empty()) return absl::InvalidArgumentError("Cat: no tensors");
  if (tensors.size() > 255) {
    return absl::InvalidArgumentError(absl::StrCat("Cat: ", tensors.size(), " tensors (at most 255)"));
  }
  DT_ASSIGN_OR_RETURN(const int d, Dim("Cat", tensors[0], dim));
  OpCall call{OpId::kCat, {}, {{d}, {}}};
  std::vector<const DTensor*> ptrs;
  for (size_t j = 0; j < tensors.size(); ++j) {
    if (!tensors[j].defined()) {
      return absl::InvalidArgumentError(absl::StrCat("Cat: tensors[", j, "] is undefined"));
    }
    call.inputs.push_back(&tensors[j].spec());
    ptrs.push_back(&tensors[j]);
    if (tensors[j].spec().ndim() != tensors[0].spec().ndim()) {
      return absl::InvalidArgumentError(absl::StrCat("Cat: tensors[0] ", tensors[0].spec().Describe(),
                                                     " and tensors[", j, "] ",
                                                     tensors[j].spec().Describe(),
                                                     ": ranks differ"));
    }
  }
  Prepared p;
  DT_RETURN_IF_ERROR(Prepare(call, ptrs, &p));
  if (!p.member()) {
    DT_ASSIGN_OR_RETURN(Outputs outs, p.Empty());
    return std::move(outs[0]);
  }
  std::vector<Tensor> locals;
  for (size_t j = 0; j < tensors.size(); ++j) locals.push_back(p.local(static_cast<int>(j)));
  DT_ASSIGN_OR_RETURN(Tensor y, ops::Cat(locals, d));
  DT_ASSIGN_OR_RETURN(Outputs outs, p.Wrap(One(std::move(y))));
  return std::move(outs[0]);
}

absl::StatusOr<std::vector<DTensor>> Split(const DTensor& x, absl::Span<const int64_t> sizes,
                                           int64_t dim) {
  DT_ASSIGN_OR_RETURN(const int d, Dim("Split", x, dim));
  if (sizes.empty()) return absl::InvalidArgumentError("Split: no sizes");
  OpCall call{OpId::kSplit, {&x.spec()}, {{d}, {}}};
  call.attrs.ints.insert(call.attrs.ints.end(), sizes.begin(), sizes.end());
  DT_ASSIGN_OR_RETURN(Outputs outs, Run(call, {&x}, [&](const Prepared& p)
                                                       -> absl::StatusOr<LocalOutputs> {
    std::vector<int64_t> local_sizes;
    for (size_t k = 0; k < sizes.size(); ++k) {
      local_sizes.push_back(p.OutLocalShape(static_cast<int>(k))[d]);
    }
    DT_ASSIGN_OR_RETURN(std::vector<Tensor> pieces, ops::Split(p.local(0), local_sizes, d));
    return LocalOutputs(pieces.begin(), pieces.end());
  }));
  return std::vector<DTensor>(std::make_move_iterator(outs.begin()),
                              std::make_move_iterator(outs.end()));
}

absl::StatusOr<std::vector<DTensor>> Chunk(const DTensor& x, int64_t chunks, int64_t dim) {
  DT_ASSIGN_OR_RETURN(const int d, Dim("Chunk", x, dim));
  if (chunks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("Chunk: chunks must be positive, got ", chunks));
  }
  return Split(x, ChunkSizes(x.shape()[d], chunks), d);
}

absl::StatusOr<TopKResult> TopK(const DTensor& x, int64_t k, int64_t dim, bool largest) {
  DT_ASSIGN_OR_RETURN(const int d, Dim("TopK", x, dim));
  OpCall call{OpId::kTopK, {&x.spec()}, {{k, d, largest}, {}}};
  DT_ASSIGN_OR_RETURN(Outputs outs,
                      Run(call, {&x}, [&](const Prepared& p) -> absl::StatusOr<LocalOutputs> {
                        DT_ASSIGN_OR_RETURN(ops::TopKResult r, ops::TopK(p.local(0), k, d, largest));
                        LocalOutputs o;
                        o.push_back(std::move(r.values));
                        o.push_back(std::move(r.indices));
                        return o;
                      }));
  return TopKResult{std::move(outs[0]), std::move(outs[1])};
}

}  // namespace dt::dops
