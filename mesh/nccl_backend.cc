// The nccl backend: one NCCL communicator and one CUDA stream per group. It is the
// libdtensor_nccl.so module, built when CUDA and NCCL are found and loaded by the first nccl world
// (internal::MakeNcclWorld in mesh/nccl_module.cc; Note [CUDA module] in core/cuda_module.h).
//
// Note [NCCL backend]
//   - Rank 0 of a group makes the ncclUniqueId and publishes it in the store ("nccl/<gid>"); the
//     members first join through the store (so a missing member is named), then
//     ncclCommInitRankConfig with blocking = 0, polled against the deadline.
//   - Each call is enqueued on the group's stream after the legacy default stream (so tensors made
//     by other code are ready) and returns a Work that polls a CUDA event and
//     ncclCommGetAsyncError against the deadline; on a timeout or an asynchronous error the
//     communicator is aborted (ncclCommAbort) and stays broken, as PyTorch's watchdog does.
//   - Collectives NCCL lacks: all_gather_v as a group of broadcasts, reduce_scatter_v as a group
//     of reduces, all_to_all(_v) as grouped send/recv; all_to_all_views takes the base's default
//     (pack on the device, all_to_all_v, unpack), cheap next to NVLink.
//   - avg: ncclAvg for floating dtypes; integers sum, then divide on the host (a slow path).

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/mesh/backends.h"
#include "dtensor/mesh/collective.h"
#include "dtensor/mesh/reduce.h"
#include "dtensor/mesh/tcp_store.h"

namespace dt::internal {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t TypeOf(DType d) {
  switch (d) {
    case DType::kF32: return ncclFloat32;
    case DType::kF16: return ncclFloat16;
    case DType::kBF16: return ncclBfloat16;
    case DType::kI64: return ncclInt64;
    case DType::kI32: return ncclInt32;
    case DType::kU8:
    case DType::kBool: return ncclUint8;
    default: break;  // quantized: rejected by the communicator
  }
  return ncclUint8;
}

ncclRedOp_t OpOf(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;  // floats only (ReducesAvg); the base averages integers
    case ReduceOp::kProd: return ncclProd;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
  }
  return ncclSum;
}

