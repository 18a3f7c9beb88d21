// Scaled dot-product attention, contiguous and paged: validation and defaults; the kernel does the
// work.

#include <cmath>
#include <optional>
#include <vector>

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
  Tensor sinks, mask;  // f32 and contiguous: what params.sinks and params.mask point into
};

// Note [A KV cache of its own dtype]
// Keys and values share one float dtype, which may differ from q's on the CPU: a decode step reads
// every cached key and value once per layer, so an f32 model whose cache is f16 or bf16 (llama.cpp
// keeps f16 by default) reads half the bytes. The CPU kernels read half-precision rows in place,
// widened in registers (Note [Score rows read keys in place] in cpu/attention.cc), and compute in
// f32 (bf16 q: as bf16 products where the CPU has them, keys of another dtype rounded to bf16).
// Other devices take one dtype for all three (refused, naming them, otherwise).
absl::Status CheckCacheDType(absl::string_view op, const Tensor& q, absl::string_view k_name,
                             const Tensor& k, absl::string_view v_name, const Tensor& v) {
  DT_RETURN_IF_ERROR(internal::CheckSameDType(op, k_name, k, v_name, v));
  if (q.dtype() == k.dtype() || q.device().is_cpu()) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      op, " on ", q.device().ToString(), ": a KV dtype other than q's is CPU only, got q ",
      q.Describe(), ", ", k_name, " ", k.Describe(),
      " (Note [A KV cache of its own dtype] in ops/local/attention.cc)"));
}

// Checks the options every attention op shares (Note [Attention options] in cpu/attention.cc) and
// gives the sinks as f32 [hq] (undefined without).
absl::StatusOr<Tensor> CheckOptions(absl::string_view kOp, const Tensor& q, int64_t hq,
                                    bool causal, std::optional<double> softcap,
                                    std::optional<int64_t> window, const Tensor& sinks) {
  if (softcap.has_value() && !(std::isfinite(*softcap) && *softcap > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": softcap must be finite and > 0, got ", *softcap));
  }
  if (window.has_value() && (*window < 1 || !causal)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": window must be >= 1 and causal attention, got window ", *window,
        causal ? "" : " without causal"));
  }
  if (!sinks.defined()) return Tensor();
  DT_RETURN_IF_ERROR(internal::CheckFloat(kOp, "sinks", sinks));
  DT_RETURN_IF_ERROR(internal::CheckSameDevice(kOp, {{"q", &q}, {"sinks", &sinks}}));
  if (sinks.dim() != 1 || sinks.size(0) != hq) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": sinks must be [Hq] = [", hq,
                                                   "] (one per query head), got ",
                                                   sinks.Describe()));
  }
  DT_ASSIGN_OR_RETURN(Tensor f32, sinks.To(DType::kF32));
  return f32.Contiguous();
}
absl::StatusOr<AttentionCall> CheckAttention(absl::string_view kOp, const Tensor& q,
                                             const Tensor& k, const Tensor& v,
                                             const AttentionOptions& options) {
  DT_RETURN_IF_ERROR(internal::CheckFloat(kOp, "q", q));
  DT_RETURN_IF_ERROR(internal::CheckFloat(kOp, "k", k));
  DT_RETURN_IF_ERROR(internal::CheckFloat(kOp, "v", v));
  DT_RETURN_IF_ERROR(internal::CheckSameDevice(kOp, {{"q", &q}, {"k", &k}, {"v", &v}}));
  DT_RETURN_IF_ERROR(CheckCacheDType(kOp, q, "k", k, "v", v));
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
  DT_ASSIGN_OR_RETURN(c.sinks, CheckOptions(kOp, q, hq, options.causal, options.softcap,
                                            options.window, options.sinks));
  p.softcap = static_cast<float>(options.softcap.value_or(0));
  p.window = options.window.value_or(0);
  if (c.sinks.defined()) p.sinks = c.sinks.data<float>();
  if (const Tensor& m = options.mask; m.defined()) {
    DT_RETURN_IF_ERROR(internal::CheckFloat(kOp, "mask", m));
    DT_RETURN_IF_ERROR(internal::CheckSameDevice(kOp, {{"q", &q}, {"mask", &m}}));
    if (m.dim() != 4 || (m.size(0) != b && m.size(0) != 1) || m.size(1) != 1 || m.size(2) != sq ||
        m.size(3) != skv) {
      return absl::InvalidArgumentError(absl::StrCat(
          kOp, ": mask must be [B or 1, 1, Sq, Skv] = [", b, " or 1, 1, ", sq, ", ", skv,
          "] (added to every head's scores), got ", m.Describe()));
    }
    DT_ASSIGN_OR_RETURN(c.mask, m.To(DType::kF32));
    DT_ASSIGN_OR_RETURN(c.mask, c.mask.Contiguous());
    p.mask = c.mask.data<float>();
    p.mask_bs = m.size(0) == 1 ? 0 : sq * skv;
    p.mask_rs = skv;
  }
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

namespace {

// "PagedAttentionInto on cuda:0: ... CPU only" for a tensor off the CPU.
absl::Status CheckOnCpu(absl::string_view op, const Tensor& t) {
  if (t.device().is_cpu()) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      op, " on ", t.device().ToString(),
      ": paged attention is CPU only (Note [Paged attention] in ops/local/cpu/attention.cc)"));
}

