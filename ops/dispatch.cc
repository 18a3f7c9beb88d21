#include "dtensor/ops/dispatch.h"

#include <cmath>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"
#include "dtensor/dtensor/planner.h"

namespace dt::ops::internal {

// Note [Sharding propagation]
// An op's rule (its declaration's candidates, ops/decls/<family>.cc) lists, for one mesh dim at a
// time, candidate placements for every input and output (PyTorch's single-mesh-dim strategies). ChooseStrategy takes the product over
// mesh dims (on a mesh dim of size 1 only the candidates that keep the inputs as they are, since
// every layout there is the same) and, for each combination:
//   1. costs every input's move from its placements to the candidate's with the redistribute
//      planner's cost model (CachedPlan; Partial targets are only accepted where the input is
//      already that Partial: ops never create Partial inputs, and a target the planner refuses,
//      such as S -> P, drops the candidate);
//   2. keeps it only if it is cheaper than the best so far, or as cheap and moving fewer inputs
//      (so a strategy needing no redistribution always wins when one exists);
//   3. validates the outputs' placements for their shapes and runs the rule's whole-strategy check
//      (view pieces, GQA head ranges, block boundaries), which sees every rank at once.
// The winner is cached per thread under a key of everything the choice depends on: the op, every
// attribute including scalars (PyTorch #147180 reused a decision made for another scalar), and
// each input's mesh shape, placements, shape and dtype. A cache hit costs one hash of precomputed
// spec hashes and one probe of a thread-local flat_hash_map; no lock, no allocation.
// Fixed PyTorch failures: the scalar cache key (#147180); views of sharded dims, which are checked
// rank by rank (#179502); ops on Partial inputs that are not linear, which reduce first (#165962).

// Note [Adding a replicated term to a Partial]
// A Partial(sum) value is the sum of the ranks' terms, so a replicated addend (a bias, the other
// operand of Add, a scalar) must enter exactly one term: the rank whose coordinate is 0 on every
// Partial(sum) mesh dim adds it, the others add zero. This is exact (no division by k, unlike
// PyTorch's R -> P(sum) partition) and needs no communication. For Partial(avg), max and min every
// rank adds it (avg(t + c) = avg(t) + c, max(t + c) = max(t) + c).

namespace {

// ---- the cache -----------------------------------------------------------------------------------

// What an input contributes to the cache's key, declared once: a stored key and a live call compare
// through it (spans, so that comparing copies nothing); an absent input is (false, {}, {}, {}, f32).
using SpecFields = std::tuple<bool, IntSpan, absl::Span<const Placement>, IntSpan, DType>;
SpecFields FieldsOf(const DTensorSpec* s) {
  if (s == nullptr) return {false, {}, {}, {}, DType::kF32};
  return {true, s->mesh().shape(), s->placements(), s->shape(), s->dtype()};
}

struct SpecKey {
  bool present = false;
  Shape mesh;
  Placements placements;
  Shape shape;
  DType dtype = DType::kF32;

