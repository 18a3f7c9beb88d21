// DTensor API and Redistribute on the threads backend: properties over random meshes, shapes,
// dtypes and placements (each failure shrinks to a one-line `dtensor verify` command), and the
// API's error paths.
#include <algorithm>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "dtensor/dtensor/dtensor.h"
#include "dtensor/dtensor/verify.h"
#include "dtensor/mesh/comm_counter.h"
#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"

namespace dt {
namespace {

WorldOptions Quick() {
  WorldOptions o;
  o.timeout = std::chrono::seconds(20);
  return o;
}

Placements Pl(const char* text) { return ParsePlacements(text).value(); }

// Runs `body` on every rank of a thread world the size of the mesh `shape` (dims `names`, default
// d0, d1, ...), under Quick(); expects every rank to return OK.
void ExpectOkOnMesh(const std::vector<int64_t>& shape, const std::vector<std::string>& names,
                    const std::function<absl::Status(World&, const DeviceMesh&)>& body) {
  int ranks = 1;
  for (int64_t d : shape) ranks *= static_cast<int>(d);
  const absl::Status s = World::RunThreads(ranks, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), shape, names));
    return body(w, mesh);
  }, Quick());
  EXPECT_TRUE(s.ok()) << s;
}

// Runs VerifyRedistribute on the threads backend; "" when every rank matches, else the errors.
std::string RunVerify(const VerifyRequest& req) {
  int64_t n = 1;
  for (int64_t s : req.mesh) n *= s;
  std::mutex mu;
  std::string errors;
  absl::Status s = World::RunThreads(static_cast<int>(n), [&](World& w) -> absl::Status {
    auto report = VerifyRedistribute(w.shared_from_this(), req);
    std::lock_guard<std::mutex> lock(mu);
    if (!report.ok()) {
      absl::StrAppend(&errors, "rank ", w.rank(), ": ", report.status().ToString(), "\n");
    } else {
      for (const std::string& e : report->errors) absl::StrAppend(&errors, e, "\n");
    }
    return absl::OkStatus();
  }, Quick());
  if (!s.ok()) absl::StrAppend(&errors, s.ToString());
  return errors;
}

// ---- generators --------------------------------------------------------------------------------

std::vector<int64_t> GenMesh() {
  const int ndim = *rc::gen::inRange(1, 4);
  std::vector<int64_t> mesh;
  int64_t total = 1;
  for (int i = 0; i < ndim; ++i) {
    const int64_t max = 8 / total;
    const int64_t k = *rc::gen::inRange<int64_t>(1, std::min<int64_t>(max, 4) + 1);
    mesh.push_back(k);
    total *= k;
  }
  return mesh;
}

// One placement per mesh dim; Partial ops share one op (or mix sum with avg). Block lists are
// drawn only where the dim they split has one size on every rank.
Placements GenPlacements(const std::vector<int64_t>& mesh, const Shape& shape, ReduceOp op,
                         bool allow_partial) {
  Placements ps;
  const int ndim = static_cast<int>(shape.size());
  for (size_t i = 0; i < mesh.size(); ++i) {
    const int kind = *rc::gen::inRange(0, allow_partial ? 6 : 5);
    const int d = *rc::gen::inRange(0, ndim);
    if (kind == 0) {
      ps.push_back(Placement::Replicate());
    } else if (kind == 1) {
      ps.push_back(Placement::Shard(d));
    } else if (kind == 2) {
      // A unit shard (Note [Unit shards]) where every size the dim can have is whole units.
      const auto sizes = PossibleShardSizes(shape, mesh, ps, d, static_cast<int>(i));
      const int64_t unit = *rc::gen::inRange<int64_t>(1, 4);
      bool whole = true;
      for (int64_t n : sizes) whole = whole && n % unit == 0;
      ps.push_back(whole ? Placement::Shard(d, unit) : Placement::Shard(d));
    } else if (kind == 3) {
      ps.push_back(Placement::StridedShard(d, *rc::gen::inRange<int64_t>(2, 4)));
    } else if (kind == 4) {
      const auto sizes = PossibleShardSizes(shape, mesh, ps, d, static_cast<int>(i));
      if (sizes.size() == 1) {
        // Split sizes[0] into 1..4 blocks.
        int64_t left = sizes[0];
        std::vector<int64_t> blocks;
        const int nb = *rc::gen::inRange(1, 5);
        for (int b = 0; b + 1 < nb; ++b) {
          const int64_t take = *rc::gen::inRange<int64_t>(0, left + 1);
          blocks.push_back(take);
          left -= take;
        }
        blocks.push_back(left);
        ps.push_back(Placement::BlockShard(d, blocks));
      } else {
        ps.push_back(Placement::Shard(d));
      }
    } else {
      const bool avg = op == ReduceOp::kSum && *rc::gen::arbitrary<bool>();
      ps.push_back(Placement::Partial(avg ? ReduceOp::kAvg : op));
    }
  }
  return ps;
}

