#include "dtensor/nn/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/value_ops.h"
#include "dtensor/ops/local/ops.h"

namespace dt::nn {
namespace {

// A DTensor input as its local tensor; it must be replicated (a piece counts as its whole).
absl::StatusOr<Tensor> ReplicatedLocal(const Value& v, absl::string_view what,
                                       absl::string_view module) {
  if (!v.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(module, ": input '", what, "' is undefined"));
  }
  if (v.is_dtensor() || v.piece_of() != nullptr) {
    const DTensor& d = v.is_dtensor() ? v.dtensor() : *v.piece_of();
    for (const Placement& p : d.placements()) {
      if (!p.is_replicate()) {
        return absl::InvalidArgumentError(absl::StrCat(
            module, ": input '", what, "' must be replicated, got ", v.Describe()));
      }
    }
    return d.ToLocal();
  }
  return v.local();
}

}  // namespace

absl::StatusOr<Tensor> CombineByToken(const Tensor& rows, absl::Span<const int64_t> tokens,
                                      absl::Span<const float> weights, int64_t n) {
  const int64_t pairs = rows.dim() == 2 ? rows.size(0) : -1;
  if (pairs < 0 || static_cast<int64_t>(tokens.size()) != pairs ||
      static_cast<int64_t>(weights.size()) != pairs) {
    return absl::InvalidArgumentError(absl::StrCat("CombineByToken: rows ", rows.Describe(), ", ",
                                                   tokens.size(), " tokens, ", weights.size(),
                                                   " weights"));
  }
  const int64_t h = rows.size(1);
  if (pairs == 0) return Tensor::Zeros({n, h}, rows.dtype(), rows.device());
  // Weighted in f32, rounded to the rows' dtype, then summed per token in the rows' order.
  DT_ASSIGN_OR_RETURN(Tensor wt, Tensor::FromVector<float>(
                                     {pairs, 1}, std::vector<float>(weights.begin(), weights.end())));
  DT_ASSIGN_OR_RETURN(Tensor rf, ops::Cast(rows, DType::kF32));
  DT_ASSIGN_OR_RETURN(Tensor scaled, ops::Mul(rf, wt));
  DT_ASSIGN_OR_RETURN(scaled, ops::Cast(scaled, rows.dtype()));
  DT_ASSIGN_OR_RETURN(Tensor zero, Tensor::Zeros({1, h}, rows.dtype(), rows.device()));
  DT_ASSIGN_OR_RETURN(Tensor padded, ops::Cat({scaled, zero}, 0));
  std::vector<std::vector<int64_t>> per_token(n);
  for (int64_t q = 0; q < pairs; ++q) {
    if (tokens[q] < 0 || tokens[q] >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("CombineByToken: token ", tokens[q], " is outside [0, ", n, ")"));
    }
    per_token[tokens[q]].push_back(q);
  }
  size_t most = 1;
  for (const auto& t : per_token) most = std::max(most, t.size());
  std::vector<int64_t> gather(n * most, pairs);  // `pairs` is the zero row
  for (int64_t t = 0; t < n; ++t) {
    for (size_t j = 0; j < per_token[t].size(); ++j) gather[t * most + j] = per_token[t][j];
  }
  DT_ASSIGN_OR_RETURN(Tensor index,
                      Tensor::FromVector<int64_t>({n, static_cast<int64_t>(most)}, gather));
  DT_ASSIGN_OR_RETURN(Tensor picked, ops::Embedding(padded, index));  // [N, most, H]
  return ops::Sum(picked, 1);
}

// ---- router ---------------------------------------------------------------------------------------

TopKRouter::TopKRouter(const RouterOptions& o) : Module("TopKRouter"), options_(o) {
  RegisterParameter("weight", {o.num_experts, o.hidden_size},
                    o.f32_logits ? DType::kF32 : o.dtype);
  if (o.bias) RegisterParameter("bias", {o.num_experts}, o.f32_logits ? DType::kF32 : o.dtype);
  if (o.scoring == RouterScoring::kSigmoid) {
    RegisterParameter("e_score_correction_bias", {o.num_experts}, DType::kF32);
  }
}

