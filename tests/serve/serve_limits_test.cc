// The limits of `dtensor serve` (tools/serve_http.h) in front of a FakeEngine: a full queue (429),
// a large body (413), a client that hangs up (cancelled in the engine, nothing left open), the
// request timeout (504), draining on a signal, stopping on a second one, a failed step (503 and
// Run's error), and /metrics counting all of it and coming back to idle; the histogram format.
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "test_server.h"

namespace dt::serve::testing {
namespace {

using std::chrono::milliseconds;

const std::string kBody = R"({"model":"tiny","prompt":"Hi","max_tokens":5})";

std::string Metrics(TestServer& srv) {
  httplib::Client c = srv.Client();
  const httplib::Result r = c.Get("/metrics");
  return r ? r->body : "";
}

bool Has(const std::string& metrics, const std::string& line) {
  return absl::StrContains(metrics, absl::StrCat("\n", line, "\n"));
}

// Whether /metrics comes to show every line (a response is counted once written, just after its
// client has it).
::testing::AssertionResult Shows(TestServer& srv, const std::vector<std::string>& lines) {
  std::string m;
  const bool all = WaitFor([&] {
    m = Metrics(srv);
    for (const std::string& line : lines) {
      if (!Has(m, line)) return false;
    }
    return true;
  });
  if (all) return ::testing::AssertionSuccess();
  ::testing::AssertionResult failure = ::testing::AssertionFailure();
  for (const std::string& line : lines) {
    if (!Has(m, line)) failure << "missing: " << line << "\n";
  }
  return failure << "in:\n" << m;
}

TEST(ServeLimits, AFullQueueIs429) {
  nn::EngineOptions e = FakeOptions();
  e.max_waiting = 2;
  TestServer srv({}, e);
  srv.engine().Hold(true);
  std::vector<int> statuses(2, 0);
  std::vector<std::thread> waiting;
  for (int i = 0; i < 2; ++i) {
    waiting.emplace_back([&, i] { statuses[i] = PostFrom(srv, "/v1/completions", kBody).status; });
  }
  ASSERT_TRUE(WaitFor([&] { return srv.engine().stats().waiting == 2; }));
  httplib::Client c = srv.Client();
  const httplib::Result r = c.Post("/v1/completions", kBody, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(ErrorOf(r->body)["type"], "rate_limit_error");
  EXPECT_TRUE(absl::StrContains(ErrorOf(r->body)["message"].get<std::string>(), "queue is full"));
  srv.engine().Hold(false);
  for (std::thread& t : waiting) t.join();
  EXPECT_EQ(statuses, (std::vector<int>{200, 200}));
  EXPECT_TRUE(Shows(srv, {R"(dtensor_serve_http_responses_total{path="/v1/completions",status="429"} 1)",
                          R"(dtensor_serve_http_responses_total{path="/v1/completions",status="200"} 2)"}));
}

TEST(ServeLimits, ABodyOverTheLimitIs413) {
  ServerOptions o;
  o.max_request_bytes = 1000;
  TestServer srv(o);
  httplib::Client c = srv.Client();
  const std::string big = absl::StrCat(R"({"model":"tiny","prompt":")", std::string(2000, 'a'), R"("})");
  httplib::Result r = c.Post("/v1/completions", big, "application/json");  // refused by its Content-Length
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(ErrorOf(r->body)["code"], "request_too_large");
  // Chunked, the length is not known up front: refused once the body passes the limit.
  RawConnection raw(srv.port());
  const std::string chunk = absl::StrCat("258\r\n", std::string(600, 'a'), "\r\n");  // 0x258 = 600
  raw.Send(absl::StrCat("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
                        chunk, chunk, "0\r\n\r\n"));
  const std::string answer = raw.ReadUntil("request_too_large");
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 413")) << answer;
  EXPECT_TRUE(absl::StrContains(answer, "request_too_large")) << answer;
  r = c.Post("/v1/completions", kBody, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(ServeLimits, AClientThatHangsUpIsCancelled) {
  TestServer srv;
  srv.engine().set_step_delay(milliseconds(20));
  {  // mid-stream
    RawConnection raw(srv.port());
    raw.Send(PostRequest("/v1/completions", R"({"model":"tiny","prompt":"Hi","max_tokens":1000,"stream":true})"));
    EXPECT_TRUE(absl::StrContains(raw.ReadUntil("data: {"), "data: {"));
  }
  ASSERT_TRUE(WaitFor([&] { return srv.engine().cancelled().size() == 1; }));
  // Waiting in the queue, not streamed: seen on the connection's socket.
  srv.engine().Hold(true);
  {
    RawConnection raw(srv.port());
    raw.Send(PostRequest("/v1/completions", kBody));
    ASSERT_TRUE(WaitFor([&] { return srv.engine().stats().waiting == 1; }));
  }
  ASSERT_TRUE(WaitFor([&] { return srv.engine().cancelled().size() == 2; }));
  srv.engine().Hold(false);
  // Nothing is left open: no request, no page.
  EXPECT_TRUE(Shows(srv, {"dtensor_serve_requests_open 0", "dtensor_serve_kv_pages_used 0",
                          "dtensor_serve_requests_running 0",
                          R"(dtensor_serve_requests_finished_total{reason="disconnected"} 2)"}));
}

TEST(ServeLimits, TheRequestTimeoutIs504AndCancels) {
  ServerOptions o;
  o.request_timeout = milliseconds(300);
  TestServer srv(o);
  srv.engine().Hold(true);
  httplib::Client c = srv.Client();
  httplib::Result r = c.Post("/v1/completions", kBody, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 504);
  EXPECT_EQ(ErrorOf(r->body)["type"], "timeout_error");
  // A stream has said 200 already: the error is its last event.
  r = c.Post("/v1/completions", R"({"model":"tiny","prompt":"Hi","stream":true})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  const std::vector<std::string> payloads = SsePayloads(r->body);
  ASSERT_EQ(payloads.size(), 2u) << r->body;
  EXPECT_EQ(ErrorOf(payloads[0])["type"], "timeout_error");
  EXPECT_EQ(payloads[1], "[DONE]");
  EXPECT_TRUE(WaitFor([&] { return srv.engine().cancelled().size() == 2; }));
  EXPECT_TRUE(Shows(srv, {R"(dtensor_serve_requests_finished_total{reason="timeout"} 2)"}));
}

TEST(ServeLimits, ASignalDrains) {
  TestServer srv;
  srv.engine().set_step_delay(milliseconds(10));
  Answer running;
  std::thread client([&] {
    running = PostFrom(srv, "/v1/completions", R"({"model":"tiny","prompt":"Hi","max_tokens":40,"stream":true})");
  });
  ASSERT_TRUE(WaitFor([&] { return srv.engine().stats().running == 1; }));
  srv.Signal();
  httplib::Client c = srv.Client();
  ASSERT_TRUE(WaitFor([&] {
    const httplib::Result h = c.Get("/health");
    return h && h->status == 503 && Json::parse(h->body)["status"] == "draining";
  }));
  const httplib::Result refused = c.Post("/v1/completions", kBody, "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  EXPECT_EQ(ErrorOf(refused->body)["type"], "service_unavailable");
  client.join();
  // The running request finished whole.
  EXPECT_EQ(running.status, 200);
  std::vector<std::string> payloads = SsePayloads(running.body);
  ASSERT_EQ(payloads.back(), "[DONE]");
  payloads.pop_back();
  int64_t tokens = 0;
  for (const std::string& p : payloads) tokens += Json::parse(p)["choices"][0]["text"].get<std::string>().size();
  EXPECT_EQ(tokens, 40);  // a byte per token
  EXPECT_EQ(Json::parse(payloads.back())["choices"][0]["finish_reason"], "length");
  const absl::Status s = srv.Finish(1);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(srv.engine().stop_calls(), 1);
}

TEST(ServeLimits, ASecondSignalStopsAtOnce) {
  TestServer srv;
  srv.engine().set_step_delay(milliseconds(10));
  Answer cut;
  std::thread client([&] {
    cut = PostFrom(srv, "/v1/completions", R"({"model":"tiny","prompt":"Hi","max_tokens":100000})");
  });
  ASSERT_TRUE(WaitFor([&] { return srv.engine().stats().running == 1; }));
  srv.Signal();
  srv.Signal();
  client.join();
  EXPECT_EQ(cut.status, 503);
  EXPECT_TRUE(absl::StrContains(ErrorOf(cut.body)["message"].get<std::string>(), "stopped")) << cut.body;
  EXPECT_TRUE(srv.Finish(2).ok());
}

TEST(ServeLimits, AFailedStepIs503AndEndsRun) {
  TestServer srv;
  srv.engine().Hold(true);
  Answer failed;
  std::thread client([&] { failed = PostFrom(srv, "/v1/completions", kBody); });
  ASSERT_TRUE(WaitFor([&] { return srv.engine().stats().waiting == 1; }));
  srv.engine().FailSteps(absl::DeadlineExceededError("rank 1 did not answer within 300000 ms"));
  client.join();
  EXPECT_EQ(failed.status, 503);
  EXPECT_TRUE(absl::StrContains(ErrorOf(failed.body)["message"].get<std::string>(), "rank 1 did not answer"));
  const absl::Status s = srv.Finish();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 1 did not answer")) << s;
}

TEST(ServeLimits, MetricsCountAndComeBackToIdle) {
  TestServer srv;
  httplib::Client c = srv.Client();
  for (int i = 0; i < 2; ++i) {
    const httplib::Result r = c.Post("/v1/completions", kBody, "application/json");
    ASSERT_TRUE(r && r->status == 200);
  }
  const httplib::Result bad = c.Post("/v1/completions", R"({"model":"tiny"})", "application/json");
  ASSERT_TRUE(bad && bad->status == 400);
  EXPECT_TRUE(Shows(srv, {R"(dtensor_serve_http_responses_total{path="/v1/completions",status="200"} 2)",
                          R"(dtensor_serve_http_responses_total{path="/v1/completions",status="400"} 1)",
                          R"(dtensor_serve_requests_finished_total{reason="length"} 2)",
                          "dtensor_serve_time_to_first_token_seconds_count 2",
                          "dtensor_serve_inter_token_latency_seconds_count 8",  // 2 requests x (5 - 1)
                          "dtensor_serve_generated_tokens_total 10", "dtensor_serve_requests_open 0",
                          "dtensor_serve_kv_pages_used 0", "dtensor_serve_requests_waiting 0"}));
}

// Prometheus' histogram: a bucket counts the values up to its bound ("le", inclusive), the buckets
// are cumulative, +Inf is the count.
TEST(ServeMetrics, HistogramBucketsAreCumulative) {
  Histogram h({0.01, 0.05, 1});
  for (double v : {0.005, 0.05, 0.05, 0.5, 100.0}) h.Observe(v);
  std::string out;
  h.Write("x", "help", &out);
  EXPECT_EQ(out,
            "# HELP dtensor_serve_x help\n# TYPE dtensor_serve_x histogram\n"
            "dtensor_serve_x_bucket{le=\"0.01\"} 1\ndtensor_serve_x_bucket{le=\"0.05\"} 3\n"
            "dtensor_serve_x_bucket{le=\"1\"} 4\ndtensor_serve_x_bucket{le=\"+Inf\"} 5\n"
            "dtensor_serve_x_sum 100.605\ndtensor_serve_x_count 5\n");
}

}  // namespace
}  // namespace dt::serve::testing
