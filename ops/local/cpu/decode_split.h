#pragma once
// Internal to the CPU kernels: how a decode product (a few rows of x against weights it reads
// once) is split among the threads, per size class of the bytes one call reads, as the tuner
// decides on the running CPU (Note [Decode split] in decode_split.cc).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dtensor/ops/local/cpu/tuner.h"

namespace dt::ops::cpu::split {

// The size classes of the bytes of weights one call reads: small, medium, large.
inline constexpr int kClasses = 3;
int ClassOf(int64_t bytes);

// The knobs `<prefix>.small`, `.medium` and `.large` of one kernel, they and their list reachable
// until exit (call once per kernel); their candidates are "4/thread", "2/thread", "1/thread" and
// "serial" (ChunksPerThread); make_trial(size_class) times them on that kernel.
using MakeTrial = std::function<absl::StatusOr<std::unique_ptr<tune::Trial>>(int size_class)>;
const std::vector<const tune::Knob*>& MakeKnobs(const std::string& prefix, const std::string& product,
                                                const MakeTrial& make_trial);

// Chunks per thread of candidate i (0: the calling thread alone).
int ChunksPerThread(int candidate);

// Chunks per thread for a call that reads `bytes` of weights on `threads` threads: 0 on one
// thread (nothing to split, nothing measured), else the pick of the class's knob (Pick: measured
// at first use). Settled: the same without measuring, for a trial's kernels.
absl::StatusOr<int> Decide(const std::vector<const tune::Knob*>& knobs, int64_t bytes, int threads);
int Settled(const std::vector<const tune::Knob*>& knobs, int64_t bytes, int threads);

// How many chunks a call's target of `bytes` (of the call's `total`) is cut into: its share, by
// bytes, of chunks_per_thread x threads, each chunk at least min_chunk_bytes, at least one.
int64_t Chunks(int64_t bytes, int64_t total, int chunks_per_thread, int threads, int64_t min_chunk_bytes);

}  // namespace dt::ops::cpu::split
