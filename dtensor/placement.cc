#include "dtensor/dtensor/placement.h"

#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "dtensor/core/status.h"

namespace dt {

Placement Placement::Shard(int dim) {
  Placement p;
  p.kind_ = PlacementKind::kShard;
  p.dim_ = dim;
  return p;
}

Placement Placement::Shard(int dim, int64_t unit) {
  DT_CHECK(unit >= 1, "S unit ", unit);
  Placement p = Shard(dim);
  p.unit_ = unit;
  return p;
}

Placement Placement::Partial(ReduceOp op) {
  Placement p;
  p.kind_ = PlacementKind::kPartial;
  p.op_ = op;
  return p;
}

Placement Placement::StridedShard(int dim, int64_t split_factor) {
  DT_CHECK(split_factor >= 1, "_S split factor ", split_factor);
  if (split_factor == 1) return Shard(dim);
  Placement p;
  p.kind_ = PlacementKind::kStridedShard;
  p.dim_ = dim;
  p.sf_ = split_factor;
  return p;
}

Placement Placement::BlockShard(int dim, std::vector<int64_t> blocks) {
  DT_CHECK(!blocks.empty(), "_S block list is empty");
  for (int64_t b : blocks) DT_CHECK(b >= 0, "_S block size ", b);
  Placement p;
  p.kind_ = PlacementKind::kStridedShard;
  p.dim_ = dim;
  p.blocks_ = std::make_shared<const std::vector<int64_t>>(std::move(blocks));
  return p;
}

absl::Span<const int64_t> Placement::blocks() const {
  if (!blocks_) return {};
  return absl::MakeConstSpan(*blocks_);
}

absl::InlinedVector<int64_t, 8> Placement::BlockSizes(int64_t n) const {
  absl::InlinedVector<int64_t, 8> out;
  if (blocks_) {
    out.assign(blocks_->begin(), blocks_->end());
  } else if (is_strided_shard()) {
    for (int64_t b = 0; b < sf_; ++b) out.push_back(ChunkOf(n, sf_, b).size);
  } else {
    out.push_back(n);
  }
  return out;
}

Placement Placement::WithDim(int dim) const {
  Placement p = *this;
  p.dim_ = dim;
  return p;
}

std::string Placement::ToString() const {
  switch (kind_) {
    case PlacementKind::kReplicate: return "R";
    case PlacementKind::kShard:
      if (unit_ != 1) return absl::StrCat("S(", dim_, ",unit=", unit_, ")");
      return absl::StrCat("S(", dim_, ")");
    case PlacementKind::kPartial: return absl::StrCat("P(", ReduceOpName(op_), ")");
    case PlacementKind::kStridedShard:
      if (blocks_) return absl::StrCat("_S(", dim_, ",[", absl::StrJoin(*blocks_, ","), "])");
      return absl::StrCat("_S(", dim_, ",", sf_, ")");
  }
  return "?";
}

size_t Placement::Hash() const {
  size_t h = absl::HashOf(static_cast<int>(kind_), dim_, static_cast<int>(op_), sf_, unit_);
  if (blocks_) h = absl::HashOf(h, *blocks_);
  return h;
}

bool operator==(const Placement& a, const Placement& b) {
  if (a.kind_ != b.kind_) return false;
  switch (a.kind_) {
    case PlacementKind::kReplicate: return true;
    case PlacementKind::kShard: return a.dim_ == b.dim_ && a.unit_ == b.unit_;
    case PlacementKind::kPartial: return a.op_ == b.op_;
    case PlacementKind::kStridedShard:
      if (a.dim_ != b.dim_ || a.sf_ != b.sf_ || (a.blocks_ == nullptr) != (b.blocks_ == nullptr)) {
        return false;
      }
      return a.blocks_ == b.blocks_ || *a.blocks_ == *b.blocks_;
  }
  return false;
}

namespace {

absl::Status BadPlacement(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "bad placement '", text, "': ", why,
      " (expected R, S(dim), S(dim,unit=u), P(sum|avg|min|max|prod), _S(dim,split_factor) or ",
      "_S(dim,[b0,b1,...]))"));
}

bool ParseInt(absl::string_view s, int64_t* v) {
  return absl::SimpleAtoi(absl::StripAsciiWhitespace(s), v);
}

// Splits `s` at commas that are not nested inside (), [].
std::vector<absl::string_view> SplitTopLevel(absl::string_view s) {
  std::vector<absl::string_view> parts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  parts.push_back(s.substr(start));
  return parts;
}

// "name(args)" -> name, args; a bare name has no parentheses (has_args false).
bool SplitCall(absl::string_view t, absl::string_view* name, absl::string_view* args,
               bool* has_args) {
  const size_t open = t.find('(');
  if (open == absl::string_view::npos) {
    *name = t;
    *has_args = false;
    return true;
  }
  if (t.back() != ')') return false;
  *name = absl::StripAsciiWhitespace(t.substr(0, open));
  *args = t.substr(open + 1, t.size() - open - 2);
  *has_args = true;
  return true;
}

}  // namespace

