// The Module tree (names, lookups, hooks, local values), parameters as placeholders, and
// materialization (loader-style per-rank ranges, full tensors, random init).
#include <memory>
#include <string>
#include <vector>

#include "dtensor/core/quant.h"
#include "dtensor/dtensor/executor.h"
#include "gtest/gtest.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/nn.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/test_util.h"
#include "dtensor/mesh/comm_counter.h"

namespace dt::nn {
namespace {

using dt::testing::Contains;

// A two-layer decoder-like model: embed, layers.{0,1}.{self_attn, mlp, norm}, norm.
class Layer : public Module {
 public:
  Layer() : Module("Layer") {
    AddModule<Attention>("self_attn", AttentionOptions{.hidden_size = 8, .num_heads = 4,
                                                       .num_kv_heads = 2});
    AddModule<SwiGLUMLP>("mlp", SwiGLUOptions{.hidden_size = 8, .intermediate_size = 16});
    AddModule<RMSNorm>("norm", 8);
  }

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override { return inputs; }
};

class Model : public Module {
 public:
  Model() : Module("Model") {
    AddModule<Embedding>("embed", 32, 8);
    auto& layers = AddModule<ModuleList>("layers");
    layers.Append(std::make_unique<Layer>());
    layers.Append(std::make_unique<Layer>());
    AddModule<RMSNorm>("norm", 8);
  }

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override { return inputs; }
};

std::vector<std::string> Names(const std::vector<std::pair<std::string, Parameter*>>& v) {
  std::vector<std::string> out;
  for (const auto& [n, p] : v) out.push_back(n);
  return out;
}

TEST(ModuleTree, DottedNamesInRegistrationOrder) {
  Model m;
  const std::vector<std::string> names = Names(m.NamedParameters());
  ASSERT_EQ(names.size(), 1 + 2 * 8 + 1u);
  EXPECT_EQ(names[0], "embed.weight");
  EXPECT_EQ(names[1], "layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(names[4], "layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(names[5], "layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(names[8], "layers.0.norm.weight");
  EXPECT_EQ(names[9], "layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(names.back(), "norm.weight");

  auto modules = m.NamedModules();
  EXPECT_EQ(modules[0].first, "");
  EXPECT_EQ(modules[1].first, "embed");
  EXPECT_EQ(modules[2].first, "layers");
  EXPECT_EQ(modules[3].first, "layers.0");
  EXPECT_EQ(modules[3].second->type_name(), "Layer");

  Module* q = m.GetSubmodule("layers.1.self_attn.q_proj").value();
  EXPECT_EQ(q->FullName(), "layers.1.self_attn.q_proj");
  EXPECT_EQ(q->type_name(), "Linear");
  Parameter* w = m.GetParameter("layers.1.self_attn.k_proj.weight").value();
  EXPECT_EQ(w->FullName(), "layers.1.self_attn.k_proj.weight");
  EXPECT_EQ(w->shape(), Shape({4, 8}));  // 2 KV heads of 2
  EXPECT_EQ(static_cast<ModuleList*>(m.GetSubmodule("layers").value())->size(), 2);

  auto missing = m.GetSubmodule("layers.2.mlp");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(std::string(missing.status().message()), "has no child '2'"));
  auto no_param = m.GetParameter("layers.0.mlp.down_proj.bias");
  EXPECT_TRUE(Contains(std::string(no_param.status().message()), "no parameter 'bias'"));
}

TEST(ModuleTree, LayerNormWithoutAffineHasNoParameters) {
  LayerNorm ln(8, 1e-6, /*elementwise_affine=*/false);
  EXPECT_TRUE(ln.NamedParameters().empty());
  Linear l(4, 3, /*bias=*/true);
  EXPECT_EQ(Names(l.NamedParameters()), (std::vector<std::string>{"weight", "bias"}));
}

TEST(ModuleTree, ModuleListHasNoForward) {
  ModuleList list;
  auto r = list.Call({});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Parameters, PlaceholdersCarryOnlyTheSpec) {
  const DeviceMesh mesh = DeviceMesh::Abstract({4}, {"tp"}, /*rank=*/2).value();
  Linear l(6, 10);
  Parameter& w = *l.FindParameter("weight");
  EXPECT_TRUE(Contains(w.Describe(), "not placed"));
  ASSERT_TRUE(w.Place(mesh, {Placement::Shard(0)}).ok());
  EXPECT_TRUE(w.placed());
  EXPECT_FALSE(w.materialized());
  EXPECT_EQ(w.Describe(), "f32[10, 6] [S(0)] on mesh(tp=4) (placeholder)");
  // Rank 2 of 4 will hold rows [6, 9): a loader reads only those.
  EXPECT_EQ(RangesToString(w.spec().Ranges()[0]), "[6, 9)");

  auto v = l.ParamValue("weight");
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(std::string(v.status().message()), "'weight' is not materialized"));

  Linear fresh(6, 10, true);
  EXPECT_FALSE(fresh.FindParameter("bias")->placed());
}

TEST(Parameters, SetChecksShapeAndSpec) {
  ASSERT_TRUE(World::RunThreads(1, [](World& world) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(world.shared_from_this(), {1}, {"tp"}));
    Linear l(3, 2);
    Parameter& w = *l.FindParameter("weight");
    DT_ASSIGN_OR_RETURN(Tensor wrong, Tensor::Zeros({3, 2}));
    DT_ASSIGN_OR_RETURN(DTensor d, DTensor::FromLocal(wrong, mesh, {Placement::Replicate()}));
    absl::Status s = w.Set(d);
    EXPECT_TRUE(Contains(s.message(), "parameter 'weight': expected f32[2, 3], got f32[3, 2]"));
    DT_RETURN_IF_ERROR(w.Place(mesh, {Placement::Shard(0)}));
    DT_ASSIGN_OR_RETURN(Tensor right, Tensor::Zeros({2, 3}));
    DT_ASSIGN_OR_RETURN(DTensor r, DTensor::FromLocal(right, mesh, {Placement::Replicate()}));
    s = w.Set(r);
    EXPECT_TRUE(Contains(s.message(), "expected f32[2, 3] [S(0)]"));
    return absl::OkStatus();
  }).ok());
}

// A loader that reads only this rank's index ranges (spec.Ranges()) equals cutting the full
// tensor, for plain and interleaved (packed) placements.
TEST(Materialize, LoaderRangesEqualFullTensorCut) {
  ASSERT_TRUE(World::RunThreads(3, [](World& world) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(world.shared_from_this(), {3}, {"tp"}));
    auto make = [] {
      auto l = std::make_unique<Linear>(6, 45, true);
      l->set_packed_col_blocks({9, 9, 27});
      return l;
    };
    auto by_ranges = make(), by_full = make();
    ParallelizeOptions quiet;
    quiet.unused_rules = quiet.uncovered_params = PlanCheck::kIgnore;
    for (Module* m : {static_cast<Module*>(by_ranges.get()), static_cast<Module*>(by_full.get())}) {
      DT_RETURN_IF_ERROR(ParallelizeModule(*m, mesh, {{"", "packed_colwise"}}, quiet));
    }
    auto full_of = [](absl::string_view name, IntSpan shape) {
      return Tensor::Randn(shape, ParameterSeed(3, name));
    };
    int reads = 0;
    DT_RETURN_IF_ERROR(MaterializeParameters(
        *by_ranges, [&](absl::string_view name, const DTensorSpec& spec) -> absl::StatusOr<Tensor> {
          ++reads;
          DT_ASSIGN_OR_RETURN(Tensor full, full_of(name, spec.shape()));  // stands for the file
          return SliceRanges(full, spec.Ranges());
        }));
    DT_RETURN_IF_ERROR(LoadFullTensors(*by_full, [&](absl::string_view name, const Parameter& p) {
      return full_of(name, p.shape());
    }));
    EXPECT_EQ(reads, 2);
    for (const char* name : {"weight", "bias"}) {
      const DTensor& a = by_ranges->FindParameter(name)->value();
      const DTensor& b = by_full->FindParameter(name)->value();
      EXPECT_EQ(a.placements()[0].ToString(), "_S(0,[9,9,27])");
      EXPECT_TRUE(Equal(a.ToLocal(), b.ToLocal())) << name;
      EXPECT_EQ(a.ToLocal().size(0), 15);  // 3 + 3 + 9 rows
    }
    return absl::OkStatus();
  }).ok());
}

