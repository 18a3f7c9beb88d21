#include "dtensor/ops/dtensor_ops.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/dispatch.h"
#include "dtensor/ops/op_decl.h"

namespace dt::dops {
namespace {

using Inputs = std::initializer_list<const DTensor*>;

absl::StatusOr<DTensor> Apply1(const OpCall& call, Inputs inputs) {
  DT_ASSIGN_OR_RETURN(Outputs outs, dops::Apply(call, absl::MakeConstSpan(inputs.begin(), inputs.size())));
  return std::move(outs[0]);
}
absl::StatusOr<Outputs> Apply(const OpCall& call, Inputs inputs) {
  return dops::Apply(call, absl::MakeConstSpan(inputs.begin(), inputs.size()));
}

const DTensorSpec* SpecOr(const DTensor& x) { return x.defined() ? &x.spec() : nullptr; }
const DTensor* Opt(const DTensor& x) { return x.defined() ? &x : nullptr; }

absl::StatusOr<int> Dim(const char* op, const DTensor& x, int64_t dim) {
  if (!x.defined()) return absl::InvalidArgumentError(absl::StrCat(op, ": x is undefined"));
  return NormalizeDim(dim, x.spec().ndim(), absl::StrCat(op, ": dim"));
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
    case ops::UnaryOp::kRelu: return "Relu";
  }
  return "Unary";
}

const char* ReduceName(ops::Reduction op) {
  switch (op) {
    case ops::Reduction::kSum: return "Sum";
    case ops::Reduction::kMean: return "Mean";
    case ops::Reduction::kMax: return "Max";
    case ops::Reduction::kArgmax: return "Argmax";
  }
  return "Reduce";
}

}  // namespace

// ---- GEMM ----------------------------------------------------------------------------------------

absl::StatusOr<DTensor> Matmul(const DTensor& a, const DTensor& b, bool trans_a, bool trans_b) {
  OpCall call{OpId::kMatmul, {SpecOr(a), SpecOr(b)}, MatmulAttrs{trans_a, trans_b}};
  return Apply1(call, {&a, &b});
}

absl::StatusOr<DTensor> Linear(const DTensor& x, const DTensor& w, const DTensor& bias) {
  OpCall call{OpId::kLinear, {SpecOr(x), SpecOr(w), SpecOr(bias)}, NoAttrs{}};
  return Apply1(call, {&x, &w, Opt(bias)});
}

// ---- pointwise -----------------------------------------------------------------------------------

absl::StatusOr<DTensor> Binary(ops::BinaryOp op, const DTensor& a, const DTensor& b) {
  OpCall call{OpId::kBinary, {SpecOr(a), SpecOr(b)}, BinaryAttrs{op},
              BinaryName(op)};
  return Apply1(call, {&a, &b});
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
  OpCall call{OpId::kBinaryScalar, {SpecOr(x)}, BinaryScalarAttrs{op, s},
              BinaryName(op)};
  return Apply1(call, {&x});
}
absl::StatusOr<DTensor> Add(const DTensor& x, double s) { return Binary(ops::BinaryOp::kAdd, x, s); }
absl::StatusOr<DTensor> Sub(const DTensor& x, double s) { return Binary(ops::BinaryOp::kSub, x, s); }
absl::StatusOr<DTensor> Mul(const DTensor& x, double s) { return Binary(ops::BinaryOp::kMul, x, s); }
absl::StatusOr<DTensor> Div(const DTensor& x, double s) { return Binary(ops::BinaryOp::kDiv, x, s); }

