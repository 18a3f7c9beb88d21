#pragma once
// Byte-level BPE tokenization as GPT-2, Llama 3, Qwen2 and SmolLM2 use it, and Gemma's
// SentencePiece BPE (Note [SentencePiece BPE]), from a Hugging Face tokenizer.json (+
// tokenizer_config.json beside it) or from a GGUF's tokenizer.ggml.* metadata, with the same ids
// as Hugging Face `tokenizers` (tests/loaders/tokenizer_test.cc checks a corpus of 200+ hard
// strings against it, against transformers' GGUF tokenizer and, for Gemma's, sentencepiece).
//
// Encoding, in order:
//   1. added tokens ("<|im_end|>", ...) are found in the text first and kept whole (leftmost,
//      longest first); the text between them is encoded as below;
//   2. pre-tokenization: a sequence of split regexes, each splitting every piece at its matches
//      and keeping both matches and the text between ("Isolated"), through PCRE2 with Unicode
//      classes (\p{L}, \p{N}, \s as Unicode whitespace);
//   3. each piece's UTF-8 bytes become GPT-2's printable byte characters (bytes_to_unicode);
//   4. BPE: the lowest-ranked adjacent pair is merged, leftmost first, until no merge applies
//      (ignore_merges: a piece already in the vocabulary is taken whole).
// Decoding maps the byte characters back to bytes; added tokens give their text. StreamDecoder
// holds an incomplete UTF-8 sequence until its last byte arrives.
//
//   source                       pre-tokenizer                         refused
//   tokenizer.json               ByteLevel (use_regex: GPT-2's split), normalizers (but Gemma's),
//                                Split (Regex, Isolated), Digits,      dropout, word prefixes/
//                                Sequence of these; byte_fallback BPE  suffixes, add_prefix_space,
//                                in Gemma's layout                     lstrip/rstrip/single_word
//   GGUF tokenizer.ggml.pre      gpt2, smollm, llama-bpe (Llama 3),    tokenizer.ggml.model other
//                                qwen2 (llama.cpp's regex lists);      than gpt2 and llama; llama
//                                model llama: SentencePiece BPE        with a space prefix
//
// Note [SentencePiece BPE]: Gemma's vocabulary is a SentencePiece BPE model. Its tokenizer.json
// (transformers' GemmaConverter: BPE with byte_fallback, normalizer Replace " " -> U+2581, a
// pre-tokenizer that splits nothing after it, decoders Replace U+2581 -> " ", ByteFallback, Fuse)
// and its GGUF (tokenizer.ggml.model "llama": tokens with scores and types, add_space_prefix
// false) are read into one encoder: the text between added tokens, spaces as U+2581, starts as
// its characters, and adjacent pairs merge best first — the lowest merge rank (tokenizer.json)
// or the highest score of the merged piece (llama.cpp's rule for GGUF), the leftmost among equals
// — until none merges; a piece outside the vocabulary becomes the <0xXX> tokens of its bytes
// (else unk, consecutive ones fused where fuse_unk). Both give sentencepiece's own ids on the test
// corpus. Decoding maps <0xXX> tokens to their byte and U+2581 to a space. A GGUF SentencePiece
// vocabulary adds BOS unless tokenizer.ggml.add_bos_token says otherwise (llama.cpp's default).
// Llama 2's and Mistral's SentencePiece vocabularies (a dummy space prefix, tokenizer.json's
// Metaspace) are not read.
//
// BOS: added by Encode(..., add_bos=true) only when the tokenizer says so (tokenizer_config's
// add_bos_token, a TemplateProcessing post-processor that starts with it, or GGUF's
// tokenizer.ggml.add_bos_token). The stop tokens are EOS plus the chat format's end of turn.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "dtensor/loaders/chat_template.h"

namespace dt::loaders {

class GgufFile;

class Tokenizer {
 public:
  // `path`: a GGUF file, a tokenizer.json, or a directory holding tokenizer.json.
  static absl::StatusOr<std::shared_ptr<const Tokenizer>> Load(const std::string& path);
  // `config_json`: tokenizer_config.json's text ("" when absent). `what` names the source.
  static absl::StatusOr<std::shared_ptr<const Tokenizer>> FromJson(absl::string_view json,
                                                                   absl::string_view config_json,
                                                                   absl::string_view what);
  static absl::StatusOr<std::shared_ptr<const Tokenizer>> FromGguf(const GgufFile& file);
  ~Tokenizer();

  // InvalidArgument when `text` is not valid UTF-8.
  absl::StatusOr<std::vector<int64_t>> Encode(absl::string_view text, bool add_bos = false) const;
  // Ids outside the vocabulary are InvalidArgument.
  absl::StatusOr<std::string> Decode(absl::Span<const int64_t> ids) const;
  // A token's bytes (a special token's text); "" for an id outside the vocabulary.
  std::string TokenBytes(int64_t id) const;

  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  std::optional<int64_t> bos_id() const { return bos_; }
  std::optional<int64_t> eos_id() const { return eos_; }
  bool adds_bos() const { return add_bos_; }
  // EOS and the chat format's end-of-turn token(s).
  std::vector<int64_t> stop_ids() const;
  // The id of a token's text ("<|im_end|>"), if in the vocabulary.
  std::optional<int64_t> TokenId(absl::string_view text) const;

  // The checkpoint's chat template applied to `messages` (loaders/chat_template.h):
  // FailedPrecondition when the checkpoint has none, Unimplemented for one it does not recognize.
  absl::StatusOr<std::string> ApplyChatTemplate(absl::Span<const ChatMessage> messages,
                                                bool add_generation_prompt = true) const;

  struct Impl;  // the tables and regexes (tokenizer.cc)

 private:
  Tokenizer();
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> tokens_;  // id -> token text as stored (byte characters)
  std::optional<int64_t> bos_, eos_;
  bool add_bos_ = false;
  // The checkpoint's template (nullopt: none) recognized; `none` is the error when absent.
  void SetChatTemplate(const std::optional<std::string>& source, const std::string& none);
  std::shared_ptr<const ChatTemplate> chat_;
  absl::Status chat_status_;  // why there is no chat_
};

// Decodes ids one at a time for streaming: Push returns the text that is complete so far (an
// incomplete UTF-8 sequence at the end is held until its remaining bytes arrive); Finish returns
// what is left (an incomplete sequence as U+FFFD).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  std::string Push(int64_t id);
  std::string Finish();

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
};

// True when `s` is valid UTF-8. The length of the longest prefix of `s` that ends on a whole
// UTF-8 sequence (the rest is an incomplete sequence, or invalid).
bool IsValidUtf8(absl::string_view s);
size_t CompleteUtf8Prefix(absl::string_view s);

}  // namespace dt::loaders
