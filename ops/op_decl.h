#pragma once
// One declaration per DTensor op: everything the op is, in one row with designated initializers,
// written beside the op's functions in ops/decls/<family>.cc and gathered in OpId order (the list
// DT_DTENSOR_OPS in ops/strategy.h) by ops/op_decls.cc.
//
//   field        what it is
//   name         the op's name in messages ("Linear"); a call may carry a more specific one ("Add")
//   input_names  {"x", "w", "bias"}; a variable number of inputs (Cat) is {"tensors"}
//   attrs        which typed attribute struct it takes (ops/op_attrs.h), checked on every call
//   infer        validates the call on global shapes and dtypes; the outputs' shapes and dtypes
//   candidates   its sharding rule: candidate placements for one mesh dim (ops/strategy.h)
//   check        optional: whether a complete strategy is exact on every rank
//   precheck     optional: errors no strategy may silently fix (GQA-inconsistent head shards)
//   run          the local kernel on this rank's pieces (LocalArgs), usually one ops:: call
//   cuda         "kernel" when ops/local has a CUDA kernel for it, else why it needs none
//
// The dispatcher (ops/dispatch.h) combines the candidates over mesh dims and picks the cheapest;
// Apply (ops/dtensor_ops.cc) runs `run` on the result. Adding an op: docs/ops.md, "Adding an op".

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dtensor/core/tensor.h"
#include "dtensor/ops/op_attrs.h"
#include "dtensor/ops/strategy.h"

namespace dt::ops::internal {

class Prepared;
using LocalOutputs = absl::InlinedVector<Tensor, 2>;

// What a declaration's `run` sees: this rank's pieces of the inputs and where they sit in the
// global tensors (from Prepared), or whole local tensors (no mesh: offsets 0, nothing sharded).
class LocalArgs {
 public:
  explicit LocalArgs(const Prepared& p) : prepared_(&p) {}
  explicit LocalArgs(absl::Span<const Tensor* const> locals) : locals_(locals) {}

  bool has(int j) const;
  const Tensor& local(int j) const;
  // The global shape of input j.
  const Shape& global_shape(int j) const;
  // True when some mesh dim (of size > 1) splits input j along `dim`.
  bool Sharded(int j, int dim) const;
  // This rank's first global index of input j along `dim` (0 when the dim is whole).
  int64_t OffsetAlong(int j, int dim) const;
  // True for a DTensor call (pieces of a mesh), false for whole local tensors.
  bool distributed() const { return prepared_ != nullptr; }
  // The shape of this rank's piece of output k (distributed calls only).
  Shape OutLocalShape(int k) const;
  // See Prepared::TermIncludes; always true for local tensors.
  bool TermIncludes(int j, int k) const;

 private:
  const Prepared* prepared_ = nullptr;
  absl::Span<const Tensor* const> locals_;
};

struct OpDecl {
  OpId op;
  const char* name = nullptr;
  std::vector<const char*> input_names;
  size_t attrs = 0;  // the index of the op's alternative in Attrs
  absl::StatusOr<OutputMetas> (*infer)(const OpCall& call) = nullptr;
  void (*candidates)(const OpCall& call, const OutputMetas& outs, int mesh_dim,
                     DimOptions* options) = nullptr;
  absl::Status (*check)(const OpCall& call, const OutputMetas& outs, const Strategy& s) = nullptr;
  absl::Status (*precheck)(const OpCall& call) = nullptr;
  absl::StatusOr<LocalOutputs> (*run)(const OpCall& call, const LocalArgs& args) = nullptr;
  const char* cuda = nullptr;
};

// The declaration of `op` (every OpId has one), and all of them in OpId order.
const OpDecl& DeclOf(OpId op);
absl::Span<const OpDecl* const> AllOps();

// The op's name in messages: call.name, else the declaration's.
const char* OpName(const OpCall& call);
// "x", "w", "tensors[2]": input j's name in messages.
std::string InputName(const OpCall& call, int j);
// "x [S(0)], w [S(1)] on mesh(tp=4)": the inputs' placements for messages.
std::string DescribeInputs(const OpCall& call);

}  // namespace dt::ops::internal
