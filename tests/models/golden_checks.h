#pragma once
// The checks the causal-LM tests run against transformers' goldens (tests/fixtures/*/golden.json):
// prompt logits within 1e-4 of their scale, the greedy continuation identical, the logits of its
// last KV-cache step within the same tolerance, and the loader's accounting (no rank read more
// than its pieces; a sharded parameter never read whole; the peak within transformers' bound, which
// the Flux2 tests check too).
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/load.h"
#include "dtensor/nn/models/causal_lm.h"
#include "dtensor/tests/models/llama_util.h"
#include "gtest/gtest.h"

namespace dt::nn::testing {

// 1e-4 of the logits' scale (their largest magnitude).
inline double Tolerance(const std::vector<float>& want) {
  double scale = 0;
  for (float v : want) scale = std::max(scale, double(std::fabs(v)));
  return 1e-4 * scale;
}

inline absl::StatusOr<Tensor> PromptLogits(CausalLM& m, const std::vector<int64_t>& prompt) {
  m.ResetCache();
  DT_ASSIGN_OR_RETURN(Tensor ids, Tensor::FromVector<int64_t>(
                                      {1, static_cast<int64_t>(prompt.size())}, prompt));
  return m.Logits(ids);
}

// The model on this rank against the f32 golden: prompt logits, greedy tokens, last decode step.
inline absl::Status MatchesGolden(CausalLM& m, const Golden& g, int rank) {
  DT_ASSIGN_OR_RETURN(Tensor logits, PromptLogits(m, g.prompt));
  const double diff = MaxAbsDiff(logits, g.f32.prompt_logits), tol = Tolerance(g.f32.prompt_logits);
  if (diff > tol) {
    return absl::InternalError(absl::StrCat("rank ", rank, ": prompt logits differ from ",
                                            "transformers' by ", diff, " > ", tol));
  }
  GenerateOptions go;
  go.max_new_tokens = static_cast<int64_t>(g.f32.greedy_tokens.size());
  DT_ASSIGN_OR_RETURN(GenerateResult r, m.Generate(g.prompt, go));
  if (r.tokens != g.f32.greedy_tokens) {
    return absl::InternalError(absl::StrCat("rank ", rank, ": greedy tokens [",
                                            absl::StrJoin(r.tokens, ","),
                                            "] differ from transformers' [",
                                            absl::StrJoin(g.f32.greedy_tokens, ","), "]"));
  }
  // The KV cache's last step against transformers' (the logits that picked the last token).
  DT_ASSIGN_OR_RETURN(Tensor last, PromptLogits(m, g.prompt));
  for (size_t i = 0; i + 1 < r.tokens.size(); ++i) {
    DT_ASSIGN_OR_RETURN(Tensor t, Tensor::FromVector<int64_t>({1, 1}, {r.tokens[i]}));
    DT_ASSIGN_OR_RETURN(last, m.Logits(t, /*last_only=*/true));
  }
  const double last_diff = MaxAbsDiff(last, g.f32.last_step_logits);
  if (last_diff > Tolerance(g.f32.last_step_logits)) {
    return absl::InternalError(
        absl::StrCat("rank ", rank, ": the last decode step differs by ", last_diff));
  }
  return absl::OkStatus();
}

// No piece read beyond its bytes; with `sharded` (more than one rank), no sharded parameter read
// whole.
inline absl::Status ReadsOnlyItsPieces(const LoadReport& report, bool sharded) {
  for (const LoadReport::Param& p : report.params) {
    if (p.read_bytes > p.local_bytes) {
      return absl::InternalError(absl::StrCat(p.name, ": read ", p.read_bytes, " bytes for a ",
                                              p.local_bytes, "-byte piece"));
    }
    if (sharded && p.sharded && p.read_bytes >= p.full_bytes) {
      return absl::InternalError(absl::StrCat(p.name, " (", p.spec, ") was read whole"));
    }
  }
  return absl::OkStatus();
}

// fn(rank, model, report) on every rank of a model test.
template <typename Model>
using RankFnOf = std::function<absl::Status(int rank, Model& model, const LoadReport& report)>;

// Loads `dir` as a Model on `tp` thread ranks (a 1-D "tp" mesh) and runs fn on each.
template <typename Model, typename Options>
absl::Status OnThreadRanks(int tp, const std::string& dir, const Options& options, const RankFnOf<Model>& fn) {
  return World::RunThreads(tp, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {tp}, {"tp"}));
    LoadReport report;
    DT_ASSIGN_OR_RETURN(auto model, Model::FromPretrained(dir, mesh, options, &report));
    return fn(w.rank(), *model, report);
  });
}

// transformers' test_loading_memory_consumption bound: the loader's peak and what rank `rank` of
// `tp` keeps stay within (full/tp + replicated) x 1.2.
inline absl::Status WithinLoadBound(const LoadReport& report, int tp, int rank) {
  const double bound = (double(report.sharded_full_bytes) / tp + report.replicated_bytes) * 1.2;
  if (report.stats.peak_bytes > bound || report.local_bytes > bound) {
    return absl::InternalError(absl::StrCat("rank ", rank, ": peak ", report.stats.peak_bytes,
                                            " bytes > (full/tp + replicated) x 1.2 = ", bound));
  }
  return absl::OkStatus();
}

// A test parameter's name from a fixture's: "llama-tiny" -> "llama_tiny".
inline std::string FixtureParamName(const ::testing::TestParamInfo<const char*>& info) {
  std::string n = info.param;
  for (char& c : n) c = c == '-' ? '_' : c;
  return n;
}

}  // namespace dt::nn::testing
