// The building blocks for new models (MLP with any activation, the grouped Experts of a MoE block,
// Attention with a fused QKV and its own child names, LearnedPositionEmbedding) against references computed by hand in double
// from the gathered weights, tensor-parallel on 1-4 thread ranks; and CheckParallel, which must
// pass a right plan and catch a wrong one.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "rapidcheck.h"
#include "rapidcheck/gtest.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/nn.h"
#include "dtensor/tests/nn/plan_util.h"
#include "dtensor/tests/test_util.h"

namespace dt::nn {
namespace {

using dt::testing::Contains;
using testing::Quiet;
using Vec = std::vector<double>;

absl::StatusOr<DeviceMesh> TpMesh(World& w) {
  return InitDeviceMesh(w.shared_from_this(), {w.size()}, {"tp"});
}

// name -> full weight (gathered), as doubles.
absl::StatusOr<std::vector<std::pair<std::string, Vec>>> Weights(Module& m) {
  DT_ASSIGN_OR_RETURN(auto params, GatherParameters(m));
  std::vector<std::pair<std::string, Vec>> out;
  for (auto& [name, t] : params) out.emplace_back(name, t.ToDoubles());
  return out;
}
const Vec& W(const std::vector<std::pair<std::string, Vec>>& ws, const std::string& name) {
  for (const auto& [n, v] : ws) {
    if (n == name) return v;
  }
  static const Vec empty;
  ADD_FAILURE() << "no parameter " << name;
  return empty;
}

// y [n, out] = x [n, in] · w [out, in]ᵀ + b (b may be empty).
Vec LinearRef(const Vec& x, int64_t n, int64_t in, const Vec& w, int64_t out, const Vec& b,
              int64_t row0 = 0) {
  Vec y(n * out, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[row0 + o];
      for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[(row0 + o) * in + i];
      y[r * out + o] = s;
    }
  }
  return y;
}

double ActRef(Activation a, double v) {
  switch (a) {
    case Activation::kGeluTanh:
      return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    case Activation::kGelu: return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    case Activation::kSilu: return v / (1 + std::exp(-v));
    case Activation::kRelu: return v > 0 ? v : 0;
  }
  return 0;
}

::testing::AssertionResult Near(const Tensor& got, const Vec& want, double tol = 1e-4) {
  const Vec g = got.ToDoubles();
  if (g.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << g.size() << " vs " << want.size();
  }
  for (size_t i = 0; i < g.size(); ++i) {
    if (!(std::fabs(g[i] - want[i]) <= tol * (1 + std::fabs(want[i])))) {
      return ::testing::AssertionFailure() << "element " << i << ": " << g[i] << " vs " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// ---- MLP ------------------------------------------------------------------------------------------

RC_GTEST_PROP(MLPBlock, MatchesHandComputedReference, ()) {
  const int tp = *rc::gen::inRange(1, 5);
  MLPOptions o;
  o.hidden_size = *rc::gen::inRange(1, 7);
  o.intermediate_size = tp * *rc::gen::inRange(1, 4);
  o.activation = *rc::gen::element(Activation::kGeluTanh, Activation::kGelu, Activation::kSilu,
                                   Activation::kRelu);
  o.bias = *rc::gen::arbitrary<bool>();
  if (*rc::gen::arbitrary<bool>()) {
    o.up_name = "c_fc";
    o.down_name = "c_proj";
  }
  const int64_t n = *rc::gen::inRange(1, 5);
  const Tensor x = Tensor::Randn({n, o.hidden_size}, *rc::gen::inRange(0, 1000)).value();
  const absl::Status s = World::RunThreads(tp, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, TpMesh(w));
    MLP m(o);
    DT_RETURN_IF_ERROR(
        ParallelizeModule(m, mesh, {{o.up_name, "colwise"}, {o.down_name, "rowwise"}}, Quiet()));
    DT_RETURN_IF_ERROR(InitRandom(m, 3));
    DT_ASSIGN_OR_RETURN(Value y, m.CallOne({x}));
    DT_ASSIGN_OR_RETURN(auto ws, Weights(m));
    const int64_t h = o.hidden_size, i = o.intermediate_size;
    const std::string up = o.up_name, down = o.down_name;
    Vec a = LinearRef(x.ToDoubles(), n, h, W(ws, up + ".weight"), i,
                      o.bias ? W(ws, up + ".bias") : Vec());
    for (double& v : a) v = ActRef(o.activation, v);
    const Vec want =
        LinearRef(a, n, i, W(ws, down + ".weight"), h, o.bias ? W(ws, down + ".bias") : Vec());
    EXPECT_TRUE(Near(y.local(), want)) << ActivationName(o.activation) << " tp " << tp;
    return absl::OkStatus();
  });
  RC_ASSERT(s.ok());
}

TEST(MLPBlock, ActivationNamesFromConfigs) {
  EXPECT_EQ(ParseActivation("gelu_new").value(), Activation::kGeluTanh);
  EXPECT_EQ(ParseActivation("gelu_pytorch_tanh").value(), Activation::kGeluTanh);
  EXPECT_EQ(ParseActivation("gelu").value(), Activation::kGelu);
  EXPECT_EQ(ParseActivation("swish").value(), Activation::kSilu);
  EXPECT_EQ(ParseActivation("relu").value(), Activation::kRelu);
  EXPECT_TRUE(Contains(ParseActivation("tanh").status(),
                       "activation 'tanh' is not supported; use one of gelu_new"));
}

// ---- Experts --------------------------------------------------------------------------------------

using Weighted = std::vector<std::pair<std::string, Vec>>;

// A routing of n tokens to k experts each: ids [n, k] and their weights.
struct Routing {
  int64_t n, k;
  std::vector<int64_t> ids;
  Vec weights;
};

// 1-5 experts of random small shapes whose intermediate size tp divides.
ExpertsOptions SmallExperts(int tp) {
  ExpertsOptions o;
  o.num_experts = *rc::gen::inRange(1, 6);
  o.hidden_size = *rc::gen::inRange(1, 7);
  o.intermediate_size = tp * *rc::gen::inRange(1, 3);
  return o;
}

// Experts(o) under `plan` on tp thread ranks, randomly initialized, against `want(the module's
// weights, x, routing)` on every rank, for a random x and a routing of up to 5 tokens to 1-3 of
// the ids [0, id_end).
void CheckExperts(int tp, const ExpertsOptions& o, const ParallelPlan& plan, int64_t id_end,
                  const std::function<Vec(const Weighted&, const Vec&, const Routing&)>& want) {
  const int64_t n = *rc::gen::inRange(0, 6), k = *rc::gen::inRange(1, 4);
  const std::vector<int64_t> ids =
      *rc::gen::container<std::vector<int64_t>>(n * k, rc::gen::inRange<int64_t>(0, id_end));
  const int seed = *rc::gen::inRange(0, 1000);
  const Tensor x = Tensor::Randn({n, o.hidden_size}, seed).value();
  const Tensor weights = Tensor::Rand({n, k}, seed + 1).value();
  const absl::Status s = World::RunThreads(tp, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, TpMesh(w));
    Experts m(o);
    DT_RETURN_IF_ERROR(ParallelizeModule(m, mesh, plan, Quiet()));
    DT_RETURN_IF_ERROR(InitRandom(m, 5));
    DT_ASSIGN_OR_RETURN(Tensor id_t, Tensor::FromVector<int64_t>({n, k}, ids));
    DT_ASSIGN_OR_RETURN(Value y, m.CallOne({x, id_t, weights}));
    DT_ASSIGN_OR_RETURN(const Weighted ws, Weights(m));
    EXPECT_TRUE(Near(y.local(), want(ws, x.ToDoubles(), {n, k, ids, weights.ToDoubles()})))
        << "rank " << w.rank() << " of " << tp;
    return absl::OkStatus();
  });
  RC_ASSERT(s.ok());
}

