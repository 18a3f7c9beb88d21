// Every guard a new model's plan goes through, with the message it gives (docs/nn.md, "What is
// checked"): packed blocks that must be declared, plain styles refused on packed layers, the
// `replicate` style and the two plan-check switches, and errors that name the module they came
// from (Note [Errors name the module]).
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/nn.h"
#include "dtensor/tests/nn/plan_util.h"
#include "dtensor/tests/test_util.h"

namespace dt::nn {
namespace {

using dt::testing::Contains;
using testing::Tp;
using testing::Quiet;

// attn.c_attn [24, 8] (q | k | v, blocks declared or not), attn.c_proj [8, 8].
class Holder : public Module {
 public:
  explicit Holder(bool declare) : Module("Holder") {
    auto& attn = AddModule<ModuleList>("layers").Append(std::make_unique<ModuleList>());
    auto& c_attn = attn.RegisterModule("c_attn", std::make_unique<Linear>(8, 24, true));
    if (declare) c_attn.set_packed_col_blocks({8, 8, 8});
    auto& c_proj = attn.RegisterModule("c_proj", std::make_unique<Linear>(24, 8));
    if (declare) c_proj.set_packed_row_blocks({8, 16});
  }

 protected:
  absl::StatusOr<Values> Forward(Values in) override { return in; }
};

TEST(PackedGuards, BlocksMustBeDeclaredOnTheModuleOrInThePlan) {
  Holder h(/*declare=*/false);
  absl::Status s = ParallelizeModule(h, Tp(2), {{"layers.*.c_attn", "packed_colwise"}}, Quiet());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "packed_colwise on 'layers.0.c_attn': parameter 'layers.0.c_attn.weight' "
                          "(f32[24, 8]"));
  EXPECT_TRUE(Contains(s, "has no declared packed blocks, so its 24 rows cannot be cut block by "
                          "block (two equal halves would silently mix the projections of a "
                          "three-block q|k|v)"));
  EXPECT_TRUE(Contains(s, "Declare them in the model with `c_attn.set_packed_col_blocks({...})` "
                          "(absolute sizes summing to 24; diffusers' _tp_packed_col_blocks), or in "
                          "the plan with std::make_shared<PackedColwiseParallel>"
                          "(std::vector<int64_t>{1, 1, 1})"));
  EXPECT_FALSE(h.GetParameter("layers.0.c_attn.weight").value()->placed());  // nothing placed

  s = ParallelizeModule(h, Tp(2), {{"layers.*.c_proj", "packed_rowwise"}}, Quiet());
  EXPECT_TRUE(Contains(s, "packed_rowwise on 'layers.0.c_proj': parameter 'layers.0.c_proj.weight'"));
  EXPECT_TRUE(Contains(s, "its 24 columns cannot be cut"));
  EXPECT_TRUE(Contains(s, "`c_proj.set_packed_row_blocks({...})`"));

  // Declared on the module, or given by the plan: placed block by block.
  Holder declared(/*declare=*/true);
  ASSERT_TRUE(ParallelizeModule(declared, Tp(2),
                                {{"layers.*.c_attn", "packed_colwise"},
                                 {"layers.*.c_proj", "packed_rowwise"}},
                                Quiet())
                  .ok());
  EXPECT_EQ(declared.GetParameter("layers.0.c_attn.weight").value()->spec().placements()[0]
                .ToString(),
            "_S(0,[8,8,8])");
  Holder by_plan(/*declare=*/false);
  auto qkv = std::make_shared<PackedColwiseParallel>(std::vector<int64_t>{1, 1, 1});
  EXPECT_TRUE(ParallelizeModule(by_plan, Tp(2), {{"layers.*.c_attn", qkv}}, Quiet()).ok());
}

