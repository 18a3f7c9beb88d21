#include "dtensor/tests/nn/style_cases.h"

#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/dtensor/dtensor.h"
#include "dtensor/dtensor/executor.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/nn.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/mesh/comm_counter.h"

namespace dt::nn::testing {
namespace {

constexpr double kTol = 1e-5;

absl::StatusOr<DeviceMesh> TpMesh(World& w) {
  return InitDeviceMesh(w.shared_from_this(), {w.size()}, {"tp"});
}

Placement P(const char* text) { return ParsePlacement(text).value(); }

// The full value every parameter is loaded from (same on every rank and process).
absl::StatusOr<Tensor> Weight(absl::string_view name, const Parameter& p) {
  DT_ASSIGN_OR_RETURN(Tensor t, Tensor::Randn(p.shape(), ParameterSeed(11, name)));
  return ops::Mul(t, 0.5);
}

absl::Status CheckGatherBack(Module& m) {
  DT_ASSIGN_OR_RETURN(auto params, GatherParameters(m));
  for (auto& [name, full] : params) {
    DT_ASSIGN_OR_RETURN(Parameter * p, m.GetParameter(name));
    DT_ASSIGN_OR_RETURN(Tensor want, Weight(name, *p));
    if (!Equal(full, want)) {
      return absl::InternalError(absl::StrCat("parameter '", name, "' (", p->Describe(),
                                              ") does not gather back to the bytes it was "
                                              "loaded from"));
    }
  }
  return absl::OkStatus();
}

// `tp` parallelized by `plan`, `ref` unparallelized; both loaded with the same full weights.
absl::Status Twin(Module& tp, Module& ref, const DeviceMesh& mesh, const ParallelPlan& plan) {
  ParallelizeOptions options;
  options.unused_rules = options.uncovered_params = PlanCheck::kIgnore;
  DT_RETURN_IF_ERROR(ParallelizeModule(tp, mesh, plan, options));
  DT_RETURN_IF_ERROR(ReplicateModule(ref, mesh));
  DT_RETURN_IF_ERROR(LoadFullTensors(tp, Weight));
  DT_RETURN_IF_ERROR(LoadFullTensors(ref, Weight));
  return CheckGatherBack(tp);
}

absl::StatusOr<Tensor> Randn(IntSpan shape, uint64_t seed) { return Tensor::Randn(shape, seed); }

absl::StatusOr<Value> Rep(const Tensor& t, const DeviceMesh& mesh) {
  DT_ASSIGN_OR_RETURN(DTensor d, DTensor::FromLocal(t, mesh, {Placement::Replicate()}));
  return Value(std::move(d));
}

absl::StatusOr<Tensor> Piece(const Tensor& full, const DeviceMesh& mesh, const Placement& p) {
  DT_ASSIGN_OR_RETURN(DTensor d, DTensor::Distribute(full, mesh, {p}, std::nullopt));
  return d.ToLocal();
}

// The unparallelized forward on replicated DTensors: the full output.
absl::StatusOr<Tensor> RefForward(Module& ref, const std::vector<Tensor>& inputs,
                                  const DeviceMesh& mesh) {
  Values in;
  for (const Tensor& t : inputs) {
    DT_ASSIGN_OR_RETURN(Value v, Rep(t, mesh));
    in.push_back(std::move(v));
  }
  DT_ASSIGN_OR_RETURN(Value out, ref.CallOne(std::move(in)));
  if (!out.is_dtensor()) return out.local();
  return out.dtensor().FullTensor();
}

// `got` (a DTensor, or a local piece laid out as `layout`) against the full `want`.
absl::Status Expect(absl::string_view what, const Value& got, const Tensor& want,
                    const DeviceMesh& mesh, const Placement& layout) {
  Tensor g, w;
  if (got.is_dtensor()) {
    DT_ASSIGN_OR_RETURN(g, got.dtensor().FullTensor());
    w = want;
  } else {
    g = got.local();
    DT_ASSIGN_OR_RETURN(w, Piece(want, mesh, layout));
  }
  absl::Status s = AllClose(g, w, kTol, kTol);
  if (!s.ok()) {
    return absl::InternalError(
        absl::StrCat(what, " on rank ", mesh.my_rank(), " of ", mesh.Size(), ": ", s.message()));
  }
  return absl::OkStatus();
}

// Runs its children in order (a test model).
class Chain : public Module {
 public:
  Chain() : Module("Chain") {}

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override {
    for (const auto& [name, child] : children()) {
      DT_ASSIGN_OR_RETURN(inputs, child->Call(std::move(inputs)));
    }
    return inputs;
  }
};

// silu between two linears, no bias on `down` (its partial sums are reduced by the parent).
class PartialMLP : public Module {
 public:
  PartialMLP() : Module("PartialMLP") {
    AddModule<Linear>("up", 6, 12, true);
    AddModule<Linear>("down", 12, 6, false);
  }

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override {
    DT_ASSIGN_OR_RETURN(Value h, FindChild("up")->CallOne(std::move(inputs)));
    DT_ASSIGN_OR_RETURN(h, ops::Silu(h));
    return FindChild("down")->Call({h});
  }
};

// Flux2's single-stream pattern: one packed projection [attn (D) | gate (M) | up (M)], split by
// the global ratio (so it works on any rank's piece), SwiGLU, and one packed output projection
// over [attn (D) | mlp (M)].
class FusedBlock : public Module {
 public:
  static constexpr int64_t kH = 8, kD = 12, kM = 24;
  FusedBlock() : Module("FusedBlock") {
    AddModule<Linear>("in_proj", kH, kD + 2 * kM).set_packed_col_blocks({kD, kM, kM});
    AddModule<Linear>("out_proj", kD + kM, kH).set_packed_row_blocks({kD, kM});
  }

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override {
    DT_ASSIGN_OR_RETURN(Value h, FindChild("in_proj")->CallOne(std::move(inputs)));
    const int64_t w = h.shape().back();
    const int64_t a = w * kD / (kD + 2 * kM), m = w * kM / (kD + 2 * kM);
    DT_ASSIGN_OR_RETURN(std::vector<Value> parts, ops::Split(h, {a, m, m}, -1));
    DT_ASSIGN_OR_RETURN(Value act, ops::Silu(parts[1]));
    DT_ASSIGN_OR_RETURN(Value mlp, ops::Mul(act, parts[2]));
    DT_ASSIGN_OR_RETURN(Value cat, ops::Cat({parts[0], mlp}, -1));
    return FindChild("out_proj")->Call({cat});
  }
};

// ---- cases --------------------------------------------------------------------------------------

// A single module under one style: the output for a local and a DTensor input.
// `comm`: the collectives the forward of a local input issues on more than one rank
// (CollectiveCounts::ToString()).
absl::Status OneModule(World& w, const std::function<std::unique_ptr<Module>()>& make,
                       const ParallelPlan& plan, const Tensor& x, const Placement& in_layout,
                       const Placement& out_layout, absl::string_view comm) {
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, TpMesh(w));
  std::unique_ptr<Module> tp = make(), ref = make();
  DT_RETURN_IF_ERROR(Twin(*tp, *ref, mesh, plan));
  DT_ASSIGN_OR_RETURN(Tensor want, RefForward(*ref, {x}, mesh));
  DT_ASSIGN_OR_RETURN(Tensor local_x, Piece(x, mesh, in_layout));
  std::optional<CommCounter> counter(std::in_place);
  DT_ASSIGN_OR_RETURN(Value y, tp->CallOne({Value(local_x)}));
  const std::string issued = counter->counts().ToString();
  counter.reset();
  DT_RETURN_IF_ERROR(Expect("local input", y, want, mesh, out_layout));
  const std::string expected = w.size() > 1 ? std::string(comm) : "none";
  if (issued != expected) {
    return absl::InternalError(
        absl::StrCat("the forward issued ", issued, ", expected ", expected));
  }
  DT_ASSIGN_OR_RETURN(Value xd, Rep(x, mesh));
  DT_ASSIGN_OR_RETURN(y, tp->CallOne({xd}));
  return Expect("replicated DTensor input", y, want, mesh, out_layout);
}

template <typename M, typename... Args>
std::function<std::unique_ptr<Module>()> Make(Args... args) {
  return [=] { return std::unique_ptr<Module>(std::make_unique<M>(args...)); };
}

absl::Status Colwise(World& w) {
  DT_ASSIGN_OR_RETURN(Tensor x, Randn({3, 6}, 1));  // 10 outputs: uneven on 3 and 4 ranks
  return OneModule(w, Make<Linear>(6, 10, true), {{"", "colwise"}}, x, P("R"), P("S(1)"), "none");
}

absl::Status ColwiseGatherOutput(World& w) {
  DT_ASSIGN_OR_RETURN(Tensor x, Randn({2, 3, 6}, 2));
  DT_RETURN_IF_ERROR(OneModule(w, Make<Linear>(6, 12, true), {{"", "colwise_gather_output"}}, x,
                               P("R"), P("R"), "all_gather=1"));
  return OneModule(w, Make<Linear>(6, 12, true), {{"", "colwise_rep"}}, x, P("R"), P("R"),
                   "all_gather=1");
}

absl::Status ColwiseDTensorOutput(World& w) {
  DT_ASSIGN_OR_RETURN(Tensor x, Randn({3, 6}, 3));
  auto style = std::make_shared<ColwiseParallel>(Placement::Replicate(), Placement::Shard(-1),
                                                 /*use_local_output=*/false);
  return OneModule(w, Make<Linear>(6, 10, true), {{"", style}}, x, P("R"), P("S(1)"), "none");
}

absl::Status Rowwise(World& w) {
  DT_ASSIGN_OR_RETURN(Tensor x, Randn({3, 10}, 4));  // 10 inputs: uneven
  return OneModule(w, Make<Linear>(10, 6, true), {{"", "rowwise"}}, x, P("S(1)"), P("R"),
                   "all_reduce=1");
}

absl::Status RowwiseReduceScatter(World& w) {
  DT_ASSIGN_OR_RETURN(Tensor x, Randn({2, 5, 10}, 5));  // sequence 5: uneven reduce_scatter
  auto style = std::make_shared<RowwiseParallel>(Placement::Shard(-1), Placement::Shard(1));
  return OneModule(w, Make<Linear>(10, 6, true), {{"", style}}, x, P("S(2)"), P("S(1)"),
                   "reduce_scatter=1");
}

absl::Status RowwiseSplitInput(World& w) {
  DT_ASSIGN_OR_RETURN(Tensor x, Randn({3, 10}, 6));
  DT_RETURN_IF_ERROR(OneModule(w, Make<Linear>(10, 6, true), {{"", "rowwise_split_input"}}, x,
                               P("R"), P("R"), "all_reduce=1"));
  return OneModule(w, Make<Linear>(10, 6, true), {{"", "rowwise_rep"}}, x, P("R"), P("R"),
                   "all_reduce=1");
}

absl::Status ColwiseThenRowwiseUneven(World& w) {
  // 10 hidden features over up to 4 ranks (3, 3, 3, 1): the local hand-off between the two
  // styles is annotated with the exact global shape (Note [Annotating local inputs]).
  auto make = [] {
    auto c = std::make_unique<Chain>();
    c->AddModule<Linear>("up", 6, 10, true);
    c->AddModule<Linear>("down", 10, 6, true);
    return std::unique_ptr<Module>(std::move(c));
  };
  DT_ASSIGN_OR_RETURN(Tensor x, Randn({4, 6}, 7));
  return OneModule(w, make, {{"up", "colwise"}, {"down", "rowwise"}}, x, P("R"), P("R"),
                   "all_reduce=1");
}

absl::Status SwiGLU(World& w) {
  DT_ASSIGN_OR_RETURN(Tensor x, Randn({2, 3, 8}, 8));
  SwiGLUOptions o{.hidden_size = 8, .intermediate_size = 12, .bias = true};
  DT_RETURN_IF_ERROR(
      OneModule(w, Make<SwiGLUMLP>(o),
                {{"gate_proj", "colwise"}, {"up_proj", "colwise"}, {"down_proj", "rowwise"}}, x,
                P("R"), P("R"), "all_reduce=1"));
  o.fused = true;  // gate_up_proj [2I, H], blocks [I, I] recorded on the Linear
  return OneModule(w, Make<SwiGLUMLP>(o),
                   {{"gate_up_proj", "packed_colwise"}, {"down_proj", "rowwise"}}, x, P("R"),
                   P("R"), "all_reduce=1");
}

absl::Status PackedColwise(World& w) {
  DT_ASSIGN_OR_RETURN(Tensor x, Randn({3, 6}, 9));
  // Two equal halves from the plan (transformers' split factor 2).
  auto halves = std::make_shared<PackedColwiseParallel>(std::vector<int64_t>{1, 1});
  DT_RETURN_IF_ERROR(OneModule(w, Make<Linear>(6, 24, true), {{"", halves}}, x, P("R"),
                               P("_S(1,[12,12])"), "none"));
  // Proportional blocks from the plan (diffusers' PackedColwiseParallel([1, 1, 1, 3, 3])).
  auto flux = std::make_shared<PackedColwiseParallel>(std::vector<int64_t>{1, 1, 1, 3, 3});
  DT_RETURN_IF_ERROR(OneModule(w, Make<Linear>(6, 108, true), {{"", flux}}, x, P("R"),
                               P("_S(1,[12,12,12,36,36])"), "none"));
  // Absolute blocks recorded on the Linear.
  auto make = [] {
    auto l = std::make_unique<Linear>(6, 60, true);
    l->set_packed_col_blocks({12, 24, 24});
    return std::unique_ptr<Module>(std::move(l));
  };
  return OneModule(w, make, {{"", "packed_colwise"}}, x, P("R"), P("_S(1,[12,24,24])"), "none");
}

absl::Status PackedRowwise(World& w) {
  DT_ASSIGN_OR_RETURN(Tensor x, Randn({3, 48}, 10));
  auto make = [] {
    auto l = std::make_unique<Linear>(48, 6, true);
    l->set_packed_row_blocks({12, 36});
    return std::unique_ptr<Module>(std::move(l));
  };
  DT_RETURN_IF_ERROR(
      OneModule(w, make, {{"", "packed_rowwise"}}, x, P("_S(1,[12,36])"), P("R"), "all_reduce=1"));
  auto halves = std::make_shared<PackedRowwiseParallel>(std::vector<int64_t>{1, 1});
  return OneModule(w, Make<Linear>(48, 6, false), {{"", halves}}, x, P("_S(1,[24,24])"), P("R"),
                   "all_reduce=1");
}

absl::Status FusedFlux2Block(World& w) {
  DT_ASSIGN_OR_RETURN(Tensor x, Randn({2, 5, FusedBlock::kH}, 11));
  return OneModule(w, Make<FusedBlock>(),
                   {{"in_proj", "packed_colwise"}, {"out_proj", "packed_rowwise"}}, x, P("R"),
                   P("R"), "all_reduce=1");
}

absl::StatusOr<Tensor> Ids(int64_t vocab) {
  std::vector<int64_t> ids = {0, vocab - 1, 3, 1, 7 % vocab, 2, vocab / 2, vocab - 2, 5, 4};
  return Tensor::FromVector<int64_t>({2, 5}, ids);
}

absl::Status EmbeddingRowwise(World& w) {
  DT_ASSIGN_OR_RETURN(Tensor ids, Ids(11));  // 11 rows: uneven vocab shards
  return OneModule(w, Make<Embedding>(11, 6), {{"", "embedding_rowwise"}}, ids, P("R"), P("R"),
                   "all_reduce=1");
}

absl::Status EmbeddingColwise(World& w) {
  DT_ASSIGN_OR_RETURN(Tensor ids, Ids(10));  // hidden 6: uneven on 4 ranks
  return OneModule(w, Make<Embedding>(10, 6), {{"", "embedding_colwise"}}, ids, P("R"), P("R"),
                   "all_gather=1");
}

absl::Status SequenceParallelNorms(World& w) {
  DT_ASSIGN_OR_RETURN(Tensor x, Randn({2, 5, 8}, 12));  // sequence 5: uneven
  DT_ASSIGN_OR_RETURN(Tensor even, Randn({2, 2 * w.size(), 8}, 13));
  for (bool rms : {true, false}) {
    auto make = rms ? Make<RMSNorm>(8, 1e-6) : Make<LayerNorm>(8, 1e-5);
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, TpMesh(w));
    std::unique_ptr<Module> tp = make(), ref = make();
    DT_RETURN_IF_ERROR(Twin(*tp, *ref, mesh, {{"", "sequence_parallel"}}));
    // Uneven sequence: a DTensor input is redistributed to S(1).
    DT_ASSIGN_OR_RETURN(Tensor want, RefForward(*ref, {x}, mesh));
    DT_ASSIGN_OR_RETURN(Value xd, Rep(x, mesh));
    DT_ASSIGN_OR_RETURN(Value y, tp->CallOne({xd}));
    DT_RETURN_IF_ERROR(Expect("uneven DTensor input", y, want, mesh, P("S(1)")));
    // Even sequence: a local shard is annotated S(1).
    DT_ASSIGN_OR_RETURN(want, RefForward(*ref, {even}, mesh));
    DT_ASSIGN_OR_RETURN(Tensor piece, Piece(even, mesh, P("S(1)")));
    DT_ASSIGN_OR_RETURN(y, tp->CallOne({Value(piece)}));
    DT_RETURN_IF_ERROR(Expect("local shard input", y, want, mesh, P("S(1)")));
  }
  return absl::OkStatus();
}

