#include "dtensor/tools/serve_http.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "dtensor/tools/serve_text.h"
#include "httplib.h"

namespace dt::serve {

using Clock = std::chrono::steady_clock;

namespace {

// How often a waiting request looks at its connection and its deadline.
constexpr auto kPoll = std::chrono::milliseconds(100);

// Note [Finding a request's socket]
// cpp-httplib 0.11 (Debian 12) gives a handler no access to its connection (later versions added
// Request::is_connection_closed), yet a request waiting for its tokens should notice that its
// client hung up. The handler knows the connection's two addresses (Request::local_addr/port and
// remote_addr/port), which identify one socket of this process: the probe finds it once among
// /proc/self/fd with getsockname and getpeername, and then polls it for a hang-up (POLLRDHUP)
// without reading from it. The socket stays open until the handler's answer is written, so the
// descriptor cannot be reused meanwhile. When it is not found, the probe never reports a hang-up
// and only a failed write does.
class ConnectionProbe {
 public:
  explicit ConnectionProbe(const httplib::Request& req) {
    DIR* dir = opendir("/proc/self/fd");
    if (dir == nullptr) return;
    while (dirent* e = readdir(dir)) {
      const int fd = std::atoi(e->d_name);
      if (fd > 0 && fd != dirfd(dir) && Is(fd, getsockname, req.local_addr, req.local_port) &&
          Is(fd, getpeername, req.remote_addr, req.remote_port)) {
        fd_ = fd;
        break;
      }
    }
    closedir(dir);
  }
  bool closed() const {
    if (fd_ < 0) return false;
    pollfd p{fd_, POLLRDHUP, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
  }

 private:
  using NameFn = int (*)(int, sockaddr*, socklen_t*);
  // Whether `fd` is a socket whose address (by `name`) is addr:port, written as httplib writes it.
  static bool Is(int fd, NameFn name, const std::string& addr, int port) {
    sockaddr_storage s{};
    socklen_t len = sizeof(s);
    if (name(fd, reinterpret_cast<sockaddr*>(&s), &len) != 0) return false;
    if (s.ss_family != AF_INET && s.ss_family != AF_INET6) return false;
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    if (getnameinfo(reinterpret_cast<sockaddr*>(&s), len, host, sizeof(host), serv, sizeof(serv),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
      return false;
    }
    return std::atoi(serv) == port && addr == host;
  }
  int fd_ = -1;
};

// Note [The listen backlog]
// cpp-httplib 0.11 listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into Debian's
// library), so a burst of connections (200 clients at once) overflows the accept queue and some are
// reset. Linux takes a second listen() on the bound socket as its new backlog; the socket is
// httplib's protected svr_sock_, hence this subclass.
class Listener : public httplib::Server {
 public:
  bool SetBacklog(int n) { return ::listen(svr_sock_, n) == 0; }
};

// The path label of /metrics' response counts: the API's paths, else "other".
std::string PathLabel(const std::string& path) {
  for (const char* p : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"}) {
    if (path == p) return p;
  }
  return "other";
}

void Reply(httplib::Response& res, const absl::Status& error, int http_status = 0) {
  ApiError e = ApiErrorOf(error, http_status);
  res.status = e.http_status;
  res.set_content(e.body, "application/json");
}

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct Server::Slot {
  Slot(int64_t id, GenerationRequest r, const ModelInfo& model, Clock::time_point deadline)
      : id(id),
        request(std::move(r)),
        format(request.endpoint, id, UnixNow(), model.name),
        text(*model.tokenizer, request.stop),
        deadline(deadline) {
    usage.prompt_tokens = static_cast<int64_t>(request.prompt.size());
  }
  const int64_t id;
  const GenerationRequest request;
  const ResponseFormat format;
  TextStream text;
  Usage usage;
  const Clock::time_point deadline;
  // The stepping thread's (Dispatch): when the request was submitted and its last token came.
  Clock::time_point submitted = Clock::now(), last_token;
  bool got_token = false;
  // Under Server::mu_.
  std::deque<nn::EngineEvent> events;
  absl::Status failure;       // FailAll's
  bool engine_done = false;   // finished or cancelled there: nothing (more) to cancel
  bool closed = false;
  std::condition_variable cv;
  // The answering thread's: how the request ended.
  std::string finish;         // "stop" or "length"
  absl::Status error;         // else why not
  bool started = false;       // a stream's first chunk was written
};

Server::Server(nn::Engine& engine, ModelInfo model, ServerOptions options)
    : engine_(engine),
      model_(std::move(model)),
      options_(std::move(options)),
      created_(UnixNow()),
      seed_base_(std::random_device{}()),
      http_(std::make_unique<Listener>()) {}

Server::~Server() {
  if (http_thread_.joinable()) {
    http_->stop();
    http_thread_.join();
  }
}

absl::Status Server::Start() {
  httplib::Server& h = *http_;
  const int threads = options_.http_threads;
  h.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  h.set_payload_max_length(static_cast<size_t>(options_.max_request_bytes));
  h.set_keep_alive_timeout(2);  // idle connections hold a thread; see Note [Serving states]
  // httplib's own refusals (no route, a malformed request line) as API errors.
  h.set_error_handler(httplib::Server::HandlerWithResponse(
      [](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // ours
        if (res.status == 404) {
          Reply(res, absl::NotFoundError(absl::StrCat("no route ", req.method, " ", req.path,
                                                      " (POST /v1/completions, POST /v1/chat/completions, GET "
                                                      "/v1/models, /health, /metrics)")));
        } else {
          Reply(res, absl::InvalidArgumentError(absl::StrCat("the request was refused (HTTP ", res.status, ")")),
                res.status);
        }
        return httplib::Server::HandlerResponse::Handled;
      }));
  h.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    Reply(res, absl::InternalError(what));
  });
  h.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.CountResponse(PathLabel(req.path), res.status);
  });
  for (auto [path, endpoint] : {std::pair{"/v1/completions", Endpoint::kCompletions},
                                std::pair{"/v1/chat/completions", Endpoint::kChat}}) {
    h.Post(path, [this, endpoint](const httplib::Request& req, httplib::Response& res,
                                  const httplib::ContentReader& reader) {
      std::string body;
      bool too_large = false;
      const bool read = reader([&](const char* data, size_t n) {
        if (body.size() + n > static_cast<size_t>(options_.max_request_bytes)) {
          too_large = true;
          return false;
        }
        body.append(data, n);
        return true;
      });
      if (too_large || res.status == 413) {  // httplib's own check of Content-Length sets 413
        Reply(res,
              FieldError("", absl::StrCat("the request body is over --max-request-bytes ", options_.max_request_bytes),
                         "request_too_large"),
              413);
      } else if (!read) {
        Reply(res, absl::InvalidArgumentError("the request body could not be read"));
      } else {
        Generate(endpoint, req, res, std::move(body));
      }
    });
  }
  h.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(ModelsJson(model_, created_), "application/json");
  });
  h.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    res.status = state_ == State::kServing ? 200 : 503;
    res.set_content(absl::StrCat("{\"status\":\"", state_ == State::kServing ? "ok" : StateName(), "\"}"),
                    "application/json");
  });
  h.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    int64_t open = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      open = static_cast<int64_t>(slots_.size());
    }
    res.set_content(metrics_.Text(engine_.stats(), open, StateName()), "text/plain; version=0.0.4");
  });

  if (options_.port == 0) {
    port_ = h.bind_to_any_port(options_.host);
    if (port_ < 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.host, ": no free port"));
  } else {
    if (!h.bind_to_port(options_.host, options_.port)) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.host, ":", options_.port,
                                                 " (in use, or not an address of this machine)"));
    }
    port_ = options_.port;
  }
  if (!static_cast<Listener&>(h).SetBacklog(SOMAXCONN)) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.host, ":", port_, ": listen() failed"));
  }
  http_thread_ = std::thread([this] { http_->listen_after_bind(); });
  return absl::OkStatus();
}

