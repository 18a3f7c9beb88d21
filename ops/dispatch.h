#pragma once
// The dispatcher behind ops/dtensor_ops.h: picks a strategy for an op call (cached per thread),
// redistributes the inputs that need it and wraps the local results. See Note [Sharding
// propagation] in dispatch.cc. Its introspection (ops::LastDecision, the cache statistics) is at
// the end, for tests, benches and `dtensor explain`.
//
//   OpCall call{OpId::kBinary, {&a.spec(), &b.spec()}, BinaryAttrs{op}};
//   Prepared p;
//   DT_RETURN_IF_ERROR(Prepare(call, {&a, &b}, &p));
//   if (!p.member()) return p.Empty();                 // ranks outside the mesh
//   DT_ASSIGN_OR_RETURN(LocalOutputs y, DeclOf(call.op).run(call, LocalArgs(p)));
//   return p.Wrap(std::move(y));
// ops::internal::Apply (ops/dtensor_ops.cc) is exactly this.

#include <iterator>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dtensor/core/tensor.h"
#include "dtensor/dtensor/dtensor.h"
#include "dtensor/dtensor/plan_cache.h"  // CacheStats
#include "dtensor/ops/local/ops.h"  // TopKOf
#include "dtensor/ops/op_decl.h"
#include "dtensor/ops/strategy.h"

namespace dt::ops::internal {

// A cached decision: the chosen strategy and what running it needs.
struct Entry {
  const OpDecl* rule = nullptr;
  const char* name = nullptr;  // OpName of the call
  Strategy strategy;
  absl::InlinedVector<bool, 4> moves;  // input j must be redistributed
  OutputMetas outs;
  double cost_us = 0;
  std::vector<Placements> before;  // the inputs' placements (for Decision)
};

using Outputs = absl::InlinedVector<DTensor, 2>;

// An op's outputs (DTensors, or Values) as its public overload returns them: the first, TopK's
// values and indices, or all of them (R a vector).
template <typename R, typename Outs>
absl::StatusOr<R> OutputsAs(absl::StatusOr<Outs> outs) {
  using T = typename Outs::value_type;
  if (!outs.ok()) return outs.status();
  if constexpr (std::is_same_v<R, T>) {
    return std::move((*outs)[0]);
  } else if constexpr (std::is_same_v<R, TopKOf<T>>) {
    return R{std::move((*outs)[0]), std::move((*outs)[1])};
  } else if constexpr (std::is_same_v<R, Outs>) {
    return *std::move(outs);
  } else {
    return R(std::make_move_iterator(outs->begin()), std::make_move_iterator(outs->end()));
  }
}

// One call in flight: the decision and the inputs in the strategy's placements.
class Prepared {
 public:
  bool member() const { return coord_ != nullptr; }
  bool has(int j) const { return inputs_[j] != nullptr && inputs_[j]->defined(); }
  const Tensor& local(int j) const { return inputs_[j]->ToLocal(); }
  const DTensorSpec& spec(int j) const { return inputs_[j]->spec(); }
  const std::vector<int64_t>& coord() const { return *coord_; }
  const DeviceMesh& mesh() const { return first_->mesh(); }
  // This rank's piece of output k (its shape).
  Shape OutLocalShape(int k) const;
  // Whether input j's piece (j = -1: a scalar or other replicated constant) enters this rank's term
  // of output k: always, except where output k is Partial(sum) on a mesh dim on which input j is not
  // Partial and this rank's coordinate is not 0. See Note [Adding a replicated term to a Partial].
  bool TermIncludes(int j, int k) const;

  // The output DTensors from this rank's pieces.
  absl::StatusOr<Outputs> Wrap(LocalOutputs locals) const;
  // Outputs for a rank outside the mesh: the right specs, empty pieces.
  absl::StatusOr<Outputs> Empty() const;

 private:
  friend absl::Status Prepare(const OpCall& call, absl::Span<const DTensor* const> inputs,
                              Prepared* p);
  const Entry* entry_ = nullptr;  // owned by this thread's cache (which also keeps the last one)
  absl::InlinedVector<DTensor, 4> moved_;
  absl::InlinedVector<const DTensor*, 4> inputs_;
  const DTensor* first_ = nullptr;  // the first present input
  const std::vector<int64_t>* coord_ = nullptr;
};

// Chooses (or finds) the strategy for `call` and redistributes `inputs` (nullptr or undefined for
// an absent optional input; call.inputs are their specs) to it. Collective over the mesh.
absl::Status Prepare(const OpCall& call, absl::Span<const DTensor* const> inputs, Prepared* p);

// The whole op: checks that every given input is defined, Prepare, the declaration's `run` on
// this rank's pieces (members only), the wrapped outputs. nullptr stands for an absent optional
// input. Collective over the mesh.
absl::StatusOr<Outputs> Apply(const OpCall& call, absl::Span<const DTensor* const> inputs);

// The same call on whole local tensors (no mesh; call.inputs are their specs on any mesh, nullptr
// for an absent optional input): the declaration's `infer` validates it with the messages the
// DTensor path gives, and its `run` computes it with the local kernels. The local mode of
// the ops on Values (ops/value_ops.h).
absl::StatusOr<LocalOutputs> ApplyLocal(const OpCall& call, absl::Span<const Tensor* const> inputs);

// The strategy choice itself (no cache, no communication): exposed for tests and tools.
absl::StatusOr<std::shared_ptr<const Entry>> ChooseStrategy(const OpCall& call);

}  // namespace dt::ops::internal

namespace dt::ops {

// ---- introspection -------------------------------------------------------------------------------

// The strategy the last op on this thread used: "Linear: x [R] w [S(0)] -> [S(1)], cost 0 us,
// cache hit". For tests, debugging and `dtensor explain`.
struct Decision {
  std::string op;
  std::vector<Placements> inputs_before;  // the inputs' placements as given
  std::vector<Placements> inputs_after;   // what the strategy needed (redistributed to)
  std::vector<Placements> outputs;
  double cost_us = 0;  // the redistribution cost the strategy was chosen for
  bool cache_hit = false;

  int num_redistributed() const;  // inputs whose placements changed
  std::string ToString() const;
};
// Empty (op "") before any op ran on this thread.
Decision LastDecision();

// The strategy cache of this thread.
using DispatchCacheStats = CacheStats;
DispatchCacheStats GetDispatchCacheStats();
void ClearDispatchCache();

}  // namespace dt::ops
