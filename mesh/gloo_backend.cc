// The gloo backend: Debian's libgloo (0.5) over TCP, rendezvous through our TcpStore.
//
// Note [Gloo backend]
//   - Groups: one gloo context per group (connectFullMesh through a PrefixStore "g/<gid>/"), made
//     after every member has joined ("g/<gid>/join/<i>"), so a member that never calls Group() is
//     named in the timeout error. One TCP device per process, shared by every context.
//   - Async: gloo's calls block, so each communicator runs its collectives in order on its own
//     worker thread (WorkQueue; a Wait() on the next item runs it on the waiting thread, so the
//     synchronous forms cost no hand-off); send/recv go straight to gloo's unbound buffers.
//   - Reductions: our own element-wise function (mesh/reduce.h) for every dtype, so bf16/f16 work
//     (gloo has no bf16) and avg is sum followed by one division.
//   - reduce_scatter(_v): gloo 0.5 has no options-style reduce_scatter; we run a ring on unbound
//     buffers (n-1 steps, each sends one block to the right and reduces the block from the left),
//     which moves (n-1)/n of the data per rank — half of an allreduce; uneven counts come free.
//   - Faults: gloo throws; we catch at this boundary (Fail). First we drop our gloo context:
//     closing its sockets makes the peers blocked on us fail at once instead of at their timeouts,
//     so the failure spreads through the group while everyone is still there to be asked. The
//     communicator stays broken afterwards (gloo pairs do not recover). Then we diagnose, within
//     DiagnosisTime(timeout) (at most 1 s; errors come within the timeout + about a second):
//       * every other member is probed directly (mesh/peer_probe.h): its process answers (alive,
//         or failing too: it marked itself when its own Fail began), refuses or resets (its host
//         is up, the process is gone: "died"), or says nothing (host down or network partition:
//         "unreachable"). Asking the peers, not the store, also works on the side of a partition
//         that lost the store, and names victims deterministically: a process being killed
//         resets the probe, it never answers it.
//       * ranks killed together die moments apart: once a probe finds one gone, the members that
//         answered are probed once more kSettle after the failure, so that all are named. One
//         that answered as failing and is gone now left after an error of its own: no cause.
//       * the store (a Peek on its own connection, bounded like the probes) lists the ranks whose
//         connection closed without Bye (died) or after Bye (left cleanly: no cause either), and
//         the arrival markers: every collective first posts one (fire and forget), so on a
//         timeout, or when nothing else explains the error, the members still alive that never
//         posted theirs for this collective are named: "never reached it", or "failed before
//         reaching it" when they answered as failing (stuck in an earlier collective that failed).
//   - Limit: gloo fails the transfers pending on a pair when its socket breaks, yet a transfer
//     toward a peer that is already gone, or one that left after an error of its own, sometimes
//     waits out the timeout instead (seen under load, about 1 run in 30). That survivor then
//     reports DEADLINE_EXCEEDED at its timeout, and the diagnosis still names the dead; members
//     that left after their own error before it asks are named as dead too. Debian's gloo headers
//     offer no public way to fail a pair from outside (tcp/pair.h needs a header they omit), and
//     cutting gloo's waits into slices does not work: a wait that times out closes every pair of
//     the context.
//   - gloo writes to sockets without MSG_NOSIGNAL, so a dead peer would raise SIGPIPE: creating a
//     gloo world sets SIGPIPE to ignored when it still has the default action.
//
// Note [Shm groups]
// The shm backend is this world with one difference: a group whose members all run on one host
// gets a shared-memory communicator (mesh/shm_backend.cc) instead of a gloo one. At world creation
// every rank publishes its HostKey (mesh/shm_segment.h: boot id, /dev/shm, network and PID
// namespaces) under "dt/host/<rank>"; a group is on one host when its members' keys are equal and
// not empty. So under dtrun/torchrun on one machine every group is shm; across machines the groups
// within a machine (a (node, local) mesh's `local` dim) are shm and the others (`node`, the world)
// gloo. Ranks in different network namespaces count as different hosts, which is what the
// simulated hosts of tests/multinode are. An shm group still makes its gloo context: send/recv
// travel on it, and when shared memory cannot be used (no /dev/shm, or too small: the members
// agree on that through the store) the group falls back to it with one line on stderr.

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/allgather.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/alltoall.h"
#include "gloo/alltoallv.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "dtensor/mesh/backends.h"
#include "dtensor/mesh/collective.h"
#include "dtensor/mesh/gloo_store.h"
#include "dtensor/mesh/peer_probe.h"
#include "dtensor/mesh/reduce.h"
#include "dtensor/mesh/shm_segment.h"
#include "dtensor/mesh/sockets.h"
#include "dtensor/mesh/tcp_store.h"
#include "dtensor/mesh/view_stream.h"
#include "dtensor/mesh/work.h"

