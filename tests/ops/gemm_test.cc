// Matmul and Linear on DTensors: einsum strategies (batch, free and contracting dims, Partial
// linearity) against ops::Matmul / ops::Linear on the full tensors; tensor-parallel layouts
// (colwise, rowwise, packed) need no communication.
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "dtensor/tests/ops/ops_test_util.h"

namespace dt::ops::internal::testing {
namespace {

struct MatmulCase {
  Shape a, b;
  bool ta = false, tb = false;
  int nb = 0;                     // batch dims of the output
  Shape batch;                    // the output's batch dims
  int64_t m = 1, k = 1, n = 1;
};

// `batch` followed by a matrix's dims: [rows, cols], or [cols, rows] when `transposed`.
Shape WithMatrix(Shape batch, bool transposed, int64_t rows, int64_t cols) {
  batch.push_back(transposed ? cols : rows);
  batch.push_back(transposed ? rows : cols);
  return batch;
}

MatmulCase GenMatmul() {
  MatmulCase c;
  c.nb = U(0, 3);
  c.batch = GenShape(c.nb, 1, 3);
  c.m = U<int64_t>(1, 6);
  c.k = U<int64_t>(0, 6);
  c.n = U<int64_t>(1, 6);
  c.ta = Coin();
  c.tb = Coin();
  auto batch_of = [&]() {
    Shape s;
    const int drop = U(0, c.nb + 1);
    for (int d = drop; d < c.nb; ++d) s.push_back(U(0, 3) == 0 ? 1 : c.batch[d]);
    return s;
  };
  c.a = batch_of();
  c.b = batch_of();
  // The output batch is the broadcast of the operands' batches.
  Shape ab = BroadcastShapes(c.a, c.b).value();
  c.batch = ab;
  c.nb = static_cast<int>(ab.size());
  c.a = WithMatrix(std::move(c.a), c.ta, c.m, c.k);
  c.b = WithMatrix(std::move(c.b), c.tb, c.k, c.n);
  return c;
}

RC_GTEST_PROP(DopsGemm, MatmulMatchesLocal, ()) {
  const auto mesh = GenMesh();
  const MatmulCase c = GenMatmul();
  const ReduceOp op = GenPartialOp();
  std::vector<Arg> args = {
      MakeArg(GenTensor(c.a), GenPlacements(mesh, static_cast<int>(c.a.size()), true, op, 2)),
      MakeArg(GenTensor(c.b), GenPlacements(mesh, static_cast<int>(c.b.size()), true, op, 2))};
  const Tensor want = ops::Matmul(args[0].full, args[1].full, c.ta, c.tb).value();
  const bool ta = c.ta, tb = c.tb;
  CheckOp(mesh, args, Single([ta, tb](const std::vector<DTensor>& in) {
            return Matmul(in[0], in[1], ta, tb);
          }),
          {want}, /*exact=*/false);
}

// Per mesh dim one of the einsum strategies, so the inputs already fit: no communication.
RC_GTEST_PROP(DopsGemm, MatmulEinsumLayoutsNeedNoRedistribution, ()) {
  const auto mesh = GenMesh();
  const MatmulCase c = GenMatmul();
  const int ra = static_cast<int>(c.a.size()), rb = static_cast<int>(c.b.size());
  const int am = c.ta ? ra - 1 : ra - 2, ak = c.ta ? ra - 2 : ra - 1;
  const int bk = c.tb ? rb - 1 : rb - 2, bn = c.tb ? rb - 2 : rb - 1;
  Placements pa, pb;
  const ReduceOp pop = GenPartialOp(false);
  for (size_t i = 0; i < mesh.size(); ++i) {
    Placement x, y;
    switch (U(0, 7)) {
      case 1: x = Placement::Shard(am); break;
      case 2: y = Placement::Shard(bn); break;
      case 3: x = Placement::Shard(ak); y = Placement::Shard(bk); break;
      case 4: x = Placement::Partial(pop); break;
      case 5: y = Placement::Partial(pop); break;
      case 6: {
        // A batch dim both operands have with the output's size.
        const int o = c.nb > 0 ? U(0, c.nb) : -1;
        const int da = o - (c.nb - (ra - 2)), db = o - (c.nb - (rb - 2));
        if (o >= 0 && da >= 0 && db >= 0 && c.a[da] == c.batch[o] && c.b[db] == c.batch[o]) {
          x = Placement::Shard(da);
          y = Placement::Shard(db);
        }
        break;
      }
      default: break;
    }
    pa.push_back(x);
    pb.push_back(y);
  }
  // Partial a on one mesh dim and Partial b on another is fine too: (sum a)(sum b) = sum sum ab.
  std::vector<Arg> args = {MakeArg(GenTensor(c.a), pa), MakeArg(GenTensor(c.b), pb)};
  const Tensor want = ops::Matmul(args[0].full, args[1].full, c.ta, c.tb).value();
  const bool ta = c.ta, tb = c.tb;
  CheckOp(mesh, args, Single([ta, tb](const std::vector<DTensor>& in) {
            return Matmul(in[0], in[1], ta, tb);
          }),
          {want}, /*exact=*/false, /*no_moves=*/true);
}

RC_GTEST_PROP(DopsGemm, LinearMatchesLocal, ()) {
  const auto mesh = GenMesh();
  const Shape x = GenShape(U(1, 4), 1, 5);
  const int64_t out = U<int64_t>(1, 7);
  const bool bias = Coin();
  const ReduceOp op = GenPartialOp();
  std::vector<Arg> args = {
      MakeArg(GenTensor(x), GenPlacements(mesh, static_cast<int>(x.size()), true, op, 2)),
      MakeArg(GenTensor({out, x.back()}), GenPlacements(mesh, 2, true, op, 2))};
  if (bias) args.push_back(MakeArg(GenTensor({out}), GenPlacements(mesh, 1, true, op, 2)));
  const Tensor want =
      ops::Linear(args[0].full, args[1].full, bias ? args[2].full : Tensor()).value();
  CheckOp(mesh, args, Single([bias](const std::vector<DTensor>& in) {
            return Linear(in[0], in[1], bias ? in[2] : DTensor());
          }),
          {want}, /*exact=*/false);
}

// Colwise (w S(0), bias S(0)), rowwise (x S(-1), w S(1), bias R), batch, and Partial x or w.
RC_GTEST_PROP(DopsGemm, LinearParallelStylesNeedNoRedistribution, ()) {
  const auto mesh = GenMesh();
  const Shape x = GenShape(U(1, 4), 1, 5);
  const int r = static_cast<int>(x.size());
  const int64_t out = U<int64_t>(1, 7);
  const bool bias = Coin();
  const ReduceOp pop = GenPartialOp(false);
  Placements px, pw, pb;
  bool partial_x = false, partial_w = false;
  for (size_t i = 0; i < mesh.size(); ++i) {
    Placement a, w, b;
    switch (U(0, 6)) {
      case 1: w = Placement::Shard(0); b = Placement::Shard(0); break;  // colwise
      case 2: a = Placement::Shard(r - 1); w = Placement::Shard(1); break;  // rowwise
      case 3: if (r > 1) a = Placement::Shard(U(0, r - 1)); break;  // batch
      case 4: if (!partial_w) { a = Placement::Partial(pop); partial_x = true; } break;
      case 5: if (!partial_x) { w = Placement::Partial(pop); partial_w = true; } break;
      default: break;
    }
    px.push_back(a);
    pw.push_back(w);
    pb.push_back(b);
  }
  std::vector<Arg> args = {MakeArg(GenTensor(x), px), MakeArg(GenTensor({out, x.back()}), pw)};
  if (bias) args.push_back(MakeArg(GenTensor({out}), pb));
  const Tensor want =
      ops::Linear(args[0].full, args[1].full, bias ? args[2].full : Tensor()).value();
  CheckOp(mesh, args, Single([bias](const std::vector<DTensor>& in) {
            return Linear(in[0], in[1], bias ? in[2] : DTensor());
          }),
          {want}, /*exact=*/false, /*no_moves=*/true);
}

// The MLP of dtensor_ops.h's example: colwise, Silu, rowwise; the only collective is the final
// all_reduce the caller asks for. The rowwise bias is added once.
TEST(DopsGemm, TensorParallelMlp) {
  const Tensor x = RandTensor({3, 8}, 1), up = RandTensor({12, 8}, 2), down = RandTensor({8, 12}, 3),
               b_up = RandTensor({12}, 4), b_down = RandTensor({8}, 5);
  std::vector<Arg> args = {{x, Pl("R"), 0},        {up, Pl("S(0)"), 0},  {b_up, Pl("S(0)"), 0},
                           {down, Pl("S(1)"), 0},  {b_down, Pl("R"), 0}};
  auto res = RunOp({4}, args, [](const std::vector<DTensor>& in)
                                  -> absl::StatusOr<std::vector<DTensor>> {
    DT_ASSIGN_OR_RETURN(DTensor h, Linear(in[0], in[1], in[2]));
    if (PlacementsToString(h.placements()) != "[S(1)]") {
      return absl::InternalError("colwise: " + h.ToString());
    }
    DT_ASSIGN_OR_RETURN(DTensor a, Silu(h));
    DT_ASSIGN_OR_RETURN(DTensor y, Linear(a, in[3], in[4]));
    if (PlacementsToString(y.placements()) != "[P(sum)]") {
      return absl::InternalError("rowwise: " + y.ToString());
    }
    DT_ASSIGN_OR_RETURN(DTensor z, y.Redistribute(Pl("R")));
    return std::vector<DTensor>{z};
  });
  ASSERT_TRUE(res.ok()) << res.status();
  const Tensor h = ops::Silu(ops::Linear(x, up, b_up).value()).value();
  const Tensor want = ops::Linear(h, down, b_down).value();
  for (const RankResult& r : *res) {
    EXPECT_TRUE(AllClose(r.full[0], want, 1e-4, 1e-4).ok());
    EXPECT_EQ(r.comms.all_reduce, 1);
    EXPECT_EQ(r.comms.total(), 1);
  }
}

// Packed (fused) weights: a colwise weight _S(0, [a, b]) gives _S(-1, [a, b]) outputs, which Split
// at the block boundary into plain shards, and Cat turns back into the packed layout that a
// rowwise _S(1, [a, b]) weight contracts with: no communication until the final reduction.
TEST(DopsGemm, PackedColwiseSplitCatRowwise) {
  const int64_t a = 6, b = 10, hid = 5;
  const Tensor x = RandTensor({3, hid}, 1), w_in = RandTensor({a + b, hid}, 2),
               w_out = RandTensor({hid, a + b}, 3);
  const Placements packed_col = {Placement::BlockShard(0, {a, b})};
  const Placements packed_row = {Placement::BlockShard(1, {a, b})};
  std::vector<Arg> args = {{x, Pl("R"), 0}, {w_in, packed_col, 0}, {w_out, packed_row, 0}};
  auto res = RunOp({4}, args, [](const std::vector<DTensor>& in)
                                  -> absl::StatusOr<std::vector<DTensor>> {
    DT_ASSIGN_OR_RETURN(DTensor p, Linear(in[0], in[1]));  // [3, a+b] _S(1, [a, b])
    DT_ASSIGN_OR_RETURN(std::vector<DTensor> parts, Split(p, {6, 10}, -1));
    DT_ASSIGN_OR_RETURN(DTensor g, Silu(parts[0]));
    DT_ASSIGN_OR_RETURN(DTensor cat, Cat({g, parts[1]}, -1));
    DT_ASSIGN_OR_RETURN(DTensor y, Linear(cat, in[2]));
    return std::vector<DTensor>{p, parts[0], parts[1], cat, y};
  });
  ASSERT_TRUE(res.ok()) << res.status();
  const Tensor p = ops::Linear(x, w_in).value();
  const auto parts = ops::Split(p, {6, 10}, -1).value();
  const Tensor cat = ops::Cat({ops::Silu(parts[0]).value(), parts[1]}, -1).value();
  const Tensor y = ops::Linear(cat, w_out).value();
  for (const RankResult& r : *res) {
    EXPECT_EQ(r.comms.total(), 0);
    EXPECT_EQ(PlacementsToString(r.placements[0]), "[_S(1,[6,10])]");
    EXPECT_EQ(PlacementsToString(r.placements[1]), "[S(1)]");
    EXPECT_EQ(PlacementsToString(r.placements[2]), "[S(1)]");
    EXPECT_EQ(PlacementsToString(r.placements[3]), "[_S(1,[6,10])]");
    EXPECT_EQ(PlacementsToString(r.placements[4]), "[P(sum)]");
    EXPECT_TRUE(AllClose(r.full[0], p, 1e-4, 1e-4).ok());
    EXPECT_TRUE(AllClose(r.full[3], cat, 1e-4, 1e-4).ok());
    EXPECT_TRUE(AllClose(r.full[4], y, 1e-4, 1e-4).ok());
  }
}

}  // namespace
}  // namespace dt::ops::internal::testing
