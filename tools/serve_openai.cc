#include "dtensor/tools/serve_openai.h"

#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"
#include "nlohmann/json.hpp"

namespace dt::serve {
namespace {

// Keys in the order written (id first), as OpenAI's answers read.
using Json = nlohmann::ordered_json;

constexpr absl::string_view kParamPayload = "dtensor.serve/param";
constexpr absl::string_view kCodePayload = "dtensor.serve/code";

// Text in answers is valid UTF-8 by construction (the tokenizer's stream decoder); `replace` keeps
// dump from throwing should anything else slip through.
std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string TypeName(const Json& j) {
  if (j.is_number_integer()) return "an integer";
  if (j.is_number()) return "a number";
  if (j.is_string()) return "a string";
  if (j.is_boolean()) return "a boolean";
  if (j.is_null()) return "null";
  if (j.is_array()) return "an array";
  return "an object";
}

// Note [Naming the field of a bad byte]
// nlohmann's parser refuses a string that is not UTF-8 (or holds a lone surrogate escape) as a
// parse error at a byte offset. To name the field that string belongs to, the parse follows its
// own events: a stack of the open objects (with the last key seen) and arrays (with the elements
// completed so far) is the path of the value being read when the error comes. The same stack
// bounds the nesting (kMaxDepth): a body of a million '[' parses without recursion, but printing
// or destroying what it builds would recurse that deep.
constexpr size_t kMaxDepth = 64;
struct TooDeep {};  // thrown by the tracker out of the parse, caught in ParseJson

struct PathTracker {
  struct Frame {
    bool array = false;
    std::string key;
    int64_t index = 0;
  };
  std::vector<Frame> stack;

  bool operator()(int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (stack.size() == kMaxDepth) throw TooDeep{};
        stack.push_back({event == Json::parse_event_t::array_start, "", 0});
        break;
      case Json::parse_event_t::key: stack.back().key = parsed.get<std::string>(); break;
      case Json::parse_event_t::value:
        if (!stack.empty() && stack.back().array) ++stack.back().index;
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        stack.pop_back();
        if (!stack.empty() && stack.back().array) ++stack.back().index;
        break;
    }
    return true;
  }
  std::string Path() const {
    std::string path;
    for (size_t i = 0; i < stack.size(); ++i) {
      const Frame& f = stack[i];
      if (f.array) {
        absl::StrAppend(&path, "[", f.index, "]");
      } else if (!f.key.empty()) {
        absl::StrAppend(&path, i == 0 ? "" : ".", f.key);
      }
    }
    return path;
  }
};

absl::StatusOr<Json> ParseJson(absl::string_view body) {
  PathTracker tracker;
  try {
    return Json::parse(body.begin(), body.end(), std::ref(tracker));
  } catch (const TooDeep&) {
    return FieldError(tracker.Path(), absl::StrCat("nests deeper than ", kMaxDepth, " levels"));
  } catch (const Json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 33: ..." without its tag.
    std::string what = e.what();
    if (const size_t tag = what.find("] "); what.front() == '[' && tag != std::string::npos) what.erase(0, tag + 2);
    if (what.find("UTF-8") != std::string::npos || what.find("surrogate") != std::string::npos) {
      return FieldError(tracker.Path(), absl::StrCat("not valid UTF-8 (byte ", e.byte - 1, " of the body)"),
                        "invalid_utf8");
    }
    return FieldError("", absl::StrCat("the body is not valid JSON: ", what), "invalid_json");
  }
}

// Typed fields: nullopt when absent or null; an error naming the field for another type.
absl::StatusOr<std::optional<int64_t>> IntField(const Json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return std::optional<int64_t>();
  if (!it->is_number_integer()) {
    return FieldError(name, absl::StrCat("must be an integer, got ", TypeName(*it)));
  }
  if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{INT64_MAX}) {
    return FieldError(name, absl::StrCat("must fit in 64 bits, got ", it->dump()));
  }
  return std::optional<int64_t>(it->get<int64_t>());
}

absl::StatusOr<std::optional<double>> NumberField(const Json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number()) return FieldError(name, absl::StrCat("must be a number, got ", TypeName(*it)));
  return std::optional<double>(it->get<double>());
}

absl::StatusOr<bool> BoolField(const Json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return false;
  if (!it->is_boolean()) return FieldError(name, absl::StrCat("must be a boolean, got ", TypeName(*it)));
  return it->get<bool>();
}

