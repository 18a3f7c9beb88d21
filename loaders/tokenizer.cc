#include "dtensor/loaders/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <queue>
#include <tuple>
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/chat_template.h"
#include "dtensor/loaders/gguf.h"
#include "dtensor/loaders/small_file.h"
#include "nlohmann/json.hpp"

namespace dt::loaders {
namespace {

using Json = nlohmann::json;

// The split regexes (Hugging Face tokenizers' and llama.cpp's).
constexpr const char* kGpt2Split =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// The UTF-8 sequence at s[i]: *need is its full length by the lead byte (0 for a byte that
// cannot start one), *ok how many of its bytes are valid so far (overlongs and surrogates are
// invalid, as in the Unicode standard's "maximal subpart" rule).
void Utf8Scan(absl::string_view s, size_t i, size_t* need, size_t* ok) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  uint32_t lo = 0x80, hi = 0xBF;  // the second byte's range
  size_t n = 0;
  if (c < 0x80) {
    n = 1;
  } else if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  }
  *need = n;
  *ok = 1;
  for (size_t k = 1; k < n && i + k < s.size(); ++k) {
    const unsigned char b = static_cast<unsigned char>(s[i + k]);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
    ++*ok;
  }
}

// The length of the valid UTF-8 sequence at s[i], 0 when invalid or incomplete.
size_t Utf8At(absl::string_view s, size_t i) {
  size_t need = 0, ok = 0;
  Utf8Scan(s, i, &need, &ok);
  return need > 0 && ok == need ? need : 0;
}

// Replaces each maximal invalid subpart with U+FFFD (as Rust's from_utf8_lossy).
std::string Utf8Lossy(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    size_t need = 0, ok = 0;
    Utf8Scan(s, i, &need, &ok);
    if (need > 0 && ok == need) {
      out.append(s.data() + i, need);
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += ok;
  }
  return out;
}

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to U+0100 onwards.
const std::array<uint32_t, 256>& ByteChars() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      t[b] = printable ? b : next++;
    }
    return t;
  }();
  return table;
}

struct Regex {
  pcre2_code* code = nullptr;
  std::string pattern;
  ~Regex() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

absl::StatusOr<std::unique_ptr<Regex>> CompileRegex(const std::string& pattern, bool literal,
                                                    absl::string_view what) {
  auto r = std::make_unique<Regex>();
  r->pattern = pattern;
  int err = 0;
  PCRE2_SIZE at = 0;
  r->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0), &err, &at,
                          nullptr);
  if (r->code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return absl::InvalidArgumentError(absl::StrCat(what, ": split pattern \"", pattern,
                                                   "\" does not compile at offset ", at, ": ",
                                                   reinterpret_cast<const char*>(msg)));
  }
  return r;
}

}  // namespace

bool IsValidUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8At(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

size_t CompleteUtf8Prefix(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t need = 0, ok = 0;
    Utf8Scan(s, i, &need, &ok);
    if (need > 0 && ok < need && i + ok == s.size()) return i;  // its last bytes are to come
    i += ok;
  }
  return s.size();
}

struct Tokenizer::Impl {
  std::unordered_map<std::string, int64_t> vocab;  // token text -> id
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  std::array<int64_t, 256> byte_id{};  // the id of each byte's character (-1: not in the vocab)
  std::unordered_map<uint32_t, uint8_t> char_byte;  // byte character -> byte
  std::vector<std::unique_ptr<Regex>> splits;
  bool ignore_merges = false;
  std::optional<int64_t> unk;
  // Added tokens matched whole in the text, by first byte, longest first.
  std::array<std::vector<std::pair<std::string, int64_t>>, 256> added;
  std::vector<bool> is_added;  // id -> decoded as its text
  // Note [SentencePiece BPE]: spaces as U+2581, characters merged, bytes as <0xXX> tokens.
  bool sentencepiece = false;
  std::vector<float> scores;  // GGUF: a pair merges by its piece's score (empty: merges' ranks)
  std::array<int64_t, 256> byte_token{};  // the id of <0xXX> (-1: none)
  std::vector<int16_t> token_byte;        // id -> the byte a <0xXX> token stands for, else -1
  bool fuse_unk = false;

