#include "dtensor/tools/serve_text.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"

namespace dt::serve {

TextStream::TextStream(const loaders::Tokenizer& tokenizer, std::vector<std::string> stops)
    : decoder_(tokenizer), stops_(std::move(stops)) {}

std::string TextStream::Push(int64_t token) {
  if (stopped_) return "";
  held_ += decoder_.Push(token);
  return Release(/*end=*/false);
}

std::string TextStream::Finish() {
  if (stopped_) return "";
  held_ += decoder_.Finish();
  return Release(/*end=*/true);
}

std::string TextStream::Release(bool end) {
  // The first occurrence of any stop string ends the text.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Keep the longest tail that begins a stop string (a proper prefix: a whole one was found above).
  size_t keep = 0;
  if (!end) {
    for (const std::string& s : stops_) {
      for (size_t n = std::min(held_.size(), s.size() - 1); n > keep; --n) {
        if (absl::EndsWith(held_, absl::string_view(s).substr(0, n))) {
          keep = n;
          break;
        }
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

}  // namespace dt::serve
