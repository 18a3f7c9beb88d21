#pragma once
// The text of a generation as its tokens arrive (`dtensor serve`, tools/serve_http.h): the
// tokenizer's StreamDecoder makes whole UTF-8 characters of them, and the OpenAI `stop` strings are
// looked for in that text. What Push returns is final: it is never followed by a character's
// missing bytes, and it never holds the start of a stop string, so a streamed answer is exactly
// the non-streamed one cut into pieces.
//
//   tokens so far      decoded text   stop ["\n\n"]    Push returns     held back
//   "Hi", "!\n"        "Hi!\n"                         "Hi!"            "\n" (could begin "\n\n")
//   "\n", "Bye"        "Hi!\n\nBye"   found at 3       ""               stopped(): the text ends "Hi!"
//   "caf", 0xC3        "caf"                           "caf"            0xC3 (half of "é")
//
// Note [Stop strings are held back]
// A stop string can only start in the text not yet returned: whenever Push returns text, it keeps
// the longest tail that is the beginning of some stop string, so any occurrence that begins in
// returned text would have begun in a held-back tail instead. Searching the held-back text alone
// therefore finds every occurrence, and the first one (the smallest offset) ends the answer. The
// tail starts where a stop string's first byte matches, a UTF-8 lead byte, so holding it back
// never splits a character.

#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/loaders/tokenizer.h"

namespace dt::serve {

class TextStream {
 public:
  // `stops`: non-empty strings (the request's `stop`).
  TextStream(const loaders::Tokenizer& tokenizer, std::vector<std::string> stops);

  // One generated token (a stop token id is not text: the caller leaves it out). Returns the text
  // that became final; nothing once stopped().
  std::string Push(int64_t token);
  // No more tokens: what was held back (an incomplete character as U+FFFD), up to a stop string.
  std::string Finish();
  // A stop string appeared: the answer ends before it and later tokens add nothing.
  bool stopped() const { return stopped_; }

 private:
  // Takes what became final out of held_ (Note [Stop strings are held back]); `end`: nothing more
  // will come, so only a whole stop string is held.
  std::string Release(bool end);

  loaders::StreamDecoder decoder_;
  std::vector<std::string> stops_;
  std::string held_;  // decoded, not yet returned
  bool stopped_ = false;
};

}  // namespace dt::serve
