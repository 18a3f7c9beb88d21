// The paths that used to give wrong numbers without an error for a model built through the API
// (issue 31), each now an error with its message asserted, or computed right (checked against the
// replicated model by CheckParallel, an independent forward on whole weights):
//   1. a custom attention with q_proj split and k_proj / v_proj left out of the plan;
//   2. lm_head planned 'colwise' (not 'colwise_gather_output'): its output is a piece the model's
//      output gathers; an op that needs the whole sharded dim in a custom forward gets it;
//   3. tp_plan() after ParallelizeModule called directly;
//   4. a misspelled plan key: a warning, an error with DistributedConfig::unmatched_keys, and a
//      later error that names it.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "dtensor/core/status.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/check.h"
#include "dtensor/nn/distributed.h"
#include "dtensor/nn/init.h"
#include "dtensor/nn/linear.h"
#include "dtensor/nn/log.h"
#include "dtensor/nn/mlp.h"
#include "dtensor/nn/norm.h"
#include "dtensor/nn/plan.h"
#include "dtensor/ops/value_ops.h"
#include "dtensor/tests/nn/plan_util.h"
#include "dtensor/tests/test_util.h"
#include "gtest/gtest.h"

namespace dt::nn {
namespace {

using dt::testing::Contains;
using testing::Quiet;

absl::StatusOr<DeviceMesh> Tp(World& w) {
  return InitDeviceMesh(w.shared_from_this(), {w.size()}, {"tp"});
}

Tensor Ids() { return Tensor::FromVector<int64_t>({2, 5}, {1, 7, 3, 0, 9, 4, 4, 2, 8, 5}).value(); }

// A user's own attention (not nn::Attention): 4 query heads, 2 KV heads of 4, written as the
// report's was, with GQA left to SDPA.
class MyAttention : public Module {
 public:
  MyAttention() : Module("MyAttention") {
    AddModule<Linear>("q_proj", 16, 16);
    AddModule<Linear>("k_proj", 16, 8);
    AddModule<Linear>("v_proj", 16, 8);
    AddModule<Linear>("o_proj", 16, 16);
  }

 protected:
  absl::StatusOr<Values> Forward(Values in) override {
    const int64_t b = in[0].shape()[0], s = in[0].shape()[1];
    auto heads = [&](const char* name) -> absl::StatusOr<Value> {
      DT_ASSIGN_OR_RETURN(Value y, FindChild(name)->CallOne({in[0]}));
      DT_ASSIGN_OR_RETURN(y, ops::Reshape(y, {b, s, -1, 4}));
      return ops::Transpose(y, 1, 2);
    };
    DT_ASSIGN_OR_RETURN(Value q, heads("q_proj"));
    DT_ASSIGN_OR_RETURN(Value k, heads("k_proj"));
    DT_ASSIGN_OR_RETURN(Value v, heads("v_proj"));
    ops::AttentionOptions o;
    o.causal = true;
    DT_ASSIGN_OR_RETURN(Value a, ops::ScaledDotProductAttention(q, k, v, o));
    DT_ASSIGN_OR_RETURN(a, ops::Transpose(a, 1, 2));
    DT_ASSIGN_OR_RETURN(a, ops::Reshape(a, {b, s, -1}));
    DT_ASSIGN_OR_RETURN(Value y, FindChild("o_proj")->CallOne({a}));
    return Values{std::move(y)};
  }
};

// The same forward with the plan check switched off: the pieces q_proj hands on still compute
// what the replicated model does (SDPA pairs this rank's query heads with the KV heads they use).
class MyUncheckedAttention : public MyAttention {
 public:
  absl::Status ValidateTensorParallel(const TPValidationContext&) const override {
    return absl::OkStatus();
  }
};

// ids -> embedding -> MyAttention -> (LayerNorm without affine over `up`'s output) -> lm_head.
class MyLM : public Module {
 public:
  explicit MyLM(bool norm_up = false, bool unchecked = false) : Module("MyLM"), norm_up_(norm_up) {
    AddModule<Embedding>("embed", 12, 16);
    if (unchecked) {
      AddModule<MyUncheckedAttention>("attn");
    } else {
      AddModule<MyAttention>("attn");
    }
    AddModule<Linear>("up", 16, 32);
    AddModule<LayerNorm>("up_norm", 32, 1e-5, /*elementwise_affine=*/false);
    AddModule<Linear>("lm_head", 16, 12);
  }