// The fields of features this server does not have: a request that sets one to anything but its
// neutral value is refused rather than answered without it.
absl::Status RefuseUnsupported(const Json& j) {
  auto neutral = [](absl::string_view name, const Json& v) {
    if (v.is_null()) return true;
    if (name == "logprobs" || name == "echo") return v.is_boolean() && !v.get<bool>();
    if (name == "best_of") return v.is_number_integer() && v.get<int64_t>() == 1;
    if (name == "suffix") return v.is_string() && v.get<std::string>().empty();
    if (name == "presence_penalty" || name == "frequency_penalty" || name == "top_logprobs") {
      return v.is_number() && v.get<double>() == 0;
    }
    if (name == "tool_choice") return v.is_string() && v.get<std::string>() == "none";
    if (name == "response_format") return v.is_object() && v.value("type", "") == "text";
    return (v.is_array() || v.is_object()) && v.empty();  // logit_bias, tools, functions
  };
  for (const char* name : {"logprobs", "top_logprobs", "echo", "best_of", "suffix", "logit_bias",
                           "presence_penalty", "frequency_penalty", "tools", "functions",
                           "tool_choice", "response_format"}) {
    auto it = j.find(name);
    if (it != j.end() && !neutral(name, *it)) {
      return FieldError(name, absl::StrCat("is not supported by this server (got ", Dump(*it), ")"),
                        "unsupported_parameter");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> TokenIds(const Json& list, const std::string& field,
                                              const ModelInfo& model) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& v = list[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= model.vocab_size) {
      return FieldError(absl::StrCat(field, "[", i, "]"),
                        absl::StrCat("must be a token id in [0, ", model.vocab_size, "), got ", Dump(v)));
    }
    ids.push_back(v.get<int64_t>());
  }
  return ids;
}

// The completions prompt: a string, token ids, or a list of one of either.
absl::StatusOr<std::vector<int64_t>> CompletionPrompt(const Json& j, const ModelInfo& model) {
  auto it = j.find("prompt");
  if (it == j.end() || it->is_null()) return FieldError("prompt", "is required");
  const Json* p = &*it;
  std::string field = "prompt";
  if (p->is_array() && !p->empty() && (p->front().is_string() || p->front().is_array())) {
    if (p->size() != 1) {
      return FieldError("prompt", absl::StrCat("holds ", p->size(),
                                               " prompts; this server answers one per request"));
    }
    p = &p->front();
    field = "prompt[0]";
  }
  if (p->is_string()) {
    absl::StatusOr<std::vector<int64_t>> ids = model.tokenizer->Encode(p->get<std::string>(), /*add_bos=*/true);
    if (!ids.ok()) return FieldError(field, ids.status().message());
    return ids;
  }
  if (p->is_array()) return TokenIds(*p, field, model);
  return FieldError(field, absl::StrCat("must be a string or a list of token ids, got ", TypeName(*p)));
}

// The chat messages in the model's template.
absl::StatusOr<std::vector<int64_t>> ChatPrompt(const Json& j, const ModelInfo& model) {
  auto it = j.find("messages");
  if (it == j.end() || it->is_null()) return FieldError("messages", "is required");
  if (!it->is_array() || it->empty()) {
    return FieldError("messages", absl::StrCat("must be a non-empty array of messages, got ",
                                               it->is_array() ? "an empty one" : TypeName(*it)));
  }
  std::vector<loaders::ChatMessage> messages;
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& m = (*it)[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return FieldError(at, absl::StrCat("must be an object, got ", TypeName(m)));
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return FieldError(at + ".role", "must be a string");
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";  // OpenAI's newer name for the system role
    if (r != "system" && r != "user" && r != "assistant") {
      return FieldError(at + ".role", absl::StrCat("must be system, developer, user or assistant, got '",
                                                   role->get<std::string>(), "'"));
    }
    auto content = m.find("content");
    std::string text;
    if (content != m.end() && content->is_string()) {
      text = content->get<std::string>();
    } else if (content != m.end() && content->is_array()) {  // [{type: text, text}]
      for (size_t k = 0; k < content->size(); ++k) {
        const Json& part = (*content)[k];
        const std::string pat = absl::StrCat(at, ".content[", k, "]");
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return FieldError(pat, "only parts {\"type\": \"text\", \"text\": STRING} are supported");
        }
        text += part["text"].get<std::string>();
      }
    } else {
      return FieldError(at + ".content", absl::StrCat("must be a string or an array of text parts, got ",
                                                      content == m.end() ? "nothing" : TypeName(*content)));
    }
    messages.push_back({r, std::move(text)});
  }
  absl::StatusOr<std::string> text = model.tokenizer->ApplyChatTemplate(messages);
  if (!text.ok()) return FieldError("messages", text.status().message());
  absl::StatusOr<std::vector<int64_t>> ids = model.tokenizer->Encode(*text, /*add_bos=*/false);
  if (!ids.ok()) return FieldError("messages", ids.status().message());
  return ids;
}