  absl::Status AddToken(const std::string& text, int64_t id) {
    if (text.empty()) return absl::InvalidArgumentError("an added token is empty");
    auto& list = added[static_cast<unsigned char>(text[0])];
    list.emplace_back(text, id);
    std::stable_sort(list.begin(), list.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    if (id >= 0 && id < static_cast<int64_t>(is_added.size())) is_added[id] = true;
    return absl::OkStatus();
  }

  // The BPE of one pre-tokenized piece (raw bytes).
  absl::Status Bpe(absl::string_view piece, std::vector<int64_t>* out) const {
    if (ignore_merges) {
      std::string mapped;
      for (unsigned char b : piece) AppendUtf8(ByteChars()[b], &mapped);
      auto it = vocab.find(mapped);
      if (it != vocab.end()) {
        out->push_back(it->second);
        return absl::OkStatus();
      }
    }
    std::vector<int64_t> sym;
    sym.reserve(piece.size());
    for (unsigned char b : piece) {
      if (byte_id[b] < 0) {
        if (!unk) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tokenizer: byte 0x", absl::Hex(b), " has no token and there is no unk token"));
        }
        sym.push_back(*unk);
      } else {
        sym.push_back(byte_id[b]);
      }
    }
    while (sym.size() > 1) {
      int32_t best = std::numeric_limits<int32_t>::max();
      size_t at = 0;
      int32_t merged = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        auto it = merges.find(static_cast<uint64_t>(sym[i]) << 32 | static_cast<uint64_t>(sym[i + 1]));
        if (it != merges.end() && it->second.first < best) {
          best = it->second.first;
          at = i;
          merged = it->second.second;
        }
      }
      if (best == std::numeric_limits<int32_t>::max()) break;
      sym[at] = merged;
      sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    out->insert(out->end(), sym.begin(), sym.end());
    return absl::OkStatus();
  }

  // Note [SentencePiece BPE]: `text` (spaces already U+2581) as characters merged pairwise, the
  // best pair first — the lowest merge rank (tokenizer.json) or the highest score of the merged
  // piece (GGUF), the leftmost among equals — until no adjacent pair merges; a piece outside the
  // vocabulary becomes its bytes' <0xXX> tokens (else unk).
  absl::Status SentencePiece(absl::string_view text, std::vector<int64_t>* out) const {
    struct Symbol {
      size_t start = 0, len = 0;
      int64_t prev = -1, next = -1;
    };
    std::vector<Symbol> sym;
    for (size_t i = 0; i < text.size();) {
      const size_t n = std::max<size_t>(1, Utf8At(text, i));
      const int64_t at = static_cast<int64_t>(sym.size());
      sym.push_back({i, n, at - 1, at + 1});
      i += n;
    }
    if (sym.empty()) return absl::OkStatus();
    sym.back().next = -1;
    auto id_of = [&](size_t start, size_t len) -> int64_t {
      auto it = vocab.find(std::string(text.substr(start, len)));
      return it == vocab.end() ? -1 : it->second;
    };
    // A candidate: (priority, left symbol's start, left index, right index, merged length).
    using Pair = std::tuple<double, size_t, int64_t, int64_t, size_t>;
    std::priority_queue<Pair, std::vector<Pair>, std::greater<>> queue;
    auto consider = [&](int64_t l, int64_t r) {
      if (l < 0 || r < 0) return;
      const size_t len = sym[l].len + sym[r].len;
      double priority = 0;
      if (!scores.empty()) {
        const int64_t id = id_of(sym[l].start, len);
        if (id < 0) return;
        priority = -static_cast<double>(scores[static_cast<size_t>(id)]);
      } else {
        const int64_t a = id_of(sym[l].start, sym[l].len), b = id_of(sym[r].start, sym[r].len);
        if (a < 0 || b < 0) return;
        auto it = merges.find(static_cast<uint64_t>(a) << 32 | static_cast<uint64_t>(b));
        if (it == merges.end()) return;
        priority = it->second.first;
      }
      queue.emplace(priority, sym[l].start, l, r, len);
    };
    for (int64_t i = 0; i + 1 < static_cast<int64_t>(sym.size()); ++i) consider(i, i + 1);
    while (!queue.empty()) {
      const auto [priority, start, l, r, len] = queue.top();
      queue.pop();
      // Stale: a side merged since (its length changed, or it was absorbed: len 0).
      if (sym[l].len == 0 || sym[r].len == 0 || sym[l].len + sym[r].len != len || sym[l].next != r) {
        continue;
      }
      sym[l].len = len;
      sym[r].len = 0;
      sym[l].next = sym[r].next;
      if (sym[r].next >= 0) sym[sym[r].next].prev = l;
      consider(sym[l].prev, l);
      consider(l, sym[l].next);
    }
    bool last_unk = false;
    for (int64_t i = 0; i >= 0; i = sym[i].next) {
      const int64_t id = id_of(sym[i].start, sym[i].len);
      if (id >= 0) {
        out->push_back(id);
        last_unk = false;
        continue;
      }
      const absl::string_view piece = text.substr(sym[i].start, sym[i].len);
      const bool bytes = std::all_of(piece.begin(), piece.end(), [&](char c) {
        return byte_token[static_cast<unsigned char>(c)] >= 0;
      });
      if (bytes) {
        for (unsigned char c : piece) out->push_back(byte_token[c]);
        last_unk = false;
        continue;
      }
      if (!unk) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tokenizer: '", piece, "' has no token, no byte tokens and there is no unk token"));
      }
      if (!(fuse_unk && last_unk)) out->push_back(*unk);
      last_unk = true;
    }
    return absl::OkStatus();
  }

  // Splits every piece at the matches of each regex in turn, keeping matches and gaps.
  absl::StatusOr<std::vector<std::string>> PreTokenize(absl::string_view text) const {
    std::vector<std::string> pieces = {std::string(text)};
    for (const auto& re : splits) {
      std::vector<std::string> next;
      pcre2_match_data* md = pcre2_match_data_create_from_pattern(re->code, nullptr);
      struct Free {
        pcre2_match_data* md;
        ~Free() { pcre2_match_data_free(md); }
      } free_md{md};
      for (const std::string& p : pieces) {
        size_t start = 0, last = 0;
        while (start <= p.size()) {
          const int rc = pcre2_match(re->code, reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                                     start, PCRE2_NO_UTF_CHECK, md, nullptr);
          if (rc == PCRE2_ERROR_NOMATCH) break;
          if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof(msg));
            return absl::ResourceExhaustedError(absl::StrCat(
                "tokenizer: the split regex failed on a piece of ", p.size(), " bytes: ",
                reinterpret_cast<const char*>(msg)));
          }
          const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
          const size_t b = ov[0], e = ov[1];
          if (e == b) {  // an empty match: step over one character
            start = b + std::max<size_t>(1, b < p.size() ? Utf8At(p, b) : 1);
            continue;
          }
          if (b > last) next.push_back(p.substr(last, b - last));
          next.push_back(p.substr(b, e - b));
          last = start = e;
        }
        if (last < p.size()) next.push_back(p.substr(last));
      }
      pieces = std::move(next);
    }
    return pieces;
  }
};

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

