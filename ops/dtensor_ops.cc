#include "dtensor/ops/dtensor_ops.h"

#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/core/status.h"
#include "dtensor/ops/dispatch.h"
#include "dtensor/ops/op_calls.h"

// Every op here is its builder (ops/op_calls.h) applied to the DTensors' specs, then
// internal::Apply (ops/dispatch.h).

namespace dt::ops {
namespace {

using internal::OpCall;
using internal::Outputs;
using Inputs = std::initializer_list<const DTensor*>;

absl::StatusOr<Outputs> ApplyAll(const absl::StatusOr<OpCall>& call, Inputs inputs) {
  if (!call.ok()) return call.status();
  return internal::Apply(*call, absl::MakeConstSpan(inputs.begin(), inputs.size()));
}

const DTensorSpec* S(const DTensor& x) { return x.defined() ? &x.spec() : nullptr; }
const DTensor* Opt(const DTensor& x) { return x.defined() ? &x : nullptr; }

}  // namespace

// ---- the rows of DT_OPS, DT_DECLARED_OPS and DT_LAYOUT_OPS --------------------------------------

// Name(params) { return the outputs of Apply(builder(the tensors' specs), the tensors); }
#define DT_DTENSOR_PARAM_In(n) , const DTensor& n
#define DT_DTENSOR_PARAM_Opt(n) , const DTensor& n
#define DT_DTENSOR_PARAM_Attr(type, n, ...) , type n
#define DT_DTENSOR_SPEC_In(n) , S(n)
#define DT_DTENSOR_SPEC_Opt(n) , S(n)
#define DT_DTENSOR_SPEC_Attr(type, n, ...)
#define DT_DTENSOR_INPUT_In(n) , &n
#define DT_DTENSOR_INPUT_Opt(n) , Opt(n)
#define DT_DTENSOR_INPUT_Attr(type, n, ...)
#define DT_DTENSOR_OP_(name, params, call, ...)                                                  \
  absl::StatusOr<DT_ROW_RESULT(DTensor, __VA_ARGS__)> name(                                      \
      DT_ROW_LIST(DT_DTENSOR_PARAM_, params)) {                                                  \
    return internal::OutputsAs<DT_ROW_RESULT(DTensor, __VA_ARGS__)>(                             \
        ApplyAll(DT_ROW_BUILDER(params, call)(DT_ROW_LIST(DT_DTENSOR_SPEC_, params)),            \
                 {DT_ROW_LIST(DT_DTENSOR_INPUT_, params)}));                                     \
  }
#define DT_DTENSOR_DECLARED_OP_(name, params) \
  DT_DTENSOR_OP_(name, params, name(DT_ROW_LIST(DT_DTENSOR_NAME_, params)))
#define DT_DTENSOR_NAME_In(n) , n
#define DT_DTENSOR_NAME_Opt(n) , n
#define DT_DTENSOR_NAME_Attr(type, n, ...) , n
DT_OPS(DT_DTENSOR_OP_)
DT_DECLARED_OPS(DT_DTENSOR_DECLARED_OP_)
DT_LAYOUT_OPS(DT_DTENSOR_OP_)

// ---- Cat -----------------------------------------------------------------------------------------

absl::StatusOr<DTensor> Cat(absl::Span<const DTensor> tensors, int64_t dim) {
  std::vector<const DTensorSpec*> specs;
  std::vector<const DTensor*> ptrs;
  for (const DTensor& t : tensors) {
    specs.push_back(S(t));
    ptrs.push_back(&t);
  }
  DT_ASSIGN_OR_RETURN(const OpCall call, internal::calls::Cat(specs, dim));
  DT_ASSIGN_OR_RETURN(Outputs outs, internal::Apply(call, ptrs));
  return std::move(outs[0]);
}

}  // namespace dt::ops
