#include "dtensor/nn/styles.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"
#include "dtensor/nn/linear.h"

namespace dt::nn {
namespace {

// "R" when the declared input layout is the one the forward needs, else "R -> S(-1)".
std::string InputText(const Placement& declared, const Placement& needed) {
  if (declared == needed) return declared.ToString();
  return absl::StrCat(declared.ToString(), " -> ", needed.ToString());
}

bool IsEmbedding(const Module& m) { return dynamic_cast<const Embedding*>(&m) != nullptr; }

// The module's weight; InvalidArgument naming the module when it has none.
absl::StatusOr<const Parameter*> WeightOf(const Module& m, absl::string_view style) {
  const Parameter* w = m.FindParameter("weight");
  if (w == nullptr || w->dim() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(style, " on '", m.FullName(), "': the module (", m.type_name(),
                     ") has no weight of 2 or more dims to derive the input layout from"));
  }
  return w;
}

// A rowwise layer fed a local tensor expects this rank's slice of its input features, which its
// placed weight's local columns give. The usual cause of anything else is a producer that did
// not shard its output (a missing or misspelled colwise rule before it): say so, rather than
// leaving FromLocal to report a shape mismatch that names no layer.
absl::Status CheckLocalSlice(const Module& m, const Parameter& w, const Value& x) {
  if (!w.placed() || x.dim() < 1) return absl::OkStatus();
  const int64_t want = w.spec().LocalShape().back(), got = x.shape().back();
  const int64_t in = w.shape().back();
  if (want == got) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "rowwise on '", m.FullName(), "' expects this rank's slice of its ", in,
      " input features (", want, " here, weight ", w.Describe(), ") but got ",
      x.Describe(),
      got == in ? ": the whole feature dim. Is the layer that produces it sharded colwise? Check "
                  "that its plan rule exists and that the key is spelled right"
                : ""));
}

// `p` (a plain shard of the last dim) in the units the module's placed weight is split in along
// `dim` (Note [Uneven heads]): what a local piece of an uneven colwise output or rowwise input is.
Placement InWeightUnits(const Placement& p, const Module& m, int dim) {
  const Parameter* w = m.FindParameter("weight");
  if (!p.is_shard() || p.unit() != 1 || w == nullptr || !w->placed()) return p;
  for (const Placement& q : w->spec().placements()) {
    if (q.is_shard() && q.dim() == dim && q.unit() != 1) return Placement::Shard(p.dim(), q.unit());
  }
  return p;
}

// The units a module declares along the split dim of `param` (Module::ShardUnit), or an error
// naming the module and the style.
absl::StatusOr<int64_t> DeclaredUnit(absl::string_view style, const Module& module,
                                     const Parameter& param, int dim, bool col) {
  const int64_t unit = module.ShardUnit(param, col), n = param.shape()[dim];
  if (unit <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        style, " on '", module.FullName(), "': ", module.type_name(),
        " declares no unit to keep whole (attention heads); a Linear declares it with set_",
        col ? "col" : "row", "_unit(head_dim), as nn::Attention does for its projections"));
  }
  if (n % unit != 0) {
    return absl::InvalidArgumentError(absl::StrCat(style, " on '", module.FullName(),
                                                   "': parameter '", param.FullName(), "' (",
                                                   param.Describe(), ") has ", n,
                                                   col ? " rows" : " columns",
                                                   ", not a whole number of units of ", unit));
  }
  return unit;
}

absl::Status NeedInput(const Module& m, const Values& inputs, absl::string_view style,
                       int min_dim = 0) {
  if (inputs.empty() || !inputs[0].defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(style, " on '", m.FullName(), "': the module was called without an input"));
  }
  if (inputs[0].dim() < min_dim) {
    return absl::InvalidArgumentError(absl::StrCat(style, " on '", m.FullName(),
                                                   "': the input needs at least ", min_dim,
                                                   " dims, got ", inputs[0].Describe()));
  }
  return absl::OkStatus();
}

// The first input replicated (a local one is first taken as laid out by `declared`): what the
// styles whose forward needs the whole input start with.
absl::StatusOr<DTensor> ReplicatedInput(const Module& m, const Values& inputs,
                                        const DeviceMesh& mesh, const Placement& declared,
                                        absl::string_view style) {
  DT_RETURN_IF_ERROR(NeedInput(m, inputs, style));
  DT_ASSIGN_OR_RETURN(DTensor x, AsDTensor(inputs[0], mesh, declared));
  return RedistributeTo(x, Placement::Replicate());
}