  SpecFields Fields() const { return {present, mesh, placements, shape, dtype}; }
};

struct Key {
  OpId op;
  const char* name;
  Attrs attrs;
  absl::InlinedVector<SpecKey, 4> specs;
  size_t hash = 0;
};

struct CallRef {
  const OpCall* call;
  size_t hash;
};

size_t HashCall(const OpCall& call) {
  size_t h = absl::HashOf(static_cast<int>(call.op), call.name, AttrsHash(call.attrs), call.inputs.size());
  for (const DTensorSpec* s : call.inputs) h = absl::HashOf(h, s == nullptr ? size_t{7} : s->hash());
  return h;
}

// The same op, name and attributes, and inputs whose fields `spec(j)` gives.
template <typename SpecAt>
bool SameCall(const Key& k, OpId op, const char* name, const Attrs& attrs, size_t n, SpecAt spec) {
  if (k.op != op || k.name != name || k.specs.size() != n || !(k.attrs == attrs)) return false;
  for (size_t j = 0; j < n; ++j) {
    if (k.specs[j].Fields() != spec(j)) return false;
  }
  return true;
}

bool Matches(const Key& k, const OpCall& c) {
  return SameCall(k, c.op, c.name, c.attrs, c.inputs.size(), [&](size_t j) { return FieldsOf(c.inputs[j]); });
}

Key MakeKey(const OpCall& c, size_t hash) {
  Key k{c.op, c.name, c.attrs, {}, hash};
  for (const DTensorSpec* s : c.inputs) {
    const auto [present, mesh, placements, shape, dtype] = FieldsOf(s);
    k.specs.push_back({present, Shape(mesh.begin(), mesh.end()), Placements(placements.begin(), placements.end()),
                       Shape(shape.begin(), shape.end()), dtype});
  }
  return k;
}

struct KeyHash {
  using is_transparent = void;
  size_t operator()(const Key& k) const { return k.hash; }
  size_t operator()(const CallRef& r) const { return r.hash; }
};

struct KeyEq {
  using is_transparent = void;
  bool operator()(const Key& a, const Key& b) const {
    return a.hash == b.hash &&
           SameCall(a, b.op, b.name, b.attrs, b.specs.size(), [&](size_t j) { return b.specs[j].Fields(); });
  }
  bool operator()(const Key& a, const CallRef& b) const {
    return a.hash == b.hash && Matches(a, *b.call);
  }
  bool operator()(const CallRef& b, const Key& a) const { return (*this)(a, b); }
};

// Bounds memory when shapes keep changing (e.g. growing KV caches): the cache starts over.
constexpr size_t kMaxEntries = 1 << 14;

struct Cache {
  absl::flat_hash_map<Key, std::shared_ptr<const Entry>, KeyHash, KeyEq> map;
  int64_t hits = 0;
  int64_t misses = 0;
  std::shared_ptr<const Entry> last;
  bool last_hit = false;
};

Cache& ThreadCache() {
  thread_local Cache cache;
  return cache;
}

// ---- choosing ------------------------------------------------------------------------------------

struct MoveCost {
  bool ok = false;
  double cost_us = 0;
  bool moves = false;
};

// The cost of moving input `spec` to `target` (see Note [Sharding propagation], step 1).
MoveCost CostOfMove(const DTensorSpec& spec, const Placements& target) {
  if (target == spec.placements()) return {true, 0, false};
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i].is_partial() && target[i] != spec.placements()[i]) return {};
  }
  auto plan = CachedPlan(spec, target);
  if (!plan.ok()) return {};
  return {true, (*plan)->cost_us, true};
}

bool SameOption(const DimOption& a, const DimOption& b) { return a.in == b.in && a.out == b.out; }

}  // namespace