absl::StatusOr<Placement> ParsePlacement(absl::string_view text) {
  const absl::string_view t = absl::StripAsciiWhitespace(text);
  if (t.empty()) return BadPlacement(text, "empty");
  absl::string_view name, args;
  bool has_args = false;
  if (!SplitCall(t, &name, &args, &has_args)) return BadPlacement(text, "unbalanced parentheses");
  args = absl::StripAsciiWhitespace(args);

  if (name == "R" || name == "Replicate") {
    if (has_args && !args.empty()) return BadPlacement(text, "Replicate takes no arguments");
    return Placement::Replicate();
  }
  if (name == "S" || name == "Shard") {
    const std::vector<absl::string_view> parts = SplitTopLevel(args);
    int64_t d = 0;
    if (!has_args || parts.size() > 2 || !ParseInt(parts[0], &d)) {
      return BadPlacement(text, "Shard needs an integer dim");
    }
    if (parts.size() == 1) return Placement::Shard(static_cast<int>(d));
    absl::string_view unit = absl::StripAsciiWhitespace(parts[1]);
    int64_t u = 0;
    if (!absl::ConsumePrefix(&unit, "unit=") || !ParseInt(unit, &u) || u < 1) {
      return BadPlacement(text, absl::StrCat("the second argument of S must be unit=<a positive "
                                             "integer>, got '",
                                             absl::StripAsciiWhitespace(parts[1]), "'"));
    }
    return Placement::Shard(static_cast<int>(d), u);
  }
  if (name == "P" || name == "Partial") {
    if (!has_args || args.empty()) return Placement::Partial(ReduceOp::kSum);
    absl::string_view op = args;
    absl::ConsumePrefix(&op, "reduce_op=");
    op = absl::StripAsciiWhitespace(op);
    if (op.size() >= 2 && (op.front() == '"' || op.front() == '\'')) op = op.substr(1, op.size() - 2);
    if (op == "product") op = "prod";
    auto parsed = ParseReduceOp(op);
    if (!parsed.ok()) return BadPlacement(text, parsed.status().message());
    return Placement::Partial(*parsed);
  }
  if (name == "_S" || name == "_StridedShard") {
    if (!has_args) return BadPlacement(text, "_S needs (dim, split_factor) or (dim, [blocks])");
    const std::vector<absl::string_view> parts = SplitTopLevel(args);
    int64_t d = 0;
    if (parts.size() != 2 || !ParseInt(parts[0], &d)) {
      return BadPlacement(text, "_S needs (dim, split_factor) or (dim, [blocks])");
    }
    absl::string_view second = absl::StripAsciiWhitespace(parts[1]);
    absl::ConsumePrefix(&second, "split_factor=");
    absl::ConsumePrefix(&second, "sf=");
    second = absl::StripAsciiWhitespace(second);
    if (absl::ConsumePrefix(&second, "[")) {
      if (!absl::ConsumeSuffix(&second, "]")) return BadPlacement(text, "unclosed block list");
      std::vector<int64_t> blocks;
      for (absl::string_view b : SplitTopLevel(second)) {
        int64_t v = 0;
        if (!ParseInt(b, &v) || v < 0) {
          return BadPlacement(text, absl::StrCat("block size '", absl::StripAsciiWhitespace(b),
                                                 "' is not a non-negative integer"));
        }
        blocks.push_back(v);
      }
      return Placement::BlockShard(static_cast<int>(d), std::move(blocks));
    }
    int64_t sf = 0;
    if (!ParseInt(second, &sf) || sf < 1) {
      return BadPlacement(text, absl::StrCat("split factor '", second, "' is not a positive integer"));
    }
    return Placement::StridedShard(static_cast<int>(d), sf);
  }
  return BadPlacement(text, absl::StrCat("unknown placement '", name, "'"));
}

absl::StatusOr<Placements> ParsePlacements(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  if (absl::ConsumePrefix(&t, "[")) {
    if (!absl::ConsumeSuffix(&t, "]")) {
      return absl::InvalidArgumentError(absl::StrCat("bad placements '", text, "': unclosed '['"));
    }
  }
  Placements out;
  if (absl::StripAsciiWhitespace(t).empty()) {
    return absl::InvalidArgumentError(absl::StrCat("bad placements '", text, "': empty list"));
  }
  for (absl::string_view part : SplitTopLevel(t)) {
    DT_ASSIGN_OR_RETURN(Placement p, ParsePlacement(part));
    out.push_back(std::move(p));
  }
  return out;
}

std::string PlacementsToString(absl::Span<const Placement> placements) {
  return absl::StrCat("[",
                      absl::StrJoin(placements, ", ",
                                    [](std::string* out, const Placement& p) {
                                      absl::StrAppend(out, p.ToString());
                                    }),
                      "]");
}

std::string PlacementsToCompactString(absl::Span<const Placement> placements) {
  return absl::StrJoin(placements, ",", [](std::string* out, const Placement& p) {
    absl::StrAppend(out, p.ToString());
  });
}

Chunk ChunkOf(int64_t n, int64_t k, int64_t r) {
  if (k <= 1) return {0, n};
  const int64_t full = (n + k - 1) / k;
  const int64_t start = full * r;
  if (start >= n) return {n, 0};
  return {start, std::min(n, start + full) - start};
}

}  // namespace dt