const char* Server::StateName() const {
  switch (state_.load()) {
    case State::kServing: return "serving";
    case State::kDraining: return "draining";
    case State::kFailed: return "failed";
  }
  return "";
}

absl::StatusOr<std::shared_ptr<Server::Slot>> Server::Submit(GenerationRequest request) {
  nn::EngineRequest e;
  e.prompt = request.prompt;
  e.max_new_tokens = request.max_tokens;
  e.sampling = request.sampling;
  e.stop_ids = model_.stop_ids;
  const Clock::time_point deadline = Clock::now() + options_.request_timeout;
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kServing || engine_stopped_) {
    return absl::UnavailableError(absl::StrCat("the server is ", StateName(), " and takes no new requests"));
  }
  absl::StatusOr<int64_t> id = engine_.Submit(std::move(e));
  if (!id.ok()) {
    if (absl::IsResourceExhausted(id.status())) {
      return absl::ResourceExhaustedError(absl::StrCat("the queue is full (", id.status().message(),
                                                       "); retry later"));
    }
    return id.status();
  }
  auto slot = std::make_shared<Slot>(*id, std::move(request), model_, deadline);
  slots_[*id] = slot;
  return slot;
}

void Server::Generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res, std::string body) {
  if (state_ != State::kServing) {
    return Reply(res, absl::UnavailableError(absl::StrCat("the server is ", StateName(), " and takes no new requests")));
  }
  absl::StatusOr<GenerationRequest> request =
      ParseGenerationRequest(body, endpoint, model_, seed_base_ + next_seed_.fetch_add(1));
  if (!request.ok()) return Reply(res, request.status());
  absl::StatusOr<std::shared_ptr<Slot>> submitted = Submit(*std::move(request));
  if (!submitted.ok()) return Reply(res, submitted.status());
  std::shared_ptr<Slot> slot = *std::move(submitted);
  auto probe = std::make_shared<const ConnectionProbe>(req);
  auto reason = [](const Slot& s) -> std::string {
    if (s.error.ok()) return s.finish;
    if (absl::IsDeadlineExceeded(s.error)) return "timeout";
    if (absl::IsCancelled(s.error)) return "cancelled";
    return "error";
  };

  if (!slot->request.stream) {
    std::string text;
    while (Advance(*slot, &text)) {
      if (probe->closed()) return Close(*slot, "disconnected");  // nobody to answer
    }
    Close(*slot, reason(*slot));
    if (!slot->error.ok()) return Reply(res, slot->error);
    res.set_content(slot->format.Whole(text, slot->finish, slot->usage), "application/json");
    return;
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, slot, probe, reason](size_t /*offset*/, httplib::DataSink& sink) {
        if (!slot->started) {  // the headers are out; chat's first chunk names the role at once
          slot->started = true;
          if (slot->request.endpoint == Endpoint::kChat) {
            const std::string role = SseEvent(slot->format.RoleChunk());
            if (!sink.write(role.data(), role.size())) {
              Close(*slot, "disconnected");
              return false;
            }
          }
        }
        std::string out, text;
        const bool more = Advance(*slot, &text);
        if (!text.empty()) out += SseEvent(slot->format.TextChunk(text));
        if (!more) {
          if (slot->error.ok()) {
            out += SseEvent(slot->format.FinishChunk(slot->finish));
            if (slot->request.include_usage) out += SseEvent(slot->format.UsageChunk(slot->usage));
          } else {
            out += SseEvent(ApiErrorOf(slot->error).body);
          }
          out += SseEvent("[DONE]");
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          Close(*slot, "disconnected");
          return false;
        }
        if (!more) {
          sink.done();
          Close(*slot, reason(*slot));
          return true;
        }
        if (probe->closed()) {
          Close(*slot, "disconnected");
          return false;
        }
        return true;
      },
      // The response is gone (written, or abandoned when the server stops): the request too.
      [this, slot](bool /*success*/) { Close(*slot, "disconnected"); });
}

