#include "dtensor/tests/dtensor/upstream_cases.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/dtensor/dtensor.h"
#include "dtensor/dtensor/executor.h"
#include "dtensor/mesh/comm_counter.h"

namespace dt::testing {
namespace {

#define UP_EXPECT(cond, ...)                                                              \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      return absl::InternalError(absl::StrCat("upstream_cases.cc:", __LINE__, ": ", #cond, \
                                              " " __VA_OPT__(, ) __VA_ARGS__));           \
    }                                                                                     \
  } while (0)

using WorldPtr = std::shared_ptr<World>;

Placements Pl(const char* text) { return ParsePlacements(text).value(); }

absl::StatusOr<Tensor> Arange(IntSpan shape, DType dtype = DType::kF32) {
  DT_ASSIGN_OR_RETURN(Tensor t, Tensor::Arange(0, static_cast<double>(Numel(shape)), 1.0, dtype));
  return t.View(shape);
}

absl::Status Same(const Tensor& got, const Tensor& want, absl::string_view what) {
  if (Equal(got, want)) return absl::OkStatus();
  absl::Status s = AllClose(got, want, 0, 0);
  return absl::InternalError(absl::StrCat(what, ": got ", got.Describe(), " want ", want.Describe(),
                                          s.ok() ? "" : absl::StrCat(": ", s.message())));
}

absl::Status Close(const Tensor& got, const Tensor& want, absl::string_view what) {
  absl::Status s = AllClose(got, want, 1e-5, 1e-5);
  if (s.ok()) return s;
  return absl::InternalError(absl::StrCat(what, ": ", s.message()));
}

absl::Status Counts(const CommCounter& c, absl::string_view want, absl::string_view what) {
  if (c.counts().ToString() == want) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": collectives ", c.counts().ToString(), ", want ", want));
}

absl::Status AtMost(const CommCounter& c, int64_t n, absl::string_view what) {
  if (c.counts().total() <= n) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", c.counts().total(), " collectives (",
                                          c.counts().ToString(), "), upstream needs ", n));
}

// torch.chunk(x, k, dim)[r], computed with Narrow (independent of the shard math).
absl::StatusOr<Tensor> TorchChunk(const Tensor& x, int64_t k, int dim, int64_t r) {
  const int64_t n = x.size(dim);
  const int64_t c = (n + k - 1) / k;
  const int64_t start = std::min(n, c * r);
  const int64_t len = std::max<int64_t>(0, std::min(n, start + c) - start);
  DT_ASSIGN_OR_RETURN(Tensor v, x.Narrow(dim, start, len));
  return v.Contiguous();
}

// The direct distribution of `full` (cut locally, no communication).
absl::StatusOr<Tensor> Direct(const Tensor& full, const DeviceMesh& mesh, const Placements& p) {
  DT_ASSIGN_OR_RETURN(DTensor d, DTensor::Distribute(full, mesh, p, std::nullopt));
  return d.ToLocal();
}

// Distributes `full` to `from`, redistributes to `to`, checks the piece against the direct
// distribution and the collective count (at most `max_collectives`; -1: no check).
absl::Status CheckRedistribute(const DeviceMesh& mesh, const Tensor& full, const char* from,
                               const char* to, int max_collectives, absl::string_view want_counts = "") {
  const std::string what = absl::StrCat(ShapeToString(full.shape()), " ", from, " -> ", to);
  DT_ASSIGN_OR_RETURN(DTensor x, DTensor::Distribute(full, mesh, Pl(from)));
  CommCounter counter;
  DT_ASSIGN_OR_RETURN(DTensor y, x.Redistribute(Pl(to)));
  DT_ASSIGN_OR_RETURN(Tensor want, Direct(full, mesh, Pl(to)));
  DT_RETURN_IF_ERROR(Same(y.ToLocal(), want, what));
  if (max_collectives >= 0) DT_RETURN_IF_ERROR(AtMost(counter, max_collectives, what));
  if (!want_counts.empty()) DT_RETURN_IF_ERROR(Counts(counter, want_counts, what));
  DT_ASSIGN_OR_RETURN(Tensor back, y.FullTensor());
  return Same(back, full, absl::StrCat(what, " FullTensor"));
}

// A Partial DTensor whose every rank holds `local` (upstream builds them with from_local).
absl::StatusOr<DTensor> PartialFrom(const Tensor& value, const DeviceMesh& mesh, const char* p) {
  // The local piece of `value` under the placements with Partial replaced by Replicate.
  Placements ps = Pl(p);
  Placements rs = ps;
  for (Placement& q : rs) {
    if (q.is_partial()) q = Placement::Replicate();
  }
  DT_ASSIGN_OR_RETURN(Tensor local, Direct(value, mesh, rs));
  return DTensor::FromLocal(local, mesh, ps, {.shape = Shape(value.shape())});
}

int64_t Rank(const DeviceMesh& m) { return m.my_rank(); }

// ---- the cases -----------------------------------------------------------------------------

