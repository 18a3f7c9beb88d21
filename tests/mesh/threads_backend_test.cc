// The threads backend against the oracle (tests/mesh/collective_oracle.h), its fault handling
// (a failing rank, a rank that never arrives, mismatched arguments) and its concurrency.

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include <stdlib.h>
#include <tbb/global_control.h>

#include "gtest/gtest.h"
#include "dtensor/mesh/collective.h"
#include "dtensor/mesh/world.h"
#include "rapidcheck/gtest.h"
#include "dtensor/tests/mesh/collective_oracle.h"
#include "dtensor/tests/test_util.h"

namespace dt {
namespace {

using testing::AllCases;
using testing::CollectiveCase;
using testing::RunCase;
using Kind = internal::CollectiveKind;

WorldOptions Quick(int timeout_ms = 5000) {
  WorldOptions o;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  return o;
}

// Runs `body` with the world group on every rank of `n` threads; expects every rank to return OK.
void ExpectOkOnWorldGroup(int n, const std::function<absl::Status(World&, const CommPtr&)>& body) {
  absl::Status st = World::RunThreads(n, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(CommPtr c, w.WorldGroup());
    return body(w, c);
  });
  EXPECT_TRUE(st.ok()) << st;
}

class ThreadsSweep : public ::testing::TestWithParam<int> {};

TEST_P(ThreadsSweep, EveryCollectiveMatchesTheOracle) {
  const int n = GetParam();
  absl::Status st = World::RunThreads(n, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(CommPtr comm, w.WorldGroup());
    for (const CollectiveCase& c : AllCases(n, 7)) DT_RETURN_IF_ERROR(RunCase(*comm, c));
    return absl::OkStatus();
  }, Quick());
  EXPECT_TRUE(st.ok()) << st;
}

INSTANTIATE_TEST_SUITE_P(Sizes, ThreadsSweep, ::testing::Values(1, 2, 3, 4, 8));

// Note [One core budget per node]: an explicit thread count caps the threads backend's process
// too, given as WorldOptions::num_threads or DT_NUM_THREADS (a one-rank llama_generate with
// DT_NUM_THREADS=1 once computed on every core).
TEST(ThreadsBackend, AnExplicitThreadCountCapsTheProcess) {
  auto cap = [] { return tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism); };
  const size_t before = cap();
  WorldOptions one = Quick();
  one.num_threads = 1;
  size_t seen = 0;
  ASSERT_TRUE(World::RunThreads(1, [&](World&) { seen = cap(); return absl::OkStatus(); }, one).ok());
  EXPECT_EQ(seen, 1u);
  ASSERT_EQ(setenv("DT_NUM_THREADS", "2", 1), 0);
  absl::StatusOr<std::shared_ptr<World>> w = World::FromEnv();
  unsetenv("DT_NUM_THREADS");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->backend(), "threads");
  EXPECT_EQ(cap(), 2u);
  WorldOptions restore = Quick();
  restore.num_threads = static_cast<int>(before);
  EXPECT_TRUE(World::RunThreads(1, [](World&) { return absl::OkStatus(); }, restore).ok());
}

TEST(ThreadsBackend, SubgroupsRunConcurrently) {
  // Ranks {0,2} and {1,3} reduce in separate groups at the same time, then all four together.
  absl::Status st = World::RunThreads(4, [](World& w) -> absl::Status {
    std::vector<int> pair = w.rank() % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    DT_ASSIGN_OR_RETURN(CommPtr sub, w.Group(pair));
    EXPECT_EQ(sub->size(), 2);
    EXPECT_EQ(sub->rank(), w.rank() / 2);
    EXPECT_EQ(sub->Describe(), w.rank() % 2 == 0 ? "threads group [0, 2]" : "threads group [1, 3]");
    for (int i = 0; i < 50; ++i) {
      DT_RETURN_IF_ERROR(RunCase(*sub, {Kind::kAllReduce, DType::kF32, ReduceOp::kSum, 64, uint64_t(i)}));
    }
    DT_ASSIGN_OR_RETURN(CommPtr all, w.WorldGroup());
    return RunCase(*all, {Kind::kAllGatherV, DType::kI64, ReduceOp::kSum, 9, 3});
  }, Quick());
  EXPECT_TRUE(st.ok()) << st;
}

