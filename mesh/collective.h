#pragma once
// Internal to mesh/: one collective call as data, its validation, and the base class every backend
// derives from (Communicator itself). The base turns each XxxAsync call into a Collective, checks it once for all backends
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
#include "dtensor/core/reduce_op.h"
#include "dtensor/mesh/comm_types.h"

namespace dt::internal {

enum class CollectiveKind : uint8_t {
  kAllReduce, kAllGather, kAllGatherV, kReduceScatter, kReduceScatterV, kAllToAll, kAllToAllV,
  kAllToAllViews, kBroadcast, kSend, kRecv, kBarrier,
};
absl::string_view CollectiveName(CollectiveKind kind);  // "all_reduce", ...
bool IsReduction(CollectiveKind kind);
struct Collective;
// Records an accepted collective in this thread's CommCounters (mesh/comm_counter.h).
void CountIssued(const Collective& c);

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

// A backend derives from Communicator (mesh/communicator.h) and implements Run, plus the hooks it
// handles natively (VerifiesInRun, HandlesViews, ReducesAvg, RunInvalid).

}  // namespace dt::internal
