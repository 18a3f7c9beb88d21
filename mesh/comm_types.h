#pragma once
// The types a Communicator (mesh/communicator.h), its collectives (mesh/collective.h) and the Work
// handles of its backends (mesh/work.h) share, below all of them (Note [Include graph]).

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "dtensor/core/tensor.h"

namespace dt {

// Handle of an asynchronous collective.
class Work {
 public:
  virtual ~Work() = default;
  virtual absl::Status Wait() = 0;
  // A Work that is already finished with `status`.
  static std::shared_ptr<Work> Done(absl::Status status = absl::OkStatus());
};
using WorkPtr = std::shared_ptr<Work>;

// What AllToAllViews exchanges with one peer: the elements of these tensors (any strides), each
// view in row-major order, one view after another. See Note [All-to-all over views] in
// mesh/collective.h.
using TensorViews = std::vector<Tensor>;

}  // namespace dt
