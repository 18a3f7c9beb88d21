#include "dtensor/core/shape.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "dtensor/core/status.h"

namespace dt {

int64_t Numel(IntSpan shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Shape ContiguousStrides(IntSpan shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<int64_t>(shape[i], 1);
  }
  return st;
}

std::string ShapeToString(IntSpan shape) { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

absl::StatusOr<Shape> ParseShape(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  absl::ConsumePrefix(&t, "[");
  absl::ConsumePrefix(&t, "(");
  absl::ConsumeSuffix(&t, "]");
  absl::ConsumeSuffix(&t, ")");
  Shape out;
  if (absl::StripAsciiWhitespace(t).empty()) return out;
  for (absl::string_view part : absl::StrSplit(t, absl::ByAnyChar(",x"))) {
    part = absl::StripAsciiWhitespace(part);
    if (part.empty()) continue;
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad shape '", text, "': '", part, "' is not a non-negative integer"));
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<int> NormalizeDim(int64_t dim, int64_t ndim, absl::string_view what) {
  const int64_t d = dim < 0 ? dim + ndim : dim;
  if (d < 0 || d >= ndim) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", dim, " is out of range for a tensor of ",
                                                   ndim, " dims (expected ", -ndim, "..", ndim - 1, ")"));
  }
  return static_cast<int>(d);
}

absl::StatusOr<Shape> InferShape(IntSpan shape, int64_t numel, absl::string_view op) {
  Shape out(shape.begin(), shape.end());
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      if (infer >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(op, ": only one -1 allowed in ", ShapeToString(shape)));
      }
      infer = static_cast<int>(i);
    } else if (out[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": bad size in ", ShapeToString(shape)));
    } else {
      known *= out[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": cannot infer -1 in ",
                                                     ShapeToString(shape), " for ", numel,
                                                     " elements"));
    }
    out[infer] = numel / known;
  } else if (known != numel) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": shape ", ShapeToString(shape), " has ",
                                                   known, " elements, the tensor has ", numel));
  }
  return out;
}

absl::StatusOr<Shape> FlattenShape(IntSpan shape, int64_t start_dim, int64_t end_dim,
                                   absl::string_view what) {
  const int64_t r = static_cast<int64_t>(shape.size());
  if (r == 0) return Shape{1};
  DT_ASSIGN_OR_RETURN(int a, NormalizeDim(start_dim, r, "Flatten: start_dim"));
  DT_ASSIGN_OR_RETURN(int b, NormalizeDim(end_dim, r, "Flatten: end_dim"));
  if (a > b) {
    return absl::InvalidArgumentError(absl::StrCat("Flatten: start_dim ", start_dim,
                                                   " is after end_dim ", end_dim, " for ", what));
  }
  Shape s(shape.begin(), shape.begin() + a);
  s.push_back(Numel(shape.subspan(a, b - a + 1)));
  s.insert(s.end(), shape.begin() + b + 1, shape.end());
  return s;
}

std::vector<int64_t> ChunkSizes(int64_t n, int64_t chunks) {
  std::vector<int64_t> sizes;
  if (n == 0) {
    sizes.assign(static_cast<size_t>(chunks), 0);
    return sizes;
  }
  const int64_t c = (n + chunks - 1) / chunks;
  for (int64_t start = 0; start < n; start += c) sizes.push_back(std::min(c, n - start));
  return sizes;
}

absl::StatusOr<Shape> BroadcastShapes(IntSpan a, IntSpan b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (x != y && x != 1 && y != 1) {
      return absl::InvalidArgumentError(absl::StrCat("shapes ", ShapeToString(a), " and ",
                                                     ShapeToString(b), " do not broadcast (dim ",
                                                     i, ": ", x, " vs ", y, ")"));
    }
    out[i] = x == 1 ? y : x;
  }
  return out;
}

}  // namespace dt
