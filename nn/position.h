#pragma once
// Learned absolute position embeddings (GPT-2's wpe, OPT, BERT): a table [P, H] whose row p is
// added to the hidden state of the token at position p.
//
//   layer                     parameters       forward
//   LearnedPositionEmbedding  weight [P, H]    {x [B, S, H]} -> {x + weight[0..S)}
//                                              {x, positions i64/i32 [S] or [B, S]}
//                                                -> {x + weight[positions]}
//
// Positions past the table are an InvalidArgument naming the module, the position and P
// ("the sequence is longer than max_position_embeddings"), not an out-of-bounds read. With a KV
// cache, pass the absolute positions of the new tokens (past_length + i).
//
// Tensor parallelism: the table is small (P·H), so a plan leaves it replicated — say so with a
// `replicate` rule (GPT-2: {"wpe", "replicate"}). The forward works on DTensors (x replicated,
// the usual input of the first block) and on local tensors alike; the embedding styles do not
// apply (their input is token ids, this module's first input is the hidden state).

#include <cstdint>
#include <string>

#include "dtensor/core/dtype.h"
#include "dtensor/nn/linear.h"

namespace dt::nn {

class LearnedPositionEmbedding : public EmbeddingTable {
 public:
  LearnedPositionEmbedding(int64_t num_positions, int64_t embedding_dim,
                           DType dtype = DType::kF32);
  int64_t num_positions() const { return rows_; }

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override;
};

}  // namespace dt::nn
