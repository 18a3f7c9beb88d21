// Shape ops on DTensors (View/Reshape/Flatten, Transpose/Permute, Unsqueeze/Squeeze, Cat,
// Split/Chunk) against the same op on the full tensors, bitwise; uneven shards included. The view
// regressions (PyTorch #179502: a sharded view gave wrong numbers) check that a shard is kept only
// when every rank's piece holds the same elements before and after.
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "absl/strings/match.h"
#include "dtensor/ops/value_ops.h"
#include "dtensor/ops/view_math.h"
#include "rapidcheck/gtest.h"
#include "dtensor/tests/ops/ops_test_util.h"

namespace dt::ops::internal::testing {
namespace {

// A random shape with the same number of elements: the dims' factors in order, regrouped.
Shape GenViewOf(const Shape& in) {
  std::vector<int64_t> factors;
  for (int64_t n : in) {
    if (n <= 1) {
      factors.push_back(n);
      continue;
    }
    for (int64_t f = 2; n > 1;) {
      if (n % f == 0) {
        factors.push_back(f);
        n /= f;
      } else {
        ++f;
      }
    }
  }
  Shape out;
  int64_t cur = 1;
  for (size_t i = 0; i < factors.size(); ++i) {
    cur *= factors[i];
    if (i + 1 == factors.size() || Coin()) {
      out.push_back(cur);
      cur = 1;
      if (U(0, 5) == 0) out.push_back(1);
    }
  }
  return out;
}

OpFn ViewOp(Shape shape) {
  return Single([shape](const std::vector<DTensor>& in) { return View(in[0], shape); });
}

RC_GTEST_PROP(DopsShape, ViewMatchesLocal, ()) {
  const auto mesh = GenMesh();
  const Shape in = GenShape(U(1, 4), 1, 8);
  Shape out = GenViewOf(in);
  const Tensor full = GenTensor(in);
  const Tensor want = full.Reshape(out).value();
  if (Coin()) out[U(0, static_cast<int>(out.size()))] = -1;
  std::vector<Arg> args = {MakeArg(full, GenPlacements(mesh, static_cast<int>(in.size()), true,
                                                       GenPartialOp()))};
  CheckOp(mesh, args, ViewOp(out), {want}, /*exact=*/true);
}

// Views whose groups only merge or split evenly divisible outer dims keep the shard.
RC_GTEST_PROP(DopsShape, EvenViewsNeedNoRedistribution, ()) {
  const std::vector<int64_t> mesh = {Pick<int64_t>(2, 4)};
  const int64_t k = mesh[0];
  const int64_t b = U<int64_t>(1, 3), s = U<int64_t>(1, 4), h = k * U<int64_t>(1, 3),
                d = U<int64_t>(1, 4);
  const Tensor full = GenTensor({b, s, h * d});
  // [B, S, H*D] S(2) -> [B, S, H, D] S(2), and back.
  std::vector<Arg> args = {MakeArg(full, {Placement::Shard(2)})};
  CheckOp(mesh, args, ViewOp({b, s, h, d}), {full.Reshape({b, s, h, d}).value()}, true, true);
  args[0] = MakeArg(full.Reshape({b, s, h, d}).value(), {Placement::Shard(2)});
  CheckOp(mesh, args, ViewOp({b, s, h * d}), {full}, true, true);
  // [k*m, n] S(0) -> [k*m*n] S(0)
  const int64_t m = U<int64_t>(1, 3), n = U<int64_t>(1, 4);
  const Tensor x = GenTensor({k * m, n});
  args[0] = MakeArg(x, {Placement::Shard(0)});
  CheckOp(mesh, args, ViewOp({k * m * n}), {x.Reshape({k * m * n}).value()}, true, true);
}

// PyTorch #179502: keeping Shard through a view of an unevenly sharded dim gives wrong numbers.
// Each case would be wrong if the shard were kept; the op must move data and stay exact.
TEST(DopsShape, UnevenShardedViewRegression179502) {
  struct Case {
    Shape in, out;
    int64_t k;
    int dim;
  };
  const Case cases[] = {
      {{5, 4}, {20}, 4, 0},         // rows [2, 2, 1, 0] are elements [8, 8, 4, 0], not [5, 5, 5, 5]
      {{4, 6}, {4, 2, 3}, 4, 1},    // cols [2, 2, 2, 0] vs 2 groups of 3
      {{7, 3}, {21}, 2, 0},         // rows [4, 3] are elements [12, 9], chunk of 21 is [11, 10]
      {{6, 5}, {2, 15}, 4, 0},      // rows [2, 2, 2, 0] vs [1, 1, 0, 0] groups of 3 rows
      {{3, 10}, {3, 5, 2}, 4, 1},   // cols [3, 3, 3, 1] vs [2, 2, 1, 0] pairs
      {{2, 9}, {18}, 2, 1},         // an inner dim of a merged group stays split: must gather
  };
  for (const Case& c : cases) {
    const Tensor full = RandTensor(c.in, 11);
    const Tensor want = full.Reshape(c.out).value();
    std::vector<Arg> args = {{full, {Placement::Shard(c.dim)}, 0}};
    auto res = RunOp({c.k}, args, ViewOp(c.out));
    ASSERT_TRUE(res.ok()) << res.status();
    for (const RankResult& r : *res) {
      EXPECT_TRUE(Equal(r.full[0], want)) << ShapeToString(c.in) << " -> " << ShapeToString(c.out)
                                          << ": " << r.decision.ToString();
      EXPECT_GT(r.decision.num_redistributed(), 0) << r.decision.ToString();
    }
    // The check that refuses keeping the shard (on the lead output dim of its group), directly.
    for (const ViewGroup& g : ViewGroups(c.in, c.out)) {
      if (c.dim < g.in_begin || c.dim >= g.in_end) continue;
      EXPECT_FALSE(ViewPiecesMatch(c.in, c.out, {c.k}, {Placement::Shard(c.dim)},
                                   {Placement::Shard(g.out_lead)})
                       .ok());
    }
  }
}

TEST(DopsShape, ViewGroups) {
  auto g = ViewGroups({2, 3, 4}, {6, 4});
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].in_begin, 0);
  EXPECT_EQ(g[0].in_end, 2);
  EXPECT_EQ(g[0].out_end, 1);
  EXPECT_EQ(g[0].in_lead, 0);
  EXPECT_EQ(g[0].in_inner, 3);
  EXPECT_EQ(g[1].in_lead, 2);
  EXPECT_EQ(g[1].out_lead, 1);
  g = ViewGroups({1, 4}, {4, 1});
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].in_lead, 1);
  EXPECT_EQ(g[0].out_lead, 0);
  EXPECT_EQ(g[1].in_begin, 2);
  EXPECT_EQ(g[1].out_lead, -1);
  // Evenly divisible outer dims keep their shard, on every rank.
  EXPECT_TRUE(ViewPiecesMatch({8, 6}, {4, 2, 6}, {4}, Pl("S(0)"), Pl("S(0)")).ok());
  EXPECT_TRUE(ViewPiecesMatch({8, 6}, {4, 2, 6}, {2, 2}, Pl("S(0),S(0)"), Pl("S(0),S(0)")).ok());
}