namespace {

// "a b" (tokenizer.json's older form and GGUF's) as its two tokens.
absl::StatusOr<std::pair<std::string, std::string>> ParseMerge(absl::string_view what,
                                                               const std::string& s) {
  const size_t sp = s.find(' ', 1);
  if (sp == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": merge '", s, "' is not 'a b'"));
  }
  return std::make_pair(s.substr(0, sp), s.substr(sp + 1));
}

// Fills the vocabulary, merges and byte tables shared by both sources.
absl::Status BuildVocab(absl::string_view what, const std::vector<std::string>& tokens,
                        const std::vector<std::pair<std::string, std::string>>& merges,
                        Tokenizer::Impl* impl) {
  impl->is_added.assign(tokens.size(), false);
  for (size_t id = 0; id < tokens.size(); ++id) impl->vocab.emplace(tokens[id], static_cast<int64_t>(id));
  if (merges.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max() - 1)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": too many merges"));
  }
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = impl->vocab.find(a), ib = impl->vocab.find(b), im = impl->vocab.find(a + b);
    if (ia == impl->vocab.end() || ib == impl->vocab.end() || im == impl->vocab.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": merge #", rank, " '", a, " ", b, "' names a token that is not in the vocabulary"));
    }
    // The first (lowest-ranked) occurrence of a pair wins, as in tokenizers.
    impl->merges.emplace(static_cast<uint64_t>(ia->second) << 32 | static_cast<uint64_t>(ib->second),
                         std::make_pair(static_cast<int32_t>(rank), static_cast<int32_t>(im->second)));
  }
  for (uint32_t b = 0; b < 256; ++b) {
    std::string c;
    AppendUtf8(ByteChars()[b], &c);
    auto it = impl->vocab.find(c);
    impl->byte_id[b] = it == impl->vocab.end() ? -1 : it->second;
    impl->char_byte[ByteChars()[b]] = static_cast<uint8_t>(b);
  }
  return absl::OkStatus();
}

// Note [SentencePiece BPE]: the byte tokens "<0xXX>" (`is_byte(id)` says which tokens may be one).
template <typename IsByte>
void SetByteTokens(const std::vector<std::string>& tokens, IsByte is_byte, Tokenizer::Impl* impl) {
  impl->sentencepiece = true;
  impl->byte_token.fill(-1);
  impl->token_byte.assign(tokens.size(), -1);
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string& t = tokens[id];
    int value = 0;
    if (t.size() == 6 && absl::StartsWith(t, "<0x") && t[5] == '>' && is_byte(id) &&
        absl::SimpleHexAtoi(t.substr(3, 2), &value) &&
        std::isxdigit(static_cast<unsigned char>(t[3])) &&
        std::isxdigit(static_cast<unsigned char>(t[4]))) {
      impl->byte_token[static_cast<size_t>(value)] = static_cast<int64_t>(id);
      impl->token_byte[id] = static_cast<int16_t>(value);
    }
  }
}