std::string TopKRouter::GroupMisfit() const {
  const RouterOptions& o = options_;
  if (o.scoring != RouterScoring::kSigmoid ||
      SigmoidGroupsFit(o.num_experts, o.num_groups, o.topk_groups, o.top_k)) {
    return "";
  }
  return absl::StrCat(o.num_experts, " experts in ", o.num_groups, " groups (", o.topk_groups,
                      " eligible) cannot give top ", o.top_k, " (groups must divide the experts, "
                      "hold 2 or more each, and the eligible ones at least top_k)");
}

absl::Status TopKRouter::ValidateTensorParallel(const TPValidationContext& ctx) const {
  const std::string misfit = GroupMisfit();
  if (misfit.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("TopKRouter '", ctx.module_name(), "': ", misfit));
}

std::string TopKRouter::ExtraRepr() const {
  return absl::StrCat("experts=", options_.num_experts, ", top_k=", options_.top_k,
                      options_.bias ? ", bias" : "", options_.normalize ? ", normalized" : "",
                      options_.scaling != 1.0 ? absl::StrCat(", scaling=", options_.scaling) : "",
                      options_.f32_logits ? ", f32" : "",
                      options_.scoring == RouterScoring::kSigmoid
                          ? absl::StrCat(", sigmoid, groups=", options_.topk_groups, "/",
                                         options_.num_groups)
                          : "");
}

namespace {

// Note [Sigmoid group routing]: the top-k ids and weights of each row of `logits` [N, E] (f32).
absl::StatusOr<std::pair<Tensor, Tensor>> SigmoidGroupTopK(const Tensor& logits,
                                                           const Tensor& bias,
                                                           const RouterOptions& o) {
  const int64_t n = logits.size(0), e = o.num_experts, k = o.top_k;
  const int64_t groups = o.num_groups, per = e / groups;
  const std::vector<float> z = logits.ToVector<float>(), b = bias.ToVector<float>();
  std::vector<float> weights(n * k);
  std::vector<int64_t> ids(n * k);
  std::vector<float> s(e), choice(e), group_score(groups);
  std::vector<int64_t> order(std::max(e, groups));
  std::vector<char> eligible(e);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < e; ++j) {
      s[j] = 1.0f / (1.0f + std::exp(-z[t * e + j]));
      choice[j] = s[j] + b[j];
    }
    for (int64_t g = 0; g < groups; ++g) {  // the sum of each group's two best
      float best = -INFINITY, second = -INFINITY;
      for (int64_t j = g * per; j < (g + 1) * per; ++j) {
        if (choice[j] > best) {
          second = best;
          best = choice[j];
        } else if (choice[j] > second) {
          second = choice[j];
        }
      }
      group_score[g] = best + second;
    }
    auto by = [](const std::vector<float>& v) {
      return [&v](int64_t a, int64_t c) { return v[a] > v[c] || (v[a] == v[c] && a < c); };
    };
    std::iota(order.begin(), order.begin() + groups, 0);
    std::partial_sort(order.begin(), order.begin() + o.topk_groups, order.begin() + groups,
                      by(group_score));
    std::fill(eligible.begin(), eligible.end(), 0);
    for (int64_t g = 0; g < o.topk_groups; ++g) {
      std::fill(eligible.begin() + order[g] * per, eligible.begin() + (order[g] + 1) * per, 1);
    }
    int64_t m = 0;
    for (int64_t j = 0; j < e; ++j) {
      if (eligible[j]) order[m++] = j;
    }
    std::partial_sort(order.begin(), order.begin() + k, order.begin() + m, by(choice));
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += s[order[j]];
    const float scale = static_cast<float>(o.scaling) / (o.normalize ? sum + 1e-20f : 1.0f);
    for (int64_t j = 0; j < k; ++j) {
      ids[t * k + j] = order[j];
      weights[t * k + j] = s[order[j]] * scale;
    }
  }
  DT_ASSIGN_OR_RETURN(Tensor w, Tensor::FromVector<float>({n, k}, weights));
  DT_ASSIGN_OR_RETURN(Tensor i, Tensor::FromVector<int64_t>({n, k}, ids));
  DT_ASSIGN_OR_RETURN(w, w.To(logits.device()));
  DT_ASSIGN_OR_RETURN(i, i.To(logits.device()));
  return std::make_pair(std::move(w), std::move(i));
}

}  // namespace