absl::Status Case01(const WorldPtr& w) {  // S(0) -> R: all_gather, uneven shapes
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {4}));
  const std::vector<std::pair<int64_t, std::vector<int64_t>>> shapes = {
      {12, {3, 3, 3, 3}}, {13, {4, 4, 4, 1}}, {14, {4, 4, 4, 2}}};
  for (const auto& [rows, sizes] : shapes) {
    DT_ASSIGN_OR_RETURN(Tensor x, Arange({rows, 3}));
    DT_ASSIGN_OR_RETURN(DTensor s, DTensor::Distribute(x, mesh, Pl("S(0)")));
    UP_EXPECT(s.ToLocal().size(0) == sizes[Rank(mesh)], "rows ", rows);
    CommCounter c;
    DT_ASSIGN_OR_RETURN(DTensor r, s.Redistribute(Pl("R")));
    DT_RETURN_IF_ERROR(Same(r.ToLocal(), x, "S(0)->R"));
    DT_RETURN_IF_ERROR(Counts(c, "all_gather=1", "S(0)->R"));
  }
  return absl::OkStatus();
}

absl::Status Case02(const WorldPtr& w) {  // S(1) -> R (upstream: fp32 and cfloat; here f32, f16)
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {4}));
  for (DType dtype : {DType::kF32, DType::kF16}) {
    for (int64_t cols : {12, 13, 14}) {
      DT_ASSIGN_OR_RETURN(Tensor x, Arange({3, cols}, dtype));
      DT_ASSIGN_OR_RETURN(DTensor s, DTensor::Distribute(x, mesh, Pl("S(1)")));
      CommCounter c;
      DT_ASSIGN_OR_RETURN(DTensor r, s.Redistribute(Pl("R")));
      DT_RETURN_IF_ERROR(Same(r.ToLocal(), x, "S(1)->R"));
      DT_RETURN_IF_ERROR(Counts(c, "all_gather=1", "S(1)->R"));
    }
  }
  return absl::OkStatus();
}

absl::Status Case03(const WorldPtr& w) {  // R -> S(d): local torch.chunk, no communication
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {4}));
  const std::vector<std::vector<int64_t>> shapes = {{12, 3}, {13, 3}, {14, 3}, {3, 12}, {3, 13}, {3, 14}};
  for (const auto& shape : shapes) {
    for (int dim : {0, 1}) {
      DT_ASSIGN_OR_RETURN(Tensor x, Arange(shape));
      DT_ASSIGN_OR_RETURN(DTensor r, DTensor::Distribute(x, mesh, Pl("R")));
      CommCounter c;
      DT_ASSIGN_OR_RETURN(DTensor s, r.Redistribute({Placement::Shard(dim)}));
      DT_ASSIGN_OR_RETURN(Tensor want, TorchChunk(x, 4, dim, Rank(mesh)));
      DT_RETURN_IF_ERROR(Same(s.ToLocal(), want, "R->S"));
      DT_RETURN_IF_ERROR(Counts(c, "none", "R->S"));
    }
  }
  return absl::OkStatus();
}

absl::Status Case04(const WorldPtr& w) {  // R -> R: unchanged, no communication
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {4}));
  DT_ASSIGN_OR_RETURN(Tensor x, Arange({12, 3}));
  DT_ASSIGN_OR_RETURN(DTensor r, DTensor::Distribute(x, mesh, Pl("R")));
  CommCounter c;
  DT_ASSIGN_OR_RETURN(DTensor s, r.Redistribute(Pl("R")));
  DT_RETURN_IF_ERROR(Same(s.ToLocal(), x, "R->R"));
  return Counts(c, "none", "R->R");
}

absl::Status Case05(const WorldPtr& w) {  // P(sum) -> R: all_reduce gives 4 * ones
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {4}));
  DT_ASSIGN_OR_RETURN(Tensor ones, Tensor::Ones({12, 3}));
  DT_ASSIGN_OR_RETURN(DTensor p, DTensor::FromLocal(ones, mesh, Pl("P(sum)")));
  CommCounter c;
  DT_ASSIGN_OR_RETURN(DTensor r, p.Redistribute(Pl("R")));
  DT_ASSIGN_OR_RETURN(Tensor four, Tensor::Full({12, 3}, 4.0));
  DT_RETURN_IF_ERROR(Same(r.ToLocal(), four, "P->R"));
  DT_RETURN_IF_ERROR(Same(ones, Tensor::Ones({12, 3}).value(), "P->R input untouched"));
  return Counts(c, "all_reduce=1", "P->R");
}

absl::Status Case06(const WorldPtr& w) {  // P -> P (same): no-op; Distribute accepts Partial
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {4}));
  DT_ASSIGN_OR_RETURN(Tensor x, Arange({12, 3}));
  DT_ASSIGN_OR_RETURN(DTensor p, DTensor::Distribute(x, mesh, Pl("P(sum)")));
  CommCounter c;
  DT_ASSIGN_OR_RETURN(DTensor q, p.Redistribute(Pl("P(sum)")));
  DT_RETURN_IF_ERROR(Same(q.ToLocal(), p.ToLocal(), "P->P"));
  DT_RETURN_IF_ERROR(Counts(c, "none", "P->P"));
  DT_ASSIGN_OR_RETURN(Tensor full, q.FullTensor());
  return Close(full, x, "P->P FullTensor");
}

