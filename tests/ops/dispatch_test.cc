// The dispatcher: the strategy cache (scalars in the key: PyTorch #147180), strategy choice on
// abstract meshes, error messages naming the op and the placements, ranks outside the mesh.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "dtensor/ops/dispatch.h"
#include "dtensor/tests/ops/ops_test_util.h"
#include "dtensor/mesh/comm_counter.h"

namespace dt::ops::internal::testing {
namespace {

// PyTorch #147180: sharding propagation of `scalar * dtensor` on a Partial input was cached without
// the scalar, so -5 * x reused the decision made for 2 * x. Here a negative factor turns P(max)
// into P(min) and a positive one keeps P(max): a decision reused across scalars would be wrong.
TEST(DopsDispatch, ScalarIsPartOfTheCacheKeyRegression147180) {
  const Tensor x = RandTensor({3, 5}, 4);
  for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kSum}) {
    std::vector<Arg> args = {{x, {Placement::Partial(op)}, 17}};
    auto res = RunOp({4}, args, [](const std::vector<DTensor>& in)
                                    -> absl::StatusOr<std::vector<DTensor>> {
      ClearDispatchCache();
      DT_ASSIGN_OR_RETURN(DTensor a, Mul(in[0], 2.0));
      DT_ASSIGN_OR_RETURN(DTensor b, Mul(in[0], -5.0));
      DT_ASSIGN_OR_RETURN(DTensor c, Add(in[0], 2.0));
      DT_ASSIGN_OR_RETURN(DTensor d, Add(in[0], -5.0));
      DT_ASSIGN_OR_RETURN(DTensor e, Mul(in[0], 2.0));  // a hit
      if (GetDispatchCacheStats().misses != 4 || GetDispatchCacheStats().hits != 1) {
        return absl::InternalError("expected 4 misses and 1 hit");
      }
      return std::vector<DTensor>{a, b, c, d, e};
    });
    ASSERT_TRUE(res.ok()) << res.status();
    // Values compare exactly (0 == -0: terms that cancel sum to +0).
    auto same = [](const Tensor& a, const Tensor& b) { return AllClose(a, b, 0, 0).ok(); };
    for (const RankResult& r : *res) {
      EXPECT_TRUE(same(r.full[0], ops::Mul(x, 2.0).value()));
      EXPECT_TRUE(same(r.full[1], ops::Mul(x, -5.0).value()));
      EXPECT_TRUE(same(r.full[2], ops::Add(x, 2.0).value()));
      EXPECT_TRUE(same(r.full[3], ops::Add(x, -5.0).value()));
      EXPECT_TRUE(same(r.full[4], ops::Mul(x, 2.0).value()));
      if (op == ReduceOp::kMax) {
        EXPECT_EQ(PlacementsToString(r.placements[0]), "[P(max)]");
        EXPECT_EQ(PlacementsToString(r.placements[1]), "[P(min)]");
      }
      EXPECT_EQ(r.comms.total(), 0);
    }
  }
}

TEST(DopsDispatch, SecondCallHitsTheCache) {
  const Tensor a = RandTensor({4, 6}, 1), b = RandTensor({4, 6}, 2);
  std::vector<Arg> args = {{a, Pl("S(0),R"), 0}, {b, Pl("S(0),R"), 0}};
  auto res = RunOp({2, 2}, args, [](const std::vector<DTensor>& in)
                                     -> absl::StatusOr<std::vector<DTensor>> {
    ClearDispatchCache();
    DT_ASSIGN_OR_RETURN(DTensor y, Add(in[0], in[1]));
    if (LastDecision().cache_hit) return absl::InternalError("first call hit");
    DT_ASSIGN_OR_RETURN(y, Add(in[0], in[1]));
    if (!LastDecision().cache_hit) return absl::InternalError("second call missed");
    return std::vector<DTensor>{y};
  });
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ((*res)[0].decision.ToString(),
            "Add: [S(0), R] [S(0), R] -> [S(0), R] [S(0), R] => [S(0), R], cost 0 us, cache hit");
}

