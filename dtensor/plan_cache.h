#pragma once
// The process-wide plan cache in front of PlanRedistribute (Note [Plan cache] in plan_cache.cc).

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dtensor/dtensor/planner.h"

namespace dt {

// The same through a process-wide cache keyed by (mesh shape, shape, dtype, src placements, dst
// placements, options). Thread-safe; a hit costs one hash of the key and a shared lock. On a miss
// `dst` is validated and planned; the plan's dst holds the validated (normalized) placements.
absl::StatusOr<std::shared_ptr<const RedistributePlan>> CachedPlan(
    const DTensorSpec& src, absl::Span<const Placement> dst_placements,
    const PlannerOptions& options = {});

// Hits, misses and entries of a cache (the plan cache here, the dispatch cache of
// ops/dtensor_ops.h).
struct CacheStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t size = 0;
};
CacheStats GetPlanCacheStats();
void ClearPlanCache();

}  // namespace dt