RC_GTEST_PROP(DopsShape, PermuteAndTransposeNeverMove, ()) {
  const auto mesh = GenMesh();
  const Shape in = GenShape(U(1, 5), 0, 5);
  const int r = static_cast<int>(in.size());
  std::vector<int64_t> perm(static_cast<size_t>(r));
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = r - 1; i > 0; --i) std::swap(perm[i], perm[U(0, i + 1)]);
  const bool transpose = Coin();
  const int64_t d0 = U(0, r), d1 = U(0, r);
  const Tensor full = GenTensor(in);
  const Tensor want = transpose ? full.Transpose(d0, d1).value() : full.Permute(perm).value();
  std::vector<Arg> args = {MakeArg(full, GenPlacements(mesh, r, true, GenPartialOp()))};
  CheckOp(mesh, args, Single([=](const std::vector<DTensor>& in) {
            return transpose ? Transpose(in[0], d0, d1) : Permute(in[0], perm);
          }),
          {want}, /*exact=*/true, /*no_moves=*/true);
}

RC_GTEST_PROP(DopsShape, UnsqueezeSqueezeMatchLocal, ()) {
  const auto mesh = GenMesh();
  Shape in = GenShape(U(1, 4), 0, 5);
  const int r = static_cast<int>(in.size());
  const bool squeeze = Coin();
  const int dim = squeeze ? U(0, r) : U(0, r + 1);
  if (squeeze) in[dim] = 1;
  const Tensor full = GenTensor(in);
  const Tensor want = squeeze ? full.Squeeze(dim).value() : full.Unsqueeze(dim).value();
  std::vector<Arg> args = {MakeArg(full, GenPlacements(mesh, r, true, GenPartialOp()))};
  const bool no_moves = !squeeze || !AnyOn(mesh, args[0].placements, [&](const Placement& p) {
    return p.is_any_shard(dim);
  });
  CheckOp(mesh, args, Single([=](const std::vector<DTensor>& in) {
            return squeeze ? Squeeze(in[0], dim) : Unsqueeze(in[0], dim);
          }),
          {want}, /*exact=*/true, no_moves);
}

