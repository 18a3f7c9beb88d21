// Every rope_type transformers' Llama accepts, against transformers 5.24's LlamaRotaryEmbedding
// (tests/fixtures/rope/rope_goldens.json, tools/reference/make_rope_fixtures.py): the tables,
// their sequence-length updates (dynamic, longrope) in call order, and the cos/sin that
// nn::RotaryEmbedding computes from them (the Llama model's rotary module).

#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "dtensor/loaders/hf_config.h"
#include "dtensor/loaders/rope.h"
#include "dtensor/nn/attention.h"
#include "nlohmann/json.hpp"

namespace dt::loaders {
namespace {

using Json = nlohmann::json;

Json Goldens() {
  std::ifstream in(std::string(DT_FIXTURES_DIR) + "/rope/rope_goldens.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return Json::parse(ss.str());
}

// A case's config.json: the generator's fields are LlamaConfig's (a config must name its model:
// Note [Which model a config describes] in loaders/hf_config_read.cc).
std::string ConfigJson(const Json& c) {
  Json config = c["config"];
  config["model_type"] = "llama";
  return config.dump();
}

// f32 results within a few ulps of torch's (pow and cos/sin may round differently).
void ExpectClose(const std::vector<float>& got, const Json& want, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = want[i].get<double>();
    EXPECT_NEAR(got[i], w, rel * std::max(1.0, std::abs(w))) << what << " [" << i << "]";
  }
}

TEST(Rope, EveryTypeMatchesTransformers) {
  const Json g = Goldens();
  ASSERT_GE(g["cases"].size(), 9u);
  for (const Json& c : g["cases"]) {
    const std::string name = c["name"];
    absl::StatusOr<LlamaConfig> config = ParseLlamaConfig(ConfigJson(c), name);
    ASSERT_TRUE(config.ok()) << config.status();
    RopeSchedule schedule(LlamaRopeSpec(*config));
    // The module the Llama model uses, fed the same schedule semantics (its own instance).
    auto module_schedule = std::make_shared<RopeSchedule>(LlamaRopeSpec(*config));
    nn::RotaryEmbedding rotary(
        [module_schedule](int64_t n) {
          const RopeTable& t = n > 0 ? module_schedule->ForLength(n) : module_schedule->current();
          return nn::RotaryTable{t.inv_freq, t.attention_scaling};
        },
        name);
    for (const Json& call : c["calls"]) {
      const int64_t s = call["seq_len"];
      const std::string what = absl::StrCat(name, " seq_len ", s);
      const RopeTable& t = schedule.ForLength(s);
      ExpectClose(t.inv_freq, call["inv_freq"], 4e-7, what + " inv_freq");
      EXPECT_NEAR(t.attention_scaling, call["attention_scaling"].get<double>(), 1e-7) << what;

      std::vector<int64_t> pos(s);
      for (int64_t i = 0; i < s; ++i) pos[i] = i;
      absl::StatusOr<Tensor> p = Tensor::FromVector<int64_t>({s}, pos);
      ASSERT_TRUE(p.ok());
      absl::StatusOr<Values> cs = rotary.Call({Value(*p)});
      ASSERT_TRUE(cs.ok()) << cs.status();
      const std::vector<float> cos = (*cs)[0].local().ToVector<float>();
      const std::vector<float> sin = (*cs)[1].local().ToVector<float>();
      const int64_t d = config->head_dim;
      for (size_t k = 0; k < call["positions"].size(); ++k) {
        const int64_t at = call["positions"][k];
        // Angles reach position · inv_freq ~ 300 rad: f32 cos/sin of them agree to ~1e-5.
        ExpectClose(std::vector<float>(cos.begin() + at * d, cos.begin() + (at + 1) * d), call["cos"][k], 3e-5,
                    absl::StrCat(what, " cos at ", at));
        ExpectClose(std::vector<float>(sin.begin() + at * d, sin.begin() + (at + 1) * d), call["sin"][k], 3e-5,
                    absl::StrCat(what, " sin at ", at));
      }
    }
  }
}

TEST(Rope, ConfigsRoundTripThroughJson) {
  const Json g = Goldens();  // not `: Goldens()["cases"]`: the temporary would die before the loop
  for (const Json& c : g["cases"]) {
    const std::string name = c["name"];
    LlamaConfig config = ParseLlamaConfig(ConfigJson(c), name).value();
    absl::StatusOr<LlamaConfig> back = ParseLlamaConfig(LlamaConfigToJson(config), name + " (written)");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, config) << name;
  }
}

}  // namespace
}  // namespace dt::loaders