absl::Status Unsupported(absl::string_view what, absl::string_view field, const Json& value) {
  return absl::UnimplementedError(
      absl::StrCat(what, ": ", field, " ", value.dump(), " is not supported"));
}

// The pre-tokenizer of tokenizer.json as split regexes; *byte_level: a ByteLevel step was seen.
absl::Status ParsePreTokenizer(absl::string_view what, const Json& p, Tokenizer::Impl* impl,
                               bool* byte_level) {
  if (p.is_null()) return absl::OkStatus();
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const Json& step : p.at("pretokenizers")) {
      DT_RETURN_IF_ERROR(ParsePreTokenizer(what, step, impl, byte_level));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    if (p.value("add_prefix_space", false)) {
      return Unsupported(what, "pre_tokenizer ByteLevel add_prefix_space", p["add_prefix_space"]);
    }
    *byte_level = true;
    if (p.value("use_regex", true)) {
      DT_ASSIGN_OR_RETURN(auto re, CompileRegex(kGpt2Split, false, what));
      impl->splits.push_back(std::move(re));
    }
    return absl::OkStatus();
  }
  if (type == "Digits") {
    DT_ASSIGN_OR_RETURN(auto re, CompileRegex(p.value("individual_digits", false) ? R"(\p{N})"
                                                                                  : R"(\p{N}+)",
                                              false, what));
    impl->splits.push_back(std::move(re));
    return absl::OkStatus();
  }
  if (type == "Split") {
    if (p.value("behavior", "") != "Isolated") {
      return Unsupported(what, "pre_tokenizer Split behavior", p.value("behavior", Json()));
    }
    if (p.value("invert", false)) return Unsupported(what, "pre_tokenizer Split invert", true);
    const Json& pat = p.at("pattern");
    const bool literal = pat.contains("String");
    const std::string text = literal ? pat.at("String").get<std::string>()
                                     : pat.at("Regex").get<std::string>();
    DT_ASSIGN_OR_RETURN(auto re, CompileRegex(text, literal, what));
    impl->splits.push_back(std::move(re));
    return absl::OkStatus();
  }
  return Unsupported(what, "pre_tokenizer type", p.value("type", Json()));
}

// Note [SentencePiece BPE]: Gemma's tokenizer.json steps (transformers' GemmaConverter).
const Json& SpaceToMetaspace() {
  static const Json* const j = new Json(Json::parse(
      R"({"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"})"));
  return *j;
}
const Json& SplitOnSpace() {
  static const Json* const j = new Json(Json::parse(
      R"({"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
          "invert": false})"));
  return *j;
}
const Json& SentencePieceDecoder() {
  static const Json* const j = new Json(Json::parse(
      R"({"type": "Sequence", "decoders": [
          {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
          {"type": "ByteFallback"}, {"type": "Fuse"}]})"));
  return *j;
}

