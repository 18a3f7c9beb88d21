#include "dtensor/dtensor/planner.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <optional>
#include <queue>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"

namespace dt {

// Note [Planning]
// Legality. Mesh dims apply left to right (Note [Shard math]), so a mesh dim i can only change how
// it splits tensor dim d when no mesh dim j > i (of size > 1) currently splits d as well: j's
// pieces are pieces *of i's pieces*, and a collective along i alone cannot re-cut them. So a step
// on mesh dim i from `from` to `to` is legal iff no such j shards a dim that `from` or `to` shards.
// This is "unshard innermost first": [S(0), S(0)] -> [R, R] must gather mesh dim 1 before mesh
// dim 0. Steps on mesh dims of size 1 never move data and are dropped.
//
// Greedy (PyTorch's generate_greedy_transform_infos): walk mesh dims right to left; a dim whose
// target shards d while the dims left of it split d differently now than in the target goes to R
// for the moment; every other dim goes straight to its target. Then walk left to right and finish
// the dims parked at R. We compare the left dims' exact placements, not just "which dims shard d"
// as PyTorch does, because S(0) and _S(0,2) on the same dim are different layouts.
//
// Min-cost search. Each mesh dim that must change visits at most three placements in order — its
// source, R, its target — and no optimal plan revisits one (every greedy plan is such a walk). So
// the state is one phase in {src, R, dst} per changing dim: at most 3^m states for m changing dims
// (243 for 5), not PyTorch's (N+2)·M·M! placement/order graph. Dijkstra runs over these states with
// edges for every legal single-dim step and for every legal merged step (an all_reduce, all_gather
// or reduce_scatter over a set of dims at once, see below), priced by the alpha-beta CostModel on
// the largest logical shape. Planning a 5-dim mesh of 10^4 ranks takes well under a millisecond;
// costs never depend on the number of ranks except through k. Beyond 7 changing dims (3^7 states)
// only greedy runs.
//
// Hosts. With CostModel::ranks_per_host, a step whose groups hold ranks of two hosts is priced on
// the inter-host link (Note [Groups across hosts] in cost_model.cc), computed once per set of mesh
// dims. So the search moves bytes within hosts where it can: [S(0), S(1)] -> [R, R] on
// (node, local) gathers the small pieces across hosts first and the large ones within a host, the
// reverse of the greedy order (without hosts both orders cost the same and greedy's is kept).
//
// Merging. Consecutive collectives of one kind become one collective on the flattened group of
// their mesh dims (row-major over the dims, ascending) when that gives the same layout:
//   all_reduce      any dims; ops equal, or sum mixed with avg (sum, then divide by the avg dims)
//   all_gather      S(d) -> R on dims that are all the innermost splits of d, when nested
//                   torch.chunk equals one flat chunk over the group for every logical size of d
//                   (always when the group size divides it; see NestedIsFlat)
//   reduce_scatter  P -> S(d) likewise; no dim right of the first one may split d
// all_to_all steps never merge (as in PyTorch). The search includes merged steps as edges, so it
// prices them; the greedy plan is merged afterwards.
//
// Choice (Strategy::kBest): the search plan when it is strictly cheaper and has no more
// collectives than the (merged) greedy plan; otherwise the greedy plan. So a plan never has more
// collectives than greedy, and plan(x -> x) is empty.

std::string PlanStep::ToString() const {
  return absl::StrCat(StepKindName(collective), " on d", absl::StrJoin(mesh_dims, "+d"), ": ",
                      PlacementsToCompactString(from), " -> ", PlacementsToCompactString(to));
}

namespace {
int CountCollectives(const std::vector<PlanStep>& steps) {
  int n = 0;
  for (const PlanStep& s : steps) n += s.collective != StepKind::kLocal;
  return n;
}
}  // namespace

int RedistributePlan::num_collectives() const { return CountCollectives(steps); }

std::string RedistributePlan::ToString() const {
  std::string out = PlacementsToString(src);
  for (size_t i = 0; i < steps.size(); ++i) {
    absl::StrAppend(&out, " -", StepKindName(steps[i].collective), "(d",
                    absl::StrJoin(steps[i].mesh_dims, "+d"), ")-> ",
                    PlacementsToString(states[i + 1]));
  }
  return out;
}

namespace {

struct Problem {
  Shape mesh;
  Shape shape;
  int64_t elem = 4;
  CostModel cost;
  // GroupCrossesHosts by mask of mesh dims, computed on first use (a search prices the same few
  // groups many times).
  mutable absl::InlinedVector<std::pair<uint64_t, bool>, 8> crosses;