// A destination reachable from `src`: no Shard -> Partial, no Partial(a) -> Partial(b).
Placements GenTarget(const std::vector<int64_t>& mesh, const Shape& shape, const Placements& src,
                     ReduceOp op) {
  Placements dst = GenPlacements(mesh, shape, op, true);
  for (size_t i = 0; i < dst.size(); ++i) {
    if (!dst[i].is_partial()) continue;
    if (src[i].is_any_shard()) dst[i] = Placement::Replicate();
    else if (src[i].is_partial()) dst[i] = src[i];
  }
  // A block list must fit the sizes its dim has under dst's own left dims; re-check by validating.
  auto m = DeviceMesh::Abstract(mesh);
  if (!DTensorSpec::Create(*m, dst, shape, DType::kF32).ok()) {
    for (Placement& p : dst) {
      if ((p.is_strided_shard() && !p.blocks().empty()) || p.unit() != 1) {
        p = Placement::Shard(p.dim());
      }
    }
  }
  return dst;
}

RC_GTEST_PROP(RedistributeProp, EveryRankMatchesDirectDistribution, ()) {
  VerifyRequest req;
  req.mesh = GenMesh();
  const int ndim = *rc::gen::inRange(1, 4);
  req.shape = *rc::gen::container<Shape>(ndim, rc::gen::inRange<int64_t>(0, 11));
  req.dtype = *rc::gen::element(DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64,
                                DType::kU8);
  const ReduceOp op =
      *rc::gen::element(ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProd);
  req.from = GenPlacements(req.mesh, req.shape, op, true);
  auto m = DeviceMesh::Abstract(req.mesh);
  RC_PRE(DTensorSpec::Create(*m, req.from, req.shape, req.dtype).ok());
  req.to = GenTarget(req.mesh, req.shape, req.from, op);
  req.seed = *rc::gen::inRange<uint64_t>(0, 1000);
  const std::string errors = RunVerify(req);
  if (!errors.empty()) {
    RC_FAIL(absl::StrCat("reproduce with: ", VerifyCommand(req), "\n", errors));
  }
}