absl::Status Case07(const WorldPtr& w) {
  // Upstream: R -> R, then to_local(grad_placements=[P]) makes the backward reduce the partial
  // gradient (AR=1). Without autograd, the same data flow: a Partial gradient becomes Replicate.
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {4}));
  DT_ASSIGN_OR_RETURN(Tensor g, Arange({12, 3}));
  DT_ASSIGN_OR_RETURN(DTensor grad, DTensor::FromLocal(g, mesh, Pl("P(sum)")));
  CommCounter c;
  DT_ASSIGN_OR_RETURN(DTensor r, grad.Redistribute(Pl("R")));
  DT_ASSIGN_OR_RETURN(Tensor want, Tensor::FromDoubles({12, 3}, [&] {
    std::vector<double> v = g.ToDoubles();
    for (double& e : v) e *= 4;
    return v;
  }()));
  DT_RETURN_IF_ERROR(Same(r.ToLocal(), want, "partial grad"));
  return Counts(c, "all_reduce=1", "partial grad");
}

absl::Status Case08(const WorldPtr& w) {  // P -> S(d): reduce_scatter, uneven too
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {4}));
  const std::vector<std::pair<std::vector<int64_t>, int>> cases = {
      {{12, 3}, 0}, {{13, 3}, 0}, {{14, 3}, 0}, {{3, 12}, 1}, {{3, 13}, 1}, {{3, 14}, 1}};
  for (const auto& [shape, dim] : cases) {
    DT_ASSIGN_OR_RETURN(Tensor ones, Tensor::Ones(shape));
    DT_ASSIGN_OR_RETURN(DTensor p, DTensor::FromLocal(ones, mesh, Pl("P(sum)")));
    CommCounter c;
    DT_ASSIGN_OR_RETURN(DTensor s, p.Redistribute({Placement::Shard(dim)}));
    DT_ASSIGN_OR_RETURN(Tensor four, Tensor::Full(shape, 4.0));
    DT_ASSIGN_OR_RETURN(Tensor want, TorchChunk(four, 4, dim, Rank(mesh)));
    DT_RETURN_IF_ERROR(Same(s.ToLocal(), want, "P->S"));
    DT_RETURN_IF_ERROR(Counts(c, "reduce_scatter=1", "P->S"));
  }
  return absl::OkStatus();
}

absl::Status Case09(const WorldPtr& w) {  // R -> P through the public API: refused
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {4}));
  DT_ASSIGN_OR_RETURN(DTensor r, DTensor::Distribute(Arange({12, 3}).value(), mesh, Pl("R")));
  auto p = r.Redistribute(Pl("P(sum)"));
  UP_EXPECT(!p.ok());
  UP_EXPECT(p.status().message().find("redistributing to Partial is for internal use only") !=
                absl::string_view::npos,
            p.status().message());
  return absl::OkStatus();
}

absl::Status Case10(const WorldPtr& w) {  // R -> P(sum) internally: x / 4, no communication
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {4}));
  DT_ASSIGN_OR_RETURN(Tensor x, Arange({12, 3}));
  DT_ASSIGN_OR_RETURN(DTensor r, DTensor::Distribute(x, mesh, Pl("R")));
  CommCounter c;
  DT_ASSIGN_OR_RETURN(DTensor p, r.Redistribute(Pl("P(sum)"), {.planner = {.allow_partial = true}}));
  std::vector<double> v = x.ToDoubles();
  for (double& e : v) e = static_cast<float>(e) / 4.0f;
  DT_RETURN_IF_ERROR(Same(p.ToLocal(), Tensor::FromDoubles({12, 3}, v).value(), "R->P"));
  return Counts(c, "none", "R->P");
}

absl::Status Case11(const WorldPtr& w) {  // [R, R] -> [P, P] on (2, 2): x / 4
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {2, 2}));
  DT_ASSIGN_OR_RETURN(Tensor x, Arange({12, 3}));
  DT_ASSIGN_OR_RETURN(DTensor r, DTensor::Distribute(x, mesh, Pl("R,R")));
  CommCounter c;
  DT_ASSIGN_OR_RETURN(DTensor p, r.Redistribute(Pl("P(sum),P(sum)"), {.planner = {.allow_partial = true}}));
  std::vector<double> v = x.ToDoubles();
  for (double& e : v) e = static_cast<float>(static_cast<float>(e) / 2.0f) / 2.0f;
  DT_RETURN_IF_ERROR(Same(p.ToLocal(), Tensor::FromDoubles({12, 3}, v).value(), "RR->PP"));
  return Counts(c, "none", "RR->PP");
}

