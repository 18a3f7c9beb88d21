#include "dtensor/loaders/chat_template.h"

#include <algorithm>
#include <ctime>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace dt::loaders {
namespace {

// The text of a ChatML default system message written as a literal in the template:
// '<|im_start|>system\n' + TEXT + '<|im_end|>' inside one quoted Jinja string. "" when none.
std::string DefaultSystem(absl::string_view source) {
  for (absl::string_view head : {"<|im_start|>system\n", "<|im_start|>system\\n"}) {
    size_t at = source.find(head);
    while (at != absl::string_view::npos) {
      const size_t begin = at + head.size();
      const size_t end = source.find("<|im_end|>", begin);
      if (end == absl::string_view::npos) break;
      absl::string_view text = source.substr(begin, end - begin);
      // A literal: no Jinja expression, no closing quote inside.
      if (!absl::StrContains(text, "{{") && !absl::StrContains(text, "{%") &&
          !absl::StrContains(text, "'") && !absl::StrContains(text, "\"") && !text.empty()) {
        return absl::StrReplaceAll(text, {{"\\n", "\n"}});
      }
      at = source.find(head, end);
    }
  }
  return "";
}

// Gemma 3's separator between a system message and the first user turn: the string literal in
// "set first_user_prefix = messages[0]['content'] + '<SEP>'", unescaped as Jinja reads it
// (published templates hold real newlines; a hand-written one may spell them \n). nullopt when
// the template has no such line.
std::optional<std::string> SystemSeparator(absl::string_view source) {
  constexpr absl::string_view kSet = "set first_user_prefix = messages[0]['content'] + '";
  const size_t at = source.find(kSet);
  if (at == absl::string_view::npos) return std::nullopt;
  const size_t begin = at + kSet.size();
  const size_t end = source.find('\'', begin);
  if (end == absl::string_view::npos) return std::nullopt;
  std::string out;
  if (!absl::CUnescape(source.substr(begin, end - begin), &out)) return std::nullopt;
  return out;
}

// Note [Harmony]: what the harmony template must say for Apply to write what it renders, each as
// Jinja spells it in gpt-oss's template of 2025-08-08 with the whitespace removed, and what its
// absence means.
struct HarmonyPiece {
  absl::string_view jinja, meaning;
};
constexpr HarmonyPiece kHarmonyPieces[] = {
    {"\"YouareChatGPT,alargelanguagemodeltrainedbyOpenAI.\"", "the model identity"},
    {"\"Knowledgecutoff:2024-06\\n\"", "the knowledge cutoff 2024-06"},
    {"\"Currentdate:\"+strftime_now(\"%Y-%m-%d\")+\"\\n\\n\"", "today's date"},
    {"setreasoning_effort=\"medium\"", "the default reasoning effort medium"},
    {"\"#Validchannels:analysis,commentary,final.Channelmustbeincludedforeverymessage.\"}}"
     "{%-iftools-%}",
     "the valid-channels line, the tool-channel line only with tools"},
    {"{{-\"#Instructions\\n\\n\"}}{{-developer_message}}{{-\"\\n\\n\"}}",
     "a blank line after the developer's instructions"},
    {"{{-\"<|start|>assistant<|channel|>final<|message|>\"+message.content+\"<|return|>\"}}",
     "the last assistant turn ending with <|return|>"},
};

// Harmony's date line: `now` in local time, as strftime_now("%Y-%m-%d").
std::string LocalDate(std::chrono::system_clock::time_point now) {
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm local{};
  localtime_r(&t, &local);
  char date[16];
  return std::string(date, std::strftime(date, sizeof(date), "%Y-%m-%d", &local));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const ChatTemplate>> ChatTemplate::Recognize(
    absl::string_view source, absl::string_view bos, absl::string_view eos) {
  auto t = std::make_shared<ChatTemplate>();
  t->bos_ = std::string(bos);
  t->eos_ = std::string(eos);
  const std::string head(source.substr(0, 80));
  if (absl::StrContains(source, "<|im_start|>") && absl::StrContains(source, "<|im_end|>")) {
    t->format_ = Format::kChatML;
    t->default_system_ = DefaultSystem(source);
    return std::shared_ptr<const ChatTemplate>(std::move(t));
  }
  if (absl::StrContains(source, "<|start_header_id|>") && absl::StrContains(source, "<|eot_id|>")) {
    if (absl::StrContains(source, "Cutting Knowledge") || absl::StrContains(source, "tools")) {
      return absl::UnimplementedError(absl::StrCat(
          "chat template: Llama 3.1+'s format (date and tool preamble) is not supported; the "
          "template starts \"", absl::CEscape(head), "\""));
    }
    t->format_ = Format::kLlama3;
    return std::shared_ptr<const ChatTemplate>(std::move(t));
  }
  if (absl::StrContains(source, "[INST]") && absl::StrContains(source, "[/INST]")) {
    if (absl::StrContains(source, "system") || absl::StrContains(source, "tools")) {
      return absl::UnimplementedError(absl::StrCat(
          "chat template: this Mistral [INST] template has a system role or tools (Mistral's later "
          "templates); only the v0.1 / v0.2 form is supported; the template starts \"",
          absl::CEscape(head), "\""));
    }
    if (eos.empty()) {
      return absl::FailedPreconditionError(
          "chat template: the Mistral [INST] format ends assistant turns with EOS, and the "
          "tokenizer has none");
    }
    t->format_ = Format::kMistral;
    return std::shared_ptr<const ChatTemplate>(std::move(t));
  }
  if (absl::StrContains(source, "<|user|>") && absl::StrContains(source, "<|assistant|>") &&
      absl::StrContains(source, "<|end|>")) {
    if (!absl::StrContains(source, "<|system|>") ||
        !absl::StrContains(source, "add_generation_prompt")) {
      return absl::UnimplementedError(absl::StrCat(
          "chat template: Phi-3's first template form (an assistant header after every user turn, "
          "no system role) is not supported; the template starts \"",
          absl::CEscape(head), "\""));
    }
    t->format_ = Format::kPhi3;
    return std::shared_ptr<const ChatTemplate>(std::move(t));
  }
  // Note [Harmony]: gpt-oss's <|start|>ROLE<|channel|>...<|message|>CONTENT<|end|>.
  if (absl::StrContains(source, "<|start|>") && absl::StrContains(source, "<|message|>")) {
    std::string compact(source);
    compact.erase(std::remove_if(compact.begin(), compact.end(), absl::ascii_isspace),
                  compact.end());
    for (const HarmonyPiece& piece : kHarmonyPieces) {
      if (!absl::StrContains(compact, piece.jinja)) {
        return absl::UnimplementedError(absl::StrCat(
            "chat template: this harmony template (<|start|>ROLE<|message|>) does not write ",
            piece.meaning, " as gpt-oss's of 2025-08-08 does (it lacks `", piece.jinja,
            "`, whitespace removed): only that revision is supported; the template starts \"",
            absl::CEscape(head), "\""));
      }
    }
    t->format_ = Format::kHarmony;
    return std::shared_ptr<const ChatTemplate>(std::move(t));
  }
  // Gemma and Gemma 2's form raises on a system message; Gemma 3's folds it into the first turn.
  if (absl::StrContains(source, "<start_of_turn>") && absl::StrContains(source, "<end_of_turn>")) {
    t->format_ = Format::kGemma;
    if (absl::StrContains(source, "System role not supported")) {
      return std::shared_ptr<const ChatTemplate>(std::move(t));
    }
    std::optional<std::string> separator = SystemSeparator(source);
    if (separator) {
      t->system_separator_ = *std::move(separator);
      return std::shared_ptr<const ChatTemplate>(std::move(t));
    }
  }
  // Note [Tulu turns]: OLMo 2's <|user|> / <|assistant|> turns without Phi-3's <|end|>.
  if (absl::StrContains(source, "<|user|>") && absl::StrContains(source, "<|assistant|>") &&
      absl::StrContains(source, "<|system|>") && absl::StrContains(source, "eos_token") &&
      absl::StrContains(source, "not loop.last") && !absl::StrContains(source, "<|end|>")) {
    for (absl::string_view extra : {"<think>", "add_bos_token", "loop.first and"}) {
      if (absl::StrContains(source, extra)) {
        return absl::UnimplementedError(absl::StrCat(
            "chat template: this <|user|> / <|assistant|> (Tulu) template has \"", extra,
            "\" (a thinking prompt, a BOS switch or a default system turn), which OLMo 2's "
            "has not; the template starts \"", absl::CEscape(head), "\""));
      }
    }
    t->format_ = Format::kTulu;
    t->tulu_bos_ = absl::StartsWith(source, "{{ bos_token }}");
    return std::shared_ptr<const ChatTemplate>(std::move(t));
  }
  return absl::UnimplementedError(absl::StrCat(
      "chat template not recognized (supported: ChatML, Llama 3, Mistral [INST], Phi-3, Gemma, "
      "Gemma 3, Tulu (OLMo 2), Harmony (gpt-oss)); it starts \"",
      absl::CEscape(head), "\""));
}

absl::string_view ChatTemplate::name() const {
  switch (format_) {
    case Format::kChatML: return "ChatML";
    case Format::kLlama3: return "Llama 3";
    case Format::kMistral: return "Mistral";
    case Format::kPhi3: return "Phi-3";
    case Format::kGemma: return system_separator_ ? "Gemma 3" : "Gemma";
    case Format::kTulu: return "Tulu";
    case Format::kHarmony: return "Harmony";
  }
  return "?";
}

absl::string_view ChatTemplate::end_of_turn() const {
  switch (format_) {
    case Format::kChatML: return "<|im_end|>";
    case Format::kLlama3: return "<|eot_id|>";
    case Format::kMistral: return eos_;
    case Format::kPhi3: return "<|end|>";
    case Format::kGemma: return "<end_of_turn>";
    case Format::kTulu: return eos_;
    case Format::kHarmony: return "<|return|>";
  }
  return "";
}

absl::StatusOr<std::string> ChatTemplate::Apply(absl::Span<const ChatMessage> messages,
                                                bool add_generation_prompt,
                                                std::chrono::system_clock::time_point now) const {
  if (messages.empty()) return absl::InvalidArgumentError("chat: no messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat: role '", m.role, "' is not one of system, user, assistant"));
    }
    if (m.thinking && (format_ != Format::kHarmony || m.role != "assistant")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat: message ", i, " ('", m.role, "') has a thinking, which the ", name(),
          " template writes ",
          format_ == Format::kHarmony ? "for assistant turns only" : "nowhere"));
    }
  }
  if (format_ == Format::kHarmony) return ApplyHarmony(messages, add_generation_prompt, now);
  std::string out;
  // Gemma 3: a leading system message becomes the first turn's prefix.
  std::string prefix;
  if (system_separator_ && messages[0].role == "system") {
    prefix = absl::StrCat(messages[0].content, *system_separator_);
    messages.remove_prefix(1);
  }
  if (format_ == Format::kMistral || format_ == Format::kGemma) {
    // The templates raise on a system message (Gemma 3: past the first) and on roles that do not
    // alternate.
    for (size_t i = 0; i < messages.size(); ++i) {
      const char* want = i % 2 == 0 ? "user" : "assistant";
      if (messages[i].role != want) {
        return absl::InvalidArgumentError(absl::StrCat(
            "chat: the ", format_ == Format::kGemma ? name() : "Mistral [INST]",
            " template takes alternating user / assistant messages from a user message (",
            system_separator_ ? "a system message first at most" : "no system role",
            "); message ", i + (prefix.empty() ? 0 : 1), " is '", messages[i].role, "'"));
      }
    }
  }
  if (format_ == Format::kGemma) {
    out = bos_;
    for (const ChatMessage& m : messages) {
      absl::StrAppend(&out, "<start_of_turn>", m.role == "assistant" ? "model" : m.role, "\n",
                      std::exchange(prefix, ""), absl::StripAsciiWhitespace(m.content),
                      "<end_of_turn>\n");
    }
    if (add_generation_prompt) absl::StrAppend(&out, "<start_of_turn>model\n");
    return out;
  }
  if (format_ == Format::kTulu) {
    // Note [Tulu turns]: nothing is trimmed; an assistant turn ends with EOS, and a newline
    // unless it is the last message.
    if (tulu_bos_) out = bos_;
    for (size_t i = 0; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      absl::StrAppend(&out, "<|", m.role, "|>\n", m.content);
      if (m.role == "assistant") absl::StrAppend(&out, eos_);
      if (m.role != "assistant" || i + 1 < messages.size()) absl::StrAppend(&out, "\n");
    }
    if (add_generation_prompt) absl::StrAppend(&out, "<|assistant|>\n");
    return out;
  }
  if (format_ == Format::kMistral) {
    out = bos_;
    for (size_t i = 0; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      if (m.role == "user") {
        absl::StrAppend(&out, "[INST] ", m.content, " [/INST]");
      } else {
        absl::StrAppend(&out, m.content, eos_);
      }
    }
    return out;
  }
  if (format_ == Format::kPhi3) {
    for (const ChatMessage& m : messages) {
      absl::StrAppend(&out, "<|", m.role, "|>\n", m.content, "<|end|>\n");
    }
    absl::StrAppend(&out, add_generation_prompt ? "<|assistant|>\n" : eos_);
    return out;
  }
  if (format_ == Format::kChatML) {
    if (messages[0].role != "system" && !default_system_.empty()) {
      absl::StrAppend(&out, "<|im_start|>system\n", default_system_, "<|im_end|>\n");
    }
    for (const ChatMessage& m : messages) {
      absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
    }
    if (add_generation_prompt) absl::StrAppend(&out, "<|im_start|>assistant\n");
    return out;
  }
  out = bos_;
  for (const ChatMessage& m : messages) {
    absl::StrAppend(&out, "<|start_header_id|>", m.role, "<|end_header_id|>\n\n",
                    absl::StripAsciiWhitespace(m.content), "<|eot_id|>");
  }
  if (add_generation_prompt) absl::StrAppend(&out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
  return out;
}

