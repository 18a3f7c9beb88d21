// bench/collectives: algorithm bandwidth of our all_gather, all_reduce, reduce_scatter and
// all_to_all per backend, each beside the raw backend call and memcpy, measured in the same run;
// and all_to_all_views, the all_to_all of strided blocks a shard-dim change sends (each rank's
// buffer as [rows, size*1024] floats, column block r to rank r, received as contiguous row blocks;
// see Note [All-to-all over views] in mesh/collective.h) beside the same raw all_to_all of
// contiguous blocks.
//
//   bench_collectives [--quick] [--backends threads,shm,gloo,mpi] [--ranks 2,4] [--rep-scale K]
//                     [--null] [--latency]      (--help says what each flag does)
//       every configuration: threads in-process, shm and gloo through dtrun, mpi through mpirun;
//       with --worker shm|gloo|mpi, one rank of one configuration (what the driver launches)
//
// Sizes follow nccl-tests: S is the whole buffer per rank (all_reduce's buffer, all_gather's output,
// reduce_scatter's input, all_to_all's input); algbw = S / time, in GB/s (1e9 bytes). A sample
// is a barrier, then kCallsPerSample calls back to back, timed together (the per-call time is
// their mean, as nccl-tests does: a barrier before every single call adds its exit skew to each
// one, which on a loaded 2-core VM is milliseconds). Per repetition we take one sample of ours and
// one of the raw call on the same buffers (ABBA order), take the slowest rank of each, and report
// the median time and the median of the per-repetition ratios ours/raw.
//   Precision (measured with --null, the raw call against itself, 2-vCPU VM): with one call per
// sample and a barrier before each, the ratio of identical calls spread with sd 7% (0.83-1.36)
// and a fifth of them 'failed' 1.05; with 4 calls per sample and the repetitions below, sd 2.6%.
//   raw gloo     gloo::allreduce/allgather/alltoall with gloo::sum on a context of our own, and
//                gloo's ReduceScatterHalvingDoubling (its only reduce_scatter) made once, on a
//                second context; the barriers run on a third (see GlooRaw and Raw for why)
//   raw mpi      MPI_Allreduce/Allgather/Reduce_scatter_block/Alltoall on MPI_COMM_WORLD
//   raw threads  the same shared-memory algorithm written directly against std::barrier
//   memcpy       every rank copies S bytes at once (the memory-bandwidth ceiling)
// --quick measures 1 and 16 MiB only. Ends with one line per (backend, ranks, op, size >= 16 MiB):
//   RESULT <op>_<backend>_<n>r_<S>MiB_overhead <ours/raw> 1.05 PASS|FAIL
// all_to_all_views has no raw call of its own (no backend sends strided blocks without packing),
// so its rows are shown but carry no RESULT: its target is bench_redistribute's S(0)->S(1) line.
// shm has no raw call of its own either (its rows show ours and memcpy only): its bandwidth target
// is MPI's raw call, from the mpi rows of the same run,
//   RESULT shm_<op>_<n>r_16MiB_vs_mpi <MPI's raw time / shm's time> 0.9 PASS|FAIL
//
// Latency (what a decode step sees: 61 collectives of 2.3 KB per token for SmolLM2-135M):
// all_reduce and all_gather of 8 B, 2.3 KB (576 floats) and 64 KiB per rank (all_gather: each
// rank's input), timed call by call, back to back after one barrier, ours and the raw call in
// alternating blocks of 10 calls; p50 over calls of the slowest rank's time. Raw: the same calls
// as above (shm's: gloo's allreduce/allgather on a context of its own in the same processes).
//   RESULT shm_all_reduce_2.3KB_2r_vs_gloo <shm p50 / raw gloo p50> 0.1 PASS|FAIL

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "dtensor/bench/bench_util.h"
#include "absl/strings/str_split.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/alltoall.h"
#include "gloo/math.h"
#include "gloo/reduce_scatter.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "dtensor/mesh/collective.h"
#include "dtensor/mesh/gloo_store.h"
#include "dtensor/mesh/tcp_store.h"
#include "dtensor/mesh/world.h"