absl::Status Case12(const WorldPtr& w) {  // R -> P(avg/min/max): identity; P(sum): x / 4
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {4}));
  DT_ASSIGN_OR_RETURN(Tensor x, Arange({12, 3}));
  DT_ASSIGN_OR_RETURN(DTensor r, DTensor::Distribute(x, mesh, Pl("R")));
  CommCounter c;
  for (const char* op : {"P(avg)", "P(min)", "P(max)"}) {
    DT_ASSIGN_OR_RETURN(DTensor p, r.Redistribute(Pl(op), {.planner = {.allow_partial = true}}));
    DT_RETURN_IF_ERROR(Same(p.ToLocal(), x, op));
    DT_ASSIGN_OR_RETURN(Tensor back, p.FullTensor());
    DT_RETURN_IF_ERROR(Same(back, x, absl::StrCat(op, " FullTensor")));
  }
  UP_EXPECT(c.counts().all_gather + c.counts().all_to_all + c.counts().reduce_scatter == 0);
  return absl::OkStatus();
}

absl::Status Case13(const WorldPtr& w) {  // which Partial transitions are allowed on (2, 2)
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {2, 2}));
  DT_ASSIGN_OR_RETURN(Tensor x, Arange({12, 8}));
  for (const auto& [from, to] : std::vector<std::pair<const char*, const char*>>{
           {"P(sum),S(0)", "P(sum),S(0)"}, {"P(sum),S(0)", "P(sum),S(1)"},
           {"S(0),P(sum)", "R,P(sum)"}, {"S(0),P(prod)", "R,P(prod)"}}) {
    DT_ASSIGN_OR_RETURN(DTensor a, DTensor::Distribute(x, mesh, Pl(from)));
    DT_ASSIGN_OR_RETURN(DTensor b, a.Redistribute(Pl(to)));
    DT_ASSIGN_OR_RETURN(Tensor want, Direct(x, mesh, Pl(to)));
    DT_RETURN_IF_ERROR(Same(b.ToLocal(), want, absl::StrCat(from, " -> ", to)));
  }
  for (const auto& [from, to, why] : std::vector<std::tuple<const char*, const char*, const char*>>{
           {"S(0),R", "S(0),P(sum)", "for internal use only"},
           {"S(0),R", "R,P(sum)", "for internal use only"},
           {"S(0),S(1)", "R,P(sum)", "Shard -> Partial is not a redistribution"},
           {"S(0),P(prod)", "R,P(sum)", "Partial(prod) -> Partial(sum) is not a redistribution"}}) {
    DT_ASSIGN_OR_RETURN(DTensor a, DTensor::Distribute(x, mesh, Pl(from)));
    auto b = a.Redistribute(Pl(to));
    UP_EXPECT(!b.ok(), from, " -> ", to);
    UP_EXPECT(b.status().message().find(why) != absl::string_view::npos, b.status().message());
  }
  return absl::OkStatus();
}

absl::Status Case14(const WorldPtr& w) {  // uneven distribute + FullTensor round trip on (2, 2)
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {2, 2}));
  for (const auto& shape : std::vector<std::vector<int64_t>>{{10, 5}, {9, 5}, {3, 5}, {1, 3}}) {
    for (const char* p : {"S(0),S(0)", "S(0),S(1)"}) {
      DT_ASSIGN_OR_RETURN(Tensor x, Arange(shape));
      DT_ASSIGN_OR_RETURN(DTensor d, DTensor::Distribute(x, mesh, Pl(p)));
      DT_ASSIGN_OR_RETURN(Tensor back, d.FullTensor());
      DT_RETURN_IF_ERROR(Same(back, x, absl::StrCat(p, " ", ShapeToString(shape))));
    }
  }
  return absl::OkStatus();
}

absl::Status Case15(const WorldPtr& w) {  // S(0) <-> S(1) on (4,): one all_to_all on every backend
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {4}));
  for (const auto& shape : std::vector<std::vector<int64_t>>{{8, 8}, {8, 8, 8}, {8, 5}, {5, 8}, {5, 5}}) {
    DT_ASSIGN_OR_RETURN(Tensor x, Arange(shape));
    DT_RETURN_IF_ERROR(CheckRedistribute(mesh, x, "S(0)", "S(1)", 1, "all_to_all=1"));
    DT_RETURN_IF_ERROR(CheckRedistribute(mesh, x, "S(1)", "S(0)", 1, "all_to_all=1"));
  }
  return absl::OkStatus();
}

const std::vector<std::vector<int64_t>> kTwoByTwoShapes = {{8, 8}, {8, 5}, {5, 8}, {5, 5}, {8, 8, 8}};

absl::Status Case16(const WorldPtr& w) {  // [S0,S1] -> [S0,S0]: one all_to_all on mesh dim 1
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {2, 2}));
  for (const auto& shape : kTwoByTwoShapes) {
    DT_RETURN_IF_ERROR(CheckRedistribute(mesh, Arange(shape).value(), "S(0),S(1)", "S(0),S(0)", 1,
                                         "all_to_all=1"));
  }
  return absl::OkStatus();
}

absl::Status Case17(const WorldPtr& w) {  // [S0,S1] -> [S1,S0]: upstream 2
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {2, 2}));
  for (const auto& shape : kTwoByTwoShapes) {
    DT_RETURN_IF_ERROR(CheckRedistribute(mesh, Arange(shape).value(), "S(0),S(1)", "S(1),S(0)", 2));
  }
  return absl::OkStatus();
}