bool Server::Advance(Slot& slot, std::string* text) {
  std::deque<nn::EngineEvent> events;
  absl::Status failure;
  {
    std::unique_lock<std::mutex> lock(mu_);
    slot.cv.wait_until(lock, std::min(slot.deadline, Clock::now() + kPoll),
                       [&] { return !slot.events.empty() || !slot.failure.ok(); });
    events.swap(slot.events);
    failure = slot.failure;
  }
  for (const nn::EngineEvent& ev : events) {
    if (ev.token >= 0) {
      ++slot.usage.completion_tokens;
      if (ev.finish != nn::FinishReason::kStop) *text += slot.text.Push(ev.token);  // a stop id is no text
      if (slot.text.stopped()) {  // a stop string: the answer is complete before the engine knows
        slot.finish = "stop";
        CancelInEngine(slot);
        return false;
      }
    }
    switch (ev.finish) {
      case nn::FinishReason::kNone: continue;
      case nn::FinishReason::kStop: slot.finish = "stop"; break;
      case nn::FinishReason::kLength:
      case nn::FinishReason::kContext: slot.finish = "length"; break;  // OpenAI has no word for the context
      case nn::FinishReason::kCancelled:
        slot.error = absl::CancelledError("the server stopped before this answer was complete");
        return false;
      case nn::FinishReason::kError:
        slot.error = absl::InternalError(absl::StrCat("the engine could not finish this request: ", ev.error));
        return false;
    }
    *text += slot.text.Finish();
    if (slot.text.stopped()) slot.finish = "stop";
    return false;
  }
  if (!failure.ok()) {
    slot.error = failure;
    return false;
  }
  if (Clock::now() >= slot.deadline) {
    slot.error = absl::DeadlineExceededError(absl::StrCat(
        "the request took longer than --request-timeout ", options_.request_timeout.count() / 1000.0, " s"));
    return false;
  }
  return true;
}

