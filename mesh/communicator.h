#pragma once
// Communicator: one process group (an ordered list of global ranks) on one backend. The class is
// the front end every backend shares: each call becomes an internal::Collective, validated once,
// verified across members, counted (mesh/comm_counter.h), averaged (Note [Average once]) and
// handed to the backend's Run (mesh/collective.h).
//
// Semantics (every backend; docs/mesh.md has the per-backend details):
//   - Tensors passed in must be contiguous (except AllToAllViews') and on the backend's device (cpu
//     for threads/gloo/mpi, cuda for nccl); every member passes the same dtype and (where stated)
//     the same sizes.
//     Inputs and outputs must not overlap. Local mistakes are InvalidArgument at once; members that
//     disagree with each other are InvalidArgument on every member (threads always; the others
//     when WorldOptions::verify is on, the default).
//   - Calls are collective over the group and must be issued in the same order on every member.
//   - Every call finishes within timeout(): when a peer dies or never arrives the call returns
//     DeadlineExceeded/Unavailable/Aborted naming the collective, the group and, where the backend
//     can know, the missing ranks. After such an error the communicator may stay broken (gloo,
//     mpi, nccl): later calls fail at once with the original error.
//   - Async variants return a Work whose Wait() yields the result; the tensors must stay alive
//     until then. The synchronous forms are Async(...)->Wait(). gloo and mpi run a communicator's
//     collectives in order on a worker thread; nccl enqueues on its stream; threads completes
//     collectives before returning (its receives happen on Wait()).
//   - Reductions: f32, bf16, f16, i64, i32, u8 (not bool). Half types are combined as f32 per
//     element pair and rounded back; avg = sum / size (integers: truncating division).
//
//   collective        input (per rank)         output (per rank)
//   AllReduce         x [n]                    x [n] reduced in place
//   AllGather         x [n]                    out [size*n], rank r's x at r*n
//   AllGatherV        x [counts[me]]           out [sum counts], rank r's x at prefix(counts, r)
//   ReduceScatter     x [size*n]               out [n] = reduction of every rank's block `me`
//   ReduceScatterV    x [sum counts]           out [counts[me]]
//   AllToAll          x [size*n]               out [size*n]: block r of out = block `me` of rank r's x
//   AllToAllV         x, send_counts[size]     out, recv_counts[size] (element counts per peer)
//   AllToAllViews     send[size]: views        recv[size]: views; recv[r] is filled with send[me]
//                                              of rank r (strided, see Note [All-to-all over views])
//   Broadcast         x from `root` (group rank) to everyone, in place
//   Send/Recv         point to point by group rank
// Counts and sizes are in elements of the tensor's dtype.

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dtensor/core/reduce_op.h"
#include "dtensor/core/tensor.h"
#include "dtensor/mesh/comm_types.h"

namespace dt {

namespace internal {
struct Collective;  // mesh/collective.h
}  // namespace internal

class Communicator {
 public:
  Communicator(std::vector<int> global_ranks, int rank, Device device,
               std::chrono::milliseconds timeout);
  virtual ~Communicator() = default;

  int rank() const { return rank_; }  // rank within this group
  int size() const { return static_cast<int>(global_ranks_.size()); }
  // The global ranks of the members, in group-rank order.
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  Device device() const { return device_; }
  virtual absl::string_view backend() const = 0;  // "threads", "shm", "gloo", "mpi", "nccl"
  // "gloo group [0, 2, 4, 6]" — used in error messages.
  std::string Describe() const;

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

  WorkPtr AllReduceAsync(const Tensor& x, ReduceOp op);
  WorkPtr AllGatherAsync(const Tensor& x, const Tensor& out);
  WorkPtr AllGatherVAsync(const Tensor& x, const Tensor& out, std::vector<int64_t> counts);
  WorkPtr ReduceScatterAsync(const Tensor& x, const Tensor& out, ReduceOp op);
  WorkPtr ReduceScatterVAsync(const Tensor& x, const Tensor& out, std::vector<int64_t> counts,
                              ReduceOp op);
  WorkPtr AllToAllAsync(const Tensor& x, const Tensor& out);
  WorkPtr AllToAllVAsync(const Tensor& x, std::vector<int64_t> send_counts, const Tensor& out,
                         std::vector<int64_t> recv_counts);
  // An all_to_all whose blocks are lists of strided views, so that a transpose-like exchange
  // (a shard-dim change) needs no separate pack/unpack pass. send[r] goes to group rank r and
  // recv[r] receives from it (me to me included); the element counts must agree pairwise (rank
  // r's send[q] and rank q's recv[r]); shapes may differ, only the order of the elements counts.
  // One dtype throughout, on this communicator's device; every rank passes at least one view
  // (zero-size ones are fine); no recv view may share bytes with a send view, and recv views must
  // not overlap one another.
  WorkPtr AllToAllViewsAsync(std::vector<TensorViews> send, std::vector<TensorViews> recv);
  WorkPtr BroadcastAsync(const Tensor& x, int root);
  WorkPtr SendAsync(const Tensor& x, int dst);
  WorkPtr RecvAsync(const Tensor& x, int src);
  absl::Status Barrier();