// The text of a special token in tokenizer_config.json: "x", {"content": "x"}, or null.
std::optional<std::string> ConfigToken(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) return it->at("content").get<std::string>();
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Tokenizer>> Tokenizer::FromJson(absl::string_view json,
                                                                     absl::string_view config_json,
                                                                     absl::string_view what) {
  std::shared_ptr<Tokenizer> t(new Tokenizer());
  try {
    const Json j = Json::parse(json.begin(), json.end());
    const Json config = config_json.empty() ? Json::object()
                                            : Json::parse(config_json.begin(), config_json.end());
    if (!j.is_object() || !config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": must be a JSON object"));
    }
    const Json& model = j.at("model");
    if (model.value("type", "") != "BPE") return Unsupported(what, "model type", model.value("type", Json()));
    if (!model.value("dropout", Json()).is_null()) return Unsupported(what, "BPE dropout", model["dropout"]);
    // Note [SentencePiece BPE]: byte_fallback is Gemma's layout, spaces normalized to U+2581.
    const bool sentencepiece = model.value("byte_fallback", false);
    const Json normalizer = j.value("normalizer", Json());
    if (sentencepiece ? normalizer != SpaceToMetaspace() : !normalizer.is_null()) {
      return Unsupported(what, sentencepiece ? "normalizer (byte_fallback BPE reads Gemma's "
                                               "Replace \" \" -> \"\u2581\" only)"
                                             : "normalizer",
                         normalizer.is_object() ? normalizer.value("type", Json()) : normalizer);
    }
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const Json v = model.value(k, Json());
      if (!v.is_null() && v != "") return Unsupported(what, absl::StrCat("BPE ", k), v);
    }
    t->impl_->ignore_merges = model.value("ignore_merges", false);
    const Json& vocab = model.at("vocab");
    int64_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) max_id = std::max(max_id, it->get<int64_t>());
    for (const Json& a : j.value("added_tokens", Json::array())) max_id = std::max(max_id, a.at("id").get<int64_t>());
    if (max_id < 0 || max_id > (int64_t{1} << 24)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": vocabulary ids up to ", max_id));
    }
    t->tokens_.assign(static_cast<size_t>(max_id + 1), "");
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const int64_t id = it->get<int64_t>();
      if (id < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": negative id ", id));
      t->tokens_[static_cast<size_t>(id)] = it.key();
    }
    std::vector<std::pair<std::string, std::string>> merges;
    for (const Json& m : model.at("merges")) {
      if (m.is_string()) {
        DT_ASSIGN_OR_RETURN(auto merge, ParseMerge(what, m.get<std::string>()));
        merges.push_back(std::move(merge));
      } else {
        merges.emplace_back(m.at(0).get<std::string>(), m.at(1).get<std::string>());
      }
    }
    for (const Json& a : j.value("added_tokens", Json::array())) {
      t->tokens_[a.at("id").get<size_t>()] = a.at("content").get<std::string>();
    }
    DT_RETURN_IF_ERROR(BuildVocab(what, t->tokens_, merges, t->impl_.get()));
    for (const Json& a : j.value("added_tokens", Json::array())) {
      for (const char* k : {"lstrip", "rstrip", "single_word"}) {
        if (a.value(k, false)) {
          return Unsupported(what, absl::StrCat("added token ", a.at("content").dump(), " ", k), true);
        }
      }
      DT_RETURN_IF_ERROR(t->impl_->AddToken(a.at("content").get<std::string>(), a.at("id").get<int64_t>()));
    }
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      auto it = t->impl_->vocab.find(model["unk_token"].get<std::string>());
      if (it != t->impl_->vocab.end()) t->impl_->unk = it->second;
    }
    const Json decoder = j.value("decoder", Json());
    if (sentencepiece) {
      // After the normalizer no space is left: Gemma's Split(" ", MergedWithPrevious) splits
      // nothing.
      const Json pre = j.value("pre_tokenizer", Json());
      if (!pre.is_null() && pre != SplitOnSpace()) {
        return Unsupported(what, "pre_tokenizer of a byte_fallback BPE", pre.value("type", Json()));
      }
      if (decoder != SentencePieceDecoder()) {
        return absl::UnimplementedError(absl::StrCat(
            what, ": a byte_fallback BPE is read with Gemma's decoder only (Replace \"\u2581\" "
                  "-> \" \", ByteFallback, Fuse)"));
      }
      SetByteTokens(t->tokens_, [](size_t) { return true; }, t->impl_.get());
      t->impl_->fuse_unk = model.value("fuse_unk", false);
    } else {
      bool byte_level = false;
      DT_RETURN_IF_ERROR(ParsePreTokenizer(what, j.value("pre_tokenizer", Json()), t->impl_.get(), &byte_level));
      if (!byte_level || decoder.is_null() || decoder.value("type", "") != "ByteLevel") {
        return absl::UnimplementedError(absl::StrCat(
            what, ": only byte-level BPE (a ByteLevel pre-tokenizer and decoder) and Gemma's "
                  "byte_fallback BPE are supported"));
      }
    }
    // BOS: the post-processor's template, then tokenizer_config's add_bos_token.
    const Json post = j.value("post_processor", Json());
    std::vector<Json> steps;
    if (!post.is_null()) {
      if (post.value("type", "") == "Sequence") {
        for (const Json& s : post.at("processors")) steps.push_back(s);
      } else {
        steps.push_back(post);
      }
    }
    for (const Json& s : steps) {
      const std::string type = s.value("type", "");
      if (type == "ByteLevel") continue;
      if (type != "TemplateProcessing") return Unsupported(what, "post_processor", s.value("type", Json()));
      const Json& single = s.at("single");
      if (!single.empty() && single[0].contains("SpecialToken")) {
        t->add_bos_ = true;
        auto it = t->impl_->vocab.find(single[0]["SpecialToken"].at("id").get<std::string>());
        if (it != t->impl_->vocab.end()) t->bos_ = it->second;
      }
    }
    if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
      t->add_bos_ = config["add_bos_token"].get<bool>();
    }
    for (auto [key, slot] : {std::pair{"bos_token", &t->bos_}, std::pair{"eos_token", &t->eos_}}) {
      if (std::optional<std::string> text = ConfigToken(config, key)) {
        auto it = t->impl_->vocab.find(*text);
        if (it == t->impl_->vocab.end()) {
          return absl::InvalidArgumentError(absl::StrCat(what, ": ", key, " '", *text,
                                                         "' is not in the vocabulary"));
        }
        *slot = it->second;
      }
    }
    if (t->add_bos_ && !t->bos_) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": adds a BOS token but names none"));
    }
    std::string chat;
    if (config.contains("chat_template")) {
      const Json& c = config["chat_template"];
      if (c.is_string()) {
        chat = c.get<std::string>();
      } else if (c.is_array()) {
        for (const Json& e : c) {
          if (e.value("name", "") == "default") chat = e.value("template", "");
        }
      }
    }
    t->SetChatTemplate(chat.empty() ? std::nullopt : std::optional<std::string>(chat),
                       absl::StrCat(what, " has no chat template"));
  } catch (const std::exception& e) {  // nlohmann must not throw past this boundary
    return absl::InvalidArgumentError(absl::StrCat(what, ": malformed tokenizer (", e.what(), ")"));
  }
  return std::shared_ptr<const Tokenizer>(std::move(t));
}

