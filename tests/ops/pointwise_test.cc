// Pointwise DTensor ops (Add/Sub/Mul/Div with tensors and scalars, unary ops, Cast) against the
// local op on the full tensors, over random meshes, shapes and placements (Partial included).
#include <vector>

#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "dtensor/tests/ops/ops_test_util.h"

namespace dt::ops::internal::testing {
namespace {

// A shape that broadcasts to `out`: some dims 1, maybe fewer leading dims.
Shape GenBroadcastOf(const Shape& out) {
  const int drop = U(0, static_cast<int>(out.size()));
  Shape s;
  for (size_t d = drop; d < out.size(); ++d) {
    s.push_back(U(0, 3) == 0 ? 1 : out[d]);
  }
  return s;
}

RC_GTEST_PROP(DopsPointwise, BinaryMatchesLocal, ()) {
  const auto mesh = GenMesh();
  const auto op = Pick(ops::BinaryOp::kAdd, ops::BinaryOp::kSub, ops::BinaryOp::kMul,
                                    ops::BinaryOp::kDiv);
  const Shape out = GenShape(U(1, 4), 1, 5);
  Shape a = out, b = GenBroadcastOf(out);
  if (Coin()) std::swap(a, b);
  const ReduceOp pa = GenPartialOp(false), pb = Coin() ? pa : GenPartialOp(false);
  const bool div = op == ops::BinaryOp::kDiv;
  std::vector<Arg> args = {
      MakeArg(GenTensor(a), GenPlacements(mesh, static_cast<int>(a.size()), true, pa, 2)),
      MakeArg(div ? GenTensor(b, true, 1, 4) : GenTensor(b),
              GenPlacements(mesh, static_cast<int>(b.size()), true, pb, 2))};
  const Tensor want = ops::Binary(op, args[0].full, args[1].full).value();
  CheckOp(mesh, args, Single([op](const std::vector<DTensor>& in) {
            return Binary(op, in[0], in[1]);
          }),
          {want}, /*exact=*/false);
}

// Flux2's AdaLN modulation: scale and shift broadcast to x ([B, S, D] with [B, 1, D] and the like),
// any placements of the three (Partial ones are reduced first).
RC_GTEST_PROP(DopsPointwise, ModulateMatchesLocal, ()) {
  const auto mesh = GenMesh();
  const Shape x = GenShape(U(1, 4), 1, 5);
  const Shape scale = GenBroadcastOf(x), shift = GenBroadcastOf(x);
  const ReduceOp p = GenPartialOp(false);
  std::vector<Arg> args;
  for (const Shape* s : {&x, &scale, &shift}) {
    args.push_back(MakeArg(GenTensor(*s), GenPlacements(mesh, static_cast<int>(s->size()), true, p, 2)));
  }
  const Tensor want = ops::Modulate(args[0].full, args[1].full, args[2].full).value();
  CheckOp(mesh, args, Single([](const std::vector<DTensor>& in) {
            return Modulate(in[0], in[1], in[2]);
          }),
          {want}, /*exact=*/false);
}

// act(gate) * up (SwiGLU and the like): any placements of the two; a Partial up with a
// replicated gate stays Partial (linear in up), every other Partial is reduced first.
RC_GTEST_PROP(DopsPointwise, GatedActivationMatchesLocal, ()) {
  const auto mesh = GenMesh();
  const auto act = *rc::gen::element(ops::UnaryOp::kSilu, ops::UnaryOp::kGeluTanh,
                                     ops::UnaryOp::kGeluErf, ops::UnaryOp::kRelu);
  const Shape shape = GenShape(U(1, 4), 1, 5);
  const ReduceOp p = GenPartialOp(false);
  std::vector<Arg> args;
  for (int j = 0; j < 2; ++j) {
    args.push_back(MakeArg(GenTensor(shape), GenPlacements(mesh, static_cast<int>(shape.size()), true, p, 2)));
  }
  const Tensor want = ops::GatedActivation(args[0].full, args[1].full, act).value();
  CheckOp(mesh, args, Single([act](const std::vector<DTensor>& in) {
            return GatedActivation(in[0], in[1], act);
          }),
          {want}, /*exact=*/false);
}

// Placements for b that fit a's where b's dims line up with a's (broadcast dims replicated).
Placements Aligned(const Placements& pa, const Shape& a, const Shape& b) {
  Placements pb;
  const int off = static_cast<int>(a.size()) - static_cast<int>(b.size());
  for (const Placement& p : pa) {
    if (p.is_any_shard()) {
      const int d = p.dim() - off;
      pb.push_back(d >= 0 && b[d] == a[p.dim()] ? p.WithDim(d) : Placement::Replicate());
    } else {
      pb.push_back(Placement::Replicate());
    }
  }
  return pb;
}

RC_GTEST_PROP(DopsPointwise, BinaryNeedsNoRedistributionWhenLayoutsFit, ()) {
  const auto mesh = GenMesh();
  const auto op = Pick(ops::BinaryOp::kAdd, ops::BinaryOp::kSub, ops::BinaryOp::kMul,
                                    ops::BinaryOp::kDiv);
  const Shape a = GenShape(U(1, 4), 1, 5);
  const Shape b = GenBroadcastOf(a);
  const ReduceOp pop = GenPartialOp(false);
  Placements pa = GenPlacements(mesh, static_cast<int>(a.size()), true, pop, 4);
  Placements pb = Aligned(pa, a, b);
  // Partial: P op R always; P + P (same op) for add and sub.
  const bool additive = op == ops::BinaryOp::kAdd || op == ops::BinaryOp::kSub;
  for (size_t i = 0; i < mesh.size(); ++i) {
    if (pa[i].is_partial() && additive && Coin()) pb[i] = pa[i];
  }
  std::vector<Arg> args = {MakeArg(GenTensor(a), pa),
                           MakeArg(op == ops::BinaryOp::kDiv ? GenTensor(b, true, 1, 4)
                                                             : GenTensor(b),
                                   pb)};
  const bool swap = op != ops::BinaryOp::kDiv && Coin();
  if (swap) std::swap(args[0], args[1]);
  const Tensor want = ops::Binary(op, args[0].full, args[1].full).value();
  CheckOp(mesh, args, Single([op](const std::vector<DTensor>& in) {
            return Binary(op, in[0], in[1]);
          }),
          {want}, /*exact=*/false, /*no_moves=*/true);
}

RC_GTEST_PROP(DopsPointwise, ScalarMatchesLocalAndKeepsPartial, ()) {
  const auto mesh = GenMesh();
  const auto op = Pick(ops::BinaryOp::kAdd, ops::BinaryOp::kSub, ops::BinaryOp::kMul,
                                    ops::BinaryOp::kDiv);
  const double s = Pick(-5.0, -1.0, 0.0, 0.5, 2.0, 3.0);
  const Shape shape = GenShape(U(1, 4), 1, 5);
  const ReduceOp pop = GenPartialOp();
  std::vector<Arg> args = {MakeArg(GenTensor(shape), GenPlacements(mesh, static_cast<int>(shape.size()),
                                                                   true, pop, 4))};
  const Tensor want = ops::Binary(op, args[0].full, s).value();
  // Every Partial kind stays Partial, except division by zero.
  const bool no_moves = !(op == ops::BinaryOp::kDiv && s == 0) ||
                        !AnyOn(mesh, args[0].placements, [](const Placement& p) { return p.is_partial(); });
  CheckOp(mesh, args, Single([op, s](const std::vector<DTensor>& in) {
            return Binary(op, in[0], s);
          }),
          {want}, /*exact=*/false, no_moves);
}

RC_GTEST_PROP(DopsPointwise, UnaryMatchesLocal, ()) {
  const auto mesh = GenMesh();
  const auto op = *rc::gen::resize(100, rc::gen::elementOf(ops::kAllUnaryOps));
  const Shape shape = GenShape(U(1, 4), 1, 5);
  const bool positive = op == ops::UnaryOp::kRsqrt || op == ops::UnaryOp::kSqrt;
  const ReduceOp pop = GenPartialOp();
  std::vector<Arg> args = {MakeArg(positive ? GenTensor(shape, true, 1, 6) : GenTensor(shape),
                                   GenPlacements(mesh, static_cast<int>(shape.size()), true, pop, 3))};
  const Tensor want = ops::Unary(op, args[0].full).value();
  // Only Neg is linear; the others must reduce a Partial input first, so they move it.
  const bool partial = AnyOn(mesh, args[0].placements, [](const Placement& p) { return p.is_partial(); });
  const bool no_moves = op == ops::UnaryOp::kNeg || !partial;
  CheckOp(mesh, args, Single([op](const std::vector<DTensor>& in) { return Unary(op, in[0]); }),
          {want}, /*exact=*/false, no_moves);
  if (op != ops::UnaryOp::kNeg && partial) {
    // Never a silently wrong layout: the non-linear op saw reduced values (checked above), which
    // took communication.
    auto res = RunOp(mesh, args, Single([op](const std::vector<DTensor>& in) {
                       return Unary(op, in[0]);
                     }));
    RC_ASSERT(res.ok());
    bool moved = false;
    for (const RankResult& r : *res) moved = moved || r.decision.num_redistributed() > 0;
    RC_ASSERT(moved);
  }
}

RC_GTEST_PROP(DopsPointwise, CastMatchesLocal, ()) {
  const auto mesh = GenMesh();
  const DType to = Pick(DType::kF32, DType::kBF16, DType::kF16, DType::kI32);
  const Shape shape = GenShape(U(1, 4), 1, 5);
  std::vector<Arg> args = {MakeArg(GenTensor(shape), GenPlacements(mesh, static_cast<int>(shape.size()),
                                                                   true, GenPartialOp(), 3))};
  const Tensor want = ops::Cast(args[0].full, to).value();
  // Small integers are exact in every target dtype, so float -> float keeps Partial exactly.
  CheckOp(mesh, args, Single([to](const std::vector<DTensor>& in) { return Cast(in[0], to); }),
          {want}, /*exact=*/true, /*no_moves=*/to != DType::kI32);
}

// The example in dtensor_ops.h: a rowwise result plus a replicated bias term, then non-linear ops.
TEST(DopsPointwise, PartialPlusReplicatedAddsOnce) {
  const Tensor a = RandTensor({4, 3}, 1), b = RandTensor({3}, 2);
  std::vector<Arg> args = {{a, Pl("P(sum)"), 7}, {b, Pl("R"), 0}};
  auto res = RunOp({4}, args, Single([](const std::vector<DTensor>& in) { return Add(in[0], in[1]); }));
  ASSERT_TRUE(res.ok()) << res.status();
  const Tensor want = ops::Add(a, b).value();
  for (const RankResult& r : *res) {
    EXPECT_TRUE(Equal(r.full[0], want));
    EXPECT_EQ(PlacementsToString(r.placements[0]), "[P(sum)]");
    EXPECT_EQ(r.comms.total(), 0);
  }
}

}  // namespace
}  // namespace dt::ops::internal::testing