absl::StatusOr<Values> TopKRouter::Forward(Values inputs) {
  const std::string name = absl::StrCat("TopKRouter '", FullName(), "'");
  // Before any work: a router placed without a plan was not checked by ValidateTensorParallel.
  if (const std::string misfit = GroupMisfit(); !misfit.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(name, ": ", misfit));
  }
  DT_ASSIGN_OR_RETURN(Value xv, SingleInput(*this, inputs));
  DT_ASSIGN_OR_RETURN(Tensor x, ReplicatedLocal(xv, "x", name));
  const RouterOptions& o = options_;
  if (x.dim() != 2 || x.size(1) != o.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": expected x [N, ", o.hidden_size,
                                                   "], got ", x.Describe()));
  }
  DT_ASSIGN_OR_RETURN(Tensor w, LocalParam("weight"));
  if (w.dim() != 2 || w.size(0) != o.num_experts) {
    return absl::FailedPreconditionError(absl::StrCat(
        name, ": its weight must be whole on every rank (the router is replicated), got ",
        FindParameter("weight")->Describe()));
  }
  Tensor logits, b;
  if (o.bias) {
    DT_ASSIGN_OR_RETURN(b, LocalParam("bias"));
  }
  if (o.f32_logits) {
    DT_ASSIGN_OR_RETURN(Tensor xf, ops::Cast(x, DType::kF32));
    DT_ASSIGN_OR_RETURN(Tensor wf, ops::Cast(w, DType::kF32));
    if (b.defined()) {
      DT_ASSIGN_OR_RETURN(b, ops::Cast(b, DType::kF32));
    }
    DT_ASSIGN_OR_RETURN(logits, ops::Linear(xf, wf, b));
  } else {
    DT_ASSIGN_OR_RETURN(logits, ops::Linear(x, w, b));
    DT_ASSIGN_OR_RETURN(logits, ops::Cast(logits, DType::kF32));
  }
  if (o.scoring == RouterScoring::kSigmoid) {
    DT_ASSIGN_OR_RETURN(Tensor bias, LocalParam("e_score_correction_bias"));
    DT_ASSIGN_OR_RETURN(auto top, SigmoidGroupTopK(logits, bias, o));
    Tensor weights = std::move(top.first);
    if (o.weights_in_input_dtype) {
      DT_ASSIGN_OR_RETURN(weights, ops::Cast(weights, x.dtype()));
    }
    return Values{Value(std::move(weights)), Value(std::move(top.second))};
  }
  DT_ASSIGN_OR_RETURN(Tensor probs, ops::Softmax(logits, -1));
  DT_ASSIGN_OR_RETURN(ops::TopKResult top, ops::TopK(probs, o.top_k, -1));
  Tensor weights = top.values;
  if (o.normalize) {
    DT_ASSIGN_OR_RETURN(Tensor sum, ops::Sum(weights, -1, /*keepdim=*/true));
    DT_ASSIGN_OR_RETURN(weights, ops::Div(weights, sum));
  }
  if (o.scaling != 1.0) {
    DT_ASSIGN_OR_RETURN(weights, ops::Mul(weights, o.scaling));
  }
  if (o.weights_in_input_dtype) {
    DT_ASSIGN_OR_RETURN(weights, ops::Cast(weights, x.dtype()));
  }
  return Values{Value(std::move(weights)), Value(std::move(top.indices))};
}

// ---- experts --------------------------------------------------------------------------------------

absl::StatusOr<Values> IdentityExpert::Forward(Values inputs) {
  DT_ASSIGN_OR_RETURN(Value x, SingleInput(*this, inputs));
  return Values{std::move(x)};
}

Experts::Experts(const ExpertsOptions& o) : Module("Experts"), options_(o) {
  const int64_t e = o.num_experts, h = o.hidden_size, i = o.intermediate_size;
  if (o.layout == ExpertsLayout::kInterleavedColumns) {  // Note [gpt-oss experts]
    RegisterParameter("gate_up_proj", {e, h, 2 * i}, o.dtype);
    RegisterParameter("gate_up_proj_bias", {e, 2 * i}, o.dtype);
    RegisterParameter("down_proj", {e, i, h}, o.dtype);
    RegisterParameter("down_proj_bias", {e, h}, o.dtype);
  } else {
    RegisterParameter("gate_up_proj", {e, 2 * i, h}, o.dtype);
    RegisterParameter("down_proj", {e, h, i}, o.dtype);
  }
  if (o.num_identity_experts > 0) identity_ = &AddModule<IdentityExpert>("identity");
}

