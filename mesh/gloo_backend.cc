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
//   - Faults: gloo throws; we catch at this boundary. Every collective first posts an arrival
//     marker to the store (fire and forget), and the store records ranks whose connection closed
//     without Bye. On an error we name the dead ranks and the members that never reached the
//     collective, then drop our gloo context: closing its sockets makes the peers blocked on us
//     fail at once instead of at their timeouts, so the failure spreads through the group.
//     The communicator stays broken afterwards (gloo pairs do not recover).
//   - gloo writes to sockets without MSG_NOSIGNAL, so a dead peer would raise SIGPIPE: creating a
//     gloo world sets SIGPIPE to ignored when it still has the default action.

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

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
#include "mesh/backends.h"
#include "mesh/collective.h"
#include "mesh/gloo_store.h"
#include "mesh/reduce.h"
#include "mesh/tcp_store.h"
#include "mesh/work.h"

namespace dt::internal {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kRingSlotPrefix = 0x41;
constexpr uint64_t kP2PSlotPrefix = 0x42;

std::string RankList(const std::vector<int>& r) { return absl::StrCat("[", absl::StrJoin(r, ", "), "]"); }

// The same element-wise reduction for every gloo path: c = a op b.
gloo::AllreduceOptions::Func ReduceFunc(DType dtype, ReduceOp op) {
  return [dtype, op](void* c, const void* a, const void* b, size_t n) {
    if (c == b) {
      ReduceInto(c, a, static_cast<int64_t>(n), dtype, op);
      return;
    }
    if (c != a) std::memcpy(c, a, n * DTypeSize(dtype));
    ReduceInto(c, b, static_cast<int64_t>(n), dtype, op);
  };
}

class GlooComm final : public BackendCommunicator {
 public:
  GlooComm(std::shared_ptr<gloo::Context> ctx, std::shared_ptr<TcpStore> store, std::string gid,
           std::vector<int> ranks, int rank, std::chrono::milliseconds timeout)
      : BackendCommunicator(std::move(ranks), rank, kCPU, timeout),
        ctx_(std::move(ctx)),
        store_(std::move(store)),
        gid_(std::move(gid)),
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