namespace dt::internal {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kRingSlotPrefix = 0x41;
// See Note [Gloo backend]: how long after finding one member dead we look for others.
constexpr std::chrono::milliseconds kSettle{200};

// The store key under which a rank publishes its probe endpoint ("host:port").
std::string ProbeKey(int global_rank) { return absl::StrCat("dt/probe/", global_rank); }
// ... and its HostKey (shm worlds, Note [Shm groups]).
std::string HostKeyKey(int global_rank) { return absl::StrCat("dt/host/", global_rank); }
constexpr uint64_t kP2PSlotPrefix = 0x42;
constexpr uint64_t kViewsSlotPrefix = 0x43;

// What is left of a deadline, for gloo's waits (at least 1 ms: gloo reads 0 as "the default").
std::chrono::milliseconds Left(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
}

// The same element-wise reduction for every gloo path: c = a op b.
gloo::AllreduceOptions::Func ReduceFunc(DType dtype, ReduceOp op) {
  // gloo calls c = a op b with c == a, c == b or all distinct; Reduce3 handles each in one pass.
  return [dtype, op](void* c, const void* a, const void* b, size_t n) {
    Reduce3(c, a, b, static_cast<int64_t>(n), dtype, op);
  };
}

class GlooComm final : public Communicator {
 public:
  // `probe_endpoints`: per member, where its ProbeListener answers ("" for this rank and unknowns).
  // `probe`: this process's listener (null in a world of one).
  GlooComm(std::shared_ptr<gloo::Context> ctx, std::shared_ptr<TcpStore> store, std::string gid,
           std::vector<int> ranks, int rank, std::chrono::milliseconds timeout,
           std::vector<std::string> probe_endpoints, std::shared_ptr<ProbeListener> probe)
      : Communicator(std::move(ranks), rank, kCPU, timeout),
        ctx_(std::move(ctx)),
        store_(std::move(store)),
        gid_(std::move(gid)),
        probe_endpoints_(std::move(probe_endpoints)),
        probe_(std::move(probe)),
        send_seq_(size(), 0),
        recv_seq_(size(), 0) {}

  absl::string_view backend() const override { return "gloo"; }

 protected:
  WorkPtr Run(Collective c) override {
    if (c.kind == CollectiveKind::kSend || c.kind == CollectiveKind::kRecv) return PointToPoint(c);
    store_->Arrive(ArrivalKey(rank()), c.seq + 1);
    return queue_.Post([this, c = std::move(c)] { return Execute(c); });
  }

 private:
  std::string ArrivalKey(int group_rank) const { return absl::StrCat("a/", gid_, "/", group_rank); }