 protected:
  absl::StatusOr<Values> Forward(Values in) override {
    DT_ASSIGN_OR_RETURN(Value h, FindChild("embed")->CallOne({in[0]}));
    DT_ASSIGN_OR_RETURN(Value a, FindChild("attn")->CallOne({h}));
    DT_ASSIGN_OR_RETURN(h, ops::Add(h, a));
    if (norm_up_) {  // a custom forward normalizing over a colwise layer's sharded output
      DT_ASSIGN_OR_RETURN(Value u, FindChild("up")->CallOne({h}));
      DT_ASSIGN_OR_RETURN(u, FindChild("up_norm")->CallOne({u}));
      return Values{std::move(u)};
    }
    DT_ASSIGN_OR_RETURN(Value logits, FindChild("lm_head")->CallOne({h}));
    return Values{std::move(logits)};
  }

 private:
  bool norm_up_;
};

// 1. q split, k / v replicated in a forward nobody here knows: refused before anything is placed.
TEST(SilentPaths, MixedProjectionsInACustomAttentionAreAnError) {
  MyLM m;
  const DeviceMesh tp = DeviceMesh::Abstract({2}, {"tp"}).value();
  const absl::Status s = ParallelizeModule(
      m, tp, {{"attn.q_proj", "colwise"}, {"attn.o_proj", "rowwise"}}, Quiet());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "MyAttention 'attn': q_proj.weight is [S(0)] (output split) but "
                          "k_proj.weight is [R] (output whole)"));
  EXPECT_TRUE(Contains(s, "Plan [q_proj, k_proj, v_proj] alike"));
  EXPECT_FALSE(m.GetParameter("attn.q_proj.weight").value()->placed());
  // Split alike, the same forward computes what the replicated model does.
  ASSERT_TRUE(World::RunThreads(2, [](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, Tp(w));
    const ParallelPlan plan = {{"attn.q_proj", "colwise"}, {"attn.k_proj", "colwise"},
                               {"attn.v_proj", "colwise"}, {"attn.o_proj", "rowwise"},
                               {"lm_head", "colwise_gather_output"}};
    CheckParallelOptions o;
    o.parallelize = Quiet();
    DT_ASSIGN_OR_RETURN(ParallelCheck r,
                        CheckParallel([] { return std::make_unique<MyLM>(); }, mesh, plan,
                                      {Value(Ids())}, o));
    DT_RETURN_IF_ERROR(r.status());
    const ParallelPlan mixed = {{"attn.q_proj", "colwise"}, {"attn.o_proj", "rowwise"},
                                {"lm_head", "colwise_gather_output"}};
    DT_ASSIGN_OR_RETURN(
        ParallelCheck unchecked,
        CheckParallel([] { return std::make_unique<MyLM>(false, /*unchecked=*/true); }, mesh,
                      mixed, {Value(Ids())}, o));
    return unchecked.status();
  }).ok());
}

// 2. lm_head 'colwise': a piece, gathered at the model's output with a warning naming the layer,
// so an argmax over the vocab sees all of it; a norm over a colwise output's sharded dim in a
// custom forward gets the dim gathered.
TEST(SilentPaths, AColwiseOutputKeepsItsPlacement) {
  std::vector<std::string> warnings;
  ScopedLogSink capture([&](LogLevel, absl::string_view m) { warnings.emplace_back(m); });
  ASSERT_TRUE(World::RunThreads(2, [](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, Tp(w));
    CheckParallelOptions o;
    o.parallelize = Quiet();
    const ParallelPlan logits = {{"attn.q_proj", "colwise"}, {"attn.k_proj", "colwise"},
                                 {"attn.v_proj", "colwise"}, {"attn.o_proj", "rowwise"},
                                 {"lm_head", "colwise"}};
    DT_ASSIGN_OR_RETURN(ParallelCheck a, CheckParallel([] { return std::make_unique<MyLM>(); },
                                                       mesh, logits, {Value(Ids())}, o));
    DT_RETURN_IF_ERROR(a.status());
    EXPECT_EQ(a.outputs[0].describe, "f32[2, 5, 12]");  // the whole vocab on every rank
    const ParallelPlan norm = {{"attn.q_proj", "colwise"}, {"attn.k_proj", "colwise"},
                               {"attn.v_proj", "colwise"}, {"attn.o_proj", "rowwise"},
                               {"up", "colwise"}};
    DT_ASSIGN_OR_RETURN(ParallelCheck b,
                        CheckParallel([] { return std::make_unique<MyLM>(/*norm_up=*/true); },
                                      mesh, norm, {Value(Ids())}, o));
    return b.status();
  }).ok());
  bool named = false;
  for (const std::string& m : warnings) {
    named = named || absl::StrContains(m, "MyLM: output 0 is local f32[2, 5, 6] cpu, this rank's "
                                          "piece of f32[2, 5, 12] [S(2)] from 'lm_head'; gathered "
                                          "it whole (plan 'lm_head' as colwise_gather_output");
  }
  EXPECT_TRUE(named) << (warnings.empty() ? "no warning" : warnings[0]);
  // A styled layer called on its own hands on its piece, which says what it is.
  ASSERT_TRUE(World::RunThreads(2, [](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, Tp(w));
    Linear head(16, 12);
    DT_RETURN_IF_ERROR(ParallelizeModule(head, mesh, {{"", "colwise"}}, Quiet()));
    DT_RETURN_IF_ERROR(InitRandom(head, 1));
    DT_ASSIGN_OR_RETURN(Tensor x, Tensor::Rand({1, 3, 16}, 2));
    DT_ASSIGN_OR_RETURN(Value y, head.CallOne({Value(x)}));
    EXPECT_EQ(y.local().shape(), (Shape{1, 3, 6}));  // this rank's piece
    EXPECT_EQ(y.shape(), (Shape{1, 3, 12}));         // what ops on it see
    EXPECT_NE(y.piece_of(), nullptr);
    EXPECT_EQ(y.Describe(), "local f32[1, 3, 6] cpu, this rank's piece of f32[1, 3, 12] [S(2)] "
                            "from the root module");
    DT_ASSIGN_OR_RETURN(Tensor whole, WholeTensor(y));
    EXPECT_EQ(whole.shape(), (Shape{1, 3, 12}));
    return absl::OkStatus();
  }).ok());
}

