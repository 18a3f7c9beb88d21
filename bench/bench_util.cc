#include "dtensor/bench/bench_util.h"

#include "absl/flags/flag.h"
#include "dtensor/tools/flags.h"

ABSL_FLAG(bool, quick, false, "finish in under a minute: smaller sizes, fewer repetitions");

namespace dt::bench {

bool ParseBenchFlags(int argc, char** argv, const char* usage) {
  cli::ParseFlags(argc, argv, usage);
  return absl::GetFlag(FLAGS_quick);
}

}  // namespace dt::bench
