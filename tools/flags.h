#pragma once
// The command line of every dtensor program (tools/, examples/, bench/). Flags are abseil flags,
// defined beside the code that reads them:
//
//   ABSL_FLAG(int, max_new_tokens, 64, "tokens to generate after the prompt");
//
// and ParseFlags applies one rule to every program:
//
//   --name=value | --name value      any flag; booleans also --name, --noname (--no-name),
//                                    --name=true|false
//   --help, -h                       the usage line(s) and every flag of the program with its type,
//                                    default and meaning, on stdout; exit 0
//   --                               everything after it is positional
//   an unknown flag, a missing or malformed value
//                                    one line on stderr naming the flag (and the value), then
//                                    "(see <program> --help)"; exit 2
//
// Flag names use '_' as abseil requires; the command line may spell them with '-' as well
// (--max-new-tokens), which is how the docs write them.

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace dt::cli {

struct ParseOptions {
  // Stop at the first argument that is not a flag: it and everything after it are positional
  // (dtrun's PROG ARGS..., whose flags are the program's own).
  bool stop_at_positional = false;
  // Only these flags (abseil names, with '_') are accepted and listed: a subcommand's own (the
  // dtensor CLI); empty: every flag of the program but abseil's own.
  std::vector<std::string> only;
};

// Parses argv (see the file comment); returns the positional arguments, argv[0] first. Exits on
// --help and on errors, as above.
std::vector<std::string> ParseFlags(int argc, char** argv, absl::string_view usage,
                                    const ParseOptions& options = {});

// Whether the last ParseFlags saw `name` (abseil's name, with '_') on the command line.
bool Given(absl::string_view name);

// What --help prints.
std::string FlagsHelp(absl::string_view program, absl::string_view usage, const ParseOptions& options = {});

}  // namespace dt::cli
