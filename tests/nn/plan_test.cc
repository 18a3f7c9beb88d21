// Plans: key matching and precedence, unknown styles, warnings, validation before any weight is
// read, the placements every built-in style gives, and the registry. Everything here runs on
// abstract meshes: planning places placeholders and never communicates.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "dtensor/nn/nn.h"
#include "dtensor/tests/nn/plan_util.h"
#include "dtensor/tests/test_util.h"

namespace dt::nn {
namespace {

using dt::testing::Contains;
using testing::Tp;
using testing::Quiet;

// layers.{0,1,2}.{attn (Attention 4 heads / 2 KV), mlp (SwiGLU, I = 8), norm}, lm_head.
class Block : public Module {
 public:
  explicit Block(int64_t kv_heads = 2, int64_t intermediate = 8) : Module("Block") {
    AddModule<Attention>(
        "attn", AttentionOptions{
                    .hidden_size = 8, .num_heads = 4, .num_kv_heads = kv_heads, .head_dim = 2});
    AddModule<SwiGLUMLP>("mlp", SwiGLUOptions{.hidden_size = 8, .intermediate_size = intermediate});
    AddModule<RMSNorm>("norm", 8);
  }

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override { return inputs; }
};

class Net : public Module {
 public:
  explicit Net(int64_t kv_heads = 2, int64_t intermediate = 8, int64_t vocab = 16) : Module("Net") {
    auto& layers = AddModule<ModuleList>("layers");
    for (int i = 0; i < 3; ++i) layers.Append(std::make_unique<Block>(kv_heads, intermediate));
    AddModule<Linear>("lm_head", 8, vocab);
  }

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override { return inputs; }
};

ParallelPlan LlamaLikePlan() {
  return {{"layers.*.attn.q_proj", "colwise"},   {"layers.*.attn.k_proj", "colwise"},
          {"layers.*.attn.v_proj", "colwise"},   {"layers.*.attn.o_proj", "rowwise"},
          {"layers.*.mlp.gate_proj", "colwise"}, {"layers.*.mlp.up_proj", "colwise"},
          {"layers.*.mlp.down_proj", "rowwise"}, {"lm_head", "colwise_gather_output"}};
}

std::string PlacementOf(Module& m, absl::string_view param) {
  return PlacementsToString(m.GetParameter(param).value()->spec().placements());
}

TEST(PlanKeys, WildcardStandsForOneIndexComponent) {
  EXPECT_TRUE(PlanKeyMatches("layers.*.mlp.up_proj", "layers.17.mlp.up_proj"));
  EXPECT_TRUE(PlanKeyMatches("layers.3.mlp.up_proj", "layers.3.mlp.up_proj"));
  EXPECT_TRUE(PlanKeyMatches("blocks.*.experts.3.w1", "blocks.0.experts.3.w1"));
  EXPECT_FALSE(PlanKeyMatches("layers.*.mlp.up_proj", "layers.x.mlp.up_proj"));
  EXPECT_FALSE(PlanKeyMatches("layers.*proj", "layers.3proj"));
  EXPECT_FALSE(PlanKeyMatches("layers.*.mlp", "layers.1.mlp.up_proj"));  // not a prefix match
  EXPECT_TRUE(PlanKeyMatches("layers.*.*.up", "layers.1.2.up"));
  EXPECT_FALSE(PlanKeyMatches("layers.*.*.up", "layers.1.x.up"));
  EXPECT_EQ(WildcardName("layers.12.mlp.w1.weight"), "layers.*.mlp.w1.weight");
}

// transformers v4's MoE plans name every expert's projections with two stars
// ("layers.*.mlp.experts.*.gate_proj"); they match here as v4 matched them (every numeric
// component a `*`), and a key with fewer stars (one expert fixed) beats them.
TEST(PlanKeys, TwoStarsMatchAsTransformersV4) {
  // Built as v4 names them: layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.
  class Mlp : public Module {
   public:
    Mlp() : Module("SparseMoeBlock") {
      auto& experts = AddModule<ModuleList>("experts");
      for (int e = 0; e < 4; ++e) {
        experts.Append(std::make_unique<SwiGLUMLP>(
            SwiGLUOptions{.hidden_size = 4, .intermediate_size = 8}));
      }
    }

   protected:
    absl::StatusOr<Values> Forward(Values in) override { return in; }
  };
  class Layer : public Module {
   public:
    Layer() : Module("Layer") { AddModule<Mlp>("mlp"); }

   protected:
    absl::StatusOr<Values> Forward(Values in) override { return in; }
  };
  class Model : public Module {
   public:
    Model() : Module("Model") {
      auto& layers = AddModule<ModuleList>("layers");
      for (int l = 0; l < 2; ++l) layers.Append(std::make_unique<Layer>());
    }

   protected:
    absl::StatusOr<Values> Forward(Values in) override { return in; }
  } model;
  const ParallelPlan v4 = {{"layers.*.mlp.experts.*.gate_proj", "colwise"},
                           {"layers.*.mlp.experts.*.up_proj", "colwise"},
                           {"layers.*.mlp.experts.*.down_proj", "rowwise"},
                           {"layers.*.mlp.experts.3.down_proj", "colwise_gather_output"}};
  ASSERT_TRUE(ParallelizeModule(model, Tp(2), v4, Quiet()).ok());
  EXPECT_EQ(PlacementOf(model, "layers.1.mlp.experts.2.gate_proj.weight"), "[S(0)]");
  EXPECT_EQ(PlacementOf(model, "layers.0.mlp.experts.0.up_proj.weight"), "[S(0)]");
  EXPECT_EQ(PlacementOf(model, "layers.1.mlp.experts.1.down_proj.weight"), "[S(1)]");
  // One star fewer: the more specific key wins for expert 3.
  EXPECT_EQ(PlacementOf(model, "layers.0.mlp.experts.3.down_proj.weight"), "[S(0)]");
  // Two keys with as many stars that both match are ambiguous.
  Model again;
  EXPECT_TRUE(Contains(ResolvePlan(again, {{"layers.*.mlp.experts.*.up_proj", "colwise"},
                                           {"layers.0.mlp.experts.*.up_proj", "rowwise"},
                                           {"layers.*.mlp.experts.0.up_proj", "rowwise"}})
                           .status(),
                       "both match 'layers.0.mlp.experts.0.up_proj'"));
}

TEST(PlanKeys, ExactBeatsWildcardAndParameterBeatsModule) {
  Net net;
  const ParallelPlan plan = {{"layers.*.mlp.up_proj", "colwise"},
                             {"layers.1.mlp.up_proj", "rowwise"},
                             {"layers.*.mlp.gate_proj", "colwise"},
                             {"layers.2.mlp.gate_proj.weight", "rowwise"}};
  auto r = ResolvePlan(net, plan);
  ASSERT_TRUE(r.ok()) << r.status();
  auto key_of = [&](absl::string_view name) {
    for (const auto& p : r->params) {
      if (p.name == name) return p.key;
    }
    return std::string("<missing>");
  };
  EXPECT_EQ(key_of("layers.0.mlp.up_proj.weight"), "layers.*.mlp.up_proj");
  EXPECT_EQ(key_of("layers.1.mlp.up_proj.weight"), "layers.1.mlp.up_proj");
  EXPECT_EQ(key_of("layers.2.mlp.gate_proj.weight"), "layers.2.mlp.gate_proj.weight");
  EXPECT_EQ(key_of("layers.1.mlp.gate_proj.weight"), "layers.*.mlp.gate_proj");
  EXPECT_EQ(key_of("layers.0.norm.weight"), "");
  // Module keys install forwards; parameter keys do not.
  std::vector<std::string> forwards;
  for (const auto& f : r->forwards) forwards.push_back(f.name + "=" + f.style_label);
  EXPECT_EQ(forwards, (std::vector<std::string>{
                          "layers.0.mlp.gate_proj=colwise", "layers.0.mlp.up_proj=colwise",
                          "layers.1.mlp.gate_proj=colwise", "layers.1.mlp.up_proj=rowwise",
                          "layers.2.mlp.gate_proj=colwise", "layers.2.mlp.up_proj=colwise"}));
}

TEST(PlanKeys, ModuleKeyCoversOnlyItsOwnParameters) {
  Net net;
  auto r = ResolvePlan(net, {{"layers.*.mlp", "colwise"}});
  ASSERT_TRUE(r.ok());
  for (const auto& p : r->params) EXPECT_EQ(p.key, "") << p.name;
  ASSERT_EQ(r->forwards.size(), 3u);
  EXPECT_EQ(r->forwards[0].name, "layers.0.mlp");
}

TEST(PlanErrors, UnknownStyleListsSupportedOnes) {
  Net net;
  const absl::Status s = ParallelizeModule(net, Tp(2), {{"layers.*.mlp.up_proj", "foo"}}, Quiet());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s,
                       "Unsupported tensor parallel style 'foo' for layer "
                       "'layers.*.mlp.up_proj'. Supported styles are [colwise, "));
  for (const char* name : {"colwise_gather_output", "colwise_rep", "rowwise_split_input",
                           "packed_colwise", "embedding_rowwise", "moe_identity_expert"}) {
    EXPECT_TRUE(Contains(s, name));
  }
  EXPECT_FALSE(net.GetParameter("layers.0.mlp.up_proj.weight").value()->placed());
}