absl::Status Case18(const WorldPtr& w) {  // [S0,S0] -> [S1,S1]: upstream 2
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {2, 2}));
  for (const auto& shape : kTwoByTwoShapes) {
    DT_RETURN_IF_ERROR(CheckRedistribute(mesh, Arange(shape).value(), "S(0),S(0)", "S(1),S(1)", 2));
  }
  return absl::OkStatus();
}

absl::Status Case19(const WorldPtr& w) {  // 3-d tensor on (2, 2): upstream 2 and 1
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {2, 2}));
  DT_ASSIGN_OR_RETURN(Tensor x, Arange({8, 8, 8}));
  DT_RETURN_IF_ERROR(CheckRedistribute(mesh, x, "S(0),S(2)", "S(1),S(0)", 2));
  return CheckRedistribute(mesh, x, "S(1),S(1)", "S(1),S(2)", 1, "all_to_all=1");
}

absl::Status Case20(const WorldPtr& w) {  // [S0,S0,S0] -> [S1,S1,S1] on (2,2,2): upstream 3
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {2, 2, 2}));
  return CheckRedistribute(mesh, Arange({8, 8, 8}).value(), "S(0),S(0),S(0)", "S(1),S(1),S(1)", 3);
}

absl::Status Case21(const WorldPtr& w) {  // test_redistribute_shard_dim_multi_dim_mesh
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {2, 2, 2}));
  DT_ASSIGN_OR_RETURN(Tensor x, Arange({8, 8, 8}));
  const std::vector<std::tuple<const char*, const char*, int>> cases = {
      {"S(0),S(1),S(0)", "S(1),S(0),S(0)", 3}, {"S(0),S(1),S(2)", "S(2),S(1),S(0)", 2},
      {"S(1),S(0),S(0)", "R,S(0),S(0)", 1},    {"S(1),R,S(0)", "R,S(0),S(0)", 2},
      {"S(0),S(0),S(1)", "S(0),S(1),S(2)", 2}};
  for (const auto& [from, to, n] : cases) DT_RETURN_IF_ERROR(CheckRedistribute(mesh, x, from, to, n));
  return absl::OkStatus();
}

absl::Status Case22(const WorldPtr& w) {  // (4, 1): a mesh dim of size 1 never communicates
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {4, 1}));
  DT_ASSIGN_OR_RETURN(Tensor local, Arange({16, 8}));
  for (const char* src : {"S(1)", "R", "P(sum)"}) {
    for (const char* dst : {"S(0)", "S(1)", "R"}) {
      DT_ASSIGN_OR_RETURN(DTensor a, DTensor::FromLocal(local, mesh, Pl(absl::StrCat("S(0),", src).c_str())));
      CommCounter c;
      DT_ASSIGN_OR_RETURN(DTensor b, a.Redistribute(Pl(absl::StrCat("S(0),", dst).c_str())));
      DT_RETURN_IF_ERROR(Counts(c, "none", absl::StrCat(src, " -> ", dst)));
      UP_EXPECT(b.placements()[1] == Pl(dst)[0]);
      DT_RETURN_IF_ERROR(Same(b.ToLocal(), local, absl::StrCat(src, " -> ", dst)));
    }
  }
  return absl::OkStatus();
}

absl::Status Case23(const WorldPtr& w) {  // zero-size shards: (2, 8) on 4 ranks
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {4}));
  DT_ASSIGN_OR_RETURN(Tensor x, Arange({2, 8}));
  DT_ASSIGN_OR_RETURN(DTensor s, DTensor::Distribute(x, mesh, Pl("S(0)")));
  UP_EXPECT(s.ToLocal().size(0) == (Rank(mesh) < 2 ? 1 : 0));
  DT_ASSIGN_OR_RETURN(DTensor r, s.Redistribute(Pl("R")));
  DT_RETURN_IF_ERROR(Same(r.ToLocal(), x, "S0->R"));
  DT_ASSIGN_OR_RETURN(DTensor t, s.Redistribute(Pl("S(1)")));
  UP_EXPECT(t.ToLocal().shape() == (Shape{2, 2}));
  DT_ASSIGN_OR_RETURN(Tensor want, TorchChunk(x, 4, 1, Rank(mesh)));
  return Same(t.ToLocal(), want, "S0->S1");
}

