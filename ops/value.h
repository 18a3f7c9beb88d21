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
//
// Note [Local pieces remember their layout]
// A style that hands on this rank's piece of a sharded output (colwise: S(-1); sequence_parallel:
// S(1)) as a local tensor hands on a piece: a local value that also knows the global tensor it
// is a piece of and the layer that made it (Piece, piece_of, source). A piece is what that
// DTensor is, with one difference: it mixes with plain local values, which count as replicated.
// So its shape() is the global one, and
//   - ops on pieces run the op's sharding rules (ops/value_ops.h): an op that needs the whole dim
//     (a norm, softmax or reduction over the sharded dim, a matmul contracting it, attention
//     whose query heads are split and key heads not) gets it gathered, sliced or reduced as a
//     DTensor op would, never a silently partial answer; split sizes and reshapes are global,
//     so a forward written with shape() and -1 (the same on every rank) computes the same;
//   - the root module of a forward gathers a piece it returns (with a warning naming the layer:
//     lm_head planned 'colwise' instead of 'colwise_gather_output'), and CausalLM::Logits does
//     the same, so an argmax over the vocab never sees a slice of it;
//   - a rowwise layer takes a piece with its exact global layout.
// Modules written for local pieces (nn::Attention, SwiGLUMLP, MLP, Flux2's blocks), whose plans
// their ValidateTensorParallel checks, take the plain pieces (PlainLocal) and compute as before.

#include <string>
#include <vector>

#include "dtensor/core/dtype.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/tensor.h"
#include "dtensor/dtensor/dtensor.h"

namespace dt {

class Value {
 public:
  Value() = default;
  Value(DTensor d) : dtensor_(std::move(d)) {}  // NOLINT: implicit by design
  Value(Tensor t) : local_(std::move(t)) {}     // NOLINT: implicit by design
  // A local value that is this rank's piece of `whole`, made by the layer `source` (Note [Local
  // pieces remember their layout]); a replicated `whole` gives a plain local value.
  static Value Piece(DTensor whole, std::string source);

  bool defined() const { return dtensor_.defined() || local_.defined(); }
  bool is_dtensor() const { return dtensor_.defined() && !local_.defined(); }
  bool is_local() const { return local_.defined(); }

  // The DTensor (is_dtensor() only).
  const DTensor& dtensor() const;
  // The plain tensor, or a DTensor's local piece.
  const Tensor& local() const { return is_dtensor() ? dtensor_.ToLocal() : local_; }
  // Global shape of a DTensor or a piece (what ops on it see), shape of a plain local tensor.
  const Shape& shape() const { return dtensor_.defined() ? dtensor_.shape() : local_.shape(); }
  int dim() const { return static_cast<int>(shape().size()); }
  DType dtype() const { return dtensor_.defined() ? dtensor_.dtype() : local_.dtype(); }

  // A piece's global tensor (this rank's piece is local()); nullptr for every other value.
  const DTensor* piece_of() const { return is_local() && dtensor_.defined() ? &dtensor_ : nullptr; }
  // The layer that made a piece, its path from the root ("" for the root itself and for values
  // that are not pieces).
  const std::string& source() const { return source_; }

  // "DTensor(f32[4, 8] [S(1)] on mesh(tp=2), ...)", "local f32[4, 4] cpu", "undefined"; a piece:
  // "local f32[1, 7, 96] cpu, this rank's piece of f32[1, 7, 384] [S(2)] from 'lm_head'".
  std::string Describe() const;

 private:
  DTensor dtensor_;  // a DTensor value, or a piece's global tensor
  Tensor local_;
  std::string source_;
};

using Values = std::vector<Value>;

// The whole tensor `v` stands for, on every rank: a DTensor's or a piece's gathered (collective
// over its mesh), a plain local tensor as it is.
absl::StatusOr<Tensor> WholeTensor(const Value& v);

// `v` with a piece's layout dropped: its local tensor as a plain local value (anything else
// unchanged). For modules and styles that compute on this rank's pieces knowingly (Note [Local
// pieces remember their layout]).
Value PlainLocal(const Value& v);

}  // namespace dt