// The unit styles keep units the module declares (Note [Unit meshes], Note [Uneven heads]): a
// layer that declares none is refused by name before anything is placed.
TEST(PlanErrors, UnitStylesNeedTheModulesUnit) {
  Net net;
  for (const char* style : {"unit_colwise", "unit_rowwise", "uneven_colwise", "uneven_rowwise"}) {
    const absl::Status s = ParallelizeModule(net, Tp(2), {{"layers.*.mlp.up_proj", style}}, Quiet());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(Contains(s, absl::StrCat(style, " on 'layers.0.mlp.up_proj': Linear declares no "
                                         "unit to keep whole (attention heads)")))
        << s;
    EXPECT_FALSE(net.GetParameter("layers.0.mlp.up_proj.weight").value()->placed());
  }
}

TEST(PlanErrors, MalformedKeys) {
  Net net;
  EXPECT_TRUE(Contains(ResolvePlan(net, {{"lm_head", "colwise"}, {"lm_head", "rowwise"}}).status(),
                       "plan key 'lm_head' is given twice"));
  // Two wildcards that match one name: ambiguous.
  class Nested : public Module {
   public:
    Nested() : Module("Nested") {
      auto& outer = AddModule<ModuleList>("blocks");
      auto& inner = outer.Append(std::make_unique<ModuleList>());
      inner.Append(std::make_unique<Linear>(2, 2));
    }

   protected:
    absl::StatusOr<Values> Forward(Values in) override { return in; }
  } nested;
  EXPECT_TRUE(
      Contains(ResolvePlan(nested, {{"blocks.*.0", "colwise"}, {"blocks.0.*", "rowwise"}}).status(),
               "both match 'blocks.0.0'"));
  EXPECT_TRUE(
      ResolvePlan(nested,
                  {{"blocks.*.0", "colwise"}, {"blocks.0.*", "rowwise"}, {"blocks.0.0", "colwise"}})
          .ok());
  // Mesh must be 1-D.
  const DeviceMesh mesh2d = DeviceMesh::Abstract({2, 2}, {"dp", "tp"}).value();
  EXPECT_TRUE(Contains(ParallelizeModule(net, mesh2d, LlamaLikePlan()),
                       "needs a 1-D tensor-parallel mesh"));
}

