#pragma once
// The HTTP side of `dtensor serve` on rank 0: an OpenAI-compatible server (tools/serve_openai.h)
// in front of a continuous-batching engine (nn/models/engine.h), through cpp-httplib (Debian's
// libcpp-httplib-dev). It takes any `nn::Engine`, so tests drive it with a fake one
// (tests/serve/fake_engine.h).
//
//   thread                  does
//   the caller of Run       loops engine.Step() and hands each event to its request's slot;
//                           drains and stops (below)
//   httplib's pool          one thread per connection: reads and checks a request, submits it,
//   (http_threads)          then waits on its slot (a deadline, and a look at the connection every
//                           kPoll) and writes the answer, whole or as server-sent events; the
//                           tokens become text here (TextStream), not on the stepping thread
//
// Note [Serving states]
//   serving   requests are submitted; /health 200
//   draining  (the first signal) new requests get 503 and the running ones finish; when none is
//             left the engine stops, and Run returns OK
//   stopping  (a second signal) the engine stops at once: unfinished requests get 503 (or an error
//             event on a stream), then Run returns OK
//   failed    a step failed (a rank died or timed out: the collective timeout, DT_TIMEOUT_MS):
//             every open request gets 503 with the step's error, and Run returns that error
// Run stops the HTTP server only once no request is open, so every answer is written whole (a
// stream with its [DONE]); the last answers and idle keep-alive connections end within the
// keep-alive timeout.
//
// Note [Cancelling requests]
// A request is cancelled in the engine (its sequence and pages freed at the next step) when its
// client goes away: a failed write, or a hang-up seen on its connection's socket while the request
// waits (Note [Finding a request's socket]); when --request-timeout passes (504, or an error event
// on a stream); and when a stop string ends its text before the engine did.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "dtensor/nn/models/engine.h"
#include "dtensor/tools/serve_metrics.h"
#include "dtensor/tools/serve_openai.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace dt::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                         // 0: a free port (port() says which)
  int64_t max_request_bytes = 1 << 20;     // a larger body gets 413
  std::chrono::milliseconds request_timeout{600'000};  // from arrival to the last token; then 504
  int http_threads = 96;                   // connections served at once; more wait for a thread
  // Counts SIGTERM/SIGINT (the CLI's handler; a test's own counter): 1 drains, 2 stops at once
  // (Note [Serving states]). nullptr: never.
  const std::atomic<int>* signals = nullptr;
};

class Server {
 public:
  // `engine` must outlive the server and be driven by nothing else.
  Server(nn::Engine& engine, ModelInfo model, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port (Unavailable naming them when it cannot) and starts answering.
  absl::Status Start();
  int port() const { return port_; }
  // Steps the engine on the calling thread until a drain or stop ends (OK) or a step fails (its
  // error); then stops HTTP (Note [Serving states]).
  absl::Status Run();

 private:
  struct Slot;  // one request between its submission and its answer (serve_http.cc)
  enum class State { kServing, kDraining, kFailed };
  void Generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res,
                std::string body);
  // Submits under mu_ (so the stepping thread never sees an event before its slot); the slot, or
  // why not.
  absl::StatusOr<std::shared_ptr<Slot>> Submit(GenerationRequest request);
  // Waits for the slot's next events (or its deadline, a failure, or kPoll) and turns them into
  // text; false when the request is over (Slot::finish or Slot::error set).
  bool Advance(Slot& slot, std::string* text);
  // Frees the request's sequence at the next step, unless the engine is done with it.
  void CancelInEngine(Slot& slot);
  // The request leaves: cancelled in the engine unless it finished there, counted by `reason`.
  void Close(Slot& slot, absl::string_view reason);
  void Dispatch(const std::vector<nn::EngineEvent>& events);
  // Every open request ends with `why` (a failed step, or the engine stopped).
  void FailAll(const absl::Status& why);
  void WaitUntilNoneOpen(std::chrono::milliseconds limit);
  const char* StateName() const;

  nn::Engine& engine_;
  const ModelInfo model_;
  const ServerOptions options_;
  const int64_t created_;       // unix time of the start (OpenAI's `created` of the model)
  const uint64_t seed_base_;    // seeds of sampled requests that name none
  std::atomic<uint64_t> next_seed_{0};
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_;
  int port_ = 0;
  Metrics metrics_;

  mutable std::mutex mu_;
  std::map<int64_t, std::shared_ptr<Slot>> slots_;  // open requests by engine id
  std::atomic<State> state_{State::kServing};
  bool engine_stopped_ = false;  // mu_
};

}  // namespace dt::serve