// ---- packed blocks (Note [Packed blocks]) ------------------------------------------------------

struct PackedLayout {
  std::vector<int64_t> sizes;  // absolute block sizes, each > 0, summing to the packed dim
};

std::string BlocksText(const std::vector<int64_t>& b) {
  return absl::StrCat("[", absl::StrJoin(b, ", "), "]");
}

// Note [Packed blocks must be declared]
// transformers' packed styles cut a weight into two equal halves whatever it holds, which is right
// for gate|up and silently wrong for a three-block q|k|v (each rank then gets the wrong rows and
// the logits stay plausible). Here the blocks must come from the plan (proportions) or from the
// module (Module::PackedBlocks: Linear's set_packed_*_blocks); with neither, the style refuses the
// parameter before any weight is read and says how to declare them.
absl::Status MissingBlocks(absl::string_view style, const Module& m, const Parameter& p, bool col,
                           int64_t n) {
  const bool linear = dynamic_cast<const Linear*>(&m) != nullptr;
  const std::string name = m.name().empty() ? std::string("layer") : m.name();
  const std::string declare =
      linear ? absl::StrCat("`", name, ".set_packed_", col ? "col" : "row", "_blocks({...})` (",
                            "absolute sizes summing to ", n, "; diffusers' _tp_packed_",
                            col ? "col" : "row", "_blocks)")
             : absl::StrCat("an override of ", m.type_name(), "::PackedBlocks for '", p.name(),
                            "'");
  return absl::InvalidArgumentError(absl::StrCat(
      style, " on '", m.FullName(), "': parameter '", p.FullName(), "' (", p.Describe(),
      ") has no declared packed blocks, so its ", n, col ? " rows" : " columns",
      " cannot be cut block by block (two equal halves would silently mix the projections of a "
      "three-block q|k|v). Declare them in the model with ",
      declare, ", or in the plan with std::make_shared<", col ? "PackedColwise" : "PackedRowwise",
      "Parallel>(std::vector<int64_t>{1, 1, 1}) (proportions; {1, 1} for a gate|up pair)"));
}

absl::StatusOr<PackedLayout> ResolvePacked(absl::string_view style,
                                           const std::vector<int64_t>& proportions, const Module& m,
                                           const Parameter& p, bool col, int64_t n) {
  PackedLayout layout;
  if (!proportions.empty()) {
    int64_t total = 0;
    for (int64_t b : proportions) {
      if (b <= 0) {
        return absl::InvalidArgumentError(absl::StrCat("packed blocks ", BlocksText(proportions),
                                                       " for '", m.FullName(),
                                                       "': every block must be positive"));
      }
      total += b;
    }
    if (n % total != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Cannot split ", n, " into proportional blocks ", BlocksText(proportions),
                       ": sum(", BlocksText(proportions), ")=", total, " does not divide ", n,
                       " (layer '", m.FullName(), "')."));
    }
    for (int64_t b : proportions) layout.sizes.push_back(b * (n / total));
    return layout;
  }
  const std::vector<int64_t> stored = m.PackedBlocks(p, col);
  if (stored.empty()) return MissingBlocks(style, m, p, col, n);
  const char* what = col ? "packed_col_blocks " : "packed_row_blocks ";
  const int64_t total = std::accumulate(stored.begin(), stored.end(), int64_t{0});
  if (total != n) {
    return absl::InvalidArgumentError(absl::StrCat(m.type_name(), " '", m.FullName(), "': ", what,
                                                   BlocksText(stored), " sum to ", total,
                                                   " but the packed dim has ", n,
                                                   col ? " rows" : " columns"));
  }
  for (int64_t b : stored) {
    if (b <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(m.type_name(), " '", m.FullName(), "': ",
                                                     what, BlocksText(stored),
                                                     " must all be positive"));
    }
  }
  layout.sizes = stored;
  return layout;
}

Placement PackedPlacement(const PackedLayout& layout, int dim) {
  return Placement::BlockShard(dim, layout.sizes);
}

absl::Status CheckBlocksDivisible(absl::string_view style, const Parameter& param,
                                  const PackedLayout& layout, int64_t tp) {
  const std::vector<int64_t>& sizes = layout.sizes;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] % tp != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          style, " '", param.FullName(), "': packed block ", i, " of ", BlocksText(sizes),
          " has size ", sizes[i], ", not divisible by the tensor parallel size ", tp,
          " (every packed block must be divisible on its own)"));
    }
  }
  return absl::OkStatus();
}