absl::StatusOr<DTensor> Unary(ops::UnaryOp op, const DTensor& x) {
  OpCall call{OpId::kUnary, {SpecOr(x)}, UnaryAttrs{op}, UnaryName(op)};
  return Apply1(call, {&x});
}
absl::StatusOr<DTensor> Neg(const DTensor& x) { return Unary(ops::UnaryOp::kNeg, x); }
absl::StatusOr<DTensor> Silu(const DTensor& x) { return Unary(ops::UnaryOp::kSilu, x); }
absl::StatusOr<DTensor> Gelu(const DTensor& x, ops::GeluApproximation approx) {
  return Unary(approx == ops::GeluApproximation::kTanh ? ops::UnaryOp::kGeluTanh
                                                       : ops::UnaryOp::kGeluErf,
               x);
}
absl::StatusOr<DTensor> Relu(const DTensor& x) { return Unary(ops::UnaryOp::kRelu, x); }
absl::StatusOr<DTensor> Exp(const DTensor& x) { return Unary(ops::UnaryOp::kExp, x); }
absl::StatusOr<DTensor> Rsqrt(const DTensor& x) { return Unary(ops::UnaryOp::kRsqrt, x); }
absl::StatusOr<DTensor> Sqrt(const DTensor& x) { return Unary(ops::UnaryOp::kSqrt, x); }

absl::StatusOr<DTensor> Cast(const DTensor& x, DType dtype) {
  OpCall call{OpId::kCast, {SpecOr(x)}, CastAttrs{dtype}};
  return Apply1(call, {&x});
}

absl::StatusOr<DTensor> Modulate(const DTensor& x, const DTensor& scale, const DTensor& shift) {
  OpCall call{OpId::kModulate, {SpecOr(x), SpecOr(scale), SpecOr(shift)}, NoAttrs{}};
  return Apply1(call, {&x, &scale, &shift});
}

// ---- reductions ----------------------------------------------------------------------------------

absl::StatusOr<DTensor> Reduce(ops::Reduction op, const DTensor& x, int64_t dim, bool keepdim) {
  const char* name = ReduceName(op);
  DT_ASSIGN_OR_RETURN(const int d, Dim(name, x, dim));
  OpCall call{OpId::kReduce, {SpecOr(x)}, ReduceAttrs{op, d, keepdim}, name};
  return Apply1(call, {&x});
}
absl::StatusOr<DTensor> Sum(const DTensor& x, int64_t dim, bool keepdim) {
  return Reduce(ops::Reduction::kSum, x, dim, keepdim);
}
absl::StatusOr<DTensor> Mean(const DTensor& x, int64_t dim, bool keepdim) {
  return Reduce(ops::Reduction::kMean, x, dim, keepdim);
}
absl::StatusOr<DTensor> Max(const DTensor& x, int64_t dim, bool keepdim) {
  return Reduce(ops::Reduction::kMax, x, dim, keepdim);
}
absl::StatusOr<DTensor> Argmax(const DTensor& x, int64_t dim, bool keepdim) {
  return Reduce(ops::Reduction::kArgmax, x, dim, keepdim);
}

// ---- normalisation, rotary, attention, lookup ----------------------------------------------------

namespace {
absl::StatusOr<DTensor> SoftmaxImpl(const DTensor& x, int64_t dim, bool log) {
  const char* name = log ? "LogSoftmax" : "Softmax";
  DT_ASSIGN_OR_RETURN(const int d, Dim(name, x, dim));
  OpCall call{OpId::kSoftmax, {SpecOr(x)}, SoftmaxAttrs{d, log}, name};
  return Apply1(call, {&x});
}
}  // namespace

absl::StatusOr<DTensor> Softmax(const DTensor& x, int64_t dim) { return SoftmaxImpl(x, dim, false); }
absl::StatusOr<DTensor> LogSoftmax(const DTensor& x, int64_t dim) {
  return SoftmaxImpl(x, dim, true);
}

absl::StatusOr<DTensor> RmsNorm(const DTensor& x, const DTensor& weight, double eps) {
  OpCall call{OpId::kRmsNorm, {SpecOr(x), SpecOr(weight)}, NormAttrs{eps}};
  return Apply1(call, {&x, Opt(weight)});
}

absl::StatusOr<DTensor> LayerNorm(const DTensor& x, const DTensor& weight, const DTensor& bias,
                                  double eps) {
  OpCall call{OpId::kLayerNorm, {SpecOr(x), SpecOr(weight), SpecOr(bias)}, NormAttrs{eps}};
  return Apply1(call, {&x, Opt(weight), Opt(bias)});
}

