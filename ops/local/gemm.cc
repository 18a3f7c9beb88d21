// Matmul and Linear: validation, broadcasting and operand layout; the GEMM itself is a kernel.

#include "absl/strings/str_cat.h"
#include "dtensor/ops/local/checks.h"
#include "dtensor/ops/local/cpu/qgemm.h"
#include "dtensor/ops/local/kernels.h"
#include "dtensor/ops/local/ops.h"

namespace dt::ops {

namespace {

using internal::CheckFloat;

bool IsGemmLayout(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  return (cs == 1 && rs >= std::max<int64_t>(1, cols)) || (rs == 1 && cs >= std::max<int64_t>(1, rows));
}

// t [..., R, C] with each matrix row-major or column-major with a leading dimension (see the Matmul
// kernel contract): strides of size-1 matrix dims are rewritten (they address nothing), and an
// operand that still does not qualify is copied.
absl::StatusOr<Tensor> GemmOperand(const Tensor& t) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  int64_t rs = t.stride(-2), cs = t.stride(-1);
  if (rows == 1) rs = cs == 1 ? std::max<int64_t>(1, cols) : 1;
  if (cols == 1) cs = rs == 1 ? std::max<int64_t>(1, rows) : 1;
  if (!IsGemmLayout(rows, cols, rs, cs)) return t.Clone();
  Shape strides = t.strides();
  strides[strides.size() - 2] = rs;
  strides[strides.size() - 1] = cs;
  return Tensor(t.storage(), t.shape(), std::move(strides), t.storage_offset(), t.dtype());
}

// a [..., M, K] · b [..., K, N] (+ bias [N]) with validated shapes; `batch` is the broadcast of
// their batch dims.
absl::StatusOr<Tensor> GemmImpl(const Tensor& a, const Tensor& b, const Tensor& bias, IntSpan batch) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  Shape out_shape(batch.begin(), batch.end());
  out_shape.push_back(m);
  out_shape.push_back(n);
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(out_shape, a.dtype(), a.device()));
  if (out.numel() == 0) return out;
  if (k == 0) {
    if (!bias.defined()) {
      DT_RETURN_IF_ERROR(out.Fill(0.0));
    } else {
      DT_ASSIGN_OR_RETURN(Tensor bias_e, bias.Expand(out_shape));
      DT_RETURN_IF_ERROR(out.CopyFrom(bias_e));
    }
    return out;
  }
  Tensor bias_c;
  if (bias.defined()) {
    DT_ASSIGN_OR_RETURN(bias_c, bias.Contiguous());
  }
  DT_ASSIGN_OR_RETURN(Tensor a_op, GemmOperand(a));
  DT_ASSIGN_OR_RETURN(Tensor b_op, GemmOperand(b));

  // One shared right operand (b has no batch dims or only broadcast ones): fold a's batch into M
  // when that needs no copy, so the kernel runs one large GEMM.
  bool b_shared = true;
  for (int d = 0; d < b_op.dim() - 2; ++d) b_shared &= b_op.size(d) == 1 || b_op.stride(d) == 0;
  const int64_t rows = out.numel() / n;
  if (b_shared && !batch.empty() && a_op.dim() == static_cast<int>(batch.size()) + 2 &&
      a_op.stride(-1) == 1) {
    if (auto a2 = a_op.View({rows, k}); a2.ok()) {
      Tensor b2 = b_op;
      while (b2.dim() > 2) {
        DT_ASSIGN_OR_RETURN(b2, b2.Select(0, 0));
      }
      DT_ASSIGN_OR_RETURN(Tensor a2_op, GemmOperand(*a2));
      DT_ASSIGN_OR_RETURN(Tensor out2, out.View({rows, n}));
      DT_RETURN_IF_ERROR(DT_OPS_KERNEL(out.device(), Matmul, a2_op, b2, bias_c, out2));
      return out;
    }
  }
  Shape a_shape(batch.begin(), batch.end()), b_shape(batch.begin(), batch.end());
  a_shape.insert(a_shape.end(), {m, k});
  b_shape.insert(b_shape.end(), {k, n});
  DT_ASSIGN_OR_RETURN(Tensor a_e, a_op.Expand(a_shape));
  DT_ASSIGN_OR_RETURN(Tensor b_e, b_op.Expand(b_shape));
  DT_RETURN_IF_ERROR(DT_OPS_KERNEL(out.device(), Matmul, a_e, b_e, bias_c, out));
  return out;
}

}  // namespace