// A parameter's packed dim (ndim-2 colwise / ndim-1 rowwise for weights, 0 for 1-D params), its
// size and its blocks.
struct PackedParam {
  int dim = 0;
  int64_t size = 0;
  PackedLayout layout;
};

absl::StatusOr<PackedParam> ResolvePackedParam(absl::string_view style,
                                               const std::vector<int64_t>& proportions,
                                               const Module& m, const Parameter& p, bool col) {
  PackedParam out;
  if (p.dim() >= 2) out.dim = col ? p.dim() - 2 : p.dim() - 1;
  out.size = p.shape()[out.dim];
  DT_ASSIGN_OR_RETURN(out.layout, ResolvePacked(style, proportions, m, p, col, out.size));
  return out;
}

// Note [Plain styles on packed layers]
// A module that declares packed blocks for a parameter (Module::PackedBlocks) holds several
// projections side by side; colwise / rowwise cut it into contiguous slices across the block
// boundaries, so rank 0 of a q|k|v gets all of q and part of k. That is only right when the
// cut dim is gathered again right away (colwise_gather_output; rowwise_split_input, whose input
// is sliced the same way), so colwise with a sharded output and rowwise with a sharded input
// refuse it and name the packed style to use.
absl::Status RefusePackedLayer(absl::string_view style, absl::string_view packed_style,
                               const Module& m, const Parameter& p, bool col) {
  const std::vector<int64_t> blocks = m.PackedBlocks(p, col);
  if (blocks.size() < 2) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      style, " on '", m.FullName(), "': ", m.type_name(), " '", m.FullName(), "' declares packed ",
      col ? "output" : "input", " blocks ", BlocksText(blocks), " (set_packed_", col ? "col" : "row",
      "_blocks), and ", style, " would cut parameter '", p.FullName(), "' (", p.Describe(),
      ") into contiguous slices across the block boundaries; plan it as '", packed_style,
      "', which gives every rank its slice of each block"));
}

}  // namespace

// ---- colwise ------------------------------------------------------------------------------------

absl::StatusOr<Placement> LayoutParallel::Split(const Module& module, const Parameter& param,
                                                int dim, bool col) const {
  if (!whole_units_) return Placement::Shard(dim);
  DT_ASSIGN_OR_RETURN(const int64_t unit, DeclaredUnit(col ? "uneven_colwise" : "uneven_rowwise",
                                                       module, param, dim, col));
  return Placement::Shard(dim, unit);
}

StyleInfo ColwiseParallel::Info() const {
  const bool gathers = output_layout_.is_replicate();
  if (whole_units_) {
    return {"S(0,unit=u)", "S(0,unit=u)", InputText(input_layout_, Placement::Replicate()),
            absl::StrCat("S(-1,unit=u)", gathers ? " -> R" : "",
                         use_local_output_ ? " local" : ""),
            gathers ? "all_gather" : "none"};
  }
  return {"S(0) (Embedding: S(1))", "S(0)", InputText(input_layout_, Placement::Replicate()),
          absl::StrCat("S(-1)", gathers ? " -> R" : "", use_local_output_ ? " local" : ""),
          gathers ? "all_gather" : "none"};
}

absl::Status ColwiseParallel::ValidateParam(const Module& module, const Parameter& param,
                                            const DeviceMesh& mesh) const {
  if (whole_units_) return ParamPlacement(module, param).status();
  if (!output_layout_.is_replicate()) {  // Note [Plain styles on packed layers]
    return RefusePackedLayer("colwise", "packed_colwise", module, param, /*col=*/true);
  }
  if (param.dim() < 2) return absl::OkStatus();
  const int dim = IsEmbedding(module) ? 1 : param.dim() - 2;
  const int64_t n = param.shape()[dim], tp = mesh.Size();
  if (n % tp == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("The output size of `", module.FullName(), "` (", n,
                   ") must be divisible by the tensor parallel size (", tp,
                   ") when gathering a colwise output."));
}

absl::StatusOr<Placement> ColwiseParallel::ParamPlacement(const Module& module,
                                                          const Parameter& param) const {
  if (param.dim() == 0) return Placement::Replicate();
  if (IsEmbedding(module)) return Placement::Shard(1);
  return Split(module, param, std::max(param.dim() - 2, 0), /*col=*/true);
}