// Note [Plain local views skip the dispatch] (ops/value_ops.cc): a plain local float tensor's
// views are its own (the same shape, strides and storage as Tensor's), and what the tensor refuses
// still gets the op's error.
TEST(DopsShape, PlainLocalViewsAreTheTensorsAndKeepTheOpsErrors) {
  const Tensor x = Tensor::Randn({2, 3, 4}, 1).value();
  const Value v(x);
  const Value r = ops::Reshape(v, {6, -1}).value();
  EXPECT_EQ(r.shape(), (Shape{6, 4}));
  EXPECT_EQ(r.local().raw_data(), x.raw_data());
  const Value t = ops::Transpose(v, 0, 2).value();
  EXPECT_EQ(t.local().strides(), x.Transpose(0, 2).value().strides());
  EXPECT_EQ(ops::Transpose(v, -1, 0).value().shape(), (Shape{4, 3, 2}));  // through the op
  EXPECT_EQ(ops::Unsqueeze(v, 3).value().shape(), (Shape{2, 3, 4, 1}));
  const absl::Status bad = ops::Reshape(v, {5, -1}).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_TRUE(absl::StrContains(bad.message(), "Reshape")) << bad;
  const absl::Status out_of_range = ops::Transpose(v, 0, 7).status();
  EXPECT_TRUE(absl::StrContains(out_of_range.message(), "Transpose")) << out_of_range;
}

RC_GTEST_PROP(DopsShape, CatMatchesLocal, ()) {
  const auto mesh = GenMesh();
  const int n = U(1, 4);
  Shape base = GenShape(U(1, 4), 1, 4);
  const int dim = U(0, static_cast<int>(base.size()));
  const ReduceOp op = GenPartialOp();
  std::vector<Arg> args;
  std::vector<Tensor> fulls;
  for (int j = 0; j < n; ++j) {
    Shape s = base;
    s[dim] = U<int64_t>(0, 5);
    args.push_back(MakeArg(GenTensor(s), GenPlacements(mesh, static_cast<int>(s.size()), true, op)));
    fulls.push_back(args.back().full);
  }
  const Tensor want = ops::Cat(fulls, dim).value();
  CheckOp(mesh, args, Single([dim](const std::vector<DTensor>& in) { return Cat(in, dim); }),
          {want}, /*exact=*/true);
}

// Inputs sharded alike off the cat dim, or along it by one mesh dim (the result is the interleaved
// shard of the inputs' blocks): no communication.
RC_GTEST_PROP(DopsShape, CatOfFittingLayoutsNeedsNoRedistribution, ()) {
  const auto mesh = GenMesh();
  const int n = U(1, 4);
  Shape base = GenShape(U(1, 4), 1, 5);
  const int r = static_cast<int>(base.size());
  const int dim = U(0, r);
  Placements pl = GenPlacements(mesh, r, true, GenPartialOp());
  bool along = false;
  for (size_t i = 0; i < mesh.size(); ++i) {
    if (!pl[i].is_any_shard(dim)) continue;
    if (along || mesh[i] == 1) pl[i] = Placement::Replicate();
    else pl[i] = Placement::Shard(dim);
    along = along || pl[i].is_any_shard(dim);
  }
  std::vector<Arg> args;
  std::vector<Tensor> fulls;
  for (int j = 0; j < n; ++j) {
    Shape s = base;
    s[dim] = U<int64_t>(0, 6);
    args.push_back(MakeArg(GenTensor(s), pl));
    fulls.push_back(args.back().full);
  }
  const Tensor want = ops::Cat(fulls, dim).value();
  CheckOp(mesh, args, Single([dim](const std::vector<DTensor>& in) { return Cat(in, dim); }),
          {want}, /*exact=*/true, /*no_moves=*/true);
}

// A random partition of n into `parts` sizes (zeros allowed).
std::vector<int64_t> GenSizes(int64_t n, int parts) {
  std::vector<int64_t> sizes;
  int64_t left = n;
  for (int i = 0; i + 1 < parts; ++i) {
    sizes.push_back(U<int64_t>(0, left + 1));
    left -= sizes.back();
  }
  sizes.push_back(left);
  return sizes;
}