TEST(PackedGuards, ModulesOtherThanLinearDeclareThroughPackedBlocks) {
  class BareExperts : public Module {  // a fused [E, 2I, H] parameter, no declaration
   public:
    BareExperts() : Module("BareExperts") { RegisterParameter("gate_up", {2, 8, 4}, DType::kF32); }

   protected:
    absl::StatusOr<Values> Forward(Values in) override { return in; }
  } bare;
  EXPECT_TRUE(Contains(ParallelizeModule(bare, Tp(2), {{"gate_up", "packed_colwise"}}, Quiet()),
                       "Declare them in the model with an override of BareExperts::PackedBlocks "
                       "for 'gate_up'"));
  // The built-in Experts declares [I, I] for its gate_up_proj.
  Experts experts(ExpertsOptions{.num_experts = 2, .hidden_size = 4, .intermediate_size = 4});
  ASSERT_TRUE(
      ParallelizeModule(experts, Tp(2), {{"gate_up_proj", "packed_colwise"}}, Quiet()).ok());
  EXPECT_EQ(experts.FindParameter("gate_up_proj")->spec().placements()[0].ToString(),
            "_S(1,[4,4])");
}

TEST(PackedGuards, PlainStylesAreRefusedOnPackedLayers) {
  Holder h(/*declare=*/true);
  absl::Status s = ParallelizeModule(h, Tp(2), {{"layers.*.c_attn", "colwise"}}, Quiet());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "colwise on 'layers.0.c_attn': Linear 'layers.0.c_attn' declares packed "
                          "output blocks [8, 8, 8] (set_packed_col_blocks), and colwise would cut "
                          "parameter 'layers.0.c_attn.weight'"));
  EXPECT_TRUE(Contains(s, "into contiguous slices across the block boundaries; plan it as "
                          "'packed_colwise', which gives every rank its slice of each block"));
  s = ParallelizeModule(h, Tp(2), {{"layers.*.c_proj", "rowwise"}}, Quiet());
  EXPECT_TRUE(Contains(s, "rowwise on 'layers.0.c_proj': Linear 'layers.0.c_proj' declares packed "
                          "input blocks [8, 16] (set_packed_row_blocks)"));
  EXPECT_TRUE(Contains(s, "plan it as 'packed_rowwise'"));
  // The fused MLP and attention of nn/ declare their blocks, so colwise is refused there too.
  SwiGLUMLP fused(SwiGLUOptions{.hidden_size = 4, .intermediate_size = 4, .fused = true});
  EXPECT_TRUE(Contains(ParallelizeModule(fused, Tp(2),
                                         {{"gate_up_proj", "colwise"}, {"down_proj", "rowwise"}},
                                         Quiet()),
                       "plan it as 'packed_colwise'"));
  // Styles that gather the cut dim right away stay correct on packed layers.
  EXPECT_TRUE(ParallelizeModule(h, Tp(2),
                                {{"layers.*.c_attn", "colwise_gather_output"},
                                 {"layers.*.c_proj", "rowwise_split_input"}},
                                Quiet())
                  .ok());
}

// ---- replicate and the two plan checks ---------------------------------------------------------

class Net : public Module {  // blocks.{0,1}.{norm, up, down}
 public:
  Net() : Module("Net") {
    auto& blocks = AddModule<ModuleList>("blocks");
    for (int i = 0; i < 2; ++i) {
      auto& b = blocks.Append(std::make_unique<ModuleList>());
      b.RegisterModule("norm", std::make_unique<LayerNorm>(4));
      b.RegisterModule("up", std::make_unique<Linear>(4, 8));
      b.RegisterModule("down", std::make_unique<Linear>(8, 4));
    }
  }

 protected:
  absl::StatusOr<Values> Forward(Values in) override { return in; }
};