absl::StatusOr<std::vector<std::string>> StopStrings(const Json& j) {
  auto it = j.find("stop");
  std::vector<std::string> stops;
  if (it == j.end() || it->is_null()) return stops;
  if (it->is_string()) {
    stops.push_back(it->get<std::string>());
  } else if (it->is_array() && it->size() <= 4) {
    for (size_t i = 0; i < it->size(); ++i) {
      if (!(*it)[i].is_string()) {
        return FieldError(absl::StrCat("stop[", i, "]"), absl::StrCat("must be a string, got ", TypeName((*it)[i])));
      }
      stops.push_back((*it)[i].get<std::string>());
    }
  } else {
    return FieldError("stop", absl::StrCat("must be a string or an array of at most 4 strings, got ",
                                           it->is_array() ? absl::StrCat(it->size(), " of them") : TypeName(*it)));
  }
  for (const std::string& s : stops) {
    if (s.empty()) return FieldError("stop", "holds an empty string");
  }
  return stops;
}

absl::StatusOr<nn::SamplingOptions> Sampling(const Json& j, uint64_t default_seed) {
  nn::SamplingOptions s;
  DT_ASSIGN_OR_RETURN(std::optional<double> temperature, NumberField(j, "temperature"));
  DT_ASSIGN_OR_RETURN(std::optional<double> top_p, NumberField(j, "top_p"));
  DT_ASSIGN_OR_RETURN(std::optional<int64_t> top_k, IntField(j, "top_k"));
  DT_ASSIGN_OR_RETURN(std::optional<int64_t> seed, IntField(j, "seed"));
  s.temperature = temperature.value_or(1.0);
  if (!std::isfinite(s.temperature) || s.temperature < 0) {
    return FieldError("temperature", absl::StrCat("must be a finite number >= 0, got ", s.temperature));
  }
  s.top_p = top_p.value_or(1.0);
  if (!(s.top_p > 0 && s.top_p <= 1)) return FieldError("top_p", absl::StrCat("must be in (0, 1], got ", s.top_p));
  s.top_k = top_k.value_or(0);
  if (s.top_k < 0) return FieldError("top_k", absl::StrCat("must be an integer >= 0 (0: off), got ", s.top_k));
  if (seed && *seed < 0) return FieldError("seed", absl::StrCat("must be an integer >= 0, got ", *seed));
  s.seed = seed ? static_cast<uint64_t>(*seed) : default_seed;
  s.greedy = s.temperature == 0;
  if (s.greedy) s.temperature = 1.0;  // unused; keeps the options valid
  return s;
}

std::string Type(int http_status) {
  switch (http_status) {
    case 400: return "invalid_request_error";
    case 404: return "not_found_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    case 504: return "timeout_error";
    default: return "server_error";
  }
}

}  // namespace

absl::Status FieldError(absl::string_view field, absl::string_view message, absl::string_view code) {
  absl::Status s = absl::InvalidArgumentError(field.empty() ? std::string(message)
                                                            : absl::StrCat(field, ": ", message));
  if (!field.empty()) s.SetPayload(kParamPayload, absl::Cord(field));
  if (!code.empty()) s.SetPayload(kCodePayload, absl::Cord(code));
  return s;
}

absl::StatusOr<GenerationRequest> ParseGenerationRequest(absl::string_view body, Endpoint endpoint,
                                                         const ModelInfo& model, uint64_t seed) {
  DT_ASSIGN_OR_RETURN(const Json j, ParseJson(body));
  if (!j.is_object()) return FieldError("", absl::StrCat("the body must be a JSON object, got ", TypeName(j)));
  auto name = j.find("model");
  if (name == j.end() || !name->is_string()) {
    return FieldError("model", absl::StrCat("must be a string naming the model ('", model.name, "')"));
  }
  if (name->get<std::string>() != model.name) {
    return FieldError("model", absl::StrCat("unknown model '", name->get<std::string>(), "'; this server serves '",
                                            model.name, "' (GET /v1/models)"),
                      "model_not_found");
  }
  DT_RETURN_IF_ERROR(RefuseUnsupported(j));
  DT_ASSIGN_OR_RETURN(std::optional<int64_t> n, IntField(j, "n"));
  if (n && *n != 1) return FieldError("n", absl::StrCat("must be 1 (one answer per request), got ", *n));

  GenerationRequest r;
  r.endpoint = endpoint;
  const bool chat = endpoint == Endpoint::kChat;
  const char* prompt_field = chat ? "messages" : "prompt";
  if (chat) {
    DT_ASSIGN_OR_RETURN(r.prompt, ChatPrompt(j, model));
  } else {
    DT_ASSIGN_OR_RETURN(r.prompt, CompletionPrompt(j, model));
  }
  const int64_t prompt_tokens = static_cast<int64_t>(r.prompt.size());
  if (prompt_tokens == 0) return FieldError(prompt_field, "is empty (no tokens)");
  if (prompt_tokens >= model.context_length) {
    return FieldError(prompt_field,
                      absl::StrCat("is ", prompt_tokens, " tokens; the model's context is ", model.context_length,
                                   " tokens, and at least one must be left for the answer"),
                      "context_length_exceeded");
  }

  // Chat's newer max_completion_tokens wins over max_tokens.
  const char* max_field = "max_tokens";
  DT_ASSIGN_OR_RETURN(std::optional<int64_t> max_tokens, IntField(j, "max_tokens"));
  if (chat) {
    DT_ASSIGN_OR_RETURN(std::optional<int64_t> max_completion, IntField(j, "max_completion_tokens"));
    if (max_completion) {
      max_tokens = max_completion;
      max_field = "max_completion_tokens";
    }
  }
  r.max_tokens = max_tokens.value_or(chat ? model.context_length - prompt_tokens : 16);
  if (r.max_tokens < 1) {
    return FieldError(max_field, absl::StrCat("must be an integer >= 1, got ", r.max_tokens));
  }
  DT_ASSIGN_OR_RETURN(r.sampling, Sampling(j, seed));
  DT_ASSIGN_OR_RETURN(r.stop, StopStrings(j));
  DT_ASSIGN_OR_RETURN(r.stream, BoolField(j, "stream"));
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!r.stream) return FieldError("stream_options", "is only allowed with stream: true");
    if (!it->is_object()) return FieldError("stream_options", absl::StrCat("must be an object, got ", TypeName(*it)));
    absl::StatusOr<bool> usage = BoolField(*it, "include_usage");
    if (!usage.ok()) return FieldError("stream_options.include_usage", "must be a boolean");
    r.include_usage = *usage;
  }
  return r;
}