absl::StatusOr<Values> ColwiseParallel::TransformInputsPreForward(Module& module, Values inputs,
                                                                  const DeviceMesh& mesh) const {
  DT_ASSIGN_OR_RETURN(inputs[0], ReplicatedInput(module, inputs, mesh, input_layout_, "colwise"));
  return inputs;
}

absl::StatusOr<Values> ColwiseParallel::TransformOutputPostForward(Module& module, Values outputs,
                                                                   const DeviceMesh& mesh) const {
  if (outputs.empty() || !outputs[0].defined()) return outputs;
  std::optional<Shape> global;
  if (outputs[0].is_local()) {  // a forward run in local mode: annotate the exact global shape
    global = outputs[0].shape();
    const Parameter* w = module.FindParameter("weight");
    if (w != nullptr && w->dim() >= 2) {
      global->back() = IsEmbedding(module) ? w->shape()[1] : w->shape()[w->dim() - 2];
    }
  }
  const Placement sharded = InWeightUnits(Placement::Shard(-1), module, 0);
  DT_ASSIGN_OR_RETURN(DTensor y, AsDTensor(outputs[0], mesh, sharded, global));
  DT_ASSIGN_OR_RETURN(y, RedistributeTo(y, InWeightUnits(output_layout_, module, 0)));
  outputs[0] = Handoff(std::move(y), use_local_output_, module);
  return outputs;
}

// ---- rowwise ------------------------------------------------------------------------------------

StyleInfo RowwiseParallel::Info() const {
  const std::string collective = output_layout_.is_replicate()
                                     ? "all_reduce"
                                     : (output_layout_.is_any_shard() ? "reduce_scatter" : "none");
  if (whole_units_) {
    return {"S(1,unit=u)", "R",
            input_layout_.is_replicate() ? "R -> S(-1,unit=u)" : "S(-1,unit=u)",
            absl::StrCat("P(sum) -> ", output_layout_.ToString(),
                         use_local_output_ ? " local" : ""),
            collective};
  }
  return {"S(1) (Embedding: S(0))", "R", InputText(input_layout_, Placement::Shard(-1)),
          absl::StrCat("P(sum) -> ", output_layout_.ToString(), use_local_output_ ? " local" : ""),
          collective};
}

absl::Status RowwiseParallel::ValidateParam(const Module& module, const Parameter& param,
                                            const DeviceMesh&) const {
  if (whole_units_) return ParamPlacement(module, param).status();
  if (input_layout_.is_replicate() || param.dim() < 2) return absl::OkStatus();
  return RefusePackedLayer("rowwise", "packed_rowwise", module, param, /*col=*/false);
}

absl::StatusOr<Placement> RowwiseParallel::ParamPlacement(const Module& module,
                                                          const Parameter& param) const {
  if (param.dim() < 2) return Placement::Replicate();
  if (IsEmbedding(module)) return Placement::Shard(0);
  return Split(module, param, param.dim() - 1, /*col=*/false);
}

absl::StatusOr<Values> RowwiseParallel::TransformInputsPreForward(Module& module, Values inputs,
                                                                  const DeviceMesh& mesh) const {
  DT_RETURN_IF_ERROR(NeedInput(module, inputs, "rowwise", 1));
  if (IsEmbedding(module)) {  // ids stay whole: the table is split by vocab
    DT_ASSIGN_OR_RETURN(DTensor ids, AsDTensor(inputs[0], mesh, input_layout_));
    DT_ASSIGN_OR_RETURN(ids, RedistributeTo(ids, Placement::Replicate()));
    inputs[0] = std::move(ids);
    return inputs;
  }
  DT_ASSIGN_OR_RETURN(const Parameter* w, WeightOf(module, "rowwise"));
  std::optional<Shape> global;
  const int last = w->dim() - 1;
  const Placement declared =
      InWeightUnits(ResolveDim(input_layout_, inputs[0].dim()), module, last);
  if (inputs[0].is_local() && inputs[0].piece_of() == nullptr &&
      declared.is_any_shard(inputs[0].dim() - 1)) {
    global = inputs[0].shape();  // Note [Annotating local inputs]
    global->back() = w->shape().back();
    DT_RETURN_IF_ERROR(CheckLocalSlice(module, *w, inputs[0]));
  }
  DT_ASSIGN_OR_RETURN(DTensor x, AsDTensor(inputs[0], mesh, declared, global));
  DT_ASSIGN_OR_RETURN(x, RedistributeTo(x, InWeightUnits(Placement::Shard(-1), module, last)));
  inputs[0] = std::move(x);
  return inputs;
}