std::string Experts::ExtraRepr() const {
  return absl::StrCat("experts=", options_.num_experts, ", hidden=", options_.hidden_size,
                      ", intermediate=", options_.intermediate_size,
                      options_.num_identity_experts > 0
                          ? absl::StrCat(", identity_experts=", options_.num_identity_experts)
                          : "",
                      options_.activation == Activation::kSilu
                          ? ""
                          : absl::StrCat(", ", ActivationName(options_.activation)),
                      options_.layout == ExpertsLayout::kInterleavedColumns
                          ? ", interleaved columns, biases"
                          : "",
                      options_.swiglu_limit > 0
                          ? absl::StrCat(", clamped swiglu (limit=", options_.swiglu_limit,
                                         ", alpha=", options_.swiglu_alpha, ")")
                          : "");
}

std::vector<int64_t> Experts::PackedBlocks(const Parameter& param, bool col) const {
  if (!col || param.name() != "gate_up_proj" ||
      options_.layout != ExpertsLayout::kGateUpRows) {
    return {};
  }
  return {options_.intermediate_size, options_.intermediate_size};
}

absl::Status Experts::ValidateTensorParallel(const TPValidationContext& ctx) const {
  const std::vector<std::string> projections = {"gate_up_proj", "down_proj"};
  DT_RETURN_IF_ERROR(CheckIntermediate(*this, ctx, projections, options_.intermediate_size));
  if (options_.layout != ExpertsLayout::kInterleavedColumns) return absl::OkStatus();
  // Note [gpt-oss experts]: the intermediate dim of each, or the experts (dim 0, ep); the down
  // bias whole or with the experts.
  const std::pair<const char*, int> splits[] = {
      {"gate_up_proj", 2}, {"gate_up_proj_bias", 1}, {"down_proj", 1}, {"down_proj_bias", -1}};
  for (const auto& [name, dim] : splits) {
    const Placement p = ctx.PlannedPlacement(name);
    if (!p.is_any_shard() || p.dim() == 0 || p.dim() == dim) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "Experts '", ctx.module_name(), "': ", name, " is planned ", p.ToString(), " but its ",
        dim < 0 ? "only split is by experts (dim 0)"
                : absl::StrCat("intermediate dim is ", dim, " (or experts, dim 0)"),
        ": gpt-oss's experts are stored [E, H, 2I] (x · W), so gate_up_proj is rowwise and "
        "down_proj colwise"));
  }
  return absl::OkStatus();
}

namespace {

// ClampedSwiGLU's loop over n values of one float type T.
template <typename T>
void ClampedSwiGLUValues(const T* gate, const T* up, T* out, int64_t n, float limit, float alpha) {
  auto round = [](float v) { return static_cast<float>(T(v)); };
  for (int64_t j = 0; j < n; ++j) {
    const float g = std::min(static_cast<float>(gate[j]), limit);
    const float u = std::clamp(static_cast<float>(up[j]), -limit, limit);
    const float s = round(1.0f / (1.0f + std::exp(-round(g * alpha))));
    out[j] = T(round(u + 1.0f) * round(g * s));
  }
}

// Note [gpt-oss experts]: (clamp(up) + 1) · g · sigmoid(alpha · g), g = min(gate, limit), from
// gate and up [c, I] (any layout), each step rounded to their dtype as transformers' ops round.
// On the host (CPU tensors only): dtensor has no clamp op yet.
absl::StatusOr<Tensor> ClampedSwiGLU(const Tensor& gate, const Tensor& up, double limit,
                                     double alpha) {
  if (!gate.device().is_cpu()) {
    return absl::UnimplementedError(absl::StrCat(
        "ClampedSwiGLU (gpt-oss's experts) runs on CPU tensors only, got ", gate.Describe()));
  }
  DT_ASSIGN_OR_RETURN(Tensor g, gate.Contiguous());
  DT_ASSIGN_OR_RETURN(Tensor u, up.Contiguous());
  if (!IsFloating(g.dtype()) || g.shape() != u.shape() || g.dtype() != u.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat("ClampedSwiGLU: gate ", g.Describe(),
                                                   " and up ", u.Describe()));
  }
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(g.shape(), g.dtype(), g.device()));
  const int64_t n = g.numel();
  const float lim = static_cast<float>(limit), a = static_cast<float>(alpha);
  if (g.dtype() == DType::kBF16) {
    ClampedSwiGLUValues(g.data<BFloat16>(), u.data<BFloat16>(), out.data<BFloat16>(), n, lim, a);
  } else if (g.dtype() == DType::kF16) {
    ClampedSwiGLUValues(g.data<Float16>(), u.data<Float16>(), out.data<Float16>(), n, lim, a);
  } else {
    ClampedSwiGLUValues(g.data<float>(), u.data<float>(), out.data<float>(), n, lim, a);
  }
  return out;
}

}  // namespace

