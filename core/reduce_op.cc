#include "dtensor/core/reduce_op.h"

#include "absl/strings/str_cat.h"

namespace dt {

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProd: return "prod";
  }
  return "?";
}

absl::StatusOr<ReduceOp> ParseReduceOp(absl::string_view name) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProd}) {
    if (name == ReduceOpName(op)) return op;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown reduce op '", name, "': expected sum, avg, min, max or prod"));
}

}  // namespace dt
