#pragma once
// The OpenAI API's requests and responses as `dtensor serve` speaks them (tools/serve_http.h holds
// the HTTP side): a request body checked and turned into what the engine runs, and the JSON of
// answers, streamed chunks and errors.
//
//   POST /v1/completions        prompt (a string, token ids, or a list of one of either)
//   POST /v1/chat/completions   messages [{role: system|developer|user|assistant, content: a
//                               string or [{type: "text", text}]}], in the model's chat template
//   both                        model (the served name), max_tokens (completions: 16 by default;
//                               chat: also max_completion_tokens, by default the rest of the
//                               context), temperature (0: greedy; 1 by default, as OpenAI),
//                               top_p, top_k (an extension; 0: off), seed (a sampled request
//                               without one gets one of the server's), n (1 only), stop (a string
//                               or up to 4), stream, stream_options.include_usage
//   refused when not at their     logprobs, top_logprobs, echo, best_of, suffix, logit_bias,
//   neutral value                 presence_penalty, frequency_penalty, tools, functions,
//                                 tool_choice, response_format (not "text")
//   ignored                       any other field (user, metadata, ...)
//
// Errors are absl::Status values whose payloads carry OpenAI's `param` (the field at fault, named
// as a path: "messages[1].content") and `code`; ApiErrorOf turns any Status (the engine's too)
// into the HTTP status and body {"error": {"message", "type", "param", "code"}}:
//
//   status code                       HTTP  type
//   InvalidArgument, OutOfRange       400   invalid_request_error
//   NotFound                          404   not_found_error
//   ResourceExhausted                 429   rate_limit_error   (the queue is full)
//   FailedPrecondition, Unavailable,  503   service_unavailable (draining, stopped, a rank failed)
//   Cancelled
//   DeadlineExceeded                  504   timeout_error      (--request-timeout)
//   anything else                     500   server_error

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dtensor/loaders/tokenizer.h"
#include "dtensor/nn/models/sampling.h"
#include "nlohmann/json_fwd.hpp"

namespace dt::serve {

enum class Endpoint { kCompletions, kChat };

// What the server serves.
struct ModelInfo {
  std::string name;             // the `model` a request must name
  int64_t context_length = 0;   // prompt + answer tokens
  int64_t vocab_size = 0;       // the model's (token id prompts are checked against it)
  std::shared_ptr<const loaders::Tokenizer> tokenizer;
  std::vector<int64_t> stop_ids;  // EOS and the chat format's end of turn
};

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::vector<int64_t> prompt;  // templated (chat) and tokenized; fits the context
  int64_t max_tokens = 16;
  nn::SamplingOptions sampling;
  std::vector<std::string> stop;  // non-empty strings
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// InvalidArgument "FIELD: MESSAGE" whose payloads name FIELD as OpenAI's `param` (and `code`).
absl::Status FieldError(absl::string_view field, absl::string_view message, absl::string_view code = "");

// The body of POST /v1/completions or /v1/chat/completions checked against `model` and turned
// into token ids and options. `seed` is the seed of a sampled request that names none.
absl::StatusOr<GenerationRequest> ParseGenerationRequest(absl::string_view body, Endpoint endpoint,
                                                         const ModelInfo& model, uint64_t seed);

// An error as the API answers it.
struct ApiError {
  int http_status = 500;
  std::string body;  // {"error": {...}}
};
// `http_status` 0: the status's code decides (the table above); else that status (413).
ApiError ApiErrorOf(const absl::Status& status, int http_status = 0);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// The JSON objects of one request's answer (ids, timestamps and the model name fixed at its start).
class ResponseFormat {
 public:
  ResponseFormat(Endpoint endpoint, int64_t serial, int64_t created, std::string model);

  // The whole answer (not streamed). `finish`: "stop" or "length".
  std::string Whole(const std::string& text, absl::string_view finish, const Usage& usage) const;
  // Streamed chunks: chat's first one names the role; then the text as it comes; the last one
  // carries the finish reason and no text; with include_usage, one with the usage and no choices.
  std::string RoleChunk() const;
  std::string TextChunk(const std::string& text) const;
  std::string FinishChunk(absl::string_view finish) const;
  std::string UsageChunk(const Usage& usage) const;

 private:
  // The chunk object around `choice` (null: no choices, e.g. the usage chunk).
  nlohmann::ordered_json Chunk(nlohmann::ordered_json choice) const;
  Endpoint endpoint_;
  std::string id_;
  int64_t created_;
  std::string model_;
};

// One server-sent event: "data: PAYLOAD\n\n" (the stream ends with SseEvent("[DONE]")).
std::string SseEvent(absl::string_view payload);

// GET /v1/models.
std::string ModelsJson(const ModelInfo& model, int64_t created);

}  // namespace dt::serve