absl::Status AllReduceAndLocalParams(World& w) {
  // down's weight is placed by its own (param-level) rule; down runs on local tensors
  // (local_params) and gives partial sums, which the root's all_reduce reduces.
  DT_ASSIGN_OR_RETURN(Tensor x, Randn({3, 6}, 14));
  return OneModule(
      w, Make<PartialMLP>(),
      {{"up", "colwise"}, {"down.weight", "rowwise"}, {"down", "local_params"}, {"", "all_reduce"}},
      x, P("R"), P("R"), "all_reduce=1");
}

absl::Status ReplicatedWithGradAllReduce(World& w) {
  DT_ASSIGN_OR_RETURN(Tensor x, Randn({2, 3, 8}, 15));
  return OneModule(w, Make<RMSNorm>(8, 1e-6), {{"", "replicated_with_grad_allreduce"}}, x, P("R"),
                   P("R"), "none");
}

absl::Status MoEExperts(World& w) {
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, TpMesh(w));
  const ExpertsOptions o{
      .num_experts = 3, .hidden_size = 6, .intermediate_size = 12, .num_identity_experts = 1};
  Experts tp(o), ref(o);
  DT_RETURN_IF_ERROR(Twin(tp, ref, mesh,
                          {{"gate_up_proj", "packed_colwise"},
                           {"down_proj", "rowwise"},
                           {"", "moe_tp_experts"},
                           {"identity", "moe_identity_expert"}}));
  DT_ASSIGN_OR_RETURN(Tensor x, Randn({5, 6}, 16));
  // Top-2 picks of 5 tokens among 3 experts and the identity expert (id 3); expert 1 picked by
  // nobody.
  DT_ASSIGN_OR_RETURN(Tensor ids,
                      Tensor::FromVector<int64_t>({5, 2}, {0, 2, 2, 3, 0, 3, 2, 0, 3, 2}));
  DT_ASSIGN_OR_RETURN(Tensor weights, Tensor::Rand({5, 2}, 17));
  DT_ASSIGN_OR_RETURN(Tensor want, RefForward(ref, {x, ids, weights}, mesh));
  DT_ASSIGN_OR_RETURN(Value y, tp.CallOne({Value(x), Value(ids), Value(weights)}));
  return Expect("experts", y, want, mesh, P("R"));
}

