#pragma once
// GET /metrics of `dtensor serve`: the Prometheus text format (version 0.0.4), every name prefixed
// dtensor_serve_.
//
//   name                                   type       what
//   requests_waiting, requests_running     gauge      the engine's queue and batch (EngineStats)
//   requests_open                          gauge      requests the server holds: submitted, not yet
//                                                     answered (0 when idle: nothing leaked)
//   kv_pages_used, kv_pages_total          gauge      the KV page pool of rank 0
//   prompt_tokens_total                    counter    prompt tokens the engine took in
//   generated_tokens_total                 counter    tokens it generated
//   engine_steps_total                     counter
//   generated_tokens_per_second            gauge      over the last 10 s
//   time_to_first_token_seconds            histogram  from the request's submission to its first
//                                                     token
//   inter_token_latency_seconds            histogram  between a request's consecutive tokens
//   http_responses_total{path,status}      counter    every HTTP answer by path (the API's paths,
//                                                     else "other") and status code
//   requests_finished_total{reason}        counter    stop, length, timeout, disconnected,
//                                                     cancelled (the server stopped), error
//   state{state}                           gauge      1 for the current one of serving, draining,
//                                                     failed

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "dtensor/nn/models/engine.h"

namespace dt::serve {

// A Prometheus histogram: counts per upper bound (cumulative when written), sum and count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  void Write(absl::string_view name, absl::string_view help, std::string* out) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bound, and one past the last (+Inf)
  double sum_ = 0;
  int64_t count_ = 0;
};

class Metrics {
 public:
  using Clock = std::chrono::steady_clock;
  Metrics();

  void ObserveTimeToFirstToken(double seconds);
  void ObserveInterToken(double seconds);
  void CountResponse(absl::string_view path, int status);
  void CountFinish(absl::string_view reason);
  // After each engine step: the engine's generated-token total then (the rate's samples).
  void RecordStep(Clock::time_point now, int64_t generated_tokens);

  // The exposition, with the gauges of this moment.
  std::string Text(const nn::EngineStats& stats, int64_t requests_open, absl::string_view state) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_, inter_token_;
  std::map<std::pair<std::string, int>, int64_t> responses_;
  std::map<std::string, int64_t> finished_;
  std::deque<std::pair<Clock::time_point, int64_t>> samples_;  // the last 10 s of RecordStep
};

}  // namespace dt::serve
