// Scaled dot-product attention: validation and defaults; the kernel does the work.

#include <cmath>

#include "absl/strings/str_cat.h"
#include "dtensor/ops/local/checks.h"
#include "dtensor/ops/local/kernels.h"
#include "dtensor/ops/local/ops.h"

namespace dt::ops {

namespace {

// The checks of an attention call, its parameters with every default resolved and its output's
// shape [B, Hq, Sq, Dv].
struct AttentionCall {
  AttentionParams params;
  Shape out_shape;
};
absl::StatusOr<AttentionCall> CheckAttention(absl::string_view kOp, const Tensor& q,
                                             const Tensor& k, const Tensor& v,
                                             const AttentionOptions& options) {
  DT_RETURN_IF_ERROR(internal::CheckFloat(kOp, "q", q));
  DT_RETURN_IF_ERROR(internal::CheckFloat(kOp, "k", k));
  DT_RETURN_IF_ERROR(internal::CheckFloat(kOp, "v", v));
  DT_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "q", q, "k", k));
  DT_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "q", q, "v", v));
  DT_RETURN_IF_ERROR(internal::CheckSameDevice(kOp, {{"q", &q}, {"k", &k}, {"v", &v}}));
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": expected q [B, Hq, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv], got q ",
        q.Describe(), ", k ", k.Describe(), ", v ", v.Describe()));
  }
  const int64_t b = q.size(0), hq = q.size(1), sq = q.size(2), d = q.size(3);
  const int64_t hkv = k.size(1), skv = k.size(2), dv = v.size(3);
  if (k.size(0) != b || v.size(0) != b || v.size(1) != hkv || v.size(2) != skv || k.size(3) != d ||
      (hkv == 0 ? hq != 0 : hq % hkv != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": shapes do not match q [B, Hq, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv] with Hq "
             "a multiple of Hkv: q ",
        q.Describe(), ", k ", k.Describe(), ", v ", v.Describe()));
  }
  AttentionCall c;
  c.out_shape = {b, hq, sq, dv};
  AttentionParams& p = c.params;
  p.causal = options.causal;
  p.kv_length = options.kv_length.value_or(skv);
  if (p.kv_length < 0 || p.kv_length > skv) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": kv_length ", p.kv_length,
                                                   " is out of range for Skv ", skv));
  }
  p.q_offset = options.q_offset.value_or(p.kv_length - sq);
  if (Numel(c.out_shape) == 0) return c;
  if (d == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": the head dim D of q ", q.Describe(), " is 0"));
  }
  const double scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(d)));
  if (!std::isfinite(scale)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": scale must be finite, got ", scale));
  }
  p.scale = static_cast<float>(scale);
  return c;
}

}  // namespace

absl::StatusOr<Tensor> ScaledDotProductAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const AttentionOptions& options) {
  DT_ASSIGN_OR_RETURN(const AttentionCall c,
                      CheckAttention("ScaledDotProductAttention", q, k, v, options));
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(c.out_shape, q.dtype(), q.device()));
  if (out.numel() == 0) return out;
  DT_RETURN_IF_ERROR(DT_OPS_KERNEL(q.device(), Attention, q, k, v, c.params, out));
  return out;
}

absl::Status ScaledDotProductAttentionInto(const Tensor& out, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const AttentionOptions& options) {
  constexpr absl::string_view kOp = "ScaledDotProductAttentionInto";
  DT_ASSIGN_OR_RETURN(const AttentionCall c, CheckAttention(kOp, q, k, v, options));
  DT_RETURN_IF_ERROR(internal::CheckInto(kOp, out, c.out_shape, {"q", &q},
                                         {{"q", &q}, {"k", &k}, {"v", &v}}));
  if (out.numel() == 0) return absl::OkStatus();
  return DT_OPS_KERNEL(q.device(), Attention, q, k, v, c.params, out);
}

}  // namespace dt::ops
