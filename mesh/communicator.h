#pragma once
// Communicator: one process group (an ordered list of global ranks) on one backend.
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

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dtensor/core/reduce_op.h"
#include "dtensor/core/tensor.h"

namespace dt {

// Handle of an asynchronous collective.
class Work {
 public:
  virtual ~Work() = default;
  virtual absl::Status Wait() = 0;
  // A Work that is already finished with `status`.
  static std::shared_ptr<Work> Done(absl::Status status = absl::OkStatus());
};
using WorkPtr = std::shared_ptr<Work>;

// What AllToAllViews exchanges with one peer: the elements of these tensors (any strides), each
// view in row-major order, one view after another. See Note [All-to-all over views] in
// mesh/collective.h.
using TensorViews = std::vector<Tensor>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // rank within this group
  virtual int size() const = 0;
  // The global ranks of the members, in group-rank order.
  virtual const std::vector<int>& global_ranks() const = 0;
  virtual absl::string_view backend() const = 0;  // "threads", "gloo", "mpi", "nccl"
  // "gloo group [0, 2, 4, 6]" — used in error messages.
  std::string Describe() const;

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

  virtual WorkPtr AllReduceAsync(const Tensor& x, ReduceOp op) = 0;
  virtual WorkPtr AllGatherAsync(const Tensor& x, const Tensor& out) = 0;
  virtual WorkPtr AllGatherVAsync(const Tensor& x, const Tensor& out,
                                  std::vector<int64_t> counts) = 0;
  virtual WorkPtr ReduceScatterAsync(const Tensor& x, const Tensor& out, ReduceOp op) = 0;
  virtual WorkPtr ReduceScatterVAsync(const Tensor& x, const Tensor& out,
                                      std::vector<int64_t> counts, ReduceOp op) = 0;
  virtual WorkPtr AllToAllAsync(const Tensor& x, const Tensor& out) = 0;
  virtual WorkPtr AllToAllVAsync(const Tensor& x, std::vector<int64_t> send_counts,
                                 const Tensor& out, std::vector<int64_t> recv_counts) = 0;
  // An all_to_all whose blocks are lists of strided views, so that a transpose-like exchange
  // (a shard-dim change) needs no separate pack/unpack pass. send[r] goes to group rank r and
  // recv[r] receives from it (me to me included); the element counts must agree pairwise (rank
  // r's send[q] and rank q's recv[r]); shapes may differ, only the order of the elements counts.
  // One dtype throughout, on this communicator's device; every rank passes at least one view
  // (zero-size ones are fine); no recv view may share bytes with a send view, and recv views must
  // not overlap one another.
  virtual WorkPtr AllToAllViewsAsync(std::vector<TensorViews> send, std::vector<TensorViews> recv) = 0;
  virtual WorkPtr BroadcastAsync(const Tensor& x, int root) = 0;
  virtual WorkPtr SendAsync(const Tensor& x, int dst) = 0;
  virtual WorkPtr RecvAsync(const Tensor& x, int src) = 0;
  virtual absl::Status Barrier() = 0;

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

 protected:
  std::chrono::milliseconds timeout_{300'000};
};
using CommPtr = std::shared_ptr<Communicator>;

}  // namespace dt
