// loaders/chat_template: every format dtensor writes against transformers' rendering of the
// checkpoints' templates (tests/fixtures/zoo/chat_templates.json, made by
// tools/reference/make_zoo_fixtures.py), errors where the template raises, and clear refusals of
// the forms it does not write.
#include "dtensor/loaders/chat_template.h"

#include <fstream>
#include <string>
#include <vector>

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

TEST(ChatTemplate, EveryFormatMatchesTransformersRendering) {
  const Json g = Goldens();
  const std::vector<std::pair<std::string, std::string>> formats = {
      {"chatml_qwen2.5", "ChatML"}, {"mistral_v0.2", "Mistral"}, {"phi3", "Phi-3"},
      {"gemma", "Gemma"}, {"gemma3", "Gemma 3"}, {"olmo2", "Tulu"}};
  for (const auto& [key, name] : formats) {
    const Json& t = g.at(key);
    auto chat = ChatTemplate::Recognize(t["template"].get<std::string>(),
                                        t["bos"].get<std::string>(), t["eos"].get<std::string>());
    ASSERT_TRUE(chat.ok()) << key << ": " << chat.status();
    EXPECT_EQ((*chat)->name(), name);
    for (const Json& c : t["cases"]) {
      std::vector<ChatMessage> messages;
      for (const Json& m : c["messages"]) messages.push_back({m["role"], m["content"]});
      auto text = (*chat)->Apply(messages, c["add_generation_prompt"].get<bool>());
      if (c.contains("error")) {
        EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << key << c.dump();
        EXPECT_TRUE(Contains(text.status(), "alternating user / assistant")) << key;
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
            "gpt-oss's harmony format"},
           {"{% for message in messages %}<start_of_turn>{{ message['role'] }}{% endfor %}",
            "chat template not recognized (supported: ChatML, Llama 3, Mistral [INST], Phi-3, "
            "Gemma, Gemma 3, Tulu (OLMo 2))"},
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
