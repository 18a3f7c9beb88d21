#pragma once
// Shared by the Llama tests: fixture paths, transformers' golden outputs, comparisons.
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/tensor.h"
#include "nlohmann/json.hpp"

namespace dt::nn::testing {

inline std::string FixtureDir(const std::string& name) {
  return std::string(DT_FIXTURES_DIR) + "/" + name;
}

// tests/fixtures/<name>/golden.json (tools/reference/make_llama_fixtures.py).
struct Golden {
  std::vector<int64_t> prompt;
  int64_t vocab = 0;
  struct Run {
    std::vector<float> prompt_logits;  // [prompt, vocab]
    std::vector<int64_t> greedy_tokens;
    std::vector<float> last_step_logits;  // [vocab], the logits that picked the last token
  };
  Run f32, bf16;
  bool has_bf16 = false;
};

inline Golden LoadGolden(const std::string& fixture) {
  std::ifstream in(FixtureDir(fixture) + "/golden.json");
  nlohmann::json j = nlohmann::json::parse(in);
  Golden g;
  g.prompt = j["prompt"].get<std::vector<int64_t>>();
  auto run = [&](const nlohmann::json& r) {
    Golden::Run out;
    out.prompt_logits = r["prompt_logits"].get<std::vector<float>>();
    out.greedy_tokens = r["greedy_tokens"].get<std::vector<int64_t>>();
    out.last_step_logits = r["last_step_logits"].get<std::vector<float>>();
    g.vocab = r["prompt_logits_shape"][1].get<int64_t>();
    return out;
  };
  g.f32 = run(j["f32"]);
  if (j.contains("bf16")) {
    g.bf16 = run(j["bf16"]);
    g.has_bf16 = true;
  }
  return g;
}

// Largest |got - want| (got any float dtype, flattened).
inline double MaxAbsDiff(const Tensor& got, const std::vector<float>& want) {
  const std::vector<float> g = got.ToVector<float>();
  if (g.size() != want.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < g.size(); ++i) m = std::max(m, std::abs(double(g[i]) - want[i]));
  return m;
}

}  // namespace dt::nn::testing
