// TextStream (tools/serve_text.h): streamed text never splits a UTF-8 character, stop strings end
// it at the same place whichever way the tokens arrive, and what it returns, concatenated, is the
// text an independent computation cuts (the decoded bytes as each token arrives, searched whole).
#include "dtensor/tools/serve_text.h"

#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "rapidcheck.h"
#include "rapidcheck/gtest.h"

namespace dt::serve {
namespace {

const loaders::Tokenizer& Tok() {
  static const std::shared_ptr<const loaders::Tokenizer> tok =
      loaders::Tokenizer::Load(DT_FIXTURES_DIR "/gguf/llama-tiny.gguf").value();
  return *tok;
}

// The token whose bytes are `b` alone (byte-level BPE has one for every byte).
int64_t ByteToken(unsigned char b) {
  static const std::map<std::string, int64_t> by_bytes = [] {
    std::map<std::string, int64_t> m;
    for (int64_t id = 0; id < Tok().vocab_size(); ++id) m.emplace(Tok().TokenBytes(id), id);
    return m;
  }();
  return by_bytes.at(std::string(1, static_cast<char>(b)));
}

std::vector<int64_t> ByteTokens(const std::string& text) {
  std::vector<int64_t> ids;
  for (unsigned char b : text) ids.push_back(ByteToken(b));
  return ids;
}

struct Streamed {
  std::vector<std::string> pieces;
  std::string text;
  bool stopped = false;
};

Streamed Stream(const std::vector<int64_t>& ids, const std::vector<std::string>& stops) {
  TextStream s(Tok(), stops);
  Streamed out;
  for (int64_t id : ids) out.pieces.push_back(s.Push(id));
  out.pieces.push_back(s.Finish());
  for (const std::string& p : out.pieces) out.text += p;
  out.stopped = s.stopped();
  return out;
}

// The oracle: after each token, the complete characters of all bytes so far; the first of these
// texts that holds a stop string is cut at its earliest one.
std::pair<std::string, bool> Expected(const std::vector<int64_t>& ids, const std::vector<std::string>& stops) {
  std::string bytes;
  for (int64_t id : ids) {
    bytes += Tok().TokenBytes(id);
    const std::string text = bytes.substr(0, loaders::CompleteUtf8Prefix(bytes));
    size_t first = std::string::npos;
    for (const std::string& s : stops) first = std::min(first, text.find(s));
    if (first != std::string::npos) return {text.substr(0, first), true};
  }
  return {bytes, false};  // valid UTF-8 here (the generators make whole characters)
}

TEST(TextStream, NeverSplitsACharacter) {
  const std::string text = "caf\xC3\xA9 \xE2\x98\x95 \xF0\x9F\x98\x80!";  // café ☕ 😀!
  const Streamed s = Stream(ByteTokens(text), {});
  EXPECT_EQ(s.text, text);
  EXPECT_FALSE(s.stopped);
  for (const std::string& p : s.pieces) EXPECT_TRUE(loaders::IsValidUtf8(p)) << p;
  // The first byte of 😀 returns nothing; its last returns the whole character.
  EXPECT_EQ(s.pieces[10], "");
  EXPECT_EQ(s.pieces[13], "\xF0\x9F\x98\x80");
}

TEST(TextStream, HoldsBackTheStartOfAStopString) {
  const Streamed s = Stream(ByteTokens("Hi!\n\nBye"), {"\n\n"});
  EXPECT_EQ(s.text, "Hi!");
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.pieces[3], "");  // the first "\n" might begin "\n\n"
  // A partial stop string that never completes comes out at the end.
  const Streamed t = Stream(ByteTokens("Hi!\n"), {"\n\n"});
  EXPECT_EQ(t.text, "Hi!\n");
  EXPECT_FALSE(t.stopped);
}

TEST(TextStream, TheFirstStopToAppearWins) {
  // One token brings both "the" and "h": the one that starts first ends the text...
  const std::vector<int64_t> the = Tok().Encode(" the").value();
  ASSERT_EQ(the.size(), 1u);
  EXPECT_EQ(Stream(the, {"h", "the"}).text, " ");
  // ...while byte by byte "h" is whole first.
  EXPECT_EQ(Stream(ByteTokens(" the"), {"h", "the"}).text, " t");
  // Nothing is returned after the stop, even for later tokens.
  TextStream s(Tok(), {"!"});
  EXPECT_EQ(s.Push(ByteToken('a')), "a");
  EXPECT_EQ(s.Push(ByteToken('!')), "");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.Push(ByteToken('b')), "");
  EXPECT_EQ(s.Finish(), "");
}

TEST(TextStream, AStopStringWithAMultibyteStart) {
  const Streamed s = Stream(ByteTokens("a\xC3\xA9\xC3\xA8z"), {"\xC3\xA8z"});  // "aéèz", stop "èz"
  EXPECT_EQ(s.text, "a\xC3\xA9");
  for (const std::string& p : s.pieces) EXPECT_TRUE(loaders::IsValidUtf8(p));
}

// Random texts over an alphabet of 1- to 4-byte characters, as byte tokens or as the tokenizer's
// own merges, with stop strings drawn from the text itself or from the alphabet.
RC_GTEST_PROP(TextStream, PiecesAreTheOracleText, ()) {
  const std::vector<std::string> alphabet = {"a", "b", " ", "\n", "\xC3\xA9", "\xE2\x98\x95", "\xF0\x9F\x98\x80"};
  const auto chars = *rc::gen::container<std::vector<int>>(rc::gen::inRange<int>(0, alphabet.size()));
  std::string text;
  for (int c : chars) text += alphabet[c];
  std::vector<std::string> stops;
  const int n = *rc::gen::inRange(0, 3);
  for (int i = 0; i < n; ++i) {
    const int len = *rc::gen::inRange(1, 4);
    std::string s;
    if (!chars.empty() && *rc::gen::arbitrary<bool>()) {  // a run of the text's characters
      const int at = *rc::gen::inRange<int>(0, chars.size());
      for (int k = at; k < std::min<int>(chars.size(), at + len); ++k) s += alphabet[chars[k]];
    } else {
      for (int k = 0; k < len; ++k) s += alphabet[*rc::gen::inRange<int>(0, alphabet.size())];
    }
    stops.push_back(s);
  }
  const std::vector<int64_t> ids = *rc::gen::arbitrary<bool>() ? ByteTokens(text) : Tok().Encode(text).value();
  const Streamed got = Stream(ids, stops);
  const auto [want, stopped] = Expected(ids, stops);
  RC_ASSERT(got.text == want);
  RC_ASSERT(got.stopped == stopped);
  for (const std::string& p : got.pieces) RC_ASSERT(loaders::IsValidUtf8(p));
}

}  // namespace
}  // namespace dt::serve