namespace {

// tokenizer.ggml.scores: one finite float per token (Note [SentencePiece BPE]).
absl::StatusOr<std::vector<float>> Scores(const GgufFile& f, size_t tokens) {
  const std::string key = "tokenizer.ggml.scores";
  const GgufValue* v = f.Find(key);
  const GgufArray* a = v != nullptr ? v->AsArray() : nullptr;
  if (a == nullptr || a->element_type != GgufValue::kF32 || !a->kept ||
      a->size != static_cast<int64_t>(tokens)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gguf '", f.path(), "': a SentencePiece vocabulary needs '", key, "', ", tokens,
        " f32 scores; got ", v != nullptr ? v->ToString() : "none"));
  }
  std::vector<float> out(tokens);
  std::memcpy(out.data(), a->bytes.data(), tokens * sizeof(float));
  for (float x : out) {
    if (!std::isfinite(x)) {
      return absl::InvalidArgumentError(absl::StrCat("gguf '", f.path(), "': '", key,
                                                     "' holds ", x));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Tokenizer>> Tokenizer::FromGguf(const GgufFile& f) {
  const std::string what = absl::StrCat("gguf '", f.path(), "'");
  DT_ASSIGN_OR_RETURN(std::string model, f.GetString("tokenizer.ggml.model"));
  if (model != "gpt2" && model != "llama") {
    return absl::UnimplementedError(absl::StrCat(
        what, ": tokenizer.ggml.model '", model,
        "' is not supported (gpt2: byte-level BPE; llama: SentencePiece BPE)"));
  }
  const bool sentencepiece = model == "llama";
  DT_ASSIGN_OR_RETURN(std::optional<std::string> pre, f.GetOptionalString("tokenizer.ggml.pre"));
  std::vector<const char*> splits;
  const std::string p = pre.value_or("default");
  if (sentencepiece) {
    // Note [SentencePiece BPE]: llama.cpp puts a space before the text unless the file says
    // add_space_prefix false (Gemma's); Llama 2's and Mistral's dummy prefix is not implemented.
    const GgufValue* prefix = f.Find("tokenizer.ggml.add_space_prefix");
    const bool* no_prefix = prefix != nullptr ? std::get_if<bool>(&prefix->value) : nullptr;
    if (no_prefix == nullptr || *no_prefix) {
      return absl::UnimplementedError(absl::StrCat(
          what, ": a SentencePiece vocabulary with a space prefix (tokenizer.ggml.add_space_prefix ",
          prefix != nullptr ? prefix->ToString() : "absent: true", ") is not supported; Gemma's "
          "says false"));
    }
  } else if (p == "gpt2" || p == "default") {
    splits = {kGpt2Split};
  } else if (p == "smollm") {
    splits = {R"(\p{N})", kGpt2Split};
  } else if (p == "llama-bpe" || p == "llama3") {
    splits = {kLlama3Split};
  } else if (p == "qwen2") {
    splits = {kQwen2Split};
  } else {
    return absl::UnimplementedError(absl::StrCat(
        what, ": tokenizer.ggml.pre '", p, "' is not supported (gpt2, smollm, llama-bpe, qwen2)"));
  }
  std::shared_ptr<Tokenizer> t(new Tokenizer());
  for (const char* s : splits) {
    DT_ASSIGN_OR_RETURN(auto re, CompileRegex(s, false, what));
    t->impl_->splits.push_back(std::move(re));
  }
  DT_ASSIGN_OR_RETURN(t->tokens_, f.GetStrings("tokenizer.ggml.tokens"));
  std::vector<std::pair<std::string, std::string>> merges;
  if (f.Find("tokenizer.ggml.merges") != nullptr) {
    DT_ASSIGN_OR_RETURN(std::vector<std::string> text, f.GetStrings("tokenizer.ggml.merges"));
    for (const std::string& m : text) {
      DT_ASSIGN_OR_RETURN(auto merge, ParseMerge(what, m));
      merges.push_back(std::move(merge));
    }
  }
  DT_RETURN_IF_ERROR(BuildVocab(what, t->tokens_, merges, t->impl_.get()));
  std::vector<int64_t> types;
  if (f.Find("tokenizer.ggml.token_type") != nullptr) {
    DT_ASSIGN_OR_RETURN(types, f.GetInts("tokenizer.ggml.token_type"));
    if (types.size() != t->tokens_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": tokenizer.ggml.token_type has ",
                                                     types.size(), " entries for ",
                                                     t->tokens_.size(), " tokens"));
    }
  }
  if (sentencepiece) {
    DT_ASSIGN_OR_RETURN(t->impl_->scores, Scores(f, t->tokens_.size()));
    // Byte tokens are type 6 (llama.cpp's LLAMA_TOKEN_TYPE_BYTE).
    SetByteTokens(t->tokens_, [&](size_t id) { return !types.empty() && types[id] == 6; },
                  t->impl_.get());
    // llama.cpp adds BOS to a SentencePiece vocabulary's text unless the file says otherwise.
    t->add_bos_ = true;
    DT_ASSIGN_OR_RETURN(std::optional<int64_t> unk,
                        f.GetOptionalInt("tokenizer.ggml.unknown_token_id"));
    if (unk && (*unk < 0 || *unk >= t->vocab_size())) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": tokenizer.ggml.unknown_token_id ",
                                                     *unk, " is outside the vocabulary"));
    }
    t->impl_->unk = unk;
  }
  // Control (3) and user-defined (4) tokens are matched whole in the text.
  if (!types.empty()) {
    for (size_t id = 0; id < types.size(); ++id) {
      if ((types[id] == 3 || types[id] == 4) && !t->tokens_[id].empty()) {
        DT_RETURN_IF_ERROR(t->impl_->AddToken(t->tokens_[id], static_cast<int64_t>(id)));
      }
    }
  }
  const int64_t n = t->vocab_size();
  for (auto [key, slot] : {std::pair{"tokenizer.ggml.bos_token_id", &t->bos_},
                           std::pair{"tokenizer.ggml.eos_token_id", &t->eos_}}) {
    DT_ASSIGN_OR_RETURN(std::optional<int64_t> id, f.GetOptionalInt(key));
    if (id && (*id < 0 || *id >= n)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", key, " ", *id,
                                                     " is outside the vocabulary of ", n));
    }
    *slot = id;
  }
  if (const GgufValue* add = f.Find("tokenizer.ggml.add_bos_token")) {
    if (const bool* b = std::get_if<bool>(&add->value)) t->add_bos_ = *b;
  }
  DT_ASSIGN_OR_RETURN(std::optional<std::string> chat, f.GetOptionalString("tokenizer.chat_template"));
  t->SetChatTemplate(chat, absl::StrCat(what, " has no tokenizer.chat_template"));
  return std::shared_ptr<const Tokenizer>(std::move(t));
}

