#include "dtensor/nn/attention.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/nn/norm.h"
#include "dtensor/ops/value_ops.h"

namespace dt::nn {

RotaryEmbedding::RotaryEmbedding(std::vector<float> inv_freq, std::string scaling, ops::RotaryStyle style)
    : Module("RotaryEmbedding"),
      head_dim_(2 * static_cast<int64_t>(inv_freq.size())),
      table_(std::move(scaling)),
      style_(style) {
  auto t = Tensor::FromVector<float>({static_cast<int64_t>(inv_freq.size())}, inv_freq);
  DT_CHECK_OK(t);
  SetBuffer("inv_freq", *std::move(t));
}

RotaryEmbedding::RotaryEmbedding(RotaryTableFn table, std::string scaling, ops::RotaryStyle style)
    : RotaryEmbedding(table(0).inv_freq, std::move(scaling), style) {
  table_fn_ = std::move(table);
}

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, double theta, ops::RotaryStyle style)
    : RotaryEmbedding(ops::RopeInverseFrequencies(head_dim, theta), absl::StrCat("theta=", theta), style) {
  head_dim_ = head_dim;  // an odd head_dim is reported by Forward
}

std::string RotaryEmbedding::ExtraRepr() const {
  return absl::StrCat("head_dim=", head_dim_, ", ", table_, style_ == ops::RotaryStyle::kHalf ? ", half" : ", interleaved");
}

absl::StatusOr<Values> RotaryEmbedding::Forward(Values inputs) {
  DT_ASSIGN_OR_RETURN(Value positions, SingleInput(*this, inputs));
  if (head_dim_ <= 0 || head_dim_ % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RotaryEmbedding '", FullName(), "': head_dim must be even, got ", head_dim_));
  }
  if (positions.dtype() != DType::kI64 && positions.dtype() != DType::kI32) {
    return absl::InvalidArgumentError(absl::StrCat("RotaryEmbedding '", FullName(),
                                                   "': positions must be i64 or i32, got ",
                                                   positions.Describe()));
  }
  if (positions.is_dtensor()) {
    for (const Placement& p : positions.dtensor().placements()) {
      if (!p.is_replicate()) {
        return absl::InvalidArgumentError(absl::StrCat("RotaryEmbedding '", FullName(),
                                                       "': positions must be replicated, got ",
                                                       positions.Describe()));
      }
    }
  }
  const Tensor& pos = positions.local();
  const std::vector<int64_t> p = pos.ToVector<int64_t>();
  float scaling = 1.0f;
  if (table_fn_) {
    const int64_t seq_len = p.empty() ? 0 : *std::max_element(p.begin(), p.end()) + 1;
    RotaryTable t = table_fn_(seq_len);
    if (static_cast<int64_t>(t.inv_freq.size()) * 2 != head_dim_) {
      return absl::InternalError(absl::StrCat("RotaryEmbedding '", FullName(), "': its table function gave ",
                                              t.inv_freq.size(), " frequencies for head_dim ", head_dim_));
    }
    if (t.inv_freq != FindBuffer("inv_freq")->local().ToVector<float>()) {  // a new table (dynamic)
      DT_ASSIGN_OR_RETURN(Tensor inv_t, Tensor::FromVector<float>({head_dim_ / 2}, t.inv_freq));
      SetBuffer("inv_freq", std::move(inv_t));
    }
    scaling = t.attention_scaling;
  }
  const std::vector<float> inv = FindBuffer("inv_freq")->local().ToVector<float>();
  const int64_t half = head_dim_ / 2;
  std::vector<float> cos(p.size() * head_dim_), sin(p.size() * head_dim_);
  for (size_t t = 0; t < p.size(); ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p[t]) * inv[i];
      const float c = std::cos(angle) * scaling, s = std::sin(angle) * scaling;
      const int64_t a = style_ == ops::RotaryStyle::kHalf ? i : 2 * i;
      const int64_t b = style_ == ops::RotaryStyle::kHalf ? i + half : 2 * i + 1;
      cos[t * head_dim_ + a] = cos[t * head_dim_ + b] = c;
      sin[t * head_dim_ + a] = sin[t * head_dim_ + b] = s;
    }
  }
  Shape shape = pos.shape();
  shape.push_back(head_dim_);
  DT_ASSIGN_OR_RETURN(Tensor cos_t, Tensor::FromVector<float>(shape, cos));
  DT_ASSIGN_OR_RETURN(Tensor sin_t, Tensor::FromVector<float>(shape, sin));
  DT_ASSIGN_OR_RETURN(cos_t, cos_t.To(pos.device()));
  DT_ASSIGN_OR_RETURN(sin_t, sin_t.To(pos.device()));
  if (!positions.is_dtensor()) return Values{Value(cos_t), Value(sin_t)};
  const DTensor& d = positions.dtensor();
  DT_ASSIGN_OR_RETURN(DTensor cos_d, DTensor::FromLocal(cos_t, d.mesh(), d.placements()));
  DT_ASSIGN_OR_RETURN(DTensor sin_d, DTensor::FromLocal(sin_t, d.mesh(), d.placements()));
  return Values{Value(std::move(cos_d)), Value(std::move(sin_d))};
}

