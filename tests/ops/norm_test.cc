// RmsNorm, LayerNorm and ApplyRotary on DTensors against the local ops on the full tensors: the
// normalised (rotated) last dim must be whole, every other dim may stay sharded.
#include <vector>

#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "dtensor/tests/ops/ops_test_util.h"

namespace dt::ops::internal::testing {
namespace {

RC_GTEST_PROP(DopsNorm, NormsMatchLocal, ()) {
  const auto mesh = GenMesh();
  const bool layer = Coin();
  const Shape shape = GenShape(U(1, 4), 1, 6);
  const int r = static_cast<int>(shape.size());
  const bool weight = Coin(), bias = layer && Coin();
  const double eps = Pick(1e-6, 1e-5, 0.1);
  std::vector<Arg> args = {MakeArg(GenTensor(shape), GenPlacements(mesh, r, true, GenPartialOp()))};
  if (weight) args.push_back(MakeArg(GenTensor({shape.back()}), GenPlacements(mesh, 1, false)));
  if (bias) args.push_back(MakeArg(GenTensor({shape.back()}), GenPlacements(mesh, 1, false)));
  const Tensor w = weight ? args[1].full : Tensor();
  const Tensor b = bias ? args.back().full : Tensor();
  const Tensor want = layer ? ops::LayerNorm(args[0].full, w, b, eps).value()
                            : ops::RmsNorm(args[0].full, w, eps).value();
  bool no_moves = !AnyOn(mesh, args[0].placements, [&](const Placement& p) {
    return p.is_partial() || p.is_any_shard(r - 1);
  });
  for (size_t j = 1; j < args.size(); ++j) {
    no_moves = no_moves && !AnyOn(mesh, args[j].placements, [](const Placement& p) {
      return !p.is_replicate();
    });
  }
  CheckOp(mesh, args, Single([=](const std::vector<DTensor>& in) {
            const DTensor wd = weight ? in[1] : DTensor();
            const DTensor bd = bias ? in.back() : DTensor();
            return layer ? LayerNorm(in[0], wd, bd, eps) : RmsNorm(in[0], wd, eps);
          }),
          {want}, /*exact=*/false, no_moves);
}

RC_GTEST_PROP(DopsNorm, RotaryMatchesLocal, ()) {
  const auto mesh = GenMesh();
  const auto style = Pick(ops::RotaryStyle::kHalf, ops::RotaryStyle::kInterleaved);
  const int64_t b = U<int64_t>(1, 3), h = U<int64_t>(1, 5), s = U<int64_t>(1, 6),
                d = 2 * U<int64_t>(1, 4);
  const Shape x = {b, h, s, d};
  const Shape cs = Coin() ? Shape{s, d} : Shape{b, 1, s, d};
  const bool fits = Coin();
  Placements px = GenPlacements(mesh, 4, true, GenPartialOp(false));
  Placements pc = GenPlacements(mesh, static_cast<int>(cs.size()), false);
  if (fits) {
    // x sharded on non-last dims (or Partial), cos/sin sharded alike where they have the dim.
    const int off = 4 - static_cast<int>(cs.size());
    for (size_t i = 0; i < mesh.size(); ++i) {
      if (px[i].is_any_shard(3)) px[i] = Placement::Replicate();
      const int dc = px[i].is_any_shard() ? px[i].dim() - off : -1;
      pc[i] = dc >= 0 && cs[dc] == x[px[i].dim()] ? px[i].WithDim(dc) : Placement::Replicate();
    }
  }
  std::vector<Arg> args = {MakeArg(GenTensor(x), px), MakeArg(GenTensor(cs, false), pc),
                           MakeArg(GenTensor(cs, false), pc)};
  const Tensor want = ops::ApplyRotary(args[0].full, args[1].full, args[2].full, style).value();
  CheckOp(mesh, args, Single([style](const std::vector<DTensor>& in) {
            return ApplyRotary(in[0], in[1], in[2], style);
          }),
          {want}, /*exact=*/false, /*no_moves=*/fits);
}

}  // namespace
}  // namespace dt::ops::internal::testing