  bool Crosses(absl::Span<const int> dims) const {
    if (cost.ranks_per_host <= 0) return false;
    if (mesh.size() > 64) return GroupCrossesHosts(mesh, dims, cost.ranks_per_host);
    uint64_t mask = 0;
    for (int d : dims) mask |= uint64_t{1} << d;
    for (const auto& [m, v] : crosses) {
      if (m == mask) return v;
    }
    const bool v = GroupCrossesHosts(mesh, dims, cost.ranks_per_host);
    crosses.push_back({mask, v});
    return v;
  }
};

bool ShardedRightOf(const Problem& pb, const Placements& cur, int i, int d,
                    absl::Span<const int> except = {}) {
  for (int j = i + 1; j < static_cast<int>(cur.size()); ++j) {
    if (pb.mesh[j] <= 1 || !cur[j].is_any_shard(d)) continue;
    if (std::find(except.begin(), except.end(), j) != except.end()) continue;
    return true;
  }
  return false;
}

// Whether mesh dim i may go from cur[i] to `to` (Note [Planning]); the mesh dims in `except` move
// in the same (merged) step and do not block it.
bool Legal(const Problem& pb, const Placements& cur, int i, const Placement& to,
           absl::Span<const int> except = {}) {
  const Placement& from = cur[i];
  if (from.is_any_shard() && ShardedRightOf(pb, cur, i, from.dim(), except)) return false;
  if (to.is_any_shard() && ShardedRightOf(pb, cur, i, to.dim(), except)) return false;
  return true;
}

StepKind KindOf(const Placement& from, const Placement& to) {
  if (from.is_any_shard()) return to.is_replicate() ? StepKind::kAllGather : StepKind::kAllToAll;
  if (from.is_partial()) {
    return to.is_any_shard() ? StepKind::kReduceScatter : StepKind::kAllReduce;
  }
  return StepKind::kLocal;
}

bool OpsMergeable(ReduceOp a, ReduceOp b) { return a == b || (IsSumLike(a) && IsSumLike(b)); }

// Sets cost_shape, group_size, bytes and cost_us of `step`, taken from state `cur`.
void Price(const Problem& pb, const Placements& cur, PlanStep& step) {
  const CostModel& cm = pb.cost;
  // The tensor the group jointly holds: every other mesh dim's split applied (Legal guarantees no
  // dim right of the group splits the dims it moves).
  Placements others = cur;
  for (int i : step.mesh_dims) others[i] = Placement::Replicate();
  const Shape origin(pb.mesh.size(), 0);  // holds the largest pieces
  step.cost_shape = ShardShape(pb.shape, pb.mesh, others, origin);
  int64_t k = 1;
  for (int i : step.mesh_dims) k *= pb.mesh[i];
  step.group_size = k;
  step.crosses_hosts = step.collective != StepKind::kLocal && pb.Crosses(step.mesh_dims);
  const LinkCost& link = cm.Link(step.crosses_hosts);
  const double logical = static_cast<double>(Numel(step.cost_shape) * pb.elem);
  // Bytes of the largest piece a shard placement list cuts the logical tensor into.
  auto piece = [&](const Placements& ps) {
    Shape s = step.cost_shape;
    for (size_t m = 0; m < ps.size(); ++m) {
      const Placement& p = ps[m];
      if (p.is_any_shard()) s[p.dim()] = ShardPieceSize(p, s[p.dim()], pb.mesh[step.mesh_dims[m]], 0);
    }
    return static_cast<double>(Numel(s) * pb.elem);
  };
  // Bytes sent per rank and bytes copied locally (packing, slicing).
  double bytes = 0, copied = 0;
  switch (step.collective) {
    case StepKind::kAllGather:
    case StepKind::kReduceScatter: {
      const Placements& shards =
          step.collective == StepKind::kAllGather ? step.from : step.to;
      bytes = (k - 1) * piece(shards);
      if (NeedsPacking(shards, step.cost_shape)) copied = logical;
      break;
    }
    case StepKind::kAllReduce:
      bytes = 2.0 * (k - 1) * logical / k;
      break;
    case StepKind::kAllToAll: {
      const double p = piece(step.from);
      bytes = (k - 1) * p / k;
      copied = 2 * p;
      break;
    }
    case StepKind::kLocal:
      if (!step.to.front().is_any_shard()) {
        copied = logical;
      } else if (NeedsPacking(step.to, step.cost_shape)) {
        copied = piece(step.to);
      }
      break;
  }
  const double comm =
      step.collective == StepKind::kLocal ? 0.0 : link.TimeUs(Hops(step.collective, k), bytes);
  step.bytes = static_cast<int64_t>(bytes);
  step.cost_us = comm + copied / cm.copy_bytes_per_us;
}

PlanStep SingleStep(const Problem& pb, const Placements& cur, int i, const Placement& to) {
  PlanStep s;
  s.mesh_dims = {i};
  s.from = {cur[i]};
  s.to = {to};
  s.collective = KindOf(cur[i], to);
  Price(pb, cur, s);
  return s;
}

// Whether chunking n over ks[0], then each piece over ks[1], ... (nested S(d)) gives the same pieces
// as one torch.chunk of n over prod(ks) in row-major order. True when prod(ks) divides n (PyTorch's
// merge condition) and in some uneven cases too (13 over 4x2: 2,2,2,2,2,2,1,0 both ways), but not
// in general (18 over 4x2: nested 3,2,3,2,3,2,2,1, flat 3,3,3,3,3,3,0,0).
bool NestedIsFlat(int64_t n, absl::Span<const int64_t> ks) {
  int64_t total = 1;
  for (int64_t k : ks) total *= k;
  if (n % total == 0) return true;
  std::vector<int64_t> sizes = {n};
  for (int64_t k : ks) {
    std::vector<int64_t> next;
    next.reserve(sizes.size() * k);
    for (int64_t m : sizes) {
      for (int64_t r = 0; r < k; ++r) next.push_back(ChunkOf(m, k, r).size);
    }
    sizes = std::move(next);
  }
  for (int64_t g = 0; g < total; ++g) {
    if (sizes[g] != ChunkOf(n, total, g).size) return false;
  }
  return true;
}

// A merged step over `dims` (ascending, >= 2) moving each to `tos`, or nullopt when merging is not
// legal or does not preserve the layout. See Note [Planning].
std::optional<PlanStep> MergedStep(const Problem& pb, const Placements& cur,
                                   absl::Span<const int> dims, absl::Span<const Placement> tos) {
  const StepKind kind = KindOf(cur[dims[0]], tos[0]);
  if (kind != StepKind::kAllGather && kind != StepKind::kAllReduce &&
      kind != StepKind::kReduceScatter) {
    return std::nullopt;
  }
  int64_t k = 1;
  for (size_t m = 0; m < dims.size(); ++m) {
    const Placement& from = cur[dims[m]];
    if (KindOf(from, tos[m]) != kind) return std::nullopt;
    k *= pb.mesh[dims[m]];
  }
  int d = -1;
  switch (kind) {
    case StepKind::kAllReduce:
      for (int i : dims) {
        if (!OpsMergeable(cur[i].reduce_op(), cur[dims[0]].reduce_op())) return std::nullopt;
      }
      break;
    case StepKind::kAllGather:
      d = cur[dims[0]].dim();
      for (int i : dims) {
        if (!cur[i].is_shard() || cur[i].unit() != 1 || cur[i].dim() != d) return std::nullopt;
      }
      break;
    case StepKind::kReduceScatter:
      d = tos[0].dim();
      for (size_t m = 0; m < dims.size(); ++m) {
        if (!tos[m].is_shard() || tos[m].unit() != 1 || tos[m].dim() != d) return std::nullopt;
        if (!OpsMergeable(cur[dims[m]].reduce_op(), cur[dims[0]].reduce_op())) return std::nullopt;
      }
      break;
    default:
      return std::nullopt;
  }
  if (d >= 0) {
    if (ShardedRightOf(pb, cur, dims[0], d, dims)) return std::nullopt;
    absl::InlinedVector<int64_t, 4> ks;
    for (int i : dims) ks.push_back(pb.mesh[i]);
    for (int64_t n : PossibleShardSizes(pb.shape, pb.mesh, cur, d, dims[0])) {
      if (!NestedIsFlat(n, ks)) return std::nullopt;
    }
  }
  PlanStep s;
  s.mesh_dims.assign(dims.begin(), dims.end());
  for (size_t m = 0; m < dims.size(); ++m) {
    s.from.push_back(cur[dims[m]]);
    s.to.push_back(tos[m]);
  }
  s.collective = kind;
  Price(pb, cur, s);
  return s;
}

void Apply(const PlanStep& s, Placements& cur) {
  for (size_t m = 0; m < s.mesh_dims.size(); ++m) cur[s.mesh_dims[m]] = s.to[m];
}

double TotalCost(const std::vector<PlanStep>& steps) {
  double c = 0;
  for (const PlanStep& s : steps) c += s.cost_us;
  return c;
}

// Greedy, see Note [Planning]. `start` already has size-1 mesh dims at their targets.
std::vector<PlanStep> GreedySteps(const Problem& pb, Placements cur, const Placements& dst) {
  std::vector<PlanStep> steps;
  const int m = static_cast<int>(cur.size());
  for (int i = m - 1; i >= 0; --i) {
    Placement target = dst[i];
    if (target.is_any_shard()) {
      const int d = target.dim();
      for (int h = 0; h < i; ++h) {
        if (pb.mesh[h] <= 1) continue;
        if ((cur[h].is_any_shard(d) || dst[h].is_any_shard(d)) && cur[h] != dst[h]) {
          target = Placement::Replicate();
          break;
        }
      }
    }
    if (cur[i] == target) continue;
    steps.push_back(SingleStep(pb, cur, i, target));
    cur[i] = target;
  }
  for (int i = 0; i < m; ++i) {
    if (cur[i] == dst[i]) continue;
    steps.push_back(SingleStep(pb, cur, i, dst[i]));
    cur[i] = dst[i];
  }
  return steps;
}

// Merges runs of consecutive same-kind steps (Note [Planning]).
std::vector<PlanStep> MergeSteps(const Problem& pb, Placements cur,
                                 const std::vector<PlanStep>& steps) {
  std::vector<PlanStep> out;
  size_t i = 0;
  while (i < steps.size()) {
    PlanStep group = steps[i];
    size_t j = i + 1;
    while (j < steps.size() && steps[j].collective == group.collective &&
           group.collective != StepKind::kLocal && group.collective != StepKind::kAllToAll) {
      // Candidate dims and targets, ascending by mesh dim.
      std::vector<std::pair<int, Placement>> members;
      for (size_t m = 0; m < group.mesh_dims.size(); ++m) {
        members.push_back({group.mesh_dims[m], group.to[m]});
      }
      for (size_t m = 0; m < steps[j].mesh_dims.size(); ++m) {
        members.push_back({steps[j].mesh_dims[m], steps[j].to[m]});
      }
      std::sort(members.begin(), members.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
      absl::InlinedVector<int, 4> dims;
      Placements tos;
      for (const auto& [dim, to] : members) {
        dims.push_back(dim);
        tos.push_back(to);
      }
      std::optional<PlanStep> merged = MergedStep(pb, cur, dims, tos);
      if (!merged) break;
      group = *std::move(merged);
      ++j;
    }
    Apply(group, cur);
    out.push_back(std::move(group));
    i = j;
  }
  return out;
}

// Min-cost search over per-dim phases {src, R, dst} (Note [Planning]); nullopt when too many dims
// change.
std::optional<std::vector<PlanStep>> SearchSteps(const Problem& pb, const Placements& start,
                                                 const Placements& dst, bool merge) {
  struct Var {
    int mesh_dim;
    absl::InlinedVector<Placement, 3> opts;
  };
  std::vector<Var> vars;
  for (int i = 0; i < static_cast<int>(start.size()); ++i) {
    // A shard that stays may still have to step aside (to R) while a dim left of it re-splits.
    if (start[i] == dst[i] && !(start[i].is_any_shard() && pb.mesh[i] > 1)) continue;
    Var v{i, {start[i]}};
    if (!start[i].is_replicate() && !dst[i].is_replicate()) v.opts.push_back(Placement::Replicate());
    if (start[i] != dst[i] || v.opts.size() > 1) v.opts.push_back(dst[i]);
    vars.push_back(std::move(v));
  }
  const int nv = static_cast<int>(vars.size());
  if (nv > 7) return std::nullopt;
  if (nv == 0) return std::vector<PlanStep>{};
  std::vector<int> radix(nv + 1, 1);
  for (int v = 0; v < nv; ++v) radix[v + 1] = radix[v] * 3;
  const int num_states = radix[nv];
  auto phase = [&](int id, int v) { return (id / radix[v]) % 3; };
  auto last = [&](int v) { return static_cast<int>(vars[v].opts.size()) - 1; };
  auto is_goal = [&](int id) {
    for (int v = 0; v < nv; ++v) {
      if (vars[v].opts[phase(id, v)] != dst[vars[v].mesh_dim]) return false;
    }
    return true;
  };
  int goal = -1;

  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> dist(num_states, kInf);
  std::vector<int> nsteps(num_states, 0);
  std::vector<int> prev(num_states, -1);
  std::vector<PlanStep> via(num_states);
  using Item = std::tuple<double, int, int>;  // cost, steps, state
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> queue;
  dist[0] = 0;
  queue.push({0.0, 0, 0});

  Placements cur = start;
  auto relax = [&](int from_id, int to_id, PlanStep step) {
    const double c = dist[from_id] + step.cost_us;
    const int n = nsteps[from_id] + 1;
    if (c < dist[to_id] || (c == dist[to_id] && n < nsteps[to_id])) {
      dist[to_id] = c;
      nsteps[to_id] = n;
      prev[to_id] = from_id;
      via[to_id] = std::move(step);
      queue.push({c, n, to_id});
    }
  };
  while (!queue.empty()) {
    const auto [c, n, id] = queue.top();
    queue.pop();
    if (c > dist[id] || (c == dist[id] && n > nsteps[id])) continue;
    if (is_goal(id)) {
      goal = id;
      break;
    }
    for (int v = 0; v < nv; ++v) cur[vars[v].mesh_dim] = vars[v].opts[phase(id, v)];
    // Single-dim steps.
    for (int v = 0; v < nv; ++v) {
      const int p = phase(id, v);
      for (int q = p + 1; q <= last(v); ++q) {
        const Placement& to = vars[v].opts[q];
        if (to == vars[v].opts[p] || !Legal(pb, cur, vars[v].mesh_dim, to)) continue;
        relax(id, id + (q - p) * radix[v], SingleStep(pb, cur, vars[v].mesh_dim, to));
      }
    }
    if (!merge) continue;
    // Merged steps: every subset (>= 2) of the dims that can take one collective of a kind.
    for (StepKind kind : {StepKind::kAllReduce, StepKind::kAllGather,
                            StepKind::kReduceScatter}) {
      std::vector<std::pair<int, int>> cand;  // (var, target phase)
      for (int v = 0; v < nv; ++v) {
        const int p = phase(id, v);
        for (int q = p + 1; q <= last(v); ++q) {
          if (KindOf(vars[v].opts[p], vars[v].opts[q]) == kind) {
            cand.push_back({v, q});
            break;
          }
        }
      }
      const int nc = static_cast<int>(cand.size());
      if (nc < 2) continue;
      for (int mask = 1; mask < (1 << nc); ++mask) {
        if ((mask & (mask - 1)) == 0) continue;  // single dims are covered above
        absl::InlinedVector<int, 4> dims;
        Placements tos;
        int to_id = id;
        for (int b = 0; b < nc; ++b) {  // vars are in ascending mesh-dim order
          if (!(mask >> b & 1)) continue;
          const auto [v, q] = cand[b];
          dims.push_back(vars[v].mesh_dim);
          tos.push_back(vars[v].opts[q]);
          to_id += (q - phase(id, v)) * radix[v];
        }
        std::optional<PlanStep> step = MergedStep(pb, cur, dims, tos);
        if (step) relax(id, to_id, *std::move(step));
      }
    }
  }
  if (goal < 0) return std::nullopt;
  std::vector<PlanStep> steps;
  for (int id = goal; id != 0; id = prev[id]) steps.push_back(via[id]);
  std::reverse(steps.begin(), steps.end());
  return steps;
}

std::string Describe(const DTensorSpec& spec) { return spec.ToString(); }

absl::Status Refuse(const DTensorSpec& src, const DTensorSpec& dst, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("cannot redistribute ", Describe(src), " to ",
                                                 PlacementsToString(dst.placements()), ": ", why));
}

// Checks that `steps` are legal and take src to dst (an internal invariant of the planners).
absl::Status CheckSteps(const Problem& pb, Placements cur, const Placements& dst,
                        const std::vector<PlanStep>& steps) {
  for (const PlanStep& s : steps) {
    for (size_t m = 0; m < s.mesh_dims.size(); ++m) {
      const int i = s.mesh_dims[m];
      if (cur[i] != s.from[m] || !Legal(pb, cur, i, s.to[m], s.mesh_dims)) {
        return absl::InternalError(absl::StrCat("planner produced an illegal step ", s.ToString(),
                                                " from ", PlacementsToString(cur)));
      }
    }
    Apply(s, cur);
  }
  if (cur != dst) {
    return absl::InternalError(absl::StrCat("planner ended at ", PlacementsToString(cur),
                                            " instead of ", PlacementsToString(dst)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RedistributePlan> PlanRedistribute(const DTensorSpec& src, const DTensorSpec& dst,
                                                  const PlannerOptions& options) {
  if (!(src.mesh() == dst.mesh())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot redistribute ", Describe(src), " to ", Describe(dst),
        ": the meshes differ (redistribution across meshes is not supported)"));
  }
  if (src.shape() != dst.shape() || src.dtype() != dst.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot redistribute ", src.Describe(), " to ",
                                                   dst.Describe(),
                                                   ": the global shape and dtype must not change"));
  }
  const int m = static_cast<int>(src.placements().size());
  const std::vector<std::string>& names = src.mesh().names();
  // Note [Quantized tensors stay put]
  // A quantized tensor (Note [Quantized dtypes] in core/quant.h) is a weight sharded at load on
  // block boundaries: its pieces are blocks, not elements, so the element-wise shard math of a
  // redistribution (all_gather, slicing of a replicated piece) does not apply to it. The planner
  // refuses any change of its placements (mesh dims of size 1 aside), which also makes every op
  // strategy that would move it unusable (ops/dispatch.cc prices moves through here): a Linear
  // runs where its quantized weight lies. Code that needs it elsewhere dequantizes it first
  // (SaveGathered does).
  if (IsQuantized(src.dtype())) {
    for (int i = 0; i < m; ++i) {
      if (src.mesh().shape()[i] > 1 && src.placements()[i] != dst.placements()[i]) {
        return absl::UnimplementedError(absl::StrCat(
            "cannot redistribute ", src.Describe(), " to ", PlacementsToString(dst.placements()),
            ": a quantized tensor keeps the placement it was loaded with (Note [Quantized tensors "
            "stay put]); dequantize it first"));
      }
    }
  }
  for (int i = 0; i < m; ++i) {
    const Placement& a = src.placements()[i];
    const Placement& b = dst.placements()[i];
    const std::string where = absl::StrCat(" (mesh dim ", MeshDimName(names, i), ": ",
                                           a.ToString(), " -> ", b.ToString(), ")");
    if (a.is_any_shard() && b.is_partial()) {
      return Refuse(src, dst, absl::StrCat("Shard -> Partial is not a redistribution", where));
    }
    if (b.is_partial() && !(a == b) && !a.is_partial() && !options.allow_partial) {
      return Refuse(src, dst, absl::StrCat("redistributing to Partial is for internal use only", where,
                                           "; see PlannerOptions::allow_partial"));
    }
    if (a.is_partial() && b.is_partial() && a.reduce_op() != b.reduce_op()) {
      return Refuse(src, dst,
                    absl::StrCat("Partial(", ReduceOpName(a.reduce_op()), ") -> Partial(",
                                 ReduceOpName(b.reduce_op()), ") is not a redistribution", where));
    }
  }

  Problem pb;
  pb.mesh = Shape(src.mesh().shape().begin(), src.mesh().shape().end());
  pb.shape = src.shape();
  pb.elem = DTypeSize(src.dtype());
  pb.cost = options.cost;

  RedistributePlan plan;
  plan.src = src.placements();
  plan.dst = dst.placements();
  // Mesh dims of size 1 hold the same data under every placement.
  Placements start = src.placements();
  for (int i = 0; i < m; ++i) {
    if (pb.mesh[i] <= 1) start[i] = dst.placements()[i];
  }

  using Strategy = PlannerOptions::Strategy;
  std::vector<PlanStep> greedy;
  if (options.strategy != Strategy::kSearch) {
    greedy = GreedySteps(pb, start, plan.dst);
    if (options.merge) greedy = MergeSteps(pb, start, greedy);
  }
  std::optional<std::vector<PlanStep>> search;
  if (options.strategy != Strategy::kGreedy) {
    search = SearchSteps(pb, start, plan.dst, options.merge);
    if (search && options.merge) search = MergeSteps(pb, start, *search);
  }
  // The greedy walk is legal by construction for plain shards; with interleaved shards it can
  // get stuck, and then the search plan (always legal) is used, whichever strategy was asked for.
  const bool greedy_ok = options.strategy != Strategy::kSearch &&
                         CheckSteps(pb, start, plan.dst, greedy).ok();
  if (!greedy_ok && !search && options.strategy == Strategy::kGreedy) {
    search = SearchSteps(pb, start, plan.dst, options.merge);
    if (search && options.merge) search = MergeSteps(pb, start, *search);
  }
  bool use_search = false;
  if (options.strategy == Strategy::kSearch || !greedy_ok) {
    if (!search) {
      return absl::UnimplementedError(absl::StrCat(
          "cannot plan ", Describe(src), " -> ", PlacementsToString(dst.placements()), ": ",
          options.strategy == Strategy::kSearch
              ? "the min-cost search covers at most 7 changing mesh dims; use the greedy planner"
              : "the greedy order gets stuck on these interleaved shards and the min-cost search "
                "covers at most 7 changing mesh dims"));
    }
    use_search = true;
  } else if (options.strategy == Strategy::kBest && search) {
    use_search = TotalCost(*search) < TotalCost(greedy) - 1e-9 &&
                 CountCollectives(*search) <= CountCollectives(greedy);
  }
  plan.steps = use_search ? *std::move(search) : std::move(greedy);
  plan.strategy = plan.steps.empty() ? "none" : use_search ? "search" : "greedy";
  DT_RETURN_IF_ERROR(CheckSteps(pb, start, plan.dst, plan.steps));

  plan.cost_us = TotalCost(plan.steps);
  Placements cur = start;
  plan.states.push_back(cur);
  for (const PlanStep& s : plan.steps) {
    Apply(s, cur);
    plan.states.push_back(cur);
  }
  return plan;
}

}  // namespace dt