absl::Status Case24(const WorldPtr& w) {  // test_multi_dim_mesh: every {R,S0,S1,P}^2 -> {R,S0,S1}^2
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {4, 2}));
  DT_ASSIGN_OR_RETURN(Tensor x, Arange({16, 24}));
  const char* ins[] = {"R", "S(0)", "S(1)", "P(sum)"};
  const char* outs[] = {"R", "S(0)", "S(1)"};
  for (const char* a : ins) {
    for (const char* b : ins) {
      const std::string src = absl::StrCat(a, ",", b);
      DT_ASSIGN_OR_RETURN(DTensor d, PartialFrom(x, mesh, src.c_str()));
      const double scale = (a[0] == 'P' ? 4 : 1) * (b[0] == 'P' ? 2 : 1);
      std::vector<double> v = x.ToDoubles();
      for (double& e : v) e *= scale;
      DT_ASSIGN_OR_RETURN(Tensor want, Tensor::FromDoubles({16, 24}, v));
      for (const char* c : outs) {
        for (const char* e : outs) {
          const std::string dst = absl::StrCat(c, ",", e);
          DT_ASSIGN_OR_RETURN(DTensor r, d.Redistribute(Pl(dst.c_str())));
          DT_ASSIGN_OR_RETURN(Tensor full, r.FullTensor());
          DT_RETURN_IF_ERROR(Close(full, want, absl::StrCat(src, " -> ", dst)));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Case25(const WorldPtr& w) {
  // Upstream (1, 8192, 6144) [S1,S1] -> [S1,R]: the gather needs no split/cat when the leading dims
  // are 1 (smaller here); (4, ...) needs the rearrangement. Both must be right.
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {2, 2}));
  DT_RETURN_IF_ERROR(CheckRedistribute(mesh, Arange({1, 64, 48}).value(), "S(1),S(1)", "S(1),R", 1, "all_gather=1"));
  DT_RETURN_IF_ERROR(CheckRedistribute(mesh, Arange({1, 64, 48}).value(), "S(2),S(2)", "S(2),R", 1, "all_gather=1"));
  return CheckRedistribute(mesh, Arange({4, 64, 48}).value(), "S(1),S(1)", "S(1),R", 1, "all_gather=1");
}

absl::Status Case26(const WorldPtr& w) {
  // [S0,S0,S0] -> RRR on (2,2,2): one all_gather on the flattened mesh. Shard order (1,0,2) is
  // [_S(0,2), S(0), S(0)]: upstream needs three all_gathers; the two plain dims merge here.
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {2, 2, 2}));
  DT_ASSIGN_OR_RETURN(Tensor x, Arange({8, 8, 8}));
  DT_RETURN_IF_ERROR(CheckRedistribute(mesh, x, "S(0),S(0),S(0)", "R,R,R", 1, "all_gather=1"));
  return CheckRedistribute(mesh, x, "_S(0,2),S(0),S(0)", "R,R,R", 3, "all_gather=2");
}

absl::Status Case27(const WorldPtr& w) {  // (4, 2): S(0) over both dims -> RR, one merged gather
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {4, 2}, {"A", "B"}));
  return CheckRedistribute(mesh, Arange({8, 8}).value(), "S(0),S(0)", "R,R", 1, "all_gather=1");
}

absl::Status Case28(const WorldPtr& w) {  // MultiDimRedistributeOptimizationTest on (4, 2), 16^3
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {4, 2}));
  DT_ASSIGN_OR_RETURN(Tensor x, Arange({16, 16, 16}));
  std::vector<double> v = x.ToDoubles();
  for (double& e : v) e *= 8;
  DT_ASSIGN_OR_RETURN(Tensor x8, Tensor::FromDoubles({16, 16, 16}, v));
  const std::vector<std::tuple<const char*, const char*, const char*>> partial = {
      {"R,R", "all_reduce=1", ""}, {"S(0),S(0)", "reduce_scatter=1", ""},
      // upstream reduce_scatter=2; at 16 KiB our cost model prefers one flattened all_reduce.
      {"S(0),S(1)", "all_reduce=1", ""}};
  for (const auto& [to, counts, unused] : partial) {
    DT_ASSIGN_OR_RETURN(DTensor p, PartialFrom(x, mesh, "P(sum),P(sum)"));
    CommCounter c;
    DT_ASSIGN_OR_RETURN(DTensor r, p.Redistribute(Pl(to)));
    DT_RETURN_IF_ERROR(Counts(c, counts, to));
    DT_ASSIGN_OR_RETURN(Tensor full, r.FullTensor());
    DT_RETURN_IF_ERROR(Close(full, x8, to));
  }
  DT_RETURN_IF_ERROR(CheckRedistribute(mesh, x, "S(0),S(0)", "R,R", 1, "all_gather=1"));
  return CheckRedistribute(mesh, x, "S(0),S(1)", "R,R", 2, "all_gather=2");
}

absl::Status Case29(const WorldPtr& w) {  // (2,2,2) with flattened groups, 16^3
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {2, 2, 2}));
  DT_ASSIGN_OR_RETURN(Tensor x, Arange({16, 16, 16}));
  const std::vector<std::tuple<const char*, const char*, int>> cases = {
      {"P(sum),P(sum),S(0)", "S(0),S(0),S(0)", 3}, {"P(sum),P(sum),P(sum)", "R,R,R", 1},
      {"P(sum),S(0),P(sum)", "R,R,R", 3},          {"P(sum),R,P(sum)", "R,R,R", 1},
      {"P(sum),P(sum),R", "S(0),S(1),R", 2},       {"P(sum),P(sum),P(sum)", "S(0),S(0),S(1)", 2}};
  for (const auto& [from, to, n] : cases) {
    DT_ASSIGN_OR_RETURN(DTensor p, PartialFrom(x, mesh, from));
    int partial_dims = 0;
    for (const Placement& q : Pl(from)) partial_dims += q.is_partial();
    std::vector<double> v = x.ToDoubles();
    for (double& e : v) e *= 1 << partial_dims;
    CommCounter c;
    DT_ASSIGN_OR_RETURN(DTensor r, p.Redistribute(Pl(to)));
    DT_RETURN_IF_ERROR(AtMost(c, n, absl::StrCat(from, " -> ", to)));
    DT_ASSIGN_OR_RETURN(Tensor full, r.FullTensor());
    DT_RETURN_IF_ERROR(Close(full, Tensor::FromDoubles({16, 16, 16}, v).value(), absl::StrCat(from, " -> ", to)));
  }
  return absl::OkStatus();
}