// The grouped experts (Note [Grouped experts]) at tp 1-4 against a token-by-token reference:
// y[n] = Σ_j w[n, j] · down_e(silu(gate_e x) * up_e x) for e = ids[n, j] < E, + w · x for identity
// experts, nothing for the skip id E; zero tokens and experts nobody picks included.
RC_GTEST_PROP(ExpertsBlock, GroupedMatchesTokenByTokenReference, ()) {
  const int tp = *rc::gen::inRange(1, 5);
  ExpertsOptions o = SmallExperts(tp);
  o.num_identity_experts = *rc::gen::inRange(0, 2);
  // Ids in [0, E + E_id]: the last one is the skip id without identity experts.
  const int64_t top = o.num_experts + o.num_identity_experts + (o.num_identity_experts == 0);
  ParallelPlan plan = {{"gate_up_proj", "packed_colwise"}, {"down_proj", "rowwise"}, {"", "moe_tp_experts"}};
  if (o.num_identity_experts > 0) plan.emplace_back("identity", "moe_identity_expert");
  CheckExperts(tp, o, plan, top, [&](const Weighted& ws, const Vec& xs, const Routing& r) {
    const int64_t h = o.hidden_size, i = o.intermediate_size;
    const Vec& gu = W(ws, "gate_up_proj");
    const Vec& dn = W(ws, "down_proj");
    Vec want(r.n * h, 0.0);
    for (int64_t t = 0; t < r.n; ++t) {
      const Vec row(xs.begin() + t * h, xs.begin() + (t + 1) * h);
      for (int64_t j = 0; j < r.k; ++j) {
        const int64_t e = r.ids[t * r.k + j];
        const double wt = r.weights[t * r.k + j];
        if (e >= o.num_experts) {  // identity expert, or the skip id
          if (o.num_identity_experts > 0) {
            for (int64_t c = 0; c < h; ++c) want[t * h + c] += wt * row[c];
          }
          continue;
        }
        const Vec g = LinearRef(row, 1, h, Vec(gu.begin() + e * 2 * i * h, gu.end()), i, Vec());
        const Vec u =
            LinearRef(row, 1, h, Vec(gu.begin() + (e * 2 * i + i) * h, gu.end()), i, Vec());
        Vec act(i);
        for (int64_t c = 0; c < i; ++c) act[c] = ActRef(Activation::kSilu, g[c]) * u[c];
        const Vec out = LinearRef(act, 1, i, Vec(dn.begin() + e * h * i, dn.end()), h, Vec());
        for (int64_t c = 0; c < h; ++c) want[t * h + c] += wt * out[c];
      }
    }
    return want;
  });
}

