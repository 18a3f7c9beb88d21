// ScaledDotProductAttention (heads sharded with GQA, batch, queries) and Embedding (vocab-sharded
// masked lookup) on DTensors against the local ops on the full tensors.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "dtensor/tests/ops/ops_test_util.h"

namespace dt::ops::internal::testing {
namespace {

struct AttnCase {
  Shape q, k, v;
  ops::AttentionOptions options;
};

AttnCase GenAttn(int64_t hkv_multiple = 1) {
  AttnCase c;
  const int64_t b = U<int64_t>(1, 3), hkv = hkv_multiple * U<int64_t>(1, 3),
                rep = U<int64_t>(1, 4), sq = U<int64_t>(1, 5), d = U<int64_t>(1, 4),
                dv = U<int64_t>(1, 4);
  const int64_t skv = sq + U<int64_t>(0, 3);
  c.q = {b, hkv * rep, sq, d};
  c.k = {b, hkv, skv, d};
  c.v = {b, hkv, skv, dv};
  c.options.causal = Coin();
  if (Coin()) c.options.scale = 0.5;
  if (Coin()) c.options.kv_length = U<int64_t>(sq, skv + 1);
  return c;
}

OpFn Attention(const ops::AttentionOptions& o) {
  return Single([o](const std::vector<DTensor>& in) {
    return ScaledDotProductAttention(in[0], in[1], in[2], o);
  });
}

// Random layouts, except that q and k/v never both split the heads on one mesh dim (that must be
// GQA-consistent: see the next property and the error test).
RC_GTEST_PROP(DopsAttention, MatchesLocal, ()) {
  const auto mesh = GenMesh();
  const AttnCase c = GenAttn();
  Placements pq = GenPlacements(mesh, 4, false), pk = GenPlacements(mesh, 4, false),
             pv = GenPlacements(mesh, 4, true, ReduceOp::kSum);
  for (size_t i = 0; i < mesh.size(); ++i) {
    if (pq[i].is_any_shard(1)) {
      if (pk[i].is_any_shard(1)) pk[i] = Placement::Replicate();
      if (pv[i].is_any_shard(1)) pv[i] = Placement::Replicate();
    }
  }
  std::vector<Arg> args = {MakeArg(GenTensor(c.q, false), pq), MakeArg(GenTensor(c.k, false), pk),
                           MakeArg(GenTensor(c.v), pv)};
  const Tensor want =
      ops::ScaledDotProductAttention(args[0].full, args[1].full, args[2].full, c.options).value();
  CheckOp(mesh, args, Attention(c.options), {want}, /*exact=*/false);
}

// Tensor-parallel layouts per mesh dim: batch, heads (kv heads divisible by the mesh), query heads
// with replicated kv, queries with replicated kv, or replicated: no communication.
RC_GTEST_PROP(DopsAttention, ParallelLayoutsNeedNoRedistribution, ()) {
  const auto mesh = GenMesh();
  int64_t ranks = 1;
  for (int64_t s : mesh) ranks *= s;
  const AttnCase c = GenAttn(ranks);
  Placements pq, pk;
  for (size_t i = 0; i < mesh.size(); ++i) {
    switch (U(0, 5)) {
      case 1: pq.push_back(Placement::Shard(0)); pk.push_back(Placement::Shard(0)); break;
      case 2: pq.push_back(Placement::Shard(1)); pk.push_back(Placement::Shard(1)); break;
      case 3: pq.push_back(Placement::Shard(1)); pk.push_back(Placement::Replicate()); break;
      case 4: pq.push_back(Placement::Shard(2)); pk.push_back(Placement::Replicate()); break;
      default: pq.push_back(Placement::Replicate()); pk.push_back(Placement::Replicate()); break;
    }
  }
  // A kv-head split to the right of a query-only head split would give a rank kv heads its query
  // heads do not use (mesh dims split left to right); keep the layouts that fit.
  bool q_only = false, fits = true;
  for (size_t i = 0; i < mesh.size(); ++i) {
    if (mesh[i] <= 1) continue;
    if (pq[i].is_any_shard(1) && pk[i].is_replicate()) q_only = true;
    if (q_only && pk[i].is_any_shard(1)) fits = false;
  }
  RC_PRE(fits);
  std::vector<Arg> args = {MakeArg(GenTensor(c.q, false), pq), MakeArg(GenTensor(c.k, false), pk),
                           MakeArg(GenTensor(c.v), pk)};
  const Tensor want =
      ops::ScaledDotProductAttention(args[0].full, args[1].full, args[2].full, c.options).value();
  CheckOp(mesh, args, Attention(c.options), {want}, /*exact=*/false, /*no_moves=*/true);
}

// 8 query heads, 2 kv heads on 4 ranks: splitting both puts q heads [2, 4) with kv head 1 on rank
// 1, but they need kv head 0. An error, not a silently gathered kv.
TEST(DopsAttention, InconsistentGqaHeadSplitIsAnError) {
  const Tensor q = RandTensor({1, 8, 3, 2}, 1, false), k = RandTensor({1, 2, 3, 2}, 2, false),
               v = RandTensor({1, 2, 3, 2}, 3, false);
  std::vector<Arg> args = {{q, Pl("S(1)"), 0}, {k, Pl("S(1)"), 0}, {v, Pl("S(1)"), 0}};
  auto res = RunOp({4}, args, Attention({}));
  ASSERT_FALSE(res.ok());
  const std::string msg(res.status().message());
  EXPECT_NE(msg.find("ScaledDotProductAttention"), std::string::npos) << msg;
  EXPECT_NE(msg.find("q [S(1)], k [S(1)] and v [S(1)] on mesh(d0=4)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("inconsistently for GQA (q heads 8, kv heads 2): rank 1 (1) holds q heads "
                     "[2, 4) but kv heads [1, 2)"),
            std::string::npos)
      << msg;
  // Query heads split with kv replicated is fine (each rank picks its kv heads).
  args[1].placements = args[2].placements = Pl("R");
  auto ok = RunOp({4}, args, Attention({}));
  ASSERT_TRUE(ok.ok()) << ok.status();
  const Tensor want = ops::ScaledDotProductAttention(q, k, v).value();
  for (const RankResult& r : *ok) {
    EXPECT_TRUE(AllClose(r.full[0], want, 1e-5, 1e-5).ok());
    EXPECT_EQ(r.comms.total(), 0);
  }
}

RC_GTEST_PROP(DopsEmbedding, MatchesLocal, ()) {
  const auto mesh = GenMesh();
  const int64_t vocab = U<int64_t>(1, 10), hidden = U<int64_t>(1, 5);
  const Shape ids_shape = GenShape(U(1, 3), 1, 4);
  const DType id_dtype = Pick(DType::kI64, DType::kI32);
  // Ids in [-1, vocab]: out-of-range ids give zero rows.
  std::vector<Arg> args = {
      MakeArg(GenTensor({vocab, hidden}), GenPlacements(mesh, 2, true, GenPartialOp(), 2)),
      MakeArg(GenTensor(ids_shape, true, -1, static_cast<int>(vocab), id_dtype),
              GenPlacements(mesh, static_cast<int>(ids_shape.size()), false))};
  const Tensor want = ops::Embedding(args[0].full, args[1].full).value();
  CheckOp(mesh, args, Single([](const std::vector<DTensor>& in) { return Embedding(in[0], in[1]); }),
          {want}, /*exact=*/true);
}

// Vocab-split table (contiguous shards, nested too), hidden-split table, split ids: no
// communication; a vocab split yields Partial(sum).
RC_GTEST_PROP(DopsEmbedding, ParallelLayoutsNeedNoRedistribution, ()) {
  const auto mesh = GenMesh();
  const int64_t vocab = U<int64_t>(1, 12), hidden = U<int64_t>(1, 5);
  const Shape ids_shape = GenShape(U(1, 3), 1, 4);
  Placements pt, pi;
  for (size_t i = 0; i < mesh.size(); ++i) {
    Placement t, d;
    switch (U(0, 4)) {
      case 1: t = Placement::Shard(0); break;
      case 2: t = Placement::Shard(1); break;
      case 3: d = Placement::Shard(U(0, static_cast<int>(ids_shape.size()))); break;
      default: break;
    }
    pt.push_back(t);
    pi.push_back(d);
  }
  std::vector<Arg> args = {MakeArg(GenTensor({vocab, hidden}), pt),
                           MakeArg(GenTensor(ids_shape, true, 0, static_cast<int>(vocab) - 1,
                                             DType::kI64),
                                   pi)};
  const Tensor want = ops::Embedding(args[0].full, args[1].full).value();
  CheckOp(mesh, args, Single([](const std::vector<DTensor>& in) { return Embedding(in[0], in[1]); }),
          {want}, /*exact=*/true, /*no_moves=*/true);
}

}  // namespace
}  // namespace dt::ops::internal::testing
