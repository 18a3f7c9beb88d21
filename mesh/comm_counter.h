#pragma once
// CommCounter: counts the collectives issued on this thread while it is alive (PyTorch's
// CommDebugMode). The communicators report every collective they accept (mesh/communicator.cc), so
// whatever issues one — a redistribution, an op's strategy, FromLocal's check, a save — is
// counted without any counting code of its own. Scopes nest; each counts everything issued inside
// it. Ranks of the threads backend are threads, so each rank counts its own.
//
//   CommCounter counter;
//   auto y = x.Redistribute(...);
//   EXPECT_EQ(counter.counts().all_gather, 1);
//
// Kinds fold as the collectives' users think of them: all_gather_v counts as all_gather,
// reduce_scatter_v as reduce_scatter, all_to_all_v and all_to_all_views (Distribute's scatter
// too) as all_to_all. Arguments the communicator rejects, its own verification exchange, barriers
// and point-to-point messages are not counted.

#include <cstdint>
#include <string>

namespace dt {

struct CollectiveCounts {
  int64_t all_gather = 0;
  int64_t all_reduce = 0;
  int64_t reduce_scatter = 0;
  int64_t all_to_all = 0;
  int64_t broadcast = 0;
  // Bytes this rank handed to its all_to_alls (to every member, itself included): what expert
  // parallelism's dispatch and combine move (bench/moe).
  int64_t all_to_all_bytes = 0;

  int64_t total() const { return all_gather + all_reduce + reduce_scatter + all_to_all + broadcast; }
  // "all_gather=1 all_to_all=1" (zero kinds left out; "none" when nothing; no bytes).
  std::string ToString() const;
};

class CommCounter {
 public:
  CommCounter();
  ~CommCounter();
  CommCounter(const CommCounter&) = delete;
  CommCounter& operator=(const CommCounter&) = delete;
  const CollectiveCounts& counts() const { return counts_; }

  // Internal (the communicators): records one collective in every active counter of this thread.
  static void Record(int64_t CollectiveCounts::*kind, int64_t all_to_all_bytes = 0);

 private:
  CollectiveCounts counts_;
  CommCounter* outer_;
};

}  // namespace dt
