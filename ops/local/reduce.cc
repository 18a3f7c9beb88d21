// Ops along one dim: reductions, softmax and top-k.

#include "absl/strings/str_cat.h"
#include "dtensor/ops/local/checks.h"
#include "dtensor/ops/local/kernels.h"
#include "dtensor/ops/local/ops.h"

namespace dt::ops {

namespace {

absl::string_view ReduceName(Reduction op) {
  switch (op) {
    case Reduction::kSum: return "Sum";
    case Reduction::kMean: return "Mean";
    case Reduction::kMax: return "Max";
    case Reduction::kArgmax: return "Argmax";
  }
  return "Reduce";
}

Shape WithoutDim(const Shape& shape, int d) {
  Shape s = shape;
  s.erase(s.begin() + d);
  return s;
}

}  // namespace

absl::StatusOr<Tensor> Reduce(Reduction op, const Tensor& x, int64_t dim, bool keepdim) {
  const absl::string_view name = ReduceName(op);
  DT_RETURN_IF_ERROR(op == Reduction::kMean ? internal::CheckFloat(name, "x", x)
                                           : internal::CheckNotBool(name, "x", x));
  DT_ASSIGN_OR_RETURN(int d, NormalizeDim(dim, x.dim(), absl::StrCat(name, ": dim")));
  if ((op == Reduction::kMax || op == Reduction::kArgmax) && x.size(d) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": cannot reduce the zero-size dim ", d,
                                                   " of ", x.Describe()));
  }
  DType out_dtype = x.dtype();
  if (op == Reduction::kArgmax || (op == Reduction::kSum && !IsFloating(x.dtype()))) {
    out_dtype = DType::kI64;
  }
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(WithoutDim(x.shape(), d), out_dtype, x.device()));
  if (out.numel() > 0) DT_RETURN_IF_ERROR(DT_OPS_KERNEL(out.device(), Reduce, op, x, d, out));
  return keepdim ? out.Unsqueeze(d) : out;
}

absl::StatusOr<Tensor> Sum(const Tensor& x, int64_t dim, bool keepdim) {
  return Reduce(Reduction::kSum, x, dim, keepdim);
}
absl::StatusOr<Tensor> Mean(const Tensor& x, int64_t dim, bool keepdim) {
  return Reduce(Reduction::kMean, x, dim, keepdim);
}
absl::StatusOr<Tensor> Max(const Tensor& x, int64_t dim, bool keepdim) {
  return Reduce(Reduction::kMax, x, dim, keepdim);
}
absl::StatusOr<Tensor> Argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return Reduce(Reduction::kArgmax, x, dim, keepdim);
}

namespace {

absl::StatusOr<Tensor> SoftmaxImpl(const Tensor& x, int64_t dim, bool log) {
  const absl::string_view name = log ? "LogSoftmax" : "Softmax";
  DT_RETURN_IF_ERROR(internal::CheckFloat(name, "x", x));
  DT_ASSIGN_OR_RETURN(int d, NormalizeDim(dim, x.dim(), absl::StrCat(name, ": dim")));
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(x.shape(), x.dtype(), x.device()));
  if (out.numel() > 0) DT_RETURN_IF_ERROR(DT_OPS_KERNEL(out.device(), Softmax, x, d, log, out));
  return out;
}

}  // namespace

absl::StatusOr<Tensor> Softmax(const Tensor& x, int64_t dim) { return SoftmaxImpl(x, dim, false); }
absl::StatusOr<Tensor> LogSoftmax(const Tensor& x, int64_t dim) { return SoftmaxImpl(x, dim, true); }

absl::StatusOr<TopKResult> TopK(const Tensor& x, int64_t k, int64_t dim, bool largest) {
  constexpr absl::string_view kOp = "TopK";
  DT_RETURN_IF_ERROR(internal::CheckNotBool(kOp, "x", x));
  DT_ASSIGN_OR_RETURN(int d, NormalizeDim(dim, x.dim(), "TopK: dim"));
  if (k < 0 || k > x.size(d)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": k ", k, " is out of range for dim ", d,
                                                   " of ", x.Describe(), " (expected 0..", x.size(d), ")"));
  }
  Shape shape = x.shape();
  shape[d] = k;
  TopKResult r;
  DT_ASSIGN_OR_RETURN(r.values, Tensor::Empty(shape, x.dtype(), x.device()));
  DT_ASSIGN_OR_RETURN(r.indices, Tensor::Empty(shape, DType::kI64, x.device()));
  if (r.values.numel() > 0) {
    DT_RETURN_IF_ERROR(DT_OPS_KERNEL(x.device(), TopK, x, k, d, largest, r.values, r.indices));
  }
  return r;
}

}  // namespace dt::ops
