// The OpenAI API of `dtensor serve` (tools/serve_http.h, serve_openai.h) in front of a FakeEngine:
// every endpoint, answers whole and streamed (the server-sent events' framing), what the engine is
// given, and bad requests refused with the field named while the server goes on answering.
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/tools/serve_text.h"
#include "gtest/gtest.h"
#include "test_server.h"

namespace dt::serve::testing {
namespace {

const int64_t kScriptTokens = static_cast<int64_t>(ScriptText().size());  // a byte per token

std::string Completion(const std::string& fields) {
  return absl::StrCat(R"({"model":"tiny","prompt":"Hi there")", fields.empty() ? "" : ",", fields, "}");
}

std::string Chat(const std::string& fields) {
  return absl::StrCat(R"({"model":"tiny","messages":[{"role":"system","content":"Be brief."},)",
                      R"({"role":"user","content":[{"type":"text","text":"Hi"}]}])",
                      fields.empty() ? "" : ",", fields, "}");
}

// POSTs the JSON `body` to `path` and expects 200: the answer parsed (a discarded Json, after a
// failure named, when there is no answer or it is not JSON).
Json PostOk(httplib::Client& c, const std::string& path, const std::string& body) {
  const httplib::Result r = c.Post(path, body, "application/json");
  if (!r) {
    ADD_FAILURE() << "POST " << path << ": no answer";
    return Json::value_t::discarded;
  }
  EXPECT_EQ(r->status, 200) << "POST " << path << ": " << r->body;
  const Json j = Json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "POST " << path << ": not JSON: " << r->body;
  return j;
}

TEST(ServeApi, ModelsHealthMetricsAndUnknownRoutes) {
  TestServer srv;
  httplib::Client c = srv.Client();
  httplib::Result r = c.Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  const Json models = Json::parse(r->body);
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][0]["context_length"], 64);

  r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(Json::parse(r->body)["status"], "ok");

  r = c.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(absl::StartsWith(r->get_header_value("Content-Type"), "text/plain"));
  EXPECT_TRUE(absl::StrContains(r->body, "\ndtensor_serve_kv_pages_total 64\n")) << r->body;
  EXPECT_TRUE(absl::StrContains(r->body, "dtensor_serve_state{state=\"serving\"} 1")) << r->body;

  for (auto [method, path] : {std::pair{"GET", "/nope"}, std::pair{"GET", "/v1/completions"},
                              std::pair{"POST", "/v1/models"}}) {
    r = std::string(method) == "GET" ? c.Get(path) : c.Post(path, "{}", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404) << method << " " << path;
    EXPECT_EQ(ErrorOf(r->body)["type"], "not_found_error");
  }
}

TEST(ServeApi, CompletionWhole) {
  TestServer srv;
  httplib::Client c = srv.Client();
  const Json j = PostOk(
      c, "/v1/completions", Completion(absl::StrCat(R"("max_tokens":)", kScriptTokens, R"(,"temperature":0)")));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_TRUE(absl::StartsWith(j["id"].get<std::string>(), "cmpl-"));
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["choices"][0]["text"], ScriptText());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  const std::vector<int64_t> prompt = Tokenizer()->Encode("Hi there", /*add_bos=*/true).value();
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], kScriptTokens);
  EXPECT_EQ(j["usage"]["total_tokens"], prompt.size() + kScriptTokens);

  const auto requests = srv.engine().requests();
  ASSERT_EQ(requests.size(), 1u);
  const nn::EngineRequest& e = requests.begin()->second;
  EXPECT_EQ(e.prompt, prompt);
  EXPECT_EQ(e.max_new_tokens, kScriptTokens);
  EXPECT_TRUE(e.sampling.greedy);
  EXPECT_EQ(e.stop_ids, Tokenizer()->stop_ids());
}

