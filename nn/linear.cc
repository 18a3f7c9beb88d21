#include "dtensor/nn/linear.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/ops/value_ops.h"

namespace dt::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, DType dtype)
    : Module("Linear"), in_(in_features), out_(out_features) {
  RegisterParameter("weight", {out_features, in_features}, dtype);
  if (bias) RegisterParameter("bias", {out_features}, dtype);
}

std::vector<int64_t> Linear::PackedBlocks(const Parameter& param, bool col) const {
  if (col) return packed_col_blocks_;
  return param.dim() >= 2 ? packed_row_blocks_ : std::vector<int64_t>{};
}

int64_t Linear::ShardUnit(const Parameter& param, bool col) const {
  if (col) return col_unit_;
  return param.dim() >= 2 ? row_unit_ : 0;
}

std::string Linear::ExtraRepr() const {
  std::string s =
      absl::StrCat("in=", in_, ", out=", out_, ", bias=", has_bias() ? "true" : "false");
  if (!packed_col_blocks_.empty()) {
    absl::StrAppend(&s, ", packed_col_blocks=[", absl::StrJoin(packed_col_blocks_, ", "), "]");
  }
  if (!packed_row_blocks_.empty()) {
    absl::StrAppend(&s, ", packed_row_blocks=[", absl::StrJoin(packed_row_blocks_, ", "), "]");
  }
  return s;
}

absl::StatusOr<Values> Linear::Forward(Values inputs) {
  DT_ASSIGN_OR_RETURN(Value x, SingleInput(*this, inputs));
  DT_ASSIGN_OR_RETURN(Value w, ParamValue("weight"));
  Value b;
  if (has_bias()) {
    DT_ASSIGN_OR_RETURN(b, ParamValue("bias"));
  }
  DT_ASSIGN_OR_RETURN(Value y, ops::Linear(x, w, b));
  return Values{std::move(y)};
}

namespace {

// The whole local weight of a layer whose call would be its own Forward on a plain local x, or
// nullptr (CallLinears).
const Tensor* PlainWeight(const Linear& l) {
  if (l.installed_forward() || l.has_hooks() || l.has_bias()) return nullptr;
  const Parameter* w = l.FindParameter("weight");
  if (w == nullptr || !w->materialized() || (w->placed() && w->spec().NumShards() > 0)) {
    return nullptr;
  }
  return &w->value().ToLocal();
}

}  // namespace

absl::StatusOr<std::vector<Value>> CallLinears(absl::Span<Linear* const> layers, const Value& x) {
  std::vector<Tensor> ws;
  if (x.defined() && x.is_local() && x.piece_of() == nullptr) {
    for (const Linear* l : layers) {
      const Tensor* w = PlainWeight(*l);
      if (w == nullptr) break;
      ws.push_back(*w);
    }
  }
  std::vector<Value> out;
  if (ws.size() == layers.size()) {
    absl::StatusOr<std::vector<Tensor>> ys = ops::Linears(x.local(), ws);
    if (ys.ok()) {
      for (Tensor& y : *ys) out.emplace_back(std::move(y));
      return out;
    }
  }
  for (Linear* l : layers) {
    DT_ASSIGN_OR_RETURN(Value y, l->CallOne({x}));
    out.push_back(std::move(y));
  }
  return out;
}

EmbeddingTable::EmbeddingTable(std::string type_name, int64_t rows, int64_t dim, DType dtype)
    : Module(std::move(type_name)), rows_(rows), dim_(dim) {
  RegisterParameter("weight", {rows, dim}, dtype);
}

std::string EmbeddingTable::ExtraRepr() const { return absl::StrCat(rows_, ", ", dim_); }

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, DType dtype)
    : EmbeddingTable("Embedding", num_embeddings, embedding_dim, dtype), dtype_(dtype) {}

absl::StatusOr<Values> Embedding::Forward(Values inputs) {
  DT_ASSIGN_OR_RETURN(Value ids, SingleInput(*this, inputs));
  DT_ASSIGN_OR_RETURN(Value w, ParamValue("weight"));
  DT_ASSIGN_OR_RETURN(Value y, ops::Embedding(w, ids));
  if (y.dtype() != dtype_) {  // a quantized table gives f32 rows
    DT_ASSIGN_OR_RETURN(y, ops::Cast(y, dtype_));
  }
  return Values{std::move(y)};
}

}  // namespace dt::nn