  // Names the dead members and those that never reached `c`, and breaks the communicator (see
  // Note [Gloo backend]).
  absl::Status Fail(const Collective& c, const std::string& what) {
    const bool timed_out = absl::StrContains(what, "imed out");
    std::vector<int> dead, missing;
    // A peer's socket can report its death before the store has seen its connection close.
    const auto settle_by = Clock::now() + std::chrono::milliseconds(timed_out ? 0 : 1000);
    do {
      std::vector<int> all_dead = store_->DeadRanks();
      for (int g : global_ranks()) {
        if (std::find(all_dead.begin(), all_dead.end(), g) != all_dead.end()) dead.push_back(g);
      }
      if (!dead.empty() || Clock::now() >= settle_by) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (true);
    bool store_ok = true;
    if (c.kind != CollectiveKind::kSend && c.kind != CollectiveKind::kRecv) {
      for (int i = 0; i < size(); ++i) {
        absl::StatusOr<std::optional<std::string>> v = store_->Get(ArrivalKey(i));
        if (!v.ok()) {
          store_ok = false;
          break;
        }
        int64_t reached = 0;
        if (v->has_value() && !absl::SimpleAtoi(**v, &reached)) reached = 0;
        const int g = global_ranks()[i];
        if (reached <= c.seq && std::find(dead.begin(), dead.end(), g) == dead.end()) missing.push_back(g);
      }
    }
    std::string msg = ErrorPrefix(c) + ": ";
    if (!dead.empty()) absl::StrAppend(&msg, "global rank(s) ", RankList(dead), " died (store connection closed); ");
    if (!missing.empty()) absl::StrAppend(&msg, "global rank(s) ", RankList(missing), " never reached it; ");
    if (!store_ok) absl::StrAppend(&msg, "the store is unreachable (global rank 0 may have died); ");
    if (timed_out) absl::StrAppend(&msg, "timed out after ", timeout().count(), " ms; ");
    absl::StrAppend(&msg, "gloo: ", what);
    absl::Status st = timed_out ? absl::DeadlineExceededError(msg) : absl::UnavailableError(msg);
    std::lock_guard<std::mutex> lock(mu_);
    if (ctx_) {
      broken_ = st;
      ctx_.reset();
    }
    return st;
  }

  bool VerifiesInRun() const override { return true; }

  absl::Status Execute(const Collective& c) {
    DT_ASSIGN_OR_RETURN(std::shared_ptr<gloo::Context> ctx, Context(c));
    try {
      if (c.verify) {
        std::vector<int64_t> mine = EncodedFingerprint(c), all(mine.size() * size());
        gloo::AllgatherOptions opts(ctx);
        opts.setTag(static_cast<uint32_t>(c.seq));
        opts.setTimeout(timeout());
        opts.setInput(mine.data(), mine.size());
        opts.setOutput(all.data(), all.size());
        gloo::allgather(opts);
        DT_RETURN_IF_ERROR(CheckFingerprints(c, all));
      }
      Gloo(ctx, c);
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return Fail(c, e.what());
    }
  }

  void Gloo(const std::shared_ptr<gloo::Context>& ctx, const Collective& c) {
    using K = CollectiveKind;
    const uint32_t tag = static_cast<uint32_t>(c.seq);
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
        opts.setTag(tag);
        opts.setTimeout(timeout());
        DT_DISPATCH_DTYPE(c.dtype(), T, [&] { opts.setOutput(reinterpret_cast<T*>(in), c.input.numel()); });
        opts.setReduceFunction(ReduceFunc(c.dtype(), c.op));
        gloo::allreduce(opts);
        if (c.op == ReduceOp::kAvg) DivideInPlace(in, c.input.numel(), c.dtype(), n);
        return;
      }
      case K::kAllGather: {
        if (c.input.numel() == 0) return;
        gloo::AllgatherOptions opts(ctx);
        opts.setTag(tag);
        opts.setTimeout(timeout());
        opts.setInput(in, c.input.nbytes());
        opts.setOutput(out, c.output.nbytes());
        gloo::allgather(opts);
        return;
      }
      case K::kAllGatherV: {
        if (c.output.numel() == 0) return;
        gloo::AllgathervOptions opts(ctx);
        opts.setTag(tag);
        opts.setTimeout(timeout());
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
      case K::kAllToAll: {
        if (c.input.numel() == 0) return;
        gloo::AlltoallOptions opts(ctx);
        opts.setTag(tag);
        opts.setTimeout(timeout());
        opts.setInput(in, c.input.nbytes());
        opts.setOutput(out, c.output.nbytes());
        gloo::alltoall(opts);
        return;
      }
      case K::kAllToAllV: {
        gloo::AlltoallvOptions opts(ctx);
        opts.setTag(tag);
        opts.setTimeout(timeout());
        opts.setInput(in, bytes(c.counts));
        opts.setOutput(out, bytes(c.recv_counts));
        gloo::alltoallv(opts);
        return;
      }
      case K::kBroadcast: {
        if (c.input.numel() == 0) return;
        gloo::BroadcastOptions opts(ctx);
        opts.setTag(tag);
        opts.setTimeout(timeout());
        opts.setRoot(c.peer);
        opts.setOutput(in, c.input.nbytes());
        gloo::broadcast(opts);
        return;
      }
      case K::kBarrier: {
        gloo::BarrierOptions opts(ctx);
        opts.setTag(tag);
        opts.setTimeout(timeout());
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
        if (!recvs[j]->waitRecv(timeout())) throw gloo::IoException("ring receive aborted");
        const int64_t o = j * seg, len = std::min(seg, recv_bytes - o);
        ReduceInto(dst + o, in + off[rb] * esz + o, len / esz, c.dtype(), c.op);
      }
      for (auto& b : sends) {
        if (!b->waitSend(timeout())) throw gloo::IoException("ring send aborted");
      }
    }
    if (c.op == ReduceOp::kAvg) DivideInPlace(out, counts[r], c.dtype(), n);
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
  std::vector<uint64_t> send_seq_, recv_seq_;
  std::unique_ptr<char[]> scratch_;  // reduce_scatter's two blocks, reused
  int64_t scratch_bytes_ = 0;
  WorkQueue queue_;  // last: its worker stops before the members above go away
};

// The address peers reach us at: loopback for a local master, else the interface that routes to
// the master (a connected UDP socket's local address).
std::string LocalAddressFor(const std::string& master) {
  if (master.empty() || master == "localhost" || absl::StartsWith(master, "127.")) return "127.0.0.1";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  std::string out;
  if (::getaddrinfo(master.c_str(), "9", &hints, &res) == 0 && res != nullptr) {
    int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
    if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      sockaddr_in local{};
      socklen_t len = sizeof(local);
      char buf[INET_ADDRSTRLEN];
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
          ::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf)) != nullptr) {
        out = buf;
      }
    }
    if (fd >= 0) ::close(fd);
    ::freeaddrinfo(res);
  }
  return out.empty() || out == "0.0.0.0" ? "127.0.0.1" : out;
}