// 3. tp_plan() (FormatPlacements) reports what the parameters are, whichever entry point placed
// them.
TEST(SilentPaths, FormatPlacementsAfterParallelizeModule) {
  MyLM m;
  const DeviceMesh tp = DeviceMesh::Abstract({2}, {"tp"}).value();
  ASSERT_TRUE(ParallelizeModule(m, tp,
                                {{"attn.q_proj", "colwise"}, {"attn.k_proj", "colwise"},
                                 {"attn.v_proj", "colwise"}, {"attn.o_proj", "rowwise"}},
                                Quiet())
                  .ok());
  const std::string text = FormatPlacements(m);
  EXPECT_TRUE(Contains(absl::InternalError(text),
                       "attn.q_proj -> colwise: attn.q_proj.weight [S(0)]\n"));
  EXPECT_TRUE(Contains(absl::InternalError(text), "attn.o_proj -> rowwise: attn.o_proj.weight [S(1)]"));
  EXPECT_TRUE(Contains(absl::InternalError(text), "replicated (no rule): embed.weight, "));
  EXPECT_TRUE(Contains(absl::InternalError(FormatPlacements(MyLM())),
                       "not placed: embed.weight"));
}

// 4. A misspelled key: matched nothing, so its layer stays replicated (fc1 here: fc2, rowwise,
// then gets the whole feature dim).
TEST(SilentPaths, UnmatchedKeysWarnFailOnRequestAndAreNamedByLaterErrors) {
  class Net : public Module {
   public:
    Net() : Module("Net") {
      AddModule<MLP>("mlp", MLPOptions{.hidden_size = 8, .intermediate_size = 16});
    }

   protected:
    absl::StatusOr<Values> Forward(Values in) override { return FindChild("mlp")->Call(in); }
  };
  const ParallelPlan typo = {{"mlp.fc_1", "colwise"}, {"mlp.fc2", "rowwise"}};
  std::vector<std::string> warnings;
  ScopedLogSink capture([&](LogLevel, absl::string_view m) { warnings.emplace_back(m); });
  ASSERT_TRUE(World::RunThreads(2, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, Tp(w));
    Net strict;
    ParallelizeOptions error;
    error.unused_rules = PlanCheck::kError;
    EXPECT_TRUE(Contains(ParallelizeModule(strict, mesh, typo, error),
                         "Net: The following TP rules were not applied on any of the layers: "
                         "[mlp.fc_1]"));
    Net net;
    DT_RETURN_IF_ERROR(ParallelizeModule(net, mesh, typo));  // a warning by default
    DT_RETURN_IF_ERROR(InitRandom(net, 3));
    DT_ASSIGN_OR_RETURN(Tensor x, Tensor::Rand({2, 8}, 4));
    const absl::Status later = net.Call({Value(x)}).status();
    EXPECT_TRUE(Contains(later, "rowwise on 'mlp.fc2' expects this rank's slice of its 16 input "
                                "features"))
        << later;
    EXPECT_TRUE(Contains(later, "(the TP plan's rules [mlp.fc_1] matched no layer: a misspelled "
                                "key leaves its layer replicated)"))
        << later;
    return absl::OkStatus();
  }).ok());
  bool warned = false;
  for (const std::string& m : warnings) {
    warned = warned || absl::StrContains(m, "The following TP rules were not applied on any of "
                                            "the layers: [mlp.fc_1]");
  }
  EXPECT_TRUE(warned);
}

}  // namespace
}  // namespace dt::nn