class NcclComm final : public Communicator {
 public:
  NcclComm(ncclComm_t comm, cudaStream_t stream, int device, std::vector<int> ranks, int rank,
           std::chrono::milliseconds timeout)
      : Communicator(std::move(ranks), rank, Device::CUDA(device), timeout),
        comm_(comm), stream_(stream), device_(device) {}
  ~NcclComm() override {
    cudaSetDevice(device_);
    if (!aborted_) {
      // Nonblocking communicators finalise asynchronously; abort if that takes the full timeout.
      const auto deadline = Clock::now() + timeout();
      ncclResult_t r = ncclCommFinalize(comm_);
      while (r == ncclInProgress && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ncclCommGetAsyncError(comm_, &r);
      }
      if (r == ncclSuccess) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    if (barrier_buf_ != nullptr) cudaFree(barrier_buf_);
    cudaStreamDestroy(stream_);
  }

  absl::string_view backend() const override { return "nccl"; }
  bool ReducesAvg(DType dtype) const override { return IsFloating(dtype); }

  // Waits until `event` has passed on the GPU, `deadline` passes (abort) or NCCL reports an error.
  absl::Status Await(cudaEvent_t event, Clock::time_point deadline, const std::string& what) {
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (aborted_) return absl::Status(broken_.code(), absl::StrCat(what, ": ", broken_.message()));
        cudaSetDevice(device_);
        const cudaError_t q = cudaEventQuery(event);
        if (q == cudaSuccess) return absl::OkStatus();
        if (q != cudaErrorNotReady) {
          return AbortLocked(absl::InternalError(absl::StrCat(what, ": CUDA: ", cudaGetErrorString(q))));
        }
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(comm_, &async);
        if (async != ncclSuccess && async != ncclInProgress) {
          return AbortLocked(absl::UnavailableError(
              absl::StrCat(what, ": NCCL: ", ncclGetErrorString(async), " ", ncclGetLastError(comm_))));
        }
        if (Clock::now() >= deadline) {
          return AbortLocked(absl::DeadlineExceededError(absl::StrCat(
              what, ": timed out after ", timeout().count(), " ms; the NCCL communicator is aborted")));
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 protected:
  WorkPtr Run(Collective c) override;

 private:
  absl::Status AbortLocked(absl::Status why) {
    if (!aborted_) {
      aborted_ = true;
      broken_ = why;
      ncclCommAbort(comm_);
    }
    return why;
  }

  // After a call on a nonblocking communicator: wait while it reports ncclInProgress.
  absl::Status Settle(ncclResult_t r, Clock::time_point deadline, const std::string& what) {
    while (r == ncclInProgress) {
      if (Clock::now() >= deadline) {
        return AbortLocked(absl::DeadlineExceededError(absl::StrCat(what, ": NCCL call did not finish enqueueing")));
      }
      std::this_thread::yield();
      ncclCommGetAsyncError(comm_, &r);
    }
    if (r != ncclSuccess) {
      return AbortLocked(absl::UnavailableError(
          absl::StrCat(what, ": NCCL: ", ncclGetErrorString(r), " ", ncclGetLastError(comm_))));
    }
    return absl::OkStatus();
  }

  absl::Status Enqueue(const Collective& c, Clock::time_point deadline, const std::string& what);

  std::mutex mu_;  // NCCL calls on one communicator are serialised
  ncclComm_t comm_;
  cudaStream_t stream_;
  const int device_;
  bool aborted_ = false;
  absl::Status broken_;
  void* barrier_buf_ = nullptr;  // device float for Barrier()
};

class NcclWork final : public Work {
 public:
  NcclWork(NcclComm* comm, cudaEvent_t event, Clock::time_point deadline, std::string what)
      : comm_(comm), event_(event), deadline_(deadline), what_(std::move(what)) {}
  ~NcclWork() override { cudaEventDestroy(event_); }
  absl::Status Wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      status_ = comm_->Await(event_, deadline_, what_);
      done_ = true;
    }
    return status_;
  }

 private:
  std::mutex mu_;
  NcclComm* comm_;
  cudaEvent_t event_;
  Clock::time_point deadline_;
  std::string what_;
  bool done_ = false;
  absl::Status status_;
};

absl::Status NcclComm::Enqueue(const Collective& c, Clock::time_point deadline, const std::string& what) {
  using K = CollectiveKind;
  const int n = size();
  const ncclDataType_t t = TypeOf(c.dtype());
  const size_t esz = static_cast<size_t>(DTypeSize(c.dtype()));
  char* in = static_cast<char*>(c.input.defined() ? c.input.raw_data() : nullptr);
  char* out = static_cast<char*>(c.output.defined() ? c.output.raw_data() : nullptr);
  auto settle = [&](ncclResult_t r) { return Settle(r, deadline, what); };
  auto grouped = [&](const std::function<absl::Status()>& body) -> absl::Status {
    DT_RETURN_IF_ERROR(settle(ncclGroupStart()));
    absl::Status st = body();
    absl::Status end = settle(ncclGroupEnd());
    return st.ok() ? end : st;
  };
  switch (c.kind) {
    case K::kAllReduce:
      if (c.input.numel() == 0) return absl::OkStatus();
      return settle(ncclAllReduce(in, in, c.input.numel(), t, OpOf(c.op), comm_, stream_));
    case K::kAllGather:
      return settle(ncclAllGather(in, out, c.input.numel(), t, comm_, stream_));
    case K::kAllGatherV: {
      const std::vector<int64_t> off = Offsets(c.counts);
      return grouped([&]() -> absl::Status {
        for (int r = 0; r < n; ++r) {
          if (c.counts[r] == 0) continue;
          DT_RETURN_IF_ERROR(settle(ncclBroadcast(r == rank() ? in : out + off[r] * esz, out + off[r] * esz,
                                                  c.counts[r], t, r, comm_, stream_)));
        }
        return absl::OkStatus();
      });
    }
    case K::kReduceScatter:
      if (c.output.numel() == 0) return absl::OkStatus();
      return settle(ncclReduceScatter(in, out, c.output.numel(), t, OpOf(c.op), comm_, stream_));
    case K::kReduceScatterV: {
      const std::vector<int64_t> off = Offsets(c.counts);
      return grouped([&]() -> absl::Status {
        for (int r = 0; r < n; ++r) {
          if (c.counts[r] == 0) continue;
          DT_RETURN_IF_ERROR(settle(ncclReduce(in + off[r] * esz, out, c.counts[r], t, OpOf(c.op), r,
                                               comm_, stream_)));
        }
        return absl::OkStatus();
      });
    }
    case K::kAllToAll:
    case K::kAllToAllV: {
      std::vector<int64_t> sc = c.counts, rc = c.recv_counts;
      if (c.kind == K::kAllToAll) sc = rc = std::vector<int64_t>(n, c.input.numel() / n);
      const std::vector<int64_t> so = Offsets(sc), ro = Offsets(rc);
      return grouped([&]() -> absl::Status {
        for (int p = 0; p < n; ++p) {
          if (sc[p] > 0) DT_RETURN_IF_ERROR(settle(ncclSend(in + so[p] * esz, sc[p], t, p, comm_, stream_)));
          if (rc[p] > 0) DT_RETURN_IF_ERROR(settle(ncclRecv(out + ro[p] * esz, rc[p], t, p, comm_, stream_)));
        }
        return absl::OkStatus();
      });
    }
    case K::kAllToAllViews:  // never here: the base stages them as all_to_all_v (HandlesViews)
      return absl::InternalError(absl::StrCat(what, ": all_to_all_views reached the nccl backend"));
    case K::kBroadcast:
      if (c.input.numel() == 0) return absl::OkStatus();
      return settle(ncclBroadcast(in, in, c.input.numel(), t, c.peer, comm_, stream_));
    case K::kSend:
      if (c.input.numel() == 0) return absl::OkStatus();
      return settle(ncclSend(in, c.input.numel(), t, c.peer, comm_, stream_));
    case K::kRecv:
      if (c.input.numel() == 0) return absl::OkStatus();
      return settle(ncclRecv(in, c.input.numel(), t, c.peer, comm_, stream_));
    case K::kBarrier:
      // A one-element all_reduce; the Work's event then waits for it.
      if (barrier_buf_ == nullptr && cudaMalloc(&barrier_buf_, sizeof(float)) != cudaSuccess) {
        barrier_buf_ = nullptr;
        return absl::ResourceExhaustedError(absl::StrCat(what, ": cannot allocate the barrier buffer"));
      }
      return settle(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, stream_));
  }
  return absl::OkStatus();
}