absl::StatusOr<bool> Experts::AddsDownBias() const {
  const Parameter* down = FindParameter("down_proj");
  if (down == nullptr || !down->placed()) return true;
  const DTensorSpec& spec = down->spec();
  for (int d = 0; d < spec.mesh().ndim(); ++d) {
    if (spec.placements()[d].is_any_shard(1)) {
      DT_ASSIGN_OR_RETURN(const int local, spec.mesh().LocalRank(d));
      return local == 0;
    }
  }
  return true;
}

absl::StatusOr<Tensor> Experts::RunExpert(const Tensor& xe, int64_t e, const Tensor& gate_up,
                                          const Tensor& down) {
  const bool interleaved = options_.layout == ExpertsLayout::kInterleavedColumns;
  DT_ASSIGN_OR_RETURN(Tensor w_gu, gate_up.Select(0, e));
  Tensor gate, up;
  if (interleaved) {  // x · W + b, then the columns g0 u0 g1 u1 ... as two strided views
    DT_ASSIGN_OR_RETURN(Tensor gu, ops::Matmul(xe, w_gu));
    DT_ASSIGN_OR_RETURN(Tensor b_all, LocalParam("gate_up_proj_bias"));
    DT_ASSIGN_OR_RETURN(Tensor b, b_all.Select(0, e));
    DT_ASSIGN_OR_RETURN(gu, ops::Add(gu, b));
    DT_ASSIGN_OR_RETURN(Tensor pairs, gu.Reshape({gu.size(0), gu.size(1) / 2, 2}));
    DT_ASSIGN_OR_RETURN(gate, pairs.Select(2, 0));
    DT_ASSIGN_OR_RETURN(up, pairs.Select(2, 1));
  } else {
    DT_ASSIGN_OR_RETURN(Tensor gu, ops::Linear(xe, w_gu));
    DT_ASSIGN_OR_RETURN(std::vector<Tensor> halves, ops::Chunk(gu, 2, -1));
    gate = halves[0];
    up = halves[1];
  }
  Tensor hidden;
  if (options_.swiglu_limit > 0) {
    DT_ASSIGN_OR_RETURN(hidden,
                        ClampedSwiGLU(gate, up, options_.swiglu_limit, options_.swiglu_alpha));
  } else {
    DT_ASSIGN_OR_RETURN(Value act, Activate(Value(gate), options_.activation));
    DT_ASSIGN_OR_RETURN(hidden, ops::Mul(act.local(), up));
  }
  DT_ASSIGN_OR_RETURN(Tensor w_down, down.Select(0, e));
  if (!interleaved) return ops::Linear(hidden, w_down);
  DT_ASSIGN_OR_RETURN(Tensor y, ops::Matmul(hidden, w_down));
  DT_ASSIGN_OR_RETURN(const bool adds_bias, AddsDownBias());
  if (!adds_bias) return y;
  DT_ASSIGN_OR_RETURN(Tensor b_all, LocalParam("down_proj_bias"));
  DT_ASSIGN_OR_RETURN(Tensor b, b_all.Select(0, e));
  return ops::Add(y, b);
}