Attention::Attention(const AttentionOptions& options) : Module("Attention"), options_(options) {
  AttentionOptions& o = options_;
  if (o.num_kv_heads == 0) o.num_kv_heads = o.num_heads;
  if (o.head_dim == 0 && o.num_heads > 0) o.head_dim = o.hidden_size / o.num_heads;
  const int64_t q = o.num_heads * o.head_dim, kv = o.num_kv_heads * o.head_dim;
  const bool qkv_bias = o.bias || o.qkv_bias;
  if (o.fused_qkv) {
    qkv_ = &AddModule<Linear>(o.qkv_name, o.hidden_size, q + 2 * kv, qkv_bias, o.dtype);
    qkv_->set_packed_col_blocks({q, kv, kv});
  } else {
    // Note [Gated attention]: each head's rows are [q | gate].
    const int64_t q_rows = o.gated ? 2 * o.head_dim : o.head_dim;
    q_ = &AddModule<Linear>(o.q_name, o.hidden_size, o.num_heads * q_rows, qkv_bias, o.dtype);
    k_ = &AddModule<Linear>(o.k_name, o.hidden_size, kv, qkv_bias, o.dtype);
    v_ = &AddModule<Linear>(o.v_name, o.hidden_size, kv, qkv_bias, o.dtype);
    // The heads the unit styles keep whole (Note [Unit meshes] in nn/styles.h).
    q_->set_col_unit(q_rows);
    k_->set_col_unit(o.head_dim);
    v_->set_col_unit(o.head_dim);
  }
  o_ = &AddModule<Linear>(o.o_name, q, o.hidden_size, o.bias, o.dtype);
  o_->set_row_unit(o.head_dim);
  if (o.qk_norm) {
    q_norm_ = &AddModule<RMSNorm>("q_norm", o.qk_norm_whole ? q : o.head_dim, o.norm_eps,
                                  o.dtype, o.norm_form);
    k_norm_ = &AddModule<RMSNorm>("k_norm", o.qk_norm_whole ? kv : o.head_dim, o.norm_eps,
                                  o.dtype, o.norm_form);
  }
  if (o.sinks) RegisterParameter("sinks", {o.num_heads}, o.dtype);
}

void Attention::ResetKVCache(int64_t reserve) { cache_.Reset(reserve); }

void Attention::SetKVCacheDType(std::optional<DType> dtype) {
  cache_.SetDType(dtype);
  paged_.SetDType(dtype);
}

namespace {

// Note [Keys are rotated into the cache]
// Rotary position embedding reads the keys as the projection left them ([B, S, h·D] viewed as
// [B, h, S, D]) and writes them rotated; the cache then copied the rotated keys into its buffer,
// a second pass over every key. With the cache on, the rotation writes into the buffer's slot
// directly (ops::ApplyRotaryInto), so each key is read once and written once, where the attention
// then reads it. The values are copied into their buffer as they are (a projection cannot write a
// [B, h, S, D] slot); tests/nn/forward_copies_test.cc counts that copy as the one a layer makes.

// Note [KV buffers are reserved]
// A cache that grows by doubling copies itself at each growth and touches fresh pages: at the
// first decode step after a 224-token prompt every layer's K and V moved to buffers twice the size,
// one step taking several times the others. CausalLM::Generate therefore reserves the prompt
// plus the tokens it may generate (at most kMaxReserve of them) when it resets the cache, as
// llama.cpp sizes its cache for the context up front; beyond the reserve the buffers double.

// Appends local `x` [B, h, S, D] to the cache whose filled part is `cache` (a view of `buffer`,
// or undefined), growing `buffer` [B, h, capacity, D] of `dtype` to `reserve` positions or by
// doubling; returns the new filled part. x is written into its slot by `write(slot, x)`.
template <typename Write>
absl::StatusOr<Tensor> AppendToBuffer(Tensor& buffer, const Value& cache, const Tensor& x,
                                      DType dtype, int64_t reserve, Write write) {
  const int64_t len = cache.defined() ? cache.shape()[2] : 0, need = len + x.size(2);
  if (!buffer.defined() || buffer.size(2) < need) {
    Shape shape = x.shape();
    shape[2] = std::max({need, buffer.defined() ? 2 * buffer.size(2) : need, reserve});
    DT_ASSIGN_OR_RETURN(Tensor grown, Tensor::Empty(shape, dtype, x.device()));
    if (len > 0) {
      DT_ASSIGN_OR_RETURN(Tensor old, grown.Narrow(2, 0, len));
      DT_RETURN_IF_ERROR(old.CopyFrom(cache.local()));
    }
    buffer = std::move(grown);
  }
  DT_ASSIGN_OR_RETURN(Tensor slot, buffer.Narrow(2, len, x.size(2)));
  DT_RETURN_IF_ERROR(write(slot, x));
  return buffer.Narrow(2, 0, need);
}

absl::Status CopyInto(const Tensor& slot, const Tensor& x) { return slot.CopyFrom(x); }

}  // namespace