// gpt-oss's experts (Note [gpt-oss experts] in nn/moe.h) at tp 1-4 against a token-by-token
// reference in doubles: gate_up = x · W_e + b_e [2I] with gate_j = gate_up[2j], up_j =
// gate_up[2j + 1]; (clamp(up, ±limit) + 1) · g · sigmoid(alpha · g), g = min(gate, limit); then
// · D_e + d_e, weighted and summed over the token's experts (the skip id E adds nothing). Under tp
// the columns are split in whole pairs and down_proj_bias is added once.
RC_GTEST_PROP(ExpertsBlock, GptOssLayoutMatchesTokenByTokenReference, ()) {
  const int tp = *rc::gen::inRange(1, 5);
  ExpertsOptions o = SmallExperts(tp);
  o.layout = ExpertsLayout::kInterleavedColumns;
  o.swiglu_limit = *rc::gen::inRange(1, 20) / 10.0;
  o.swiglu_alpha = 1.702;
  const ParallelPlan plan = {{"gate_up_proj", "rowwise"},
                             {"gate_up_proj_bias", "rowwise"},
                             {"down_proj", "colwise"},
                             {"", "moe_tp_experts"}};
  CheckExperts(tp, o, plan, o.num_experts + 1, [&](const Weighted& ws, const Vec& xs, const Routing& r) {
    const int64_t h = o.hidden_size, i = o.intermediate_size;
    const double limit = o.swiglu_limit, alpha = o.swiglu_alpha;
    const Vec &gu = W(ws, "gate_up_proj"), &gb = W(ws, "gate_up_proj_bias");
    const Vec &dn = W(ws, "down_proj"), &db = W(ws, "down_proj_bias");
    Vec want(r.n * h, 0.0);
    for (int64_t t = 0; t < r.n; ++t) {
      for (int64_t j = 0; j < r.k; ++j) {
        const int64_t e = r.ids[t * r.k + j];
        if (e == o.num_experts) continue;  // the skip id
        Vec hidden(i);
        for (int64_t p = 0; p < i; ++p) {
          double gate = gb[e * 2 * i + 2 * p], up = gb[e * 2 * i + 2 * p + 1];
          for (int64_t c = 0; c < h; ++c) {
            gate += xs[t * h + c] * gu[(e * h + c) * 2 * i + 2 * p];
            up += xs[t * h + c] * gu[(e * h + c) * 2 * i + 2 * p + 1];
          }
          gate = std::min(gate, limit);
          up = std::clamp(up, -limit, limit);
          hidden[p] = (up + 1) * gate / (1 + std::exp(-alpha * gate));
        }
        for (int64_t c = 0; c < h; ++c) {
          double out = db[e * h + c];
          for (int64_t p = 0; p < i; ++p) out += hidden[p] * dn[(e * i + p) * h + c];
          want[t * h + c] += r.weights[t * r.k + j] * out;
        }
      }
    }
    return want;
  });
}

