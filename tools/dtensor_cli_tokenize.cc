// `dtensor tokenize --model DIR|FILE.gguf [--decode] [--bos] TEXT`: the token ids of TEXT as a JSON
// list (with --bos, BOS first when the tokenizer adds one), or with --decode the text of the
// comma-separated ids in TEXT. The tokenizer is loaders/tokenizer.h (tokenizer.json, or a GGUF's
// vocabulary).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "dtensor/loaders/tokenizer.h"
#include "dtensor/tools/dtensor_cli.h"

ABSL_FLAG(bool, decode, false, "TEXT holds comma-separated ids: print their text");
ABSL_FLAG(bool, bos, false, "put BOS first when the tokenizer adds one");

namespace dt::cli {

int Tokenize(const std::string& text, const Flags& flags) {
  const std::string model = flags.Get("model");
  const bool decode = flags.Has("decode"), bos = flags.Has("bos");
  if (model.empty()) {
    std::fprintf(stderr, "dtensor tokenize: --model DIR|FILE.gguf is required (see dtensor tokenize --help)\n");
    return 2;
  }
  auto tok = loaders::Tokenizer::Load(model);
  if (!tok.ok()) {
    std::fprintf(stderr, "dtensor tokenize: %s\n", std::string(tok.status().message()).c_str());
    return 1;
  }
  if (decode) {
    std::vector<int64_t> ids;
    for (absl::string_view p : absl::StrSplit(text, absl::ByAnyChar(", []"), absl::SkipEmpty())) {
      int64_t id = 0;
      if (!absl::SimpleAtoi(p, &id)) {
        std::fprintf(stderr, "dtensor tokenize: --decode: '%s' is not an id\n", std::string(p).c_str());
        return 2;
      }
      ids.push_back(id);
    }
    auto out = (*tok)->Decode(ids);
    if (!out.ok()) {
      std::fprintf(stderr, "dtensor tokenize: %s\n", std::string(out.status().message()).c_str());
      return 1;
    }
    std::printf("%s\n", out->c_str());
    return 0;
  }
  auto ids = (*tok)->Encode(text, bos);
  if (!ids.ok()) {
    std::fprintf(stderr, "dtensor tokenize: %s\n", std::string(ids.status().message()).c_str());
    return 1;
  }
  std::printf("[%s]\n", absl::StrJoin(*ids, ", ").c_str());
  return 0;
}

}  // namespace dt::cli