void Server::CancelInEngine(Slot& slot) {
  std::lock_guard<std::mutex> lock(mu_);
  if (slot.engine_done) return;
  slot.engine_done = true;
  engine_.Cancel(slot.id);
}

void Server::Close(Slot& slot, absl::string_view reason) {
  CancelInEngine(slot);
  std::lock_guard<std::mutex> lock(mu_);
  if (slot.closed) return;
  slot.closed = true;
  slots_.erase(slot.id);
  metrics_.CountFinish(reason);
}

// Note [Waking a request's thread]
// Dispatch wakes each answering thread after it lets go of mu_: a thread woken while the
// stepping thread still holds mu_ runs only to block on mu_ and is woken a second time, and on a
// machine whose cores all compute (2 vCPUs, 2 engine threads) every wake-up takes a core from
// the engine's threads. The slots are held (shared_ptr) until then: a request may close meanwhile.
void Server::Dispatch(const std::vector<nn::EngineEvent>& events) {
  const Clock::time_point now = Clock::now();
  std::vector<std::shared_ptr<Slot>> woken;
  woken.reserve(events.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const nn::EngineEvent& ev : events) {
      auto it = slots_.find(ev.id);
      if (it == slots_.end()) continue;  // closed: cancelled in the engine already
      Slot& s = *it->second;
      if (ev.token >= 0) {
        if (s.got_token) {
          metrics_.ObserveInterToken(std::chrono::duration<double>(now - s.last_token).count());
        } else {
          metrics_.ObserveTimeToFirstToken(std::chrono::duration<double>(now - s.submitted).count());
        }
        s.got_token = true;
        s.last_token = now;
      }
      if (ev.finish != nn::FinishReason::kNone) s.engine_done = true;
      s.events.push_back(ev);
      woken.push_back(it->second);
    }
  }
  for (const std::shared_ptr<Slot>& s : woken) s->cv.notify_all();  // See Note [Waking a request's thread]
}

void Server::FailAll(const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, slot] : slots_) {
    slot->failure = why;
    slot->engine_done = true;  // nothing left to cancel
    slot->cv.notify_all();
  }
}

void Server::WaitUntilNoneOpen(std::chrono::milliseconds limit) {
  const Clock::time_point until = Clock::now() + limit;
  while (Clock::now() < until) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (slots_.empty()) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

absl::Status Server::Run() {
  absl::Status result;
  while (true) {
    const int signals = options_.signals != nullptr ? options_.signals->load() : 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (signals >= 1 && state_ == State::kServing) {
        state_ = State::kDraining;
        std::fprintf(stderr, "serve: draining: %zu request(s) open, new ones get 503\n", slots_.size());
      }
      if (state_ == State::kDraining && !engine_stopped_ && (signals >= 2 || slots_.empty())) {
        if (!slots_.empty()) std::fprintf(stderr, "serve: stopping now: %zu request(s) cut short\n", slots_.size());
        engine_.Stop();
        engine_stopped_ = true;
      }
    }
    absl::StatusOr<std::vector<nn::EngineEvent>> events = engine_.Step();
    if (!events.ok()) {
      if (engine_stopped_ && absl::IsCancelled(events.status())) {
        FailAll(absl::CancelledError("the server stopped before this answer was complete"));
        break;
      }
      state_ = State::kFailed;
      result = absl::Status(events.status().code(),
                            absl::StrCat("an engine step failed: ", events.status().message()));
      FailAll(absl::UnavailableError(absl::StrCat("the server failed: ", events.status().message())));
      break;
    }
    Dispatch(*events);
    metrics_.RecordStep(Clock::now(), engine_.stats().generated_tokens);
  }
  WaitUntilNoneOpen(std::chrono::seconds(10));
  http_->stop();
  if (http_thread_.joinable()) http_thread_.join();
  return result;
}

}  // namespace dt::serve