absl::StatusOr<Values> RowwiseParallel::TransformOutputPostForward(Module& module, Values outputs,
                                                                   const DeviceMesh& mesh) const {
  if (outputs.empty() || !outputs[0].defined()) return outputs;
  DT_ASSIGN_OR_RETURN(outputs[0],
                      ReducePartial(outputs[0], mesh, output_layout_, use_local_output_, module));
  return outputs;
}

// ---- packed -------------------------------------------------------------------------------------

absl::Status PackedParallel::ValidateParam(const Module& module, const Parameter& param,
                                           const DeviceMesh& mesh) const {
  if (param.dim() < (col_ ? 1 : 2)) return absl::OkStatus();  // rowwise: the bias stays whole
  DT_ASSIGN_OR_RETURN(PackedParam p, ResolvePackedParam(name_, blocks_, module, param, col_));
  return CheckBlocksDivisible(name_, param, p.layout, mesh.Size());
}

absl::StatusOr<Placement> PackedParallel::ParamPlacement(const Module& module,
                                                         const Parameter& param) const {
  if (param.dim() < (col_ ? 1 : 2)) return Placement::Replicate();
  DT_ASSIGN_OR_RETURN(PackedParam p, ResolvePackedParam(name_, blocks_, module, param, col_));
  return PackedPlacement(p.layout, p.dim);
}

std::string PackedParallel::WeightInfo() const {
  const int d = col_ ? 0 : 1;
  return blocks_.empty() ? absl::StrCat("_S(", d, ",[declared blocks])")
                         : absl::StrCat("_S(", d, ",", BlocksText(blocks_), " scaled)");
}

StyleInfo PackedColwiseParallel::Info() const {
  return {WeightInfo(), "as weight", "R",
          absl::StrCat("_S(-1,...)", use_local_output_ ? " local" : ""), "none"};
}

absl::StatusOr<Values> PackedColwiseParallel::TransformInputsPreForward(
    Module& module, Values inputs, const DeviceMesh& mesh) const {
  DT_ASSIGN_OR_RETURN(inputs[0], ReplicatedInput(module, inputs, mesh, Placement::Replicate(),
                                                 "packed_colwise"));
  return inputs;
}

absl::StatusOr<Values> PackedColwiseParallel::TransformOutputPostForward(
    Module& module, Values outputs, const DeviceMesh& mesh) const {
  if (outputs.empty() || !outputs[0].is_dtensor()) return outputs;
  outputs[0] = Handoff(outputs[0].dtensor(), use_local_output_, module);
  return outputs;
}

StyleInfo PackedRowwiseParallel::Info() const {
  return {WeightInfo(), "R", "_S(-1,...)",
          absl::StrCat("P(sum) -> R", use_local_output_ ? " local" : ""), "all_reduce"};
}

absl::StatusOr<Values> PackedRowwiseParallel::TransformInputsPreForward(
    Module& module, Values inputs, const DeviceMesh& mesh) const {
  DT_RETURN_IF_ERROR(NeedInput(module, inputs, "packed_rowwise", 1));
  DT_ASSIGN_OR_RETURN(const Parameter* w, WeightOf(module, "packed_rowwise"));
  const int64_t in = w->shape().back();
  DT_ASSIGN_OR_RETURN(PackedLayout layout,
                      ResolvePacked("packed_rowwise", blocks_, module, *w, false, in));
  const Placement target = PackedPlacement(layout, inputs[0].dim() - 1);
  std::optional<Shape> global;
  if (inputs[0].is_local()) {  // Note [Annotating local inputs]
    global = inputs[0].shape();
    global->back() = in;
  }
  DT_ASSIGN_OR_RETURN(DTensor x, AsDTensor(inputs[0], mesh, target, global));
  DT_ASSIGN_OR_RETURN(x, RedistributeTo(x, target));
  inputs[0] = std::move(x);
  return inputs;
}