absl::StatusOr<std::shared_ptr<const Entry>> ChooseStrategy(const OpCall& call) {
  const OpDecl& rule = DeclOf(call.op);
  DT_CHECK(call.attrs.index() == rule.attrs, OpName(call), ": attributes of the wrong kind");
  if (rule.precheck != nullptr) DT_RETURN_IF_ERROR(rule.precheck(call));
  DT_ASSIGN_OR_RETURN(OutputMetas outs, rule.infer(call));
  const DTensorSpec& first = call.first();
  const DeviceMesh& mesh = first.mesh();
  const int nd = mesh.ndim();
  const int n_in = call.num_inputs();
  const int n_out = static_cast<int>(outs.size());

  // Candidates per mesh dim, without duplicates.
  std::vector<DimOptions> per_dim(static_cast<size_t>(nd));
  for (int i = 0; i < nd; ++i) {
    DimOptions all;
    rule.candidates(call, outs, i, &all);
    DimOptions& opts = per_dim[i];
    for (DimOption& o : all) {
      bool dup = false;
      for (const DimOption& e : opts) dup = dup || SameOption(e, o);
      if (!dup) opts.push_back(std::move(o));
    }
    if (mesh.Size(i) == 1) {
      // Every layout is the same on a mesh dim of size 1: keep the inputs as they are, with the
      // rule's outputs when it has such a candidate, and with replicated outputs (always exact
      // there, and compatible with any Partial kind on other mesh dims).
      DimOptions keep;
      DimOption as_is = ReplicateOption(n_in, n_out);
      for (int j = 0; j < n_in; ++j) {
        if (call.inputs[j] != nullptr) as_is.in[j] = call.inputs[j]->placements()[i];
      }
      for (const DimOption& o : opts) {
        if (o.in == as_is.in && !SameOption(o, as_is)) keep.push_back(o);
      }
      keep.push_back(std::move(as_is));
      opts = std::move(keep);
    }
  }

  // Memoized per input: the cost of each distinct target.
  std::vector<absl::flat_hash_map<Placements, MoveCost>> memo(static_cast<size_t>(n_in));
  std::vector<absl::flat_hash_map<Placements, bool>> out_ok(static_cast<size_t>(n_out));
  std::vector<size_t> idx(static_cast<size_t>(nd), 0);
  std::optional<Strategy> best;
  double best_cost = 0;
  int best_moves = 0;
  absl::Status last_rejection;
  for (bool done = nd > 0 && per_dim[0].empty(); !done;) {
    Strategy s;
    s.inputs.resize(static_cast<size_t>(n_in));
    s.outputs.resize(static_cast<size_t>(n_out));
    for (int i = 0; i < nd; ++i) {
      const DimOption& o = per_dim[i][idx[i]];
      for (int j = 0; j < n_in; ++j) {
        if (call.inputs[j] != nullptr) s.inputs[j].push_back(o.in[j]);
      }
      for (int k = 0; k < n_out; ++k) s.outputs[k].push_back(o.out[k]);
    }
    // Next combination (odometer over mesh dims).
    done = true;
    for (int i = nd - 1; i >= 0; --i) {
      if (++idx[i] < per_dim[i].size()) {
        done = false;
        break;
      }
      idx[i] = 0;
    }

    double cost = 0;
    int moves = 0;
    bool ok = true;
    for (int j = 0; ok && j < n_in; ++j) {
      if (call.inputs[j] == nullptr) continue;
      auto [it, inserted] = memo[j].try_emplace(s.inputs[j]);
      if (inserted) it->second = CostOfMove(*call.inputs[j], s.inputs[j]);
      ok = it->second.ok;
      cost += it->second.cost_us;
      moves += it->second.moves;
    }
    if (!ok) continue;
    if (best) {
      const double eps = 1e-9 * (1 + std::abs(best_cost));
      if (cost > best_cost + eps) continue;
      if (cost > best_cost - eps && moves >= best_moves) continue;
    }
    for (int k = 0; ok && k < n_out; ++k) {
      auto [it, inserted] = out_ok[k].try_emplace(s.outputs[k]);
      if (inserted) {
        it->second = NormalizePlacements(outs[k].shape, mesh.shape(), mesh.names(), s.outputs[k]).ok();
      }
      ok = it->second;
    }
    if (!ok) continue;
    if (rule.check != nullptr) {
      absl::Status st = rule.check(call, outs, s);
      if (!st.ok()) {
        last_rejection = std::move(st);
        continue;
      }
    }
    best = std::move(s);
    best_cost = cost;
    best_moves = moves;
  }
  if (!best) {
    return absl::InvalidArgumentError(absl::StrCat(
        OpName(call), ": no strategy for ", DescribeInputs(call),
        last_rejection.ok() ? "" : absl::StrCat(" (", last_rejection.message(), ")")));
  }
  auto e = std::make_shared<Entry>();
  e->rule = &rule;
  e->name = OpName(call);
  e->outs = std::move(outs);
  e->cost_us = best_cost;
  for (int j = 0; j < n_in; ++j) {
    const DTensorSpec* s = call.inputs[j];
    e->moves.push_back(s != nullptr && best->inputs[j] != s->placements());
    e->before.push_back(s != nullptr ? s->placements() : Placements());
  }
  e->strategy = *std::move(best);
  return std::shared_ptr<const Entry>(std::move(e));
}