absl::StatusOr<Tensor> Positions(int64_t start, int64_t n) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(start + i);
  return Tensor::FromVector<int64_t>({n}, p);
}

// A prefill of 3 tokens and two decode steps through both modules' KV caches (rotary, batch 2,
// hidden 8, head_dim 4, inputs from `seed`): `tp_attn` (plain local inputs, or replicated DTensors
// with `dtensor_flow`) against the unparallelized `ref`, replicated outputs, 5 keys cached.
absl::Status StepThroughKVCache(Attention& tp_attn, Attention& ref, const DeviceMesh& mesh,
                                int seed, bool dtensor_flow = false) {
  RotaryEmbedding rope(4, 10000.0);
  tp_attn.EnableKVCache();
  ref.EnableKVCache();
  int64_t pos = 0;
  for (int64_t len : {3, 1, 1}) {
    DT_ASSIGN_OR_RETURN(Tensor x, Randn({2, len, 8}, seed + pos));
    DT_ASSIGN_OR_RETURN(Tensor positions, Positions(pos, len));
    DT_ASSIGN_OR_RETURN(Value rp, Rep(positions, mesh));
    DT_ASSIGN_OR_RETURN(Values ref_cs, rope.Call({rp}));
    DT_ASSIGN_OR_RETURN(Value xr, Rep(x, mesh));
    DT_ASSIGN_OR_RETURN(Value want_v, ref.CallOne({xr, ref_cs[0], ref_cs[1]}));
    DT_ASSIGN_OR_RETURN(Tensor want, want_v.dtensor().FullTensor());
    Value xin = dtensor_flow ? xr : Value(x);
    DT_ASSIGN_OR_RETURN(Values cs, rope.Call({dtensor_flow ? rp : Value(positions)}));
    DT_ASSIGN_OR_RETURN(Value y, tp_attn.CallOne({xin, cs[0], cs[1]}));
    DT_RETURN_IF_ERROR(Expect(absl::StrCat("attention step at position ", pos), PlainLocal(y),
                              want, mesh, P("R")));
    pos += len;
  }
  if (tp_attn.kv_cache_length() != 5) {
    return absl::InternalError(
        absl::StrCat("kv cache holds ", tp_attn.kv_cache_length(), " keys, want 5"));
  }
  return absl::OkStatus();
}