  // The live context, or the error that broke this communicator.
  absl::StatusOr<std::shared_ptr<gloo::Context>> Context(const Collective& c) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ctx_) {
      return absl::Status(broken_.code(), absl::StrCat(ErrorPrefix(c), ": communicator is broken by an earlier error: ",
                                                       broken_.message()));
    }
    return ctx_;
  }

  // Breaks the communicator, then names the members that died, those out of reach and (on a
  // timeout, or when nothing else explains the error) those that never reached `c` (see Note
  // [Gloo backend]). Returns within about DiagnosisTime(timeout()) + 2 * kSettle.
  absl::Status Fail(const Collective& c, const std::string& what) {
    const bool timed_out = absl::StrContains(what, "imed out");
    const auto start = Clock::now();
    if (probe_) probe_->MarkFailing();
    bool first = false;
    {
      // Drop our gloo context first: the peers blocked on us fail now, and diagnose while we still
      // answer their probes (as failing, not as a cause).
      std::lock_guard<std::mutex> lock(mu_);
      if (ctx_) {
        broken_ = absl::UnavailableError(absl::StrCat(ErrorPrefix(c), ": gloo: ", what));
        ctx_.reset();
        first = true;
      }
    }
    const std::chrono::milliseconds budget = DiagnosisTime(timeout());
    std::vector<std::string> keys{std::string(TcpStore::kDeadKey), std::string(TcpStore::kLeftKey)};
    constexpr size_t kMarkers = 2;  // the arrival markers follow the two lists
    if (c.kind != CollectiveKind::kSend && c.kind != CollectiveKind::kRecv) {
      for (int i = 0; i < size(); ++i) keys.push_back(ArrivalKey(i));
    }
    std::vector<PeerState> state;
    absl::StatusOr<std::vector<std::optional<std::string>>> peek;
    {
      PeerProbes probes(probe_endpoints_);  // the answers come in while we ask the store
      peek = store_->Peek(keys, budget);
      state = probes.Wait(start + budget);
    }
    // Members killed together die moments apart: once one is gone, look again at the others.
    std::vector<bool> was_failing(size(), false);
    if (std::find(state.begin(), state.end(), PeerState::kGone) != state.end()) {
      std::this_thread::sleep_until(start + kSettle);
      std::vector<std::string> again(size());
      for (int i = 0; i < size(); ++i) {
        if (state[i] == PeerState::kAlive || state[i] == PeerState::kFailing) again[i] = probe_endpoints_[i];
      }
      PeerProbes second(again);
      const auto by = std::max(start + budget, Clock::now() + kSettle);
      absl::StatusOr<std::vector<std::optional<std::string>>> later_peek =
          store_->Peek(keys, std::chrono::duration_cast<std::chrono::milliseconds>(by - Clock::now()));
      if (later_peek.ok()) peek = std::move(later_peek);
      const std::vector<PeerState> later = second.Wait(by);
      for (int i = 0; i < size(); ++i) {
        if (again[i].empty()) continue;
        was_failing[i] = state[i] == PeerState::kFailing;
        state[i] = later[i];
      }
    }
    auto list = [&](size_t k) {
      return peek.ok() && (*peek)[k].has_value() ? ParseRankList(*(*peek)[k]) : std::vector<int>();
    };
    const std::vector<int> store_dead = list(0), store_left = list(1);
    auto in = [](const std::vector<int>& v, int g) { return std::find(v.begin(), v.end(), g) != v.end(); };
    std::vector<int> dead, unreachable, stalled, maybe_missing;
    for (int i = 0; i < size(); ++i) {
      if (i == rank()) continue;
      const int g = global_ranks()[i];
      switch (state[i]) {
        case PeerState::kGone:  // a failing member that left after its own error is no cause
          if (!was_failing[i] && !in(store_left, g)) dead.push_back(g);
          break;
        case PeerState::kSilent:
          (in(store_dead, g) ? dead : unreachable).push_back(g);
          break;
        case PeerState::kStalled:  // alive, not answering: also a member that never arrives
          stalled.push_back(g);
          maybe_missing.push_back(i);
          break;
        case PeerState::kUnknown:
          if (in(store_dead, g)) {
            dead.push_back(g);
          } else if (!in(store_left, g)) {
            maybe_missing.push_back(i);
          }
          break;
        case PeerState::kAlive:
        case PeerState::kFailing:
          maybe_missing.push_back(i);
          break;
      }
    }
    std::vector<int> missing, failed_before;  // alive, and failing themselves
    if (peek.ok() && peek->size() > kMarkers && (timed_out || (dead.empty() && unreachable.empty()))) {
      for (int i : maybe_missing) {
        int64_t reached = 0;
        const std::optional<std::string>& v = (*peek)[kMarkers + i];
        if (v.has_value() && !absl::SimpleAtoi(*v, &reached)) reached = 0;
        if (reached > c.seq) continue;
        (state[i] == PeerState::kFailing ? failed_before : missing).push_back(global_ranks()[i]);
      }
    }
    std::string msg = ErrorPrefix(c) + ": ";
    if (!dead.empty()) absl::StrAppend(&msg, "global rank(s) ", RankList(dead), " died (process gone); ");
    if (!unreachable.empty()) {
      absl::StrAppend(&msg, "global rank(s) ", RankList(unreachable), " unreachable (no answer within ",
                      budget.count(), " ms: host down or network partition); ");
    }
    if (!stalled.empty()) {
      absl::StrAppend(&msg, "global rank(s) ", RankList(stalled), " not answering (its host does, the ",
                      "process did not within ", budget.count(), " ms: stopped, or starved of CPU); ");
    }
    if (!missing.empty()) absl::StrAppend(&msg, "global rank(s) ", RankList(missing), " never reached it; ");
    if (!failed_before.empty()) {
      absl::StrAppend(&msg, "global rank(s) ", RankList(failed_before), " failed before reaching it; ");
    }
    if (!peek.ok()) absl::StrAppend(&msg, "the store is unreachable (global rank 0 may have died, or be cut off); ");
    if (timed_out) absl::StrAppend(&msg, "timed out after ", timeout().count(), " ms; ");
    absl::StrAppend(&msg, "gloo: ", what);
    absl::Status st = timed_out ? absl::DeadlineExceededError(msg) : absl::UnavailableError(msg);
    if (first) {
      std::lock_guard<std::mutex> lock(mu_);
      broken_ = st;
    }
    return st;
  }

  bool VerifiesInRun() const override { return true; }
  bool HandlesViews() const override { return true; }

  // Every gloo collective of `c` runs under its sequence number as the tag and our timeout.
  template <typename Options>
  void Tag(Options& opts, const Collective& c) {
    opts.setTag(static_cast<uint32_t>(c.seq));
    opts.setTimeout(timeout());
  }

  // all_gather and all_to_all: `run` from the whole input buffer into the whole output buffer, as
  // bytes; nothing to do for an empty input.
  template <typename Options>
  void WholeBuffers(const std::shared_ptr<gloo::Context>& ctx, const Collective& c, void (*run)(Options&)) {
    if (c.input.numel() == 0) return;
    Options opts(ctx);
    Tag(opts, c);
    opts.setInput(static_cast<uint8_t*>(c.input.raw_data()), c.input.nbytes());
    opts.setOutput(static_cast<uint8_t*>(c.output.raw_data()), c.output.nbytes());
    run(opts);
  }

  absl::Status Execute(const Collective& c) {
    DT_ASSIGN_OR_RETURN(std::shared_ptr<gloo::Context> ctx, Context(c));
    std::string error;
    try {
      if (c.verify) {
        std::vector<int64_t> mine = EncodedFingerprint(c), all(mine.size() * size());
        gloo::AllgatherOptions opts(ctx);
        Tag(opts, c);
        opts.setInput(mine.data(), mine.size());
        opts.setOutput(all.data(), all.size());
        gloo::allgather(opts);
        DT_RETURN_IF_ERROR(CheckFingerprints(c, all));
      }
      Gloo(ctx, c);
      return absl::OkStatus();
    } catch (const std::exception& e) {
      error = e.what();
    }
    ctx.reset();  // so that Fail's drop of the communicator's reference closes the sockets
    return Fail(c, error);
  }

  void Gloo(const std::shared_ptr<gloo::Context>& ctx, const Collective& c) {
    using K = CollectiveKind;
    const int64_t esz = DTypeSize(c.dtype());
    const int n = size();
    auto* in = static_cast<uint8_t*>(c.input.defined() ? c.input.raw_data() : nullptr);
    auto* out = static_cast<uint8_t*>(c.output.defined() ? c.output.raw_data() : nullptr);
    auto bytes = [&](const std::vector<int64_t>& counts) {
      std::vector<int64_t> b(counts.size());
      for (size_t i = 0; i < counts.size(); ++i) b[i] = counts[i] * esz;
      return b;
    };
    switch (c.kind) {
      case K::kAllReduce: {
        if (c.input.numel() == 0) return;
        gloo::AllreduceOptions opts(ctx);
        Tag(opts, c);
        DT_DISPATCH_DTYPE(c.dtype(), T, [&] { opts.setOutput(reinterpret_cast<T*>(in), c.input.numel()); });
        opts.setReduceFunction(ReduceFunc(c.dtype(), c.op));
        gloo::allreduce(opts);
        return;
      }
      case K::kAllGather:
        WholeBuffers<gloo::AllgatherOptions>(ctx, c, gloo::allgather);
        return;
      case K::kAllGatherV: {
        if (c.output.numel() == 0) return;
        gloo::AllgathervOptions opts(ctx);
        Tag(opts, c);
        std::vector<size_t> b;
        for (int64_t x : bytes(c.counts)) b.push_back(static_cast<size_t>(x));
        opts.setInput(in, c.input.nbytes());
        opts.setOutput(out, b);
        gloo::allgatherv(opts);
        return;
      }
      case K::kReduceScatter:
        RingReduceScatter(ctx, c, std::vector<int64_t>(n, c.output.numel()));
        return;
      case K::kReduceScatterV:
        RingReduceScatter(ctx, c, c.counts);
        return;
      case K::kAllToAll:
        WholeBuffers<gloo::AlltoallOptions>(ctx, c, gloo::alltoall);
        return;
      case K::kAllToAllV: {
        gloo::AlltoallvOptions opts(ctx);
        Tag(opts, c);
        opts.setInput(in, bytes(c.counts));
        opts.setOutput(out, bytes(c.recv_counts));
        gloo::alltoallv(opts);
        return;
      }
      case K::kAllToAllViews:
        ViewsAllToAll(ctx, c);
        return;
      case K::kBroadcast: {
        if (c.input.numel() == 0) return;
        gloo::BroadcastOptions opts(ctx);
        Tag(opts, c);
        opts.setRoot(c.peer);
        opts.setOutput(in, c.input.nbytes());
        gloo::broadcast(opts);
        return;
      }
      case K::kBarrier: {
        gloo::BarrierOptions opts(ctx);
        Tag(opts, c);
        gloo::barrier(opts);
        return;
      }
      case K::kSend:
      case K::kRecv:
        return;
    }
  }

  // See Note [Gloo backend]: block (r-s-1) goes right at step s, block (r-s-2) comes from the left
  // and is reduced with ours; after n-1 steps the block from the left is our own, fully reduced
  // (the last step receives straight into `out`). Blocks travel in segments of kRingSegment bytes,
  // one unbound buffer each, so each segment is reduced while the next ones are still in flight.
  void RingReduceScatter(const std::shared_ptr<gloo::Context>& ctx, const Collective& c,
                         const std::vector<int64_t>& counts) {
    constexpr int64_t kRingSegment = 1 << 20;
    const auto deadline = Clock::now() + timeout();
    const int n = size(), r = rank();
    const int64_t esz = DTypeSize(c.dtype());
    const std::vector<int64_t> off = Offsets(counts);
    char* in = static_cast<char*>(c.input.raw_data());
    char* out = static_cast<char*>(c.output.raw_data());
    if (n == 1) {
      std::memcpy(out, in, counts[0] * esz);
      return;
    }
    const int64_t block = *std::max_element(counts.begin(), counts.end()) * esz;
    if (scratch_bytes_ < 2 * block) {  // only this worker thread touches the scratch
      scratch_.reset(new char[2 * block]);
      scratch_bytes_ = 2 * block;
    }
    char* tmp[2] = {scratch_.get(), scratch_.get() + block};
    const int64_t seg = std::max<int64_t>(esz, kRingSegment / esz * esz);
    const int left = (r + n - 1) % n, right = (r + 1) % n;
    // Slot: prefix (8 bits) | sequence (16) | step (12) | segment (20), the same on both sides of
    // a transfer (the sender's block sb is the receiver's block rb).
    const uint64_t base = (kRingSlotPrefix << 56) | ((static_cast<uint64_t>(c.seq) & 0xffff) << 32);
    for (int s = 0; s < n - 1; ++s) {
      const int sb = (r - s - 1 + 2 * n) % n, rb = (r - s - 2 + 2 * n) % n;
      const bool last = s == n - 2;
      char* src = s == 0 ? in + off[sb] * esz : tmp[(s - 1) % 2];
      char* dst = last ? out : tmp[s % 2];
      const int64_t send_bytes = counts[sb] * esz, recv_bytes = counts[rb] * esz;
      const int64_t send_segs = (send_bytes + seg - 1) / seg, recv_segs = (recv_bytes + seg - 1) / seg;
      const uint64_t step_slot = base | (static_cast<uint64_t>(s & 0xfff) << 20);
      std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> recvs, sends;
      for (int64_t j = 0; j < recv_segs; ++j) {
        const int64_t o = j * seg, len = std::min(seg, recv_bytes - o);
        recvs.push_back(ctx->createUnboundBuffer(dst + o, len));
        recvs.back()->recv(left, step_slot + j);
      }
      for (int64_t j = 0; j < send_segs; ++j) {
        const int64_t o = j * seg, len = std::min(seg, send_bytes - o);
        sends.push_back(ctx->createUnboundBuffer(src + o, len));
        sends.back()->send(right, step_slot + j);
      }
      for (int64_t j = 0; j < recv_segs; ++j) {
        if (!recvs[j]->waitRecv(Left(deadline))) throw gloo::IoException("ring receive aborted");
        const int64_t o = j * seg, len = std::min(seg, recv_bytes - o);
        ReduceInto(dst + o, in + off[rb] * esz + o, len / esz, c.dtype(), c.op);
      }
      for (auto& b : sends) {
        if (!b->waitSend(Left(deadline))) throw gloo::IoException("ring send aborted");
      }
    }
  }

  // all_to_all_views: each peer's stream travels in chunks of kViewsChunk bytes, one unbound buffer
  // each. Every receive is posted first, straight into the recv views where a chunk is contiguous
  // there, else into staging; then each send chunk is packed (unless contiguous) and sent at once,
  // so packing overlaps the transfers gloo's I/O thread does; then our own block is copied view to
  // view, and received chunks are unpacked as they arrive (see Note [All-to-all over views]).
  void ViewsAllToAll(const std::shared_ptr<gloo::Context>& ctx, const Collective& c) {
    constexpr int64_t kViewsChunk = 1 << 20;
    const int n = size(), me = rank();
    const int64_t esz = DTypeSize(c.dtype());
    const int64_t chunk = std::max<int64_t>(1, kViewsChunk / esz);
    const auto deadline = Clock::now() + timeout();
    std::vector<ViewStream> sends(n), recvs(n);
    int64_t send_stage = 0, recv_stage = 0, rounds = 0;
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      sends[p] = ViewStream(c.send_views[p]);
      recvs[p] = ViewStream(c.recv_views[p]);
      send_stage += sends[p].numel();
      recv_stage += recvs[p].numel();
      rounds = std::max({rounds, (sends[p].numel() + chunk - 1) / chunk, (recvs[p].numel() + chunk - 1) / chunk});
    }
    if (send_stage_bytes_ < send_stage * esz) {  // only this worker thread touches the staging
      send_stage_.reset(new char[send_stage * esz]);
      send_stage_bytes_ = send_stage * esz;
    }
    if (recv_stage_bytes_ < recv_stage * esz) {
      recv_stage_.reset(new char[recv_stage * esz]);
      recv_stage_bytes_ = recv_stage * esz;
    }
    // Slot: prefix (8 bits) | sequence (24) | chunk (32), the same on both sides of a transfer.
    const uint64_t base = (kViewsSlotPrefix << 56) | ((static_cast<uint64_t>(c.seq) & 0xffffff) << 32);
    struct Transfer {
      std::unique_ptr<gloo::transport::UnboundBuffer> buf;
      int peer;
      int64_t begin, len;
      char* staged;  // received into staging: unpack from here
    };
    std::vector<Transfer> in, out;
    char* rs = recv_stage_.get();
    char* ss = send_stage_.get();
    for (int64_t j = 0; j < rounds; ++j) {
      for (int i = 1; i < n; ++i) {
        const int p = (me + n - i) % n;
        const int64_t b = j * chunk, len = std::min(chunk, recvs[p].numel() - b);
        if (len <= 0) continue;
        char* at = recvs[p].Contiguous(b, len);
        char* staged = nullptr;
        if (at == nullptr) {
          at = staged = rs;
          rs += len * esz;
        }
        in.push_back({ctx->createUnboundBuffer(at, len * esz), p, b, len, staged});
        in.back().buf->recv(p, base | static_cast<uint64_t>(j));
      }
    }
    for (int64_t j = 0; j < rounds; ++j) {
      for (int i = 1; i < n; ++i) {
        const int p = (me + i) % n;
        const int64_t b = j * chunk, len = std::min(chunk, sends[p].numel() - b);
        if (len <= 0) continue;
        char* at = sends[p].Contiguous(b, len);
        if (at == nullptr) {
          at = ss;
          ss += len * esz;
          sends[p].Pack(b, len, at);
        }
        out.push_back({ctx->createUnboundBuffer(at, len * esz), p, b, len, nullptr});
        out.back().buf->send(p, base | static_cast<uint64_t>(j));
      }
    }
    ViewStream::Copy(ViewStream(c.recv_views[me]), ViewStream(c.send_views[me]));
    for (Transfer& t : in) {
      if (!t.buf->waitRecv(Left(deadline))) throw gloo::IoException("all_to_all_views receive aborted");
      if (t.staged != nullptr) recvs[t.peer].Unpack(t.begin, t.len, t.staged);
    }
    for (Transfer& t : out) {
      if (!t.buf->waitSend(Left(deadline))) throw gloo::IoException("all_to_all_views send aborted");
    }
  }

  // Send/recv post at once on unbound buffers; Wait() waits with the timeout.
  WorkPtr PointToPoint(const Collective& c) {
    absl::StatusOr<std::shared_ptr<gloo::Context>> ctx = Context(c);
    if (!ctx.ok()) return Work::Done(ctx.status());
    const bool send = c.kind == CollectiveKind::kSend;
    uint64_t seq;
    {
      std::lock_guard<std::mutex> lock(mu_);
      seq = send ? send_seq_[c.peer]++ : recv_seq_[c.peer]++;
    }
    const uint64_t slot = (kP2PSlotPrefix << 56) | (seq & ((uint64_t{1} << 48) - 1));
    if (c.input.nbytes() == 0) return Work::Done();
    std::shared_ptr<gloo::transport::UnboundBuffer> buf;
    try {
      buf = (*ctx)->createUnboundBuffer(c.input.raw_data(), c.input.nbytes());
      if (send) {
        buf->send(c.peer, slot);
      } else {
        buf->recv(c.peer, slot);
      }
    } catch (const std::exception& e) {
      return Work::Done(Fail(c, e.what()));
    }
    // The work keeps the context and the buffer alive until it is waited on.
    return std::make_shared<DeferredWork>([this, c, buf, ctx = *ctx, send]() -> absl::Status {
      try {
        const bool ok = send ? buf->waitSend(timeout()) : buf->waitRecv(timeout());
        if (!ok) return Fail(c, "aborted");
        return absl::OkStatus();
      } catch (const std::exception& e) {
        return Fail(c, e.what());
      }
    });
  }

  std::mutex mu_;
  std::shared_ptr<gloo::Context> ctx_;  // null once broken
  absl::Status broken_;
  std::shared_ptr<TcpStore> store_;
  const std::string gid_;
  const std::vector<std::string> probe_endpoints_;
  const std::shared_ptr<ProbeListener> probe_;
  std::vector<uint64_t> send_seq_, recv_seq_;
  std::unique_ptr<char[]> scratch_;  // reduce_scatter's two blocks, reused
  int64_t scratch_bytes_ = 0;
  std::unique_ptr<char[]> send_stage_, recv_stage_;  // all_to_all_views staging, reused
  int64_t send_stage_bytes_ = 0, recv_stage_bytes_ = 0;
  WorkQueue queue_;  // last: its worker stops before the members above go away
};

