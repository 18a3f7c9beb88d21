#include "dtensor/mesh/comm_counter.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/mesh/collective.h"

namespace dt {
namespace {
thread_local CommCounter* g_counters = nullptr;
}  // namespace

CommCounter::CommCounter() : outer_(g_counters) { g_counters = this; }
CommCounter::~CommCounter() { g_counters = outer_; }

void CommCounter::Record(int64_t CollectiveCounts::*kind, int64_t all_to_all_bytes) {
  for (CommCounter* c = g_counters; c != nullptr; c = c->outer_) {
    ++(c->counts_.*kind);
    c->counts_.all_to_all_bytes += all_to_all_bytes;
  }
}

std::string CollectiveCounts::ToString() const {
  std::vector<std::string> parts;
  auto add = [&](const char* name, int64_t n) {
    if (n) parts.push_back(absl::StrCat(name, "=", n));
  };
  add("all_gather", all_gather);
  add("all_reduce", all_reduce);
  add("reduce_scatter", reduce_scatter);
  add("all_to_all", all_to_all);
  add("broadcast", broadcast);
  return parts.empty() ? "none" : absl::StrJoin(parts, " ");
}

namespace internal {

void CountIssued(const Collective& c) {
  using K = CollectiveKind;
  int64_t sent = 0;  // all_to_all kinds: the elements this rank sends
  if (c.kind == K::kAllToAll) sent = c.input.numel();
  if (c.kind == K::kAllToAllV || c.kind == K::kAllToAllViews) {
    for (int64_t n : c.counts) sent += n;
  }
  const int64_t bytes = sent * DTypeSize(c.dtype());
  switch (c.kind) {
    case K::kAllGather:
    case K::kAllGatherV: return CommCounter::Record(&CollectiveCounts::all_gather);
    case K::kAllReduce: return CommCounter::Record(&CollectiveCounts::all_reduce);
    case K::kReduceScatter:
    case K::kReduceScatterV: return CommCounter::Record(&CollectiveCounts::reduce_scatter);
    case K::kAllToAll:
    case K::kAllToAllV:
    case K::kAllToAllViews: return CommCounter::Record(&CollectiveCounts::all_to_all, bytes);
    case K::kBroadcast: return CommCounter::Record(&CollectiveCounts::broadcast);
    case K::kSend:
    case K::kRecv:
    case K::kBarrier: return;
  }
}

}  // namespace internal
}  // namespace dt
