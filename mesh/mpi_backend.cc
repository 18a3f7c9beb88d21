// The mpi backend: OpenMPI with MPI_THREAD_MULTIPLE.
//
// Note [MPI timeouts]
// MPI cannot cancel a collective, blocking or not: after a timeout the call stays pending for good.
// The brief suggested nonblocking collectives polled against a deadline; we measured those
// (OpenMPI's libnbc) against the blocking calls (OpenMPI's tuned component) on this machine and
// they lose up to 40% at 64 MiB (allreduce 2 ranks: 113 ms vs 72 ms). So each communicator runs
// the *blocking* calls in order on its own worker thread, and Wait() waits for the worker with the
// deadline. Either way, a timed-out call is abandoned:
//   - Wait() returns DeadlineExceeded naming the collective and the group (MPI cannot say which
//     rank is missing), the communicator is marked broken (later calls fail at once), its worker
//     is left blocked inside MPI (detached), and MPI_Finalize is skipped at exit.
//   - Group creation (MPI_Comm_create_group, collective over the members) runs the same way.
// What a dead rank does under mpirun: mpirun (ORTE) sees the process die and kills every other
// rank of the job at once ("mpirun noticed that process rank 2 ... exited on signal 6"), so the
// survivors usually get no error at all — they are gone before their timeout. The timeout path
// matters for ranks that are alive but never arrive, and under launchers that do not kill the job.
// Errors are returned, not fatal: MPI_ERRORS_RETURN on every communicator.
// Send/recv are MPI_Isend/MPI_Irecv polled with MPI_Test against the deadline.

#include <mpi.h>

#include <cstring>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <limits>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/mesh/backends.h"
#include "dtensor/mesh/collective.h"
#include "dtensor/core/strided.h"
#include "dtensor/mesh/reduce.h"
#include "dtensor/mesh/view_stream.h"

namespace dt::internal {
namespace {

using Clock = std::chrono::steady_clock;

std::string MpiError(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return absl::StrCat("MPI error ", code);
  return std::string(buf, static_cast<size_t>(len));
}

// Process-wide MPI state: initialised once, finalised at exit unless a call is stuck in MPI.
struct Runtime {
  bool we_initialized = false;
  std::atomic<bool> stuck{false};
  std::map<std::pair<DType, ReduceOp>, MPI_Op> half_ops;
  ~Runtime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (we_initialized && !finalized && !stuck) {
      for (auto& [key, op] : half_ops) MPI_Op_free(&op);
      MPI_Finalize();
    }
  }
};
Runtime& GetRuntime() {
  static Runtime runtime;
  return runtime;
}

template <DType kD, ReduceOp kOp>
void HalfOp(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceInto(inout, in, *len, kD, kOp);
}

template <DType kD>
MPI_User_function* HalfFn(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return &HalfOp<kD, ReduceOp::kSum>;
    case ReduceOp::kProd: return &HalfOp<kD, ReduceOp::kProd>;
    case ReduceOp::kMin: return &HalfOp<kD, ReduceOp::kMin>;
    case ReduceOp::kMax: return &HalfOp<kD, ReduceOp::kMax>;
  }
  return nullptr;
}

MPI_Datatype TypeOf(DType d) {
  switch (d) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF16:
    case DType::kBF16: return MPI_UINT16_T;
    case DType::kI64: return MPI_INT64_T;
    case DType::kI32: return MPI_INT32_T;
    case DType::kU8:
    case DType::kBool: return MPI_UINT8_T;
    default: break;  // quantized: rejected by the communicator
  }
  return MPI_BYTE;
}

// Created during init (MPI_Op_create is not thread-safe with ops in flight everywhere).
void CreateHalfOps(Runtime& rt) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax}) {
    for (DType d : {DType::kF16, DType::kBF16}) {
      MPI_Op mop;
      MPI_Op_create(d == DType::kF16 ? HalfFn<DType::kF16>(op) : HalfFn<DType::kBF16>(op), 1, &mop);
      rt.half_ops[{d, op}] = mop;
    }
  }
}

MPI_Op OpOf(DType d, ReduceOp op) {
  if (d == DType::kF16 || d == DType::kBF16) {
    return GetRuntime().half_ops.at({d, op == ReduceOp::kAvg ? ReduceOp::kSum : op});
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return MPI_SUM;
    case ReduceOp::kProd: return MPI_PROD;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
  }
  return MPI_SUM;
}