TEST(ThreadsBackend, GroupsAreCachedAndValidated) {
  absl::Status st = World::RunThreads(3, [](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(CommPtr a, w.WorldGroup());
    DT_ASSIGN_OR_RETURN(CommPtr b, w.Group({0, 1, 2}));
    EXPECT_EQ(a.get(), b.get());
    EXPECT_EQ(w.Group({0, 0}).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(w.Group({0, 7}).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(w.Group({}).status().code(), absl::StatusCode::kInvalidArgument);
    const int other = (w.rank() + 1) % 3;
    absl::Status not_member = w.Group({other}).status();
    EXPECT_EQ(not_member.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(dt::testing::Contains(not_member, "not a member"));
    return absl::OkStatus();
  });
  EXPECT_TRUE(st.ok()) << st;
}

TEST(ThreadsBackend, AsyncWorkAndReceiveBeforeSend) {
  ExpectOkOnWorldGroup(2, [](World& w, const CommPtr& c) -> absl::Status {
    // Both ranks post the receive first; receives complete on Wait().
    Tensor in = Tensor::Full({4}, w.rank() + 1.0).value();
    Tensor out = Tensor::Zeros({4}).value();
    WorkPtr r = c->RecvAsync(out, 1 - w.rank());
    WorkPtr s = c->SendAsync(in, 1 - w.rank());
    DT_RETURN_IF_ERROR(s->Wait());
    DT_RETURN_IF_ERROR(r->Wait());
    EXPECT_EQ(out.ToVector<float>(), std::vector<float>(4, 2.0f - w.rank()));
    Tensor x = Tensor::Full({3}, 1.0).value();
    WorkPtr a = c->AllReduceAsync(x, ReduceOp::kSum);
    DT_RETURN_IF_ERROR(a->Wait());
    DT_RETURN_IF_ERROR(a->Wait());  // waiting twice is fine
    EXPECT_EQ(x.ToVector<float>(), std::vector<float>(3, 2.0f));
    return absl::OkStatus();
  });
}

// ---- faults ---------------------------------------------------------------------------------

TEST(ThreadsFaults, FailingRankUnblocksPeersWithItsError) {
  std::atomic<int> aborted{0};
  const auto start = std::chrono::steady_clock::now();
  absl::Status st = World::RunThreads(4, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(CommPtr c, w.WorldGroup());
    Tensor x = Tensor::Ones({16}).value();
    DT_RETURN_IF_ERROR(c->AllReduce(x, ReduceOp::kSum));
    if (w.rank() == 2) return absl::InternalError("rank 2 gave up");
    absl::Status s = c->AllReduce(x, ReduceOp::kSum);
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_TRUE(dt::testing::Contains(s, "threads group [0, 1, 2, 3]"));
    EXPECT_TRUE(dt::testing::Contains(s, "all_reduce #1"));
    EXPECT_TRUE(dt::testing::Contains(s, "rank 2 failed: rank 2 gave up"));
    if (s.code() == absl::StatusCode::kAborted) ++aborted;
    return s;
  }, Quick(60'000));
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_EQ(st.message(), "rank 2 gave up");
  EXPECT_EQ(aborted.load(), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));  // not the 60 s timeout
}

TEST(ThreadsFaults, RankThatNeverArrivesTimesOutNamingIt) {
  const auto start = std::chrono::steady_clock::now();
  std::atomic<int> timed_out{0};
  absl::Status st = World::RunThreads(3, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(CommPtr c, w.WorldGroup());
    Tensor x = Tensor::Ones({8}).value();
    Tensor out = Tensor::Empty({24}).value();
    if (w.rank() == 1) {  // stuck elsewhere (and still alive) for longer than the timeout
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      return absl::OkStatus();
    }
    absl::Status s = c->AllGather(x, out);
    EXPECT_TRUE(s.code() == absl::StatusCode::kDeadlineExceeded || s.code() == absl::StatusCode::kAborted) << s;
    EXPECT_TRUE(dt::testing::Contains(s, "all_gather #0"));
    EXPECT_TRUE(dt::testing::Contains(s, "global rank(s) [1]"));
    ++timed_out;
    return s;
  }, Quick(300));
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(timed_out.load(), 2);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(ThreadsFaults, RankThatReturnedFailsPeersAtOnce) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status st = World::RunThreads(2, [&](World& w) -> absl::Status {
    if (w.rank() == 0) return absl::OkStatus();  // forgot the collective
    DT_ASSIGN_OR_RETURN(CommPtr c, w.WorldGroup());
    absl::Status s = c->Barrier();
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_TRUE(dt::testing::Contains(s, "global rank(s) [0] returned from their function"));
    return s;
  }, Quick(60'000));
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(ThreadsFaults, MismatchedSizesFailOnEveryRank) {
  std::atomic<int> errors{0};
  absl::Status st = World::RunThreads(3, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(CommPtr c, w.WorldGroup());
    Tensor x = Tensor::Ones({w.rank() == 2 ? 5 : 4}).value();
    absl::Status s = c->AllReduce(x, ReduceOp::kSum);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(dt::testing::Contains(s,
        "input size: global rank 0 passed 4 elements, global rank 2 passed 5 elements"));
    errors += !s.ok();
    // The group is still usable afterwards.
    Tensor y = Tensor::Ones({2}).value();
    DT_RETURN_IF_ERROR(c->AllReduce(y, ReduceOp::kSum));
    EXPECT_EQ(y.ToVector<float>(), std::vector<float>(2, 3.0f));
    return absl::OkStatus();
  });
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(errors.load(), 3);
}

TEST(ThreadsFaults, MismatchedDTypeOpOrKindFailOnEveryRank) {
  ExpectOkOnWorldGroup(2, [&](World& w, const CommPtr& c) -> absl::Status {
    Tensor x = Tensor::Ones({4}, w.rank() == 0 ? DType::kF32 : DType::kBF16).value();
    absl::Status s = c->AllReduce(x, ReduceOp::kSum);
    EXPECT_TRUE(dt::testing::Contains(s, "disagree on the dtype: global rank 0 passed f32, global rank 1 passed bf16"));
    Tensor y = Tensor::Ones({4}).value();
    s = c->AllReduce(y, w.rank() == 0 ? ReduceOp::kSum : ReduceOp::kMax);
    EXPECT_TRUE(dt::testing::Contains(s, "reduce op: global rank 0 passed sum, global rank 1 passed max"));
    Tensor out = Tensor::Empty({8}).value();
    s = w.rank() == 0 ? c->AllGather(y, out) : c->Broadcast(y, 0);
    EXPECT_TRUE(dt::testing::Contains(s,
        "collective: global rank 0 passed all_gather, global rank 1 passed broadcast"));
    // all_to_all_v: rank 0 sends 2 to rank 1, which expects 3.
    std::vector<int64_t> send = {1, 2}, recv = {1, 3};
    if (w.rank() == 1) send = {3, 1}, recv = {3, 1};
    Tensor in = Tensor::Ones({internal::Sum(send)}).value();
    Tensor got = Tensor::Empty({internal::Sum(recv)}).value();
    s = c->AllToAllV(in, send, got, recv);
    EXPECT_TRUE(dt::testing::Contains(s, "global rank 0 sends 2 elements to global rank 1, which expects 3"));
    return absl::OkStatus();
  });
}

TEST(ThreadsFaults, InvalidArgumentsOnOneRankFailEveryRank) {
  ExpectOkOnWorldGroup(2, [&](World& w, const CommPtr& c) -> absl::Status {
    Tensor x = Tensor::Ones({4}).value();
    Tensor out = Tensor::Empty({w.rank() == 1 ? 7 : 8}).value();  // rank 1's output is too small
    absl::Status s = c->AllGather(x, out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    if (w.rank() == 1) {
      EXPECT_TRUE(dt::testing::Contains(s, "output has 7 elements, expected 8"));
    } else {
      EXPECT_TRUE(dt::testing::Contains(s, "global rank 1 passed invalid arguments"));
    }
    return absl::OkStatus();
  });
}

TEST(ThreadsFaults, LocalArgumentChecks) {
  ExpectOkOnWorldGroup(1, [&](World& w, const CommPtr& c) -> absl::Status {
    Tensor m = Tensor::Ones({4, 4}).value();
    Tensor t = m.Transpose(0, 1).value();
    auto code = [](absl::Status s) { return s.code(); };
    EXPECT_EQ(code(c->AllReduce(t, ReduceOp::kSum)), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(code(c->AllReduce(Tensor(), ReduceOp::kSum)), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(code(c->AllReduce(Tensor::Ones({2}, DType::kBool).value(), ReduceOp::kSum)),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(code(c->AllGather(m, m)), absl::StatusCode::kInvalidArgument);  // overlap
    EXPECT_EQ(code(c->AllGather(m, Tensor::Empty({16}, DType::kI32).value())), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(code(c->Broadcast(m, 1)), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(code(c->Send(m, 0)), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(code(c->AllGatherV(m, Tensor::Empty({16}).value(), {16, 0})), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(code(c->AllGatherV(m, Tensor::Empty({16}).value(), {-1})), absl::StatusCode::kInvalidArgument);
    absl::Status s = c->ReduceScatter(m, Tensor::Empty({3}).value(), ReduceOp::kSum);
    EXPECT_EQ(std::string(s.message()), "threads group [0], global rank 0: reduce_scatter #8 (f32[4, 4] cpu -> f32[3] cpu, sum): "
                           "input has 16 elements, expected 3 (group size 1 x output 3)");
    return absl::OkStatus();
  });
}

TEST(ThreadsFaults, AllToAllViewsFailuresNameTheCollective) {
  // Counts that disagree fail every rank, naming both; a rank that fails unblocks the others.
  std::atomic<int> aborted{0};
  absl::Status st = World::RunThreads(3, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(CommPtr c, w.WorldGroup());
    Tensor x = Tensor::Ones({4, 6}).value(), out = Tensor::Empty({12, 2}).value();
    std::vector<TensorViews> send, recv;
    for (int p = 0; p < 3; ++p) {
      send.push_back({x.Narrow(1, 2 * p, 2).value()});
      recv.push_back({out.Narrow(0, 4 * p, w.rank() == 1 && p == 0 ? 3 : 4).value()});
    }
    absl::Status s = c->AllToAllViews(send, recv);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(dt::testing::Contains(s, "all_to_all_views #0 (f32 views, counts [8, 8, 8], recv_counts ["));
    EXPECT_TRUE(dt::testing::Contains(s, "global rank 0 sends 8 elements to global rank 1, which expects 6"));
    recv[0] = {out.Narrow(0, 0, 4).value()};
    DT_RETURN_IF_ERROR(c->AllToAllViews(send, recv));  // the group is still usable
    if (w.rank() == 2) return absl::InternalError("rank 2 gave up");
    s = c->AllToAllViews(send, recv);
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_TRUE(dt::testing::Contains(s, "all_to_all_views #2"));
    EXPECT_TRUE(dt::testing::Contains(s, "rank 2 failed: rank 2 gave up"));
    aborted += s.code() == absl::StatusCode::kAborted;
    return s;
  }, Quick(60'000));
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_EQ(aborted.load(), 2);
}

TEST(ThreadsFaults, AllToAllViewsArgumentChecks) {
  ExpectOkOnWorldGroup(1, [&](World& w, const CommPtr& c) -> absl::Status {
    Tensor x = Tensor::Ones({4, 4}).value(), out = Tensor::Empty({4, 4}).value();
    auto message = [&](std::vector<TensorViews> send, std::vector<TensorViews> recv) {
      absl::Status s = c->AllToAllViews(std::move(send), std::move(recv));
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      return std::string(s.message());
    };
    auto has = [](const std::string& text, const std::string& part) {
      EXPECT_NE(text.find(part), std::string::npos) << text;
    };
    has(message({{x}, {x}}, {{out}}), "send has 2 entries, expected one list of views per rank (1)");
    has(message({{x}}, {{Tensor()}}), "recv[0][0] is undefined");
    has(message({{x}}, {{out.Narrow(0, 0, 2).value(), Tensor::Empty({8}, DType::kI32).value()}}),
        "recv[0][1] i32[8] cpu differs in dtype from the first view (f32)");
    has(message({{x.Transpose(0, 1).value()}}, {{x.Narrow(1, 1, 2).value()}}),
        "recv[0][0] f32[4, 2] cpu shares bytes with a send view; use separate buffers");
    has(message({{}}, {{}}), "no views: every rank passes at least one (a zero-size view is fine)");
    float ro_data[16] = {};
    Tensor ro(Storage::Wrap(ro_data, sizeof(ro_data), kCPU, nullptr, /*read_only=*/true), {16}, {1}, 0, DType::kF32);
    has(message({{x}}, {{ro}}), "recv[0][0] f32[16] cpu is read-only");
    // Strided and zero-size views are fine; the transpose travels in row-major order of the view.
    Tensor m = Tensor::Arange(0, 16).value().View({4, 4}).value();
    DT_RETURN_IF_ERROR(c->AllToAllViews({{m.Transpose(0, 1).value(), m.Narrow(0, 0, 0).value()}}, {{out}}));
    EXPECT_EQ(out.ToVector<float>(), m.Transpose(0, 1).value().ToVector<float>());
    return absl::OkStatus();
  });
}

TEST(ThreadsViews, StagedDefaultPathMatchesTheOracle) {
  // The default all_to_all_views (pack, all_to_all_v, unpack) that nccl uses, on every dtype.
  for (int n : {1, 2, 3, 4}) {
    absl::Status st = World::RunThreads(n, [&](World& w) -> absl::Status {
      DT_ASSIGN_OR_RETURN(CommPtr comm, w.WorldGroup());
      (*comm).set_stage_views(true);
      for (const CollectiveCase& c : AllCases(n, 3)) {
        if (c.kind == Kind::kAllToAllViews) DT_RETURN_IF_ERROR(RunCase(*comm, c));
      }
      return absl::OkStatus();
    }, Quick());
    EXPECT_TRUE(st.ok()) << st;
  }
}

TEST(ThreadsFaults, RunThreadsRejectsBadCounts) {
  EXPECT_EQ(World::RunThreads(0, [](World&) { return absl::OkStatus(); }).code(), absl::StatusCode::kInvalidArgument);
}

// ---- properties -------------------------------------------------------------------------------

RC_GTEST_PROP(ThreadsProperties, RandomCollectivesMatchTheOracle, ()) {
  const int n = *rc::gen::inRange(1, 9);
  const auto kind = *rc::gen::element(Kind::kAllReduce, Kind::kAllGather, Kind::kAllGatherV, Kind::kReduceScatter,
                                      Kind::kReduceScatterV, Kind::kAllToAll, Kind::kAllToAllV, Kind::kAllToAllViews,
                                      Kind::kBroadcast, Kind::kSend);
  const DType dtype = *rc::gen::element(DType::kF32, DType::kF16, DType::kBF16, DType::kI64, DType::kI32, DType::kU8);
  const ReduceOp op = *rc::gen::element(ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProd);
  const int64_t count = *rc::gen::inRange<int64_t>(0, 200);
  const uint64_t seed = *rc::gen::arbitrary<uint32_t>();
  const int root = *rc::gen::inRange(0, n);
  const CollectiveCase c{kind, dtype, op, count, seed, root};
  absl::Status st = World::RunThreads(n, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(CommPtr comm, w.WorldGroup());
    return RunCase(*comm, c);
  }, Quick());
  RC_ASSERT(st.ok());
}

// One view of `numel` elements shaped `shape` with arbitrary strides: a permutation of a padded
// base tensor, narrowed back to `shape`.
Tensor StridedView(const std::vector<int64_t>& shape, const std::vector<int64_t>& perm, const std::vector<int64_t>& pad,
                   DType dtype) {
  const int nd = static_cast<int>(shape.size());
  std::vector<int64_t> base_shape(nd), inverse(nd);
  for (int i = 0; i < nd; ++i) base_shape[i] = shape[perm[i]] + pad[i];
  for (int i = 0; i < nd; ++i) inverse[perm[i]] = i;
  Tensor v = Tensor::Zeros(base_shape, dtype).value().Permute(inverse).value();
  for (int d = 0; d < nd; ++d) v = v.Narrow(d, pad[inverse[d]] / 2, shape[d]).value();
  return v;
}

// The value rank `src` sends rank `dst` at stream position i.
double StreamValue(int src, int dst, int64_t i, DType dtype) {
  const int64_t v = (src * 7 + dst * 3 + i) % 50;
  return dtype == DType::kBool ? static_cast<double>(v % 2) : static_cast<double>(v);
}

RC_GTEST_PROP(ThreadsViews, RandomStridedViewsCarryTheStreamInOrder, ()) {
  // Every pair's stream is cut into views of different shapes and strides on each side; what the
  // receiver reads back, view after view in row-major order, must be the sender's stream.
  const int n = *rc::gen::inRange(1, 5);
  const DType dtype = *rc::gen::element(DType::kF32, DType::kF16, DType::kBF16, DType::kI64, DType::kI32, DType::kU8,
                                        DType::kBool);
  struct Side {
    std::vector<std::vector<int64_t>> shapes, perms, pads;  // one entry per view
  };
  std::vector<std::vector<Side>> send(n, std::vector<Side>(n)), recv(n, std::vector<Side>(n));
  auto random_view = [&](Side& side, std::vector<int64_t> shape) {
    std::vector<int64_t> perm(shape.size());
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
    for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[*rc::gen::inRange<size_t>(0, i)]);
    side.shapes.push_back(shape);
    side.perms.push_back(perm);
    side.pads.push_back(*rc::gen::container<std::vector<int64_t>>(shape.size(), rc::gen::inRange<int64_t>(0, 3)));
  };
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      // The sender: one 3-d view (or two: a 3-d and a 1-d one); the receiver: the total as a 1-d
      // strided view and a 2-d one.
      const auto dims = *rc::gen::container<std::vector<int64_t>>(3, rc::gen::inRange<int64_t>(0, 5));
      random_view(send[s][d], dims);
      const int64_t extra = *rc::gen::inRange<int64_t>(0, 6);
      if (extra > 0) random_view(send[s][d], {extra});
      const int64_t total = dims[0] * dims[1] * dims[2] + extra;
      const int64_t rows = *rc::gen::inRange<int64_t>(1, 4);
      // head <= total and total - head is a multiple of rows, by construction.
      const int64_t head = total % rows + rows * *rc::gen::inRange<int64_t>(0, total / rows + 1);
      random_view(recv[d][s], {head});
      random_view(recv[d][s], {rows, (total - head) / rows});
    }
  }
  absl::Status st = World::RunThreads(n, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(CommPtr comm, w.WorldGroup());
    const int me = w.rank();
    std::vector<TensorViews> sv(n), rv(n);
    for (int p = 0; p < n; ++p) {
      int64_t at = 0;
      for (size_t k = 0; k < send[me][p].shapes.size(); ++k) {
        const Side& side = send[me][p];
        Tensor v = StridedView(side.shapes[k], side.perms[k], side.pads[k], dtype);
        std::vector<double> vals(v.numel());
        for (int64_t i = 0; i < v.numel(); ++i) vals[i] = StreamValue(me, p, at + i, dtype);
        DT_RETURN_IF_ERROR(v.CopyFrom(Tensor::FromDoubles(v.shape(), vals, dtype).value()));
        at += v.numel();
        sv[p].push_back(v);
      }
      for (size_t k = 0; k < recv[me][p].shapes.size(); ++k) {
        const Side& side = recv[me][p];
        rv[p].push_back(StridedView(side.shapes[k], side.perms[k], side.pads[k], dtype));
      }
    }
    DT_RETURN_IF_ERROR(comm->AllToAllViews(sv, rv));
    for (int q = 0; q < n; ++q) {
      int64_t at = 0;
      for (const Tensor& v : rv[q]) {
        const std::vector<double> got = v.ToDoubles();
        for (int64_t i = 0; i < v.numel(); ++i) {
          if (got[i] != StreamValue(q, me, at + i, dtype)) {
            return absl::InternalError(absl::StrCat("rank ", me, " from ", q, " at ", at + i, ": got ", got[i]));
          }
        }
        at += v.numel();
      }
    }
    return absl::OkStatus();
  }, Quick());
  RC_ASSERT(st.ok());
}

}  // namespace
}  // namespace dt
