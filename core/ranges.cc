#include "dtensor/core/ranges.h"

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"

namespace dt {
namespace {

// Position of global index x in `have` and how many indices follow contiguously from there.
std::pair<int64_t, int64_t> Locate(const RangeList& have, int64_t x) {
  int64_t pos = 0;
  for (const IndexRange& r : have) {
    if (x >= r.start && x < r.stop) return {pos + (x - r.start), r.stop - x};
    pos += r.size();
  }
  DT_CHECK(false, "index ", x, " not in ", RangesToString(have));
  return {0, 0};
}

}  // namespace

int64_t RangesSize(const RangeList& ranges) {
  int64_t n = 0;
  for (const IndexRange& r : ranges) n += r.size();
  return n;
}

std::string RangesToString(const RangeList& ranges) {
  if (ranges.empty()) return "empty";
  return absl::StrJoin(ranges, ", ", [](std::string* out, const IndexRange& r) {
    absl::StrAppend(out, "[", r.start, ", ", r.stop, ")");
  });
}

RangeList FullRange(int64_t n) {
  RangeList r;
  if (n > 0) r.push_back({0, n});
  return r;
}

DimRanges FullRanges(IntSpan shape) {
  DimRanges out;
  for (int64_t n : shape) out.push_back(FullRange(n));
  return out;
}

RangeList IntersectRanges(const RangeList& a, const RangeList& b) {
  RangeList out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t lo = std::max(a[i].start, b[j].start);
    const int64_t hi = std::min(a[i].stop, b[j].stop);
    if (lo < hi) out.push_back({lo, hi});
    (a[i].stop < b[j].stop) ? ++i : ++j;
  }
  return out;
}

// The runs copying the global indices `box` from a tensor holding `src_have` along a dim into one
// holding `dst_have` (box is a subset of both).
IndexRuns DimRuns(const RangeList& src_have, const RangeList& dst_have, const RangeList& box) {
  IndexRuns runs;
  for (const IndexRange& r : box) {
    int64_t x = r.start;
    while (x < r.stop) {
      const auto [sp, sleft] = Locate(src_have, x);
      const auto [dp, dleft] = Locate(dst_have, x);
      const int64_t len = std::min({r.stop - x, sleft, dleft});
      if (!runs.empty() && runs.back().src + runs.back().len == sp &&
          runs.back().dst + runs.back().len == dp) {
        runs.back().len += len;
      } else {
        runs.push_back({sp, dp, len});
      }
      x += len;
    }
  }
  return runs;
}

// Copies the elements at global indices `box` (per dim) from `src` (holding `src_have`) into `dst`
// (holding `dst_have`).
absl::Status CopyBox(const Tensor& dst, const DimRanges& dst_have, const Tensor& src,
                     const DimRanges& src_have, const DimRanges& box) {
  const int nd = src.dim();
  std::vector<IndexRuns> runs(nd);
  for (int d = 0; d < nd; ++d) {
    runs[d] = DimRuns(src_have[d], dst_have[d], box[d]);
    if (runs[d].empty()) return absl::OkStatus();
  }
  if (nd == 0) return dst.CopyFrom(src);
  std::function<absl::Status(int, const Tensor&, const Tensor&)> rec =
      [&](int d, const Tensor& s, const Tensor& t) -> absl::Status {
    if (d == nd) return t.CopyFrom(s);
    for (const IndexRun& r : runs[d]) {
      const bool whole = r.src == 0 && r.dst == 0 && r.len == s.size(d) && r.len == t.size(d);
      if (whole) {
        DT_RETURN_IF_ERROR(rec(d + 1, s, t));
        continue;
      }
      DT_ASSIGN_OR_RETURN(Tensor sn, s.Narrow(d, r.src, r.len));
      DT_ASSIGN_OR_RETURN(Tensor tn, t.Narrow(d, r.dst, r.len));
      DT_RETURN_IF_ERROR(rec(d + 1, sn, tn));
    }
    return absl::OkStatus();
  };
  return rec(0, src, dst);
}

Shape RangesShape(const DimRanges& ranges) {
  Shape s;
  for (const RangeList& r : ranges) s.push_back(RangesSize(r));
  return s;
}

absl::StatusOr<Tensor> SliceRanges(const Tensor& full, const DimRanges& ranges) {
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(RangesShape(ranges), full.dtype(), full.device()));
  DT_RETURN_IF_ERROR(CopyBox(out, ranges, full, FullRanges(full.shape()), ranges));
  return out;
}

}  // namespace dt
