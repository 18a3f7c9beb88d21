#include "dtensor/ops/strategy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"

namespace dt::ops::internal {

const DTensorSpec& OpCall::first() const {
  for (const DTensorSpec* s : inputs) {
    if (s != nullptr) return *s;
  }
  DT_CHECK(false, "OpCall without inputs");
  return *inputs[0];
}

std::string CoordString(IntSpan c) { return absl::StrCat("(", absl::StrJoin(c, ", "), ")"); }

std::string RankAt(const DeviceMesh& mesh, IntSpan c) {
  int64_t flat = 0;
  for (size_t i = 0; i < c.size(); ++i) flat = flat * mesh.shape()[i] + c[i];
  return absl::StrCat("rank ", mesh.ranks()[flat], " ", CoordString(c));
}

DimOption ReplicateOption(int n_in, int n_out) {
  DimOption o;
  o.in.assign(static_cast<size_t>(n_in), Placement::Replicate());
  o.out.assign(static_cast<size_t>(n_out), Placement::Replicate());
  return o;
}

std::optional<ReduceOp> PartialOf(const OpCall& call, int j, int i) {
  const DTensorSpec* s = call.inputs[j];
  if (s == nullptr) return std::nullopt;
  const Placement& p = s->placements()[i];
  if (!p.is_partial()) return std::nullopt;
  return p.reduce_op();
}

namespace {

int FindLabel(absl::Span<const int> dims, int label) {
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] == label) return static_cast<int>(d);
  }
  return -1;
}

}  // namespace

void AddShardOptions(const OpCall& call, const LabelMap& labels, int mesh_dim,
                     DimOptions* options) {
  const int n_in = call.num_inputs();
  const int n_out = static_cast<int>(labels.out.size());
  for (int label = 0; label < static_cast<int>(labels.kinds.size()); ++label) {
    const LabelKind kind = labels.kinds[label];
    bool in_any_input = false;
    for (int j = 0; j < n_in; ++j) {
      if (call.inputs[j] != nullptr && FindLabel(labels.in[j], label) >= 0) in_any_input = true;
    }
    if (!in_any_input) continue;
    // Shard kinds: plain, plus the interleaved and unit shards the inputs carry for this label
    // (a label keeps the dim's size, so the same blocks or units cut it everywhere).
    absl::InlinedVector<Placement, 2> kinds = {Placement::Shard(0)};
    if (kind != LabelKind::kMasked) {
      for (int j = 0; j < n_in; ++j) {
        if (call.inputs[j] == nullptr) continue;
        const Placement& cur = call.inputs[j]->placements()[mesh_dim];
        if (!cur.is_any_shard() || cur == Placement::Shard(cur.dim())) continue;
        if (labels.in[j][cur.dim()] != label) continue;
        const Placement t = cur.WithDim(0);
        if (std::find(kinds.begin(), kinds.end(), t) == kinds.end()) kinds.push_back(t);
      }
    }
    for (const Placement& t : kinds) {
      DimOption o;
      for (int j = 0; j < n_in; ++j) {
        const int d = call.inputs[j] == nullptr ? -1 : FindLabel(labels.in[j], label);
        o.in.push_back(d >= 0 ? t.WithDim(d) : Placement::Replicate());
      }
      bool ok = true;
      for (int k = 0; k < n_out; ++k) {
        const int d = FindLabel(labels.out[k], label);
        if (d >= 0) {
          o.out.push_back(t.WithDim(d));
        } else if (kind == LabelKind::kSum || kind == LabelKind::kMasked) {
          o.out.push_back(Placement::Partial(ReduceOp::kSum));
        } else if (kind == LabelKind::kMax) {
          o.out.push_back(Placement::Partial(ReduceOp::kMax));
        } else {
          ok = false;  // a free label that vanishes: the output would miss data
        }
      }
      if (ok) options->push_back(std::move(o));
    }
  }
}

LabelMap BroadcastLabels(const OpCall& call, IntSpan out_shape, int n_out,
                         absl::Span<const int> whole) {
  LabelMap m;
  const int n = static_cast<int>(out_shape.size());
  auto is_whole = [&](int o) { return std::find(whole.begin(), whole.end(), o) != whole.end(); };
  for (int o = 0; o < n; ++o) m.AddLabel(LabelKind::kFree);
  for (const DTensorSpec* s : call.inputs) {
    absl::InlinedVector<int, 6> dims;
    if (s != nullptr) {
      const int r = s->ndim();
      for (int d = 0; d < r; ++d) {
        const int o = n - r + d;
        const bool same = o >= 0 && s->shape()[d] == out_shape[o];
        dims.push_back(same && !is_whole(o) ? o : -1);
      }
    }
    m.in.push_back(std::move(dims));
  }
  absl::InlinedVector<int, 6> out;
  for (int o = 0; o < n; ++o) out.push_back(is_whole(o) ? -1 : o);
  for (int k = 0; k < n_out; ++k) m.out.push_back(out);
  return m;
}

}  // namespace dt::ops::internal