absl::StatusOr<Values> PackedRowwiseParallel::TransformOutputPostForward(
    Module& module, Values outputs, const DeviceMesh& mesh) const {
  if (outputs.empty() || !outputs[0].defined()) return outputs;
  DT_ASSIGN_OR_RETURN(outputs[0],
                      ReducePartial(outputs[0], mesh, Placement::Replicate(), use_local_output_,
                                    module));
  return outputs;
}

// ---- embedding ----------------------------------------------------------------------------------

EmbeddingParallel::EmbeddingParallel(int shard_dim, bool use_local_output)
    : shard_dim_(shard_dim), use_local_output_(use_local_output) {}

StyleInfo EmbeddingParallel::Info() const {
  const std::string local = use_local_output_ ? " local" : "";
  if (shard_dim_ == 0) {
    return {"S(0) (vocab)", "-", "ids R", "P(sum) -> R" + local + " (masked lookup)", "all_reduce"};
  }
  return {"S(1) (hidden)", "-", "ids R", "S(-1) -> R" + local, "all_gather"};
}

absl::Status EmbeddingParallel::ValidateParam(const Module& module, const Parameter& param,
                                              const DeviceMesh&) const {
  if (param.dim() == 2) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(shard_dim_ == 0 ? "embedding_rowwise" : "embedding_colwise", " on '",
                   module.FullName(), "': parameter '", param.FullName(), "' is ", param.Describe(),
                   "; an embedding table has 2 dims [vocab, hidden]"));
}

absl::StatusOr<Placement> EmbeddingParallel::ParamPlacement(const Module&,
                                                            const Parameter& param) const {
  if (param.dim() != 2) return Placement::Replicate();
  return Placement::Shard(shard_dim_);
}

absl::StatusOr<Values> EmbeddingParallel::TransformInputsPreForward(Module& module, Values inputs,
                                                                    const DeviceMesh& mesh) const {
  DT_ASSIGN_OR_RETURN(inputs[0],
                      ReplicatedInput(module, inputs, mesh, Placement::Replicate(), "embedding"));
  return inputs;
}

absl::StatusOr<Values> EmbeddingParallel::TransformOutputPostForward(Module& module, Values outputs,
                                                                     const DeviceMesh& mesh) const {
  if (outputs.empty() || !outputs[0].is_dtensor()) return outputs;
  DT_ASSIGN_OR_RETURN(DTensor y, RedistributeTo(outputs[0].dtensor(), Placement::Replicate()));
  outputs[0] = Handoff(std::move(y), use_local_output_, module);
  return outputs;
}

// ---- sequence parallel --------------------------------------------------------------------------

SequenceParallel::SequenceParallel(int sequence_dim, bool use_local_output)
    : sequence_dim_(sequence_dim), use_local_output_(use_local_output) {}

StyleInfo SequenceParallel::Info() const {
  const std::string s = absl::StrCat("S(", sequence_dim_, ")");
  return {"R", "R", s, absl::StrCat(s, use_local_output_ ? " local" : ""), "none"};
}

absl::StatusOr<Values> SequenceParallel::TransformInputsPreForward(Module& module, Values inputs,
                                                                   const DeviceMesh& mesh) const {
  DT_RETURN_IF_ERROR(NeedInput(module, inputs, "sequence_parallel"));
  const Placement seq = Placement::Shard(sequence_dim_);
  DT_ASSIGN_OR_RETURN(DTensor x, AsDTensor(inputs[0], mesh, seq));
  DT_ASSIGN_OR_RETURN(x, RedistributeTo(x, seq));
  inputs[0] = std::move(x);
  return inputs;
}

absl::StatusOr<Values> SequenceParallel::TransformOutputPostForward(Module& module,
                                                                    Values outputs,
                                                                    const DeviceMesh&) const {
  for (Value& v : outputs) {
    if (v.is_dtensor()) v = Handoff(v.dtensor(), use_local_output_, module);
  }
  return outputs;
}

// ---- reductions and local forwards --------------------------------------------------------------

StyleInfo AllReduceParallel::Info() const {
  return {"-", "-", "unchanged", absl::StrCat("P(sum) -> R", use_local_output_ ? " local" : ""),
          "all_reduce"};
}

absl::StatusOr<Values> AllReduceParallel::TransformOutputPostForward(Module& module,
                                                                     Values outputs,
                                                                     const DeviceMesh& mesh) const {
  for (Value& v : outputs) {
    if (!v.defined()) continue;
    DT_ASSIGN_OR_RETURN(
        v, ReducePartial(v, mesh, Placement::Replicate(), use_local_output_, module));
  }
  return outputs;
}