// Note [Unit shards] in dtensor/placement.h, against a layout written out here rather than taken
// from the shard math: a dim of n whole units of u over k ranks, S(d,unit=u) on a 1-D mesh (or on
// one dim of a 2-D mesh, the other replicated or sharding another dim) gives rank r the rows of
// torch.chunk(units, k)[r]: c = ceil(n/k) units per rank, the last non-empty one short, the rest
// empty. Distributing to it, redistributing to it from a random layout and back, and gathering
// must all give that layout and the tensor back.
RC_GTEST_PROP(UnitShardProp, RedistributeRoundTripsEqualChunkOverUnits, ()) {
  const int64_t units = *rc::gen::inRange<int64_t>(0, 12);
  const int64_t unit = *rc::gen::inRange<int64_t>(1, 5);
  const int64_t cols = *rc::gen::inRange<int64_t>(1, 4);
  const int64_t k = *rc::gen::inRange<int64_t>(1, 6);
  const bool two_d = *rc::gen::arbitrary<bool>() && k <= 4;
  const std::vector<int64_t> mesh_shape =
      two_d ? std::vector<int64_t>{2, k} : std::vector<int64_t>{k};
  const Shape shape = {units * unit, cols};
  const Placement other = *rc::gen::element(Placement::Replicate(), Placement::Shard(1));
  Placements unit_pl = {Placement::Shard(0, unit)};
  if (two_d) unit_pl.insert(unit_pl.begin(), other);
  const Placements from = GenPlacements(mesh_shape, shape, ReduceOp::kSum, false);
  auto abstract = DeviceMesh::Abstract(mesh_shape);
  RC_PRE(DTensorSpec::Create(*abstract, from, shape, DType::kF32).ok());
  const std::string what = absl::StrCat(units, " units of ", unit, " x ", cols, " on mesh ",
                                        absl::StrJoin(mesh_shape, "x"), " from ",
                                        PlacementsToString(from), " to ",
                                        PlacementsToString(unit_pl));
  std::mutex mu;
  std::string errors;
  const absl::Status s = World::RunThreads(
      static_cast<int>(two_d ? 2 * k : k),
      [&](World& w) -> absl::Status {
        DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), mesh_shape, {}));
        DT_ASSIGN_OR_RETURN(Tensor full, VerifyTensor(shape, DType::kF32, 7));
        // This rank's rows of the unit shard, and its columns of the other mesh dim.
        const int64_t r = w.rank() % k, per = (units + k - 1) / k;
        const int64_t first = std::min(units, r * per), last = std::min(units, (r + 1) * per);
        DT_ASSIGN_OR_RETURN(Tensor want, full.Narrow(0, first * unit, (last - first) * unit));
        if (two_d && other.is_shard()) {
          const int64_t half = (cols + 1) / 2, c0 = std::min(cols, (w.rank() / k) * half);
          DT_ASSIGN_OR_RETURN(want, want.Narrow(1, c0, std::min(cols, c0 + half) - c0));
        }
        auto check = [&](const DTensor& x, absl::string_view how) {
          if (Equal(x.ToLocal(), want)) return;
          std::lock_guard<std::mutex> lock(mu);
          absl::StrAppend(&errors, "rank ", w.rank(), " ", how, ": got ",
                          x.ToLocal().ToString(), " want ", want.ToString(), "\n");
        };
        DT_ASSIGN_OR_RETURN(DTensor direct, DTensor::Distribute(full, mesh, unit_pl));
        check(direct, "Distribute");
        DT_ASSIGN_OR_RETURN(DTensor src, DTensor::Distribute(full, mesh, from));
        DT_ASSIGN_OR_RETURN(DTensor there, src.Redistribute(unit_pl));
        check(there, "Redistribute from the random layout");
        DT_ASSIGN_OR_RETURN(DTensor back, there.Redistribute(from));
        DT_ASSIGN_OR_RETURN(Tensor gathered, back.FullTensor());
        if (!Equal(back.ToLocal(), src.ToLocal()) || !Equal(gathered, full)) {
          std::lock_guard<std::mutex> lock(mu);
          absl::StrAppend(&errors, "rank ", w.rank(), ": the round trip back changed the tensor\n");
        }
        return absl::OkStatus();
      },
      Quick());
  RC_ASSERT(s.ok());
  if (!errors.empty()) RC_FAIL(absl::StrCat(what, "\n", errors));
}

// ---- examples and error paths ------------------------------------------------------------------