// InitRandom on sharded placements gives the same global weights as on replicated ones.
TEST(Materialize, InitRandomIsPlacementIndependent) {
  ASSERT_TRUE(World::RunThreads(4, [](World& world) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(world.shared_from_this(), {4}, {"tp"}));
    SwiGLUOptions o{.hidden_size = 6, .intermediate_size = 8, .bias = true, .fused = true};
    SwiGLUMLP tp(o), ref(o);
    ParallelizeOptions quiet;
    quiet.unused_rules = quiet.uncovered_params = PlanCheck::kIgnore;
    DT_RETURN_IF_ERROR(ParallelizeModule(
        tp, mesh, {{"gate_up_proj", "packed_colwise"}, {"down_proj", "rowwise"}}, quiet));
    DT_RETURN_IF_ERROR(ReplicateModule(ref, mesh));
    DT_RETURN_IF_ERROR(InitRandom(tp, 5));
    DT_RETURN_IF_ERROR(InitRandom(ref, 5));
    DT_ASSIGN_OR_RETURN(auto a, GatherParameters(tp));
    DT_ASSIGN_OR_RETURN(auto b, GatherParameters(ref));
    EXPECT_FALSE(a.empty());
    EXPECT_EQ(a.size(), b.size());
    if (a.empty() || a.size() != b.size()) return absl::InternalError("parameter lists differ");
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].first, b[i].first);
      EXPECT_TRUE(Equal(a[i].second, b[i].second)) << a[i].first;
    }
    return absl::OkStatus();
  }).ok());
}

