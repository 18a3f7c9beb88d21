// `dtensor tokenize --model DIR|FILE.gguf [--decode] [--bos] TEXT`: the token ids of TEXT as a JSON
// list (with --bos, BOS first when the tokenizer adds one), or with --decode the text of the
// comma-separated ids in TEXT. The tokenizer is loaders/tokenizer.h (tokenizer.json, or a GGUF's
// vocabulary).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "dtensor/loaders/tokenizer.h"
#include "dtensor/tools/dtensor_cli.h"

namespace dt::cli {

int Tokenize(int argc, char** argv) {
  std::string model, text;
  bool decode = false, bos = false, have_text = false;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) {
      model = argv[++i];
    } else if (a == "--decode") {
      decode = true;
    } else if (a == "--bos") {
      bos = true;
    } else if (!have_text && (a.rfind("--", 0) != 0 || a == "--")) {
      text = a == "--" && i + 1 < argc ? argv[++i] : a;
      have_text = true;
    } else {
      std::fprintf(stderr, "dtensor tokenize: unexpected argument '%s'\n", a.c_str());
      return 2;
    }
  }
  if (model.empty() || !have_text) {
    std::fprintf(stderr, "usage: dtensor tokenize --model DIR|FILE.gguf [--decode] [--bos] TEXT\n");
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
