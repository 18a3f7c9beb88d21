#pragma once
// Shared by the serving engine's tests (nn/models/engine.h): requests with the step they arrive
// at, a driver that runs them through an engine on every rank, and the same requests run alone
// through CausalLM::Generate.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/random.h"
#include "dtensor/core/status.h"
#include "dtensor/nn/models/causal_lm.h"
#include "dtensor/nn/models/engine.h"

namespace dt::nn::testing {

struct TimedRequest {
  EngineRequest request;
  int64_t arrive = 0;      // submitted before this step (0: before the first)
  int64_t cancel_at = -1;  // cancelled before this step (-1: never)
};

// What a request got: its tokens and how it finished.
struct Outcome {
  std::vector<int64_t> tokens;
  FinishReason finish = FinishReason::kNone;
  std::string error;
  bool operator==(const Outcome& o) const { return tokens == o.tokens && finish == o.finish; }
};

inline std::string Describe(const Outcome& o) {
  return absl::StrCat("[", absl::StrJoin(o.tokens, ", "), "] ", FinishReasonName(o.finish),
                      o.error.empty() ? "" : absl::StrCat(" (", o.error, ")"));
}

// What the engine's run looked like from rank 0, besides the outcomes.
struct RunLog {
  int64_t steps = 0;
  int64_t max_running = 0;             // the most sequences running at once (stats after a step)
  int64_t max_pages = 0;               // the most KV pages held at once
  std::vector<EngineStats> per_step;   // stats after each step
};

// Runs `requests` through `engine` on this rank: rank 0 (lead) submits each before its step,
// cancels as told, steps until every request finished, then stops the engine; the other ranks
// step until the engine stops. Rank 0 returns each request's outcome (others: empty). A Submit
// that fails gives that request an outcome of kError with the message, and no id.
inline absl::StatusOr<std::vector<Outcome>> RunEngine(Engine& engine, bool lead,
                                                      const std::vector<TimedRequest>& requests,
                                                      RunLog* log = nullptr,
                                                      int64_t max_steps = 10000) {
  if (!lead) {
    for (int64_t i = 0; i < max_steps; ++i) {
      absl::StatusOr<std::vector<EngineEvent>> step = engine.Step();
      if (absl::IsCancelled(step.status())) return std::vector<Outcome>();
      DT_RETURN_IF_ERROR(step.status());
    }
    return absl::DeadlineExceededError("the engine did not stop");
  }
  std::vector<Outcome> out(requests.size());
  std::map<int64_t, size_t> index;  // engine id -> request
  std::vector<int64_t> ids(requests.size(), -1);
  size_t open = requests.size();
  for (int64_t step = 0; step < max_steps && open > 0; ++step) {
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i].arrive == step) {
        absl::StatusOr<int64_t> id = engine.Submit(requests[i].request);
        if (!id.ok()) {
          out[i].finish = FinishReason::kError;
          out[i].error = std::string(id.status().message());
          --open;
          continue;
        }
        ids[i] = *id;
        index[*id] = i;
      }
      if (requests[i].cancel_at == step && ids[i] > 0) engine.Cancel(ids[i]);
    }
    DT_ASSIGN_OR_RETURN(std::vector<EngineEvent> events, engine.Step());
    for (const EngineEvent& e : events) {
      Outcome& o = out[index.at(e.id)];
      if (o.finish != FinishReason::kNone) {
        return absl::InternalError(absl::StrCat("request ", e.id, ": an event after its finish"));
      }
      if (e.token >= 0) o.tokens.push_back(e.token);
      o.finish = e.finish;
      o.error = e.error;
      if (e.finish != FinishReason::kNone) --open;
    }
    if (log != nullptr) {
      const EngineStats s = engine.stats();
      log->steps = step + 1;
      log->max_running = std::max(log->max_running, s.running);
      log->max_pages = std::max(log->max_pages, s.kv_pages_used);
      log->per_step.push_back(s);
    }
  }
  if (open > 0) return absl::DeadlineExceededError(absl::StrCat(open, " requests did not finish"));
  engine.Stop();
  absl::StatusOr<std::vector<EngineEvent>> last = engine.Step();
  if (!absl::IsCancelled(last.status())) {
    return absl::InternalError(absl::StrCat("the Step after Stop gave ", last.status().ToString()));
  }
  return out;
}

// The request run alone (every rank of the mesh calls it).
inline absl::StatusOr<Outcome> RunAlone(CausalLM& model, const EngineRequest& r) {
  GenerateOptions o;
  o.max_new_tokens = r.max_new_tokens;
  o.sampling = r.sampling;
  o.stop_token_ids = r.stop_ids;
  DT_ASSIGN_OR_RETURN(GenerateResult g, model.Generate(r.prompt, o));
  Outcome out;
  out.tokens = g.tokens;
  out.finish = g.stop == StopReason::kStopToken      ? FinishReason::kStop
               : g.stop == StopReason::kMaxNewTokens ? FinishReason::kLength
                                                     : FinishReason::kContext;
  return out;
}