// Parallelizing a module whose weights are already loaded (diffusers' enable_parallelism flow)
// cuts each rank's piece locally: Replicate -> Shard moves no data between ranks.
TEST(Materialize, PlacingLoadedParametersCutsLocally) {
  ASSERT_TRUE(World::RunThreads(2, [](World& world) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(world.shared_from_this(), {2}, {"tp"}));
    Linear l(4, 6, true), fresh(4, 6, true);
    DT_RETURN_IF_ERROR(ReplicateModule(l, mesh));
    DT_RETURN_IF_ERROR(InitRandom(l, 9));
    ParallelizeOptions quiet;
    quiet.unused_rules = quiet.uncovered_params = PlanCheck::kIgnore;
    CommCounter counter;
    DT_RETURN_IF_ERROR(ParallelizeModule(l, mesh, {{"", "colwise"}}, quiet));
    EXPECT_EQ(counter.counts().ToString(), "none");
    DT_RETURN_IF_ERROR(ParallelizeModule(fresh, mesh, {{"", "colwise"}}, quiet));
    DT_RETURN_IF_ERROR(InitRandom(fresh, 9));
    for (const char* name : {"weight", "bias"}) {
      EXPECT_EQ(l.FindParameter(name)->spec(), fresh.FindParameter(name)->spec());
      EXPECT_TRUE(Equal(l.FindParameter(name)->value().ToLocal(),
                        fresh.FindParameter(name)->value().ToLocal()))
          << name;
    }
    return absl::OkStatus();
  }).ok());
}

