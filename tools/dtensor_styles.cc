// dtensor-styles: the tensor-parallel style registry as a table (what `dtensor styles` prints):
// one row per style with its weight / bias placements, input and output layouts and forward
// collective, then which built-in models' plans use each (nn/models/style_users.h); --names: the
// registered names, one per line. `dtensor-styles --help` lists the flags.
//
// Exit status: 0, or 2 for a bad command line.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "dtensor/nn/models/style_users.h"
#include "dtensor/nn/style_registry.h"
#include "dtensor/tools/flags.h"

ABSL_FLAG(bool, names, false, "print only the registered names, one per line");

int main(int argc, char** argv) {
  const std::vector<std::string> rest =
      dt::cli::ParseFlags(argc, argv, "usage: dtensor-styles [--names]\nthe tensor-parallel style registry");
  if (rest.size() > 1) {
    std::fprintf(stderr, "dtensor-styles: unexpected argument '%s' (see dtensor-styles --help)\n", rest[1].c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_names)) {
    for (const std::string& name : dt::nn::StyleNames()) std::printf("%s\n", name.c_str());
    return 0;
  }
  std::fputs(dt::nn::FormatStylesTable().c_str(), stdout);
  std::fputs(("\n" + dt::nn::FormatStyleUsers()).c_str(), stdout);
  return 0;
}
