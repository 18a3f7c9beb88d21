#pragma once
// The HTTP side of `dtensor serve` (tools/serve_http.h) on a free port in front of a FakeEngine
// (fake_engine.h), its Run loop on a thread of its own, with the tiny GGUF's tokenizer; and the
// clients the tests use: cpp-httplib's, and a raw socket for what a polite client never does
// (hanging up mid-answer, a chunked body).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "dtensor/tools/serve_http.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "fake_engine.h"

namespace dt::serve::testing {

using Json = nlohmann::json;

inline std::shared_ptr<const loaders::Tokenizer> Tokenizer() {
  static const std::shared_ptr<const loaders::Tokenizer> tok =
      loaders::Tokenizer::Load(DT_FIXTURES_DIR "/gguf/llama-tiny.gguf").value();
  return tok;
}

// The token whose bytes are byte `b` alone (a byte-level BPE vocabulary has one for every byte).
inline int64_t ByteToken(unsigned char b) {
  static const std::map<std::string, int64_t> by_bytes = [] {
    std::map<std::string, int64_t> m;
    for (int64_t id = 0; id < Tokenizer()->vocab_size(); ++id) m.emplace(Tokenizer()->TokenBytes(id), id);
    return m;
  }();
  return by_bytes.at(std::string(1, static_cast<char>(b)));
}

// What the fake engine says, a byte per token: its multibyte characters arrive split.
inline const std::string& ScriptText() {
  static const std::string text = "Hello, w\xC3\xB6rld \xE2\x98\x95!";  // "Hello, wörld ☕!"
  return text;
}
inline std::vector<int64_t> Script() {
  std::vector<int64_t> ids;
  for (unsigned char b : ScriptText()) ids.push_back(ByteToken(b));
  return ids;
}

inline ModelInfo TinyModel(int64_t context = 64) {
  ModelInfo m;
  m.name = "tiny";
  m.context_length = context;
  m.vocab_size = Tokenizer()->vocab_size();
  m.tokenizer = Tokenizer();
  m.stop_ids = Tokenizer()->stop_ids();
  return m;
}

inline nn::EngineOptions FakeOptions() {
  nn::EngineOptions o;
  o.max_running = 4;
  o.max_waiting = 8;
  o.kv_pages = 64;
  o.page_tokens = 16;
  return o;
}

class TestServer {
 public:
  explicit TestServer(ServerOptions options = {}, nn::EngineOptions engine = FakeOptions(),
                      std::vector<int64_t> script = Script(), ModelInfo model = TinyModel())
      : engine_(engine, std::move(script)), server_(engine_, std::move(model), WithTestFields(std::move(options))) {
    const absl::Status s = server_.Start();
    EXPECT_TRUE(s.ok()) << s;
    runner_ = std::thread([this] { result_ = server_.Run(); });
  }
  ~TestServer() { (void)Finish(2); }

  // Signals as SIGTERM would (1: drain, 2: stop) and waits for Run to return its status.
  absl::Status Finish(int signals = 1) {
    if (runner_.joinable()) {
      signals_ = signals;
      runner_.join();
    }
    return result_;
  }
  void Signal() { signals_.fetch_add(1); }
  bool running() const { return runner_.joinable(); }

  FakeEngine& engine() { return engine_; }
  int port() const { return server_.port(); }
  httplib::Client Client() const {
    httplib::Client c("127.0.0.1", port());
    c.set_read_timeout(30, 0);
    return c;
  }

 private:
  ServerOptions WithTestFields(ServerOptions o) {
    o.port = 0;
    o.signals = &signals_;
    return o;
  }
  std::atomic<int> signals_{0};
  FakeEngine engine_;
  Server server_;
  std::thread runner_;
  absl::Status result_;
};

// An answer kept past its client (a test thread's).
struct Answer {
  int status = -1;  // -1: none came
  std::string body;
};
inline Answer PostFrom(const TestServer& srv, const std::string& path, const std::string& body) {
  httplib::Client c = srv.Client();
  const httplib::Result r = c.Post(path, body, "application/json");
  return r ? Answer{r->status, r->body} : Answer{};
}

// The payloads of a server-sent event stream: each event "data: PAYLOAD\n\n", nothing else.
inline std::vector<std::string> SsePayloads(const std::string& body) {
  std::vector<std::string> out;
  EXPECT_TRUE(absl::EndsWith(body, "\n\n")) << body;
  for (absl::string_view event : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
    EXPECT_TRUE(absl::StartsWith(event, "data: ")) << "'" << event << "' in " << body;
    out.emplace_back(event.substr(6));
  }
  return out;
}

// The error object of an API error body.
inline Json ErrorOf(const std::string& body) {
  const Json j = Json::parse(body, nullptr, false);
  EXPECT_TRUE(j.is_object() && j.contains("error")) << body;
  return j.is_object() && j.contains("error") ? j["error"] : Json::object();
}

// Polls `done` until it holds or `limit` passes.
inline bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

// A connection of our own: what is sent and when it closes is up to the test.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    timeval tv{10, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~RawConnection() { Close(); }
  void Send(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
  }
  // Reads until `needle` has arrived (or the connection ends or 10 s pass); everything read.
  std::string ReadUntil(const std::string& needle) {
    while (received_.find(needle) == std::string::npos) {
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) break;
      received_.append(buf, static_cast<size_t>(n));
    }
    return received_;
  }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  std::string received_;
};

inline std::string PostRequest(const std::string& path, const std::string& body) {
  return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: ",
                      body.size(), "\r\n\r\n", body);
}

}  // namespace dt::serve::testing