TEST(PlanWarnings, UnusedRulesAndUncoveredParameters) {
  std::vector<std::string> warnings;
  ScopedLogSink capture([&](LogLevel level, absl::string_view m) { warnings.emplace_back(m); });
  Net net;
  ParallelPlan plan = LlamaLikePlan();
  plan.push_back({"layers.*.mlp.w1", "colwise"});
  plan.push_back({"layers.*proj", "colwise"});
  ASSERT_TRUE(ParallelizeModule(net, Tp(2), plan).ok());
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_EQ(warnings[0],
            "The following TP rules were not applied on any of the layers: [layers.*.mlp.w1, "
            "layers.*proj]");
  EXPECT_EQ(warnings[1],
            "The following layers were not sharded by the TP plan: [layers.*.norm.weight] (they "
            "stay replicated; a 'replicate' rule says that is on purpose)");
  EXPECT_EQ(PlacementOf(net, "layers.2.norm.weight"), "[R]");

  // Only group rank 0 warns; `warn = false` silences.
  warnings.clear();
  Net other;
  ASSERT_TRUE(ParallelizeModule(other, Tp(2, /*rank=*/1), plan).ok());
  Net quiet;
  ASSERT_TRUE(ParallelizeModule(quiet, Tp(2), plan, Quiet()).ok());
  EXPECT_TRUE(warnings.empty());
}