absl::Status Case30(const WorldPtr& w) {  // [P(avg),P(avg),P(sum)] -> RRR: 8V/4 = 2V, one all_reduce
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {2, 2, 2}));
  DT_ASSIGN_OR_RETURN(Tensor v, Arange({16}));
  DT_ASSIGN_OR_RETURN(DTensor p, DTensor::FromLocal(v, mesh, Pl("P(avg),P(avg),P(sum)")));
  std::vector<double> d = v.ToDoubles();
  for (double& e : d) e *= 2;
  DT_ASSIGN_OR_RETURN(Tensor v2, Tensor::FromDoubles({16}, d));
  {
    CommCounter c;
    DT_ASSIGN_OR_RETURN(DTensor r, p.Redistribute(Pl("R,R,R")));
    DT_RETURN_IF_ERROR(Counts(c, "all_reduce=1", "avg,avg,sum -> RRR"));
    DT_RETURN_IF_ERROR(Close(r.ToLocal(), v2, "avg,avg,sum -> RRR"));
  }
  CommCounter c;
  DT_ASSIGN_OR_RETURN(DTensor s, p.Redistribute(Pl("S(0),S(0),S(0)")));
  DT_RETURN_IF_ERROR(Counts(c, "reduce_scatter=1", "avg,avg,sum -> S0S0S0"));
  DT_ASSIGN_OR_RETURN(Tensor want, Direct(v2, mesh, Pl("S(0),S(0),S(0)")));
  return Close(s.ToLocal(), want, "avg,avg,sum -> S0S0S0");
}

absl::Status Case31(const WorldPtr& w) {  // UnevenFlattenedReduceScatterTest on (2, 3)
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {2, 3}));
  DT_ASSIGN_OR_RETURN(Tensor x, Arange({4, 1}));
  DT_ASSIGN_OR_RETURN(DTensor p, DTensor::FromLocal(x, mesh, Pl("P(sum),P(sum)")));
  DT_ASSIGN_OR_RETURN(DTensor s, p.Redistribute(Pl("S(0),S(0)")));
  const int64_t sizes[] = {1, 1, 0, 1, 1, 0};
  const double values[] = {0, 6, -1, 12, 18, -1};
  const int64_t r = Rank(mesh);
  UP_EXPECT(s.ToLocal().size(0) == sizes[r], "rank ", r, " holds ", s.ToLocal().Describe());
  if (sizes[r] == 1) UP_EXPECT(s.ToLocal().Item() == values[r], "rank ", r, ": ", s.ToLocal().Item());
  return absl::OkStatus();
}

absl::Status Case32(const WorldPtr& w) {  // S(0) over (2,2,2) -> [R, S0, S0] (greedy trace upstream)
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {2, 2, 2}));
  return CheckRedistribute(mesh, Arange({8, 8, 8}).value(), "S(0),S(0),S(0)", "R,S(0),S(0)", -1);
}

absl::Status Case33(const WorldPtr& w) {  // test_force_min_cost_redistribution_plan
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {2, 2, 2}));
  DT_ASSIGN_OR_RETURN(Tensor x, Arange({8, 8, 8}));
  for (auto strategy : {PlannerOptions::Strategy::kGreedy, PlannerOptions::Strategy::kSearch}) {
    DT_ASSIGN_OR_RETURN(DTensor a, DTensor::Distribute(x, mesh, Pl("S(0),S(0),S(0)")));
    RedistributeOptions o;
    o.planner.strategy = strategy;
    DT_ASSIGN_OR_RETURN(DTensor b, a.Redistribute(Pl("S(1),S(1),S(1)"), o));
    DT_ASSIGN_OR_RETURN(Tensor want, Direct(x, mesh, Pl("S(1),S(1),S(1)")));
    DT_RETURN_IF_ERROR(Same(b.ToLocal(), want, "S0 -> S1 over (2,2,2)"));
  }
  return absl::OkStatus();
}

absl::Status Case34(const WorldPtr& w) {  // interleaved shards on (2,2,2), (31, 13, 11)
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {2, 2, 2}));
  DT_ASSIGN_OR_RETURN(Tensor x, Arange({31, 13, 11}));
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"S(0),S(0),_S(0,3)", "R,S(0),S(0)"}, {"S(0),_S(0,2),S(0)", "R,R,S(1)"},
      {"_S(0,2),S(0),R", "S(1),S(0),S(0)"}, {"R,_S(1,3),S(2)", "_S(2,2),S(1),_S(0,[10,21])"}};
  for (const auto& [from, to] : cases) DT_RETURN_IF_ERROR(CheckRedistribute(mesh, x, from, to, -1));
  return absl::OkStatus();
}