  absl::Status AllReduce(const Tensor& x, ReduceOp op) { return AllReduceAsync(x, op)->Wait(); }
  absl::Status AllGather(const Tensor& x, const Tensor& out) { return AllGatherAsync(x, out)->Wait(); }
  absl::Status AllGatherV(const Tensor& x, const Tensor& out, std::vector<int64_t> counts) {
    return AllGatherVAsync(x, out, std::move(counts))->Wait();
  }
  absl::Status ReduceScatter(const Tensor& x, const Tensor& out, ReduceOp op) {
    return ReduceScatterAsync(x, out, op)->Wait();
  }
  absl::Status ReduceScatterV(const Tensor& x, const Tensor& out, std::vector<int64_t> counts,
                              ReduceOp op) {
    return ReduceScatterVAsync(x, out, std::move(counts), op)->Wait();
  }
  absl::Status AllToAll(const Tensor& x, const Tensor& out) { return AllToAllAsync(x, out)->Wait(); }
  absl::Status AllToAllV(const Tensor& x, std::vector<int64_t> send_counts, const Tensor& out,
                         std::vector<int64_t> recv_counts) {
    return AllToAllVAsync(x, std::move(send_counts), out, std::move(recv_counts))->Wait();
  }
  absl::Status AllToAllViews(std::vector<TensorViews> send, std::vector<TensorViews> recv) {
    return AllToAllViewsAsync(std::move(send), std::move(recv))->Wait();
  }
  absl::Status Broadcast(const Tensor& x, int root) { return BroadcastAsync(x, root)->Wait(); }
  absl::Status Send(const Tensor& x, int dst) { return SendAsync(x, dst)->Wait(); }
  absl::Status Recv(const Tensor& x, int src) { return RecvAsync(x, src)->Wait(); }

  // Verification (WorldOptions::verify sets it): before each collective the members all-gather
  // what they pass, and a disagreement fails every member with InvalidArgument instead of
  // reaching the backend (where gloo aborts the process, MPI may hang and NCCL reads garbage).
  void set_verify(bool verify) { verify_ = verify; }
  // Runs all_to_all_views through the default staging path even where the backend moves views
  // itself (tests of that path on every backend, and benchmarks).
  void set_stage_views(bool stage) { stage_views_ = stage; }

  // For backends (mesh/collective.h): "<Describe()>, global rank G: <c.Describe()>", the prefix
  // of every error about `c`; and, for those that verify inside Run, this member's encoded
  // fingerprint and the check of everyone's (group-rank order, concatenated).
  std::string ErrorPrefix(const internal::Collective& c) const;
  std::vector<int64_t> EncodedFingerprint(const internal::Collective& c) const;
  absl::Status CheckFingerprints(const internal::Collective& c,
                                 const std::vector<int64_t>& all) const;

 protected:
  // What a backend implements: run a validated collective. Send/recv carry their own sequence
  // numbers (per peer).
  virtual WorkPtr Run(internal::Collective c) = 0;
  // Called instead of Run when this rank's arguments are invalid. The default returns `error` at
  // once; a backend that can tell its peers (threads) overrides it so they fail too.
  virtual WorkPtr RunInvalid(internal::Collective c, absl::Status error);
  // True when Run() honours Collective::verify itself; otherwise the base verifies synchronously
  // (an all_gather through Run) before calling Run.
  virtual bool VerifiesInRun() const { return false; }
  // True when Run() moves all_to_all_views data itself, from and into the views; otherwise the
  // base packs the send views into a staging input, runs the collective as an all_to_all_v into a
  // staging output and unpacks that on Wait() (see Note [All-to-all over views]).
  virtual bool HandlesViews() const { return false; }
  // True when Run() computes avg of `dtype` itself (NCCL's native float average); otherwise the
  // base runs avg as sum and divides on Wait() (Note [Average once] in communicator.cc).
  virtual bool ReducesAvg(DType dtype) const { return false; }

 private:
  WorkPtr Submit(internal::Collective c);
  // Verification (when on), then Run.
  WorkPtr Dispatch(internal::Collective c);
  absl::Status Validate(const internal::Collective& c) const;
  absl::Status ValidateViews(const internal::Collective& c) const;
  // The default all_to_all_views: pack, Run as all_to_all_v on staging buffers, unpack on Wait().
  WorkPtr RunViewsStaged(internal::Collective c);
  absl::Status Verify(const internal::Collective& c);

  std::vector<int> global_ranks_;
  int rank_;
  Device device_;
  std::chrono::milliseconds timeout_{300'000};
  std::atomic<int64_t> next_seq_{0};
  bool verify_ = false;
  bool stage_views_ = false;
};
using CommPtr = std::shared_ptr<Communicator>;

}  // namespace dt