TEST(PlanPlacements, LlamaLikePlanPlacesPlaceholders) {
  Net net;
  ASSERT_TRUE(ParallelizeModule(net, Tp(2, /*rank=*/1), LlamaLikePlan(), Quiet()).ok());
  EXPECT_EQ(PlacementOf(net, "layers.0.attn.q_proj.weight"), "[S(0)]");
  EXPECT_EQ(PlacementOf(net, "layers.0.attn.o_proj.weight"), "[S(1)]");
  EXPECT_EQ(PlacementOf(net, "layers.1.mlp.down_proj.weight"), "[S(1)]");
  EXPECT_EQ(PlacementOf(net, "lm_head.weight"), "[S(0)]");
  const Parameter& k = *net.GetParameter("layers.2.attn.k_proj.weight").value();
  EXPECT_FALSE(k.materialized());
  EXPECT_EQ(k.spec().LocalShape(), Shape({2, 8}));  // rank 1 holds KV head 1 only
  EXPECT_EQ(net.GetSubmodule("layers.0.attn.q_proj").value()->tp_style(), "colwise");
}

// Placements of every built-in style, per parameter kind.
TEST(PlanPlacements, BuiltinStyles) {
  struct Row {
    const char* style;
    std::function<std::unique_ptr<Module>()> make;
    const char* weight;
    const char* bias;  // "" when the module has none
  };
  auto linear = [](int64_t in, int64_t out) {
    return [=] { return std::unique_ptr<Module>(std::make_unique<Linear>(in, out, true)); };
  };
  auto packed = [](int64_t in, int64_t out) {  // blocks declared: [out/2, out/2] | [in/2, in/2]
    return [=] {
      auto l = std::make_unique<Linear>(in, out, true);
      l->set_packed_col_blocks({out / 2, out / 2});
      l->set_packed_row_blocks({in / 2, in / 2});
      return std::unique_ptr<Module>(std::move(l));
    };
  };
  auto embedding = [] { return std::unique_ptr<Module>(std::make_unique<Embedding>(8, 4)); };
  auto norm = [] { return std::unique_ptr<Module>(std::make_unique<LayerNorm>(8)); };
  const std::vector<Row> rows = {
      {"colwise", linear(4, 8), "[S(0)]", "[S(0)]"},
      {"colwise_gather_output", linear(4, 8), "[S(0)]", "[S(0)]"},
      {"colwise", embedding, "[S(1)]", ""},
      {"rowwise", linear(8, 4), "[S(1)]", "[R]"},
      {"rowwise_split_input", linear(8, 4), "[S(1)]", "[R]"},
      {"rowwise", embedding, "[S(0)]", ""},
      {"packed_colwise", packed(4, 8), "[_S(0,[4,4])]", "[_S(0,[4,4])]"},
      {"packed_rowwise", packed(8, 4), "[_S(1,[4,4])]", "[R]"},
      {"replicate", linear(4, 8), "[R]", "[R]"},
      {"embedding_rowwise", embedding, "[S(0)]", ""},
      {"embedding_colwise", embedding, "[S(1)]", ""},
      {"sequence_parallel", norm, "[R]", "[R]"},
      {"replicated_with_grad_allreduce", norm, "[R]", "[R]"},
      {"local_params", linear(4, 4), "[R]", "[R]"},
  };
  for (const Row& row : rows) {
    std::unique_ptr<Module> m = row.make();
    ASSERT_TRUE(ParallelizeModule(*m, Tp(2), {{"", row.style}}, Quiet()).ok()) << row.style;
    EXPECT_EQ(PlacementOf(*m, "weight"), row.weight) << row.style;
    if (*row.bias) {
      EXPECT_EQ(PlacementOf(*m, "bias"), row.bias) << row.style;
    }
  }
}