RC_GTEST_PROP(DopsShape, SplitAndChunkMatchLocal, ()) {
  const auto mesh = GenMesh();
  const Shape in = GenShape(U(1, 4), 0, 8);
  const int r = static_cast<int>(in.size());
  const int dim = U(0, r);
  const bool chunk = Coin();
  const int64_t chunks = U<int64_t>(1, 5);
  const std::vector<int64_t> sizes = GenSizes(in[dim], U(1, 4));
  Placements pl = GenPlacements(mesh, r, true, GenPartialOp());
  // Sometimes an interleaved shard of the split dim with random blocks (one mesh dim).
  if (Coin()) {
    const int i = U(0, static_cast<int>(mesh.size()));
    for (Placement& p : pl) {
      if (p.is_any_shard(dim)) p = Placement::Replicate();
    }
    const std::vector<int64_t> blocks = GenSizes(in[dim], U(1, 4));
    pl[i] = Placement::BlockShard(dim, blocks);
  }
  const Tensor full = GenTensor(in);
  const std::vector<Tensor> want =
      chunk ? ops::Chunk(full, chunks, dim).value() : ops::Split(full, sizes, dim).value();
  std::vector<Arg> args = {MakeArg(full, pl)};
  // Off the split dim, every layout (Partial included) passes through.
  const bool no_moves =
      !AnyOn(mesh, pl, [&](const Placement& p) { return p.is_any_shard(dim); });
  CheckOp(mesh, args,
          [=](const std::vector<DTensor>& in) {
            return chunk ? Chunk(in[0], chunks, dim) : Split(in[0], sizes, dim);
          },
          want, /*exact=*/true, no_moves);
}

// Split at block boundaries of an interleaved shard: no communication.
RC_GTEST_PROP(DopsShape, SplitAtBlockBoundariesNeedsNoRedistribution, ()) {
  const std::vector<int64_t> mesh = {U<int64_t>(2, 5)};
  const int nb = U(1, 6);
  std::vector<int64_t> blocks;
  for (int b = 0; b < nb; ++b) blocks.push_back(U<int64_t>(0, 7));
  // Pieces are runs of whole blocks.
  std::vector<int64_t> sizes;
  int64_t acc = 0;
  for (int b = 0; b < nb; ++b) {
    acc += blocks[b];
    if (b + 1 == nb || Coin()) {
      sizes.push_back(acc);
      acc = 0;
    }
  }
  const int64_t n = std::accumulate(blocks.begin(), blocks.end(), int64_t{0});
  const Tensor full = GenTensor({3, n});
  std::vector<Arg> args = {MakeArg(full, {Placement::BlockShard(1, blocks)})};
  CheckOp(mesh, args, [=](const std::vector<DTensor>& in) { return Split(in[0], sizes, 1); },
          ops::Split(full, sizes, 1).value(), /*exact=*/true, /*no_moves=*/true);
}

// Flux2's single-stream block: the fused projection output [T, 3D + 2M] is _S(1, [D, D, D, M, M]);
// split into qkv and mlp, qkv chunked into q, k, v, heads viewed out: all local.
TEST(DopsShape, Flux2FusedSplitIsLocal) {
  const int64_t t = 3, heads = 4, hd = 2, d = heads * hd, m = 6;
  const Tensor p = RandTensor({t, 3 * d + 2 * m}, 5);
  std::vector<Arg> args = {{p, {Placement::BlockShard(1, {d, d, d, m, m})}, 0}};
  auto res = RunOp({2}, args, [&](const std::vector<DTensor>& in)
                                  -> absl::StatusOr<std::vector<DTensor>> {
    DT_ASSIGN_OR_RETURN(std::vector<DTensor> parts, Split(in[0], {3 * d, 2 * m}, -1));
    DT_ASSIGN_OR_RETURN(std::vector<DTensor> qkv, Chunk(parts[0], 3, -1));
    DT_ASSIGN_OR_RETURN(DTensor q, View(qkv[0], {t, heads, hd}));
    DT_ASSIGN_OR_RETURN(std::vector<DTensor> mlp, Chunk(parts[1], 2, -1));
    return std::vector<DTensor>{q, qkv[2], mlp[1]};
  });
  ASSERT_TRUE(res.ok()) << res.status();
  const auto parts = ops::Split(p, {3 * d, 2 * m}, -1).value();
  const auto qkv = ops::Chunk(parts[0], 3, -1).value();
  const auto mlp = ops::Chunk(parts[1], 2, -1).value();
  for (const RankResult& r : *res) {
    EXPECT_EQ(r.comms.total(), 0);
    EXPECT_TRUE(Equal(r.full[0], qkv[0].Reshape({t, heads, hd}).value()));
    EXPECT_TRUE(Equal(r.full[1], qkv[2]));
    EXPECT_TRUE(Equal(r.full[2], mlp[1]));
    EXPECT_EQ(PlacementsToString(r.placements[0]), "[S(1)]");
    EXPECT_EQ(PlacementsToString(r.placements[2]), "[S(1)]");
  }
}

}  // namespace
}  // namespace dt::ops::internal::testing