absl::Status KVCache::Append(Value* k, Value* v, const KeyRotary* rotary) {
  const bool local = k->is_local() && v->is_local() && (!k_.defined() || k_.is_local()) &&
                     (rotary == nullptr || (rotary->cos.is_local() && rotary->sin.is_local()));
  if (!local && rotary != nullptr) {
    DT_ASSIGN_OR_RETURN(*k, ops::ApplyRotary(*k, rotary->cos, rotary->sin, rotary->style));
  }
  if (!local && dtype_.has_value()) {  // kept in the cache's dtype
    DT_ASSIGN_OR_RETURN(*k, ops::Cast(*k, *dtype_));
    DT_ASSIGN_OR_RETURN(*v, ops::Cast(*v, *dtype_));
  }
  if (local) {
    // The keys rotated as they are written (Note [Keys are rotated into the cache]).
    auto write_k = [&](const Tensor& slot, const Tensor& x) {
      return rotary == nullptr ? CopyInto(slot, x)
                               : ops::ApplyRotaryInto(slot, x, rotary->cos.local(),
                                                      rotary->sin.local(), rotary->style);
    };
    const DType dtype = dtype_.value_or(k->local().dtype());
    DT_ASSIGN_OR_RETURN(Tensor kk,
                        AppendToBuffer(buffer_k_, k_, k->local(), dtype, reserve_, write_k));
    DT_ASSIGN_OR_RETURN(Tensor vv,
                        AppendToBuffer(buffer_v_, v_, v->local(), dtype, reserve_, CopyInto));
    *k = kk;
    *v = vv;
  } else if (k_.defined()) {
    DT_ASSIGN_OR_RETURN(*k, ops::Cat({k_, *k}, 2));
    DT_ASSIGN_OR_RETURN(*v, ops::Cat({v_, *v}, 2));
  }
  k_ = *k;
  v_ = *v;
  return absl::OkStatus();
}

void KVCache::Reset(int64_t reserve) {
  k_ = v_ = Value();
  buffer_k_ = buffer_v_ = Tensor();
  reserve_ = reserve;
}

int64_t KVCache::bytes() const {
  int64_t n = 0;
  for (const Tensor* t : {&buffer_k_, &buffer_v_}) {
    if (t->defined()) n += t->numel() * DTypeSize(t->dtype());
  }
  for (const Value* t : {&k_, &v_}) {  // DTensor K/V (no buffer): their local shards
    if (t->defined() && !t->is_local()) n += t->local().numel() * DTypeSize(t->local().dtype());
  }
  return n;
}

void KVCache::SetDType(std::optional<DType> dtype) {
  Reset(reserve_);
  dtype_ = dtype;
}

// Note [Paged KV cache]
// The serving engine (nn/models/engine.cc) runs the tokens of many sequences in one forward: the
// activation [1, T, H] holds a prefill chunk of some sequences and one decode token of others,
// cos and sin are per token, and every layer's projections and MLP run once over all T rows.
// Attention alone is per sequence: each layer keeps a pool of pages on each rank (PagedKVCache:
// keys [N, h, P, D], values [N, h, P, Dv], this rank's KV heads as the contiguous cache holds
// them: Note [Replicated KV heads]), the step's new keys (rotated) and values are written into
// their sequences' pages (ops::WriteToPages: the slot of each token, page · P + row, from the
// PagedStep), and ops::PagedAttentionInto attends each sequence's query rows over its own pages
// with its own causal offset. The page table is the engine's and the same for every layer: page n
// of the table holds positions of the same sequence in every layer's pool. A sequence grows by
// taking pages, never by moving its cache. The pools are made at the first step, when the number
// of KV heads this rank computes is known; their memory is touched only as pages are first
// written (the engine hands out the lowest free page first).