// One Attention named "attn" under a pass-through root: plans address "attn.q_proj", errors name
// "Attention 'attn'".
class OneAttention : public Module {
 public:
  explicit OneAttention(const AttentionOptions& options) : Module("OneAttention") {
    AddModule<Attention>("attn", options);
  }

 protected:
  absl::StatusOr<Values> Forward(Values in) override { return in; }
};

TEST(Validation, KvHeadsMustDivide) {
  // transformers #48307: 4 KV heads on tp 8 fails mid-forward there; here before any weight.
  OneAttention m(
      AttentionOptions{.hidden_size = 64, .num_heads = 16, .num_kv_heads = 4, .head_dim = 4});
  const absl::Status s = ParallelizeModule(
      m, Tp(8),
      {{"attn.q_proj", "colwise"}, {"attn.k_proj", "colwise"}, {"attn.v_proj", "colwise"}},
      Quiet());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s,
                       "Attention 'attn': tensor parallel size 8 does not divide num_kv_heads 4 "
                       "(k_proj.weight sharded)"));
  EXPECT_TRUE(Contains(s, "#48307"));
  EXPECT_FALSE(m.GetParameter("attn.q_proj.weight").value()->placed());
  EXPECT_TRUE(Contains(s, "or splits them unit_colwise"));
  // Replicated K/V projections (only q and o sharded) are fine, and so are unit_colwise ones
  // (Note [Unit meshes]): 4 KV heads in 4 groups of 1 head, each on 2 of the 8 ranks.
  EXPECT_TRUE(ParallelizeModule(m, Tp(8), {{"attn.q_proj", "colwise"}, {"attn.o_proj", "rowwise"}},
                                Quiet())
                  .ok());
  EXPECT_TRUE(ParallelizeModule(m, Tp(8),
                                {{"attn.q_proj", "colwise"},
                                 {"attn.k_proj", "unit_colwise"},
                                 {"attn.v_proj", "unit_colwise"},
                                 {"attn.o_proj", "rowwise"}},
                                Quiet())
                  .ok());
  const Parameter* k = m.GetParameter("attn.k_proj.weight").value();
  EXPECT_EQ(k->spec().mesh().ToString(), "mesh(tp=4, unit_replicate=2)");
  EXPECT_EQ(PlacementsToString(k->spec().placements()), "[S(0), R]");
}

// Query heads split unit_colwise into fewer groups than tp must meet an o_proj that takes the same
// groups (unit_rowwise), not one cut into tp slices.
TEST(Validation, UnitQueriesPairWithUnitRowwise) {
  OneAttention m(
      AttentionOptions{.hidden_size = 24, .num_heads = 6, .num_kv_heads = 3, .head_dim = 4});
  ParallelPlan plan = {{"attn.q_proj", "unit_colwise"}, {"attn.o_proj", "rowwise"}};
  const absl::Status s = ParallelizeModule(m, Tp(4), plan, Quiet());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "Attention 'attn': q_proj.weight splits the 6 query heads into 2 groups "
                          "but o_proj.weight takes 4 (unit_colwise on the queries pairs with "
                          "unit_rowwise on o_proj"))
      << s;
  EXPECT_FALSE(m.GetParameter("attn.q_proj.weight").value()->placed());
  plan[1].second = "unit_rowwise";
  EXPECT_TRUE(ParallelizeModule(m, Tp(4), plan, Quiet()).ok());
  EXPECT_EQ(PlacementsToString(m.GetParameter("attn.o_proj.weight").value()->spec().placements()),
            "[S(1), R]");
}