absl::StatusOr<Tensor> Matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  constexpr absl::string_view kOp = "Matmul";
  DT_RETURN_IF_ERROR(CheckFloat(kOp, "a", a));
  DT_RETURN_IF_ERROR(CheckFloat(kOp, "b", b));
  DT_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "a", a, "b", b));
  DT_RETURN_IF_ERROR(internal::CheckSameDevice(kOp, {{"a", &a}, {"b", &b}}));
  DT_RETURN_IF_ERROR(internal::CheckMinDims(kOp, "a", a, 2));
  DT_RETURN_IF_ERROR(internal::CheckMinDims(kOp, "b", b, 2));
  DT_ASSIGN_OR_RETURN(Tensor a_mk, trans_a ? a.Transpose(-1, -2) : absl::StatusOr<Tensor>(a));
  DT_ASSIGN_OR_RETURN(Tensor b_kn, trans_b ? b.Transpose(-1, -2) : absl::StatusOr<Tensor>(b));
  if (a_mk.size(-1) != b_kn.size(-2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": inner dims differ: a ", a.Describe(), (trans_a ? " (transposed)" : ""), ", b ",
        b.Describe(), (trans_b ? " (transposed)" : ""), " (", a_mk.size(-1), " vs ", b_kn.size(-2), ")"));
  }
  auto batch = BroadcastShapes(IntSpan(a.shape()).subspan(0, a.dim() - 2),
                               IntSpan(b.shape()).subspan(0, b.dim() - 2));
  if (!batch.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": batch dims of a ", a.Describe(), " and b ",
                                                   b.Describe(), " do not broadcast"));
  }
  return GemmImpl(a_mk, b_kn, Tensor(), *batch);
}

namespace {

// The checks of a Linear with a quantized weight (Note [Quantized GEMM] in cpu/qgemm.cc: CPU
// only) and its output, in x's dtype, allocated.
absl::StatusOr<Tensor> QuantizedOutput(const Tensor& x, const Tensor& w, const Tensor& bias) {
  constexpr absl::string_view kOp = "Linear";
  DT_RETURN_IF_ERROR(internal::CheckSameDevice(kOp, {{"x", &x}, {"w", &w}, {"bias", &bias}}));
  if (!w.device().is_cpu()) {
    return absl::UnimplementedError(absl::StrCat("Linear with a quantized weight on ",
                                                 w.device().ToString(), ": quantized kernels are CPU only"));
  }
  DT_RETURN_IF_ERROR(internal::CheckMinDims(kOp, "x", x, 1));
  if (w.dim() != 2 || w.size(1) != x.size(-1)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": w must have shape [out, ", x.size(-1),
                                                   "] for x ", x.Describe(), ", got ", w.Describe()));
  }
  if (w.size(1) > 0 && (w.stride(1) != 1 || (w.size(0) > 1 && w.stride(0) != w.size(1)))) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": a quantized w must be contiguous (whole rows of blocks), got ", w.Describe(),
        " with strides ", ShapeToString(w.strides())));
  }
  if (bias.defined()) {
    DT_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "x", x, "bias", bias));
    DT_RETURN_IF_ERROR(internal::CheckShape(kOp, "bias", bias, {w.size(0)}));
  }
  Shape out_shape = x.shape();
  out_shape.back() = w.size(0);
  return Tensor::Empty(out_shape, x.dtype());
}