absl::Status PagedKVCache::Attend(const PagedStep& step, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const ops::PagedAttentionOptions& options,
                                  const Tensor& out) {
  DT_ASSIGN_OR_RETURN(const Tensor kh, k.Select(0, 0));  // [h, T, D]
  DT_ASSIGN_OR_RETURN(const Tensor vh, v.Select(0, 0));
  DT_ASSIGN_OR_RETURN(const Tensor qh, q.Select(0, 0));
  const Shape k_shape = {step.pool_pages, kh.size(0), step.page_tokens, kh.size(2)};
  const Shape v_shape = {step.pool_pages, vh.size(0), step.page_tokens, vh.size(2)};
  const DType dtype = dtype_.value_or(k.dtype());
  if (!k_.defined() || k_.shape() != k_shape || v_.shape() != v_shape || k_.dtype() != dtype) {
    k_ = v_ = Tensor();
    DT_ASSIGN_OR_RETURN(k_, Tensor::Empty(k_shape, dtype, k.device()));
    DT_ASSIGN_OR_RETURN(v_, Tensor::Empty(v_shape, dtype, v.device()));
  }
  DT_RETURN_IF_ERROR(ops::WriteToPages(k_, kh, step.slots));
  DT_RETURN_IF_ERROR(ops::WriteToPages(v_, vh, step.slots));
  return ops::PagedAttentionInto(out, qh, k_, v_, step.page_table, step.query_starts,
                                 step.kv_lengths, options);
}

void PagedKVCache::Release() { k_ = v_ = Tensor(); }

void PagedKVCache::SetDType(std::optional<DType> dtype) {
  Release();
  dtype_ = dtype;
}

int64_t PagedKVCache::bytes() const {
  return k_.defined() ? (k_.numel() + v_.numel()) * DTypeSize(k_.dtype()) : 0;
}

int64_t Attention::kv_cache_length() const { return use_cache_ ? cache_.length() : 0; }

std::string Attention::ExtraRepr() const {
  return absl::StrCat("hidden=", options_.hidden_size, ", heads=", options_.num_heads,
                      ", kv_heads=", options_.num_kv_heads, ", head_dim=", options_.head_dim,
                      options_.causal ? ", causal" : "", options_.fused_qkv ? ", fused_qkv" : "",
                      options_.bias ? ", bias" : (options_.qkv_bias ? ", qkv_bias" : ""),
                      options_.qk_norm ? ", qk_norm" : "", options_.gated ? ", gated" : "",
                      options_.scale ? absl::StrCat(", scale=", *options_.scale) : "",
                      options_.softcap ? absl::StrCat(", softcap=", *options_.softcap) : "",
                      options_.window ? absl::StrCat(", window=", *options_.window) : "",
                      options_.sinks ? ", sinks" : "");
}

absl::Status Attention::CheckHeads() const {
  const AttentionOptions& o = options_;
  if (o.gated && o.fused_qkv) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Attention '", FullName(), "': gated attention needs separate q/k/v projections, not "
        "fused_qkv"));
  }
  if (o.qk_norm_whole && (o.fused_qkv || o.gated)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Attention '", FullName(), "': q/k norms over the whole projection need separate, "
        "ungated q/k/v projections"));
  }
  if (o.num_heads > 0 && o.num_kv_heads > 0 && o.head_dim > 0 &&
      o.num_heads % o.num_kv_heads == 0) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "Attention '", FullName(), "': num_heads ", o.num_heads, " must be a positive multiple of ",
      "num_kv_heads ", o.num_kv_heads, ", and head_dim (", o.head_dim, ") positive"));
}