// Strategy choice is pure: it runs on abstract meshes of any size.
OpCall Call(OpId op, std::vector<const DTensorSpec*> specs, Attrs attrs = {}) {
  OpCall c{op, {}, std::move(attrs)};
  c.inputs.assign(specs.begin(), specs.end());
  return c;
}

TEST(DopsDispatch, ChoosesByCostOnAbstractMeshes) {
  const DeviceMesh mesh = DeviceMesh::Abstract({8, 1024}, {"dp", "tp"}).value();
  const auto spec = [&](const char* pl, Shape shape) {
    return DTensorSpec::Create(mesh, Pl(pl), shape, DType::kBF16).value();
  };
  // Colwise then rowwise: nothing moves.
  const DTensorSpec x = spec("S(0),R", {64, 4096}), w_up = spec("R,S(0)", {16384, 4096});
  auto e = ChooseStrategy(Call(OpId::kLinear, {&x, &w_up, nullptr})).value();
  EXPECT_EQ(PlacementsToString(e->strategy.outputs[0]), "[S(0), S(1)]");
  EXPECT_EQ(e->cost_us, 0);
  const DTensorSpec h = spec("S(0),S(1)", {64, 16384}), w_down = spec("R,S(1)", {4096, 16384});
  e = ChooseStrategy(Call(OpId::kLinear, {&h, &w_down, nullptr})).value();
  EXPECT_EQ(PlacementsToString(e->strategy.outputs[0]), "[S(0), P(sum)]");
  // A replicated activation meets a row-split weight: slicing the activation locally beats
  // gathering 128 MiB of weight.
  const DTensorSpec xr = spec("S(0),R", {64, 16384});
  e = ChooseStrategy(Call(OpId::kLinear, {&xr, &w_down, nullptr})).value();
  EXPECT_EQ(PlacementsToString(e->strategy.inputs[0]), "[S(0), S(1)]");
  EXPECT_EQ(PlacementsToString(e->strategy.inputs[1]), "[R, S(1)]");
  // Silu of a Partial sum must reduce it first; a reduce_scatter is cheaper than an all_reduce.
  const DTensorSpec p = spec("S(0),P(sum)", {64, 4096});
  e = ChooseStrategy(Call(OpId::kUnary, {&p}, UnaryAttrs{ops::UnaryOp::kSilu}))
          .value();
  EXPECT_FALSE(e->strategy.inputs[0][1].is_partial());
  EXPECT_TRUE(e->strategy.inputs[0][1].is_any_shard());
}

// Runs `fn` on 4 threads with a (4,) mesh "tp" and returns the first error.
absl::Status OnTp4(const std::function<absl::Status(const DeviceMesh&)>& fn) {
  return World::RunThreads(4, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {4}, {"tp"}));
    return fn(mesh);
  }, Quick());
}

