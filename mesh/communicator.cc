#include "dtensor/mesh/communicator.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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

namespace {
class DoneWork final : public Work {
 public:
  explicit DoneWork(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait() override { return status_; }

 private:
  absl::Status status_;
};
}  // namespace

std::shared_ptr<Work> Work::Done(absl::Status status) {
  return std::make_shared<DoneWork>(std::move(status));
}

std::string Communicator::Describe() const {
  return absl::StrCat(backend(), " group [", absl::StrJoin(global_ranks(), ", "), "]");
}

}  // namespace dt