class GlooWorld final : public World {
 public:
  GlooWorld(const LaunchInfo& info, const WorldOptions& options, std::unique_ptr<TcpStoreServer> server,
            std::shared_ptr<TcpStore> store, std::shared_ptr<gloo::transport::Device> device)
      : info_(info), server_(std::move(server)), store_(std::move(store)), device_(std::move(device)) {
    options_ = options;
  }
  ~GlooWorld() override {
    std::lock_guard<std::mutex> lock(mu_);
    groups_.clear();
    store_.reset();  // Bye before our own server (rank 0) lingers for the others
  }

  int rank() const override { return info_.rank; }
  int size() const override { return info_.world_size; }
  int local_rank() const override { return info_.local_rank; }
  int local_size() const override { return info_.local_size; }
  absl::string_view backend() const override { return "gloo"; }
  Device device() const override { return kCPU; }

  absl::StatusOr<CommPtr> Group(absl::Span<const int> ranks) override {
    DT_RETURN_IF_ERROR(CheckGroupRanks(ranks, size(), rank(), "gloo"));
    std::vector<int> key(ranks.begin(), ranks.end());
    std::lock_guard<std::mutex> lock(mu_);
    CommPtr& comm = groups_[key];
    if (!comm) {
      absl::StatusOr<CommPtr> made = Connect(key);
      if (!made.ok()) {
        groups_.erase(key);
        return made.status();
      }
      comm = *std::move(made);
    }
    return comm;
  }

  TcpStore& store() { return *store_; }

 private:
  absl::StatusOr<CommPtr> Connect(const std::vector<int>& ranks) {
    const std::string gid = GroupKey(ranks);
    const int me = static_cast<int>(std::find(ranks.begin(), ranks.end(), rank()) - ranks.begin());
    const std::string what = absl::StrCat("gloo group ", RankList(ranks), ", global rank ", rank(), ": creating the group");
    // Join first, so that a member that never comes is named.
    DT_RETURN_IF_ERROR(JoinGroup(*store_, gid, ranks, me, timeout(), what));
    try {
      auto ctx = std::make_shared<gloo::rendezvous::Context>(me, static_cast<int>(ranks.size()));
      ctx->setTimeout(timeout());
      GlooStore adapter(*store_, timeout());
      gloo::rendezvous::PrefixStore prefixed(absl::StrCat("g/", gid, "/"), adapter);
      ctx->connectFullMesh(prefixed, device_);
      auto comm = std::make_shared<GlooComm>(ctx, store_, gid, ranks, me, timeout());
      comm->set_verify(options_.verify.value_or(false));
      return CommPtr(std::move(comm));
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat(what, ": gloo: ", e.what()));
    }
  }

  LaunchInfo info_;
  std::unique_ptr<TcpStoreServer> server_;  // rank 0 only; outlives store_
  std::shared_ptr<TcpStore> store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::mutex mu_;
  std::map<std::vector<int>, CommPtr> groups_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<World>> MakeGlooWorld(const LaunchInfo& info, const WorldOptions& options) {
  // gloo writes to its sockets without MSG_NOSIGNAL: a peer that dies would kill us with SIGPIPE
  // instead of giving an error. Ignore SIGPIPE unless the program installed a handler of its own.
  struct sigaction old_action {};
  if (::sigaction(SIGPIPE, nullptr, &old_action) == 0 && old_action.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
  DT_ASSIGN_OR_RETURN(Rendezvous rv, StartRendezvous(info, options.timeout, "gloo"));
  gloo::transport::tcp::attr attr;
  const char* iface = std::getenv("GLOO_SOCKET_IFNAME");
  if (iface != nullptr && *iface != '\0') {
    attr.iface = iface;
  } else {
    attr.hostname = LocalAddressFor(info.master_addr);
  }
  attr.ai_family = AF_INET;
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("backend gloo: cannot create the TCP device on '",
                                               attr.iface.empty() ? attr.hostname : attr.iface, "': ", e.what()));
  }
  return std::shared_ptr<World>(
      std::make_shared<GlooWorld>(info, options, std::move(rv.server), std::move(rv.store), std::move(device)));
}

}  // namespace dt::internal
