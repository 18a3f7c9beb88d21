#pragma once
// Internal to mesh/: one collective call as data, its validation, and the base class every backend
// derives from. The base turns each XxxAsync call into a Collective, checks it once for all backends
// (contiguity, device, dtypes, element counts, roots and peers) and hands it to Run().
//
//   kind             input                      output                      extra
//   all_reduce       x (in place)               -                           op
//   all_gather       x [n]                      out [size*n]                -
//   all_gather_v     x [counts[me]]             out [sum counts]            counts
//   reduce_scatter   x [size*n]                 out [n]                     op
//   reduce_scatter_v x [sum counts]             out [counts[me]]            counts, op
//   all_to_all       x [size*n]                 out [size*n]                -
//   all_to_all_v     x [sum counts]             out [sum recv_counts]       counts, recv_counts
//   all_to_all_views send_views[size]           recv_views[size]            counts, recv_counts (their
//                                                                           element counts)
//   broadcast        x (in place)               -                           peer = root
//   send / recv      x                          -                           peer
//   barrier          -                          -                           -
//
// Note [All-to-all over views]
// Why: a shard-dim change (S(0) -> S(1)) sends each peer a strided block of the local piece
// (x[:, cols(g)]), and communicators took contiguous buffers only, so the executor packed the
// blocks first: one more pass over the data, about as long as the exchange itself where the
// transport runs at memory speed (threads, MPI's shared memory): 0.5x the raw all_to_all there.
// Contract: AllToAllViews(send[size], recv[size]), each entry a list of views of any strides; the
// elements exchanged with a peer are its list's views in row-major order, one after another (a
// ViewStream, mesh/view_stream.h), so shapes need not match across ranks, only counts. The base
// computes counts/recv_counts from the views, so verification and the threads backend's checks
// see them like all_to_all_v's; views must not share bytes with the other side's (checked on the
// byte spans, which is conservative for interleaved views of one buffer).
// Backends (bench_redistribute, S(0) -> S(1) of 16 and 64 MiB on 2 and 4 ranks, ratio raw
// all_to_all / ours; 2-vCPU VM, medians of interleaved runs):
//   threads  receivers copy straight from the senders' views into their own: no staging. The
//            copy streams (Note [Copying between views] in view_stream.cc), which is what makes
//            a strided copy keep up with the raw all_to_all's one memcpy per block.
//   mpi      MPI_Alltoallw with derived datatypes (hvectors of the coalesced dims, a struct over
//            the views at absolute addresses, MPI_BOTTOM); our own block is copied view to view.
//            OpenMPI packs a non-contiguous send through vader's shared-memory fragments
//            (single-copy CMA needs contiguous memory), and its default 32 KiB fragments cost
//            0.7x at 16 MiB; MakeMpiWorld raises btl_vader_max_send_size to 128 KiB unless the
//            user set it (contiguous collectives use CMA and do not change: bench_collectives
//            within noise). Per-peer pipelining (pack 64 KiB-1 MiB chunks, MPI_Isend/Irecv,
//            unpack as they arrive) measured 0.5-0.78x: two full passes against MPI's in-cache
//            fragments.
//   gloo     per peer, the stream in 1 MiB chunks on unbound buffers (slot: 0x43, sequence,
//            chunk): every receive posted first (in place where contiguous, else staging), each
//            send chunk packed and sent at once so packing overlaps gloo's I/O thread, our block
//            copied view to view meanwhile, staged chunks unpacked as they arrive. TCP can only
//            send contiguous bytes, so the send side still packs (4 ranks on 2 cores are
//            CPU-bound: that pass shows there).
//   nccl     the default below: cheap next to NVLink.
// Default (HandlesViews() false, or set_stage_views): the base packs the send views into a staging
// input, runs the collective as an all_to_all_v of it (the same sequence number; staged_views
// keeps error messages naming all_to_all_views) and unpacks the staging output into the recv
// views on Wait().

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "dtensor/core/tensor.h"
#include "dtensor/mesh/communicator.h"