// A pool of pages [N, H, P, W] of a float dtype.
absl::Status CheckPool(absl::string_view op, absl::string_view name, const Tensor& pool) {
  DT_RETURN_IF_ERROR(internal::CheckFloat(op, name, pool));
  if (pool.dim() != 4 || pool.size(2) < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, " must be a pool of pages [N, H, P, W] with P >= 1, got ", pool.Describe()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PagedAttentionInto(const Tensor& out, const Tensor& q, const Tensor& k_pages,
                                const Tensor& v_pages, const Tensor& page_table,
                                const Tensor& query_starts, const Tensor& kv_lengths,
                                const PagedAttentionOptions& options) {
  constexpr absl::string_view kOp = "PagedAttentionInto";
  DT_RETURN_IF_ERROR(internal::CheckFloat(kOp, "q", q));
  DT_RETURN_IF_ERROR(CheckOnCpu(kOp, q));
  DT_RETURN_IF_ERROR(CheckPool(kOp, "k_pages", k_pages));
  DT_RETURN_IF_ERROR(CheckPool(kOp, "v_pages", v_pages));
  DT_RETURN_IF_ERROR(CheckCacheDType(kOp, q, "k_pages", k_pages, "v_pages", v_pages));
  for (const auto& [name, t] : {std::pair<absl::string_view, const Tensor*>{"page_table", &page_table},
                                {"query_starts", &query_starts}, {"kv_lengths", &kv_lengths}}) {
    DT_RETURN_IF_ERROR(internal::CheckDefined(kOp, name, *t));
  }
  DT_RETURN_IF_ERROR(internal::CheckSameDevice(
      kOp, {{"q", &q}, {"k_pages", &k_pages}, {"v_pages", &v_pages}, {"page_table", &page_table},
            {"query_starts", &query_starts}, {"kv_lengths", &kv_lengths}}));
  const int64_t n = k_pages.size(0), hkv = k_pages.size(1), page = k_pages.size(2);
  if (q.dim() != 3 || v_pages.size(0) != n || v_pages.size(1) != hkv || v_pages.size(2) != page ||
      k_pages.size(3) != q.size(2) || hkv == 0 || q.size(0) % hkv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": expected q [Hq, T, D], k_pages [N, Hkv, P, D], v_pages [N, Hkv, P, Dv] with Hq a "
             "multiple of Hkv, got q ",
        q.Describe(), ", k_pages ", k_pages.Describe(), ", v_pages ", v_pages.Describe()));
  }
  const int64_t t = q.size(1), d = q.size(2);
  if (page_table.dtype() != DType::kI32 || page_table.dim() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": page_table must be i32 [S, max_pages], got ", page_table.Describe()));
  }
  const int64_t seqs = page_table.size(0), max_pages = page_table.size(1);
  if (kv_lengths.dtype() != DType::kI64 || kv_lengths.dim() != 1 || kv_lengths.size(0) != seqs ||
      query_starts.dtype() != DType::kI64 || query_starts.dim() != 1 ||
      query_starts.size(0) != seqs + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": expected query_starts i64 [S + 1] and kv_lengths i64 [S] for page_table ",
        page_table.Describe(), ", got query_starts ", query_starts.Describe(), ", kv_lengths ",
        kv_lengths.Describe()));
  }
  const std::vector<int64_t> starts = query_starts.ToVector<int64_t>();
  const std::vector<int64_t> lengths = kv_lengths.ToVector<int64_t>();
  DT_ASSIGN_OR_RETURN(const Tensor table, page_table.Contiguous());
  const int32_t* pages = table.data<int32_t>();
  if (starts[0] != 0 || starts[seqs] != t) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": query_starts must run from 0 to T = ",
                                                   t, ", got ", starts[0], " to ", starts[seqs]));
  }
  for (int64_t i = 0; i < seqs; ++i) {
    const int64_t rows = starts[i + 1] - starts[i], len = lengths[i];
    if (rows < 0 || len < rows || len > max_pages * page) {
      return absl::InvalidArgumentError(absl::StrCat(
          kOp, ": sequence ", i, " has ", rows, " query rows and ", len,
          " keys: need 0 <= rows <= keys <= max_pages · P = ", max_pages * page));
    }
    for (int64_t p = 0; p < (len + page - 1) / page; ++p) {
      const int32_t id = pages[i * max_pages + p];
      if (id < 0 || id >= n) {
        return absl::InvalidArgumentError(absl::StrCat(kOp, ": sequence ", i, " page ", p, " is ",
                                                       id, ", outside the pool's [0, ", n, ")"));
      }
    }
  }
  const Shape shape = {q.size(0), t, v_pages.size(3)};
  DT_RETURN_IF_ERROR(internal::CheckInto(
      kOp, out, shape, {"q", &q}, {{"q", &q}, {"k_pages", &k_pages}, {"v_pages", &v_pages}}));
  if (out.numel() == 0) return absl::OkStatus();
  if (d == 0) return absl::InvalidArgumentError(absl::StrCat(kOp, ": the head dim D of q ", q.Describe(), " is 0"));
  PagedAttentionParams params;
  params.causal = options.causal;
  const double scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(d)));
  if (!std::isfinite(scale)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": scale must be finite, got ", scale));
  }
  params.scale = static_cast<float>(scale);
  DT_ASSIGN_OR_RETURN(const Tensor sinks, CheckOptions(kOp, q, q.size(0), options.causal,
                                                       options.softcap, options.window,
                                                       options.sinks));
  params.softcap = static_cast<float>(options.softcap.value_or(0));
  params.window = options.window.value_or(0);
  if (sinks.defined()) params.sinks = sinks.data<float>();
  return cpu::PagedAttention(q, k_pages, v_pages, table, query_starts, kv_lengths, params, out);
}