TEST(RedistributeTest, FusedBlockWeightGathersToCheckpointLayout) {
  // Flux2-style fused rows [q(4) | k(4) | v(4) | mlp_in(6) | mlp_gate(6)] on 4 tensor-parallel ranks:
  // every rank holds its slice of every block, and FullTensor returns the checkpoint rows in order.
  ExpectOkOnMesh({4}, {"tp"}, [](World& w, const DeviceMesh& mesh) -> absl::Status {
    DT_ASSIGN_OR_RETURN(Tensor full, Tensor::Arange(0, 24 * 2));
    DT_ASSIGN_OR_RETURN(full, full.View({24, 2}));
    const Placements fused = Pl("_S(0,[4,4,4,6,6])");
    DT_ASSIGN_OR_RETURN(DTensor x, DTensor::Distribute(full, mesh, fused));
    // Rank r holds q row r, k row 4+r, v row 8+r, mlp_in rows 12+2r..13+2r, mlp_gate 18+2r..19+2r.
    const int64_t r = w.rank();
    std::vector<int64_t> rows = {r, 4 + r, 8 + r};
    if (2 * r < 6) {
      for (int64_t b : {12, 18}) {
        rows.push_back(b + 2 * r);
        rows.push_back(b + 2 * r + 1);
      }
    }
    std::vector<double> want;
    for (int64_t row : rows) {
      want.push_back(2 * row);
      want.push_back(2 * row + 1);
    }
    if (x.ToLocal().ToDoubles() != want) return absl::InternalError(x.ToLocal().ToString());
    DT_ASSIGN_OR_RETURN(Tensor back, x.FullTensor());
    if (!Equal(back, full)) return absl::InternalError("gathered rows are permuted");
    // And to plain row shards with one all_to_all.
    CommCounter c;
    DT_ASSIGN_OR_RETURN(DTensor y, x.Redistribute(Pl("S(0)")));
    if (c.counts().ToString() != "all_to_all=1") return absl::InternalError(c.counts().ToString());
    DT_ASSIGN_OR_RETURN(Tensor y_full, y.FullTensor());
    if (!Equal(y_full, full)) return absl::InternalError("S(0) after all_to_all");
    return absl::OkStatus();
  });
}

TEST(RedistributeTest, UnevenMergedCollectives) {
  // 13 rows over (4, 2): nested chunking equals one flat chunk over 8 ranks, so the two gathers
  // (and the two reduce-scatters) run as one all_gather_v (reduce_scatter_v) on the flat group.
  ExpectOkOnMesh({4, 2}, {}, [](World& w, const DeviceMesh& mesh) -> absl::Status {
    DT_ASSIGN_OR_RETURN(Tensor full, Tensor::Arange(0, 26));
    DT_ASSIGN_OR_RETURN(full, full.View({13, 2}));
    DT_ASSIGN_OR_RETURN(DTensor x, DTensor::Distribute(full, mesh, Pl("S(0),S(0)")));
    CommCounter c;
    DT_ASSIGN_OR_RETURN(DTensor r, x.Redistribute(Pl("R,R")));
    if (c.counts().ToString() != "all_gather=1") return absl::InternalError(c.counts().ToString());
    if (!Equal(r.ToLocal(), full)) return absl::InternalError("merged all_gather");
    DT_ASSIGN_OR_RETURN(DTensor p, DTensor::FromLocal(full, mesh, Pl("P(sum),P(sum)")));
    CommCounter c2;
    DT_ASSIGN_OR_RETURN(DTensor q, p.Redistribute(Pl("S(0),S(0)")));
    if (c2.counts().ToString() != "reduce_scatter=1") return absl::InternalError(c2.counts().ToString());
    std::vector<double> v = full.ToDoubles();
    for (double& e : v) e *= 8;
    DT_ASSIGN_OR_RETURN(Tensor full8, Tensor::FromDoubles({13, 2}, v));
    DT_ASSIGN_OR_RETURN(DTensor want, DTensor::Distribute(full8, mesh, Pl("S(0),S(0)"), std::nullopt));
    if (!Equal(q.ToLocal(), want.ToLocal())) return absl::InternalError("merged reduce_scatter");
    return absl::OkStatus();
  });
}