namespace dt::internal {

enum class CollectiveKind : uint8_t {
  kAllReduce, kAllGather, kAllGatherV, kReduceScatter, kReduceScatterV, kAllToAll, kAllToAllV,
  kAllToAllViews, kBroadcast, kSend, kRecv, kBarrier,
};
absl::string_view CollectiveName(CollectiveKind kind);  // "all_reduce", ...
bool IsReduction(CollectiveKind kind);
// Records an accepted collective in this thread's CommCounters (mesh/comm_counter.h).
void CountIssued(CollectiveKind kind);

struct Collective {
  CollectiveKind kind = CollectiveKind::kBarrier;
  Tensor input{};
  Tensor output{};  // undefined for in-place kinds, send/recv and barrier
  ReduceOp op = ReduceOp::kSum;
  int peer = 0;                      // broadcast root, send destination, recv source (group ranks)
  std::vector<int64_t> counts{};       // *_v kinds (send counts for all_to_all_v/views)
  std::vector<int64_t> recv_counts{};  // all_to_all_v/views
  std::vector<TensorViews> send_views{}, recv_views{};  // all_to_all_views, per group rank
  DType views_dtype = DType::kU8;                       // all_to_all_views
  bool staged_views = false;  // an all_to_all_views run as all_to_all_v on staging input/output
  bool averaged = false;      // the caller asked for avg: op is kSum and the base divides on Wait()
  int64_t seq = 0;                   // per-communicator sequence number of collectives
  bool verify = false;               // the backend checks Fingerprints first (see set_verify)

  DType dtype() const { return input.defined() ? input.dtype() : views_dtype; }
  // The reduction the caller asked for (avg where the base runs it as sum).
  ReduceOp requested_op() const { return averaged ? ReduceOp::kAvg : op; }
  // "all_reduce #3 (f32[1024], sum)" — for error messages.
  std::string Describe() const;
};

// What every member of a collective must agree on, comparable across ranks (the threads backend
// compares them directly; the other backends all-gather them first when verification is on).
struct Fingerprint {
  CollectiveKind kind = CollectiveKind::kBarrier;
  DType dtype = DType::kU8;
  ReduceOp op = ReduceOp::kSum;
  int peer = 0;
  int64_t input_numel = 0;
  std::vector<int64_t> counts;       // *_v kinds
  std::vector<int64_t> recv_counts;  // all_to_all_v/views

  static Fingerprint Of(const Collective& c);
  // 5 + 2 * group_size integers.
  std::vector<int64_t> Encode(int group_size) const;
  static Fingerprint Decode(const int64_t* data, int group_size);
};
// "" when the members agree; else the first disagreement, naming global ranks and both values:
// "ranks disagree on the dtype: global rank 0 passed f32, global rank 3 passed bf16".
std::string FindDisagreement(const std::vector<Fingerprint>& members, const std::vector<int>& global_ranks);

// "[0, 1, 2]": how every error message lists ranks.
std::string RankList(absl::Span<const int> ranks);
// A hash of a member list (FNV-1a), the same in every process: names a group in the store and in
// MPI's group-creation tag.
uint64_t GroupHash(absl::Span<const int> ranks);

// Prefix sums: Offsets({2, 0, 3}) = {0, 2, 2}; Sum({2, 0, 3}) = 5.
std::vector<int64_t> Offsets(const std::vector<int64_t>& counts);
int64_t Sum(const std::vector<int64_t>& counts);
// Ranges of `n` elements split into `parts` nearly equal chunks: chunk i is [begin(i), begin(i+1)).
inline int64_t ChunkBegin(int64_t n, int parts, int i) { return n * i / parts; }

// Base of every backend's communicator: validation, sequence numbers, the synchronous forms.
class BackendCommunicator : public Communicator {
 public:
  BackendCommunicator(std::vector<int> global_ranks, int rank, Device device,
                      std::chrono::milliseconds timeout);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(global_ranks_.size()); }
  const std::vector<int>& global_ranks() const override { return global_ranks_; }
  Device device() const { return device_; }

