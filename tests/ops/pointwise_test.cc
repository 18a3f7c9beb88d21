// Pointwise DTensor ops (Add/Sub/Mul/Div with tensors and scalars, unary ops, Cast, Modulate,
// GatedActivation, SoftCap) against the local op on the full tensors, over random meshes, shapes
// and placements (Partial included).
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "absl/strings/match.h"
#include "dtensor/ops/ops.h"
#include "dtensor/tests/ops/ops_test_util.h"

namespace dt::ops::internal::testing {
namespace {

// One of the four binary ops, for the properties that hold for each.
ops::BinaryOp GenBinaryOp() {
  return Pick(ops::BinaryOp::kAdd, ops::BinaryOp::kSub, ops::BinaryOp::kMul, ops::BinaryOp::kDiv);
}

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
  const ops::BinaryOp op = GenBinaryOp();
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
  const ops::BinaryOp op = GenBinaryOp();
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
  const ops::BinaryOp op = GenBinaryOp();
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

// cap · tanh(x / cap) over any placements: the local op on the full tensor, and the formula in
// double; a Partial x (not linear) must be reduced first, which takes communication.
RC_GTEST_PROP(DopsPointwise, SoftCapMatchesLocal, ()) {
  const auto mesh = GenMesh();
  const double cap = Pick(0.5, 3.0, 30.0);
  const Shape shape = GenShape(U(1, 4), 1, 5);
  std::vector<Arg> args = {MakeArg(GenTensor(shape, true, -40, 40),
                                   GenPlacements(mesh, static_cast<int>(shape.size()), true,
                                                 GenPartialOp(), 3))};
  const Tensor want = ops::SoftCap(args[0].full, cap).value();
  const std::vector<double> xs = args[0].full.ToDoubles(), ws = want.ToDoubles();
  for (size_t i = 0; i < xs.size(); ++i) {
    RC_ASSERT(std::abs(ws[i] - cap * std::tanh(xs[i] / cap)) <= 1e-6 * cap);
  }
  const auto op = Single([cap](const std::vector<DTensor>& in) { return SoftCap(in[0], cap); });
  const bool partial = AnyOn(mesh, args[0].placements, [](const Placement& p) { return p.is_partial(); });
  CheckOp(mesh, args, op, {want}, /*exact=*/false, /*no_moves=*/!partial);
  if (partial) {
    auto res = RunOp(mesh, args, op);
    RC_ASSERT(res.ok());
    for (const RankResult& r : *res) RC_ASSERT(r.decision.num_redistributed() > 0);
  }
}

// torch.tanh(x / cap) * cap (torch 2.15, f32), Gemma 2's final-logit soft-capping, on Tensors,
// local Values and a DTensor sharded over 2 ranks.
TEST(DopsPointwise, SoftCapMatchesTorch) {
  const std::vector<float> x = {0.0f, -0.0f, 7.0000001e-06f, -0.00210000016f, 0.0700000003f,
                                -0.699999988f, 1.39999998f, 1.7493f, 1.75f, -1.81999993f, 3.5f,
                                -5.25f, 7.0f, -10.5f, 14.0f, 25.8999996f, -35.0f, 59.5f,
                                63.7000046f, -84.0f, 140.0f, 315.0f, -616.0f, 1400.0f};
  const std::vector<float> cap30 = {0.0f, -0.0f, 7.0000001e-06f, -0.00210000016f, 0.0699998736f,
                                    -0.699872971f, 1.39898455f, 1.74732006f, 1.74801779f,
                                    -1.81777048f, 3.4842062f, -5.19705439f, 6.87566996f,
                                    -10.0912657f, 13.0650635f, 20.9391327f, -24.6960201f,
                                    28.8849297f, 29.1534061f, -29.778944f, 29.9946938f, 30.0f,
                                    -30.0f, 30.0f};
  const std::vector<float> cap50 = {0.0f, -0.0f, 6.99999964e-06f, -0.00210000016f,
                                    0.0699999481f, -0.699954271f, 1.39963424f, 1.74858665f,
                                    1.7492857f, -1.81919658f, 3.4942944f, -5.23079062f,
                                    6.95462227f, -10.3483248f, 13.6452541f, 23.8077469f,
                                    -30.2183895f, 41.5289421f, 42.7439041f, -46.6430779f,
                                    49.6315765f, 49.9996643f, -50.0f, 50.0f};
  const Tensor t = Tensor::FromVector<float>({2, 12}, x).value();
  for (const auto& [cap, torch] : {std::pair{30.0, &cap30}, std::pair{50.0, &cap50}}) {
    SCOPED_TRACE(cap);
    const auto expect = [&](const Tensor& got) {
      const std::vector<float> g = got.ToVector<float>();
      ASSERT_EQ(g.size(), torch->size());
      for (size_t i = 0; i < g.size(); ++i) {
        EXPECT_NEAR(g[i], (*torch)[i], 1e-6f * std::abs((*torch)[i]) + 1e-12f) << "x = " << x[i];
      }
    };
    expect(ops::SoftCap(t, cap).value());
    expect(ops::SoftCap(Value(t), cap).value().local());
    auto res = RunOp({2}, {{t, Pl("S(1)"), 0}},
                     Single([cap](const std::vector<DTensor>& in) { return SoftCap(in[0], cap); }));
    ASSERT_TRUE(res.ok()) << res.status();
    for (const RankResult& r : *res) {
      EXPECT_EQ(r.decision.num_redistributed(), 0);
      expect(r.full[0]);
    }
  }
  // bf16: computed in f32 from the bf16 inputs, rounded once.
  const Tensor xb = t.To(DType::kBF16).value();
  const Tensor b = ops::SoftCap(xb, 30.0).value();
  EXPECT_EQ(b.dtype(), DType::kBF16);
  EXPECT_EQ(b.ToDoubles(), ops::SoftCap(xb.To(DType::kF32).value(), 30.0)
                               .value().To(DType::kBF16).value().ToDoubles());
}

TEST(DopsPointwise, SoftCapErrors) {
  const Tensor x = Tensor::Zeros({2, 3}, DType::kF32).value();
  for (const double cap : {0.0, -1.0, std::nan(""), static_cast<double>(INFINITY)}) {
    const absl::Status s = ops::SoftCap(x, cap).status();
    EXPECT_TRUE(absl::StrContains(s.message(), "SoftCap")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "expected a finite number > 0")) << s;
  }
  const absl::Status s = ops::SoftCap(Tensor::Zeros({2}, DType::kI32).value(), 30.0).status();
  EXPECT_TRUE(absl::StrContains(s.message(), "SoftCap: x i32")) << s;
  EXPECT_FALSE(ops::SoftCap(Tensor(), 30.0).ok());
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
