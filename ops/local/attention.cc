// Scaled dot-product attention: validation and defaults; the kernel does the work.

#include <cmath>

#include "absl/strings/str_cat.h"
#include "dtensor/ops/local/checks.h"
#include "dtensor/ops/local/kernels.h"
#include "dtensor/ops/local/ops.h"

namespace dt::ops {

absl::StatusOr<Tensor> ScaledDotProductAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const AttentionOptions& options) {
  constexpr absl::string_view kOp = "ScaledDotProductAttention";
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
  AttentionParams p;
  p.causal = options.causal;
  p.kv_length = options.kv_length.value_or(skv);
  if (p.kv_length < 0 || p.kv_length > skv) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": kv_length ", p.kv_length,
                                                   " is out of range for Skv ", skv));
  }
  p.q_offset = options.q_offset.value_or(p.kv_length - sq);
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty({b, hq, sq, dv}, q.dtype(), q.device()));
  if (out.numel() == 0) return out;
  if (d == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": the head dim D of q ", q.Describe(), " is 0"));
  }
  const double scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(d)));
  if (!std::isfinite(scale)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": scale must be finite, got ", scale));
  }
  p.scale = static_cast<float>(scale);
  DT_RETURN_IF_ERROR(DT_OPS_KERNEL(q.device(), Attention, q, k, v, p, out));
  return out;
}

}  // namespace dt::ops