// How far every logit may move (each by at most this much) before the token SampleToken draws
// from them with `o` at `step` could change. Greedy: half the top logit's lead over the second.
// Sampled (temperature T): moving every logit by at most d scales each probability of the
// renormalized candidates by at most e^(±2d/T), so a cumulative probability moves by at most
// e^(2d/T) - 1: the margin is the least of half the logit gap at the top-k cut and on either side
// of the drawn candidate (the candidates before it may reorder among themselves: their sum stays),
// and (T/2) ln(1 + g) for the distance g of the draw from the cumulative probabilities before and
// after the drawn candidate, and of top_p from the masses around the top-p cut.
inline double DecisionMargin(absl::Span<const float> logits, const SamplingOptions& o,
                             int64_t step) {
  const int64_t n = static_cast<int64_t>(logits.size());
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  auto gap = [&](int64_t i) {  // half the gap between the i-th and (i+1)-th largest
    return i + 1 < n ? 0.5 * (double{logits[order[i]]} - logits[order[i + 1]])
                     : std::numeric_limits<double>::infinity();
  };
  if (o.greedy) return gap(0);
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, n) : n;
  double margin = k < n ? gap(k - 1) : std::numeric_limits<double>::infinity();
  const double t = o.temperature;
  std::vector<double> p(static_cast<size_t>(k));
  double total = 0;
  for (int64_t i = 0; i < k; ++i) total += p[i] = std::exp((logits[order[i]] - logits[order[0]]) / t);
  auto in_logits = [&](double g) { return t / 2 * std::log1p(std::abs(g)); };
  int64_t keep = k;
  if (o.top_p < 1) {
    double mass = 0;
    for (int64_t i = 0; i < k; ++i) {
      const double before = mass;
      mass += p[i] / total;
      if (mass >= o.top_p) {
        keep = i + 1;
        margin = std::min(margin, in_logits(mass - o.top_p));
        if (i > 0) margin = std::min(margin, in_logits(o.top_p - before));
        break;
      }
    }
  }
  double kept = 0;
  for (int64_t i = 0; i < keep; ++i) kept += p[i];
  const double u = UniformAt(o.seed, static_cast<uint64_t>(step));
  double acc = 0;
  for (int64_t i = 0; i < keep; ++i) {
    const double before = acc / kept;
    acc += p[i];
    if (u < acc / kept || i == keep - 1) {  // the drawn candidate
      margin = std::min({margin, in_logits(u - acc / kept), gap(i)});
      if (i > 0) margin = std::min({margin, in_logits(u - before), gap(i - 1)});
      break;
    }
  }
  return margin;
}

// The request run alone step by step as Generate runs it (Logits, then SampleToken): each
// token's DecisionMargin, and the tokens (which must be Generate's).
struct Margins {
  std::vector<int64_t> tokens;
  std::vector<double> margin;
};
inline absl::StatusOr<Margins> AloneMargins(CausalLM& model, const EngineRequest& r) {
  Margins m;
  model.ResetCache();
  const int64_t budget =
      std::min(r.max_new_tokens, model.context_length() - static_cast<int64_t>(r.prompt.size()));
  DT_ASSIGN_OR_RETURN(Tensor ids, Tensor::FromVector<int64_t>(
                                      {1, static_cast<int64_t>(r.prompt.size())}, r.prompt));
  for (int64_t k = 0; k < budget; ++k) {
    DT_ASSIGN_OR_RETURN(Tensor logits, model.Logits(ids, /*last_only=*/true));
    DT_ASSIGN_OR_RETURN(logits, logits.To(DType::kF32));
    const std::vector<float> v = logits.ToVector<float>();
    DT_ASSIGN_OR_RETURN(const int64_t token, SampleToken(v, r.sampling, k));
    m.tokens.push_back(token);
    m.margin.push_back(DecisionMargin(v, r.sampling, k));
    if (std::find(r.stop_ids.begin(), r.stop_ids.end(), token) != r.stop_ids.end()) break;
    DT_ASSIGN_OR_RETURN(ids, Tensor::FromVector<int64_t>({1, 1}, {token}));
  }
  return m;
}

// A prompt of n ids below `vocab`, the same for the same (n, seed).
inline std::vector<int64_t> Prompt(int64_t n, int64_t vocab, int64_t seed) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(seed + 1);
  for (int64_t& t : p) {
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    t = 1 + static_cast<int64_t>(x % static_cast<uint64_t>(vocab - 1));
  }
  return p;
}

// Requests of several prompt lengths, greedy and sampled, arriving at different steps: with
// max_running 3 and step_tokens 8 some wait, long prompts are prefilled in chunks beside other
// sequences' decode steps, and sequences leave while others join.
inline std::vector<TimedRequest> MixedRequests(int64_t vocab) {
  struct Shape {
    int64_t prompt, new_tokens, arrive;
    bool sampled;
  };
  const Shape shapes[] = {{3, 10, 0, false}, {13, 6, 0, true}, {1, 12, 0, false},
                          {20, 5, 1, true},  {7, 9, 3, false}, {5, 8, 6, true},
                          {11, 4, 6, false}};
  std::vector<TimedRequest> out;
  int64_t i = 0;
  for (const Shape& s : shapes) {
    TimedRequest t;
    t.request.prompt = Prompt(s.prompt, vocab, i);
    t.request.max_new_tokens = s.new_tokens;
    if (s.sampled) {
      t.request.sampling.greedy = false;
      t.request.sampling.temperature = 0.8;
      t.request.sampling.top_k = 40;
      t.request.sampling.top_p = 0.95;
      t.request.sampling.seed = 100 + static_cast<uint64_t>(i);
    }
    t.arrive = s.arrive;
    out.push_back(std::move(t));
    ++i;
  }
  return out;
}

// The options the tests run with: small enough that requests wait, prompts are chunked and
// sequences cross pages.
inline EngineOptions SmallOptions() {
  EngineOptions o;
  o.max_running = 3;
  o.max_waiting = 16;
  o.step_tokens = 8;
  o.page_tokens = 4;
  return o;
}

}  // namespace dt::nn::testing