TEST(DopsDispatch, ErrorsNameTheOpAndThePlacements) {
  auto expect_error = [](const std::function<absl::Status(const DeviceMesh&)>& fn,
                         std::vector<std::string> parts) {
    const absl::Status st = OnTp4(fn);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    const std::string msg(st.message());
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
  };
  const Tensor a = RandTensor({4, 6}, 1), w = RandTensor({3, 5}, 2);
  // The same for a function of x: `a` as [S(0)] on the mesh.
  auto expect_error_on_x = [&](const std::function<absl::Status(const DTensor&)>& fn,
                               std::vector<std::string> parts) {
    expect_error([&](const DeviceMesh& m) -> absl::Status {
      DT_ASSIGN_OR_RETURN(DTensor x, DTensor::Distribute(a, m, Pl("S(0)"), std::nullopt));
      return fn(x);
    }, std::move(parts));
  };
  // Shapes.
  expect_error([&](const DeviceMesh& m) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DTensor x, DTensor::Distribute(a, m, Pl("S(0)"), std::nullopt));
    DT_ASSIGN_OR_RETURN(DTensor y, DTensor::Distribute(w, m, Pl("S(1)"), std::nullopt));
    return Linear(x, y).status();
  }, {"Linear: in features differ", "x f32[4, 6]", "w f32[3, 5]"});
  // Meshes.
  expect_error([&](const DeviceMesh& m) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh m2, InitDeviceMesh(m.world(), {2, 2}, {"dp", "tp"}));
    DT_ASSIGN_OR_RETURN(DTensor x, DTensor::Distribute(a, m, Pl("S(0)"), std::nullopt));
    DT_ASSIGN_OR_RETURN(DTensor y, DTensor::Distribute(a, m2, Pl("R,S(1)"), std::nullopt));
    return Add(x, y).status();
  }, {"Add: a [S(0)] on mesh(tp=4) and b [R, S(1)] on mesh(dp=2, tp=2): inputs are on different "
      "meshes"});
  // Undefined inputs, dims, views, permutations, squeezes.
  expect_error_on_x([](const DTensor& x) { return Matmul(x, DTensor()).status(); },
                    {"Matmul: b is undefined"});
  expect_error_on_x([](const DTensor& x) { return Softmax(x, 2).status(); },
                    {"Softmax: dim 2 is out of range"});
  expect_error_on_x([](const DTensor& x) { return View(x, {5, 5}).status(); },
                    {"View: ", "cannot view as [5, 5]"});
  expect_error_on_x([](const DTensor& x) { return Permute(x, {0, 0}).status(); },
                    {"Permute: [0, 0] is not a permutation", "[S(0)] on mesh(tp=4)"});
  expect_error_on_x([](const DTensor& x) { return Squeeze(x, 1).status(); },
                    {"Squeeze: x f32[4, 6]: dim 1 has size 6, not 1"});
  expect_error([&](const DeviceMesh& m) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DTensor x, DTensor::Distribute(a, m, Pl("S(0)"), std::nullopt));
    DT_ASSIGN_OR_RETURN(Tensor i, Tensor::Zeros({2}, DType::kI64));
    DT_ASSIGN_OR_RETURN(DTensor ids, DTensor::Distribute(i, m, Pl("R"), std::nullopt));
    return Add(x, ids).status();
  }, {"Add: a f32[4, 6] and b i64[2]: dtypes differ"});
}

// Ranks outside the mesh get outputs with the right specs and empty pieces, and communicate
// nothing; the members compute as usual.
TEST(DopsDispatch, RanksOutsideTheMesh) {
  const Tensor a = RandTensor({4, 6}, 1), w = RandTensor({8, 6}, 2);
  std::mutex mu;
  std::vector<std::string> seen(4);
  const absl::Status st = World::RunThreads(4, [&](World& world) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, DeviceMesh::Create(world.shared_from_this(), {2}, {0, 1}));
    DT_ASSIGN_OR_RETURN(DTensor x, DTensor::Distribute(a, mesh, Pl("R"), std::nullopt));
    DT_ASSIGN_OR_RETURN(DTensor y, DTensor::Distribute(w, mesh, Pl("S(0)"), std::nullopt));
    CommCounter counter;
    DT_ASSIGN_OR_RETURN(DTensor z, Linear(x, y));
    DT_ASSIGN_OR_RETURN(DTensor s, Sum(z, 1));
    DT_ASSIGN_OR_RETURN(Tensor full, s.FullTensor());
    std::lock_guard<std::mutex> lock(mu);
    seen[world.rank()] = absl::StrCat(s.spec().ToString(), " local ", ShapeToString(s.ToLocal().shape()),
                                      " comms ", counter.counts().ToString(), " full ",
                                      ShapeToString(full.shape()));
    return absl::OkStatus();
  }, Quick());
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(seen[0], "[P(sum)] on mesh(d0=2) local [4] comms all_reduce=1 full [4]");
  EXPECT_EQ(seen[2], "[P(sum)] on mesh(d0=2) local [0] comms none full [0]");
  EXPECT_EQ(seen[3], seen[2]);
}

}  // namespace
}  // namespace dt::ops::internal::testing