absl::Status Case35(const WorldPtr& w) {  // Test2DStridedLocalShard on (2, 2) dp, tp; (4, 2) arange
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {2, 2}, {"dp", "tp"}));
  DT_ASSIGN_OR_RETURN(Tensor x, Arange({4, 2}));
  const auto& c = *mesh.Coordinate();
  const int64_t dp = c[0], tp = c[1];
  // TP-sharded rows [2tp, 2tp+2) from_local as [R, S0], then -> [S0, S0]: rank r gets row r.
  DT_ASSIGN_OR_RETURN(Tensor tp_rows, x.Narrow(0, 2 * tp, 2));
  DT_ASSIGN_OR_RETURN(DTensor a, DTensor::FromLocal(tp_rows.Clone().value(), mesh, Pl("R,S(0)")));
  CommCounter counter;
  DT_ASSIGN_OR_RETURN(DTensor b, a.Redistribute(Pl("S(0),S(0)")));
  DT_RETURN_IF_ERROR(Counts(counter, "all_gather=1", "[R,S0] -> [S0,S0]"));
  DT_ASSIGN_OR_RETURN(Tensor row, x.Narrow(0, 2 * dp + tp, 1));
  DT_RETURN_IF_ERROR(Same(b.ToLocal(), row.Clone().value(), "[R,S0] -> [S0,S0]"));
  // FSDP on top of TP: row 2tp + dp is [_S(0,2), S(0)]; full_tensor needs no help.
  DT_ASSIGN_OR_RETURN(Tensor fsdp_row, x.Narrow(0, 2 * tp + dp, 1));
  DT_ASSIGN_OR_RETURN(DTensor s, DTensor::FromLocal(fsdp_row.Clone().value(), mesh, Pl("_S(0,2),S(0)"),
                                                    {.shape = Shape{4, 2}, .run_check = true}));
  DT_ASSIGN_OR_RETURN(Tensor full, s.FullTensor());
  return Same(full, x, "[_S(0,2), S0] FullTensor");
}

absl::Status Case36(const WorldPtr& w) {  // test_2d_mesh_uneven_strided_shard
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w, {2, 2}, {"fsdp", "tp"}));
  for (int64_t n : {2, 3, 5, 11}) {
    DT_ASSIGN_OR_RETURN(Tensor x, Arange({1, n}));
    DT_RETURN_IF_ERROR(CheckRedistribute(mesh, x, "R,R", "_S(1,2),S(1)", -1));
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<UpstreamCase>& UpstreamCases() {
  static const auto* cases = new std::vector<UpstreamCase>{
      {"Case01_ShardToReplicate", 4, Case01},
      {"Case02_ShardDim1ToReplicate", 4, Case02},
      {"Case03_ReplicateToShard", 4, Case03},
      {"Case04_ReplicateToReplicate", 4, Case04},
      {"Case05_PartialToReplicate", 4, Case05},
      {"Case06_PartialToSamePartial", 4, Case06},
      {"Case07_PartialGradientReduces", 4, Case07},
      {"Case08_PartialToShard", 4, Case08},
      {"Case09_ReplicateToPartialRefused", 4, Case09},
      {"Case10_ReplicateToPartialInternal", 4, Case10},
      {"Case11_ReplicateToPartial2d", 4, Case11},
      {"Case12_ReplicateToPartialOps", 4, Case12},
      {"Case13_PartialTransitionsAllowed", 4, Case13},
      {"Case14_UnevenFullTensor", 4, Case14},
      {"Case15_ShardToShardAllToAll", 4, Case15},
      {"Case16_ShardDimChangeInner", 4, Case16},
      {"Case17_ShardSwap2d", 4, Case17},
      {"Case18_NestedShardToOtherDim", 4, Case18},
      {"Case19_ShardDims3dTensor", 4, Case19},
      {"Case20_NestedShard3dMesh", 8, Case20},
      {"Case21_ShardDimMultiDimMesh", 8, Case21},
      {"Case22_SizeOneMeshDim", 4, Case22},
      {"Case23_ZeroSizeShards", 4, Case23},
      {"Case24_MultiDimMeshAllPairs", 8, Case24},
      {"Case25_AllGatherLeadingOnes", 4, Case25},
      {"Case26_FlattenedAllGather", 8, Case26},
      {"Case27_FlattenedAllGather2d", 8, Case27},
      {"Case28_FlattenedCollectives", 8, Case28},
      {"Case29_FlattenedMixed3d", 8, Case29},
      {"Case30_AvgScale", 8, Case30},
      {"Case31_UnevenFlattenedReduceScatter", 6, Case31},
      {"Case32_NestedShardToInner", 8, Case32},
      {"Case33_GreedyAndSearchAgree", 8, Case33},
      {"Case34_InterleavedShards", 8, Case34},
      {"Case35_StridedLocalShard", 4, Case35},
      {"Case36_UnevenStridedShard", 4, Case36},
  };
  return *cases;
}

}  // namespace dt::testing