TEST(PlanChecks, ReplicateCoversParametersOnPurpose) {
  std::vector<std::string> warnings;
  ScopedLogSink capture([&](LogLevel, absl::string_view m) { warnings.emplace_back(m); });
  Net net;
  ASSERT_TRUE(ParallelizeModule(net, Tp(2),
                                {{"blocks.*.up", "colwise"},
                                 {"blocks.*.down", "rowwise"},
                                 {"blocks.*.norm", "replicate"}})
                  .ok());
  EXPECT_TRUE(warnings.empty()) << warnings[0];
  EXPECT_EQ(net.GetParameter("blocks.1.norm.weight").value()->spec().placements()[0].ToString(),
            "R");
  EXPECT_EQ(net.GetSubmodule("blocks.1.norm").value()->tp_style(), "replicate");
  EXPECT_TRUE(Contains(FormatStylesTable(), "replicated on purpose"));
}

TEST(PlanChecks, UnusedRulesAndUncoveredParametersAreSeparateSwitches) {
  std::vector<std::string> warnings;
  ScopedLogSink capture([&](LogLevel, absl::string_view m) { warnings.emplace_back(m); });
  const ParallelPlan typo = {{"blocks.*.upp", "colwise"}, {"blocks.*.down", "rowwise"}};
  {  // Defaults: both warn.
    Net net;
    ASSERT_TRUE(ParallelizeModule(net, Tp(2), typo).ok());
    ASSERT_EQ(warnings.size(), 2u);
    EXPECT_EQ(warnings[0],
              "The following TP rules were not applied on any of the layers: [blocks.*.upp]");
    EXPECT_TRUE(Contains(warnings[1], "The following layers were not sharded by the TP plan: "
                                      "[blocks.*.norm.weight, blocks.*.norm.bias, "
                                      "blocks.*.up.weight]"));
  }
  warnings.clear();
  {  // Norms replicated on purpose: the uncovered check off, the typo still reported.
    Net net;
    ParallelizeOptions o;
    o.uncovered_params = PlanCheck::kIgnore;
    ASSERT_TRUE(ParallelizeModule(net, Tp(2), typo, o).ok());
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_TRUE(Contains(warnings[0], "[blocks.*.upp]"));
  }
  warnings.clear();
  {  // Either can be an error, before anything is placed.
    Net net;
    ParallelizeOptions o;
    o.unused_rules = PlanCheck::kError;
    const absl::Status s = ParallelizeModule(net, Tp(2), typo, o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(
        s, "Net: The following TP rules were not applied on any of the layers: [blocks.*.upp]"));
    EXPECT_FALSE(net.GetParameter("blocks.0.down.weight").value()->placed());
    o = ParallelizeOptions();
    o.unused_rules = PlanCheck::kIgnore;
    o.uncovered_params = PlanCheck::kError;
    EXPECT_TRUE(Contains(ParallelizeModule(net, Tp(2), typo, o),
                         "Net: The following layers were not sharded by the TP plan: "
                         "[blocks.*.norm.weight"));
    EXPECT_TRUE(warnings.empty());
  }
}

// ---- errors name the module ---------------------------------------------------------------------

// h.0.{ln, mlp (MLP c_fc / c_proj)}: the forward of a GPT-2 block's MLP half.
class Gpt2Half : public Module {
 public:
  Gpt2Half() : Module("Gpt2Half") {
    auto& block = AddModule<ModuleList>("h").Append(std::make_unique<ModuleList>());
    block.RegisterModule("mlp", std::make_unique<MLP>(MLPOptions{.hidden_size = 8,
                                                                 .intermediate_size = 32,
                                                                 .up_name = "c_fc",
                                                                 .down_name = "c_proj"}));
  }

 protected:
  absl::StatusOr<Values> Forward(Values in) override {
    return GetSubmodule("h.0.mlp").value()->Call(std::move(in));
  }
};

