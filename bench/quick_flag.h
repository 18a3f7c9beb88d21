#pragma once
// The command line of the benches that take nothing but --quick (done in under a minute).

#include <cstdio>
#include <cstring>
#include <optional>

namespace dt::bench {

// true with --quick, false without; nullopt, after printing the usage, for anything else.
inline std::optional<bool> ParseQuickFlag(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") != 0) {
      std::fprintf(stderr, "usage: %s [--quick]\n", argv[0]);
      return std::nullopt;
    }
    quick = true;
  }
  return quick;
}

}  // namespace dt::bench