absl::Status Prepare(const OpCall& call, absl::Span<const DTensor* const> inputs, Prepared* p) {
  p->inputs_.assign(inputs.begin(), inputs.end());
  int first = -1;
  for (int j = 0; j < static_cast<int>(inputs.size()); ++j) {
    const DTensor* x = inputs[j];
    if (x == nullptr) continue;
    if (first < 0) {
      first = j;
      p->first_ = x;
    } else if (!(x->mesh() == p->first_->mesh())) {
      return absl::InvalidArgumentError(absl::StrCat(
          OpName(call), ": ", InputName(call, first), " ", p->first_->spec().ToString(), " and ",
          InputName(call, j), " ", x->spec().ToString(), ": inputs are on different meshes"));
    }
  }
  DT_CHECK(p->first_ != nullptr, "op without inputs");

  Cache& cache = ThreadCache();
  const size_t hash = HashCall(call);
  auto it = cache.map.find(CallRef{&call, hash});
  if (it != cache.map.end()) {
    if (cache.last != it->second) cache.last = it->second;
    ++cache.hits;
    cache.last_hit = true;
  } else {
    DT_ASSIGN_OR_RETURN(std::shared_ptr<const Entry> e, ChooseStrategy(call));
    if (cache.map.size() >= kMaxEntries) cache.map.clear();
    cache.map.emplace(MakeKey(call, hash), e);
    cache.last = std::move(e);
    ++cache.misses;
    cache.last_hit = false;
  }
  p->entry_ = cache.last.get();

  const auto& coord = p->first_->mesh().Coordinate();
  if (!coord) return absl::OkStatus();  // outside the mesh: nothing to move, nothing to run
  p->coord_ = &*coord;
  const Entry& e = *p->entry_;
  for (size_t j = 0; j < inputs.size(); ++j) {
    if (!e.moves[j]) continue;
    if (p->moved_.size() < inputs.size()) p->moved_.resize(inputs.size());
    DT_ASSIGN_OR_RETURN(p->moved_[j], inputs[j]->Redistribute(e.strategy.inputs[j]));
    p->inputs_[j] = &p->moved_[j];
  }
  return absl::OkStatus();
}

Shape Prepared::OutLocalShape(int k) const {
  return ShardShape(entry_->outs[k].shape, mesh().shape(), entry_->strategy.outputs[k], coord());
}

bool Prepared::TermIncludes(int j, int k) const {
  const Placements& pl = entry_->strategy.outputs[k];
  for (size_t i = 0; i < pl.size(); ++i) {
    if (!pl[i].is_partial() || pl[i].reduce_op() != ReduceOp::kSum || coord()[i] == 0) continue;
    if (j < 0 || !spec(j).placements()[i].is_partial()) return false;
  }
  return true;
}