absl::Status Attention::ValidateTensorParallel(const TPValidationContext& ctx) const {
  DT_RETURN_IF_ERROR(CheckHeads());
  const int64_t tp = ctx.tp_size();
  auto fail = [&](absl::string_view what, int64_t n, absl::string_view projection,
                  absl::string_view consequence) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Attention '", ctx.module_name(), "': tensor parallel size ", tp, " does not divide ", what,
        " ", n, " (", projection, " sharded): each rank would hold a fraction of ", consequence));
  };
  const AttentionOptions& o = options_;
  const std::string q = (o.fused_qkv ? o.qkv_name : o.q_name) + ".weight";
  // A head count must be divisible by the number of pieces the plan cuts it into: tp, or under
  // the unit styles gcd(heads, tp) (Note [Unit meshes] in nn/styles.h), which always is; a shard
  // in whole heads (S(0,unit=head rows): Note [Unit shards] in dtensor/placement.h) takes any.
  auto fraction = [&](const std::string& p, int64_t heads) {
    return ctx.IsSharded(p) && ctx.PlannedPlacement(p).unit() == 1 &&
           heads % ctx.PlannedPieces(p) != 0;
  };
  if (fraction(q, o.num_heads)) {
    return fail("num_heads", o.num_heads, q, "a query head");
  }
  for (const std::string& p : o.fused_qkv ? std::vector<std::string>{q}
                                          : std::vector<std::string>{o.k_name + ".weight",
                                                                     o.v_name + ".weight"}) {
    if (fraction(p, o.num_kv_heads)) {
      return fail("num_kv_heads", o.num_kv_heads, p,
                  o.fused_qkv ? "a KV head (transformers #48307)"
                              : "a KV head (transformers #48307); a plan that replicates k_proj "
                                "and v_proj, or splits them unit_colwise (whole heads on every "
                                "rank), runs it, every rank keeping the KV heads its query heads "
                                "use");
    }
  }
  // Placements that compute something else, whatever the sizes (Note [Replicated KV heads]).
  auto mixed = [&](const std::string& a, const std::string& b, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Attention '", ctx.module_name(), "': ", a, " is [", ctx.PlannedPlacement(a).ToString(),
        "] but ", b, " is [", ctx.PlannedPlacement(b).ToString(), "]: ", why));
  };
  const std::string q_mod = o.fused_qkv ? o.qkv_name : o.q_name;
  const bool q_heads = ctx.OutputSharded(q_mod);
  if (!o.fused_qkv) {
    const std::string k = o.k_name + ".weight", v = o.v_name + ".weight";
    const bool k_heads = ctx.OutputSharded(o.k_name), v_heads = ctx.OutputSharded(o.v_name);
    if (k_heads != v_heads) {
      return mixed(k, v, "keys and values must be split alike (both colwise, or both replicated)");
    }
    if (k_heads && !q_heads) {
      return mixed(q, k,
                   "every rank would pair all query heads with a fraction of the KV heads; "
                   "shard q_proj colwise too, or replicate k_proj and v_proj");
    }
  }
  const std::string out = o.o_name + ".weight";
  if (q_heads && !ctx.IsSharded(out)) {
    return mixed(q, out,
                 "the attention output holds this rank's heads, which only a rowwise o_proj "
                 "takes");
  }
  if (q_heads && ctx.PlannedPieces(q) != ctx.PlannedPieces(out)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Attention '", ctx.module_name(), "': ", q, " splits the ", o.num_heads,
        " query heads into ", ctx.PlannedPieces(q), " groups but ", out, " takes ",
        ctx.PlannedPieces(out), " (unit_colwise on the queries pairs with unit_rowwise on ",
        o.o_name, ", colwise with rowwise)"));
  }
  return absl::OkStatus();
}

// Note [Replicated KV heads]
// A plan may shard q_proj and keep k_proj / v_proj replicated (sensible for MQA, or when tp
// exceeds the KV heads: vLLM replicates KV heads the same way), or split them by unit_colwise into
// fewer groups than the query heads (Note [Unit meshes] in nn/styles.h). On DTensors
// ops::ScaledDotProductAttention picks each rank's KV heads. On local tensors the local GQA
// grouping would pair this rank's query heads (global heads h0 .. h0+n-1) with the first of the
// KV heads it holds, silently. So the forward keeps, before rotary and the cache, only the KV
// heads this rank's query heads use, as transformers' repeat_kv would pair them (head h uses KV
// head h / g, g = num_heads / num_kv_heads), reading h0 from q_proj's placement and the first KV
// head the rank holds, k0, from k_proj's:
//   the rank holds whole groups (h0 and n multiples of g)  KV heads h0/g .. (h0+n)/g - 1 (a view)
//   its heads share one KV head (n divides g)              that one KV head (a view)
//   otherwise (a group split between ranks)                one KV head per query head
// so each rank computes attention and caches keys for its own KV heads only (at tp = 9 with 3 KV
// heads: one KV head per rank instead of three). A rank whose KV heads lack one its queries use
// (a hand-made placement) is an error naming both ranges.
absl::StatusOr<int64_t> Attention::FirstHead(const Linear* l, int64_t local, int64_t all,
                                             absl::string_view what) const {
  if (local == all) return int64_t{0};
  const AttentionOptions& o = options_;
  const Parameter* w = l->FindParameter("weight");
  int shards = 0;
  bool rows = true;
  if (w->placed()) {
    for (const Placement& p : w->spec().placements()) {
      if (!p.is_any_shard()) continue;
      ++shards;
      rows = rows && p.is_shard() && p.dim() == 0;
    }
  }
  if (shards == 0 || !rows) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Attention '", FullName(), "': this rank holds ", local, " of ", all, " ", what,
        " heads, and ", l->name(), ".weight (", w->Describe(), ") does not say which",
        what == "query" ? absl::StrCat("; shard ", o.k_name, " and ", o.v_name, " too")
                        : std::string()));
  }
  return w->spec().Offset()[0] / l->ShardUnit(*w, /*col=*/true);
}