TEST(Forward, HooksWrapTheForwardAndCanBeRemoved) {
  ASSERT_TRUE(World::RunThreads(1, [](World& world) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(world.shared_from_this(), {1}, {"tp"}));
    Linear l(3, 2, true);
    DT_RETURN_IF_ERROR(ReplicateModule(l, mesh));
    DT_RETURN_IF_ERROR(InitRandom(l, 1));
    DT_ASSIGN_OR_RETURN(Tensor x, Tensor::Randn({4, 3}, 2));
    std::vector<std::string> trace;
    const HookId pre = l.RegisterForwardPreHook([&](Module& m, Values& in) -> absl::Status {
      trace.push_back("pre " + m.type_name());
      DT_ASSIGN_OR_RETURN(in[0], ops::Mul(in[0], 2.0));
      return absl::OkStatus();
    });
    const HookId post =
        l.RegisterForwardHook([&](Module&, const Values& in, Values& out) -> absl::Status {
          trace.push_back("post");
          DT_ASSIGN_OR_RETURN(out[0], ops::Mul(out[0], -1.0));
          return absl::OkStatus();
        });
    DT_ASSIGN_OR_RETURN(Value y, l.CallOne({Value(x)}));
    EXPECT_EQ(trace, (std::vector<std::string>{"pre Linear", "post"}));
    DT_ASSIGN_OR_RETURN(Tensor x2, ops::Mul(x, 2.0));
    DT_ASSIGN_OR_RETURN(Tensor want, ops::Linear(x2, l.FindParameter("weight")->value().ToLocal(),
                                                 l.FindParameter("bias")->value().ToLocal()));
    DT_ASSIGN_OR_RETURN(want, ops::Neg(want));
    EXPECT_TRUE(AllClose(y.local(), want).ok());
    EXPECT_TRUE(l.RemoveHook(pre));
    EXPECT_TRUE(l.RemoveHook(post));
    EXPECT_FALSE(l.RemoveHook(post));
    DT_ASSIGN_OR_RETURN(y, l.CallOne({Value(x)}));
    EXPECT_EQ(trace.size(), 2u);
    return absl::OkStatus();
  }).ok());
}

// CallLinears (Note [Sibling projections] in ops/local/ops.h): quantized siblings computed
// together give what each layer's call gives; a layer with a hook is called, hook and all.
TEST(Forward, SiblingLinearsEqualTheirCalls) {
  ASSERT_TRUE(World::RunThreads(1, [](World& world) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(world.shared_from_this(), {1}, {"tp"}));
    Linear q(256, 96), k(256, 32), v(256, 32);
    uint64_t seed = 7;
    for (Linear* l : {&q, &k, &v}) {
      Parameter* w = l->FindParameter("weight");
      DT_RETURN_IF_ERROR(w->SetDType(DType::kQ4_1));
      DT_RETURN_IF_ERROR(ReplicateModule(*l, mesh));
      DT_ASSIGN_OR_RETURN(Tensor blocks, RandomQuantized(DType::kQ4_1, w->shape(), seed++));
      DT_ASSIGN_OR_RETURN(DTensor value, DTensor::FromLocal(blocks, mesh, {Placement::Replicate()}));
      DT_RETURN_IF_ERROR(w->Set(std::move(value)));
    }
    DT_ASSIGN_OR_RETURN(Tensor x, Tensor::Randn({1, 2, 256}, 3));
    auto expect_calls = [&](const std::vector<Value>& got) -> absl::Status {
      EXPECT_EQ(got.size(), 3u);
      for (Linear* l : {&q, &k, &v}) {
        DT_ASSIGN_OR_RETURN(Value one, l->CallOne({Value(x)}));
        EXPECT_TRUE(Equal(got[l == &q ? 0 : l == &k ? 1 : 2].local(), one.local()));
      }
      return absl::OkStatus();
    };
    DT_ASSIGN_OR_RETURN(std::vector<Value> together, CallLinears({&q, &k, &v}, Value(x)));
    DT_RETURN_IF_ERROR(expect_calls(together));
    int calls = 0;
    k.RegisterForwardHook([&](Module&, const Values&, Values& out) -> absl::Status {
      ++calls;
      DT_ASSIGN_OR_RETURN(out[0], ops::Mul(out[0], -1.0));
      return absl::OkStatus();
    });
    DT_ASSIGN_OR_RETURN(std::vector<Value> hooked, CallLinears({&q, &k, &v}, Value(x)));
    EXPECT_EQ(calls, 1);
    DT_RETURN_IF_ERROR(expect_calls(hooked));
    return absl::OkStatus();
  }).ok());
}