// Note [Grouped experts]
// transformers' reference loops over the experts that received a token and gathers their rows;
// here the (token, slot) pairs are sorted by expert once (on the host: N·k small integers), the
// rows gathered in that order into one buffer, and each expert with pairs runs two GEMMs over its
// contiguous run of rows (gate|up, then down), writing its run of one output buffer. Experts no
// token picked cost nothing — in decode that is all but k of them, which is what makes a sparse
// model cheap. The routing weights are applied to the sorted rows (in f32, as transformers
// multiplies its f32 weights), and each token's rows are summed in ascending expert order, the
// order of transformers' index_add_, so f32 results match it to the last bits for k = 2.
absl::StatusOr<Values> Experts::Forward(Values inputs) {
  const std::string name = absl::StrCat("Experts '", FullName(), "'");
  if (inputs.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " takes {x [N, H], ids [N, k], weights [N, k]}, got ", inputs.size(), " inputs"));
  }
  if (!local_mode_requested()) {
    for (const auto& p : parameters()) {
      if (p->placed() && p->spec().NumShards() > 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            name, ": parameter '", p->name(), "' is sharded (", p->Describe(),
            ") but the forward is not in local mode; plan the module as 'moe_tp_experts' (tensor "
            "parallel) or 'ep_dispatch_experts' (expert parallel)"));
      }
    }
  }
  DT_ASSIGN_OR_RETURN(const Tensor x, ReplicatedLocal(inputs[0], "x", name));
  DT_ASSIGN_OR_RETURN(Tensor ids_t, ReplicatedLocal(inputs[1], "ids", name));
  DT_ASSIGN_OR_RETURN(const Tensor weights, ReplicatedLocal(inputs[2], "weights", name));
  if (x.dim() != 2 || x.size(1) != options_.hidden_size || ids_t.dim() != 2 ||
      ids_t.size(0) != x.size(0) || weights.shape() != ids_t.shape() ||
      (ids_t.dtype() != DType::kI64 && ids_t.dtype() != DType::kI32) ||
      !IsFloating(weights.dtype())) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": expected x [N, ", options_.hidden_size,
                     "], ids i64 [N, k] and float weights [N, k], got ", x.Describe(), ", ",
                     ids_t.Describe(), " and ", weights.Describe()));
  }
  DT_ASSIGN_OR_RETURN(ids_t, ops::Cast(ids_t, DType::kI64));
  // [E_here, 2I/tp, H] and [E_here, H, I/tp] (kInterleavedColumns: [E_here, H, 2I/tp] and
  // [E_here, I/tp, H])
  DT_ASSIGN_OR_RETURN(Tensor gate_up, LocalParam("gate_up_proj"));
  DT_ASSIGN_OR_RETURN(Tensor down, LocalParam("down_proj"));
  const int64_t n = x.size(0), k = ids_t.size(1), h = options_.hidden_size;
  const int64_t experts = gate_up.size(0), identity = options_.num_identity_experts;
  const std::vector<int64_t> ids = ids_t.ToVector<int64_t>();
  DT_ASSIGN_OR_RETURN(Tensor wf, ops::Cast(weights, DType::kF32));
  const std::vector<float> w = wf.ToVector<float>();

  // Pairs bucketed by expert, stable in (token, slot) order; identity experts' weights per token.
  std::vector<std::vector<int64_t>> bucket(experts);
  std::vector<float> identity_weight(identity > 0 ? n : 0, 0.0f);
  for (int64_t p = 0; p < n * k; ++p) {
    const int64_t e = ids[p];
    if (e >= 0 && e < experts) {
      bucket[e].push_back(p);
    } else if (identity > 0 && e >= experts && e < experts + identity) {
      identity_weight[p / k] += w[p];
    } else if (!(identity == 0 && e == experts)) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": expert id ", e, " (token ", p / k, ") is outside [0, ", experts + identity,
          ")", identity == 0 ? absl::StrCat(" and is not the skip id ", experts) : ""));
    }
  }
  std::vector<int64_t> order, tokens;
  for (const auto& b : bucket) {
    for (int64_t p : b) {
      order.push_back(p);
      tokens.push_back(p / k);
    }
  }
  const int64_t pairs = static_cast<int64_t>(order.size());
  DT_ASSIGN_OR_RETURN(Tensor y, Tensor::Zeros({n, h}, x.dtype(), x.device()));
  if (pairs > 0) {
    DT_ASSIGN_OR_RETURN(Tensor token_ids, Tensor::FromVector<int64_t>({pairs}, tokens));
    DT_ASSIGN_OR_RETURN(Tensor rows, ops::Embedding(x, token_ids));  // [P, H], sorted by expert
    DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty({pairs, h}, x.dtype(), x.device()));
    int64_t at = 0;
    for (int64_t e = 0; e < experts; ++e) {
      const int64_t c = static_cast<int64_t>(bucket[e].size());
      if (c == 0) continue;
      DT_ASSIGN_OR_RETURN(Tensor xe, rows.Narrow(0, at, c));
      DT_ASSIGN_OR_RETURN(Tensor ye, RunExpert(xe, e, gate_up, down));
      DT_ASSIGN_OR_RETURN(Tensor slot, out.Narrow(0, at, c));
      DT_RETURN_IF_ERROR(slot.CopyFrom(ye));
      at += c;
    }
    std::vector<float> sorted_w(pairs);
    for (int64_t q = 0; q < pairs; ++q) sorted_w[q] = w[order[q]];
    DT_ASSIGN_OR_RETURN(y, CombineByToken(out, tokens, sorted_w, n));
  }
  if (identity > 0) {
    DT_ASSIGN_OR_RETURN(Value id, identity_->CallOne({Value(x)}));
    DT_ASSIGN_OR_RETURN(Tensor idf, ops::Cast(id.local(), DType::kF32));
    DT_ASSIGN_OR_RETURN(Tensor iw, Tensor::FromVector<float>({n, 1}, identity_weight));
    DT_ASSIGN_OR_RETURN(Tensor contribution, ops::Mul(idf, iw));
    DT_ASSIGN_OR_RETURN(contribution, ops::Cast(contribution, x.dtype()));
    DT_ASSIGN_OR_RETURN(y, ops::Add(y, contribution));
  }
  return Values{Value(std::move(y))};
}

