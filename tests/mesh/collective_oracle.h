#pragma once
// Test oracle for collectives: deterministic inputs per (case, rank) and the expected outputs,
// computed directly from every rank's inputs (no communicator involved). Values are small integers
// (products of ±1 and 2), so every backend's result is exact whatever its reduction order, and
// avg follows the documented rule (sum, then one division in the dtype; integers truncate).

#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/core/tensor.h"
#include "dtensor/mesh/collective.h"
#include "dtensor/mesh/communicator.h"

namespace dt::testing {

using internal::CollectiveKind;

struct CollectiveCase {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int64_t count = 5;   // elements per rank (per block for all_to_all); the base for uneven counts
  uint64_t seed = 1;
  int root = 0;        // broadcast root

  std::string ToString() const;  // "all_reduce f32 sum count=5 seed=1"
};

// Per-rank counts of the *_v kinds: (count + 3*r + seed) % (count + 1) for rank r, so some are 0.
std::vector<int64_t> UnevenCounts(const CollectiveCase& c, int size);
// all_to_all_v: elements rank `src` sends to rank `dst`.
int64_t PairCount(const CollectiveCase& c, int src, int dst);

// all_to_all_views, per peer p: a 2-d block A[:, p*2:(p+1)*2] of A [count, 2*size] (strided), row
// p of E [size, count] (contiguous), then column p of B [count+1, size] down to PairCount rows
// (strided, zero-size for some pairs) split in two views; received into rows [q*count, (q+1)*count)
// of C [size*count, 2] (contiguous), column q of F [count, size] (strided) and column q of
// D [count+1, size] split in three views, the rest of D left at kViewsSentinel. Input() is A, E, B
// flat; Expected() is C, F, D flat.
inline constexpr double kViewsSentinel = 1;
struct ViewLists {
  std::vector<TensorViews> send, recv;
};
// The views of `input` (rank's Input(), on any device) and `output` (shaped like Expected()).
ViewLists MakeViews(const CollectiveCase& c, int rank, int size, const Tensor& input, const Tensor& output);

Tensor Input(const CollectiveCase& c, int rank, int size);
Tensor Expected(const CollectiveCase& c, int rank, int size);

// Runs `c` on `comm` with tensors on `device` (send/recv: a ring) and compares with Expected; the
// error names the case, the rank and the first differing element.
absl::Status RunCase(Communicator& comm, const CollectiveCase& c, Device device = kCPU);

// Every kind, dtype, op and a few sizes (0, 1, 7, 33), for sweeping a communicator.
std::vector<CollectiveCase> AllCases(int size, uint64_t seed);

}  // namespace dt::testing
