#pragma once
// A deterministic nn::Engine for the tests of `dtensor serve`'s HTTP side (tools/serve_http.h):
// no model, one rank, the contract of nn/models/engine.h kept where the server relies on it.
//
//   Submit       InvalidArgument for an empty prompt or max_new_tokens < 1, ResourceExhausted when
//                max_waiting requests wait, FailedPrecondition after Stop
//   Step         moves waiting requests into the batch (up to max_running; none while held), then
//                gives each running request its next token: the i-th token of every request is
//                script[i % script.size()]; kStop after a token of stop_ids, kLength at
//                max_new_tokens; cancelled requests end with kCancelled (token -1). Idle, it waits
//                up to 5 ms for a Submit. After Stop, Cancelled.
//   pages        a running request holds ceil((prompt + tokens) / page_tokens) pages of kv_pages
//
// The test controls it (Hold, FailNextStep, set_step_delay) and reads what it was given
// (requests(), cancelled()).

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/nn/models/engine.h"

namespace dt::serve::testing {

class FakeEngine : public nn::Engine {
 public:
  FakeEngine(nn::EngineOptions options, std::vector<int64_t> script)
      : options_(options), script_(std::move(script)) {
    stats_.kv_pages_total = options_.kv_pages;
  }

  absl::StatusOr<int64_t> Submit(nn::EngineRequest r) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return absl::FailedPreconditionError("the engine stopped");
    if (r.prompt.empty()) return absl::InvalidArgumentError("prompt: empty");
    if (r.max_new_tokens < 1) return absl::InvalidArgumentError("max_new_tokens < 1");
    if (static_cast<int64_t>(waiting_.size()) >= options_.max_waiting) {
      return absl::ResourceExhaustedError(absl::StrCat(waiting_.size(), " requests wait"));
    }
    const int64_t id = next_id_++;
    requests_[id] = r;
    waiting_.push_back(Seq{id, std::move(r)});
    stats_.waiting = static_cast<int64_t>(waiting_.size());
    cv_.notify_all();
    return id;
  }

  void Cancel(int64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_.insert(id);
    cancel_pending_.insert(id);
  }

  absl::StatusOr<std::vector<nn::EngineEvent>> Step() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!fail_.ok()) return fail_;
    if (stopped_) return absl::CancelledError("the engine stopped");
    std::vector<nn::EngineEvent> events;
    auto cancelled = [&](const Seq& s) {
      if (!cancel_pending_.count(s.id)) return false;
      events.push_back({s.id, -1, nn::FinishReason::kCancelled, ""});
      return true;
    };
    std::erase_if(waiting_, cancelled);
    std::erase_if(running_, cancelled);
    cancel_pending_.clear();
    while (!held_ && !waiting_.empty() && static_cast<int64_t>(running_.size()) < options_.max_running) {
      running_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
      stats_.prompt_tokens += static_cast<int64_t>(running_.back().request.prompt.size());
    }
    if (running_.empty()) {
      cv_.wait_for(lock, std::chrono::milliseconds(5));
      Account();
      return events;
    }
    const auto delay = step_delay_;
    lock.unlock();
    std::this_thread::sleep_for(delay);  // the forward
    lock.lock();
    for (auto it = running_.begin(); it != running_.end();) {
      Seq& s = *it;
      const int64_t token = script_[s.produced % script_.size()];
      ++s.produced;
      ++stats_.generated_tokens;
      nn::EngineEvent ev{s.id, token, nn::FinishReason::kNone, ""};
      const auto& stop = s.request.stop_ids;
      if (std::find(stop.begin(), stop.end(), token) != stop.end()) {
        ev.finish = nn::FinishReason::kStop;
      } else if (s.produced >= s.request.max_new_tokens) {
        ev.finish = nn::FinishReason::kLength;
      }
      events.push_back(ev);
      it = ev.finish == nn::FinishReason::kNone ? it + 1 : running_.erase(it);
    }
    ++stats_.steps;
    Account();
    return events;
  }

  void Stop() override {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    stop_calls_++;
  }

  nn::EngineStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  // While held, no request joins the batch (they wait: the queue fills).
  void Hold(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = on;
  }
  // Every Step from now on fails with `s` (a dead rank).
  void FailSteps(absl::Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_ = std::move(s);
  }
  void set_step_delay(std::chrono::milliseconds d) {
    std::lock_guard<std::mutex> lock(mu_);
    step_delay_ = d;
  }
  std::map<int64_t, nn::EngineRequest> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  std::set<int64_t> cancelled() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_;
  }
  int stop_calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_calls_;
  }

 private:
  struct Seq {
    int64_t id = 0;
    nn::EngineRequest request;
    int64_t produced = 0;
  };
  void Account() {  // mu_ held
    stats_.waiting = static_cast<int64_t>(waiting_.size());
    stats_.running = static_cast<int64_t>(running_.size());
    stats_.kv_pages_used = 0;
    for (const Seq& s : running_) {
      const int64_t len = static_cast<int64_t>(s.request.prompt.size()) + s.produced;
      stats_.kv_pages_used += (len + options_.page_tokens - 1) / options_.page_tokens;
    }
  }

  const nn::EngineOptions options_;
  const std::vector<int64_t> script_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Seq> waiting_;
  std::vector<Seq> running_;
  std::map<int64_t, nn::EngineRequest> requests_;
  std::set<int64_t> cancelled_, cancel_pending_;
  absl::Status fail_;
  std::chrono::milliseconds step_delay_{1};
  bool held_ = false, stopped_ = false;
  int stop_calls_ = 0;
  int64_t next_id_ = 1;
  nn::EngineStats stats_;
};

}  // namespace dt::serve::testing