absl::StatusOr<std::shared_ptr<const Tokenizer>> Tokenizer::Load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec) && GgufFile::HasMagic(path)) {
    DT_ASSIGN_OR_RETURN(std::shared_ptr<const GgufFile> f, GgufFile::Open(path));
    return FromGguf(*f);
  }
  const fs::path file = fs::is_directory(path, ec) ? fs::path(path) / "tokenizer.json" : fs::path(path);
  if (!fs::exists(file, ec)) {
    return absl::NotFoundError(absl::StrCat("no tokenizer at '", path,
                                            "' (a GGUF file, tokenizer.json, or a directory with one)"));
  }
  DT_ASSIGN_OR_RETURN(const std::string json, ReadSmallFile(file.string(), int64_t{512} << 20));
  std::string config;
  const fs::path config_path = file.parent_path() / "tokenizer_config.json";
  if (fs::exists(config_path, ec)) {
    DT_ASSIGN_OR_RETURN(config, ReadSmallFile(config_path.string(), int64_t{64} << 20));
  }
  return FromJson(json, config, absl::StrCat("tokenizer '", file.string(), "'"));
}

absl::StatusOr<std::vector<int64_t>> Tokenizer::Encode(absl::string_view text, bool add_bos) const {
  if (!IsValidUtf8(text)) return absl::InvalidArgumentError("tokenizer: text is not valid UTF-8");
  std::vector<int64_t> ids;
  if (add_bos && add_bos_ && bos_) ids.push_back(*bos_);
  auto encode_plain = [&](absl::string_view plain) -> absl::Status {
    if (plain.empty()) return absl::OkStatus();
    if (impl_->sentencepiece) {
      return impl_->SentencePiece(absl::StrReplaceAll(plain, {{" ", "\u2581"}}), &ids);
    }
    DT_ASSIGN_OR_RETURN(std::vector<std::string> pieces, impl_->PreTokenize(plain));
    for (const std::string& p : pieces) DT_RETURN_IF_ERROR(impl_->Bpe(p, &ids));
    return absl::OkStatus();
  };
  size_t plain_start = 0;
  for (size_t i = 0; i < text.size();) {
    bool matched = false;
    for (const auto& [tok, id] : impl_->added[static_cast<unsigned char>(text[i])]) {
      if (text.substr(i, tok.size()) == tok) {
        DT_RETURN_IF_ERROR(encode_plain(text.substr(plain_start, i - plain_start)));
        ids.push_back(id);
        i += tok.size();
        plain_start = i;
        matched = true;
        break;
      }
    }
    if (!matched) ++i;
  }
  DT_RETURN_IF_ERROR(encode_plain(text.substr(plain_start)));
  return ids;
}