TEST(RedistributeTest, FromLocalChecks) {
  ExpectOkOnMesh({2, 2}, {"dp", "tp"}, [](World& w, const DeviceMesh& mesh) -> absl::Status {
    const int64_t r = w.rank();
    // Uneven rows (5 over dp): without the global shape the layout is assumed even.
    DT_ASSIGN_OR_RETURN(Tensor local, Tensor::Full({r < 2 ? 3 : 2, 4}, 1.0));
    auto even = DTensor::FromLocal(local, mesh, Pl("S(0),R"), {.run_check = true});
    if (even.ok() || even.status().message().find("uneven layouts need the global shape") ==
                         absl::string_view::npos) {
      return absl::InternalError(absl::StrCat("even assumption: ", even.status().ToString()));
    }
    DT_ASSIGN_OR_RETURN(DTensor ok, DTensor::FromLocal(local, mesh, Pl("S(0),R"),
                                                       {.shape = Shape{5, 4}, .run_check = true}));
    DT_ASSIGN_OR_RETURN(Tensor full, ok.FullTensor());
    if (full.shape() != Shape{5, 4}) return absl::InternalError(full.Describe());
    // Replicate dims must agree: rank 3 holds different values.
    DT_ASSIGN_OR_RETURN(Tensor mine, Tensor::Full({r < 2 ? 3 : 2, 4}, r == 3 ? 2.0 : 1.0));
    auto bad = DTensor::FromLocal(mine, mesh, Pl("S(0),R"), {.shape = Shape{5, 4}, .run_check = true});
    if (bad.ok() || bad.status().message().find("Replicate mesh dim tp") == absl::string_view::npos) {
      return absl::InternalError(absl::StrCat("replicate check: ", bad.status().ToString()));
    }
    // dtypes must agree.
    DT_ASSIGN_OR_RETURN(Tensor typed, Tensor::Zeros({2, 2}, r == 1 ? DType::kBF16 : DType::kF32));
    auto mixed = DTensor::FromLocal(typed, mesh, Pl("R,R"), {.run_check = true});
    if (mixed.ok()) return absl::InternalError("mixed dtypes accepted");
    return absl::OkStatus();
  });
}

TEST(RedistributeTest, CreationEqualsDistribution) {
  ExpectOkOnMesh({3, 2}, {}, [](World& w, const DeviceMesh& mesh) -> absl::Status {
    const Shape shape = {7, 5};
    for (const char* p : {"S(0),S(1)", "_S(0,2),R", "P(sum),S(0)", "R,P(max)"}) {
      DT_ASSIGN_OR_RETURN(DTensor a, DTensor::Rand(shape, 42, mesh, Pl(p)));
      DT_ASSIGN_OR_RETURN(Tensor full, Tensor::Rand(shape, 42));
      DT_ASSIGN_OR_RETURN(DTensor b, DTensor::Distribute(full, mesh, Pl(p)));
      if (!Equal(a.ToLocal(), b.ToLocal())) return absl::InternalError(absl::StrCat("Rand ", p));
      DT_ASSIGN_OR_RETURN(DTensor o, DTensor::Ones(shape, mesh, Pl(p), DType::kI32));
      DT_ASSIGN_OR_RETURN(DTensor d, DTensor::Distribute(Tensor::Ones(shape, DType::kI32).value(), mesh, Pl(p)));
      if (!Equal(o.ToLocal(), d.ToLocal())) return absl::InternalError(absl::StrCat("Ones ", p));
      DT_ASSIGN_OR_RETURN(Tensor back, o.FullTensor());
      if (!Equal(back, Tensor::Ones(shape, DType::kI32).value())) {
        return absl::InternalError(absl::StrCat("Ones FullTensor ", p, ": ", back.ToString()));
      }
    }
    return absl::OkStatus();
  });
}