class GlooWorld final : public BackendWorld {
 public:
  GlooWorld(const LaunchInfo& info, const WorldOptions& options, std::unique_ptr<TcpStoreServer> server,
            std::shared_ptr<TcpStore> store, std::shared_ptr<gloo::transport::Device> device,
            std::shared_ptr<ProbeListener> probe, std::string host_key)
      : BackendWorld(info, options),
        server_(std::move(server)),
        store_(std::move(store)),
        device_(std::move(device)),
        probe_(std::move(probe)),
        shm_(options.backend == "shm"),
        host_key_(std::move(host_key)) {}
  ~GlooWorld() override {
    ClearGroups();
    store_.reset();  // Bye before our own server (rank 0) lingers for the others
  }

  absl::string_view backend() const override { return shm_ ? "shm" : "gloo"; }
  Device device() const override { return kCPU; }

 private:
  absl::StatusOr<CommPtr> MakeGroup(const std::vector<int>& ranks) override {
    const std::string gid = GroupKey(ranks);
    const int me = IndexIn(ranks);
    auto what_for = [&](absl::string_view backend) {
      return absl::StrCat(backend, " group ", RankList(ranks), ", global rank ", rank(), ": creating the group");
    };
    // Join first, so that a member that never comes is named. Every member published its host key
    // before it could join, so once all have joined they all decide alike.
    DT_RETURN_IF_ERROR(JoinGroup(*store_, gid, ranks, me, timeout(), what_for(backend())));
    const bool shm = shm_ && OnOneHost(ranks);
    const std::string what = what_for(shm ? "shm" : "gloo");
    CommPtr gloo_comm;
    try {
      auto ctx = std::make_shared<gloo::rendezvous::Context>(me, static_cast<int>(ranks.size()));
      ctx->setTimeout(timeout());
      GlooStore adapter(*store_, timeout());
      gloo::rendezvous::PrefixStore prefixed(absl::StrCat("g/", gid, "/"), adapter);
      ctx->connectFullMesh(prefixed, device_);
      auto comm = std::make_shared<GlooComm>(ctx, store_, gid, ranks, me, timeout(), ProbeEndpoints(ranks),
                                             probe_);
      comm->set_verify(options_.verify.value_or(false));
      gloo_comm = std::move(comm);
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat(what, ": gloo: ", e.what()));
    }
    if (!shm) return gloo_comm;
    absl::StatusOr<CommPtr> made = MakeShmGroup(*store_, gid, ranks, me, timeout(), gloo_comm, what);
    if (made.ok() || made.status().code() != absl::StatusCode::kFailedPrecondition) return made;
    std::fprintf(stderr, "dtensor: %s; this group uses gloo (DT_SHM=0: gloo for every group)\n",
                 std::string(made.status().message()).c_str());
    return gloo_comm;
  }

  // What the other members of `ranks` published under key(rank), into `cache` (by global rank) for
  // those not there yet; one store round trip. A store failure or a missing key leaves no entry.
  void FetchPerRank(const std::vector<int>& ranks, std::string (*key)(int), std::map<int, std::string>& cache) {
    std::vector<int> wanted;
    std::vector<std::string> keys;
    for (int r : ranks) {
      if (r != rank() && !cache.count(r)) {
        wanted.push_back(r);
        keys.push_back(key(r));
      }
    }
    if (keys.empty()) return;
    absl::StatusOr<std::vector<std::optional<std::string>>> v = store_->Peek(keys, timeout());
    for (size_t i = 0; v.ok() && i < wanted.size(); ++i) {
      if ((*v)[i].has_value()) cache[wanted[i]] = *(*v)[i];
    }
  }

  // Whether every member published the same (non-empty) host key (Note [Shm groups]). Cached; a
  // store failure counts as different hosts.
  bool OnOneHost(const std::vector<int>& ranks) {
    if (host_key_.empty()) return false;
    FetchPerRank(ranks, HostKeyKey, host_keys_);
    for (int r : ranks) {
      if (r == rank()) continue;
      auto it = host_keys_.find(r);
      if (it == host_keys_.end() || it->second != host_key_) return false;
    }
    return true;
  }

  // Where the members' probes answer ("" for this rank): published by every rank before it can
  // join a group, so after JoinGroup they are all there. Cached; a store failure leaves "" (the
  // diagnosis then relies on the store alone).
  std::vector<std::string> ProbeEndpoints(const std::vector<int>& ranks) {
    FetchPerRank(ranks, ProbeKey, probe_endpoints_);
    std::vector<std::string> out;
    for (int r : ranks) {
      auto it = probe_endpoints_.find(r);
      out.push_back(r == rank() || it == probe_endpoints_.end() ? "" : it->second);
    }
    return out;
  }

  std::unique_ptr<TcpStoreServer> server_;  // rank 0 only; outlives store_
  std::shared_ptr<TcpStore> store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<ProbeListener> probe_;  // answers the peers' probes; shared with the communicators
  std::map<int, std::string> probe_endpoints_;  // by global rank; MakeGroup runs under the groups' lock
  const bool shm_;                              // groups on one host use shared memory
  const std::string host_key_;                  // this process's HostKey (shm worlds)
  std::map<int, std::string> host_keys_;        // the others', by global rank
};

}  // namespace