absl::StatusOr<Tensor> Attention::LocalSinks(int64_t n) {
  if (!options_.sinks) return Tensor();
  DT_ASSIGN_OR_RETURN(Value sv, ParamValue("sinks"));
  Tensor sinks = sv.is_dtensor() ? sv.dtensor().ToLocal() : sv.local();
  if (sinks.dim() == 1 && sinks.size(0) == n) return sinks;  // sharded with the heads, or all
  if (sinks.dim() != 1 || sinks.size(0) != options_.num_heads || options_.fused_qkv) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Attention '", FullName(), "': this rank holds ", n, " query heads but sinks ",
        sinks.Describe(), " are neither theirs nor all ", options_.num_heads,
        options_.fused_qkv ? " (with fused_qkv, shard sinks as the heads)" : ""));
  }
  DT_ASSIGN_OR_RETURN(const int64_t h0, FirstHead(q_, n, options_.num_heads, "query"));
  return sinks.Narrow(0, h0, n);
}

absl::Status Attention::PickKVHeads(const Value& q, Value* k, Value* v) const {
  const AttentionOptions& o = options_;
  if (!q.is_local() || !k->is_local() || q.shape()[1] == o.num_heads || o.num_kv_heads == 1 ||
      o.fused_qkv) {  // fused: q, k and v are cut by the same packed blocks
    return absl::OkStatus();
  }
  const int64_t n = q.shape()[1], m = k->shape()[1];
  DT_ASSIGN_OR_RETURN(const int64_t h0, FirstHead(q_, n, o.num_heads, "query"));
  DT_ASSIGN_OR_RETURN(const int64_t k0, FirstHead(k_, m, o.num_kv_heads, "KV"));
  const int64_t group = o.num_heads / o.num_kv_heads;
  const int64_t first = h0 / group, last = (h0 + n - 1) / group;
  if (first < k0 || last >= k0 + m) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Attention '", FullName(), "': this rank's query heads ", h0, "..", h0 + n - 1,
        " use KV heads ", first, "..", last, ", but it holds KV heads ", k0, "..", k0 + m - 1,
        " (", o.q_name, ".weight ", q_->FindParameter("weight")->Describe(), ", ", o.k_name,
        ".weight ", k_->FindParameter("weight")->Describe(), ")"));
  }
  if ((h0 % group == 0 && n % group == 0) || first == last) {
    if (first == k0 && last - first + 1 == m) return absl::OkStatus();  // paired as they are
    DT_ASSIGN_OR_RETURN(Tensor kk, k->local().Narrow(1, first - k0, last - first + 1));
    DT_ASSIGN_OR_RETURN(Tensor vv, v->local().Narrow(1, first - k0, last - first + 1));
    *k = Value(std::move(kk));
    *v = Value(std::move(vv));
    return absl::OkStatus();
  }
  std::vector<Value> ks, vs;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t kv = (h0 + j) / group - k0;
    DT_ASSIGN_OR_RETURN(Tensor kj, k->local().Narrow(1, kv, 1));
    DT_ASSIGN_OR_RETURN(Tensor vj, v->local().Narrow(1, kv, 1));
    ks.emplace_back(kj);
    vs.emplace_back(vj);
  }
  DT_ASSIGN_OR_RETURN(*k, ops::Cat(ks, 1));
  DT_ASSIGN_OR_RETURN(*v, ops::Cat(vs, 1));
  return absl::OkStatus();
}