absl::StatusOr<DTensor> ApplyRotary(const DTensor& x, const DTensor& cos, const DTensor& sin,
                                    ops::RotaryStyle style) {
  OpCall call{OpId::kRotary, {SpecOr(x), SpecOr(cos), SpecOr(sin)}, RotaryAttrs{style}};
  return Apply1(call, {&x, &cos, &sin});
}

absl::StatusOr<DTensor> ScaledDotProductAttention(const DTensor& q, const DTensor& k,
                                                  const DTensor& v,
                                                  const ops::AttentionOptions& options) {
  OpCall call{OpId::kAttention,
              {SpecOr(q), SpecOr(k), SpecOr(v)},
              AttentionAttrs{options.causal, options.scale, options.kv_length, options.q_offset}};
  return Apply1(call, {&q, &k, &v});
}

absl::StatusOr<DTensor> Embedding(const DTensor& table, const DTensor& ids) {
  OpCall call{OpId::kEmbedding, {SpecOr(table), SpecOr(ids)}, NoAttrs{}};
  return Apply1(call, {&table, &ids});
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
  OpCall call{OpId::kView, {&x.spec()}, ViewAttrs{out}, name};
  return Apply1(call, {&x});
}

absl::StatusOr<DTensor> PermuteImpl(const char* name, const DTensor& x, IntSpan dims) {
  if (!x.defined()) return absl::InvalidArgumentError(absl::StrCat(name, ": x is undefined"));
  const int r = x.spec().ndim();
  PermuteAttrs attrs;
  std::vector<bool> seen(static_cast<size_t>(r), false);
  bool ok = static_cast<int>(dims.size()) == r;
  for (size_t i = 0; ok && i < dims.size(); ++i) {
    const int64_t d = dims[i] < 0 ? dims[i] + r : dims[i];
    ok = d >= 0 && d < r && !seen[d];
    if (ok) {
      seen[d] = true;
      attrs.perm.push_back(d);
    }
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", ShapeToString(dims),
                                                   " is not a permutation of the dims of ",
                                                   x.spec().Describe()));
  }
  OpCall call{OpId::kPermute, {&x.spec()}, std::move(attrs), name};
  return Apply1(call, {&x});
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
  OpCall call{OpId::kUnsqueeze, {&x.spec()}, DimAttrs{d}};
  return Apply1(call, {&x});
}

absl::StatusOr<DTensor> Squeeze(const DTensor& x, int64_t dim) {
  DT_ASSIGN_OR_RETURN(const int d, Dim("Squeeze", x, dim));
  OpCall call{OpId::kSqueeze, {&x.spec()}, DimAttrs{d}};
  return Apply1(call, {&x});
}

absl::StatusOr<DTensor> Cat(absl::Span<const DTensor> tensors, int64_t dim) {
  if (tensors.empty()) return absl::InvalidArgumentError("Cat: no tensors");
  if (tensors.size() > 255) {
    return absl::InvalidArgumentError(absl::StrCat("Cat: ", tensors.size(), " tensors (at most 255)"));
  }
  DT_ASSIGN_OR_RETURN(const int d, Dim("Cat", tensors[0], dim));
  OpCall call{OpId::kCat, {}, DimAttrs{d}};
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
  DT_ASSIGN_OR_RETURN(Outputs outs, dops::Apply(call, ptrs));
  return std::move(outs[0]);
}

absl::StatusOr<std::vector<DTensor>> Split(const DTensor& x, absl::Span<const int64_t> sizes,
                                           int64_t dim) {
  DT_ASSIGN_OR_RETURN(const int d, Dim("Split", x, dim));
  if (sizes.empty()) return absl::InvalidArgumentError("Split: no sizes");
  OpCall call{OpId::kSplit, {&x.spec()}, SplitAttrs{d, Shape(sizes.begin(), sizes.end())}};
  DT_ASSIGN_OR_RETURN(Outputs outs, Apply(call, {&x}));
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
  OpCall call{OpId::kTopK, {&x.spec()}, TopKAttrs{k, d, largest}};
  DT_ASSIGN_OR_RETURN(Outputs outs, Apply(call, {&x}));
  return TopKResult{std::move(outs[0]), std::move(outs[1])};
}

}  // namespace dt::dops
