#include "dtensor/mesh/communicator.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dt {

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