// ---- Attention --------------------------------------------------------------------------------

// Multi-head attention computed by hand: x [B, S, H], heads nH (nKV for k, v), head dim D.
Vec AttentionRef(const Vec& x, int64_t b, int64_t s, const AttentionOptions& o,
                 const std::vector<std::pair<std::string, Vec>>& ws) {
  const int64_t h = o.hidden_size, nh = o.num_heads, nkv = o.num_kv_heads, d = o.head_dim;
  const int64_t n = b * s;
  auto bias = [&](const std::string& name) { return o.bias ? W(ws, name + ".bias") : Vec(); };
  Vec q, k, v;
  if (o.fused_qkv) {  // rows q | k | v
    const Vec& w = W(ws, o.qkv_name + ".weight");
    const Vec bb = bias(o.qkv_name);
    q = LinearRef(x, n, h, w, nh * d, bb, 0);
    k = LinearRef(x, n, h, w, nkv * d, bb, nh * d);
    v = LinearRef(x, n, h, w, nkv * d, bb, (nh + nkv) * d);
  } else {
    q = LinearRef(x, n, h, W(ws, o.q_name + ".weight"), nh * d, bias(o.q_name));
    k = LinearRef(x, n, h, W(ws, o.k_name + ".weight"), nkv * d, bias(o.k_name));
    v = LinearRef(x, n, h, W(ws, o.v_name + ".weight"), nkv * d, bias(o.v_name));
  }
  Vec a(n * nh * d, 0.0);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t hi = 0; hi < nh; ++hi) {
      const int64_t kh = hi / (nh / nkv);
      for (int64_t i = 0; i < s; ++i) {
        const int64_t last = o.causal ? i : s - 1;
        Vec score(last + 1);
        for (int64_t j = 0; j <= last; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < d; ++e) {
            dot += q[((bi * s + i) * nh + hi) * d + e] * k[((bi * s + j) * nkv + kh) * d + e];
          }
          score[j] = dot / std::sqrt(static_cast<double>(d));
        }
        const double mx = *std::max_element(score.begin(), score.end());
        double total = 0;
        for (double& sc : score) total += (sc = std::exp(sc - mx));
        for (int64_t j = 0; j <= last; ++j) {
          for (int64_t e = 0; e < d; ++e) {
            a[((bi * s + i) * nh + hi) * d + e] +=
                score[j] / total * v[((bi * s + j) * nkv + kh) * d + e];
          }
        }
      }
    }
  }
  return LinearRef(a, n, nh * d, W(ws, o.o_name + ".weight"), h, bias(o.o_name));
}