// Runs `fn` on a thread and waits until `deadline`; on a timeout the thread is left behind (see
// Note [MPI timeouts]). The state is shared so the abandoned thread never touches freed memory.
struct Job {
  std::mutex mu;
  std::condition_variable cv;
  bool started = false;
  std::atomic<bool> done{false};
  Clock::time_point start;
  absl::Status status;
};

class MpiComm;

// Work of a collective that runs on the communicator's worker. (It keeps the collective, not its
// error prefix: that is formatted only when there is an error to report.)
class MpiWork final : public Work {
 public:
  MpiWork(std::shared_ptr<Job> job, MpiComm* comm, Collective c, std::chrono::milliseconds timeout)
      : job_(std::move(job)), comm_(comm), c_(std::move(c)), timeout_(timeout), submit_(Clock::now()) {}
  absl::Status Wait() override;

 private:
  std::shared_ptr<Job> job_;
  MpiComm* comm_;
  Collective c_;
  std::chrono::milliseconds timeout_;
  Clock::time_point submit_;
};

// FIFO worker of one communicator; detached instead of joined when a call got stuck.
struct WorkerState {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<std::function<absl::Status()>, std::shared_ptr<Job>>> items;
  std::atomic<int> queued{0};
  bool stop = false;
};

// The worker polls (yielding the CPU) for a little while before sleeping: waking a sleeping thread
// costs a scheduler slice on a busy machine, and synchronous calls come back to back. (The caller
// does not poll: while the worker is inside MPI that would take the CPU from the peers.)
template <typename Ready>
void SpinBriefly(Ready ready) {
  for (int i = 0; i < 300 && !ready(); ++i) std::this_thread::yield();
}