TEST(ServeApi, WhatTheEngineIsGiven) {
  TestServer srv;
  httplib::Client c = srv.Client();
  auto submitted = [&](const std::string& body) {
    const size_t before = srv.engine().requests().size();
    const httplib::Result r = c.Post("/v1/completions", body, "application/json");
    EXPECT_TRUE(r && r->status == 200) << body << " -> " << (r ? r->body : "no answer");
    const auto requests = srv.engine().requests();
    EXPECT_EQ(requests.size(), before + 1);
    return requests.rbegin()->second;
  };
  nn::EngineRequest e = submitted(Completion(R"("temperature":0.7,"top_p":0.9,"top_k":5,"seed":42)"));
  EXPECT_FALSE(e.sampling.greedy);
  EXPECT_EQ(e.sampling.temperature, 0.7);
  EXPECT_EQ(e.sampling.top_p, 0.9);
  EXPECT_EQ(e.sampling.top_k, 5);
  EXPECT_EQ(e.sampling.seed, 42u);
  EXPECT_EQ(e.max_new_tokens, 16);  // OpenAI's default for completions
  // OpenAI's defaults: temperature 1, sampled; each request without a seed gets its own.
  const nn::EngineRequest a = submitted(Completion(""));
  const nn::EngineRequest b = submitted(Completion(""));
  EXPECT_FALSE(a.sampling.greedy);
  EXPECT_EQ(a.sampling.temperature, 1.0);
  EXPECT_NE(a.sampling.seed, b.sampling.seed);
  // Prompts as token ids, and lists of one prompt.
  EXPECT_EQ(submitted(R"({"model":"tiny","prompt":[5,6,7]})").prompt, (std::vector<int64_t>{5, 6, 7}));
  EXPECT_EQ(submitted(R"({"model":"tiny","prompt":[[8,9]]})").prompt, (std::vector<int64_t>{8, 9}));
  EXPECT_EQ(submitted(R"({"model":"tiny","prompt":["Hi there"]})").prompt,
            Tokenizer()->Encode("Hi there", true).value());
  // Unknown fields are ignored; unsupported ones at their neutral value too.
  submitted(Completion(R"("user":"me","logprobs":null,"echo":false,"presence_penalty":0,"best_of":1)"));
}

TEST(ServeApi, ChatWholeInTheTemplate) {
  TestServer srv;
  httplib::Client c = srv.Client();
  const Json j = PostOk(c, "/v1/chat/completions", Chat(absl::StrCat(R"("max_tokens":)", kScriptTokens)));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_TRUE(absl::StartsWith(j["id"].get<std::string>(), "chatcmpl-"));
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], ScriptText());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  const std::string text =
      Tokenizer()->ApplyChatTemplate({{"system", "Be brief."}, {"user", "Hi"}}).value();
  const std::vector<int64_t> prompt = Tokenizer()->Encode(text, /*add_bos=*/false).value();
  ASSERT_EQ(srv.engine().requests().size(), 1u);
  EXPECT_EQ(srv.engine().requests().begin()->second.prompt, prompt);
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());

  // Without a limit the answer may fill the context; max_completion_tokens wins over max_tokens.
  PostOk(c, "/v1/chat/completions", Chat(""));
  EXPECT_EQ(srv.engine().requests().rbegin()->second.max_new_tokens, 64 - static_cast<int64_t>(prompt.size()));
  PostOk(c, "/v1/chat/completions", Chat(R"("max_tokens":9,"max_completion_tokens":3)"));
  EXPECT_EQ(srv.engine().requests().rbegin()->second.max_new_tokens, 3);
  // "developer" is OpenAI's newer name for the system role.
  PostOk(c, "/v1/chat/completions",
         R"({"model":"tiny","messages":[{"role":"developer","content":"Be brief."},{"role":"user","content":"Hi"}]})");
  EXPECT_EQ(srv.engine().requests().rbegin()->second.prompt, prompt);
}

