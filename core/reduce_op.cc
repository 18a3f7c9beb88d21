#include "dtensor/core/reduce_op.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "dtensor/core/name_table.h"

namespace dt {

namespace {

constexpr std::pair<const char*, ReduceOp> kReduceOpNames[] = {
    {"sum", ReduceOp::kSum}, {"avg", ReduceOp::kAvg}, {"min", ReduceOp::kMin},
    {"max", ReduceOp::kMax}, {"prod", ReduceOp::kProd}};

}  // namespace

absl::string_view ReduceOpName(ReduceOp op) { return NameIn(kReduceOpNames, op); }

absl::StatusOr<ReduceOp> ParseReduceOp(absl::string_view name) {
  if (std::optional<ReduceOp> op = ValueIn(kReduceOpNames, name)) return *op;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown reduce op '", name, "': expected sum, avg, min, max or prod"));
}

}  // namespace dt