TEST(RedistributeTest, RvalueRedistributeReusesTheBuffer) {
  ExpectOkOnMesh({2}, {}, [](World& w, const DeviceMesh& mesh) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DTensor p, DTensor::Full({1024}, 1.0, mesh, Pl("P(max)")));
    const void* before = p.ToLocal().raw_data();
    DT_ASSIGN_OR_RETURN(DTensor r, std::move(p).Redistribute(Pl("R")));
    if (r.ToLocal().raw_data() != before) return absl::InternalError("all_reduce copied its input");
    DT_ASSIGN_OR_RETURN(DTensor q, DTensor::Full({1024}, 1.0, mesh, Pl("P(max)")));
    DT_ASSIGN_OR_RETURN(DTensor r2, q.Redistribute(Pl("R")));
    if (r2.ToLocal().raw_data() == q.ToLocal().raw_data()) return absl::InternalError("lvalue modified");
    return absl::OkStatus();
  });
}

TEST(RedistributeTest, RanksOutsideTheMeshHoldNothing) {
  const absl::Status s = World::RunThreads(3, [](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, DeviceMesh::Create(w.shared_from_this(), {2}, {0, 1}));
    DT_ASSIGN_OR_RETURN(Tensor full, Tensor::Arange(0, 6));
    DT_ASSIGN_OR_RETURN(DTensor x, DTensor::Distribute(full, mesh, Pl("S(0)")));
    DT_ASSIGN_OR_RETURN(DTensor y, x.Redistribute(Pl("R")));
    if (w.rank() == 2) {
      if (y.ToLocal().numel() != 0) return absl::InternalError("non-member holds data");
    } else if (!Equal(y.ToLocal(), full)) {
      return absl::InternalError("member lost data");
    }
    return absl::OkStatus();
  }, Quick());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(RedistributeTest, IllegalRequestsAreErrorsOnEveryRank) {
  ExpectOkOnMesh({2, 2}, {"dp", "tp"}, [](World& w, const DeviceMesh& mesh) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh other, InitDeviceMesh(w.shared_from_this(), {4}, {"all"}));
    DT_ASSIGN_OR_RETURN(DTensor x, DTensor::Zeros({4, 4}, mesh, Pl("S(0),P(sum)")));
    const std::pair<absl::StatusOr<DTensor>, const char*> cases[] = {
        {x.Redistribute(Pl("P(sum),R")), "Shard -> Partial is not a redistribution (mesh dim dp"},
        {x.Redistribute(Pl("S(0),P(max)")), "Partial(sum) -> Partial(max) is not a redistribution"},
        {x.Redistribute(other, Pl("R")), "the meshes differ"},
        {x.Redistribute(Pl("S(2),R")), "shard dim 2 of S(2) on mesh dim dp is out of range"},
        {x.Redistribute(Pl("R")), "expected 2 placements"},
    };
    for (const auto& [result, want] : cases) {
      if (result.ok() || result.status().message().find(want) == absl::string_view::npos) {
        return absl::InternalError(absl::StrCat("want '", want, "', got ", result.status().ToString()));
      }
    }
    return absl::OkStatus();
  });
}

TEST(RedistributeTest, VerifyCommandIsOneLine) {
  VerifyRequest r;
  r.mesh = {2, 3};
  r.shape = {5, 0};
  r.from = Pl("S(0),R");
  r.to = Pl("R,_S(1,[0,0])");
  r.dtype = DType::kBF16;
  r.seed = 7;
  EXPECT_EQ(VerifyCommand(r), "dtensor verify --mesh 2x3 --shape 5,0 --from 'S(0),R' --to "
                              "'R,_S(1,[0,0])' --dtype bf16 --seed 7");
}

}  // namespace
}  // namespace dt
