// nn::Attention with gpt-oss's options (sinks, a sliding window, biases) against transformers'
// GptOssAttention (tests/fixtures/attention/attention_goldens.json, tools/reference/
// make_attention_fixtures.py), at tp 1 and 2 on thread ranks (q/k/v colwise, o rowwise: each rank
// uses its own heads' sinks): a prefill, the same tokens through the KV cache in steps, and the
// window given instead as an additive mask input.

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/nn.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/test_util.h"
#include "nlohmann/json.hpp"

namespace dt::nn {
namespace {

using Json = nlohmann::json;

const Json& Layer() {
  static const Json* j = [] {
    std::ifstream in(std::string(DT_FIXTURES_DIR) + "/attention/attention_goldens.json");
    return new Json(Json::parse(in)["gpt_oss_layer"]);
  }();
  return *j;
}

absl::StatusOr<Tensor> FromJson(const Json& values, IntSpan shape) {
  return Tensor::FromDoubles(shape, values.get<std::vector<double>>());
}

// `got` [1, n, H] against rows [from, from + n) of the golden.
absl::Status ExpectRows(absl::string_view what, const Value& got, int64_t from, int rank) {
  const Json& l = Layer();
  const int64_t hidden = l["hidden"];
  const std::vector<double> y = l["y"].get<std::vector<double>>();
  Tensor g;
  if (got.is_dtensor()) {
    DT_ASSIGN_OR_RETURN(g, got.dtensor().FullTensor());
  } else {
    g = PlainLocal(got).local();
  }
  const std::vector<double> gv = g.ToDoubles();
  for (size_t i = 0; i < gv.size(); ++i) {
    const double want = y[from * hidden + i];
    if (!(std::abs(gv[i] - want) <= 2e-5 + 2e-5 * std::abs(want))) {
      return absl::InternalError(absl::StrCat(what, " on rank ", rank, ": element ", i, " is ",
                                              gv[i], ", transformers gives ", want));
    }
  }
  return absl::OkStatus();
}

// With `mask_input`, no window option: the sliding window given as a 0 / -inf mask instead.
absl::Status RunLayer(World& w, bool mask_input) {
  const Json& l = Layer();
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {w.size()}, {"tp"}));
  AttentionOptions o{.hidden_size = l["hidden"],
                     .num_heads = l["heads"],
                     .num_kv_heads = l["kv_heads"],
                     .head_dim = l["head_dim"],
                     .bias = true};
  o.sinks = true;
  const int64_t window = l["window"], tokens = l["tokens"], hidden = o.hidden_size;
  if (!mask_input) o.window = window;
  Attention attn(o);
  if (w.size() > 1) {
    ParallelizeOptions options;
    options.unused_rules = options.uncovered_params = PlanCheck::kIgnore;
    const ParallelPlan plan = {
        {"q_proj", "colwise"}, {"k_proj", "colwise"}, {"v_proj", "colwise"}, {"o_proj", "rowwise"}};
    DT_RETURN_IF_ERROR(ParallelizeModule(attn, mesh, plan, options));
  } else {
    DT_RETURN_IF_ERROR(ReplicateModule(attn, mesh));
  }
  DT_RETURN_IF_ERROR(LoadFullTensors(attn, [&](absl::string_view name, const Parameter& p) {
    return FromJson(l["params"][std::string(name)], p.shape());
  }));
  DT_ASSIGN_OR_RETURN(const Tensor x, FromJson(l["x"], {1, tokens, hidden}));
  // The sliding window of query positions [from, from + n) over keys [0, from + n), as transformers
  // masks it.
  auto mask = [&](int64_t from, int64_t n) -> absl::StatusOr<Value> {
    std::vector<double> m;
    for (int64_t i = from; i < from + n; ++i) {
      for (int64_t j = 0; j < from + n; ++j) m.push_back(j > i - window ? 0.0 : -INFINITY);
    }
    DT_ASSIGN_OR_RETURN(Tensor t, Tensor::FromDoubles({1, 1, n, from + n}, m));
    return Value(std::move(t));
  };
  auto call = [&](int64_t from, int64_t n) -> absl::StatusOr<Value> {
    DT_ASSIGN_OR_RETURN(const Tensor xs, x.Narrow(1, from, n));
    if (!mask_input) return attn.CallOne({Value(xs)});
    DT_ASSIGN_OR_RETURN(Value m, mask(from, n));
    return attn.CallOne({Value(xs), Value(), Value(), m});
  };
  const std::string how = mask_input ? "mask input" : "window option";
  DT_ASSIGN_OR_RETURN(Value y, call(0, tokens));
  DT_RETURN_IF_ERROR(ExpectRows(absl::StrCat("prefill, ", how), y, 0, w.rank()));
  // The same tokens through the KV cache: a prefill of 4 (inside the window), then single steps.
  attn.EnableKVCache();
  for (int64_t from = 0; from < tokens;) {
    const int64_t n = from == 0 ? 4 : 1;
    DT_ASSIGN_OR_RETURN(Value step, call(from, n));
    DT_RETURN_IF_ERROR(
        ExpectRows(absl::StrCat("KV cache step at ", from, ", ", how), step, from, w.rank()));
    from += n;
  }
  return absl::OkStatus();
}

TEST(AttentionOptionsNnTest, GptOssLayerMatchesTransformers) {
  for (const int ranks : {1, 2}) {
    for (const bool mask_input : {false, true}) {
      WorldOptions options;
      options.timeout = std::chrono::seconds(60);
      const absl::Status s = World::RunThreads(
          ranks, [&](World& w) { return RunLayer(w, mask_input); }, options);
      EXPECT_TRUE(s.ok()) << "tp " << ranks << ": " << s;
    }
  }
}

// The Value and DTensor op refuses the options it does not carry, naming them, rather than drop them.
TEST(AttentionOptionsNnTest, ValueOpRefusesTheOptions) {
  const Value q(Tensor::Randn({1, 2, 3, 4}, 1).value());
  ops::AttentionOptions o;
  o.causal = true;
  o.window = 2;
  EXPECT_TRUE(testing::Contains(ops::ScaledDotProductAttention(q, q, q, o).status(),
                                "softcap, window, sinks and mask are taken by the Tensor overloads"));
  o.window.reset();
  EXPECT_TRUE(ops::ScaledDotProductAttention(q, q, q, o).ok());
}

// The options show in the module's repr, and sinks are a parameter of one logit per head.
TEST(AttentionOptionsNnTest, OptionsShowAndSinksAreAParameter) {
  AttentionOptions o{.hidden_size = 16, .num_heads = 4, .num_kv_heads = 2, .head_dim = 4};
  o.scale = 0.25, o.softcap = 50, o.window = 4096, o.sinks = true;
  Attention attn(o);
  EXPECT_TRUE(testing::Contains(attn.ExtraRepr(), "scale=0.25, softcap=50, window=4096, sinks"));
  ASSERT_NE(attn.FindParameter("sinks"), nullptr);
  EXPECT_EQ(attn.FindParameter("sinks")->shape(), (Shape{4}));
}

}  // namespace
}  // namespace dt::nn