WorkPtr NcclComm::Run(Collective c) {
  const auto deadline = Clock::now() + timeout();
  const std::string what = ErrorPrefix(c);
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) {
      return Work::Done(absl::Status(broken_.code(), absl::StrCat(what, ": communicator is broken by an earlier "
                                                                  "error: ", broken_.message())));
    }
    cudaSetDevice(device_);
    // Order after work already queued on the legacy default stream.
    cudaEvent_t ready;
    cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    cudaEventRecord(ready, cudaStreamLegacy);
    cudaStreamWaitEvent(stream_, ready, 0);
    cudaEventDestroy(ready);
    absl::Status st = Enqueue(c, deadline, what);
    if (!st.ok()) return Work::Done(st);
    if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(event, stream_) != cudaSuccess) {
      return Work::Done(absl::InternalError(absl::StrCat(what, ": cannot record a CUDA event")));
    }
  }
  return std::make_shared<NcclWork>(this, event, deadline, what);
}

class NcclWorld final : public BackendWorld {
 public:
  NcclWorld(const LaunchInfo& info, const WorldOptions& options, Rendezvous rv)
      : BackendWorld(info, options), rv_(std::move(rv)) {}
  ~NcclWorld() override {
    ClearGroups();
    rv_.store.reset();
  }
  absl::string_view backend() const override { return "nccl"; }
  Device device() const override { return Device::CUDA(info_.local_rank); }