absl::StatusOr<Tensor> QuantizedLinear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  DT_ASSIGN_OR_RETURN(Tensor out, QuantizedOutput(x, w, bias));
  const int64_t n = w.size(0), k = w.size(1), m = n > 0 ? out.numel() / n : 0;
  if (out.numel() == 0) return out;
  if (k == 0) {
    DT_RETURN_IF_ERROR(out.Fill(0.0));
    if (bias.defined()) return Add(out, bias);
    return out;
  }
  DT_ASSIGN_OR_RETURN(Tensor xc, x.Contiguous());
  DT_ASSIGN_OR_RETURN(Tensor x2, xc.View({m, k}));
  Tensor bias_c;
  if (bias.defined()) {
    DT_ASSIGN_OR_RETURN(bias_c, bias.Contiguous());
  }
  DT_ASSIGN_OR_RETURN(Tensor out2, out.View({m, n}));
  DT_RETURN_IF_ERROR(cpu::QuantizedLinear(x2, w, bias_c, out2));
  return out;
}

}  // namespace

absl::StatusOr<std::vector<Tensor>> Linears(const Tensor& x, absl::Span<const Tensor> ws) {
  bool together = ws.size() > 1 && x.defined() && IsFloating(x.dtype()) && x.numel() > 0 &&
                  x.size(-1) > 0;
  for (const Tensor& w : ws) {
    together = together && w.defined() && IsQuantized(w.dtype()) && w.size(0) > 0;
  }
  std::vector<Tensor> outs;
  if (together) {
    std::vector<Tensor> outs2, no_bias(ws.size());
    const int64_t k = x.size(-1), m = x.numel() / k;
    for (const Tensor& w : ws) {
      DT_ASSIGN_OR_RETURN(Tensor out, QuantizedOutput(x, w, Tensor()));
      DT_ASSIGN_OR_RETURN(Tensor out2, out.View({m, w.size(0)}));
      outs.push_back(std::move(out));
      outs2.push_back(std::move(out2));
    }
    DT_ASSIGN_OR_RETURN(Tensor xc, x.Contiguous());
    DT_ASSIGN_OR_RETURN(Tensor x2, xc.View({m, k}));
    DT_RETURN_IF_ERROR(cpu::QuantizedLinears(x2, ws, no_bias, outs2));
    return outs;
  }
  for (const Tensor& w : ws) {
    DT_ASSIGN_OR_RETURN(Tensor y, Linear(x, w));
    outs.push_back(std::move(y));
  }
  return outs;
}

absl::StatusOr<Tensor> Linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  constexpr absl::string_view kOp = "Linear";
  DT_RETURN_IF_ERROR(CheckFloat(kOp, "x", x));
  if (w.defined() && IsQuantized(w.dtype())) return QuantizedLinear(x, w, bias);
  DT_RETURN_IF_ERROR(CheckFloat(kOp, "w", w));
  DT_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "x", x, "w", w));
  DT_RETURN_IF_ERROR(internal::CheckSameDevice(kOp, {{"x", &x}, {"w", &w}, {"bias", &bias}}));
  DT_RETURN_IF_ERROR(internal::CheckMinDims(kOp, "x", x, 1));
  if (w.dim() != 2 || w.size(1) != x.size(-1)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": w must have shape [out, ", x.size(-1),
                                                   "] for x ", x.Describe(), ", got ", w.Describe()));
  }
  if (bias.defined()) {
    DT_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "x", x, "bias", bias));
    DT_RETURN_IF_ERROR(internal::CheckShape(kOp, "bias", bias, {w.size(0)}));
  }
  DT_ASSIGN_OR_RETURN(Tensor x2, x.dim() == 1 ? x.Unsqueeze(0) : absl::StatusOr<Tensor>(x));
  DT_ASSIGN_OR_RETURN(Tensor wt, w.Transpose(0, 1));
  DT_ASSIGN_OR_RETURN(Tensor y,
                      GemmImpl(x2, wt, bias, IntSpan(x2.shape()).subspan(0, x2.dim() - 2)));
  return x.dim() == 1 ? y.Squeeze(0) : y;
}

}  // namespace dt::ops