absl::StatusOr<Values> Attention::Forward(Values inputs) {
  if (inputs.empty() || inputs.size() > 4 || !inputs[0].defined() || inputs[0].dim() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Attention '", FullName(), "' takes {x [B, S, H], cos, sin, mask}, got ", inputs.size(),
        " inputs", inputs.empty() ? "" : absl::StrCat(" (x ", inputs[0].Describe(), ")")));
  }
  DT_RETURN_IF_ERROR(CheckHeads());
  const Value& x = inputs[0];
  const Value cos = inputs.size() > 1 ? inputs[1] : Value();
  const Value sin = inputs.size() > 2 ? inputs[2] : Value();
  const Value mask = inputs.size() > 3 ? inputs[3] : Value();
  if (cos.defined() != sin.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Attention '", FullName(), "': give both cos and sin, or neither"));
  }
  const int64_t b = x.shape()[0], s = x.shape()[1], d = options_.head_dim;

  const AttentionOptions& o = options_;
  Value q, k, v, gate;
  if (o.fused_qkv) {
    // This rank's [q | k | v] slices (packed_colwise keeps every block's share together): split
    // by the global ratio nH : nKV : nKV, which also holds for the whole (replicated) output.
    // Pieces taken plain: this forward pairs heads itself (Note [Local pieces remember their
    // layout] in ops/value.h; the plan was checked by ValidateTensorParallel).
    DT_ASSIGN_OR_RETURN(Value qkv, qkv_->CallOne({x}));
    qkv = PlainLocal(qkv);
    const int64_t width = qkv.shape().back(), total = (o.num_heads + 2 * o.num_kv_heads) * d;
    const int64_t wq = width * o.num_heads * d / total, wkv = width * o.num_kv_heads * d / total;
    DT_ASSIGN_OR_RETURN(std::vector<Value> parts, ops::Split(qkv, {wq, wkv, wkv}, -1));
    DT_ASSIGN_OR_RETURN(q, Project(parts[0], b, s, q_norm_));
    DT_ASSIGN_OR_RETURN(k, Project(parts[1], b, s, k_norm_));
    DT_ASSIGN_OR_RETURN(v, Project(parts[2], b, s, nullptr));
  } else {
    DT_ASSIGN_OR_RETURN(std::vector<Value> y, CallLinears({q_, k_, v_}, x));
    Value qy = PlainLocal(y[0]);
    if (o.gated) {  // Note [Gated attention]
      DT_ASSIGN_OR_RETURN(qy, ops::Reshape(qy, {b, s, -1, 2 * d}));
      DT_ASSIGN_OR_RETURN(std::vector<Value> parts, ops::Split(qy, {d, d}, -1));
      DT_ASSIGN_OR_RETURN(qy, ops::Reshape(parts[0], {b, s, -1}));
      DT_ASSIGN_OR_RETURN(gate, ops::Reshape(parts[1], {b, s, -1}));
    }
    // Whole-projection norms take the projections' pieces (Note [A norm over a sharded dim]).
    DT_ASSIGN_OR_RETURN(q, Project(o.gated ? qy : y[0], b, s, q_norm_));
    DT_ASSIGN_OR_RETURN(k, Project(y[1], b, s, k_norm_));
    DT_ASSIGN_OR_RETURN(v, Project(PlainLocal(y[2]), b, s, nullptr));
  }
  DT_RETURN_IF_ERROR(PickKVHeads(q, &k, &v));
  KVCache::KeyRotary rotary{.style = options_.rotary_style};
  if (cos.defined()) {
    DT_ASSIGN_OR_RETURN(rotary.cos, ops::AsKindOf(cos, q));
    DT_ASSIGN_OR_RETURN(rotary.sin, ops::AsKindOf(sin, q));
    if (rotary.cos.dim() == 3) {  // [B, S, D] -> [B, 1, S, D]
      DT_ASSIGN_OR_RETURN(rotary.cos, ops::Unsqueeze(rotary.cos, 1));
      DT_ASSIGN_OR_RETURN(rotary.sin, ops::Unsqueeze(rotary.sin, 1));
    }
    DT_ASSIGN_OR_RETURN(q, ops::ApplyRotary(q, rotary.cos, rotary.sin, rotary.style));
  }
  const KVCache::KeyRotary* key_rotary = cos.defined() ? &rotary : nullptr;
  if (paged_step_ == nullptr && use_cache_) {
    // Note [Keys are rotated into the cache]
    DT_RETURN_IF_ERROR(cache_.Append(&k, &v, key_rotary));
  } else if (key_rotary != nullptr) {
    DT_ASSIGN_OR_RETURN(k, ops::ApplyRotary(k, rotary.cos, rotary.sin, rotary.style));
  }
  ops::AttentionOptions attn;
  attn.causal = options_.causal;
  attn.scale = options_.scale;
  attn.softcap = options_.softcap;
  attn.window = options_.window;
  if (options_.sinks && !q.is_local()) {  // each rank's sinks are picked for its local heads
    return absl::UnimplementedError(absl::StrCat(
        "Attention '", FullName(), "': sinks need local heads (a plan that shards the "
        "projections), got q ", q.Describe()));
  }
  DT_ASSIGN_OR_RETURN(attn.sinks, LocalSinks(q.shape()[1]));
  if (mask.defined()) {
    if (!mask.is_local()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Attention '", FullName(), "': the mask must be a local tensor, got ", mask.Describe()));
    }
    attn.mask = mask.local();
  }
  Value a;
  if (paged_step_ != nullptr) {
    // Note [Paged KV cache]: the heads' rows written where o_proj reads them, as below.
    if (!q.is_local() || !k.is_local() || !v.is_local() || b != 1 || !options_.causal ||
        mask.defined()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Attention '", FullName(), "': a paged step takes causal attention without a mask on "
          "local q, k and v [1, h, T, D], got q ", q.Describe(), ", k ", k.Describe(),
          mask.defined() ? ", a mask" : ""));
    }
    const Tensor& ql = q.local();
    DT_ASSIGN_OR_RETURN(Tensor rows, Tensor::Empty({1, s, ql.size(1), v.shape()[3]}, ql.dtype(),
                                                   ql.device()));
    DT_ASSIGN_OR_RETURN(Tensor heads, rows.Transpose(1, 2));
    DT_ASSIGN_OR_RETURN(heads, heads.Select(0, 0));
    const ops::PagedAttentionOptions paged{.causal = true,
                                           .scale = attn.scale,
                                           .softcap = attn.softcap,
                                           .window = attn.window,
                                           .sinks = attn.sinks};
    DT_RETURN_IF_ERROR(paged_.Attend(*paged_step_, ql, k.local(), v.local(), paged, heads));
    DT_ASSIGN_OR_RETURN(Tensor joined, rows.View({1, s, -1}));
    a = Value(std::move(joined));
  } else if (q.is_local() && k.is_local() && v.is_local()) {
    // The heads' rows written where o_proj reads them, [B, S, h, Dv] (a view of it as
    // [B, h, S, Dv] is the attention's output): no transposing copy.
    const Tensor& ql = q.local();
    DT_ASSIGN_OR_RETURN(Tensor rows, Tensor::Empty({b, s, ql.size(1), v.shape()[3]}, ql.dtype(),
                                                   ql.device()));
    DT_ASSIGN_OR_RETURN(Tensor heads, rows.Transpose(1, 2));
    DT_RETURN_IF_ERROR(
        ops::ScaledDotProductAttentionInto(heads, ql, k.local(), v.local(), attn));
    DT_ASSIGN_OR_RETURN(Tensor joined, rows.View({b, s, -1}));
    a = Value(std::move(joined));
  } else {
    DT_ASSIGN_OR_RETURN(a, ops::ScaledDotProductAttention(q, k, v, attn));
    DT_ASSIGN_OR_RETURN(a, ops::Transpose(a, 1, 2));
    DT_ASSIGN_OR_RETURN(a, ops::Reshape(a, {b, s, -1}));
  }
  if (gate.defined()) {
    DT_ASSIGN_OR_RETURN(Value g, ops::Sigmoid(gate));
    DT_ASSIGN_OR_RETURN(a, ops::Mul(a, g));
  }
  DT_ASSIGN_OR_RETURN(Value y, o_->CallOne({a}));
  return Values{std::move(y)};
}

absl::StatusOr<Value> Attention::Heads(const Value& y, int64_t b, int64_t s) const {
  DT_ASSIGN_OR_RETURN(Value h, ops::Reshape(y, {b, s, -1, options_.head_dim}));
  return ops::Transpose(h, 1, 2);
}

absl::StatusOr<Value> Attention::Project(const Value& y, int64_t b, int64_t s, RMSNorm* norm) {
  if (norm != nullptr && options_.qk_norm_whole) {
    DT_ASSIGN_OR_RETURN(Value n, norm->CallOne({y}));
    return Heads(PlainLocal(n), b, s);
  }
  if (norm == nullptr) return Heads(PlainLocal(y), b, s);
  // [B, S, h·D] -> [B, S, h, D], normalized over D (transformers' order), -> [B, h, S, D].
  DT_ASSIGN_OR_RETURN(Value h, ops::Reshape(PlainLocal(y), {b, s, -1, options_.head_dim}));
  DT_ASSIGN_OR_RETURN(h, norm->CallOne({h}));
  return ops::Transpose(h, 1, 2);
}

}  // namespace dt::nn