 private:
  absl::StatusOr<CommPtr> MakeGroup(const std::vector<int>& ranks) override {
    const std::string gid = GroupKey(ranks);
    const int me = IndexIn(ranks);
    const std::string what = absl::StrCat("nccl group ", RankList(ranks), ", global rank ", rank(),
                                          ": creating the group");
    const auto deadline = Clock::now() + timeout();
    DT_RETURN_IF_ERROR(JoinGroup(*rv_.store, gid, ranks, me, timeout(), what));
    ncclUniqueId id;
    const std::string id_key = absl::StrCat("nccl/", gid);
    if (me == 0) {
      ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) return absl::UnavailableError(absl::StrCat(what, ": ncclGetUniqueId: ", ncclGetErrorString(r)));
      DT_RETURN_IF_ERROR(rv_.store->Set(id_key, std::string(id.internal, sizeof(id.internal))));
    } else {
      DT_ASSIGN_OR_RETURN(std::string bytes, rv_.store->WaitGet(id_key, timeout()));
      if (bytes.size() != sizeof(id.internal)) return absl::InternalError(absl::StrCat(what, ": malformed NCCL id"));
      std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
    }
    cudaSetDevice(info_.local_rank);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, static_cast<int>(ranks.size()), id, me, &config);
    while (comm != nullptr && (r == ncclSuccess || r == ncclInProgress)) {
      ncclCommGetAsyncError(comm, &r);
      if (r != ncclInProgress) break;
      if (Clock::now() >= deadline) {
        ncclCommAbort(comm);
        return absl::DeadlineExceededError(absl::StrCat(what, ": ncclCommInitRankConfig did not finish within ",
                                                        timeout().count(), " ms"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (r != ncclSuccess) {
      if (comm != nullptr) ncclCommAbort(comm);
      return absl::UnavailableError(absl::StrCat(what, ": NCCL: ", ncclGetErrorString(r)));
    }
    cudaStream_t stream;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
      ncclCommAbort(comm);
      return absl::InternalError(absl::StrCat(what, ": cannot create a CUDA stream"));
    }
    auto made = std::make_shared<NcclComm>(comm, stream, info_.local_rank, ranks, me, timeout());
    made->set_verify(options_.verify.value_or(false));
    return CommPtr(std::move(made));
  }

  Rendezvous rv_;
};

absl::StatusOr<std::shared_ptr<World>> MakeWorld(const LaunchInfo& info, const WorldOptions& options) {
  const int devices = CudaDeviceCount();
  if (devices <= info.local_rank) {
    return absl::FailedPreconditionError(absl::StrCat("backend nccl: local rank ", info.local_rank,
                                                      " needs GPU ", info.local_rank, "; this node has ", devices,
                                                      " usable CUDA device(s)"));
  }
  DT_ASSIGN_OR_RETURN(Rendezvous rv, StartRendezvous(info, options.timeout, "nccl"));
  return std::shared_ptr<World>(std::make_shared<NcclWorld>(info, options, std::move(rv)));
}

}  // namespace
}  // namespace dt::internal

extern "C" __attribute__((visibility("default"))) const dt::internal::ModuleHeader* dtensor_nccl_module_v1() {
  static const dt::internal::NcclModule module = {DT_MODULE_HEADER, dt::internal::MakeWorld};
  return &module.header;
}