// A router under a named parent, so that its refusal names it as a model's would.
class OneRouter : public Module {
 public:
  explicit OneRouter(const RouterOptions& options) : Module("OneRouter") {
    router = &AddModule<TopKRouter>("router", options);
  }
  TopKRouter* router;

 protected:
  absl::StatusOr<Values> Forward(Values in) override { return router->Call(std::move(in)); }
};

// Note [Sigmoid group routing]: groups that cannot give top_k are refused by ParallelizeModule
// and by every forward, with the module's name; a fitting grouping routes.
TEST(RouterBlock, GroupsThatCannotGiveTopKAreRefused) {
  RouterOptions o;
  o.hidden_size = 4;
  o.num_experts = 8;
  o.top_k = 4;
  o.scoring = RouterScoring::kSigmoid;
  o.num_groups = 4;   // 2 experts a group
  o.topk_groups = 1;  // 2 eligible, top 4 wanted
  const Tensor x = Tensor::Randn({3, 4}, 1).value();
  OneRouter bad(o);
  // Refused when planned, before anything is placed ...
  const absl::Status planned = ParallelizeModule(bad, testing::Tp(2), {}, Quiet());
  EXPECT_EQ(planned.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(planned,
                       "TopKRouter 'router': 8 experts in 4 groups (1 eligible) cannot give top 4"));
  EXPECT_FALSE(bad.GetParameter("router.weight").value()->placed());
  // ... and by the forward of a router placed without a plan.
  ASSERT_TRUE(ReplicateModule(bad, testing::Tp(1)).ok());
  ASSERT_TRUE(InitRandom(bad, 2).ok());
  EXPECT_TRUE(Contains(bad.Call({x}).status(),
                       "TopKRouter 'router': 8 experts in 4 groups (1 eligible) cannot give top 4"));
  o.topk_groups = 2;
  OneRouter good(o);
  ASSERT_TRUE(ParallelizeModule(good, testing::Tp(1), {}, Quiet()).ok());
  ASSERT_TRUE(InitRandom(good, 2).ok());
  const absl::StatusOr<Values> out = good.Call({x});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[1].local().shape(), (Shape{3, 4}));
}

RC_GTEST_PROP(AttentionBlock, FusedOrSeparateMatchesHandComputedAttention, ()) {
  const int tp = *rc::gen::inRange(1, 5);
  AttentionOptions o;
  o.num_kv_heads = tp * *rc::gen::inRange(1, 3);
  o.num_heads = o.num_kv_heads * *rc::gen::inRange(1, 3);
  o.head_dim = *rc::gen::inRange(1, 5);
  o.hidden_size = *rc::gen::inRange(1, 9);
  o.causal = *rc::gen::arbitrary<bool>();
  o.bias = *rc::gen::arbitrary<bool>();
  o.fused_qkv = *rc::gen::arbitrary<bool>();
  ParallelPlan plan;
  if (o.fused_qkv) {
    o.qkv_name = "c_attn";
    o.o_name = "c_proj";
    plan = {{"c_attn", "packed_colwise"}, {"c_proj", "rowwise"}};
  } else {
    plan = {{"q_proj", "colwise"}, {"k_proj", "colwise"}, {"v_proj", "colwise"},
            {"o_proj", "rowwise"}};
  }
  const int64_t b = *rc::gen::inRange(1, 3), s = *rc::gen::inRange(1, 6);
  const Tensor x = Tensor::Randn({b, s, o.hidden_size}, *rc::gen::inRange(0, 1000)).value();
  const absl::Status st = World::RunThreads(tp, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, TpMesh(w));
    Attention m(o);
    DT_RETURN_IF_ERROR(ParallelizeModule(m, mesh, plan, Quiet()));
    DT_RETURN_IF_ERROR(InitRandom(m, 5));
    DT_ASSIGN_OR_RETURN(Value y, m.CallOne({x}));  // no cos/sin: no rotary
    DT_ASSIGN_OR_RETURN(auto ws, Weights(m));
    EXPECT_TRUE(Near(y.local(), AttentionRef(x.ToDoubles(), b, s, m.options(), ws)))
        << m.ExtraRepr() << " tp " << tp;
    return absl::OkStatus();
  });
  RC_ASSERT(st.ok());
}

