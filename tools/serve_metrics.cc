#include "dtensor/tools/serve_metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dt::serve {
namespace {

constexpr auto kRateWindow = std::chrono::seconds(10);

std::string Number(double v) { return absl::StrFormat("%.9g", v); }

void Gauge(absl::string_view name, absl::string_view help, double v, std::string* out) {
  absl::StrAppend(out, "# HELP dtensor_serve_", name, " ", help, "\n# TYPE dtensor_serve_", name,
                  " gauge\ndtensor_serve_", name, " ", Number(v), "\n");
}

void Counter(absl::string_view name, absl::string_view help, double v, std::string* out) {
  absl::StrAppend(out, "# HELP dtensor_serve_", name, " ", help, "\n# TYPE dtensor_serve_", name,
                  " counter\ndtensor_serve_", name, " ", Number(v), "\n");
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::Write(absl::string_view name, absl::string_view help, std::string* out) const {
  absl::StrAppend(out, "# HELP dtensor_serve_", name, " ", help, "\n# TYPE dtensor_serve_", name,
                  " histogram\n");
  int64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    absl::StrAppend(out, "dtensor_serve_", name, "_bucket{le=\"",
                    i < bounds_.size() ? Number(bounds_[i]) : "+Inf", "\"} ", cumulative, "\n");
  }
  absl::StrAppend(out, "dtensor_serve_", name, "_sum ", Number(sum_), "\ndtensor_serve_", name, "_count ",
                  count_, "\n");
}

Metrics::Metrics()
    : ttft_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      inter_token_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}) {}

void Metrics::ObserveTimeToFirstToken(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.Observe(seconds);
}

void Metrics::ObserveInterToken(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  inter_token_.Observe(seconds);
}

void Metrics::CountResponse(absl::string_view path, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++responses_[{std::string(path), status}];
}

void Metrics::CountFinish(absl::string_view reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++finished_[std::string(reason)];
}

void Metrics::RecordStep(Clock::time_point now, int64_t generated_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  samples_.emplace_back(now, generated_tokens);
  while (samples_.size() > 2 && now - samples_.front().first > kRateWindow) samples_.pop_front();
}

std::string Metrics::Text(const nn::EngineStats& stats, int64_t requests_open, absl::string_view state) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  Gauge("requests_waiting", "Requests queued in the engine.", stats.waiting, &out);
  Gauge("requests_running", "Sequences in the engine's batch.", stats.running, &out);
  Gauge("requests_open", "Requests submitted and not yet answered.", requests_open, &out);
  Gauge("kv_pages_used", "KV cache pages in use (rank 0).", stats.kv_pages_used, &out);
  Gauge("kv_pages_total", "KV cache pages in the pool (rank 0).", stats.kv_pages_total, &out);
  Counter("prompt_tokens_total", "Prompt tokens the engine took in.", stats.prompt_tokens, &out);
  Counter("generated_tokens_total", "Tokens the engine generated.", stats.generated_tokens, &out);
  Counter("engine_steps_total", "Engine steps.", stats.steps, &out);
  double rate = 0;
  if (samples_.size() >= 2) {
    const double seconds = std::chrono::duration<double>(samples_.back().first - samples_.front().first).count();
    if (seconds > 0) rate = (samples_.back().second - samples_.front().second) / seconds;
  }
  Gauge("generated_tokens_per_second", "Generated tokens per second over the last 10 s.", rate, &out);
  ttft_.Write("time_to_first_token_seconds", "From a request's submission to its first token.", &out);
  inter_token_.Write("inter_token_latency_seconds", "Between a request's consecutive tokens.", &out);
  absl::StrAppend(&out, "# HELP dtensor_serve_http_responses_total HTTP responses by path and status.\n",
                  "# TYPE dtensor_serve_http_responses_total counter\n");
  for (const auto& [key, n] : responses_) {
    absl::StrAppend(&out, "dtensor_serve_http_responses_total{path=\"", key.first, "\",status=\"", key.second,
                    "\"} ", n, "\n");
  }
  absl::StrAppend(&out, "# HELP dtensor_serve_requests_finished_total Generation requests by how they ended.\n",
                  "# TYPE dtensor_serve_requests_finished_total counter\n");
  for (const auto& [reason, n] : finished_) {
    absl::StrAppend(&out, "dtensor_serve_requests_finished_total{reason=\"", reason, "\"} ", n, "\n");
  }
  absl::StrAppend(&out, "# HELP dtensor_serve_state The server's state.\n# TYPE dtensor_serve_state gauge\n");
  for (const char* s : {"serving", "draining", "failed"}) {
    absl::StrAppend(&out, "dtensor_serve_state{state=\"", s, "\"} ", s == state ? 1 : 0, "\n");
  }
  return out;
}

}  // namespace dt::serve
