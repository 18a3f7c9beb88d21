// loaders/tokenizer: ids identical to Hugging Face tokenizers / transformers on a corpus of 219
// hard strings (tests/fixtures/gguf, made by tools/reference/make_gguf_fixtures.py) through
// three sources — a tokenizer.json in SmolLM2's layout, the same vocabulary in a GGUF, and one in
// Llama 3's layout (Split regex, ignore_merges, BOS template) — with exact decode round trips,
// streaming decode, chat templates against apply_chat_template, and clear refusals; Gemma's
// SentencePiece BPE from its tokenizer.json and from llama.cpp's GGUF. The real
// SmolLM2 vocabulary (49152 tokens) is checked when its GGUF is cached (label `model`).
#include "dtensor/loaders/tokenizer.h"

#include <filesystem>
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

const std::string kDir = std::string(DT_FIXTURES_DIR) + "/gguf";

Json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return Json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
}

std::vector<int64_t> Ids(const Json& j) { return j.get<std::vector<int64_t>>(); }

void ExpectCorpus(const Tokenizer& tok, const Json& corpus, const Json& ids, const Json* decoded) {
  ASSERT_GE(corpus.size(), 200u);
  int mismatches = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string text = corpus[i].get<std::string>();
    absl::StatusOr<std::vector<int64_t>> got = tok.Encode(text);
    ASSERT_TRUE(got.ok()) << got.status();
    if (*got != Ids(ids[i]) && ++mismatches <= 5) {
      ADD_FAILURE() << "string #" << i << " \"" << text << "\": ids differ";
    }
    const std::string back = tok.Decode(*got).value();
    EXPECT_EQ(back, text) << "#" << i;
    if (decoded != nullptr) {
      EXPECT_EQ(back, (*decoded)[i].get<std::string>()) << "#" << i;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(Tokenizer, TokenizerJsonMatchesHfTokenizers) {
  const Json g = ReadJson(kDir + "/tokenizer_golden.json");
  auto tok = Tokenizer::Load(kDir).value();  // the directory: tokenizer.json + tokenizer_config.json
  EXPECT_EQ(tok->vocab_size(), 414);
  ExpectCorpus(*tok, g["corpus"], g["ids"], &g["decoded"]);
  EXPECT_FALSE(tok->adds_bos());
  EXPECT_EQ(tok->eos_id(), tok->TokenId("<|im_end|>"));
}

TEST(Tokenizer, GgufVocabularyMatchesTransformersGgufTokenizer) {
  const Json g = ReadJson(kDir + "/tokenizer_golden.json");
  auto tok = Tokenizer::Load(kDir + "/llama-tiny.gguf").value();
  ExpectCorpus(*tok, g["corpus"], g["gguf_ids"], nullptr);
  EXPECT_EQ(tok->bos_id(), tok->TokenId("<|im_start|>"));
  EXPECT_EQ(tok->eos_id(), tok->TokenId("<|im_end|>"));
}

// Gemma's SentencePiece BPE (make_gguf_fixtures.py make_gemma_tokenizer): the tokenizer.json in
// transformers' Gemma layout and llama.cpp's conversion of the same model to GGUF give the ids
// of `tokenizers` — which equal sentencepiece's own — and decode back exactly.
TEST(Tokenizer, GemmaSentencePieceMatchesTokenizersAndSentencePiece) {
  const Json g = ReadJson(kDir + "/gemma_tokenizer_golden.json");
  for (const std::string& source : {kDir + "/gemma-tokenizer", kDir + "/gemma-tokenizer/vocab.gguf"}) {
    SCOPED_TRACE(source);
    absl::StatusOr<std::shared_ptr<const Tokenizer>> tok = Tokenizer::Load(source);
    ASSERT_TRUE(tok.ok()) << tok.status();
    EXPECT_EQ((*tok)->vocab_size(), 500);
    ExpectCorpus(**tok, g["corpus"], g["ids"], &g["decoded"]);
    EXPECT_TRUE((*tok)->adds_bos());
    EXPECT_EQ((*tok)->bos_id(), 2);
    EXPECT_EQ((*tok)->eos_id(), 1);
    EXPECT_EQ((*tok)->Encode("Hello world", true).value(), Ids(g["with_bos"]));
    // The turn markers are matched whole, the text around them encoded as SentencePiece does.
    const std::vector<int64_t> ids = (*tok)->Encode("<start_of_turn>user\nHi<end_of_turn>").value();
    ASSERT_GE(ids.size(), 3u);
    EXPECT_EQ(ids.front(), 4);
    EXPECT_EQ(ids.back(), 5);
    EXPECT_EQ((*tok)->Decode(ids).value(), "<start_of_turn>user\nHi<end_of_turn>");
    // A character outside the vocabulary comes back through its byte tokens.
    EXPECT_EQ((*tok)->Decode((*tok)->Encode("日本 ☃").value()).value(), "日本 ☃");
  }
}

TEST(Tokenizer, GemmaLayoutVariantsAreRefused) {
  std::ifstream in(kDir + "/gemma-tokenizer/tokenizer.json");
  const Json j = Json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
  Json other = j;
  other["normalizer"]["content"] = "_";
  EXPECT_TRUE(Contains(Tokenizer::FromJson(other.dump(), "", "t").status(),
                       "byte_fallback BPE reads Gemma's Replace"));
  other = j;
  other["decoder"]["decoders"].erase(2);  // no Fuse
  EXPECT_TRUE(Contains(Tokenizer::FromJson(other.dump(), "", "t").status(),
                       "read with Gemma's decoder only"));
  other = j;
  other["pre_tokenizer"] = Json::parse(R"({"type": "Metaspace", "replacement": "_"})");
  EXPECT_TRUE(Contains(Tokenizer::FromJson(other.dump(), "", "t").status(),
                       "pre_tokenizer of a byte_fallback BPE \"Metaspace\""));
  other = j;
  other["model"]["byte_fallback"] = false;  // a byte-level BPE with Gemma's normalizer
  EXPECT_TRUE(Contains(Tokenizer::FromJson(other.dump(), "", "t").status(), "normalizer"));
}

TEST(Tokenizer, Llama3LayoutWithBosAndChat) {
  const Json g = ReadJson(kDir + "/llama3-tokenizer/golden.json");
  auto tok = Tokenizer::Load(kDir + "/llama3-tokenizer/tokenizer.json").value();
  ExpectCorpus(*tok, g["corpus"], g["ids"], &g["decoded"]);
  EXPECT_TRUE(tok->adds_bos());
  for (size_t i = 0; i < g["ids_with_bos"].size(); ++i) {
    EXPECT_EQ(tok->Encode(g["corpus"][i].get<std::string>(), /*add_bos=*/true).value(),
              Ids(g["ids_with_bos"][i]));
  }
  std::vector<ChatMessage> messages;
  for (const Json& m : g["chat"]["messages"]) messages.push_back({m["role"], m["content"]});
  EXPECT_EQ(tok->ApplyChatTemplate(messages).value(), g["chat"]["text"].get<std::string>());
  EXPECT_EQ(tok->stop_ids(), (std::vector<int64_t>{*tok->TokenId("<|eot_id|>")}));
}

// SmolLM2's template (the fixture tokenizer carries the same text) against transformers'
// apply_chat_template on the real model, with and without a system message.
TEST(Tokenizer, ChatMLWithTheTemplatesDefaultSystem) {
  const Json g = ReadJson(kDir + "/smollm2_golden.json");
  auto tok = Tokenizer::Load(kDir).value();
  for (const char* key : {"chat", "chat_system"}) {
    std::vector<ChatMessage> messages;
    for (const Json& m : g[key]["messages"]) messages.push_back({m["role"], m["content"]});
    EXPECT_EQ(tok->ApplyChatTemplate(messages).value(), g[key]["text"].get<std::string>()) << key;
  }
  EXPECT_TRUE(Contains(tok->ApplyChatTemplate({{"robot", "x"}}).status(), "role 'robot'"));
  EXPECT_TRUE(Contains(tok->ApplyChatTemplate({}).status(), "no messages"));
}

TEST(Tokenizer, StreamingHoldsIncompleteUtf8) {
  auto tok = Tokenizer::Load(kDir).value();
  for (const std::string text : {"emoji 😀🎉👍🏽 and flags 🇫🇷", "中文字符和日本語のテキスト、한국어",
                                 "unicode: café naïve"}) {
    const std::vector<int64_t> ids = tok->Encode(text).value();
    StreamDecoder stream(*tok);
    std::string out;
    int held = 0;
    for (int64_t id : ids) {
      const std::string piece = stream.Push(id);
      EXPECT_TRUE(IsValidUtf8(piece)) << text;
      if (piece.empty()) ++held;
      out += piece;
    }
    out += stream.Finish();
    EXPECT_EQ(out, text);
    if (text[0] != 'u') {
      EXPECT_GT(held, 0) << "byte tokens split a character: " << text;
    }
  }
  EXPECT_EQ(CompleteUtf8Prefix("a\xE2\x82"), 1u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xE2\x82\xAC"), 4u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xFF"), 2u);  // invalid, not incomplete: passed on as U+FFFD
  StreamDecoder s(*tok);
  EXPECT_EQ(s.Push(*tok->TokenId("\xC3\xA2")), "");  // byte 0xE2: a 3-byte lead
  EXPECT_EQ(s.Finish(), "\xEF\xBF\xBD");
}

TEST(Tokenizer, RefusesBadInputClearly) {
  auto tok = Tokenizer::Load(kDir).value();
  EXPECT_TRUE(Contains(tok->Encode("bad \xC3\x28 utf8").status(), "not valid UTF-8"));
  EXPECT_TRUE(Contains(tok->Decode({1, 414}).status(), "id 414 is outside the vocabulary of 414"));
  const std::string json = ReadJson(kDir + "/tokenizer.json").dump();
  auto with = [&](const char* path, const Json& value) {
    Json j = Json::parse(json);
    j[Json::json_pointer(path)] = value;
    return Tokenizer::FromJson(j.dump(), "", "tok").status();
  };
  EXPECT_TRUE(Contains(with("/normalizer", {{"type", "NFC"}}), "normalizer \"NFC\" is not supported"));
  EXPECT_TRUE(Contains(with("/model/byte_fallback", true), "byte_fallback"));
  EXPECT_TRUE(Contains(with("/model/type", "WordPiece"), "model type \"WordPiece\""));
  EXPECT_TRUE(Contains(with("/model/merges/0", Json::array({"h", "zz"})),
                       "merge #0 'h zz' names a token that is not in the vocabulary"));
  EXPECT_TRUE(Contains(with("/pre_tokenizer/pretokenizers/1/add_prefix_space", true),
                       "add_prefix_space"));
  const Json bad_split = {{"type", "Split"}, {"pattern", {{"Regex", "(("}}},
                          {"behavior", "Isolated"}, {"invert", false}};
  EXPECT_TRUE(Contains(with("/pre_tokenizer", bad_split), "does not compile"));
  EXPECT_TRUE(Contains(with("/decoder", nullptr), "only byte-level BPE"));
  EXPECT_TRUE(Contains(Tokenizer::FromJson("{", "", "tok").status(), "malformed tokenizer"));
  // A template of no supported format (Gemma's turns without Gemma's template around them).
  Json config = ReadJson(kDir + "/tokenizer_config.json");
  config["chat_template"] =
      "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
      "{% endfor %}";
  auto gemma = Tokenizer::FromJson(json, config.dump(), "tok").value();
  EXPECT_TRUE(Contains(gemma->ApplyChatTemplate({{"user", "hi"}}).status(),
                       "chat template not recognized (supported: ChatML, Llama 3, Mistral [INST], "
                       "Phi-3, Gemma, Gemma 3, Tulu (OLMo 2), Harmony (gpt-oss))"));
  config.erase("chat_template");
  auto none = Tokenizer::FromJson(json, config.dump(), "tok").value();
  EXPECT_EQ(none->ApplyChatTemplate({{"user", "hi"}}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(Tokenizer::Load("/nonexistent").status(), "no tokenizer at"));
}

// The real vocabulary: SmolLM2-135M-Instruct's GGUF (scripts/fetch-smollm2). Its ids are those
// of SmolLM2's own pre-tokenizer (digits one by one, as its tokenizer.json and llama.cpp's
// "smollm" pre-type split them) through `tokenizers`; transformers' GGUF loader drops that step,
// and the strings where its ids differ (non-ASCII digits) are listed in the golden.
TEST(TokenizerModel, SmolLM2MatchesTransformers) {
  if (!std::filesystem::exists(DT_SMOLLM2_GGUF)) GTEST_SKIP() << DT_SMOLLM2_GGUF << " not cached";
  const Json g = ReadJson(kDir + "/smollm2_golden.json");
  auto tok = Tokenizer::Load(DT_SMOLLM2_GGUF).value();
  EXPECT_EQ(tok->vocab_size(), 49152);
  EXPECT_EQ(tok->bos_id(), g["bos_token_id"].get<int64_t>());
  EXPECT_EQ(tok->eos_id(), g["eos_token_id"].get<int64_t>());
  ExpectCorpus(*tok, g["corpus"], g["corpus_ids"], nullptr);
  EXPECT_GE(g["pre_tokenizer_differs"].size(), 10u);  // the corpus does tell the two apart
  for (const Json& i : g["pre_tokenizer_differs"]) {
    EXPECT_NE(tok->Encode(g["corpus"][i.get<size_t>()].get<std::string>()).value(),
              Ids(g["transformers_gguf_ids"][i.get<size_t>()]));
  }
  for (const char* key : {"chat", "chat_system"}) {
    std::vector<ChatMessage> messages;
    for (const Json& m : g[key]["messages"]) messages.push_back({m["role"], m["content"]});
    EXPECT_EQ(tok->ApplyChatTemplate(messages).value(), g[key]["text"].get<std::string>()) << key;
  }
  for (const Json& p : g["prompts"]) {
    EXPECT_EQ(tok->Encode(p["text"].get<std::string>()).value(), Ids(p["ids"]));
    EXPECT_EQ(tok->Decode(Ids(p["greedy"])).value(), p["greedy_text"].get<std::string>());
  }
}

}  // namespace
}  // namespace dt::loaders