TEST(Validation, HeadsIntermediateVocabAndPackedBlocks) {
  Net net(/*kv_heads=*/4, /*intermediate=*/8, /*vocab=*/10);
  EXPECT_TRUE(
      Contains(ParallelizeModule(net, Tp(3), {{"layers.*.attn.q_proj", "colwise"}}, Quiet()),
               "does not divide num_heads 4 (q_proj.weight sharded)"));
  EXPECT_TRUE(Contains(
      ParallelizeModule(net, Tp(3), {{"layers.*.mlp.gate_proj", "colwise"}}, Quiet()),
      "SwiGLUMLP 'layers.0.mlp': tensor parallel size 3 does not divide intermediate_size 8 "
      "(gate_proj.weight sharded)"));
  EXPECT_TRUE(
      Contains(ParallelizeModule(net, Tp(4), {{"lm_head", "colwise_gather_output"}}, Quiet()),
               "The output size of `lm_head` (10) must be divisible by the tensor "
               "parallel size (4) when gathering a colwise output."));
  // Plain colwise allows the uneven vocab (no gather).
  EXPECT_TRUE(ParallelizeModule(net, Tp(4), {{"lm_head", "colwise"}}, Quiet()).ok());

  Linear fused(8, 108);  // [q | k | v | gate | up] = [12, 12, 12, 36, 36]
  auto flux = std::make_shared<PackedColwiseParallel>(std::vector<int64_t>{1, 1, 1, 3, 3});
  EXPECT_TRUE(Contains(ParallelizeModule(fused, Tp(8), {{"", flux}}, Quiet()),
                       "packed_colwise 'weight': packed block 0 of [12, 12, 12, 36, 36] has size "
                       "12, not divisible by the tensor parallel size 8"));
  EXPECT_TRUE(ParallelizeModule(fused, Tp(4), {{"", flux}}, Quiet()).ok());
  // Each block on its own: [4, 20] sums to 24, which 8 divides, but block 0 does not.
  Linear halves(8, 24);
  halves.set_packed_col_blocks({4, 20});
  EXPECT_TRUE(ParallelizeModule(halves, Tp(4), {{"", "packed_colwise"}}, Quiet()).ok());
  EXPECT_TRUE(Contains(ParallelizeModule(halves, Tp(8), {{"", "packed_colwise"}}, Quiet()),
                       "packed block 0 of [4, 20] has size 4, not divisible by the tensor parallel "
                       "size 8"));
  auto bad = std::make_shared<PackedColwiseParallel>(std::vector<int64_t>{1, 4});
  EXPECT_TRUE(Contains(
      ParallelizeModule(halves, Tp(2), {{"", bad}}, Quiet()),
      "Cannot split 24 into proportional blocks [1, 4]: sum([1, 4])=5 does not divide 24"));
  Linear wrong(8, 24);
  wrong.set_packed_col_blocks({4, 4});
  EXPECT_TRUE(Contains(ParallelizeModule(wrong, Tp(2), {{"", "packed_colwise"}}, Quiet()),
                       "packed_col_blocks [4, 4] sum to 8 but the packed dim has 24 rows"));
  Linear negative(8, 24);
  negative.set_packed_col_blocks({-4, 28});
  EXPECT_TRUE(Contains(ParallelizeModule(negative, Tp(2), {{"", "packed_colwise"}}, Quiet()),
                       "packed_col_blocks [-4, 28] must all be positive"));
  Linear out(36, 8);
  out.set_packed_row_blocks({12, 24});
  EXPECT_TRUE(Contains(ParallelizeModule(out, Tp(8), {{"", "packed_rowwise"}}, Quiet()),
                       "packed_rowwise 'weight': packed block 0 of [12, 24]"));
}