absl::StatusOr<std::shared_ptr<World>> MakeGlooWorld(const LaunchInfo& info, const WorldOptions& options) {
  // gloo writes to its sockets without MSG_NOSIGNAL: a peer that dies would kill us with SIGPIPE
  // instead of giving an error. Ignore SIGPIPE unless the program installed a handler of its own.
  struct sigaction old_action {};
  if (::sigaction(SIGPIPE, nullptr, &old_action) == 0 && old_action.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
  const std::string& name = options.backend;  // "gloo" or "shm"
  DT_ASSIGN_OR_RETURN(Rendezvous rv, StartRendezvous(info, options.timeout, name));
  std::string host_key;
  if (name == "shm") {
    host_key = HostKey();
    absl::Status published = rv.store->Set(HostKeyKey(info.rank), host_key);
    if (!published.ok()) {
      return absl::Status(published.code(), absl::StrCat("backend shm, rank ", info.rank, ": ", published.message()));
    }
  }
  gloo::transport::tcp::attr attr;
  const char* iface_env = std::getenv("GLOO_SOCKET_IFNAME");
  const std::string iface = iface_env == nullptr ? "" : iface_env;
  if (!iface.empty()) {
    attr.iface = iface;
  } else {
    attr.hostname = LocalAddressFor(info.master_addr);
  }
  std::unique_ptr<ProbeListener> probe;
  if (info.world_size > 1) {
    DT_ASSIGN_OR_RETURN(probe, ProbeListener::Start());
    const std::string endpoint = absl::StrCat(LocalAddressFor(info.master_addr, iface), ":", probe->port());
    absl::Status published = rv.store->Set(ProbeKey(info.rank), endpoint);
    if (!published.ok()) {
      return absl::Status(published.code(), absl::StrCat("backend ", name, ", rank ", info.rank, ": ", published.message()));
    }
  }
  attr.ai_family = AF_INET;
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("backend ", name, ": cannot create the TCP device on '",
                                               attr.iface.empty() ? attr.hostname : attr.iface, "': ", e.what()));
  }
  return std::shared_ptr<World>(
      std::make_shared<GlooWorld>(info, options, std::move(rv.server), std::move(rv.store), std::move(device),
                                  std::move(probe), std::move(host_key)));
}

}  // namespace dt::internal
