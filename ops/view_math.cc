#include "dtensor/ops/view_math.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/strategy.h"

namespace dt::ops::internal {

std::vector<ViewGroup> ViewGroups(IntSpan in, IntSpan out) {
  std::vector<ViewGroup> groups;
  const int ni = static_cast<int>(in.size()), no = static_cast<int>(out.size());
  int i = 0, j = 0;
  while (i < ni || j < no) {
    ViewGroup g;
    g.in_begin = i;
    g.out_begin = j;
    if (i == ni) {
      ++j;
    } else if (j == no) {
      ++i;
    } else {
      int64_t pi = in[i++], pj = out[j++];
      while (pi != pj) {  // equal numels (> 0) guarantee that the side behind has dims left
        if (pi < pj) {
          if (i == ni) break;
          pi *= in[i++];
        } else {
          if (j == no) break;
          pj *= out[j++];
        }
      }
    }
    g.in_end = i;
    g.out_end = j;
    for (int d = g.in_begin; d < g.in_end; ++d) {
      if (g.in_lead < 0 && in[d] > 1) g.in_lead = d;
      else if (g.in_lead >= 0) g.in_inner *= in[d];
    }
    for (int d = g.out_begin; d < g.out_end; ++d) {
      if (g.out_lead < 0 && out[d] > 1) g.out_lead = d;
      else if (g.out_lead >= 0) g.out_inner *= out[d];
    }
    groups.push_back(g);
  }
  return groups;
}

namespace {

bool Whole(const RangeList& rl, int64_t n) {
  return n == 0 ? rl.empty() : (rl.size() == 1 && rl[0].start == 0 && rl[0].stop == n);
}

// Ranges scaled by `inner` and merged where they touch.
RangeList Scaled(const RangeList& rl, int64_t inner) {
  RangeList out;
  for (const IndexRange& r : rl) {
    const IndexRange s{r.start * inner, r.stop * inner};
    if (!out.empty() && out.back().stop == s.start) {
      out.back().stop = s.stop;
    } else {
      out.push_back(s);
    }
  }
  return out;
}

}  // namespace

absl::Status ViewPiecesMatch(IntSpan in, IntSpan out, IntSpan mesh_shape,
                             absl::Span<const Placement> in_pl,
                             absl::Span<const Placement> out_pl) {
  if (Numel(in) == 0) return absl::OkStatus();  // every piece is empty
  const std::vector<ViewGroup> groups = ViewGroups(in, out);
  return ForEachCoord(mesh_shape, [&](IntSpan c) -> absl::Status {
    const DimRanges ri = ShardRanges(in, mesh_shape, in_pl, c);
    const DimRanges ro = ShardRanges(out, mesh_shape, out_pl, c);
    for (const ViewGroup& g : groups) {
      for (int d = g.in_begin; d < g.in_end; ++d) {
        if (d != g.in_lead && !Whole(ri[d], in[d])) {
          return absl::InvalidArgumentError(
              absl::StrCat("coordinate ", CoordString(c), ": input dim ", d, " is split inside a group"));
        }
      }
      for (int d = g.out_begin; d < g.out_end; ++d) {
        if (d != g.out_lead && !Whole(ro[d], out[d])) {
          return absl::InvalidArgumentError(absl::StrCat(
              "coordinate ", CoordString(c), ": output dim ", d, " is split inside a group"));
        }
      }
      if (g.in_lead < 0) continue;
      const RangeList a = Scaled(ri[g.in_lead], g.in_inner);
      const RangeList b = Scaled(ro[g.out_lead], g.out_inner);
      if (a != b) {
        return absl::InvalidArgumentError(absl::StrCat(
            "coordinate ", CoordString(c), ": input dim ", g.in_lead, " holds elements ",
            RangesToString(a), " of its group, output dim ", g.out_lead, " would hold ",
            RangesToString(b)));
      }
    }
    return absl::OkStatus();
  });
}

}  // namespace dt::ops::internal
