#include "dtensor/ops/op_calls.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"

namespace dt::ops::internal::calls {
namespace {

absl::Status Undefined(const char* op, const char* what) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what, " is undefined"));
}

absl::StatusOr<int> Dim(const char* op, Spec x, int64_t dim) {
  if (x == nullptr) return Undefined(op, "x");
  return NormalizeDim(dim, x->ndim(), absl::StrCat(op, ": dim"));
}

// The public name: both forms of Gelu are "Gelu".
const char* UnaryName(ops::UnaryOp op) {
  return op == ops::UnaryOp::kGeluTanh ? "Gelu" : ops::UnaryOpName(op);
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

absl::StatusOr<OpCall> Matmul(Spec a, Spec b, bool trans_a, bool trans_b) {
  return OpCall{OpId::kMatmul, {a, b}, MatmulAttrs{trans_a, trans_b}};
}

absl::StatusOr<OpCall> Linear(Spec x, Spec w, Spec bias) {
  return OpCall{OpId::kLinear, {x, w, bias}, NoAttrs{}};
}

absl::StatusOr<OpCall> Binary(ops::BinaryOp op, Spec a, Spec b) {
  return OpCall{OpId::kBinary, {a, b}, BinaryAttrs{op}, ops::BinaryOpName(op)};
}

absl::StatusOr<OpCall> BinaryScalar(ops::BinaryOp op, Spec x, double s) {
  return OpCall{OpId::kBinaryScalar, {x}, BinaryScalarAttrs{op, s}, ops::BinaryOpName(op)};
}

absl::StatusOr<OpCall> Unary(ops::UnaryOp op, Spec x) {
  return OpCall{OpId::kUnary, {x}, UnaryAttrs{op}, UnaryName(op)};
}

absl::StatusOr<OpCall> Gelu(Spec x, ops::GeluApproximation approx) {
  return Unary(approx == ops::GeluApproximation::kTanh ? ops::UnaryOp::kGeluTanh
                                                       : ops::UnaryOp::kGeluErf,
               x);
}

absl::StatusOr<OpCall> Cast(Spec x, DType dtype) {
  return OpCall{OpId::kCast, {x}, CastAttrs{dtype}};
}

absl::StatusOr<OpCall> Modulate(Spec x, Spec scale, Spec shift) {
  return OpCall{OpId::kModulate, {x, scale, shift}, NoAttrs{}};
}

absl::StatusOr<OpCall> GatedActivation(Spec gate, Spec up, ops::UnaryOp act) {
  return OpCall{OpId::kGatedActivation, {gate, up}, UnaryAttrs{act}};
}

absl::StatusOr<OpCall> Reduce(ops::Reduction op, Spec x, int64_t dim, bool keepdim) {
  const char* name = ReduceName(op);
  DT_ASSIGN_OR_RETURN(const int d, Dim(name, x, dim));
  return OpCall{OpId::kReduce, {x}, ReduceAttrs{op, d, keepdim}, name};
}

absl::StatusOr<OpCall> Softmax(Spec x, int64_t dim, bool log) {
  const char* name = log ? "LogSoftmax" : "Softmax";
  DT_ASSIGN_OR_RETURN(const int d, Dim(name, x, dim));
  return OpCall{OpId::kSoftmax, {x}, SoftmaxAttrs{d, log}, name};
}

absl::StatusOr<OpCall> RmsNorm(Spec x, Spec weight, double eps) {
  return OpCall{OpId::kRmsNorm, {x, weight}, NormAttrs{eps}};
}

absl::StatusOr<OpCall> LayerNorm(Spec x, Spec weight, Spec bias, double eps) {
  return OpCall{OpId::kLayerNorm, {x, weight, bias}, NormAttrs{eps}};
}

absl::StatusOr<OpCall> Rotary(Spec x, Spec cos, Spec sin, ops::RotaryStyle style) {
  return OpCall{OpId::kRotary, {x, cos, sin}, RotaryAttrs{style}};
}

absl::StatusOr<OpCall> Attention(Spec q, Spec k, Spec v, const ops::AttentionOptions& options) {
  // Not carried to the local calls yet: refused rather than dropped (sinks would need their heads
  // sharded as q's).
  if (options.softcap || options.window || options.sinks.defined() || options.mask.defined()) {
    return absl::UnimplementedError(
        "ScaledDotProductAttention on Values and DTensors: softcap, window, sinks and mask are "
        "taken by the Tensor overloads only (nn::Attention applies them to each rank's heads)");
  }
  return OpCall{OpId::kAttention,
                {q, k, v},
                AttentionAttrs{options.causal, options.scale, options.kv_length, options.q_offset}};
}

absl::StatusOr<OpCall> Embedding(Spec table, Spec ids) {
  return OpCall{OpId::kEmbedding, {table, ids}, NoAttrs{}};
}

absl::StatusOr<OpCall> View(const char* name, Spec x, IntSpan shape) {
  if (x == nullptr) return Undefined(name, "x");
  // Resolve a -1 (InferShape); a plain size mismatch is left to the view rule, whose message
  // names the layout.
  Shape out(shape.begin(), shape.end());
  if (std::any_of(shape.begin(), shape.end(), [](int64_t s) { return s < 0; })) {
    auto inferred = InferShape(shape, Numel(x->shape()), name);
    if (!inferred.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(inferred.status().message(), " (x ", x->Describe(), ")"));
    }
    out = *std::move(inferred);
  }
  return OpCall{OpId::kView, {x}, ViewAttrs{out}, name};
}

