#pragma once
// Value: what flows between modules — a DTensor (a global tensor with its layout) or a plain local
// Tensor (this rank's piece with no layout attached, PyTorch's `use_local_output=True`).
//
//   kind        shape()          produced by
//   DTensor     global shape     DTensor ops, styles with use_local_output = false
//   local       local shape      ops on local tensors, styles with use_local_output = true
//   undefined   -                an absent optional input (Value())
//
// Styles annotate a local input with the layout they declare (DTensor::FromLocal) before they
// redistribute it, exactly as transformers' hooks do; see Note [Local values] in nn/module.h for
// how a module runs when it receives local values.

#include <string>
#include <vector>

#include "dtensor/core/dtype.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/tensor.h"
#include "dtensor/dtensor/dtensor.h"

namespace dt::nn {

class Value {
 public:
  Value() = default;
  Value(DTensor d) : dtensor_(std::move(d)) {}  // NOLINT: implicit by design
  Value(Tensor t) : local_(std::move(t)) {}     // NOLINT: implicit by design

  bool defined() const { return dtensor_.defined() || local_.defined(); }
  bool is_dtensor() const { return dtensor_.defined(); }
  bool is_local() const { return local_.defined(); }

  // The DTensor (is_dtensor() only).
  const DTensor& dtensor() const;
  // The plain tensor, or a DTensor's local piece.
  const Tensor& local() const { return is_dtensor() ? dtensor_.ToLocal() : local_; }
  // Global shape of a DTensor, shape of a local tensor.
  const Shape& shape() const { return is_dtensor() ? dtensor_.shape() : local_.shape(); }
  int dim() const { return static_cast<int>(shape().size()); }
  DType dtype() const { return is_dtensor() ? dtensor_.dtype() : local_.dtype(); }

  // "DTensor(f32[4, 8] [S(1)] on mesh(tp=2), ...)", "local f32[4, 4] cpu", "undefined".
  std::string Describe() const;

 private:
  DTensor dtensor_;
  Tensor local_;
};

using Values = std::vector<Value>;

}  // namespace dt::nn