class MpiComm final : public Communicator {
 public:
  MpiComm(MPI_Comm comm, std::vector<int> ranks, int rank, std::chrono::milliseconds timeout)
      : Communicator(std::move(ranks), rank, kCPU, timeout), comm_(comm),
        state_(std::make_shared<WorkerState>()) {
    worker_ = std::thread([s = state_] { Loop(*s); });
  }
  ~MpiComm() override {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->stop = true;
    }
    state_->cv.notify_all();
    if (broken()) {
      worker_.detach();  // blocked inside MPI for good
    } else {
      worker_.join();
      MPI_Comm_free(&comm_);
    }
  }

  absl::string_view backend() const override { return "mpi"; }

  bool broken() {
    std::lock_guard<std::mutex> lock(mu_);
    return !broken_.ok();
  }
  void Break(const absl::Status& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.ok()) broken_ = why;
    GetRuntime().stuck = true;
  }

 protected:
  WorkPtr Run(Collective c) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_.ok()) {
        return Work::Done(absl::Status(broken_.code(), absl::StrCat(ErrorPrefix(c), ": communicator is broken by an "
                                                                    "earlier error: ", broken_.message())));
      }
    }
    if (c.kind == CollectiveKind::kSend || c.kind == CollectiveKind::kRecv) return PointToPoint(c);
    auto job = std::make_shared<Job>();
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->items.emplace_back([this, c] { return Execute(c); }, job);
      state_->queued.fetch_add(1, std::memory_order_release);
    }
    state_->cv.notify_one();
    return std::make_shared<MpiWork>(job, this, std::move(c), timeout());
  }

 private:
  static void Loop(WorkerState& s) {
    while (true) {
      SpinBriefly([&] { return s.queued.load(std::memory_order_acquire) > 0; });
      std::unique_lock<std::mutex> lock(s.mu);
      s.cv.wait(lock, [&] { return s.stop || !s.items.empty(); });
      if (s.items.empty()) return;
      auto item = std::move(s.items.front());
      s.items.pop_front();
      s.queued.fetch_sub(1, std::memory_order_release);
      lock.unlock();
      {
        std::lock_guard<std::mutex> jl(item.second->mu);
        item.second->started = true;
        item.second->start = Clock::now();
      }
      absl::Status st = item.first();
      std::lock_guard<std::mutex> jl(item.second->mu);
      item.second->status = std::move(st);
      item.second->done = true;
      item.second->cv.notify_all();
    }
  }

  absl::Status Check(const Collective& c, int rc) {
    if (rc == MPI_SUCCESS) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(ErrorPrefix(c), ": MPI: ", MpiError(rc)));
  }

  bool VerifiesInRun() const override { return true; }
  bool HandlesViews() const override { return true; }

  absl::Status Execute(const Collective& c) {
    if (c.verify) {
      std::vector<int64_t> mine = EncodedFingerprint(c), all(mine.size() * size());
      const int len = static_cast<int>(mine.size());
      DT_RETURN_IF_ERROR(Check(c, MPI_Allgather(mine.data(), len, MPI_INT64_T, all.data(), len, MPI_INT64_T, comm_)));
      DT_RETURN_IF_ERROR(CheckFingerprints(c, all));
    }
    return Collect(c);
  }

  absl::Status Collect(const Collective& c) {
    using K = CollectiveKind;
    const int n = size();
    const MPI_Datatype t = TypeOf(c.dtype());
    void* in = c.input.defined() ? c.input.raw_data() : nullptr;
    void* out = c.output.defined() ? c.output.raw_data() : nullptr;
    auto to_int = [&](const std::vector<int64_t>& v, std::vector<int>* out_v) -> absl::Status {
      for (int64_t x : v) {
        if (x > std::numeric_limits<int>::max()) {
          return absl::InvalidArgumentError(absl::StrCat(ErrorPrefix(c), ": count ", x, " exceeds MPI's int counts"));
        }
        out_v->push_back(static_cast<int>(x));
      }
      return absl::OkStatus();
    };
    auto count = [&](int64_t x) -> absl::StatusOr<int> {
      if (x > std::numeric_limits<int>::max()) {
        return absl::InvalidArgumentError(absl::StrCat(ErrorPrefix(c), ": count ", x, " exceeds MPI's int counts"));
      }
      return static_cast<int>(x);
    };
    switch (c.kind) {
      case K::kAllReduce: {
        DT_ASSIGN_OR_RETURN(int k, count(c.input.numel()));
        if (k == 0) return absl::OkStatus();
        return Check(c, MPI_Allreduce(MPI_IN_PLACE, in, k, t, OpOf(c.dtype(), c.op), comm_));
      }
      case K::kAllGather: {
        DT_ASSIGN_OR_RETURN(int k, count(c.input.numel()));
        return Check(c, MPI_Allgather(in, k, t, out, k, t, comm_));
      }
      case K::kAllGatherV: {
        std::vector<int> counts, displs;
        DT_RETURN_IF_ERROR(to_int(c.counts, &counts));
        DT_RETURN_IF_ERROR(to_int(Offsets(c.counts), &displs));
        return Check(c, MPI_Allgatherv(in, counts[rank()], t, out, counts.data(), displs.data(), t, comm_));
      }
      case K::kReduceScatter: {
        DT_ASSIGN_OR_RETURN(int k, count(c.output.numel()));
        if (k == 0) return absl::OkStatus();
        return Check(c, MPI_Reduce_scatter_block(in, out, k, t, OpOf(c.dtype(), c.op), comm_));
      }
      case K::kReduceScatterV: {
        std::vector<int> counts;
        DT_RETURN_IF_ERROR(to_int(c.counts, &counts));
        if (Sum(c.counts) == 0) return absl::OkStatus();
        return Check(c, MPI_Reduce_scatter(in, out, counts.data(), t, OpOf(c.dtype(), c.op), comm_));
      }
      case K::kAllToAll: {
        DT_ASSIGN_OR_RETURN(int k, count(c.input.numel() / n));
        return Check(c, MPI_Alltoall(in, k, t, out, k, t, comm_));
      }
      case K::kAllToAllV: {
        std::vector<int> sc, sd, rc, rd;
        DT_RETURN_IF_ERROR(to_int(c.counts, &sc));
        DT_RETURN_IF_ERROR(to_int(Offsets(c.counts), &sd));
        DT_RETURN_IF_ERROR(to_int(c.recv_counts, &rc));
        DT_RETURN_IF_ERROR(to_int(Offsets(c.recv_counts), &rd));
        return Check(c, MPI_Alltoallv(in, sc.data(), sd.data(), t, out, rc.data(), rd.data(), t, comm_));
      }
      case K::kAllToAllViews:
        return ViewsAlltoallw(c);
      case K::kBroadcast: {
        DT_ASSIGN_OR_RETURN(int k, count(c.input.numel()));
        return Check(c, MPI_Bcast(in, k, t, c.peer, comm_));
      }
      case K::kBarrier:
        return Check(c, MPI_Barrier(comm_));
      case K::kSend:
      case K::kRecv:
        break;
    }
    return absl::OkStatus();
  }

  // An MPI datatype for the elements of `views` at their absolute addresses (for MPI_BOTTOM), in
  // stream order; MPI_DATATYPE_NULL when they hold none.
  absl::StatusOr<MPI_Datatype> ViewsType(const Collective& c, const TensorViews& views) {
    const MPI_Datatype base = TypeOf(c.dtype());
    const int64_t esz = DTypeSize(c.dtype());
    std::vector<MPI_Datatype> types;
    std::vector<MPI_Aint> addrs;
    auto release = [&] {
      for (MPI_Datatype& t : types) MPI_Type_free(&t);
    };
    for (const Tensor& v : views) {
      if (v.numel() == 0) continue;
      StridedLoop loop(v.shape(), v.strides(), {});
      MPI_Datatype t = base;
      for (int d = static_cast<int>(loop.shape.size()) - 1; d >= 0; --d) {
        if (loop.shape[d] > std::numeric_limits<int>::max()) {
          if (t != base) MPI_Type_free(&t);
          release();
          return absl::InvalidArgumentError(absl::StrCat(ErrorPrefix(c), ": a view dim of ", loop.shape[d],
                                                         " elements exceeds MPI's int counts"));
        }
        const int k = static_cast<int>(loop.shape[d]);
        const int64_t stride = loop.strides[0][d];
        MPI_Datatype next;
        if (t == base && stride == 1) {
          MPI_Type_contiguous(k, t, &next);
        } else {
          MPI_Type_create_hvector(k, 1, static_cast<MPI_Aint>(stride * esz), t, &next);
        }
        if (t != base) MPI_Type_free(&t);
        t = next;
      }
      MPI_Aint addr;
      MPI_Get_address(v.raw_data(), &addr);
      types.push_back(t);
      addrs.push_back(addr);
    }
    if (types.empty()) return MPI_DATATYPE_NULL;
    std::vector<int> ones(types.size(), 1);
    MPI_Datatype all;
    MPI_Type_create_struct(static_cast<int>(types.size()), ones.data(), addrs.data(), types.data(), &all);
    MPI_Type_commit(&all);
    release();
    return all;
  }

  absl::Status ViewsAlltoallw(const Collective& c) {
    const int n = size(), me = rank();
    std::vector<MPI_Datatype> st(n, MPI_DATATYPE_NULL), rt(n, MPI_DATATYPE_NULL);
    auto release = [&] {
      for (MPI_Datatype& t : st) if (t != MPI_DATATYPE_NULL) MPI_Type_free(&t);
      for (MPI_Datatype& t : rt) if (t != MPI_DATATYPE_NULL) MPI_Type_free(&t);
    };
    std::vector<int> sc(n, 0), rc(n, 0), zero(n, 0);
    std::vector<MPI_Datatype> sty(n, MPI_BYTE), rty(n, MPI_BYTE);
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      absl::StatusOr<MPI_Datatype> s = ViewsType(c, c.send_views[p]);
      absl::StatusOr<MPI_Datatype> r = s.ok() ? ViewsType(c, c.recv_views[p]) : s;
      if (s.ok()) st[p] = *s;
      if (r.ok()) rt[p] = *r;
      if (!r.ok()) {
        release();
        return r.status();
      }
      if (st[p] != MPI_DATATYPE_NULL) sty[p] = st[p], sc[p] = 1;
      if (rt[p] != MPI_DATATYPE_NULL) rty[p] = rt[p], rc[p] = 1;
    }
    ViewStream::Copy(ViewStream(c.recv_views[me]), ViewStream(c.send_views[me]));
    const int code = MPI_Alltoallw(MPI_BOTTOM, sc.data(), zero.data(), sty.data(), MPI_BOTTOM, rc.data(),
                                   zero.data(), rty.data(), comm_);
    release();
    return Check(c, code);
  }

  // Nonblocking point to point, polled against the deadline on Wait().
  WorkPtr PointToPoint(const Collective& c) {
    absl::StatusOr<int> k = c.input.numel() <= std::numeric_limits<int>::max()
                                ? absl::StatusOr<int>(static_cast<int>(c.input.numel()))
                                : absl::InvalidArgumentError(absl::StrCat(ErrorPrefix(c), ": too many elements for MPI"));
    if (!k.ok()) return Work::Done(k.status());
    auto req = std::make_shared<MPI_Request>();
    const int rc = c.kind == CollectiveKind::kSend
                       ? MPI_Isend(c.input.raw_data(), *k, TypeOf(c.dtype()), c.peer, 0, comm_, req.get())
                       : MPI_Irecv(c.input.raw_data(), *k, TypeOf(c.dtype()), c.peer, 0, comm_, req.get());
    if (rc != MPI_SUCCESS) return Work::Done(Check(c, rc));
    return std::make_shared<P2PWork>(req, this, timeout(), c);
  }

  class P2PWork final : public Work {
   public:
    P2PWork(std::shared_ptr<MPI_Request> req, MpiComm* comm, std::chrono::milliseconds timeout, Collective c)
        : req_(std::move(req)), comm_(comm), timeout_(timeout), c_(std::move(c)) {}
    absl::Status Wait() override {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return status_;
      const auto deadline = Clock::now() + timeout_;
      MPI_Status mst;
      while (true) {
        int flag = 0;
        const int rc = MPI_Test(req_.get(), &flag, &mst);
        if (rc != MPI_SUCCESS) {
          status_ = absl::UnavailableError(absl::StrCat(comm_->ErrorPrefix(c_), ": MPI: ", MpiError(rc)));
          break;
        }
        if (flag) {
          if (c_.kind == CollectiveKind::kRecv) {
            int got = 0;
            MPI_Get_count(&mst, TypeOf(c_.dtype()), &got);
            if (got != c_.input.numel()) {
              status_ = absl::InvalidArgumentError(
                  absl::StrCat(comm_->ErrorPrefix(c_), ": received ", got, " elements, expected ", c_.input.numel()));
            }
          }
          break;
        }
        if (Clock::now() >= deadline) {
          status_ = absl::DeadlineExceededError(absl::StrCat(comm_->ErrorPrefix(c_), ": timed out after ", timeout_.count(),
                                                             " ms; MPI cannot cancel it, the communicator is broken"));
          comm_->Break(status_);
          break;
        }
        std::this_thread::yield();
      }
      done_ = true;
      return status_;
    }

   private:
    std::mutex mu_;
    std::shared_ptr<MPI_Request> req_;
    MpiComm* comm_;
    std::chrono::milliseconds timeout_;
    Collective c_;
    bool done_ = false;
    absl::Status status_;
  };

  MPI_Comm comm_;
  std::mutex mu_;
  absl::Status broken_;
  std::shared_ptr<WorkerState> state_;
  std::thread worker_;
};

