// loaders/chat_template: every format dtensor writes against transformers' rendering of the
// checkpoints' templates (tests/fixtures/zoo/chat_templates.json, made by
// tools/reference/make_zoo_fixtures.py), errors where the template raises, and clear refusals of
// the forms it does not write.
#include "dtensor/loaders/chat_template.h"

#include <fstream>
#include <string>
#include <vector>

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
      {"gemma", "Gemma"}};
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
            "Gemma)"}}) {
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