TEST(Validation, TPConfig) {
  TPConfig c;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 4;
  c.intermediate_size = 14336;
  c.vocab_size = 128256;
  EXPECT_TRUE(ValidateTPConfig(c, 4).ok());
  EXPECT_TRUE(Contains(ValidateTPConfig(c, 8),
                       "tensor parallel size 8 does not divide num_key_value_heads 4"));
  EXPECT_TRUE(Contains(ValidateTPConfig(c, 3), "does not divide num_attention_heads 32"));
  c.packed_blocks = {{"single.to_qkv_mlp_proj", {6144, 6144, 6144, 18432, 18432}}};
  EXPECT_TRUE(ValidateTPConfig(c, 4).ok());
  c.num_key_value_heads = 0;
  EXPECT_TRUE(Contains(ValidateTPConfig(c, 5), "num_attention_heads 32"));
  Net net;
  ParallelizeOptions o = Quiet();
  o.config = TPConfig();
  o.config->num_key_value_heads = 2;
  EXPECT_TRUE(Contains(ParallelizeModule(net, Tp(4), {}, o), "num_key_value_heads 2"));
}

TEST(Registry, RuntimeStylesAndTable) {
  const std::vector<std::string> names = StyleNames();
  for (const char* required :
       {"colwise", "colwise_gather_output", "colwise_rep", "rowwise", "rowwise_split_input",
        "rowwise_rep", "packed_colwise", "packed_rowwise", "embedding_rowwise", "embedding_colwise",
        "sequence_parallel", "all_reduce", "local_params", "replicated_with_grad_allreduce",
        "moe_tp_experts", "moe_identity_expert"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), required), names.end()) << required;
  }
  const auto custom = std::make_shared<ColwiseParallel>(
      Placement::Replicate(), Placement::Shard(-1), /*use_local_output=*/false);
  ASSERT_TRUE(RegisterStyle("colwise_custom", custom).ok());
  ASSERT_TRUE(RegisterStyleAlias("colwise_custom_alias", "colwise_custom").ok());
  EXPECT_FALSE(RegisterStyle("has space", std::make_shared<AllReduceParallel>()).ok());
  EXPECT_FALSE(RegisterStyleAlias("x", "no_such_style").ok());
  // The alias is the custom style (a DTensor output), not the built-in colwise (a local output),
  // whose weight placement is the same.
  EXPECT_EQ(FindStyle("colwise_custom_alias"), custom);
  EXPECT_NE(FindStyle("colwise_custom_alias"), FindStyle("colwise"));
  EXPECT_NE(FindStyle("colwise_custom_alias")->Info().output, FindStyle("colwise")->Info().output);
  Linear l(4, 8);
  absl::StatusOr<PlanResolution> resolved = ResolvePlan(l, {{"", "colwise_custom_alias"}});
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  ASSERT_EQ(resolved->forwards.size(), 1u);
  EXPECT_EQ(resolved->forwards[0].style, custom);
  ASSERT_TRUE(ParallelizeModule(l, Tp(2), {{"", "colwise_custom_alias"}}, Quiet()).ok());
  EXPECT_EQ(PlacementOf(l, "weight"), "[S(0)]");

  const std::string table = FormatStylesTable();
  EXPECT_TRUE(Contains(table, "colwise_rep (= colwise_gather_output)"));
  EXPECT_TRUE(Contains(table, "colwise_custom"));
  EXPECT_TRUE(Contains(table, "all_gather"));
  EXPECT_TRUE(Contains(table, "Inference only"));
  for (const StyleRow& row : ListStyles()) {
    EXPECT_FALSE(row.info.weight.empty() || row.info.collective.empty()) << row.name;
  }
}

}  // namespace
}  // namespace dt::nn