// Note [Local values]: a replicated module fed local tensors computes locally; fed DTensors it
// returns DTensors; the two kinds never mix silently.
TEST(Forward, LocalAndDTensorValues) {
  ASSERT_TRUE(World::RunThreads(2, [](World& world) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(world.shared_from_this(), {2}, {"tp"}));
    RMSNorm norm(4);
    DT_RETURN_IF_ERROR(ReplicateModule(norm, mesh));
    DT_RETURN_IF_ERROR(InitRandom(norm, 3));
    DT_ASSIGN_OR_RETURN(Tensor x, Tensor::Randn({2, 4}, 4));
    DT_ASSIGN_OR_RETURN(Value local, norm.CallOne({Value(x)}));
    EXPECT_TRUE(local.is_local());
    DT_ASSIGN_OR_RETURN(DTensor xd, DTensor::FromLocal(x, mesh, {Placement::Replicate()}));
    DT_ASSIGN_OR_RETURN(Value dist, norm.CallOne({Value(xd)}));
    EXPECT_TRUE(dist.is_dtensor());
    EXPECT_TRUE(Equal(local.local(), dist.local()));

    auto mixed = ops::Add(Value(x), Value(xd));
    EXPECT_EQ(mixed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(std::string(mixed.status().message()), "Add: a is local f32[2, 4]"));
    return absl::OkStatus();
  }).ok());
}

// A sharded parameter is not handed out to a forward that merely received local inputs: that
// would silently compute this rank's partial result.
TEST(Forward, ShardedParametersNeedAStyleForLocalInputs) {
  ASSERT_TRUE(World::RunThreads(2, [](World& world) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(world.shared_from_this(), {2}, {"tp"}));
    Linear param_rule_only(4, 2);
    ParallelizeOptions quiet;
    quiet.unused_rules = quiet.uncovered_params = PlanCheck::kIgnore;
    DT_RETURN_IF_ERROR(ParallelizeModule(param_rule_only, mesh, {{"weight", "rowwise"}}, quiet));
    DT_RETURN_IF_ERROR(InitRandom(param_rule_only, 1));
    DT_ASSIGN_OR_RETURN(Tensor x, Tensor::Randn({3, 2}, 2));
    auto y = param_rule_only.CallOne({Value(x)});
    EXPECT_EQ(y.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Contains(y.status(), "parameter 'weight' is sharded (f32[2, 4] [S(1)]"));
    return absl::OkStatus();
  }).ok());
}

TEST(Forward, ToStringShowsStylesAndPlacements) {
  const DeviceMesh mesh = DeviceMesh::Abstract({2}, {"tp"}).value();
  SwiGLUMLP mlp(SwiGLUOptions{.hidden_size = 4, .intermediate_size = 6});
  ParallelizeOptions quiet;
  quiet.unused_rules = quiet.uncovered_params = PlanCheck::kIgnore;
  ASSERT_TRUE(ParallelizeModule(mlp, mesh,
                                {{"gate_proj", "colwise"}, {"up_proj", "colwise"},
                                 {"down_proj", "rowwise"}},
                                quiet)
                  .ok());
  const std::string s = mlp.ToString();
  EXPECT_TRUE(Contains(s, "(gate_proj): Linear(in=4, out=6, bias=false) [colwise]"));
  EXPECT_TRUE(Contains(s, "weight: f32[4, 6] [S(1)] on mesh(tp=2) (placeholder)"));
}

}  // namespace
}  // namespace dt::nn
