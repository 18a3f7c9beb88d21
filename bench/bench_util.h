#pragma once
// What the benches share: the command line (--quick: done in under a minute), medians, the PASS/FAIL of RESULT lines, and this program's path (for the benches that
// re-launch themselves under dtrun or mpirun).

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace dt::bench {

// The flags of every bench (tools/flags.h): --quick (under a minute), defined in bench_util.cc, and
// the bench's own, defined beside its main. Parses argv (--help lists them; a bad command line
// exits with 2) and returns --quick.
bool ParseBenchFlags(int argc, char** argv, const char* usage);
// For the benches with no flag but --quick. Never nullopt (kept for its callers' form).
inline std::optional<bool> ParseQuickFlag(int argc, char** argv) {
  const std::string program = argc > 0 ? argv[0] : "bench";
  const std::string usage = absl::StrCat("usage: ", program.substr(program.rfind('/') + 1), " [--quick]");
  return ParseBenchFlags(argc, argv, usage.c_str());
}

// The median of `v` (the upper middle one for an even count); `v` must not be empty.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Generation throughput in tokens/s: medians over the repetitions of TimeGenerate.
struct GenerateFigures {
  double prefill = 0;
  double decode = 0;
};

// Runs `model.Generate(prompt, o)` `reps` times with `decode` + 1 new tokens (the prefill's token
// and `decode` decode steps) and returns the medians of its prefill and decode rates. The caller
// warms the model up first. Model: a CausalLM (nn/models/causal_lm.h), Options its
// GenerateOptions.
template <typename Model, typename Options>
absl::StatusOr<GenerateFigures> TimeGenerate(Model& model, const std::vector<int64_t>& prompt,
                                             Options o, int64_t decode, int64_t reps) {
  o.max_new_tokens = decode + 1;
  std::vector<double> pre, dec;
  for (int64_t r = 0; r < reps; ++r) {
    auto g = model.Generate(prompt, o);
    if (!g.ok()) return g.status();
    pre.push_back(g->prefill_tokens_per_second());
    dec.push_back(g->decode_tokens_per_second());
  }
  return GenerateFigures{Median(pre), Median(dec)};
}

// The verdict of a RESULT line.
inline const char* Verdict(bool pass) { return pass ? "PASS" : "FAIL"; }

// Copies src to dst on all threads of the arena in 1 MiB chunks, balanced by oneTBB as our
// kernels are (a static split would finish with whichever thread another process delays): the
// memory-bandwidth baseline at the same threads as the kernels it is compared with.
inline void ParallelMemcpy(char* dst, const char* src, size_t bytes) {
  constexpr size_t kChunk = size_t{1} << 20;
  tbb::parallel_for(tbb::blocked_range<size_t>(0, (bytes + kChunk - 1) / kChunk, 1),
                    [&](const tbb::blocked_range<size_t>& r) {
                      for (size_t c = r.begin(); c != r.end(); ++c) {
                        const size_t lo = c * kChunk, hi = std::min(bytes, lo + kChunk);
                        std::memcpy(dst + lo, src + lo, hi - lo);
                      }
                    },
                    tbb::simple_partitioner());
}

// This program's absolute path (/proc/self/exe).
inline absl::StatusOr<std::string> SelfPath() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf));
  if (n <= 0 || n == static_cast<ssize_t>(sizeof(buf))) {
    return absl::UnavailableError(absl::StrCat("cannot find this program (/proc/self/exe): ",
                                               n <= 0 ? std::strerror(errno) : "path too long"));
  }
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace dt::bench