class ProjNorm : public Module {  // proj (Linear) -> norm (RMSNorm over its output)
 public:
  ProjNorm(int64_t in, int64_t width, double eps, RMSNormForm form) : Module("ProjNorm") {
    proj = &AddModule<Linear>("proj", in, width, /*bias=*/false);
    norm = &AddModule<RMSNorm>("norm", width, eps, DType::kF32, form);
  }
  Linear* proj;
  RMSNorm* norm;

 protected:
  absl::StatusOr<Values> Forward(Values in) override {
    DT_ASSIGN_OR_RETURN(Values y, proj->Call(std::move(in)));
    return norm->Call(std::move(y));
  }
};

// RMSNorm's forms (nn/norm.h) over a colwise projection's output: a piece sharded on the normalized
// dim sums its squares across the ranks (Note [A norm over a sharded dim]) and equals the norm of
// the whole row, computed by hand in double from the gathered weights, at every tp.
RC_GTEST_PROP(NormBlock, FormsOverAShardedProjectionMatchHandComputedNorm, ()) {
  const int tp = *rc::gen::inRange(1, 5);
  const int64_t in = *rc::gen::inRange(1, 7), width = tp * *rc::gen::inRange(1, 4);
  const int64_t n = *rc::gen::inRange(1, 5);
  const RMSNormForm form = *rc::gen::element(RMSNormForm::kRoundThenScale,
                                             RMSNormForm::kScaleThenRound,
                                             RMSNormForm::kOnePlusWeight);
  const double eps = 1e-6;
  const Tensor x = Tensor::Randn({n, in}, *rc::gen::inRange(0, 1000)).value();
  const absl::Status s = World::RunThreads(tp, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, TpMesh(w));
    ProjNorm m(in, width, eps, form);
    DT_RETURN_IF_ERROR(ParallelizeModule(m, mesh, {{"proj", "colwise"}}, Quiet()));
    DT_RETURN_IF_ERROR(InitRandom(m, 7));
    DT_ASSIGN_OR_RETURN(Value y, m.proj->CallOne({x}));
    DT_ASSIGN_OR_RETURN(Value z, m.norm->CallOne({y}));
    EXPECT_TRUE(y.piece_of() != nullptr && z.piece_of() != nullptr) << z.Describe();
    DT_ASSIGN_OR_RETURN(Tensor whole, WholeTensor(z));
    DT_ASSIGN_OR_RETURN(auto ws, Weights(m));
    Vec want = LinearRef(x.ToDoubles(), n, in, W(ws, "proj.weight"), width, Vec());
    const Vec& g = W(ws, "norm.weight");
    for (int64_t r = 0; r < n; ++r) {
      double squares = 0;
      for (int64_t i = 0; i < width; ++i) squares += want[r * width + i] * want[r * width + i];
      const double rstd = 1.0 / std::sqrt(squares / width + eps);
      for (int64_t i = 0; i < width; ++i) {
        want[r * width + i] *= rstd * (form == RMSNormForm::kOnePlusWeight ? 1.0 + g[i] : g[i]);
      }
    }
    EXPECT_TRUE(Near(whole, want)) << m.norm->ExtraRepr() << " tp " << tp;
    return absl::OkStatus();
  });
  RC_ASSERT(s.ok());
}

