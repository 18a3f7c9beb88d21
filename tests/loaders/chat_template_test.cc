// loaders/chat_template: every format dtensor writes against transformers' rendering of the
// checkpoints' templates (tests/fixtures/zoo/chat_templates.json, made by
// tools/reference/make_zoo_fixtures.py), errors where the template raises, and clear refusals of
// the forms it does not write.
#include "dtensor/loaders/chat_template.h"

#include <chrono>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "dtensor/tests/test_util.h"

namespace dt::loaders {
namespace {

using dt::testing::Contains;
using Json = nlohmann::json;

Json Goldens() {
  std::ifstream in(std::string(DT_FIXTURES_DIR) + "/zoo/chat_templates.json");
  return Json::parse(in);
}

// Noon (local time) of a "YYYY-MM-DD" day: the time the harmony goldens are rendered at.
std::chrono::system_clock::time_point LocalNoon(const std::string& day) {
  std::tm tm{};
  tm.tm_year = std::stoi(day.substr(0, 4)) - 1900;
  tm.tm_mon = std::stoi(day.substr(5, 2)) - 1;
  tm.tm_mday = std::stoi(day.substr(8, 2));
  tm.tm_hour = 12;
  tm.tm_isdst = -1;
  return std::chrono::system_clock::from_time_t(std::mktime(&tm));
}

std::vector<ChatMessage> Messages(const Json& c) {
  std::vector<ChatMessage> messages;
  for (const Json& m : c["messages"]) {
    messages.push_back({m["role"], m["content"]});
    if (m.contains("thinking")) messages.back().thinking = m["thinking"].get<std::string>();
  }
  return messages;
}

TEST(ChatTemplate, EveryFormatMatchesTransformersRendering) {
  const Json g = Goldens();
  const std::vector<std::pair<std::string, std::string>> formats = {
      {"chatml_qwen2.5", "ChatML"}, {"mistral_v0.2", "Mistral"}, {"phi3", "Phi-3"},
      {"gemma", "Gemma"}, {"gemma3", "Gemma 3"}, {"olmo2", "Tulu"}, {"harmony", "Harmony"}};
  for (const auto& [key, name] : formats) {
    const Json& t = g.at(key);
    auto chat = ChatTemplate::Recognize(t["template"].get<std::string>(),
                                        t["bos"].get<std::string>(), t["eos"].get<std::string>());
    ASSERT_TRUE(chat.ok()) << key << ": " << chat.status();
    EXPECT_EQ((*chat)->name(), name);
    // Harmony's goldens state the date they were rendered at (Note [Harmony]).
    const auto now = t.contains("date") ? LocalNoon(t["date"].get<std::string>())
                                        : std::chrono::system_clock::now();
    for (const Json& c : t["cases"]) {
      auto text = (*chat)->Apply(Messages(c), c["add_generation_prompt"].get<bool>(), now);
      if (c.contains("error")) {
        EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << key << c.dump();
        EXPECT_TRUE(Contains(text.status(), key == "harmony" ? "<|channel|> tags nowhere"
                                                             : "alternating user / assistant"))
            << key << text.status();
      } else {
        ASSERT_TRUE(text.ok()) << key << ": " << text.status() << " " << c.dump();
        EXPECT_EQ(*text, c["text"].get<std::string>()) << key << " " << c.dump();
      }
    }
  }
  // The end of turn each format stops at.
  auto phi = ChatTemplate::Recognize(g["phi3"]["template"].get<std::string>(), "<s>", "</s>");
  EXPECT_EQ((*phi)->end_of_turn(), "<|end|>");
  auto mistral =
      ChatTemplate::Recognize(g["mistral_v0.2"]["template"].get<std::string>(), "<s>", "</s>");
  EXPECT_EQ((*mistral)->end_of_turn(), "</s>");
  auto gemma = ChatTemplate::Recognize(g["gemma"]["template"].get<std::string>(), "<bos>", "<eos>");
  EXPECT_EQ((*gemma)->end_of_turn(), "<end_of_turn>");
  auto gemma3 = ChatTemplate::Recognize(g["gemma3"]["template"].get<std::string>(), "<bos>", "<eos>");
  EXPECT_EQ((*gemma3)->end_of_turn(), "<end_of_turn>");
  auto olmo2 = ChatTemplate::Recognize(g["olmo2"]["template"].get<std::string>(), "<|endoftext|>",
                                       "<|endoftext|>");
  EXPECT_EQ((*olmo2)->end_of_turn(), "<|endoftext|>");
  auto harmony = ChatTemplate::Recognize(g["harmony"]["template"].get<std::string>(),
                                         "<|startoftext|>", "<|return|>");
  EXPECT_EQ((*harmony)->end_of_turn(), "<|return|>");
}

// Note [Harmony]: the system turn states the day of `now` (by default the system clock's); what
// the template would drop or raise on is refused; a thinking goes with harmony's assistants only.
TEST(ChatTemplate, HarmonyDatesItsSystemTurnAndRefusesWhatItDoesNotWrite) {
  const Json g = Goldens();
  auto chat = ChatTemplate::Recognize(g["harmony"]["template"].get<std::string>(),
                                      "<|startoftext|>", "<|return|>");
  ASSERT_TRUE(chat.ok()) << chat.status();
  for (const std::string day : {"2024-02-29", "2031-12-31"}) {
    EXPECT_TRUE(absl::StrContains((*chat)->Apply({{"user", "x"}}, true, LocalNoon(day)).value(),
                                  "\nCurrent date: " + day + "\n\n"))
        << day;
  }
  // The default: today, local time (either side of a midnight passing during the call).
  auto today = [] {
    const std::time_t t = std::time(nullptr);
    std::tm local{};
    localtime_r(&t, &local);
    char date[16];
    return std::string(date, std::strftime(date, sizeof(date), "%Y-%m-%d", &local));
  };
  const std::string before = today();
  const std::string text = (*chat)->Apply({{"user", "x"}}, true).value();
  const std::string after = today();
  EXPECT_TRUE(absl::StrContains(text, "Current date: " + before) ||
              absl::StrContains(text, "Current date: " + after))
      << text;
  EXPECT_TRUE(Contains((*chat)->Apply({{"system", "a"}, {"user", "b"}, {"system", "c"}}, true)
                           .status(),
                       "drops later ones; message 2 is 'system'"));
  ChatMessage tagged{"assistant", "ok"};
  tagged.thinking = "<|channel|>analysis<|message|>hmm";
  EXPECT_TRUE(Contains((*chat)->Apply({{"user", "q"}, tagged}, true).status(),
                       "message 1 (assistant) holds <|channel|>analysis<|message|>"));
  ChatMessage thinking_user{"user", "q"};
  thinking_user.thinking = "t";
  EXPECT_TRUE(Contains((*chat)->Apply({thinking_user}, true).status(),
                       "writes for assistant turns only"));
  auto qwen = ChatTemplate::Recognize(g["chatml_qwen2.5"]["template"].get<std::string>(), "",
                                      "<|im_end|>");
  ChatMessage thinking_assistant{"assistant", "a"};
  thinking_assistant.thinking = "t";
  EXPECT_TRUE(Contains((*qwen)->Apply({{"user", "q"}, thinking_assistant}, false).status(),
                       "message 1 ('assistant') has a thinking, which the ChatML template writes "
                       "nowhere"));
}

// Note [Harmony]: a harmony template that does not write what Apply writes is refused naming the
// piece it lacks: gpt-oss's earlier revisions among them.
TEST(ChatTemplate, HarmonyOfAnotherRevisionIsRefusedNamingThePiece) {
  const std::string source = Goldens()["harmony"]["template"].get<std::string>();
  struct Edit {
    std::string from, to, error;
  };
  for (const Edit& e : std::vector<Edit>{
           {"Knowledge cutoff: 2024-06", "Knowledge cutoff: 2025-01", "the knowledge cutoff"},
           {"set reasoning_effort = \"medium\"", "set reasoning_effort = \"high\"",
            "the default reasoning effort medium"},
           {"You are ChatGPT", "You are GPT", "the model identity"},
           // The revision of 2025-08-07: the blank line only before the tools.
           {"{{- developer_message }}\n        {{- \"\\n\\n\" }}", "{{- developer_message }}",
            "a blank line after the developer's instructions"},
           // The first (2025-08-05): the tool-channel line written without tools too.
           {"Channel must be included for every message.\" }}\n    {%- if tools -%}",
            "Channel must be included for every message.\" }}\n    {%- if true -%}",
            "the tool-channel line only with tools"}}) {
    std::string edited = source;
    const size_t at = edited.find(e.from);
    ASSERT_NE(at, std::string::npos) << e.from;
    edited.replace(at, e.from.size(), e.to);
    auto t = ChatTemplate::Recognize(edited, "<|startoftext|>", "<|return|>");
    EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented) << e.from;
    EXPECT_TRUE(Contains(t.status(), e.error)) << e.from << ": " << t.status();
  }
}

// Gemma 3's separator as the template spells it: Jinja's \n escapes or real newlines, any text;
// Tulu's BOS only where the template writes it.
TEST(ChatTemplate, Gemma3SeparatorAndTuluBosAreTheTemplates) {
  const Json g = Goldens();
  std::string source = g["gemma3"]["template"].get<std::string>();
  const std::string published = "messages[0]['content'] + '\n\n' -%}";
  for (const std::string sep : {"\\n", "--"}) {
    std::string edited = source;
    for (size_t at = edited.find(published); at != std::string::npos;
         at = edited.find(published, at + 1)) {
      edited.replace(at, published.size(), "messages[0]['content'] + '" + sep + "' -%}");
    }
    ASSERT_NE(edited, source);
    auto chat = ChatTemplate::Recognize(edited, "<bos>", "<eos>");
    ASSERT_TRUE(chat.ok()) << chat.status();
    auto text = (*chat)->Apply({{"system", "S"}, {"user", "U"}}, false);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(*text, absl::StrCat("<bos><start_of_turn>user\nS", sep == "--" ? "--" : "\n",
                                  "U<end_of_turn>\n"));
  }
  // A system message past the first is refused, as the template raises on it.
  auto chat = ChatTemplate::Recognize(source, "<bos>", "<eos>");
  EXPECT_TRUE(Contains((*chat)->Apply({{"user", "a"}, {"system", "b"}}, true).status(),
                       "message 1 is 'system'"));
  // Only a system message: it goes with the turn that never comes (what transformers renders).
  EXPECT_EQ((*chat)->Apply({{"system", "S"}}, true).value(), "<bos><start_of_turn>model\n");
  std::string tulu = g["olmo2"]["template"].get<std::string>();
  ASSERT_EQ(tulu.rfind("{{ bos_token }}", 0), 0u);
  auto no_bos = ChatTemplate::Recognize(tulu.substr(15), "<|endoftext|>", "<|endoftext|>");
  ASSERT_TRUE(no_bos.ok()) << no_bos.status();
  EXPECT_EQ((*no_bos)->Apply({{"user", "x"}}, true).value(), "<|user|>\nx\n<|assistant|>\n");
}

TEST(ChatTemplate, FormsItDoesNotWriteAreRefusedNamingThem) {
  struct Refused {
    std::string source, error;
  };
  for (const Refused& r : std::vector<Refused>{
           {"{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
            "{% set system_message = message['content'] %}{% endif %}[INST] ... [/INST]{% endfor %}",
            "Mistral [INST] template has a system role or tools"},
           {"{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}"
            "{{'<|user|>' + '\\n' + message['content'] + '<|end|>' + '\\n' + '<|assistant|>' + "
            "'\\n'}}{% endif %}{% endfor %}",
            "Phi-3's first template form"},
           {"{#- harmony -#}{{- \"<|start|>system<|message|>\" }}{%- for message in messages %}"
            "{{- \"<|start|>\" + message.role + \"<|message|>\" + message.content + \"<|end|>\" }}"
            "{%- endfor %}",
            "this harmony template (<|start|>ROLE<|message|>) does not write the model identity"},
           {"{% for message in messages %}<start_of_turn>{{ message['role'] }}{% endfor %}",
            "chat template not recognized (supported: ChatML, Llama 3, Mistral [INST], Phi-3, "
            "Gemma, Gemma 3, Tulu (OLMo 2), Harmony (gpt-oss))"},
           {"{% for message in messages %}{% if message['role'] == 'system' %}<|system|>\n"
            "{% elif message['role'] == 'user' %}<|user|>\n{% elif not loop.last %}<|assistant|>"
            "{{ eos_token }}{% endif %}{% if add_generation_prompt %}<|assistant|>\n<think>\n"
            "{% endif %}{% endfor %}",
            "this <|user|> / <|assistant|> (Tulu) template has \"<think>\""}}) {
    auto t = ChatTemplate::Recognize(r.source, "<s>", "</s>");
    EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented) << r.source;
    EXPECT_TRUE(Contains(t.status(), r.error)) << r.source;
  }
  // [INST] without an EOS to end assistant turns with.
  EXPECT_TRUE(Contains(ChatTemplate::Recognize("[INST] {{ m }} [/INST]", "<s>", "").status(),
                       "the tokenizer has none"));
}

}  // namespace
}  // namespace dt::loaders
