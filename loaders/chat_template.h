#pragma once
// Chat formatting for the templates the supported checkpoints carry. A checkpoint's template is a
// Jinja program (tokenizer_config.json's chat_template, GGUF's tokenizer.chat_template); dtensor
// does not run Jinja: it recognizes the format the program writes and writes it natively.
//
//   format    recognized by                     one message                       generation prompt
//   ChatML    "<|im_start|>" and "<|im_end|>"   <|im_start|>ROLE\nCONTENT<|im_end|>\n   <|im_start|>assistant\n
//             (SmolLM2, Qwen2)                  a default system message written in the template
//                                               (SmolLM2's "You are a helpful AI assistant named
//                                               SmolLM, ...") comes first when the conversation
//                                               does not start with a system message
//   Llama 3   "<|start_header_id|>" and         <|start_header_id|>ROLE<|end_header_id|>\n\n
//             "<|eot_id|>"                      CONTENT (trimmed)<|eot_id|>, after BOS
//                                                                                 <|start_header_id|>assistant<|end_header_id|>\n\n
//
// Anything else — Llama 3.1's date and tool preamble ("Cutting Knowledge Date"), Mistral's
// [INST], Gemma's turns — is Unimplemented naming what was seen, never a silently wrong prompt.
// tests/loaders/tokenizer_test.cc compares both formats with transformers' apply_chat_template.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "dtensor/loaders/tokenizer.h"

namespace dt::loaders {

class ChatTemplate {
 public:
  enum class Format { kChatML, kLlama3 };
  // `bos`: the BOS token's text (Llama 3 starts with it).
  static absl::StatusOr<std::shared_ptr<const ChatTemplate>> Recognize(absl::string_view source,
                                                                       absl::string_view bos);

  Format format() const { return format_; }
  // "ChatML", "Llama 3".
  absl::string_view name() const;
  // The end-of-turn token's text: "<|im_end|>", "<|eot_id|>".
  absl::string_view end_of_turn() const;
  const std::string& default_system() const { return default_system_; }

  // InvalidArgument for an empty conversation or a role other than system, user, assistant.
  absl::StatusOr<std::string> Apply(absl::Span<const ChatMessage> messages,
                                    bool add_generation_prompt) const;

 private:
  Format format_ = Format::kChatML;
  std::string bos_;
  std::string default_system_;
};

}  // namespace dt::loaders