TEST(AttentionBlock, FusedProjectionDeclaresItsBlocks) {
  Attention m(AttentionOptions{.hidden_size = 8,
                               .num_heads = 4,
                               .num_kv_heads = 2,
                               .head_dim = 2,
                               .fused_qkv = true,
                               .o_name = "c_proj",
                               .qkv_name = "c_attn"});
  const auto* c_attn = dynamic_cast<Linear*>(m.FindChild("c_attn"));
  ASSERT_NE(c_attn, nullptr);
  EXPECT_EQ(c_attn->packed_col_blocks(), (std::vector<int64_t>{8, 4, 4}));
  EXPECT_NE(m.FindChild("c_proj"), nullptr);
  EXPECT_EQ(m.FindChild("q_proj"), nullptr);
  const DeviceMesh tp = DeviceMesh::Abstract({2}, {"tp"}).value();
  ASSERT_TRUE(
      ParallelizeModule(m, tp, {{"c_attn", "packed_colwise"}, {"c_proj", "rowwise"}}, Quiet())
          .ok());
  EXPECT_EQ(PlacementsToString(m.GetParameter("c_attn.weight").value()->spec().placements()),
            "[_S(0,[8,4,4])]");
  // tp must divide the KV heads of the fused projection too.
  Attention odd(AttentionOptions{.hidden_size = 8, .num_heads = 4, .num_kv_heads = 2,
                                 .head_dim = 2, .fused_qkv = true});
  EXPECT_TRUE(Contains(ParallelizeModule(odd, DeviceMesh::Abstract({4}, {"tp"}).value(),
                                         {{"qkv_proj", "packed_colwise"}}, Quiet()),
                       "tensor parallel size 4 does not divide num_kv_heads 2 "
                       "(qkv_proj.weight sharded)"));
}

// ---- LearnedPositionEmbedding -----------------------------------------------------------------

TEST(PositionEmbedding, AddsTheRowsOfTheGivenPositions) {
  const absl::Status s = World::RunThreads(2, [](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, TpMesh(w));
    LearnedPositionEmbedding wpe(6, 3);
    DT_RETURN_IF_ERROR(ParallelizeModule(wpe, mesh, {{"", "replicate"}}));
    DT_RETURN_IF_ERROR(InitRandom(wpe, 1));
    DT_ASSIGN_OR_RETURN(auto ws, Weights(wpe));
    const Vec& table = W(ws, "weight");
    DT_ASSIGN_OR_RETURN(Tensor x, Tensor::Randn({2, 4, 3}, 2));
    const Vec xv = x.ToDoubles();
    // Default positions 0..3.
    DT_ASSIGN_OR_RETURN(Value y, wpe.CallOne({x}));
    Vec want(xv.size());
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t s = 0; s < 4; ++s) {
        for (int64_t e = 0; e < 3; ++e) {
          want[(b * 4 + s) * 3 + e] = xv[(b * 4 + s) * 3 + e] + table[s * 3 + e];
        }
      }
    }
    EXPECT_TRUE(Near(y.local(), want, 1e-6));
    // Given positions, per batch row (a KV-cache step past 2 tokens, and another sequence).
    const std::vector<int64_t> pos = {2, 3, 4, 5, 0, 1, 2, 3};
    DT_ASSIGN_OR_RETURN(Tensor p, Tensor::FromVector<int64_t>({2, 4}, pos));
    DT_ASSIGN_OR_RETURN(y, wpe.CallOne({x, p}));
    for (int64_t i = 0; i < 8; ++i) {
      for (int64_t e = 0; e < 3; ++e) want[i * 3 + e] = xv[i * 3 + e] + table[pos[i] * 3 + e];
    }
    EXPECT_TRUE(Near(y.local(), want, 1e-6));
    // DTensor inputs (replicated) give a replicated DTensor with the same values.
    DT_ASSIGN_OR_RETURN(DTensor xd, DTensor::FromLocal(x, mesh, {Placement::Replicate()}));
    DT_ASSIGN_OR_RETURN(y, wpe.CallOne({Value(xd), Value(p)}));
    EXPECT_TRUE(y.is_dtensor());
    EXPECT_TRUE(Near(y.local(), want, 1e-6));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// ---- CheckParallel ----------------------------------------------------------------------------