absl::Status MpiWork::Wait() {
  std::unique_lock<std::mutex> lock(job_->mu);
  while (!job_->done) {
    const auto deadline = (job_->started ? job_->start : submit_) + timeout_;
    if (Clock::now() >= deadline) {
      absl::Status st = absl::DeadlineExceededError(absl::StrCat(
          comm_->ErrorPrefix(c_), ": timed out after ", timeout_.count(), " ms", job_->started ? "" : " (still queued behind an earlier call)",
          "; MPI cannot tell which rank is missing nor cancel the call, so this communicator is broken now"));
      lock.unlock();
      comm_->Break(st);
      return st;
    }
    job_->cv.wait_until(lock, deadline);
  }
  return job_->status;
}

class MpiWorld final : public BackendWorld {
 public:
  MpiWorld(const LaunchInfo& info, const WorldOptions& options) : BackendWorld(info, options) {}
  absl::string_view backend() const override { return "mpi"; }
  Device device() const override { return kCPU; }


 private:
  // MPI_Comm_create_group on a helper thread, bounded by the timeout (see Note [MPI timeouts]).
  absl::StatusOr<CommPtr> MakeGroup(const std::vector<int>& ranks) override {
    const int me = IndexIn(ranks);
    const int tag = static_cast<int>(GroupHash(ranks) % 32000u);
    struct Result {
      std::mutex mu;
      std::condition_variable cv;
      bool done = false;
      int rc = MPI_SUCCESS;
      MPI_Comm comm = MPI_COMM_NULL;
    };
    auto res = std::make_shared<Result>();
    std::thread([res, ranks, tag] {
      MPI_Group world_group, group;
      MPI_Comm comm = MPI_COMM_NULL;
      MPI_Comm_group(MPI_COMM_WORLD, &world_group);
      MPI_Group_incl(world_group, static_cast<int>(ranks.size()), ranks.data(), &group);
      const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &comm);
      MPI_Group_free(&group);
      MPI_Group_free(&world_group);
      if (rc == MPI_SUCCESS) MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
      std::lock_guard<std::mutex> lock(res->mu);
      res->rc = rc;
      res->comm = comm;
      res->done = true;
      res->cv.notify_all();
    }).detach();
    std::unique_lock<std::mutex> lock(res->mu);
    const std::string what = absl::StrCat("mpi group ", RankList(ranks), ", global rank ", rank(), ": creating the group");
    if (!res->cv.wait_for(lock, timeout(), [&] { return res->done; })) {
      GetRuntime().stuck = true;
      return absl::DeadlineExceededError(absl::StrCat(what, ": not every member called Group() within ",
                                                      timeout().count(), " ms (MPI cannot say which)"));
    }
    if (res->rc != MPI_SUCCESS) return absl::UnavailableError(absl::StrCat(what, ": MPI: ", MpiError(res->rc)));
    auto comm = std::make_shared<MpiComm>(res->comm, ranks, me, timeout());
    comm->set_verify(options_.verify.value_or(true));
    return CommPtr(std::move(comm));
  }

};

}  // namespace