namespace dt {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kCallsPerSample = 4;
const char* const kOps[] = {"all_gather", "all_reduce", "reduce_scatter", "all_to_all", "all_to_all_views"};
constexpr int kNumOps = sizeof(kOps) / sizeof(kOps[0]);

struct Row {
  std::string backend;
  int n = 0;
  std::string op;
  int mib = 0;
  double ours_ms = 0, raw_ms = 0, memcpy_ms = 0;  // medians
  double ratio = 0;  // median over repetitions of ours / raw (measured back to back)
};

// p50 latency of one op and size, ours and the backend's raw call (see the top of this file).
struct LatRow {
  std::string backend;
  int n = 0;
  std::string op;
  int64_t bytes = 0;  // per rank
  double ours_us = 0, raw_us = 0;
};
constexpr int64_t kLatencyBytes[] = {8, 2304, 65536};

// Latency of a small all_reduce with and without argument verification (mesh/collective.h).
struct Latency {
  std::string backend;
  int n = 0;
  double verify_us = 0, plain_us = 0;
};

// The raw backend call for each op on float buffers, and the barrier that lines the ranks up
// before each sample. The barrier must not run on the sockets of either side: on gloo, a barrier's
// small request/response messages just before a bulk transfer on the same TCP connection slowed
// that transfer by about 20% (16 MiB all_reduce over loopback, 2 ranks), which would charge a cost
// of the benchmark's own barrier to whichever side shared its context.
class Raw {
 public:
  virtual ~Raw() = default;
  virtual void Barrier() = 0;
  virtual void AllReduce(float* buf, int64_t count) = 0;
  virtual void AllGather(const float* in, float* out, int64_t per_rank) = 0;
  virtual void ReduceScatter(float* in, float* out, int64_t per_rank) = 0;
  virtual void AllToAll(const float* in, float* out, int64_t total) = 0;
};

class MpiRaw final : public Raw {
 public:
  void Barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  void AllReduce(float* buf, int64_t count) override {
    MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  void AllGather(const float* in, float* out, int64_t k) override {
    MPI_Allgather(in, static_cast<int>(k), MPI_FLOAT, out, static_cast<int>(k), MPI_FLOAT, MPI_COMM_WORLD);
  }
  void ReduceScatter(float* in, float* out, int64_t k) override {
    MPI_Reduce_scatter_block(in, out, static_cast<int>(k), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  void AllToAll(const float* in, float* out, int64_t total) override {
    int n;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    const int k = static_cast<int>(total / n);
    MPI_Alltoall(in, k, MPI_FLOAT, out, k, MPI_FLOAT, MPI_COMM_WORLD);
  }
};

class GlooRaw final : public Raw {
 public:
  GlooRaw(int rank, int n) : rank_(rank), n_(n) {
    const char* addr = std::getenv("MASTER_ADDR");
    const char* port = std::getenv("MASTER_PORT");
    store_ = internal::TcpStore::Connect(addr ? addr : "127.0.0.1", port ? std::atoi(port) : 0, 1000 + rank,
                                         std::chrono::seconds(60)).value();
    internal::GlooStore adapter(*store_, std::chrono::seconds(60));
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    attr.ai_family = AF_INET;
    device_ = gloo::transport::tcp::CreateDevice(attr);
    for (auto* ctx : {&ctx_, &rs_ctx_, &sync_ctx_}) {
      auto made = std::make_shared<gloo::rendezvous::Context>(rank, n);
      made->setTimeout(std::chrono::seconds(60));
      const std::string prefix = absl::StrCat("bench/raw/", ctx == &ctx_ ? "ops" : ctx == &rs_ctx_ ? "rs" : "sync", "/");
      gloo::rendezvous::PrefixStore prefixed(prefix, adapter);
      made->connectFullMesh(prefixed, device_);
      *ctx = made;
    }
  }
  void Barrier() override {
    gloo::BarrierOptions o(sync_ctx_);
    o.setTag(sync_tag_++);
    gloo::barrier(o);
  }
  void AllReduce(float* buf, int64_t count) override {
    gloo::AllreduceOptions o(ctx_);
    o.setOutput(buf, count);
    o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    o.setTag(tag_++);
    gloo::allreduce(o);
  }
  void AllGather(const float* in, float* out, int64_t k) override {
    gloo::AllgatherOptions o(ctx_);
    o.setInput(const_cast<float*>(in), k);
    o.setOutput(out, k * n_);
    o.setTag(tag_++);
    gloo::allgather(o);
  }
  void ReduceScatter(float* in, float* out, int64_t k) override {
    auto key = std::make_pair(static_cast<const void*>(in), k);
    auto& algo = rs_[key];
    if (!algo) {
      algo = std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(
          rs_ctx_, std::vector<float*>{in}, static_cast<int>(k * n_), std::vector<int>(n_, static_cast<int>(k)));
    }
    algo->run();  // in place: block `rank` of `in` holds the result
    std::memcpy(out, in + rank_ * k, k * sizeof(float));
  }
  void AllToAll(const float* in, float* out, int64_t total) override {
    gloo::AlltoallOptions o(ctx_);
    o.setInput(const_cast<float*>(in), total);
    o.setOutput(out, total);
    o.setTag(tag_++);
    gloo::alltoall(o);
  }

 private:
  int rank_, n_;
  uint32_t tag_ = 1, sync_tag_ = 1;
  std::unique_ptr<internal::TcpStore> store_;
  std::shared_ptr<gloo::transport::Device> device_;
  // ReduceScatterHalvingDoubling uses gloo's older buffer API, whose sends set SO_SNDBUF on the
  // pair's socket to the message size, which stays locked afterwards (autotuning off). That socket
  // state changes the speed of every later call on the context (at 16 MiB over loopback the
  // unbound-buffer collectives ran 1.1-1.4x faster with it), so it gets a context of its own and
  // the raw all_gather/all_reduce/all_to_all run on sockets in the same state as ours. The
  // barriers have a third context (see Raw).
  std::shared_ptr<gloo::Context> ctx_, rs_ctx_, sync_ctx_;
  std::map<std::pair<const void*, int64_t>, std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>>> rs_;
};

// The threads backend's algorithm (see mesh/threads_backend.cc) written directly: pointers in a
// shared table, std::barrier between phases.
struct ThreadsShared {
  explicit ThreadsShared(int n) : n(n), in(n), out(n), bar(n) {}
  int n;
  std::vector<const float*> in;
  std::vector<float*> out;
  std::vector<float> scratch;
  std::barrier<> bar;
};

class ThreadsRaw final : public Raw {
 public:
  ThreadsRaw(ThreadsShared& s, int rank) : s_(s), r_(rank) {}
  void Barrier() override { s_.bar.arrive_and_wait(); }
  void AllReduce(float* buf, int64_t count) override {
    Post(buf, buf);
    if (r_ == 0 && static_cast<int64_t>(s_.scratch.size()) < count) s_.scratch.resize(count);
    s_.bar.arrive_and_wait();
    const int64_t b = count * r_ / s_.n, e = count * (r_ + 1) / s_.n;
    float* acc = s_.scratch.data();
    std::memcpy(acc + b, s_.in[0] + b, (e - b) * sizeof(float));
    for (int i = 1; i < s_.n; ++i) {
      const float* src = s_.in[i];
      for (int64_t j = b; j < e; ++j) acc[j] += src[j];
    }
    s_.bar.arrive_and_wait();
    std::memcpy(buf, acc, count * sizeof(float));
    s_.bar.arrive_and_wait();
  }
  void AllGather(const float* in, float* out, int64_t k) override {
    Post(in, out);
    for (int i = 0; i < s_.n; ++i) std::memcpy(out + i * k, s_.in[i], k * sizeof(float));
    s_.bar.arrive_and_wait();
  }
  void ReduceScatter(float* in, float* out, int64_t k) override {
    Post(in, out);
    std::memcpy(out, s_.in[0] + r_ * k, k * sizeof(float));
    for (int i = 1; i < s_.n; ++i) {
      const float* src = s_.in[i] + r_ * k;
      for (int64_t j = 0; j < k; ++j) out[j] += src[j];
    }
    s_.bar.arrive_and_wait();
  }
  void AllToAll(const float* in, float* out, int64_t total) override {
    Post(in, out);
    const int64_t k = total / s_.n;
    for (int i = 0; i < s_.n; ++i) std::memcpy(out + i * k, s_.in[i] + r_ * k, k * sizeof(float));
    s_.bar.arrive_and_wait();
  }

 private:
  void Post(const float* in, float* out) {
    s_.in[r_] = in;
    s_.out[r_] = out;
    s_.bar.arrive_and_wait();
  }
  ThreadsShared& s_;
  int r_;
};

struct Options {
  bool quick = false;
  std::string worker;                                      // "" = driver
  std::vector<std::string> backends = {"threads", "shm", "gloo", "mpi"};
  std::vector<int> ranks = {2, 4};
  int rep_scale = 1;                                       // multiplies the repetitions
  bool null = false;                                       // "ours" is the raw call too
  bool latency_only = false;                               // --latency: only the latency rows
};

// Buffer sizes S in MiB. --quick leaves out 64 MiB (more than half of the full run's time).
std::vector<int> Sizes(const Options& opt) { return opt.quick ? std::vector<int>{1, 16} : std::vector<int>{1, 16, 64}; }

double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

// Runs every op and size on `world`; rank 0 returns the rows.
absl::StatusOr<std::vector<Row>> Measure(World& world, Raw& raw, const Options& opt) {
  if (opt.latency_only) return std::vector<Row>();
  const bool quick = opt.quick;
  DT_ASSIGN_OR_RETURN(CommPtr comm, world.WorldGroup());
  const int n = world.size(), me = world.rank();
  std::vector<Row> rows;
  for (int mib : Sizes(opt)) {
    const int64_t count = int64_t{mib} * 1024 * 1024 / 4;  // S in floats
    // Samples per op; each times kCallsPerSample calls back to back (see the top of this file).
    const int reps = opt.rep_scale * (mib == 1    ? (quick ? 8 : 50)
                                      : mib == 16 ? (quick ? 16 : 96)
                                                  : (quick ? 12 : 32));
    // Ours and the raw call work on the same buffers, so that page placement (huge pages or not)
    // cannot favour either.
    DT_ASSIGN_OR_RETURN(Tensor a, Tensor::Full({count}, 1.0f));
    DT_ASSIGN_OR_RETURN(Tensor b, Tensor::Zeros({count}));
    DT_ASSIGN_OR_RETURN(Tensor small, Tensor::Full({count / n}, 1.0f));
    DT_ASSIGN_OR_RETURN(Tensor small_out, Tensor::Zeros({count / n}));
    // all_to_all_views: a as [rows, n*cols], column block r for rank r; b as n blocks of [rows, cols].
    const int64_t cols = 1024, view_rows = count / (n * cols);
    std::vector<TensorViews> views_send(n), views_recv(n);
    DT_ASSIGN_OR_RETURN(Tensor a2, a.Narrow(0, 0, view_rows * n * cols));
    DT_ASSIGN_OR_RETURN(a2, a2.View({view_rows, n * cols}));
    DT_ASSIGN_OR_RETURN(Tensor b2, b.Narrow(0, 0, view_rows * n * cols));
    DT_ASSIGN_OR_RETURN(b2, b2.View({n * view_rows, cols}));
    for (int r = 0; r < n; ++r) {
      DT_ASSIGN_OR_RETURN(Tensor sv, a2.Narrow(1, r * cols, cols));
      DT_ASSIGN_OR_RETURN(Tensor rv, b2.Narrow(0, r * view_rows, view_rows));
      views_send[r] = {sv};
      views_recv[r] = {rv};
    }
    float* ra = a.data<float>();
    float* rb = b.data<float>();
    float* rsmall = small.data<float>();
    float* rsmall_out = small_out.data<float>();
    for (const char* op : kOps) {
      const std::string name = op;
      auto theirs = [&]() -> absl::Status {
        if (name == "all_reduce") {
          raw.AllReduce(ra, count);
        } else if (name == "all_gather") {
          raw.AllGather(rsmall, rb, count / n);
        } else if (name == "reduce_scatter") {
          raw.ReduceScatter(ra, rsmall_out, count / n);
        } else {
          raw.AllToAll(ra, rb, count);
        }
        return absl::OkStatus();
      };
      auto ours = [&]() -> absl::Status {
        if (opt.null) return theirs();
        if (name == "all_reduce") return comm->AllReduce(a, ReduceOp::kSum);
        if (name == "all_gather") return comm->AllGather(small, b);
        if (name == "reduce_scatter") return comm->ReduceScatter(a, small_out, ReduceOp::kSum);
        if (name == "all_to_all_views") return comm->AllToAllViews(views_send, views_recv);
        return comm->AllToAll(a, b);
      };
      // One sample: the ranks lined up, then kCallsPerSample calls; the time per call.
      auto sample = [&](const auto& call) -> absl::StatusOr<double> {
        raw.Barrier();
        const auto t0 = Clock::now();
        for (int k = 0; k < kCallsPerSample; ++k) DT_RETURN_IF_ERROR(call());
        return Ms(t0, Clock::now()) / kCallsPerSample;
      };
      // shm has no raw call of its own (its target is MPI's, from the mpi rows): ours alone.
      const bool no_raw = world.backend() == "shm" && !opt.null;
      DT_RETURN_IF_ERROR(ours());
      if (!no_raw) DT_RETURN_IF_ERROR(theirs());
      std::vector<float> t_ours, t_raw, t_copy;
      for (int i = 0; i < reps; ++i) {
        // Alternate which goes first (ABBA), so that neither always runs on the warmer machine.
        double ms_ours = 0, ms_raw = 0;
        if (no_raw) {
          DT_ASSIGN_OR_RETURN(ms_ours, sample(ours));
        } else if (i % 4 == 0 || i % 4 == 3) {
          DT_ASSIGN_OR_RETURN(ms_ours, sample(ours));
          DT_ASSIGN_OR_RETURN(ms_raw, sample(theirs));
        } else {
          DT_ASSIGN_OR_RETURN(ms_raw, sample(theirs));
          DT_ASSIGN_OR_RETURN(ms_ours, sample(ours));
        }
        raw.Barrier();
        auto t4 = Clock::now();
        std::memcpy(rb, ra, count * sizeof(float));
        auto t5 = Clock::now();
        t_ours.push_back(static_cast<float>(ms_ours));
        t_raw.push_back(static_cast<float>(ms_raw));
        t_copy.push_back(static_cast<float>(Ms(t4, t5)));
        if (i % 4 == 3) DT_RETURN_IF_ERROR(a.Fill(1.0));  // the reductions keep summing into `a`
      }
      // The slowest rank per repetition, then the median.
      std::vector<float> all(t_ours);
      all.insert(all.end(), t_raw.begin(), t_raw.end());
      all.insert(all.end(), t_copy.begin(), t_copy.end());
      DT_ASSIGN_OR_RETURN(Tensor times, Tensor::FromVector<float>({static_cast<int64_t>(all.size())}, all));
      DT_RETURN_IF_ERROR(comm->AllReduce(times, ReduceOp::kMax));
      std::vector<float> slow = times.ToVector<float>();
      auto median = [&](int k) {
        return bench::Median(std::vector<double>(slow.begin() + k * reps, slow.begin() + (k + 1) * reps));
      };
      std::vector<double> ratios;
      for (int i = 0; i < reps; ++i) ratios.push_back(no_raw ? 0 : slow[i] / slow[reps + i]);
      if (me == 0) {
        rows.push_back(Row{std::string(world.backend()), n, name, mib, median(0), median(1), median(2),
                           bench::Median(ratios)});
      }
    }
  }
  return rows;
}

// Per-call p50 of all_reduce and all_gather at kLatencyBytes (see the top of this file).
absl::StatusOr<std::vector<LatRow>> MeasureSmall(World& world, Raw& raw, const Options& opt) {
  DT_ASSIGN_OR_RETURN(CommPtr comm, world.WorldGroup());
  const int n = world.size();
  const int blocks = opt.quick ? 4 : 30;  // of 10 calls each side
  std::vector<LatRow> rows;
  for (const char* op : {"all_reduce", "all_gather"}) {
    const bool reduce = std::string(op) == "all_reduce";
    for (int64_t bytes : kLatencyBytes) {
      const int64_t count = bytes / 4;
      DT_ASSIGN_OR_RETURN(Tensor x, Tensor::Full({count}, 1.0f));
      DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Zeros({count * n}));
      auto ours = [&]() -> absl::Status {
        return reduce ? comm->AllReduce(x, ReduceOp::kSum) : comm->AllGather(x, out);
      };
      auto theirs = [&]() -> absl::Status {
        if (reduce) {
          raw.AllReduce(x.data<float>(), count);
        } else {
          raw.AllGather(x.data<float>(), out.data<float>(), count);
        }
        return absl::OkStatus();
      };
      DT_RETURN_IF_ERROR(ours());
      DT_RETURN_IF_ERROR(theirs());
      std::vector<float> t_ours, t_raw;
      raw.Barrier();
      for (int b = 0; b < blocks; ++b) {
        for (int side = 0; side < 2; ++side) {
          const bool mine = (side == 0) == (b % 2 == 0);
          for (int k = 0; k < 10; ++k) {
            const auto t0 = Clock::now();
            DT_RETURN_IF_ERROR(mine ? ours() : theirs());
            (mine ? t_ours : t_raw).push_back(static_cast<float>(Ms(t0, Clock::now()) * 1000));
          }
        }
        if (reduce && b % 4 == 3) DT_RETURN_IF_ERROR(x.Fill(1.0));  // keep the sums finite
      }
      std::vector<float> all(t_ours);
      all.insert(all.end(), t_raw.begin(), t_raw.end());
      DT_ASSIGN_OR_RETURN(Tensor times, Tensor::FromVector<float>({static_cast<int64_t>(all.size())}, all));
      DT_RETURN_IF_ERROR(comm->AllReduce(times, ReduceOp::kMax));
      const std::vector<float> slow = times.ToVector<float>();
      const size_t k = t_ours.size();
      rows.push_back(LatRow{std::string(world.backend()), n, op, bytes,
                            bench::Median(std::vector<double>(slow.begin(), slow.begin() + k)),
                            bench::Median(std::vector<double>(slow.begin() + k, slow.end()))});
    }
  }
  return rows;
}

absl::StatusOr<Latency> MeasureLatency(World& world) {
  DT_ASSIGN_OR_RETURN(CommPtr comm, world.WorldGroup());
  auto* backend = comm.get();
  if (backend == nullptr) return absl::InternalError("no communicator");
  DT_ASSIGN_OR_RETURN(Tensor x, Tensor::Zeros({8}));
  Latency lat{std::string(world.backend()), world.size()};
  for (bool verify : {true, false, true, false}) {
    backend->set_verify(verify);
    std::vector<float> t;
    for (int i = 0; i < 40; ++i) {
      DT_RETURN_IF_ERROR(comm->Barrier());
      auto t0 = Clock::now();
      DT_RETURN_IF_ERROR(comm->AllReduce(x, ReduceOp::kSum));
      t.push_back(static_cast<float>(Ms(t0, Clock::now()) * 1000));
    }
    DT_ASSIGN_OR_RETURN(Tensor times, Tensor::FromVector<float>({static_cast<int64_t>(t.size())}, t));
    DT_RETURN_IF_ERROR(comm->AllReduce(times, ReduceOp::kMax));
    const std::vector<float> v = times.ToVector<float>();
    // the second round (warm) wins
    (verify ? lat.verify_us : lat.plain_us) = bench::Median(std::vector<double>(v.begin(), v.end()));
  }
  backend->set_verify(world.options().verify.value_or(world.backend() == "mpi"));
  return lat;
}

void PrintRows(const std::vector<Row>& rows, const std::vector<LatRow>& small, const Latency& lat) {
  for (const Row& r : rows) {
    std::printf("ROW %s %d %s %d %.4f %.4f %.4f %.4f\n", r.backend.c_str(), r.n, r.op.c_str(), r.mib, r.ours_ms,
                r.raw_ms, r.memcpy_ms, r.ratio);
  }
  for (const LatRow& r : small) {
    std::printf("LATROW %s %d %s %lld %.2f %.2f\n", r.backend.c_str(), r.n, r.op.c_str(),
                static_cast<long long>(r.bytes), r.ours_us, r.raw_us);
  }
  std::printf("LAT %s %d %.1f %.1f\n", lat.backend.c_str(), lat.n, lat.verify_us, lat.plain_us);
  std::fflush(stdout);
}

int Worker(const Options& opt) {
  absl::StatusOr<std::shared_ptr<World>> w = World::FromEnv();
  if (!w.ok()) {
    std::fprintf(stderr, "collectives: %s\n", std::string(w.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<Raw> raw;
  if ((*w)->backend() == "mpi") {
    raw = std::make_unique<MpiRaw>();
  } else {
    raw = std::make_unique<GlooRaw>((*w)->rank(), (*w)->size());
  }
  absl::StatusOr<std::vector<Row>> rows = Measure(**w, *raw, opt);
  absl::StatusOr<std::vector<LatRow>> small = rows.ok() ? MeasureSmall(**w, *raw, opt) : rows.status();
  absl::StatusOr<Latency> lat = small.ok() ? MeasureLatency(**w) : small.status();
  if (!lat.ok()) {
    std::fprintf(stderr, "collectives: %s\n", std::string(lat.status().message()).c_str());
    return 1;
  }
  if ((*w)->rank() == 0) PrintRows(*rows, *small, *lat);
  return 0;
}

std::vector<Row> RunThreads(int n, const Options& opt, std::vector<LatRow>* small) {
  ThreadsShared shared(n);
  std::vector<Row> rows;
  absl::Status st = World::RunThreads(n, [&](World& w) -> absl::Status {
    ThreadsRaw raw(shared, w.rank());
    DT_ASSIGN_OR_RETURN(std::vector<Row> mine, Measure(w, raw, opt));
    DT_ASSIGN_OR_RETURN(std::vector<LatRow> lat, MeasureSmall(w, raw, opt));
    if (w.rank() == 0) {
      rows = std::move(mine);
      small->insert(small->end(), lat.begin(), lat.end());
    }
    return absl::OkStatus();
  });
  if (!st.ok()) std::fprintf(stderr, "threads n=%d: %s\n", n, std::string(st.message()).c_str());
  return rows;
}

std::vector<Row> Spawn(const std::string& command, std::vector<Latency>* lats, std::vector<LatRow>* small) {
  std::vector<Row> rows;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return rows;
  char line[1024];
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    if (const char* lat = std::strstr(line, "LATROW ")) {
      std::vector<std::string> f = absl::StrSplit(absl::StripTrailingAsciiWhitespace(lat), ' ');
      if (f.size() == 7) {
        small->push_back(LatRow{f[1], std::stoi(f[2]), f[3], std::stoll(f[4]), std::stod(f[5]), std::stod(f[6])});
      }
      continue;
    }
    if (const char* lat = std::strstr(line, "LAT ")) {
      std::vector<std::string> f = absl::StrSplit(absl::StripTrailingAsciiWhitespace(lat), ' ');
      if (f.size() == 5) lats->push_back(Latency{f[1], std::stoi(f[2]), std::stod(f[3]), std::stod(f[4])});
      continue;
    }
    const char* at = std::strstr(line, "ROW ");
    if (at == nullptr) {
      if (std::strstr(line, "rror") != nullptr) std::fputs(line, stderr);
      continue;
    }
    std::vector<std::string> f = absl::StrSplit(absl::StripTrailingAsciiWhitespace(at), ' ');
    if (f.size() != 9) continue;
    rows.push_back(Row{f[1], std::stoi(f[2]), f[3], std::stoi(f[4]), std::stod(f[5]), std::stod(f[6]),
                       std::stod(f[7]), std::stod(f[8])});
  }
  const int status = ::pclose(p);
  if (status != 0) std::fprintf(stderr, "collectives: '%s' exited with %d\n", command.c_str(), status);
  return rows;
}

int Driver(const Options& opt) {
  const absl::StatusOr<std::string> self_path = bench::SelfPath();
  if (!self_path.ok()) {
    std::fprintf(stderr, "collectives: %s\n", self_path.status().ToString().c_str());
    return 1;
  }
  const std::string& self = *self_path;
  const std::string dir = self.substr(0, self.rfind('/'));
  const std::string args =
      absl::StrCat(opt.quick ? " --quick" : "", opt.null ? " --null" : "", opt.latency_only ? " --latency" : "",
                   " --rep-scale ", opt.rep_scale);
  auto wanted = [&](const char* b) { return std::find(opt.backends.begin(), opt.backends.end(), b) != opt.backends.end(); };
  std::vector<Row> rows;
  std::vector<Latency> lats;
  std::vector<LatRow> small;
  for (int n : opt.ranks) {
    if (wanted("threads")) {
      for (Row& r : RunThreads(n, opt, &small)) rows.push_back(r);
    }
    for (const char* b : {"shm", "gloo"}) {
      if (!wanted(b)) continue;
      for (Row& r : Spawn(absl::StrCat("DT_BACKEND=", b, " ", dir, "/dtrun --nproc-per-node ", n, " ", self,
                                       " --worker ", b, args), &lats, &small)) {
        rows.push_back(r);
      }
    }
    if (wanted("mpi")) {
      for (Row& r : Spawn(absl::StrCat("DT_BACKEND=mpi ", DT_MPIEXEC, " --allow-run-as-root --oversubscribe -np ", n,
                                       " ", self, " --worker mpi", args), &lats, &small)) {
        rows.push_back(r);
      }
    }
  }
  std::printf("times: per call, median over repetitions of the slowest rank; ratio: median of ours/raw per\n"
              "repetition; algbw in GB/s (1e9 B/s) from the median times%s\n",
              opt.null ? "\n--null: 'ours' is the raw call too (the method's noise floor)" : "");
  std::printf("%-8s %2s %-16s %5s %10s %10s %7s %10s %10s %11s\n", "backend", "n", "op", "MiB", "ours ms",
              "raw ms", "ratio", "ours GB/s", "raw GB/s", "memcpy GB/s");
  for (const Row& r : rows) {
    const double bytes = r.mib * 1048576.0;
    if (r.raw_ms <= 0) {  // shm: no raw call
      std::printf("%-8s %2d %-16s %5d %10.3f %10s %7s %10.2f %10s %11.2f\n", r.backend.c_str(), r.n, r.op.c_str(),
                  r.mib, r.ours_ms, "-", "-", bytes / r.ours_ms / 1e6, "-", bytes / r.memcpy_ms / 1e6);
      continue;
    }
    std::printf("%-8s %2d %-16s %5d %10.3f %10.3f %7.3f %10.2f %10.2f %11.2f\n", r.backend.c_str(), r.n,
                r.op.c_str(), r.mib, r.ours_ms, r.raw_ms, r.ratio, bytes / r.ours_ms / 1e6, bytes / r.raw_ms / 1e6,
                bytes / r.memcpy_ms / 1e6);
  }
  std::printf("\nsmall all_reduce (8 x f32) latency, median: with argument verification / without (shm always verifies)\n");
  for (const Latency& l : lats) {
    std::printf("%-8s %2d  %8.1f us / %8.1f us\n", l.backend.c_str(), l.n, l.verify_us, l.plain_us);
  }
  std::printf("\nlatency: p50 per call in us of the slowest rank, back to back (raw: the backend's own call;\n"
              "shm's raw is gloo's, in the same processes)\n");
  std::printf("%-8s %2s %-11s %8s %10s %10s\n", "backend", "n", "op", "bytes", "ours us", "raw us");
  for (const LatRow& r : small) {
    std::printf("%-8s %2d %-11s %8lld %10.1f %10.1f\n", r.backend.c_str(), r.n, r.op.c_str(),
                static_cast<long long>(r.bytes), r.ours_us, r.raw_us);
  }
  const int expected = static_cast<int>(opt.backends.size() * opt.ranks.size() * Sizes(opt).size()) * kNumOps;
  if (!opt.latency_only && static_cast<int>(rows.size()) != expected) {
    std::printf("RESULT configurations_measured %zu %d FAIL\n", rows.size(), expected);
  }
  for (const Row& r : rows) {
    if (r.mib < 16 || r.op == "all_to_all_views" || r.backend == "shm") continue;
    std::printf("RESULT %s%s_%s_%dr_%dMiB_overhead %.3f 1.05 %s\n", opt.null ? "null_" : "", r.op.c_str(),
                r.backend.c_str(), r.n, r.mib, r.ratio, bench::Verdict(r.ratio <= 1.05));
  }
  if (opt.null) return 0;
  // shm against MPI's raw calls at 16 MiB (bandwidth ratio = MPI's time / ours).
  for (const Row& s : rows) {
    if (s.backend != "shm" || s.mib != 16 || s.op == "all_to_all_views") continue;
    for (const Row& m : rows) {
      if (m.backend != "mpi" || m.n != s.n || m.mib != 16 || m.op != s.op) continue;
      const double ratio = m.raw_ms / s.ours_ms;
      std::printf("RESULT shm_%s_%dr_16MiB_vs_mpi %.3f 0.9 %s\n", s.op.c_str(), s.n, ratio,
                  bench::Verdict(ratio >= 0.9));
    }
  }
  for (const LatRow& r : small) {
    if (r.backend == "shm" && r.n == 2 && r.op == "all_reduce" && r.bytes == 2304) {
      const double ratio = r.ours_us / r.raw_us;
      std::printf("RESULT shm_all_reduce_2.3KB_2r_vs_gloo %.4f 0.1 %s\n", ratio, bench::Verdict(ratio <= 0.1));
    }
  }
  return 0;
}

}  // namespace
}  // namespace dt

ABSL_FLAG(std::string, worker, "", "run as one rank of this backend's configuration (shm, gloo or mpi; the driver launches these)");
ABSL_FLAG(std::vector<std::string>, backends, std::vector<std::string>({"threads", "shm", "gloo", "mpi"}),
          "backends to measure, comma-separated");
ABSL_FLAG(std::vector<std::string>, ranks, std::vector<std::string>({"2", "4"}), "rank counts, comma-separated");
ABSL_FLAG(int, rep_scale, 1, "multiply the repetitions by this");
ABSL_FLAG(bool, null, false, "\"ours\" is the raw call as well: the ratios show the method's own noise floor");
ABSL_FLAG(bool, latency, false, "only the latency rows");

int main(int argc, char** argv) {
  dt::Options opt;
  opt.quick = dt::bench::ParseBenchFlags(argc, argv, "usage: bench_collectives [flags]\n"
                                                     "our collectives vs each backend's raw call and memcpy");
  opt.worker = absl::GetFlag(FLAGS_worker);
  opt.backends = absl::GetFlag(FLAGS_backends);
  opt.ranks.clear();
  for (const std::string& r : absl::GetFlag(FLAGS_ranks)) {
    int n = 0;
    if (!absl::SimpleAtoi(r, &n) || n < 1) {
      std::fprintf(stderr, "bench_collectives: --ranks: '%s' is not a rank count\n", r.c_str());
      return 2;
    }
    opt.ranks.push_back(n);
  }
  opt.rep_scale = std::max(1, absl::GetFlag(FLAGS_rep_scale));
  opt.null = absl::GetFlag(FLAGS_null);
  opt.latency_only = absl::GetFlag(FLAGS_latency);
  return opt.worker.empty() ? dt::Driver(opt) : dt::Worker(opt);
}