// The events of a stream: every chunk of one id, the text in pieces that add up to the whole
// answer, the finish reason on the last chunk only, then the usage chunk when asked, then [DONE].
TEST(ServeApi, StreamingFraming) {
  TestServer srv;
  httplib::Client c = srv.Client();
  for (const bool chat : {false, true}) {
    for (const bool usage : {false, true}) {
      SCOPED_TRACE(absl::StrCat(chat ? "chat" : "completions", usage ? " with usage" : ""));
      const std::string fields = absl::StrCat(R"("stream":true,"max_tokens":)", kScriptTokens,
                                              usage ? R"(,"stream_options":{"include_usage":true})" : "");
      const httplib::Result r = c.Post(chat ? "/v1/chat/completions" : "/v1/completions",
                                       chat ? Chat(fields) : Completion(fields), "application/json");
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200) << r->body;
      EXPECT_TRUE(absl::StartsWith(r->get_header_value("Content-Type"), "text/event-stream"));
      std::vector<std::string> payloads = SsePayloads(r->body);
      ASSERT_GE(payloads.size(), 3u);
      EXPECT_EQ(payloads.back(), "[DONE]");
      payloads.pop_back();
      std::vector<Json> chunks;
      for (const std::string& p : payloads) chunks.push_back(Json::parse(p));
      if (usage) {
        const Json last = chunks.back();
        chunks.pop_back();
        EXPECT_TRUE(last["choices"].empty());
        EXPECT_EQ(last["usage"]["completion_tokens"], kScriptTokens);
      }
      std::string text;
      for (size_t i = 0; i < chunks.size(); ++i) {
        const Json& k = chunks[i];
        EXPECT_EQ(k["id"], chunks[0]["id"]);
        EXPECT_EQ(k["object"], chat ? "chat.completion.chunk" : "text_completion");
        ASSERT_EQ(k["choices"].size(), 1u);
        const Json& choice = k["choices"][0];
        const bool last = i + 1 == chunks.size();
        EXPECT_EQ(choice["finish_reason"], last ? Json("length") : Json(nullptr)) << k;
        if (chat) {
          if (i == 0) {
            EXPECT_EQ(choice["delta"]["role"], "assistant");
          }
          text += choice["delta"].value("content", "");
        } else {
          text += choice["text"].get<std::string>();
        }
      }
      EXPECT_EQ(text, ScriptText());  // no character split: no U+FFFD anywhere
    }
  }
}

TEST(ServeApi, AStopTokenEndsTheAnswer) {
  std::vector<int64_t> script = Script();
  script.insert(script.begin() + 6, Tokenizer()->stop_ids().front());  // after "Hello,"
  TestServer srv({}, FakeOptions(), script);
  httplib::Client c = srv.Client();
  const Json j = PostOk(c, "/v1/completions", Completion(R"("max_tokens":100)"));
  EXPECT_EQ(j["choices"][0]["text"], "Hello,");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["completion_tokens"], 7);  // the stop token counts, its text does not show
  EXPECT_TRUE(srv.engine().cancelled().empty());  // the engine finished it itself
}

