// dtensor-styles: the tensor-parallel style registry as a table (what `dtensor styles` prints).
//
//   dtensor-styles            one row per style: weight / bias placements, input and output
//                             layouts, forward collective
//   dtensor-styles --names    the registered names, one per line
//
// Exit status: 0, or 2 for a bad command line.
#include <cstdio>
#include <cstring>

#include "dtensor/nn/style_registry.h"

int main(int argc, char** argv) {
  if (argc == 1) {
    std::fputs(dt::nn::FormatStylesTable().c_str(), stdout);
    return 0;
  }
  if (argc == 2 && std::strcmp(argv[1], "--names") == 0) {
    for (const std::string& name : dt::nn::StyleNames()) std::printf("%s\n", name.c_str());
    return 0;
  }
  const bool help =
      argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0);
  std::fputs("usage: dtensor-styles [--names]\n", help ? stdout : stderr);
  return help ? 0 : 2;
}