absl::StatusOr<std::shared_ptr<World>> MakeMpiWorld(const LaunchInfo& info, const WorldOptions& options) {
  Runtime& rt = GetRuntime();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) return absl::FailedPreconditionError("backend mpi: MPI was already finalised in this process");
  int provided = 0;
  if (!initialized) {
    // See Note [All-to-all over views]: larger shared-memory fragments for derived datatypes,
    // unless the user chose a size.
    setenv("OMPI_MCA_btl_vader_max_send_size", "131072", /*overwrite=*/0);
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
      return absl::UnavailableError("backend mpi: MPI_Init_thread failed");
    }
    rt.we_initialized = true;
    CreateHalfOps(rt);
  } else {
    MPI_Query_thread(&provided);
    if (rt.half_ops.empty()) CreateHalfOps(rt);
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    return absl::FailedPreconditionError(
        absl::StrCat("backend mpi: the MPI library provides thread level ", provided, ", we need MPI_THREAD_MULTIPLE"));
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (info.launcher != "none" && (info.world_size != size || info.rank != rank)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "backend mpi: ", info.launcher, " started this process as rank ", info.rank, " of ", info.world_size,
        " but MPI sees rank ", rank, " of ", size, "; launch with mpirun or srun (--mpi=pmix)"));
  }
  // A node is the processes that share memory; nodes are numbered by their lowest rank (the
  // local rank 0 of each, in rank order), which every member of a node learns from its own.
  MPI_Comm node;
  int local_rank = 0, local_size = 1;
  int node_info[2] = {0, 1};  // node rank, number of nodes
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_size);
    MPI_Comm leaders = MPI_COMM_NULL;
    if (MPI_Comm_split(MPI_COMM_WORLD, local_rank == 0 ? 0 : MPI_UNDEFINED, rank, &leaders) == MPI_SUCCESS &&
        leaders != MPI_COMM_NULL) {
      MPI_Comm_rank(leaders, &node_info[0]);
      MPI_Comm_size(leaders, &node_info[1]);
      MPI_Comm_free(&leaders);
    }
    MPI_Bcast(node_info, 2, MPI_INT, 0, node);
    MPI_Comm_free(&node);
  }
  LaunchInfo seen = info;  // as MPI sees it
  seen.rank = rank;
  seen.world_size = size;
  seen.local_rank = local_rank;
  seen.local_size = local_size;
  seen.node_rank = node_info[0];
  seen.num_nodes = node_info[1];
  return std::shared_ptr<World>(std::make_shared<MpiWorld>(seen, options));
}

}  // namespace dt::internal