// ---- block ----------------------------------------------------------------------------------------

MoeBlock::MoeBlock(const MoeBlockOptions& o) : Module("MoeBlock"), options_(o) {
  gate_ = &AddModule<TopKRouter>(o.router_name, o.router);
  experts_ = &AddModule<Experts>("experts", o.experts);
  if (o.shared_intermediate_size > 0) {
    SwiGLUOptions s;
    s.hidden_size = o.experts.hidden_size;
    s.intermediate_size = o.shared_intermediate_size;
    s.bias = o.shared_bias;
    s.activation = o.experts.activation;
    s.dtype = o.experts.dtype;
    shared_experts_ = &AddModule<SwiGLUMLP>("shared_experts", s);
  }
}

absl::StatusOr<Values> MoeBlock::Forward(Values inputs) {
  DT_ASSIGN_OR_RETURN(Value hv, SingleInput(*this, inputs));
  DT_ASSIGN_OR_RETURN(Tensor h, WholeTensor(hv));
  if (h.dim() != 3 || h.size(2) != options_.experts.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat("MoeBlock '", FullName(), "': expected h [B, S, ",
                                                   options_.experts.hidden_size, "], got ",
                                                   h.Describe()));
  }
  DT_ASSIGN_OR_RETURN(Tensor x, h.Reshape({-1, h.size(2)}));
  DT_ASSIGN_OR_RETURN(Values routing, gate_->Call({Value(x)}));
  if (routing.size() != 2) {
    return absl::InternalError(absl::StrCat("MoeBlock '", FullName(), "': the router gave ",
                                            routing.size(), " outputs, not {weights, ids}"));
  }
  DT_ASSIGN_OR_RETURN(Value ev, experts_->CallOne({Value(x), routing[1], routing[0]}));
  DT_ASSIGN_OR_RETURN(Tensor y, WholeTensor(ev));
  DT_ASSIGN_OR_RETURN(y, y.Reshape(h.shape()));
  if (shared_experts_ != nullptr) {
    DT_ASSIGN_OR_RETURN(Value sv, shared_experts_->CallOne({Value(h)}));
    DT_ASSIGN_OR_RETURN(Tensor s, WholeTensor(sv));
    DT_ASSIGN_OR_RETURN(y, ops::Add(y, s));
  }
  return Values{Value(std::move(y))};
}

}  // namespace dt::nn
