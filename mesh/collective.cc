#include "dtensor/mesh/collective.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"

namespace dt::internal {

absl::string_view CollectiveName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kAllGatherV: return "all_gather_v";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kReduceScatterV: return "reduce_scatter_v";
    case CollectiveKind::kAllToAll: return "all_to_all";
    case CollectiveKind::kAllToAllV: return "all_to_all_v";
    case CollectiveKind::kAllToAllViews: return "all_to_all_views";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kSend: return "send";
    case CollectiveKind::kRecv: return "recv";
    case CollectiveKind::kBarrier: return "barrier";
  }
  return "?";
}

bool IsReduction(CollectiveKind kind) {
  return kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter ||
         kind == CollectiveKind::kReduceScatterV;
}

std::string Collective::Describe() const {
  const bool views = kind == CollectiveKind::kAllToAllViews || staged_views;
  std::string s(CollectiveName(views ? CollectiveKind::kAllToAllViews : kind));
  const bool p2p = kind == CollectiveKind::kSend || kind == CollectiveKind::kRecv;
  if (!p2p) absl::StrAppend(&s, " #", seq);
  if (kind == CollectiveKind::kBarrier) return s;
  if (views) {
    absl::StrAppend(&s, " (", DTypeName(views_dtype), " views");
  } else {
    absl::StrAppend(&s, " (", input.defined() ? input.Describe() : "undefined tensor");
    if (output.defined()) absl::StrAppend(&s, " -> ", output.Describe());
  }
  if (IsReduction(kind)) absl::StrAppend(&s, ", ", ReduceOpName(requested_op()));
  if (kind == CollectiveKind::kBroadcast) absl::StrAppend(&s, ", root ", peer);
  if (kind == CollectiveKind::kSend) absl::StrAppend(&s, ", to ", peer);
  if (kind == CollectiveKind::kRecv) absl::StrAppend(&s, ", from ", peer);
  if (!counts.empty()) absl::StrAppend(&s, ", counts [", absl::StrJoin(counts, ", "), "]");
  if (!recv_counts.empty()) {
    absl::StrAppend(&s, ", recv_counts [", absl::StrJoin(recv_counts, ", "), "]");
  }
  absl::StrAppend(&s, ")");
  return s;
}

std::vector<int64_t> Offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> off(counts.size());
  int64_t acc = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    off[i] = acc;
    acc += counts[i];
  }
  return off;
}

int64_t Sum(const std::vector<int64_t>& counts) {
  int64_t acc = 0;
  for (int64_t c : counts) acc += c;
  return acc;
}

Fingerprint Fingerprint::Of(const Collective& c) {
  Fingerprint f;
  f.kind = c.kind;
  f.dtype = c.dtype();
  f.op = c.requested_op();
  f.peer = c.peer;
  f.input_numel = c.input.defined() ? c.input.numel() : 0;
  f.counts = c.counts;
  f.recv_counts = c.recv_counts;
  return f;
}

std::vector<int64_t> Fingerprint::Encode(int group_size) const {
  std::vector<int64_t> out = {static_cast<int64_t>(kind), static_cast<int64_t>(dtype), static_cast<int64_t>(op),
                              peer, input_numel};
  for (int i = 0; i < group_size; ++i) out.push_back(i < static_cast<int>(counts.size()) ? counts[i] : -1);
  for (int i = 0; i < group_size; ++i) out.push_back(i < static_cast<int>(recv_counts.size()) ? recv_counts[i] : -1);
  return out;
}

Fingerprint Fingerprint::Decode(const int64_t* d, int group_size) {
  Fingerprint f;
  f.kind = static_cast<CollectiveKind>(d[0]);
  f.dtype = static_cast<DType>(d[1]);
  f.op = static_cast<ReduceOp>(d[2]);
  f.peer = static_cast<int>(d[3]);
  f.input_numel = d[4];
  if (d[5] >= 0) f.counts.assign(d + 5, d + 5 + group_size);
  if (d[5 + group_size] >= 0) f.recv_counts.assign(d + 5 + group_size, d + 5 + 2 * group_size);
  return f;
}

std::string RankList(absl::Span<const int> ranks) { return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]"); }

uint64_t GroupHash(absl::Span<const int> ranks) {
  uint64_t h = 1469598103934665603ull;
  for (int r : ranks) h = (h ^ static_cast<uint64_t>(r)) * 1099511628211ull;
  return h;
}

std::string FindDisagreement(const std::vector<Fingerprint>& f, const std::vector<int>& g) {
  using K = CollectiveKind;
  const int n = static_cast<int>(f.size());
  const Fingerprint& a = f[0];
  auto differ = [&](int i, absl::string_view what, const std::string& mine, const std::string& theirs) {
    return absl::StrCat("ranks disagree on the ", what, ": global rank ", g[0], " passed ", mine,
                        ", global rank ", g[i], " passed ", theirs);
  };
  auto list = [](const std::vector<int64_t>& v) { return absl::StrCat("[", absl::StrJoin(v, ", "), "]"); };
  for (int i = 1; i < n; ++i) {
    const Fingerprint& b = f[i];
    if (b.kind != a.kind) return differ(i, "collective", std::string(CollectiveName(a.kind)), std::string(CollectiveName(b.kind)));
    if (a.kind == K::kBarrier) continue;
    if (b.dtype != a.dtype) return differ(i, "dtype", std::string(DTypeName(a.dtype)), std::string(DTypeName(b.dtype)));
    if (IsReduction(a.kind) && b.op != a.op) {
      return differ(i, "reduce op", std::string(ReduceOpName(a.op)), std::string(ReduceOpName(b.op)));
    }
    if (a.kind == K::kBroadcast && b.peer != a.peer) return differ(i, "root", absl::StrCat(a.peer), absl::StrCat(b.peer));
    if (a.kind == K::kAllGatherV || a.kind == K::kReduceScatterV) {
      if (b.counts != a.counts) return differ(i, "counts", list(a.counts), list(b.counts));
    } else if (a.kind != K::kAllToAllV && a.kind != K::kAllToAllViews && b.input_numel != a.input_numel) {
      return differ(i, "input size", absl::StrCat(a.input_numel, " elements"), absl::StrCat(b.input_numel, " elements"));
    }
  }
  if (a.kind == K::kAllToAllV || a.kind == K::kAllToAllViews) {
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        if (f[i].counts[j] != f[j].recv_counts[i]) {
          return absl::StrCat("global rank ", g[i], " sends ", f[i].counts[j], " elements to global rank ", g[j],
                              ", which expects ", f[j].recv_counts[i]);
        }
      }
    }
  }
  return "";
}

}  // namespace dt::internal