ApiError ApiErrorOf(const absl::Status& status, int http_status) {
  ApiError e;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange: e.http_status = 400; break;
    case absl::StatusCode::kNotFound: e.http_status = 404; break;
    case absl::StatusCode::kResourceExhausted: e.http_status = 429; break;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled: e.http_status = 503; break;
    case absl::StatusCode::kDeadlineExceeded: e.http_status = 504; break;
    default: e.http_status = 500; break;
  }
  if (http_status != 0) e.http_status = http_status;
  Json err = {{"message", std::string(status.message())},
              {"type", Type(e.http_status)},
              {"param", nullptr},
              {"code", nullptr}};
  if (auto p = status.GetPayload(kParamPayload)) err["param"] = std::string(*p);
  if (auto c = status.GetPayload(kCodePayload)) err["code"] = std::string(*c);
  e.body = Dump(Json{{"error", err}});
  return e;
}

ResponseFormat::ResponseFormat(Endpoint endpoint, int64_t serial, int64_t created, std::string model)
    : endpoint_(endpoint),
      id_(absl::StrCat(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-", serial)),
      created_(created),
      model_(std::move(model)) {}

namespace {

Json UsageJson(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

}  // namespace

std::string ResponseFormat::Whole(const std::string& text, absl::string_view finish, const Usage& usage) const {
  const bool chat = endpoint_ == Endpoint::kChat;
  Json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", std::string(finish)}};
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  return Dump({{"id", id_},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"created", created_},
               {"model", model_},
               {"choices", Json::array({choice})},
               {"usage", UsageJson(usage)}});
}

Json ResponseFormat::Chunk(Json choice) const {
  Json j = {{"id", id_},
            {"object", endpoint_ == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", model_},
            {"choices", Json::array()}};
  if (!choice.is_null()) j["choices"].push_back(std::move(choice));
  return j;
}

std::string ResponseFormat::RoleChunk() const {
  return Dump(Chunk({{"index", 0},
                     {"delta", {{"role", "assistant"}, {"content", ""}}},
                     {"logprobs", nullptr},
                     {"finish_reason", nullptr}}));
}

std::string ResponseFormat::TextChunk(const std::string& text) const {
  Json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (endpoint_ == Endpoint::kChat) {
    choice["delta"] = {{"content", text}};
  } else {
    choice["text"] = text;
  }
  return Dump(Chunk(std::move(choice)));
}

std::string ResponseFormat::FinishChunk(absl::string_view finish) const {
  Json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", std::string(finish)}};
  if (endpoint_ == Endpoint::kChat) {
    choice["delta"] = Json::object();
  } else {
    choice["text"] = "";
  }
  return Dump(Chunk(std::move(choice)));
}

std::string ResponseFormat::UsageChunk(const Usage& usage) const {
  Json j = Chunk(nullptr);
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string SseEvent(absl::string_view payload) { return absl::StrCat("data: ", payload, "\n\n"); }

std::string ModelsJson(const ModelInfo& model, int64_t created) {
  return Dump({{"object", "list"},
               {"data", Json::array({{{"id", model.name},
                                      {"object", "model"},
                                      {"created", created},
                                      {"owned_by", "dtensor"},
                                      {"context_length", model.context_length}}})}});
}

}  // namespace dt::serve
