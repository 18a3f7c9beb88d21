// The table of op declarations (ops/op_decl.h), gathered in OpId order from ops/decls/<family>.cc,
// and the helpers those files share (ops/decls/rules.h).

#include "absl/strings/str_join.h"
#include "dtensor/ops/decls/rules.h"

namespace dt::ops::internal {
namespace rules {

std::string Arg(const OpCall& call, int j) {
  const DTensorSpec& s = *call.inputs[j];
  return absl::StrCat(InputName(call, j), " ", DTypeName(s.dtype()), ShapeToString(s.shape()));
}

absl::Status Bad(const OpCall& call, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(OpName(call), ": ", what));
}

absl::Status NeedFloat(const OpCall& call, int j) {
  if (IsFloating(In(call, j).dtype())) return absl::OkStatus();
  return Bad(call, absl::StrCat(Arg(call, j), ": expected a floating dtype (f32, bf16, f16)"));
}

absl::Status NeedNotBool(const OpCall& call, int j) {
  if (In(call, j).dtype() != DType::kBool) return absl::OkStatus();
  return Bad(call, absl::StrCat(Arg(call, j), ": bool is not supported"));
}

absl::Status NeedSameDType(const OpCall& call, int a, int b) {
  if (In(call, a).dtype() == In(call, b).dtype()) return absl::OkStatus();
  return Bad(call, absl::StrCat(Arg(call, a), " and ", Arg(call, b),
                                ": dtypes differ (cast first with Cast)"));
}

OutputMetas One(Shape shape, DType dtype) {
  OutputMetas m;
  m.push_back({std::move(shape), dtype});
  return m;
}

void AddPartialOf(const OpCall& call, int j, int i, int n_out, ReduceOp out_op,
                  DimOptions* options) {
  DimOption o = ReplicateOption(call.num_inputs(), n_out);
  o.in[j] = call.inputs[j]->placements()[i];
  for (auto& p : o.out) p = Placement::Partial(out_op);
  options->push_back(std::move(o));
}

void AddLinearPartial(const OpCall& call, int j, int i, int n_out, DimOptions* options) {
  const auto op = PartialOf(call, j, i);
  if (op && IsSumLike(*op)) AddPartialOf(call, j, i, n_out, *op, options);
}

void AddAnyPartial(const OpCall& call, int i, int n_out, DimOptions* options) {
  const auto op = PartialOf(call, 0, i);
  if (!op) return;
  DimOption o = ReplicateOption(call.num_inputs(), n_out);
  for (int j = 0; j < call.num_inputs(); ++j) {
    if (Has(call, j)) o.in[j] = Placement::Partial(*op);
  }
  for (auto& p : o.out) p = Placement::Partial(*op);
  options->push_back(std::move(o));
}

void AddElementwiseOptions(const OpCall& call, const OutputMetas& outs, int i, DimOptions* options,
                           std::initializer_list<int> whole) {
  const int n_out = static_cast<int>(outs.size());
  options->push_back(ReplicateOption(call.num_inputs(), n_out));
  AddShardOptions(call,
                  BroadcastLabels(call, outs[0].shape, n_out,
                                  absl::MakeConstSpan(whole.begin(), whole.size())),
                  i, options);
}

void AddMoveOptions(const OpCall& call, LabelMap m, int i, DimOptions* options) {
  options->push_back(ReplicateOption(1, 1));
  AddShardOptions(call, m, i, options);
  AddAnyPartial(call, i, 1, options);
}

absl::Status NeedFloatOrNotBool(const OpCall& call, int j, bool float_only) {
  return float_only ? NeedFloat(call, j) : NeedNotBool(call, j);
}

ReduceOp Swapped(ReduceOp op) {
  if (op == ReduceOp::kMax) return ReduceOp::kMin;
  if (op == ReduceOp::kMin) return ReduceOp::kMax;
  return op;
}

LocalOutputs Out(Tensor t) {
  LocalOutputs o;
  o.push_back(std::move(t));
  return o;
}

absl::StatusOr<LocalOutputs> Out(absl::StatusOr<Tensor> t) {
  if (!t.ok()) return t.status();
  return Out(*std::move(t));
}

}  // namespace rules

namespace {

// The rows' addresses in OpId order: constant-initialized, so no guard on the dispatch path.
#define DT_OP_DECL_ROW_(name) &rules::k##name##Decl,
constexpr const OpDecl* kDecls[] = {DT_DTENSOR_OPS(DT_OP_DECL_ROW_)};
#undef DT_OP_DECL_ROW_

}  // namespace

absl::Span<const OpDecl* const> AllOps() { return kDecls; }

const OpDecl& DeclOf(OpId op) {
  const OpDecl& d = *kDecls[static_cast<int>(op)];
  DT_CHECK(d.op == op, "declaration table out of order at ", static_cast<int>(op));
  return d;
}

const char* OpName(const OpCall& call) {
  return call.name != nullptr ? call.name : DeclOf(call.op).name;
}

std::string InputName(const OpCall& call, int j) {
  const OpDecl& rule = DeclOf(call.op);
  if (call.op == OpId::kCat) return absl::StrCat("tensors[", j, "]");
  return j < static_cast<int>(rule.input_names.size()) ? rule.input_names[j] : absl::StrCat("#", j);
}

std::string DescribeInputs(const OpCall& call) {
  std::vector<std::string> parts;
  for (int j = 0; j < call.num_inputs(); ++j) {
    if (!rules::Has(call, j)) continue;
    parts.push_back(absl::StrCat(InputName(call, j), " ",
                                 PlacementsToString(rules::In(call, j).placements())));
  }
  return absl::StrCat(absl::StrJoin(parts, ", "), " on ", call.first().mesh().ToString());
}

}  // namespace dt::ops::internal