absl::Status WriteToPages(const Tensor& pool, const Tensor& x, const Tensor& slots) {
  constexpr absl::string_view kOp = "WriteToPages";
  DT_RETURN_IF_ERROR(CheckPool(kOp, "pool", pool));
  DT_RETURN_IF_ERROR(CheckOnCpu(kOp, pool));
  DT_RETURN_IF_ERROR(internal::CheckFloat(kOp, "x", x));
  DT_RETURN_IF_ERROR(internal::CheckDefined(kOp, "slots", slots));
  DT_RETURN_IF_ERROR(internal::CheckSameDevice(kOp, {{"pool", &pool}, {"x", &x}, {"slots", &slots}}));
  if (x.dim() != 3 || x.size(0) != pool.size(1) || x.size(2) != pool.size(3) ||
      slots.dtype() != DType::kI64 || slots.dim() != 1 || slots.size(0) != x.size(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": expected pool [N, H, P, W], x [H, T, W] and slots i64 [T], got pool ",
        pool.Describe(), ", x ", x.Describe(), ", slots ", slots.Describe()));
  }
  if (pool.read_only() || pool.storage().data() == x.storage().data()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": pool ", pool.Describe(), " must be writable and share no storage with x"));
  }
  const int64_t capacity = pool.size(0) * pool.size(2);
  for (int64_t s : slots.ToVector<int64_t>()) {
    if (s < 0 || s >= capacity) {
      return absl::InvalidArgumentError(absl::StrCat(kOp, ": slot ", s, " is outside the pool's [0, ",
                                                     capacity, ") (", pool.Describe(), ")"));
    }
  }
  if (x.numel() == 0) return absl::OkStatus();
  return cpu::WriteToPages(pool, x, slots);
}

}  // namespace dt::ops