// GQA with tp KV heads (2 query heads per KV head), rotary, causal, bias; a prefill of 3 tokens
// and two decode steps through the KV cache.
// kv_replicated: k_proj and v_proj stay replicated with 2 KV heads (3·tp query heads each), q_proj
// and o_proj sharded: each rank must pair its query heads with the right KV heads.
// unit_heads (Note [Unit meshes] in nn/styles.h): the heads split into gcd(heads, tp) groups of
// whole heads, each group on tp / gcd ranks. Queries: 12 gated heads colwise (tp 1-4 divide them)
// with 6 KV heads unit_colwise (at tp 4: 2 groups of 3, so ranks 1 and 2 use KV heads their
// neighbours hold too); or, with `unit_queries`, 6 query heads unit_colwise over 3 KV heads and
// o_proj unit_rowwise (at tp 4: 2 query groups, KV heads whole, o_proj reduced over 2 ranks).
absl::Status AttentionUnitHeads(World& w, bool unit_queries) {
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, TpMesh(w));
  AttentionOptions o{.hidden_size = 8, .num_heads = 12, .num_kv_heads = 6, .head_dim = 4,
                     .bias = true, .gated = true};
  ParallelPlan plan = {{"q_proj", "colwise"},
                       {"k_proj", "unit_colwise"},
                       {"v_proj", "unit_colwise"},
                       {"o_proj", "rowwise"}};
  if (unit_queries) {
    o.num_heads = 6;
    o.num_kv_heads = 3;
    o.gated = false;
    plan[0].second = "unit_colwise";
    plan[3].second = "unit_rowwise";
  }
  Attention tp_attn(o), ref(o);
  DT_RETURN_IF_ERROR(Twin(tp_attn, ref, mesh, plan));
  return StepThroughKVCache(tp_attn, ref, mesh, 40);
}