  WorkPtr AllReduceAsync(const Tensor& x, ReduceOp op) override;
  WorkPtr AllGatherAsync(const Tensor& x, const Tensor& out) override;
  WorkPtr AllGatherVAsync(const Tensor& x, const Tensor& out, std::vector<int64_t> counts) override;
  WorkPtr ReduceScatterAsync(const Tensor& x, const Tensor& out, ReduceOp op) override;
  WorkPtr ReduceScatterVAsync(const Tensor& x, const Tensor& out, std::vector<int64_t> counts,
                              ReduceOp op) override;
  WorkPtr AllToAllAsync(const Tensor& x, const Tensor& out) override;
  WorkPtr AllToAllVAsync(const Tensor& x, std::vector<int64_t> send_counts, const Tensor& out,
                         std::vector<int64_t> recv_counts) override;
  WorkPtr AllToAllViewsAsync(std::vector<TensorViews> send, std::vector<TensorViews> recv) override;
  WorkPtr BroadcastAsync(const Tensor& x, int root) override;
  WorkPtr SendAsync(const Tensor& x, int dst) override;
  WorkPtr RecvAsync(const Tensor& x, int src) override;
  absl::Status Barrier() override;

  // "<Describe()>, global rank G: <c.Describe()>" — the prefix of every error about `c`.
  std::string ErrorPrefix(const Collective& c) const;
  // Verification (WorldOptions::verify): before each collective the members all-gather their
  // Fingerprints, and a disagreement fails every member with InvalidArgument instead of reaching
  // the backend (where gloo aborts the process, MPI may hang and NCCL reads garbage).
  void set_verify(bool verify) { verify_ = verify; }
  // Runs all_to_all_views through the default staging path even where the backend moves views
  // itself (tests of that path on every backend, and benchmarks).
  void set_stage_views(bool stage) { stage_views_ = stage; }

  // For backends that verify inside Run (their worker thread, no extra hand-off): this member's
  // encoded Fingerprint, and the check of everyone's (group-rank order, concatenated).
  std::vector<int64_t> EncodedFingerprint(const Collective& c) const { return Fingerprint::Of(c).Encode(size()); }
  absl::Status CheckFingerprints(const Collective& c, const std::vector<int64_t>& all) const;

 protected:
  // Runs a validated collective. Send/recv carry their own sequence numbers (per peer).
  virtual WorkPtr Run(Collective c) = 0;
  // Called instead of Run when this rank's arguments are invalid. The default returns `error` at
  // once; a backend that can tell its peers (threads) overrides it so they fail too.
  virtual WorkPtr RunInvalid(Collective c, absl::Status error);
  // True when Run() honours Collective::verify itself; otherwise the base verifies synchronously
  // (an all_gather through Run) before calling Run.
  virtual bool VerifiesInRun() const { return false; }
  // True when Run() moves all_to_all_views data itself, from and into the views; otherwise the base
  // packs the send views into a staging input, runs the collective as an all_to_all_v into a
  // staging output and unpacks that on Wait() (see Note [All-to-all over views]).
  virtual bool HandlesViews() const { return false; }
  // True when Run() computes avg of `dtype` itself (NCCL's native float average); otherwise the
  // base runs avg as sum and divides on Wait() (Note [Average once] in collective.cc).
  virtual bool ReducesAvg(DType dtype) const { return false; }

 private:
  WorkPtr Submit(Collective c);
  // Verification (when on), then Run.
  WorkPtr Dispatch(Collective c);
  absl::Status Validate(const Collective& c) const;
  absl::Status ValidateViews(const Collective& c) const;
  // The default all_to_all_views: pack, Run as all_to_all_v on staging buffers, unpack on Wait().
  WorkPtr RunViewsStaged(Collective c);
  absl::Status Verify(const Collective& c);

  std::vector<int> global_ranks_;
  int rank_;
  Device device_;
  std::atomic<int64_t> next_seq_{0};
  bool verify_ = false;
  bool stage_views_ = false;
};

}  // namespace dt::internal