StyleInfo LocalParamsParallel::Info() const {
  return {"own entries", "own entries", "local pieces", "local", "none"};
}

absl::StatusOr<Values> LocalParamsParallel::TransformInputsPreForward(Module&, Values inputs,
                                                                      const DeviceMesh&) const {
  for (Value& v : inputs) v = Value(PlainLocal(v).local());
  return inputs;
}

absl::Status ReplicateParallel::InstallForward(Module&, const DeviceMesh&) const {
  return absl::OkStatus();  // the module's own forward, on whatever it is given
}

StyleInfo MoEExpertsParallel::Info() const {
  return {"own entries", "own entries", "R -> local", "P(sum) -> R local", "all_reduce"};
}

absl::StatusOr<Values> MoEExpertsParallel::TransformInputsPreForward(Module&, Values inputs,
                                                                     const DeviceMesh&) const {
  for (Value& v : inputs) {
    if (v.piece_of() != nullptr) v = *v.piece_of();  // the whole, replicated below
    if (!v.is_dtensor()) continue;
    DT_ASSIGN_OR_RETURN(DTensor r, RedistributeTo(v.dtensor(), Placement::Replicate()));
    v = Value(r.ToLocal());
  }
  return inputs;
}

absl::StatusOr<Values> MoEExpertsParallel::TransformOutputPostForward(
    Module& module, Values outputs, const DeviceMesh& mesh) const {
  bool sharded = false;
  for (const auto& p : module.parameters()) sharded = sharded || ShardedOn(*p, mesh);
  if (!sharded || outputs.empty() || !outputs[0].defined()) return outputs;
  DT_ASSIGN_OR_RETURN(outputs[0], ReducePartial(outputs[0], mesh, Placement::Replicate(),
                                                 /*use_local_output=*/true, module));
  return outputs;
}

// ---- unit styles (Note [Unit meshes]) -----------------------------------------------------------

absl::StatusOr<DeviceMesh> UnitMesh(const DeviceMesh& tp, int64_t units) {
  if (tp.ndim() != 1 || units <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("UnitMesh: needs a 1-D tensor-parallel mesh and "
                                                   "a positive number of units, got ",
                                                   tp.ToString(), " and ", units));
  }
  const int64_t t = tp.Size(), groups = std::gcd(units, t);
  std::vector<std::string> names = {tp.names().empty() ? std::string("tp") : tp.names()[0],
                                    "unit_replicate"};
  if (tp.world() == nullptr) return DeviceMesh::Abstract({groups, t / groups}, names, tp.my_rank());
  return DeviceMesh::Create(tp.world(), {groups, t / groups}, tp.ranks(), std::move(names));
}

StyleInfo UnitParallel::Info() const {
  const std::string local = use_local_output_ ? " local" : "";
  if (col_) return {"[S(0), R] unit mesh", "as weight", "R", "[S(-1), R]" + local, "none"};
  return {"[S(1), R] unit mesh", "[R, R]", "[S(-1), R]", "[P, R] -> [R, R]" + local,
          "all_reduce (unit dim)"};
}

absl::StatusOr<int64_t> UnitParallel::Units(const Module& module, const Parameter& param) const {
  const int dim = col_ ? std::max(param.dim() - 2, 0) : param.dim() - 1;
  DT_ASSIGN_OR_RETURN(const int64_t unit, DeclaredUnit(col_ ? "unit_colwise" : "unit_rowwise",
                                                       module, param, dim, col_));
  return param.shape()[dim] / unit;
}

absl::StatusOr<Placement> UnitParallel::ParamPlacement(const Module& module,
                                                       const Parameter& param) const {
  // The placement on the unit dim (ShardParam adds the replicas' R); 1-D for the plan's checks.
  if (param.dim() < (col_ ? 1 : 2)) return Placement::Replicate();  // a rowwise bias stays whole
  DT_RETURN_IF_ERROR(Units(module, param).status());
  return Placement::Shard(col_ ? std::max(param.dim() - 2, 0) : param.dim() - 1);
}

int64_t UnitParallel::ParamPieces(const Module& module, const Parameter& param, int64_t tp) const {
  if (param.dim() < (col_ ? 1 : 2)) return 1;
  absl::StatusOr<int64_t> units = Units(module, param);
  return units.ok() ? std::gcd(*units, tp) : tp;
}