absl::Status AttentionKVCache(World& w, bool dtensor_flow, bool kv_replicated = false) {
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, TpMesh(w));
  const int64_t tp = w.size();
  AttentionOptions o{
      .hidden_size = 8, .num_heads = 2 * tp, .num_kv_heads = tp, .head_dim = 4, .bias = true};
  if (kv_replicated) {
    o.num_heads = 6 * tp;
    o.num_kv_heads = 2;
  }
  Attention tp_attn(o), ref(o);
  ParallelPlan plan = {
      {"q_proj", "colwise"}, {"k_proj", "colwise"}, {"v_proj", "colwise"}, {"o_proj", "rowwise"}};
  if (kv_replicated) plan = {{"q_proj", "colwise"}, {"o_proj", "rowwise"}};
  if (dtensor_flow) {  // DTensors between the projections: sharded heads through the DTensor ops
    auto col =
        std::make_shared<ColwiseParallel>(Placement::Replicate(), Placement::Shard(-1), false);
    auto row =
        std::make_shared<RowwiseParallel>(Placement::Shard(-1), Placement::Replicate(), false);
    plan = {{"q_proj", col}, {"k_proj", col}, {"v_proj", col}, {"o_proj", row}};
  }
  DT_RETURN_IF_ERROR(Twin(tp_attn, ref, mesh, plan));
  return StepThroughKVCache(tp_attn, ref, mesh, 20, dtensor_flow);
}

}  // namespace