absl::StatusOr<std::string> ChatTemplate::ApplyHarmony(
    absl::Span<const ChatMessage> messages, bool add_generation_prompt,
    std::chrono::system_clock::time_point now) const {
  // Note [Harmony].
  std::string out = absl::StrCat(
      "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
      "Knowledge cutoff: 2024-06\nCurrent date: ", LocalDate(now), "\n\nReasoning: medium\n\n"
      "# Valid channels: analysis, commentary, final. Channel must be included for every "
      "message.<|end|>");
  size_t first = 0;
  if (messages[0].role == "system") {
    if (!messages[0].content.empty()) {
      absl::StrAppend(&out, "<|start|>developer<|message|># Instructions\n\n", messages[0].content,
                      "\n\n<|end|>");
    }
    first = 1;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system") {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat: the Harmony template writes a system message only as the first (the developer's "
          "instructions) and drops later ones; message ", i, " is 'system'"));
    }
    if (m.role == "user") {
      absl::StrAppend(&out, "<|start|>user<|message|>", m.content, "<|end|>");
      continue;
    }
    for (absl::string_view text :
         {absl::string_view(m.content), m.thinking ? absl::string_view(*m.thinking) : ""}) {
      for (absl::string_view tag :
           {"<|channel|>analysis<|message|>", "<|channel|>final<|message|>"}) {
        if (absl::StrContains(text, tag)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "chat: message ", i, " (assistant) holds ", tag, ": the Harmony template takes "
              "<|channel|> tags nowhere (the analysis goes in `thinking`, the final answer in "
              "`content`)"));
        }
      }
    }
    if (i + 1 == messages.size() && !add_generation_prompt) {
      if (m.thinking) {
        absl::StrAppend(&out, "<|start|>assistant<|channel|>analysis<|message|>", *m.thinking,
                        "<|end|>");
      }
      absl::StrAppend(&out, "<|start|>assistant<|channel|>final<|message|>", m.content,
                      "<|return|>");
    } else {
      absl::StrAppend(&out, "<|start|>assistant<|channel|>final<|message|>", m.content, "<|end|>");
    }
  }
  if (add_generation_prompt) absl::StrAppend(&out, "<|start|>assistant");
  return out;
}

}  // namespace dt::loaders
