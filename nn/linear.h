#pragma once
// Linear and Embedding: the two layers tensor-parallel styles shard.
//
//   layer       parameters                    forward (inputs -> outputs)
//   Linear      weight [out, in], bias [out]  {x [..., in]} -> {x·weightᵀ + bias [..., out]}
//   Embedding   weight [vocab, dim]           {ids [...] (i64/i32)} -> {rows [..., dim]}
//
// Either weight may be quantized (a GGUF's blocks kept as they are: nn::KeepQuantized in
// nn/load.h); the outputs keep the layer's compute dtype (a Linear's is x's; an Embedding's the
// dtype it was built with, its rows dequantized on lookup).
//
// A Linear that packs several logical projections along one dim (a fused gate|up, Flux2's
// q|k|v|gate|up) records their sizes as diffusers does (`_tp_packed_col_blocks`,
// `_tp_packed_row_blocks`): packed_colwise / packed_rowwise read them when the plan gives no
// blocks, so the model states its layout once and the plan stays a list of names.
//
//   Linear fused(64, 2 * 96);  fused.set_packed_col_blocks({96, 96});   // gate | up

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dtensor/core/dtype.h"
#include "dtensor/nn/module.h"

namespace dt::nn {

// The outputs of layers[i]->CallOne({x}) for Linears that read the same x (q, k and v; gate and
// up), computed together by ops::Linears (Note [Sibling projections] in ops/local/ops.h) when
// nothing else would run in those calls: x a plain local tensor, and every layer without a style's
// forward, hooks or bias, its weight whole on this rank (not sharded). Otherwise, or when the
// joint call fails, each layer is called (its errors naming it). The same values either way.
class Linear;
absl::StatusOr<std::vector<Value>> CallLinears(absl::Span<Linear* const> layers, const Value& x);

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = false, DType dtype = DType::kF32);

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  bool has_bias() const { return FindParameter("bias") != nullptr; }

  // Absolute sizes of the packed blocks of the output rows / input columns (sum = out / in);
  // empty when the layer is not packed.
  const std::vector<int64_t>& packed_col_blocks() const { return packed_col_blocks_; }
  void set_packed_col_blocks(std::vector<int64_t> blocks) {
    packed_col_blocks_ = std::move(blocks);
  }
  const std::vector<int64_t>& packed_row_blocks() const { return packed_row_blocks_; }
  void set_packed_row_blocks(std::vector<int64_t> blocks) {
    packed_row_blocks_ = std::move(blocks);
  }

  // packed_col_blocks for the weight and the bias (col), packed_row_blocks for the weight (row).
  std::vector<int64_t> PackedBlocks(const Parameter& param, bool col) const override;

  // The units unit_colwise / unit_rowwise keep whole (Module::ShardUnit): rows of the output
  // (an attention's q/k/v: head_dim; a gated q|gate per head: 2 · head_dim) and columns of the
  // input (o_proj: head_dim). 0: none declared.
  void set_col_unit(int64_t rows) { col_unit_ = rows; }
  void set_row_unit(int64_t cols) { row_unit_ = cols; }
  int64_t ShardUnit(const Parameter& param, bool col) const override;
  std::string ExtraRepr() const override;

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  int64_t in_;
  int64_t out_;
  std::vector<int64_t> packed_col_blocks_;
  std::vector<int64_t> packed_row_blocks_;
  int64_t col_unit_ = 0;
  int64_t row_unit_ = 0;
};

// A module whose parameter is a table `weight` [rows, dim] (Embedding, LearnedPositionEmbedding
// in nn/position.h): it registers the table and reprs as "rows, dim".
class EmbeddingTable : public Module {
 public:
  int64_t embedding_dim() const { return dim_; }
  std::string ExtraRepr() const override;

 protected:
  EmbeddingTable(std::string type_name, int64_t rows, int64_t dim, DType dtype);

  int64_t rows_;
  int64_t dim_;
};

class Embedding : public EmbeddingTable {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, DType dtype = DType::kF32);

  int64_t num_embeddings() const { return rows_; }

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;

 private:
  DType dtype_;  // the compute dtype (the weight's, unless it is quantized)
};

}  // namespace dt::nn
