#pragma once
// Chat formatting for the templates the supported checkpoints carry. A checkpoint's template is a
// Jinja program (tokenizer_config.json's chat_template, GGUF's tokenizer.chat_template); dtensor
// does not run Jinja: it recognizes the format the program writes and writes it natively.
//
//   format    recognized by                     one message                       generation prompt
//   ChatML    "<|im_start|>" and "<|im_end|>"   <|im_start|>ROLE\nCONTENT<|im_end|>\n   <|im_start|>assistant\n
//             (SmolLM2, Qwen2, Qwen3)           a default system message written in the template
//                                               (SmolLM2's "You are a helpful AI assistant named
//                                               SmolLM, ...", Qwen2.5's "You are Qwen, ...") comes
//                                               first when the conversation does not start with a
//                                               system message
//   Llama 3   "<|start_header_id|>" and         <|start_header_id|>ROLE<|end_header_id|>\n\n
//             "<|eot_id|>"                      CONTENT (trimmed)<|eot_id|>, after BOS
//                                                                                 <|start_header_id|>assistant<|end_header_id|>\n\n
//   Mistral   "[INST]" and "[/INST]", no        BOS once, then user: [INST] CONTENT [/INST],
//             system role (Mistral-7B-Instruct  assistant: CONTENT</s> (EOS); roles alternate from a
//             v0.1 / v0.2)                      user turn                         (none: the prompt
//                                                                                 ends with [/INST])
//   Phi-3     "<|user|>", "<|assistant|>",      <|ROLE|>\nCONTENT<|end|>\n         <|assistant|>\n
//             "<|end|>" and a <|system|> turn   (without a generation prompt: EOS at the end)
//             (Phi-3 / 3.5 instruct)
//   Gemma     "<start_of_turn>", "<end_of_turn>" BOS once, then <start_of_turn>ROLE\n   <start_of_turn>model\n
//             and no system role (Gemma and     CONTENT (trimmed)<end_of_turn>\n, the
//             Gemma 2 instruct)                 assistant's ROLE "model"; roles alternate from
//                                               a user turn
//   Gemma 3   as Gemma, with "first_user_prefix" as Gemma, a leading system message     as Gemma
//             (Gemma 3 instruct)                written before the first user turn's
//                                               content, followed by the template's
//                                               separator (a blank line)
//   Tulu      "<|user|>", "<|assistant|>",      [BOS] <|ROLE|>\nCONTENT\n; an assistant  <|assistant|>\n
//             "<|system|>", EOS and no <|end|>   turn <|assistant|>\nCONTENT EOS, then \n
//             (OLMo 2 instruct; Tulu 3)         unless it is the last message
//   Harmony   "<|start|>", "<|message|>" and    See Note [Harmony]              <|start|>assistant
//             "<|channel|>" (gpt-oss)
//
// Note [Harmony]: gpt-oss's template (openai/gpt-oss-20b's and -120b's chat_template.jinja of
// 2025-08-08) writes a system turn of its own first,
//   <|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n
//   Knowledge cutoff: 2024-06\nCurrent date: YYYY-MM-DD\n\nReasoning: medium\n\n# Valid channels:
//   analysis, commentary, final. Channel must be included for every message.<|end|>
// with the date of the day it renders (Apply's `now`, local time as transformers' strftime_now);
// then a leading system message as the developer's instructions,
// <|start|>developer<|message|># Instructions\n\nCONTENT\n\n<|end|> (none when it is empty); a user
// turn <|start|>user<|message|>CONTENT<|end|>; an assistant turn
// <|start|>assistant<|channel|>final<|message|>CONTENT<|end|>, its `thinking` dropped, except when
// the conversation ends with it and no generation prompt follows (training): then its thinking,
// when it has one, as <|start|>assistant<|channel|>analysis<|message|>THINKING<|end|> before it,
// and <|return|> instead of <|end|>. The model ends its answer with <|return|> (end_of_turn).
// The template's kwargs (reasoning_effort, model_identity, builtin_tools, tools) and roles
// (developer, tool; tool calls) are not taken; a system message past the first, which the template
// drops without a word, is InvalidArgument, as is <|channel|>analysis/final<|message|> inside an
// assistant's content or thinking (the template raises). A template lacking any of the pieces
// written here (an earlier revision: no blank line after the instructions, the tool-channel line
// always written) is refused naming the piece.
//
// Note [Tulu turns]: OLMo 2's template (Tulu 3's, with BOS first) writes each turn untrimmed, ends
// an assistant turn with EOS (its end of turn), a newline after it only between turns, and takes
// any order of roles; its variants with a thinking prompt, a BOS switch or a default system turn
// are refused.
//
// Anything else — Llama 3.1's date and tool preamble ("Cutting Knowledge Date"), Mistral's later
// templates with a system role or tools, Phi-3's first template (an assistant header after every
// user turn), a <start_of_turn> template of neither Gemma form, a harmony template of another
// revision than gpt-oss's of 2025-08-08 — is Unimplemented naming what was seen, never a silently
// wrong prompt. tests/loaders/chat_template_test.cc compares every format with transformers'
// rendering of the template (tools/reference/make_zoo_fixtures.py), tokenizer_test.cc ChatML and
// Llama 3 through real tokenizers.

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace dt::loaders {

// One turn of a conversation (Tokenizer::ApplyChatTemplate, ChatTemplate::Apply).
struct ChatMessage {
  std::string role;  // system, user, assistant
  std::string content;
  // An assistant turn's reasoning (harmony's analysis channel; See Note [Harmony]); the other
  // formats have none and refuse one.
  std::optional<std::string> thinking = std::nullopt;
};

class ChatTemplate {
 public:
  enum class Format { kChatML, kLlama3, kMistral, kPhi3, kGemma, kTulu, kHarmony };
  // `bos`, `eos`: the BOS and EOS tokens' texts (Llama 3 and Mistral start with BOS; Mistral ends
  // an assistant turn with EOS).
  static absl::StatusOr<std::shared_ptr<const ChatTemplate>> Recognize(absl::string_view source,
                                                                       absl::string_view bos,
                                                                       absl::string_view eos = "");

  Format format() const { return format_; }
  // "ChatML", "Llama 3", "Mistral", "Phi-3", "Gemma", "Gemma 3", "Tulu", "Harmony".
  absl::string_view name() const;
  // The end-of-turn token's text: "<|im_end|>", "<|eot_id|>", EOS (Mistral), "<|end|>",
  // "<end_of_turn>", EOS (Tulu), "<|return|>" (Harmony).
  absl::string_view end_of_turn() const;
  const std::string& default_system() const { return default_system_; }

  // InvalidArgument for an empty conversation, a role other than system, user, assistant, a
  // thinking outside harmony's assistant turns, or a conversation the format cannot write
  // (Mistral, Gemma: a system message — Gemma 3: past the first —, roles that do not alternate
  // from a user turn — the template raises on both; Harmony: See Note [Harmony]). `now`: the
  // date Harmony's system turn states (tests fix it).
  absl::StatusOr<std::string> Apply(
      absl::Span<const ChatMessage> messages, bool add_generation_prompt,
      std::chrono::system_clock::time_point now = std::chrono::system_clock::now()) const;

 private:
  // Note [Harmony]: Apply's writing of the Harmony format (roles and thinkings checked).
  absl::StatusOr<std::string> ApplyHarmony(absl::Span<const ChatMessage> messages,
                                           bool add_generation_prompt,
                                           std::chrono::system_clock::time_point now) const;

  Format format_ = Format::kChatML;
  std::string bos_, eos_;
  std::string default_system_;
  // Gemma 3: what follows a system message folded into the first user turn ("\n\n").
  std::optional<std::string> system_separator_;
  bool tulu_bos_ = false;  // Tulu: the template starts with BOS (OLMo 2's)
};

}  // namespace dt::loaders
