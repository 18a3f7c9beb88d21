#include "dtensor/nn/position.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/value_ops.h"
#include "dtensor/ops/local/ops.h"

namespace dt::nn {

LearnedPositionEmbedding::LearnedPositionEmbedding(int64_t num_positions, int64_t embedding_dim,
                                                   DType dtype)
    : EmbeddingTable("LearnedPositionEmbedding", num_positions, embedding_dim, dtype) {}

absl::StatusOr<Values> LearnedPositionEmbedding::Forward(Values inputs) {
  if (inputs.empty() || inputs.size() > 2 || !inputs[0].defined() || inputs[0].dim() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LearnedPositionEmbedding takes {x [B, S, ", dim_, "]} or {x, positions}, got ",
        inputs.size(), " inputs", inputs.empty() ? "" : " (x " + inputs[0].Describe() + ")"));
  }
  const Value& x = inputs[0];
  const int64_t s = x.shape()[1];
  if (x.shape()[2] != dim_) {
    return absl::InvalidArgumentError(absl::StrCat("LearnedPositionEmbedding: x ", x.Describe(),
                                                   " has hidden size ", x.shape()[2],
                                                   ", the table has ", dim_));
  }
  Value positions;
  if (inputs.size() == 2 && inputs[1].defined()) {
    positions = inputs[1];
    if ((positions.dtype() != DType::kI64 && positions.dtype() != DType::kI32) ||
        positions.dim() < 1 || positions.dim() > 2 || positions.shape().back() != s) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LearnedPositionEmbedding: positions must be i64 or i32 [S] or [B, S] with S = ", s,
          " (x ", x.Describe(), "), got ", positions.Describe()));
    }
  } else {
    DT_ASSIGN_OR_RETURN(Tensor p, Tensor::Arange(0, static_cast<double>(s), 1.0, DType::kI64,
                                                 x.local().device()));
    positions = Value(std::move(p));
  }
  DT_ASSIGN_OR_RETURN(Tensor pos_i64, ops::Cast(positions.local(), DType::kI64));
  DT_ASSIGN_OR_RETURN(pos_i64, pos_i64.To(kCPU));
  for (int64_t p : pos_i64.ToVector<int64_t>()) {
    if (p < 0 || p >= rows_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LearnedPositionEmbedding: position ", p, " is outside the table of ", rows_,
          " learned positions (the sequence is longer than max_position_embeddings ", rows_, ")"));
    }
  }
  // The lookup in the kind the table comes in (local in local mode: Note [Local values]), the sum
  // in x's kind; the table is replicated, so its local piece is the whole table.
  DT_ASSIGN_OR_RETURN(Value w, ParamValue("weight"));
  DT_ASSIGN_OR_RETURN(Value ids, ops::AsKindOf(positions, w));
  DT_ASSIGN_OR_RETURN(Value e, ops::Embedding(w, ids));
  DT_ASSIGN_OR_RETURN(e, ops::AsKindOf(e, x));
  DT_ASSIGN_OR_RETURN(Value y, ops::Add(x, e));
  return Values{std::move(y)};
}

}  // namespace dt::nn