class TinyLM : public Module {  // ids -> embedding -> fused attention -> GELU MLP -> logits
 public:
  TinyLM() : Module("TinyLM") {
    AddModule<Embedding>("wte", 32, 16);
    AddModule<Attention>("attn", AttentionOptions{.hidden_size = 16,
                                                  .num_heads = 4,
                                                  .bias = true,
                                                  .fused_qkv = true,
                                                  .o_name = "c_proj",
                                                  .qkv_name = "c_attn"});
    AddModule<MLP>("mlp", MLPOptions{.hidden_size = 16, .intermediate_size = 32});
    AddModule<Linear>("lm_head", 16, 32);
  }

 protected:
  absl::StatusOr<Values> Forward(Values in) override {
    DT_ASSIGN_OR_RETURN(Value x, FindChild("wte")->CallOne({in[0]}));
    DT_ASSIGN_OR_RETURN(x, FindChild("attn")->CallOne({x}));
    DT_ASSIGN_OR_RETURN(x, FindChild("mlp")->CallOne({x}));
    DT_ASSIGN_OR_RETURN(x, FindChild("lm_head")->CallOne({x}));
    return Values{x};
  }
};

ParallelPlan TinyPlan(PlanEntry c_attn = "packed_colwise", PlanEntry lm_head = "colwise_gather_output") {
  return {{"wte", "embedding_rowwise"}, {"attn.c_attn", std::move(c_attn)},
          {"attn.c_proj", "rowwise"},   {"mlp.fc1", "colwise"},
          {"mlp.fc2", "rowwise"},       {"lm_head", std::move(lm_head)}};
}

Tensor TinyIds() {
  return Tensor::FromVector<int64_t>({2, 5}, {1, 5, 9, 30, 2, 7, 7, 0, 31, 16}).value();
}

TEST(CheckParallel, PassesARightPlanAndReportsEveryOutput) {
  ASSERT_TRUE(World::RunThreads(2, [](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, TpMesh(w));
    auto make = [] { return std::make_unique<TinyLM>(); };
    DT_ASSIGN_OR_RETURN(ParallelCheck r, CheckParallel(make, mesh, TinyPlan(), {TinyIds()}));
    EXPECT_TRUE(r.ok()) << r.ToString();
    EXPECT_TRUE(r.status().ok());
    EXPECT_EQ(r.outputs.size(), 1u);
    EXPECT_LT(r.max_abs_diff(), 1e-5);
    EXPECT_TRUE(Contains(r.ToString(), "tp=2 mesh(tp=2): output 0 f32[2, 5, 32] max |diff| "));
    EXPECT_TRUE(Contains(r.ToString(), " ok"));
    return absl::OkStatus();
  }).ok());
}

// Wrong block proportions pass every plan check (they divide the rows and tp) and cut k and v at
// the wrong rows: only the numbers show it, and CheckParallel reports them on every rank.
TEST(CheckParallel, CatchesAPlanThatComputesSomethingElse) {
  ASSERT_TRUE(World::RunThreads(2, [](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, TpMesh(w));
    auto make = [] { return std::make_unique<TinyLM>(); };
    auto wrong = std::make_shared<PackedColwiseParallel>(std::vector<int64_t>{1, 2});
    DT_ASSIGN_OR_RETURN(ParallelCheck r, CheckParallel(make, mesh, TinyPlan(wrong), {TinyIds()}));
    EXPECT_FALSE(r.ok()) << r.ToString();
    EXPECT_GT(r.max_abs_diff(), 1e-3);
    EXPECT_TRUE(Contains(r.ToString(), "OUT OF TOLERANCE"));
    EXPECT_TRUE(Contains(r.status(),
                         "the tensor-parallel model on mesh(tp=2) does not compute what the "
                         "replicated one does: output 0 f32[2, 5, 32] differs by up to"));
    // A logits layer left sharded ('colwise') hands on a piece, which the model's output gathers:
    // the numbers are right (Note [Local pieces remember their layout]).
    DT_ASSIGN_OR_RETURN(ParallelCheck gathered,
                        CheckParallel(make, mesh, TinyPlan("packed_colwise", "colwise"), {TinyIds()}));
    EXPECT_TRUE(gathered.ok()) << gathered.ToString();
    return absl::OkStatus();
  }).ok());
}

}  // namespace
}  // namespace dt::nn
