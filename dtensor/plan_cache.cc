#include "dtensor/dtensor/plan_cache.h"

#include <atomic>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/synchronization/mutex.h"
#include "dtensor/core/status.h"

namespace dt {

namespace {

// Everything a plan depends on, declared once: a stored key and a live request compare and hash
// through it (Note [Plan cache]). Spans and references, so that comparing copies nothing.
using PlanFields = std::tuple<IntSpan, IntSpan, DType, absl::Span<const Placement>, absl::Span<const Placement>,
                              PlannerOptions::Strategy, bool, bool, const CostModel&>;
PlanFields FieldsOf(IntSpan mesh, IntSpan shape, DType dtype, absl::Span<const Placement> src,
                    absl::Span<const Placement> dst, const PlannerOptions& o) {
  return {mesh, shape, dtype, src, dst, o.strategy, o.merge, o.allow_partial, o.cost};
}

struct PlanKey {
  Shape mesh;
  Shape shape;
  DType dtype;
  Placements src, dst;
  PlannerOptions options;

  PlanFields Fields() const { return FieldsOf(mesh, shape, dtype, src, dst, options); }
  friend bool operator==(const PlanKey& a, const PlanKey& b) { return a.Fields() == b.Fields(); }
  template <typename H>
  friend H AbslHashValue(H h, const PlanKey& k) {
    return H::combine(std::move(h), k.Fields());
  }
};

// See Note [Plan cache].
std::atomic<uint64_t> g_cache_generation{1};

class PlanCache {
 public:
  static PlanCache& Get() {
    static PlanCache* cache = new PlanCache();
    return *cache;
  }
  void CountHit() { hits_.fetch_add(1, std::memory_order_relaxed); }
  std::shared_ptr<const RedistributePlan> Find(const PlanKey& key) {
    absl::ReaderMutexLock lock(&mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    hits_.fetch_add(1, std::memory_order_relaxed);
    return it->second;
  }
  void Insert(PlanKey key, std::shared_ptr<const RedistributePlan> plan) {
    absl::MutexLock lock(&mu_);
    misses_.fetch_add(1, std::memory_order_relaxed);
    map_.emplace(std::move(key), std::move(plan));
  }
  CacheStats Stats() {
    absl::ReaderMutexLock lock(&mu_);
    return {hits_.load(), misses_.load(), static_cast<int64_t>(map_.size())};
  }
  void Clear() {
    absl::MutexLock lock(&mu_);
    g_cache_generation.fetch_add(1, std::memory_order_acq_rel);
    map_.clear();
    hits_ = 0;
    misses_ = 0;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<PlanKey, std::shared_ptr<const RedistributePlan>> map_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> hits_{0}, misses_{0};
};

}  // namespace

namespace {

// Note [Plan cache]
// The process-wide table is guarded by a reader-writer lock. In front of it each thread keeps its
// last few plans, compared field by field without building a key, hashing or locking, so the common
// case (a model redistributing the same few layouts every step) costs a handful of comparisons.
// ClearPlanCache() bumps a generation that invalidates every thread's entries.

struct LocalEntry {
  uint64_t generation = 0;
  PlanKey key;
  std::shared_ptr<const RedistributePlan> plan;
};
constexpr int kLocalEntries = 8;

PlanFields RequestFields(const DTensorSpec& src, absl::Span<const Placement> dst, const PlannerOptions& o) {
  return FieldsOf(src.mesh().shape(), src.shape(), src.dtype(), src.placements(), dst, o);
}

}  // namespace

absl::StatusOr<std::shared_ptr<const RedistributePlan>> CachedPlan(
    const DTensorSpec& src, absl::Span<const Placement> dst_placements,
    const PlannerOptions& options) {
  thread_local LocalEntry local[kLocalEntries];
  thread_local int next_local = 0;
  const uint64_t generation = g_cache_generation.load(std::memory_order_acquire);
  PlanCache& cache = PlanCache::Get();
  for (const LocalEntry& e : local) {
    if (e.generation == generation && e.key.Fields() == RequestFields(src, dst_placements, options)) {
      cache.CountHit();
      return e.plan;
    }
  }
  PlanKey key{Shape(src.mesh().shape().begin(), src.mesh().shape().end()), src.shape(), src.dtype(),
              src.placements(), Placements(dst_placements.begin(), dst_placements.end()), options};
  std::shared_ptr<const RedistributePlan> plan = cache.Find(key);
  if (!plan) {
    DT_ASSIGN_OR_RETURN(DTensorSpec dst, src.WithPlacements(dst_placements));
    DT_ASSIGN_OR_RETURN(RedistributePlan planned, PlanRedistribute(src, dst, options));
    plan = std::make_shared<const RedistributePlan>(std::move(planned));
    cache.Insert(key, plan);
  }
  LocalEntry& slot = local[next_local];
  next_local = (next_local + 1) % kLocalEntries;
  slot = {generation, std::move(key), plan};
  return plan;
}

CacheStats GetPlanCacheStats() { return PlanCache::Get().Stats(); }
void ClearPlanCache() { PlanCache::Get().Clear(); }

}  // namespace dt