namespace {

// "Linear: w is undefined": an input given but undefined (nullptr is an absent optional one).
template <typename T>
absl::Status CheckDefined(const OpCall& call, absl::Span<const T* const> inputs) {
  for (size_t j = 0; j < inputs.size(); ++j) {
    if (inputs[j] != nullptr && !inputs[j]->defined()) {
      return absl::InvalidArgumentError(absl::StrCat(OpName(call), ": ",
                                                     InputName(call, static_cast<int>(j)),
                                                     " is undefined"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Outputs> Apply(const OpCall& call, absl::Span<const DTensor* const> inputs) {
  DT_RETURN_IF_ERROR(CheckDefined(call, inputs));
  Prepared p;
  DT_RETURN_IF_ERROR(Prepare(call, inputs, &p));
  if (!p.member()) return p.Empty();
  DT_ASSIGN_OR_RETURN(LocalOutputs outs, DeclOf(call.op).run(call, LocalArgs(p)));
  return p.Wrap(std::move(outs));
}

absl::StatusOr<LocalOutputs> ApplyLocal(const OpCall& call, absl::Span<const Tensor* const> inputs) {
  DT_RETURN_IF_ERROR(CheckDefined(call, inputs));
  const OpDecl& decl = DeclOf(call.op);
  DT_RETURN_IF_ERROR(decl.infer(call).status());
  return decl.run(call, LocalArgs(inputs));
}

// ---- LocalArgs (op_decl.h) ------------------------------------------------------------------------

bool LocalArgs::has(int j) const {
  if (prepared_ != nullptr) return prepared_->has(j);
  return j < static_cast<int>(locals_.size()) && locals_[j] != nullptr && locals_[j]->defined();
}

const Tensor& LocalArgs::local(int j) const {
  return prepared_ != nullptr ? prepared_->local(j) : *locals_[j];
}

const Shape& LocalArgs::global_shape(int j) const {
  return prepared_ != nullptr ? prepared_->spec(j).shape() : locals_[j]->shape();
}

bool LocalArgs::Sharded(int j, int dim) const {
  if (prepared_ == nullptr) return false;
  const DTensorSpec& spec = prepared_->spec(j);
  for (int i = 0; i < spec.mesh().ndim(); ++i) {
    if (spec.mesh().Size(i) > 1 && spec.placements()[i].is_any_shard(dim)) return true;
  }
  return false;
}

int64_t LocalArgs::OffsetAlong(int j, int dim) const {
  return Sharded(j, dim) ? prepared_->spec(j).Offset(prepared_->coord(), dim) : 0;
}

Shape LocalArgs::OutLocalShape(int k) const {
  DT_CHECK(prepared_ != nullptr, "OutLocalShape on local tensors");
  return prepared_->OutLocalShape(k);
}

bool LocalArgs::TermIncludes(int j, int k) const {
  return prepared_ == nullptr || prepared_->TermIncludes(j, k);
}

absl::StatusOr<Outputs> Prepared::Wrap(LocalOutputs locals) const {
  Outputs out;
  for (size_t k = 0; k < locals.size(); ++k) {
    const OutputMeta& m = entry_->outs[k];
#ifndef NDEBUG
    DT_CHECK(locals[k].shape() == OutLocalShape(static_cast<int>(k)), entry_->name,
             ": local output ", k, " ", ShapeToString(locals[k].shape()), " vs ",
             ShapeToString(OutLocalShape(static_cast<int>(k))));
#endif
    out.emplace_back(DTensorSpec::FromValidated(mesh(), entry_->strategy.outputs[k], m.shape,
                                                m.dtype),
                     std::move(locals[k]));
  }
  return out;
}

absl::StatusOr<Outputs> Prepared::Empty() const {
  LocalOutputs locals;
  for (const OutputMeta& m : entry_->outs) {
    DT_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty({0}, m.dtype, first_->ToLocal().device()));
    locals.push_back(std::move(t));
  }
  Outputs out;
  for (size_t k = 0; k < locals.size(); ++k) {
    const OutputMeta& m = entry_->outs[k];
    out.emplace_back(DTensorSpec::FromValidated(mesh(), entry_->strategy.outputs[k], m.shape,
                                                m.dtype),
                     std::move(locals[k]));
  }
  return out;
}

}  // namespace dt::ops::internal

// ---- introspection (dtensor_ops.h: public, dt::ops) ----------------------------------------------

namespace dt::ops {

using internal::Cache;
using internal::Entry;
using internal::ThreadCache;

int Decision::num_redistributed() const {
  int n = 0;
  for (size_t j = 0; j < inputs_before.size(); ++j) n += inputs_before[j] != inputs_after[j];
  return n;
}

std::string Decision::ToString() const {
  auto list = [](const std::vector<Placements>& v) {
    std::vector<std::string> parts;
    for (const Placements& p : v) parts.push_back(p.empty() ? "-" : PlacementsToString(p));
    return absl::StrJoin(parts, " ");
  };
  return absl::StrCat(op, ": ", list(inputs_before), " -> ", list(inputs_after), " => ",
                      list(outputs), ", cost ", cost_us, " us, ",
                      cache_hit ? "cache hit" : "cache miss");
}

Decision LastDecision() {
  const Cache& cache = ThreadCache();
  Decision d;
  if (cache.last == nullptr) return d;
  const Entry& e = *cache.last;
  d.op = e.name;
  d.inputs_before = e.before;
  d.inputs_after.assign(e.strategy.inputs.begin(), e.strategy.inputs.end());
  d.outputs.assign(e.strategy.outputs.begin(), e.strategy.outputs.end());
  d.cost_us = e.cost_us;
  d.cache_hit = cache.last_hit;
  return d;
}

DispatchCacheStats GetDispatchCacheStats() {
  const Cache& cache = ThreadCache();
  return {cache.hits, cache.misses, static_cast<int64_t>(cache.map.size())};
}

void ClearDispatchCache() {
  Cache& cache = ThreadCache();
  cache.map.clear();
  cache.hits = 0;
  cache.misses = 0;
  cache.last = nullptr;
}

}  // namespace dt::ops
