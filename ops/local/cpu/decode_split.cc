// Note [Decode split]
// A decode product reads its weights once, so its threads share bytes, not flops: each takes
// chunks of weight rows (a few per thread for oneTBB to balance), or the calling thread reads them
// all, which for a small product beats waking the others. Where that line lies, and how many
// chunks per thread pay, depends on the CPU (how fast a parked worker wakes, how many bytes one
// core keeps in flight): measured on the AMD EPYC (Zen 4) VM, 2 threads, a q4_1 [192, 576] weight
// (69 KB) took 6.4 us on one thread against 8.6 us in 4 chunks on two, and [576, 576] 18.3 us in
// one chunk per thread against 20.7 in four. So the split is the tuner's, per kernel and per size
// class of the bytes one call reads (sibling projections together, Note [Sibling projections]):
// under 128 KiB, under 1 MiB, beyond; each class a knob whose candidates are 4, 2 or 1 chunks per
// thread or the calling thread alone, timed by the kernel's trial on cold weights of two shapes
// of the class. The quantized dot (qgemm.dot_split.*) and the float skinny GEMM
// (gemm.skinny_split.*) have their own knobs: their bytes per flop and per wake-up differ.

#include "dtensor/ops/local/cpu/decode_split.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"

namespace dt::ops::cpu::split {

namespace {

constexpr int64_t kClassBelow[] = {int64_t{128} << 10, int64_t{1} << 20};
constexpr const char* kClassNames[] = {"small", "medium", "large"};
constexpr int kChunksPerThread[] = {4, 2, 1, 0};

}  // namespace

int ClassOf(int64_t bytes) {
  int c = 0;
  while (c < kClasses - 1 && bytes >= kClassBelow[c]) ++c;
  return c;
}

const std::vector<const tune::Knob*>& MakeKnobs(const std::string& prefix, const std::string& product,
                                                const MakeTrial& make_trial) {
  // Never destroyed: a static vector's destructor would leave the knobs unreachable at exit.
  auto& knobs = *new std::vector<const tune::Knob*>;
  for (int c = 0; c < kClasses; ++c) {
    std::vector<std::string> candidates;
    for (const int chunks : kChunksPerThread) {
      candidates.push_back(chunks > 0 ? absl::StrCat(chunks, "/thread") : "serial");
    }
    std::string what = c < kClasses - 1
                           ? absl::StrCat("how ", product, " under ", kClassBelow[c] >> 10,
                                          " KiB of weights is split: chunks per thread, or the calling "
                                          "thread alone")
                           : absl::StrCat("the same from ", kClassBelow[c - 1] >> 10, " KiB");
    knobs.push_back(new tune::Knob{  // reachable until exit, like every knob
        .name = absl::StrCat(prefix, ".", kClassNames[c]),
        .what = std::move(what),
        .candidates = std::move(candidates),
        .unit = "GB/s",
        .rounds = 7,
        .make_trial = [make_trial, c] { return make_trial(c); },
    });
  }
  return knobs;
}

int ChunksPerThread(int candidate) { return kChunksPerThread[candidate]; }

absl::StatusOr<int> Decide(const std::vector<const tune::Knob*>& knobs, int64_t bytes, int threads) {
  if (threads <= 1) return 0;
  DT_ASSIGN_OR_RETURN(const int i, tune::Pick(*knobs[ClassOf(bytes)]));
  return kChunksPerThread[i];
}

int Settled(const std::vector<const tune::Knob*>& knobs, int64_t bytes, int threads) {
  return threads <= 1 ? 0 : kChunksPerThread[tune::Settled(*knobs[ClassOf(bytes)])];
}

int64_t Chunks(int64_t bytes, int64_t total, int chunks_per_thread, int threads, int64_t min_chunk_bytes) {
  if (chunks_per_thread <= 0 || threads <= 1 || total <= 0) return 1;
  const int64_t share = (int64_t{chunks_per_thread} * threads * bytes + total - 1) / total;
  return std::clamp<int64_t>(bytes / min_chunk_bytes, 1, std::max<int64_t>(share, 1));
}

}  // namespace dt::ops::cpu::split