absl::Status UnitParallel::ShardParam(Module& module, Parameter& param,
                                      const DeviceMesh& mesh) const {
  // Every parameter of the module on the weight's unit mesh, so that its forward runs on one mesh.
  const Parameter* w = module.FindParameter("weight");
  DT_ASSIGN_OR_RETURN(const int64_t units, Units(module, w != nullptr ? *w : param));
  DT_ASSIGN_OR_RETURN(DeviceMesh unit_mesh, UnitMesh(mesh, units));
  DT_ASSIGN_OR_RETURN(const Placement p, ParamPlacement(module, param));
  return param.Place(unit_mesh, {p, Placement::Replicate()});
}

absl::StatusOr<Values> UnitParallel::TransformInputsPreForward(Module& module, Values inputs,
                                                               const DeviceMesh&) const {
  const char* style = col_ ? "unit_colwise" : "unit_rowwise";
  DT_RETURN_IF_ERROR(NeedInput(module, inputs, style, 1));
  DT_ASSIGN_OR_RETURN(const Parameter* w, WeightOf(module, style));
  if (!w->placed() || w->spec().mesh().ndim() != 2) {
    return absl::FailedPreconditionError(absl::StrCat(style, " on '", module.FullName(),
                                                      "': its weight is not on a unit mesh (",
                                                      w->Describe(), ")"));
  }
  const DeviceMesh& unit_mesh = w->spec().mesh();
  const Placement r = Placement::Replicate();
  Value& x = inputs[0];
  const DTensor* whole = x.is_dtensor() ? &x.dtensor() : x.piece_of();
  if (col_ || whole != nullptr) {
    // The whole input on every rank (no communication when it is replicated; a plain local input
    // of unit_colwise is its declared R), then on the unit mesh.
    Tensor full = x.local();
    if (whole != nullptr) {
      DT_ASSIGN_OR_RETURN(full, whole->FullTensor());
    }
    DT_ASSIGN_OR_RETURN(DTensor d, DTensor::FromLocal(std::move(full), unit_mesh, {r, r}));
    if (!col_) {
      const int last = static_cast<int>(d.shape().size()) - 1;
      DT_ASSIGN_OR_RETURN(d, d.Redistribute({Placement::Shard(last), r}));
    }
    x = std::move(d);
    return inputs;
  }
  // unit_rowwise on a plain local tensor: this rank's units (Note [Annotating local inputs]).
  DT_RETURN_IF_ERROR(CheckLocalSlice(module, *w, x));
  Shape global = x.shape();
  global.back() = w->shape().back();
  FromLocalOptions options;
  options.shape = global;
  DT_ASSIGN_OR_RETURN(DTensor d, DTensor::FromLocal(x.local(), unit_mesh,
                                                    {Placement::Shard(x.dim() - 1), r}, options));
  x = std::move(d);
  return inputs;
}

absl::StatusOr<Values> UnitParallel::TransformOutputPostForward(Module& module, Values outputs,
                                                                const DeviceMesh&) const {
  if (outputs.empty() || !outputs[0].is_dtensor()) return outputs;
  DTensor y = outputs[0].dtensor();
  if (!col_) {  // [P, R] -> [R, R]: the all_reduce over the unit dim only
    const Placement r = Placement::Replicate();
    DT_ASSIGN_OR_RETURN(y, y.Redistribute({r, r}));
  }
  outputs[0] = Handoff(std::move(y), use_local_output_, module);
  return outputs;
}

StyleInfo MoEIdentityParallel::Info() const {
  return {"-", "-", "R -> P(sum) (x / tp)", "local", "none"};
}

absl::StatusOr<Values> MoEIdentityParallel::TransformInputsPreForward(
    Module& module, Values inputs, const DeviceMesh& mesh) const {
  DT_ASSIGN_OR_RETURN(DTensor x, ReplicatedInput(module, inputs, mesh, Placement::Replicate(),
                                                  "moe_identity_expert"));
  DT_ASSIGN_OR_RETURN(x, RedistributeTo(x, Placement::Partial()));
  inputs[0] = std::move(x);
  return inputs;
}

absl::StatusOr<Values> MoEIdentityParallel::TransformOutputPostForward(Module&, Values outputs,
                                                                       const DeviceMesh&) const {
  for (Value& v : outputs) {
    if (v.is_dtensor()) v = Value(v.local());
  }
  return outputs;
}

}  // namespace dt::nn