TEST(ServeApi, StopStringsCutTheTextAndCancelTheRest) {
  TestServer srv;
  httplib::Client c = srv.Client();
  std::string streamed;
  for (const bool stream : {false, true}) {
    const httplib::Result r =
        c.Post("/v1/completions",
               Completion(absl::StrCat(R"("max_tokens":100,"stop":["ld","w)", "\xC3\xB6", R"("],"stream":)",
                                       stream ? "true" : "false")),
               "application/json");
    ASSERT_TRUE(r && r->status == 200);
    if (!stream) {
      const Json j = Json::parse(r->body);
      EXPECT_EQ(j["choices"][0]["text"], "Hello, ");
      EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
      EXPECT_EQ(j["usage"]["completion_tokens"], 10);  // "Hello, " then w, 0xC3, 0xB6
      continue;
    }
    std::vector<std::string> payloads = SsePayloads(r->body);
    ASSERT_EQ(payloads.back(), "[DONE]");
    payloads.pop_back();
    for (const std::string& p : payloads) streamed += Json::parse(p)["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(Json::parse(payloads.back())["choices"][0]["finish_reason"], "stop");
  }
  EXPECT_EQ(streamed, "Hello, ");
  // Both were cut short by the text: the engine, which would have gone on to 100, was told.
  EXPECT_EQ(srv.engine().cancelled().size(), 2u);
}

struct BadCase {
  const char* path;
  std::string body;
  std::optional<std::string> param;  // nullopt: the error names no field
  const char* code;                  // "": none
};

TEST(ServeApi, BadRequestsNameTheFieldAndTheServerGoesOn) {
  TestServer srv({}, FakeOptions(), Script(), TinyModel(/*context=*/128));
  httplib::Client c = srv.Client();
  std::string long_prompt, deep = "prompt";
  for (int i = 0; i < 200; ++i) long_prompt += "word ";
  for (int i = 0; i < 63; ++i) deep += "[0]";  // the 64th level of the body is refused
  const char* kC = "/v1/completions";
  const char* kChat = "/v1/chat/completions";
  const std::vector<BadCase> cases = {
      {kC, R"({"model":"tiny",)", std::nullopt, "invalid_json"},
      {kC, "", std::nullopt, "invalid_json"},
      {kC, "[1,2]", std::nullopt, ""},
      {kC, R"({"model":"gpt-4","prompt":"x"})", "model", "model_not_found"},
      {kC, R"({"prompt":"x"})", "model", ""},
      {kC, R"({"model":"tiny"})", "prompt", ""},
      {kC, Completion(R"("max_tokens":-1)"), "max_tokens", ""},
      {kC, Completion(R"("max_tokens":0)"), "max_tokens", ""},
      {kC, Completion(R"("max_tokens":"5")"), "max_tokens", ""},
      {kC, Completion(R"("max_tokens":1.5)"), "max_tokens", ""},
      {kC, Completion(R"("temperature":"hot")"), "temperature", ""},
      {kC, Completion(R"("temperature":-0.5)"), "temperature", ""},
      {kC, Completion(R"("top_p":0)"), "top_p", ""},
      {kC, Completion(R"("top_k":-1)"), "top_k", ""},
      {kC, Completion(R"("seed":-3)"), "seed", ""},
      {kC, Completion(R"("n":2)"), "n", ""},
      {kC, Completion(R"("stream":1)"), "stream", ""},
      {kC, Completion(R"("stop":[1])"), "stop[0]", ""},
      {kC, Completion(R"("stop":["a","b","c","d","e"])"), "stop", ""},
      {kC, Completion(R"("stop":"")"), "stop", ""},
      {kC, Completion(R"("logprobs":2)"), "logprobs", "unsupported_parameter"},
      {kC, Completion(R"("stream_options":{"include_usage":true})"), "stream_options", ""},
      {kC, R"({"model":"tiny","prompt":["a","b"]})", "prompt", ""},
      {kC, R"({"model":"tiny","prompt":[1,-2]})", "prompt[1]", ""},
      {kC, R"({"model":"tiny","prompt":[1,99999999]})", "prompt[1]", ""},
      {kC, R"({"model":"tiny","prompt":{}})", "prompt", ""},
      {kC, R"({"model":"tiny","prompt":[]})", "prompt", ""},
      {kC, "{\"model\":\"tiny\",\"prompt\":\"a\xff\"}", "prompt", "invalid_utf8"},
      {kC, R"({"model":"tiny","prompt":"\ud800"})", "prompt", "invalid_utf8"},
      {kC, absl::StrCat(R"({"model":"tiny","prompt":")", long_prompt, R"("})"), "prompt", "context_length_exceeded"},
      {kC, absl::StrCat(R"({"model":"tiny","prompt":)", std::string(100, '['), std::string(100, ']'), "}"), deep, ""},
      {kChat, R"({"model":"tiny","messages":[]})", "messages", ""},
      {kChat, R"({"model":"tiny","messages":"hi"})", "messages", ""},
      {kChat, R"({"model":"tiny","messages":[{"role":"tool","content":"x"}]})", "messages[0].role", ""},
      {kChat, R"({"model":"tiny","messages":[{"role":"user"}]})", "messages[0].content", ""},
      {kChat, R"({"model":"tiny","messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
       "messages[0].content[0]", ""},
      {kChat, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"ok\"},{\"role\":\"user\",\"content\":\"\xc3(\"}]}",
       "messages[1].content", "invalid_utf8"},
      {kChat, Chat(R"("max_completion_tokens":-2)"), "max_completion_tokens", ""},
      {kChat, Chat(R"("tools":[{"type":"function"}])"), "tools", "unsupported_parameter"},
  };
  for (const BadCase& bad : cases) {
    SCOPED_TRACE(absl::StrCat(bad.path, " ", bad.body.substr(0, 120)));
    const httplib::Result r = c.Post(bad.path, bad.body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    const Json e = ErrorOf(r->body);
    EXPECT_EQ(e["type"], "invalid_request_error");
    EXPECT_EQ(e["param"], bad.param ? Json(*bad.param) : Json(nullptr));
    EXPECT_EQ(e["code"], *bad.code ? Json(bad.code) : Json(nullptr));
    EXPECT_FALSE(e["message"].get<std::string>().empty());
    if (bad.param) {
      EXPECT_TRUE(absl::StartsWith(e["message"].get<std::string>(), *bad.param));
    }
  }
  EXPECT_TRUE(srv.engine().requests().empty());  // none reached the engine
  const httplib::Result r = c.Post(kC, Completion(""), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

}  // namespace
}  // namespace dt::serve::testing