absl::StatusOr<OpCall> Flatten(Spec x, int64_t start_dim, int64_t end_dim) {
  if (x == nullptr) return Undefined("Flatten", "x");
  DT_ASSIGN_OR_RETURN(Shape out, FlattenShape(x->shape(), start_dim, end_dim, x->Describe()));
  return View("Flatten", x, out);
}

absl::StatusOr<OpCall> Permute(const char* name, Spec x, IntSpan dims) {
  if (x == nullptr) return Undefined(name, "x");
  const int r = x->ndim();
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
                                                   x->Describe()));
  }
  return OpCall{OpId::kPermute, {x}, std::move(attrs), name};
}

absl::StatusOr<OpCall> Transpose(Spec x, int64_t dim0, int64_t dim1) {
  DT_ASSIGN_OR_RETURN(const int a, Dim("Transpose", x, dim0));
  DT_ASSIGN_OR_RETURN(const int b, Dim("Transpose", x, dim1));
  std::vector<int64_t> perm(static_cast<size_t>(x->ndim()));
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[a], perm[b]);
  return Permute("Transpose", x, perm);
}

absl::StatusOr<OpCall> Unsqueeze(Spec x, int64_t dim) {
  if (x == nullptr) return Undefined("Unsqueeze", "x");
  DT_ASSIGN_OR_RETURN(const int d, NormalizeDim(dim, x->ndim() + 1, "Unsqueeze: dim"));
  return OpCall{OpId::kUnsqueeze, {x}, DimAttrs{d}};
}

absl::StatusOr<OpCall> Squeeze(Spec x, int64_t dim) {
  DT_ASSIGN_OR_RETURN(const int d, Dim("Squeeze", x, dim));
  return OpCall{OpId::kSqueeze, {x}, DimAttrs{d}};
}

absl::StatusOr<OpCall> Cat(absl::Span<const Spec> tensors, int64_t dim) {
  if (tensors.empty()) return absl::InvalidArgumentError("Cat: no tensors");
  if (tensors.size() > 255) {
    return absl::InvalidArgumentError(absl::StrCat("Cat: ", tensors.size(), " tensors (at most 255)"));
  }
  for (size_t j = 0; j < tensors.size(); ++j) {
    if (tensors[j] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("Cat: tensors[", j, "] is undefined"));
    }
    if (tensors[j]->ndim() != tensors[0]->ndim()) {
      return absl::InvalidArgumentError(absl::StrCat("Cat: tensors[0] ", tensors[0]->Describe(),
                                                     " and tensors[", j, "] ",
                                                     tensors[j]->Describe(), ": ranks differ"));
    }
  }
  DT_ASSIGN_OR_RETURN(const int d, Dim("Cat", tensors[0], dim));
  OpCall call{OpId::kCat, {}, DimAttrs{d}};
  call.inputs.assign(tensors.begin(), tensors.end());
  return call;
}

absl::StatusOr<OpCall> Split(Spec x, absl::Span<const int64_t> sizes, int64_t dim) {
  DT_ASSIGN_OR_RETURN(const int d, Dim("Split", x, dim));
  if (sizes.empty()) return absl::InvalidArgumentError("Split: no sizes");
  return OpCall{OpId::kSplit, {x}, SplitAttrs{d, Shape(sizes.begin(), sizes.end())}};
}

absl::StatusOr<OpCall> Chunk(Spec x, int64_t chunks, int64_t dim) {
  DT_ASSIGN_OR_RETURN(const int d, Dim("Chunk", x, dim));
  if (chunks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("Chunk: chunks must be positive, got ", chunks));
  }
  return Split(x, ChunkSizes(x->shape()[d], chunks), d);
}

absl::StatusOr<OpCall> TopK(Spec x, int64_t k, int64_t dim, bool largest) {
  DT_ASSIGN_OR_RETURN(const int d, Dim("TopK", x, dim));
  return OpCall{OpId::kTopK, {x}, TopKAttrs{k, d, largest}};
}

#define DT_CALLS_TENSOR_In(n) , n
#define DT_CALLS_TENSOR_Opt(n) , n
#define DT_CALLS_TENSOR_Attr(type, n, ...)
#define DT_CALLS_ATTR_In(n)
#define DT_CALLS_ATTR_Opt(n)
#define DT_CALLS_ATTR_Attr(type, n, ...) , n
#define DT_CALLS_DECLARED_(name, params)                                                      \
  absl::StatusOr<OpCall> name(DT_ROW_LIST(DT_CALLS_PARAM_, params)) {                         \
    return OpCall{OpId::k##name, {DT_ROW_LIST(DT_CALLS_TENSOR_, params)},                     \
                  name##Attrs{DT_ROW_LIST(DT_CALLS_ATTR_, params)}};                          \
  }
DT_DECLARED_OPS(DT_CALLS_DECLARED_)
#undef DT_CALLS_DECLARED_

}  // namespace dt::ops::internal::calls