TEST(ModulePath, AMistypedPlanKeyEndsInAnErrorNamingTheLayer) {
  std::vector<std::string> warnings;
  ScopedLogSink capture([&](LogLevel, absl::string_view m) { warnings.emplace_back(m); });
  ASSERT_TRUE(World::RunThreads(2, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {2}, {"tp"}));
    Gpt2Half model;
    DT_RETURN_IF_ERROR(ParallelizeModule(
        model, mesh, {{"h.*.mlp.cfc", "colwise"}, {"h.*.mlp.c_proj", "rowwise"}}));
    DT_RETURN_IF_ERROR(InitRandom(model, 1));
    DT_ASSIGN_OR_RETURN(Tensor x, Tensor::Randn({2, 3, 8}, 2));
    const absl::Status s = model.Call({x}).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(s, "h.0.mlp.c_proj: rowwise on 'h.0.mlp.c_proj' expects this rank's slice "
                            "of its 32 input features (16 here, weight f32[8, 32] [S(1)] on "
                            "mesh(tp=2)"));
    EXPECT_TRUE(Contains(s, "but got local f32[2, 3, 32]"));
    EXPECT_TRUE(Contains(s, "Is the layer that produces it sharded colwise? Check that its plan "
                            "rule exists and that the key is spelled right"));
    EXPECT_TRUE(absl::StartsWith(s.message(), "h.0.mlp.c_proj: rowwise")) << s.message();
    return absl::OkStatus();
  }).ok());
  // ... and the plan check had already pointed at the key.
  EXPECT_FALSE(warnings.empty());
  EXPECT_TRUE(Contains(warnings[0], "not applied on any of the layers: [h.*.mlp.cfc]"));
}

TEST(ModulePath, TheInnermostModuleNamesItselfOnce) {
  class Bad : public Module {  // adds tensors of different shapes
   public:
    Bad() : Module("Bad") {}

   protected:
    absl::StatusOr<Values> Forward(Values in) override {
      DT_ASSIGN_OR_RETURN(Tensor other, Tensor::Zeros({5}));
      DT_ASSIGN_OR_RETURN(Value y, ops::Add(in[0], Value(other)));
      return Values{y};
    }
  };
  class Outer : public Module {
   public:
    Outer() : Module("Outer") {
      AddModule<ModuleList>("blocks").Append(std::make_unique<ModuleList>()).Append(
          std::make_unique<Bad>());
    }

   protected:
    absl::StatusOr<Values> Forward(Values in) override {
      if (in.empty()) return absl::InvalidArgumentError("no input");  // the root's own error
      return GetSubmodule("blocks.0.0").value()->Call(std::move(in));
    }
  } outer;
  const Tensor x = Tensor::Zeros({2, 3}).value();
  const absl::Status s = outer.Call({x}).status();
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StartsWith(s.message(), "blocks.0.0: ")) << s;
  EXPECT_FALSE(Contains(s.message(), "blocks.0.0: blocks.0.0"));
  EXPECT_FALSE(Contains(s.message(), "Outer"));
  const absl::Status root = outer.Call({}).status();
  EXPECT_EQ(root.message(), "Outer: no input");  // the root is named by its type
  EXPECT_EQ(s.ToString(), absl::StrCat("INVALID_ARGUMENT: ", s.message()));  // no payload noise
}

TEST(ModulePath, LearnedPositionsPastTheTable) {
  class Gpt : public Module {
   public:
    Gpt() : Module("Gpt") { AddModule<LearnedPositionEmbedding>("wpe", 6, 3); }

   protected:
    absl::StatusOr<Values> Forward(Values in) override { return FindChild("wpe")->Call(in); }
  } gpt;
  ASSERT_TRUE(ReplicateModule(gpt, Tp(1)).ok());
  const Tensor x = Tensor::Zeros({1, 7, 3}).value();
  EXPECT_TRUE(Contains(gpt.Call({x}).status(),
                       "wpe: LearnedPositionEmbedding: position 6 is outside the table of 6 "
                       "learned positions (the sequence is longer than max_position_embeddings "
                       "6)"));
}

}  // namespace
}  // namespace dt::nn