std::vector<StyleCase> StyleCases() {
  return {
      {"colwise_uneven", Colwise},
      {"colwise_gather_output", ColwiseGatherOutput},
      {"colwise_dtensor_output", ColwiseDTensorOutput},
      {"rowwise_uneven", Rowwise},
      {"rowwise_reduce_scatter", RowwiseReduceScatter},
      {"rowwise_split_input", RowwiseSplitInput},
      {"colwise_rowwise_uneven_handoff", ColwiseThenRowwiseUneven},
      {"swiglu_mlp", SwiGLU},
      {"packed_colwise", PackedColwise},
      {"packed_rowwise", PackedRowwise},
      {"packed_flux2_single_block", FusedFlux2Block},
      {"embedding_rowwise", EmbeddingRowwise},
      {"embedding_colwise", EmbeddingColwise},
      {"sequence_parallel", SequenceParallelNorms},
      {"all_reduce_local_params", AllReduceAndLocalParams},
      {"replicated_with_grad_allreduce", ReplicatedWithGradAllReduce},
      {"moe_experts_identity", MoEExperts},
      {"attention_gqa_kv_cache", [](World& w) { return AttentionKVCache(w, false); }},
      {"attention_dtensor_flow", [](World& w) { return AttentionKVCache(w, true); }},
      {"attention_replicated_kv_heads",
       [](World& w) { return AttentionKVCache(w, false, /*kv_replicated=*/true); }},
      {"attention_gated_unit_kv_heads", [](World& w) { return AttentionUnitHeads(w, false); }},
      {"attention_unit_query_heads", [](World& w) { return AttentionUnitHeads(w, true); }},
  };
}

}  // namespace dt::nn::testing