std::string Tokenizer::TokenBytes(int64_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  const std::string& s = tokens_[static_cast<size_t>(id)];
  if (impl_->is_added[static_cast<size_t>(id)]) return s;
  if (impl_->sentencepiece) {
    const int16_t byte = impl_->token_byte[static_cast<size_t>(id)];
    if (byte >= 0) return std::string(1, static_cast<char>(byte));
    return absl::StrReplaceAll(s, {{"\u2581", " "}});
  }
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = std::max<size_t>(1, Utf8At(s, i));
    uint32_t cp = static_cast<unsigned char>(s[i]);
    if (n == 2) cp = ((cp & 0x1F) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3F);
    if (n == 3) {
      cp = ((cp & 0x0F) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3F) << 6) |
           (static_cast<unsigned char>(s[i + 2]) & 0x3F);
    }
    auto it = impl_->char_byte.find(cp);
    if (it != impl_->char_byte.end() && n <= 2) {
      out.push_back(static_cast<char>(it->second));
    } else {
      out.append(s, i, n);  // not a byte character: kept as written
    }
    i += n;
  }
  return out;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int64_t> ids) const {
  std::string bytes;
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: id ", id,
                                                     " is outside the vocabulary of ", vocab_size()));
    }
    bytes += TokenBytes(id);
  }
  return Utf8Lossy(bytes);
}

std::optional<int64_t> Tokenizer::TokenId(absl::string_view text) const {
  auto it = impl_->vocab.find(std::string(text));
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::vector<int64_t> Tokenizer::stop_ids() const {
  std::vector<int64_t> out;
  if (eos_) out.push_back(*eos_);
  if (chat_) {
    std::optional<int64_t> eot = TokenId(chat_->end_of_turn());
    if (eot && std::find(out.begin(), out.end(), *eot) == out.end()) out.push_back(*eot);
  }
  return out;
}

void Tokenizer::SetChatTemplate(const std::optional<std::string>& source, const std::string& none) {
  if (!source) {
    chat_status_ = absl::FailedPreconditionError(none);
    return;
  }
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> t =
      ChatTemplate::Recognize(*source, bos_ ? tokens_[static_cast<size_t>(*bos_)] : "",
                              eos_ ? tokens_[static_cast<size_t>(*eos_)] : "");
  if (t.ok()) {
    chat_ = *t;
  } else {
    chat_status_ = t.status();  // Unimplemented, naming what was seen
  }
}

absl::StatusOr<std::string> Tokenizer::ApplyChatTemplate(absl::Span<const ChatMessage> messages,
                                                         bool add_generation_prompt) const {
  if (!chat_) return chat_status_;
  return chat_->Apply(messages, add_generation_prompt);
}

std::string StreamDecoder::Push(int64_t id) {
  pending_ += tokenizer_.TokenBytes(id);
  const size_t n = CompleteUtf8Prefix(pending_);
  std::string out = Utf8Lossy(absl::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::Finish() {
  std::string out = Utf8Lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace dt::loaders
