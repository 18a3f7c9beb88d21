// Reductions (Sum, Mean, Max, Argmax over a possibly sharded dim), Softmax/LogSoftmax and TopK on
// DTensors against the local ops on the full tensors.
#include <vector>

#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "dtensor/tests/ops/ops_test_util.h"

namespace dt::ops::internal::testing {
namespace {

RC_GTEST_PROP(DopsReduce, ReduceMatchesLocal, ()) {
  const auto mesh = GenMesh();
  const auto op = Pick(ops::Reduction::kSum, ops::Reduction::kMean, ops::Reduction::kMax,
                       ops::Reduction::kArgmax);
  const bool extreme = op == ops::Reduction::kMax || op == ops::Reduction::kArgmax;
  const Shape shape = GenShape(U(1, 4), extreme ? 1 : 0, 6);
  const int dim = U(0, static_cast<int>(shape.size()));
  const bool keepdim = Coin();
  const ReduceOp pop = GenPartialOp();
  std::vector<Arg> args = {
      MakeArg(GenTensor(shape), GenPlacements(mesh, static_cast<int>(shape.size()), true, pop, 2))};
  const Tensor want = ops::Reduce(op, args[0].full, dim, keepdim).value();
  // Sharded reduced dims become Partial: no communication. Partial inputs pass when the reduction
  // commutes with them (sum/avg for Sum and Mean, max for Max); Argmax needs the dim whole.
  const bool no_moves = !AnyOn(mesh, args[0].placements, [&](const Placement& p) {
    if (p.is_partial()) {
      const ReduceOp r = p.reduce_op();
      const bool fits = ((op == ops::Reduction::kSum || op == ops::Reduction::kMean) &&
                         (r == ReduceOp::kSum || r == ReduceOp::kAvg)) ||
                        (op == ops::Reduction::kMax && r == ReduceOp::kMax);
      return !fits;
    }
    return op == ops::Reduction::kArgmax && p.is_any_shard(dim);
  });
  CheckOp(mesh, args, Single([op, dim, keepdim](const std::vector<DTensor>& in) {
            return Reduce(op, in[0], dim, keepdim);
          }),
          {want}, /*exact=*/extreme,
          /*no_moves=*/no_moves);
}

RC_GTEST_PROP(DopsReduce, SoftmaxMatchesLocal, ()) {
  const auto mesh = GenMesh();
  const Shape shape = GenShape(U(1, 4), 1, 6);
  const int dim = U(0, static_cast<int>(shape.size()));
  const bool log = Coin();
  std::vector<Arg> args = {MakeArg(GenTensor(shape, false),
                                   GenPlacements(mesh, static_cast<int>(shape.size()), false))};
  const bool no_moves =
      !AnyOn(mesh, args[0].placements, [&](const Placement& p) { return p.is_any_shard(dim); });
  const Tensor want = (log ? ops::LogSoftmax(args[0].full, dim) : ops::Softmax(args[0].full, dim)).value();
  CheckOp(mesh, args, Single([dim, log](const std::vector<DTensor>& in) {
            return log ? LogSoftmax(in[0], dim) : Softmax(in[0], dim);
          }),
          {want}, /*exact=*/false, no_moves);
}

RC_GTEST_PROP(DopsReduce, TopKMatchesLocal, ()) {
  const auto mesh = GenMesh();
  const Shape shape = GenShape(U(1, 4), 1, 6);
  const int dim = U(0, static_cast<int>(shape.size()));
  const int64_t k = U<int64_t>(0, shape[dim] + 1);
  const bool largest = Coin();
  std::vector<Arg> args = {MakeArg(GenTensor(shape),  // small integers: many ties
                                   GenPlacements(mesh, static_cast<int>(shape.size()), true,
                                                 GenPartialOp()))};
  const bool no_moves = !AnyOn(mesh, args[0].placements, [&](const Placement& p) {
    return p.is_any_shard(dim) || p.is_partial();
  });
  const ops::TopKResult want = ops::TopK(args[0].full, k, dim, largest).value();
  CheckOp(mesh, args,
          [k, dim, largest](const std::vector<DTensor>& in) -> absl::StatusOr<std::vector<DTensor>> {
            DT_ASSIGN_OR_RETURN(TopKOf<DTensor> r, TopK(in[0], k, dim, largest));
            return std::vector<DTensor>{r.values, r.indices};
          },
          {want.values, want.indices}, /*exact=*/true, no_moves);
}

// Sampling over vocab-sharded logits: Argmax gathers the vocab dim, Max reduces shards as P(max).
TEST(DopsReduce, ArgmaxAndMaxOverShardedVocab) {
  const Tensor logits = RandTensor({2, 13}, 9, false);
  std::vector<Arg> args = {{logits, Pl("S(1)"), 0}};
  auto res = RunOp({4}, args, [](const std::vector<DTensor>& in)
                                  -> absl::StatusOr<std::vector<DTensor>> {
    DT_ASSIGN_OR_RETURN(DTensor m, Max(in[0], -1));
    DT_ASSIGN_OR_RETURN(DTensor a, Argmax(in[0], -1));
    return std::vector<DTensor>{m, a};
  });
  ASSERT_TRUE(res.ok()) << res.status();
  for (const RankResult& r : *res) {
    EXPECT_TRUE(Equal(r.full[0], ops::Max(logits, -1).value()));
    EXPECT_TRUE(Equal(r.full[1], ops::Argmax(logits, -1).value()));
    EXPECT_EQ(PlacementsToString(r.placements[0]), "[P(max)]");
  }
}

}  // namespace
}  // namespace dt::ops::internal::testing
