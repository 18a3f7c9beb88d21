// The shm backend: collectives of a group whose members share a host, through a POSIX
// shared-memory segment (mesh/shm_segment.h). The world is gloo's (its store, its probes); groups
// that cross hosts stay on gloo, and so do send/recv (mesh/gloo_backend.cc decides, Note [Shm
// groups]).
//
// Note [Shm rounds]
// A collective is one or more rounds. In a round every member writes into its own area of the
// round's buffer set (its contribution, or the pieces it sends), passes a sync, then reads the
// areas it needs (all_reduce of a large buffer: each member reduces one part of every area into
// the result area, passes a second sync, and copies the result). Buffers larger than an area go
// through in several rounds; the two buffer sets alternate from round to round, so a member
// writes a set again only after passing a sync of the round in between, which every member
// reaches only after it has finished reading that set. Per kind (A = area bytes, n members):
//
//   kind              writes (own area)                   reads after the sync
//   all_reduce ≤ 64K  its buffer                          every area, reduced in member order
//                                                         into its buffer (one sync)
//   all_reduce        a chunk of A bytes                  part `me` of every area, reduced into
//                                                         the result area; sync; the result
//   all_gather(_v)    a chunk of its input                every member's chunk
//   reduce_scatter(_v) chunk of every block but its own   its block's chunk of every area
//                     (A / n each)                        (its own from its input), reduced
//   broadcast         the root: a chunk                   the root's chunk
//   all_to_all(_v)    a chunk per peer (A / n each),      its chunk of every peer's area
//                     views packed straight in            (views unpacked straight out)
//   barrier           -                                   -
// Every member reduces in member order, so all members get bit-identical results.
// Two copies per byte (into the segment, out of it) are cheap here because the areas stay in
// cache. A single-copy path (each member reading its peers' buffers with process_vm_readv, as
// MPI's transport does, two syncs per collective) measured slower: a 16 MiB all_gather on 2 ranks
// took 1.6-1.8 ms against 1.1-1.2 ms through the segment (page pinning per call), so it is not used.
//
// Arguments are always verified, at no extra cost: each member writes its Fingerprint (kind,
// dtype, op, root, sizes) into the segment before the first sync and checks everyone's after it,
// before it reads anything; members that disagree all fail with the same InvalidArgument after
// the same single sync. A member whose own arguments are invalid joins that first sync with an
// 'invalid' fingerprint, so its peers fail at once too.
//
// Note [Shm waiting]
// A sync: the member stores its step counter (step++) and waits until every member's step is at
// least as far: it spins for DT_SHM_SPIN_US (default 2 us), then calls sched_yield() between
// checks for DT_SHM_YIELD_US (default 500 us), then sleeps on the segment's futex word
// (FUTEX_WAIT without FUTEX_PRIVATE_FLAG: the word is shared between processes), so that more
// ranks than cores do not starve each other. Why so short a spin: on the 2-core development VM,
// shared with other builds, a peer that has not arrived is usually one that is not running, and a
// spinner holds the very core it needs; the p50 of a 2.3 KB all_reduce on 2 ranks measured 0.7-1.9
// us with a 2 us spin and yields, 25 us with a 10 us spin, 60-110 us with 50 us (3 runs each,
// load average 4.5). Yielding costs a system call when nothing else wants the core and hands the
// core over when something does (a peer, on a machine with more ranks than cores). Sleepers announce
// themselves (sleepers++, then read the word, then re-check the steps); the member that completes
// a sync (every step has arrived after its own store) bumps the word and wakes them all when any
// sleeps. Both sides use sequentially consistent operations, so either the sleeper sees the step
// or the waker sees the sleeper.
// Sleeps last at most kSlice: after each, a sleeper checks the deadline (the communicator's
// timeout from the start of the collective), the abort record, and its peers' processes
// (PeerWatch: pidfds). A member that fails marks itself failing, records why in the segment's
// abort record (the first one only) and wakes everyone, so a failure spreads at once:
//   a member died                       Unavailable, "global rank(s) [2] died (process gone)"
//   a member destroyed its communicator Unavailable, "... left (its communicator was destroyed)"
//   the timeout                         DeadlineExceeded, naming the alive members that never
//                                       reached the collective ("never reached it") or failed
//                                       before it
//   woken by another member's failure   that member's code, its reason, and what we see ourselves
// Members killed together die moments apart: once one is found dead the others are watched for
// kSettle more, so all are named. The communicator stays broken afterwards.

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "dtensor/core/env.h"
#include "dtensor/mesh/backends.h"
#include "dtensor/mesh/collective.h"
#include "dtensor/mesh/reduce.h"
#include "dtensor/mesh/shm_segment.h"
#include "dtensor/mesh/tcp_store.h"
#include "dtensor/mesh/view_stream.h"

namespace dt::internal {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kSlice{20};
constexpr std::chrono::milliseconds kSettle{200};
// all_reduce of at most this many bytes: one sync, every member reduces the whole buffer.
constexpr int64_t kOneSyncAllReduce = 64 << 10;
constexpr int64_t kDefaultAreaBytes = 512 << 10;

// A tuning variable, validated when the world was made (env::CheckAll in mesh/backends.cc).
int64_t EnvInt(const char* name, int64_t fallback) { return env::Int(name).value_or(std::nullopt).value_or(fallback); }

// Bytes of one member's area in a group of `n`; the leader's choice is written into the segment.
// 512 KiB up to 16 members, less beyond, so that a segment (2 (n + 1) areas) stays near 16 MiB:
// containers often give /dev/shm only 64 MiB, shared by every group of every job.
int64_t AreaBytes(int n) {
  const int64_t fallback = std::clamp<int64_t>((16 << 20) / (2 * (n + 1)), 64 << 10, kDefaultAreaBytes) >> 10;
  const int64_t kb = EnvInt("DT_SHM_AREA_KB", fallback);
  return std::clamp<int64_t>(kb, 64, 64 << 10) / 64 * 64 << 10;
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

int64_t Clamp(int64_t v, int64_t lo, int64_t hi) { return std::max(lo, std::min(v, hi)); }
int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The first word of the fingerprint of a member whose own arguments were invalid.
constexpr int64_t kInvalidArgs = -1;

class ShmComm final : public Communicator {
 public:
  ShmComm(std::unique_ptr<ShmSegment> seg, std::vector<int> ranks, int me, std::chrono::milliseconds timeout,
          CommPtr p2p, PeerWatch watch)
      : Communicator(std::move(ranks), me, kCPU, timeout),
        seg_(std::move(seg)),
        p2p_(std::move(p2p)),
        watch_(std::move(watch)) {
    // Note [Shm waiting]: a long spin holds the core a descheduled peer needs in order to arrive.
    spin_ = std::chrono::microseconds(EnvInt("DT_SHM_SPIN_US", 2));
    yield_ = std::chrono::microseconds(EnvInt("DT_SHM_YIELD_US", 500));
  }

  ~ShmComm() override {
    std::atomic<uint32_t>& state = seg_->rank(rank()).state;
    uint32_t failing = static_cast<uint32_t>(MemberState::kFailing);
    if (!state.compare_exchange_strong(failing, static_cast<uint32_t>(MemberState::kFailedAndLeft))) {
      state.store(static_cast<uint32_t>(MemberState::kLeft));
    }
    Wake(/*always=*/true);
  }

  absl::string_view backend() const override { return "shm"; }

 protected:
  bool VerifiesInRun() const override { return true; }
  bool HandlesViews() const override { return true; }

  WorkPtr Run(Collective c) override {
    if (c.kind == CollectiveKind::kSend || c.kind == CollectiveKind::kRecv) {
      p2p_->set_timeout(timeout());
      return c.kind == CollectiveKind::kSend ? p2p_->SendAsync(c.input, c.peer) : p2p_->RecvAsync(c.input, c.peer);
    }
    std::lock_guard<std::mutex> lock(mu_);
    return Work::Done(Execute(c));
  }

  // A member with invalid arguments still joins the first sync, so its peers fail at once.
  WorkPtr RunInvalid(Collective c, absl::Status error) override {
    if (c.kind == CollectiveKind::kSend || c.kind == CollectiveKind::kRecv) return Work::Done(error);
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok()) return Work::Done(error);
    Start(c);
    const int set = Begin(c, /*first=*/false);
    int64_t* fp = seg_->fingerprint(set, rank());
    fp[0] = kInvalidArgs;
    absl::Status st = Sync(c);
    return Work::Done(st.ok() ? error : st);
  }

 private:
  // ---- rounds and syncs (Note [Shm rounds], Note [Shm waiting]) ----

  void Start(const Collective& c) {
    deadline_ = Clock::now() + timeout();
    seg_->rank(rank()).reached.store(c.seq + 1, std::memory_order_relaxed);
  }

  // Round j of a collective moving up to k elements per block: whether it is the first, its
  // buffer set (Begin) and the element its blocks start at.
  struct Round {
    bool first;
    int set;
    int64_t b;
  };
  Round BeginRound(const Collective& c, int64_t j, int64_t k) {
    const bool first = j == 0;
    return {first, Begin(c, first), j * k};
  }

  // The buffer set of the next round; the first round of a collective also posts its fingerprint.
  int Begin(const Collective& c, bool first) {
    const int set = static_cast<int>(round_ & 1);
    ++round_;
    if (first) {
      const std::vector<int64_t> mine = EncodedFingerprint(c);
      std::memcpy(seg_->fingerprint(set, rank()), mine.data(), mine.size() * sizeof(int64_t));
    }
    return set;
  }

  bool AllArrived(uint64_t step) const {
    for (int q = 0; q < size(); ++q) {
      if (seg_->rank(q).step.load(std::memory_order_acquire) < step) return false;
    }
    return true;
  }

  void Wake(bool always) {
    SegmentHeader& h = seg_->header();
    if (always || h.sleepers.load() > 0) {
      h.epoch.fetch_add(1);
      FutexWakeAll(&h.epoch);
    }
  }

  absl::Status Sync(const Collective& c) {
    const uint64_t step = ++step_;
    seg_->rank(rank()).step.store(step);  // seq_cst: see Note [Shm waiting]
    if (AllArrived(step)) {
      Wake(/*always=*/false);
      return absl::OkStatus();
    }
    SegmentHeader& h = seg_->header();
    const auto spun = Clock::now();
    for (int i = 0;; ++i) {
      if (AllArrived(step)) return absl::OkStatus();
      if ((i & 63) == 63) {
        if (h.aborted.load(std::memory_order_relaxed) != 0) return Fail(c, /*timed_out=*/false);
        if (Clock::now() >= spun + spin_) break;
      }
      CpuRelax();
    }
    for (int i = 0;; ++i) {
      if (AllArrived(step)) return absl::OkStatus();
      if (Clock::now() >= spun + spin_ + yield_) break;
      sched_yield();
    }
    auto last_check = Clock::now();
    while (true) {
      h.sleepers.fetch_add(1);
      const uint32_t epoch = h.epoch.load();
      if (AllArrived(step)) {
        h.sleepers.fetch_sub(1);
        return absl::OkStatus();
      }
      const auto now = Clock::now();
      if (h.aborted.load() != 0 || now >= deadline_) {
        h.sleepers.fetch_sub(1);
        return Fail(c, /*timed_out=*/now >= deadline_);
      }
      FutexWait(&h.epoch, epoch, std::min<Clock::duration>(kSlice, deadline_ - now));
      h.sleepers.fetch_sub(1);
      if (AllArrived(step)) return absl::OkStatus();
      if (Clock::now() - last_check >= kSlice) {
        last_check = Clock::now();
        if (Blocked(step)) return Fail(c, /*timed_out=*/false);
      }
    }
  }

  // Whether a member we wait for at `step` will never come: its process is gone, or it destroyed
  // its communicator. (One that passed the step before leaving is not waited for.)
  bool Blocked(uint64_t step) const {
    for (int q = 0; q < size(); ++q) {
      const RankHeader& h = seg_->rank(q);
      if (q == rank() || h.step.load() >= step) continue;
      const auto state = static_cast<MemberState>(h.state.load());
      if (state == MemberState::kLeft || state == MemberState::kFailedAndLeft || watch_.IsGone(q)) return true;
    }
    return false;
  }

  // Breaks the communicator and says why (Note [Shm waiting]).
  absl::Status Fail(const Collective& c, bool timed_out) {
    SegmentHeader& h = seg_->header();
    RankHeader& mine = seg_->rank(rank());
    mine.state.store(static_cast<uint32_t>(MemberState::kFailing));
    // Who failed before we looked (their exit is theirs, not a cause).
    std::vector<bool> was_failing(size(), false);
    for (int q = 0; q < size(); ++q) {
      const auto state = static_cast<MemberState>(seg_->rank(q).state.load());
      was_failing[q] = q != rank() && (state == MemberState::kFailing || state == MemberState::kFailedAndLeft);
    }
    std::vector<int> gone = watch_.Gone();
    if (!gone.empty()) gone = watch_.GoneSettled(Clock::now() + kSettle);
    std::vector<int> dead, left, missing, failed_before, failed_gone;
    for (int q = 0; q < size(); ++q) {
      if (q == rank()) continue;
      const int g = global_ranks()[q];
      const auto state = static_cast<MemberState>(seg_->rank(q).state.load());
      const bool is_gone = std::find(gone.begin(), gone.end(), q) != gone.end();
      if (state == MemberState::kLeft) {
        left.push_back(g);
      } else if (state == MemberState::kFailedAndLeft) {
        failed_gone.push_back(g);  // left after an error of its own: no cause
      } else if (is_gone) {
        (was_failing[q] ? failed_gone : dead).push_back(g);  // one that failed first is no cause
      } else if (seg_->rank(q).reached.load() <= c.seq) {
        (state == MemberState::kFailing ? failed_before : missing).push_back(g);
      }
    }
    std::string reason;
    if (!dead.empty()) absl::StrAppend(&reason, "global rank(s) ", RankList(dead), " died (process gone); ");
    if (!left.empty()) {
      absl::StrAppend(&reason, "global rank(s) ", RankList(left), " left (its communicator was destroyed); ");
    }
    if (!missing.empty()) absl::StrAppend(&reason, "global rank(s) ", RankList(missing), " never reached it; ");
    if (!failed_before.empty()) {
      absl::StrAppend(&reason, "global rank(s) ", RankList(failed_before), " failed before reaching it; ");
    }
    absl::StatusCode code = absl::StatusCode::kUnavailable;
    if (timed_out) {
      absl::StrAppend(&reason, "timed out after ", timeout().count(), " ms; ");
      if (dead.empty() && left.empty()) code = absl::StatusCode::kDeadlineExceeded;
    }
    uint32_t expected = 0;
    const bool first = (!dead.empty() || !left.empty() || timed_out) &&
                       h.aborted.compare_exchange_strong(expected, 1);
    if (first) {
      h.abort_code = static_cast<int32_t>(code);
      h.abort_rank = global_ranks()[rank()];
      const std::string r = reason.substr(0, reason.size() - 2);
      std::snprintf(h.abort_reason, sizeof(h.abort_reason), "%s", r.c_str());
      h.aborted.store(2);  // the record is complete
      Wake(/*always=*/true);
    } else if (!first && h.aborted.load() != 0) {
      // Another member failed first: its reason too (it may see what we cannot).
      for (int i = 0; i < 1000 && h.aborted.load() != 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const std::string theirs = h.abort_reason;
      if (h.aborted.load() == 2 && h.abort_rank != global_ranks()[rank()] &&
          reason.find(theirs) == std::string::npos) {  // unless we see the same ourselves
        absl::StrAppend(&reason, "global rank ", h.abort_rank, " failed: ", theirs, "; ");
        if (dead.empty() && left.empty() && !timed_out) code = static_cast<absl::StatusCode>(h.abort_code);
      }
    }
    if (reason.empty() && !failed_gone.empty()) {
      reason = absl::StrCat("global rank(s) ", RankList(failed_gone), " failed and exited; ");
    }
    if (reason.empty()) reason = "the group was aborted; ";
    absl::Status st(code, absl::StrCat(ErrorPrefix(c), ": ", reason.substr(0, reason.size() - 2)));
    broken_ = st;
    return st;
  }

  // After the first sync: does everyone agree with us (Note [Shm rounds])?
  absl::Status CheckArgs(const Collective& c, int set) {
    const int n = size();
    const int64_t words = 5 + 2 * static_cast<int64_t>(n);
    std::vector<int> invalid;
    for (int q = 0; q < n; ++q) {
      if (seg_->fingerprint(set, q)[0] == kInvalidArgs) invalid.push_back(global_ranks()[q]);
    }
    if (!invalid.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(ErrorPrefix(c), ": global rank(s) ", RankList(invalid),
                                                     " passed invalid arguments (each says why)"));
    }
    const int64_t* mine = seg_->fingerprint(set, rank());
    const bool v = c.kind == CollectiveKind::kAllGatherV || c.kind == CollectiveKind::kReduceScatterV;
    const bool a2a = c.kind == CollectiveKind::kAllToAllV || c.kind == CollectiveKind::kAllToAllViews;
    if (!a2a) {
      bool same = true;
      for (int q = 0; q < n && same; ++q) {
        const int64_t* f = seg_->fingerprint(set, q);
        same = std::memcmp(f, mine, 4 * sizeof(int64_t)) == 0 && (v || f[4] == mine[4]) &&
               std::memcmp(f + 5, mine + 5, (words - 5) * sizeof(int64_t)) == 0;
      }
      if (same) return absl::OkStatus();
    }
    std::vector<int64_t> all;
    all.reserve(n * words);
    for (int q = 0; q < n; ++q) {
      const int64_t* f = seg_->fingerprint(set, q);
      all.insert(all.end(), f, f + words);
    }
    return CheckFingerprints(c, all);
  }

  // Sync, then (first round) the argument check.
  absl::Status SyncChecked(const Collective& c, int set, bool first) {
    DT_RETURN_IF_ERROR(Sync(c));
    return first ? CheckArgs(c, set) : absl::OkStatus();
  }

  // ---- the collectives ----

  absl::Status Execute(const Collective& c) {
    if (!broken_.ok()) {
      return absl::Status(broken_.code(), absl::StrCat(ErrorPrefix(c), ": communicator is broken by an earlier error: ",
                                                       broken_.message()));
    }
    Start(c);
    using K = CollectiveKind;
    switch (c.kind) {
      case K::kAllReduce: return AllReduce(c);
      case K::kAllGather: return AllGather(c, std::vector<int64_t>(size(), c.input.numel()));
      case K::kAllGatherV: return AllGather(c, c.counts);
      case K::kReduceScatter: return ReduceScatter(c, std::vector<int64_t>(size(), c.output.numel()));
      case K::kReduceScatterV: return ReduceScatter(c, c.counts);
      case K::kAllToAll: {
        const std::vector<int64_t> k(size(), c.input.numel() / size());
        return AllToAll(c, k, k);
      }
      case K::kAllToAllV:
      case K::kAllToAllViews: return AllToAll(c, c.counts, c.recv_counts);
      case K::kBroadcast: return Broadcast(c);
      case K::kBarrier: {
        const int set = Begin(c, true);
        return SyncChecked(c, set, true);
      }
      case K::kSend:
      case K::kRecv: break;
    }
    return absl::InternalError(absl::StrCat(ErrorPrefix(c), ": not a collective"));
  }

  // out = reduction over members (in member order) of src(q), `len` elements.
  template <typename Src>
  void ReduceAll(void* out, const Src& src, int64_t len, const Collective& c) {
    const int64_t esz = DTypeSize(c.dtype());
    if (len <= 0) return;
    if (size() == 1) {
      if (out != src(0)) std::memcpy(out, src(0), len * esz);
      return;
    }
    Reduce3(out, src(0), src(1), len, c.dtype(), c.op);
    for (int q = 2; q < size(); ++q) ReduceInto(out, src(q), len, c.dtype(), c.op);
  }

  absl::Status AllReduce(const Collective& c) {
    const int n = size();
    const int64_t esz = DTypeSize(c.dtype()), numel = c.input.numel();
    char* x = static_cast<char*>(c.input.raw_data());
    const int64_t area = seg_->area_bytes();
    if (numel * esz <= std::min(area, kOneSyncAllReduce)) {
      const int set = Begin(c, true);
      if (numel > 0) std::memcpy(seg_->area(set, rank()), x, numel * esz);
      DT_RETURN_IF_ERROR(SyncChecked(c, set, true));
      if (n > 1) ReduceAll(x, [&](int q) { return seg_->area(set, q); }, numel, c);
      return absl::OkStatus();
    }
    const int64_t k = area / esz;
    const int64_t rounds = std::max<int64_t>(1, CeilDiv(numel, k));
    for (int64_t j = 0; j < rounds; ++j) {
      const auto [first, set, b] = BeginRound(c, j, k);
      const int64_t len = std::min(k, numel - b);
      std::memcpy(seg_->area(set, rank()), x + b * esz, len * esz);
      DT_RETURN_IF_ERROR(SyncChecked(c, set, first));
      if (n == 1) return absl::OkStatus();
      const int64_t lo = ChunkBegin(len, n, rank()), hi = ChunkBegin(len, n, rank() + 1);
      ReduceAll(seg_->result(set) + lo * esz, [&](int q) { return seg_->area(set, q) + lo * esz; }, hi - lo, c);
      DT_RETURN_IF_ERROR(Sync(c));
      std::memcpy(x + b * esz, seg_->result(set), len * esz);
    }
    return absl::OkStatus();
  }

  absl::Status AllGather(const Collective& c, const std::vector<int64_t>& counts) {
    const int64_t esz = DTypeSize(c.dtype());
    const char* in = static_cast<const char*>(c.input.raw_data());
    char* out = static_cast<char*>(c.output.raw_data());
    const int64_t k = seg_->area_bytes() / esz;
    const std::vector<int64_t> off = Offsets(counts);
    const int64_t rounds = std::max<int64_t>(1, CeilDiv(*std::max_element(counts.begin(), counts.end()), k));
    for (int64_t j = 0; j < rounds; ++j) {
      const auto [first, set, b] = BeginRound(c, j, k);
      const int64_t mine = Clamp(counts[rank()] - b, 0, k);
      if (mine > 0) std::memcpy(seg_->area(set, rank()), in + b * esz, mine * esz);
      DT_RETURN_IF_ERROR(SyncChecked(c, set, first));
      for (int q = 0; q < size(); ++q) {
        const int64_t len = Clamp(counts[q] - b, 0, k);
        if (len == 0) continue;
        std::memcpy(out + (off[q] + b) * esz, q == rank() ? in + b * esz : seg_->area(set, q), len * esz);
      }
    }
    return absl::OkStatus();
  }

  absl::Status ReduceScatter(const Collective& c, const std::vector<int64_t>& counts) {
    const int n = size(), me = rank();
    const int64_t esz = DTypeSize(c.dtype());
    const char* in = static_cast<const char*>(c.input.raw_data());
    char* out = static_cast<char*>(c.output.raw_data());
    const int64_t k = std::max<int64_t>(1, seg_->area_bytes() / n / esz);  // per block per round
    const std::vector<int64_t> off = Offsets(counts);
    const int64_t rounds = std::max<int64_t>(1, CeilDiv(*std::max_element(counts.begin(), counts.end()), k));
    for (int64_t j = 0; j < rounds; ++j) {
      const auto [first, set, b] = BeginRound(c, j, k);
      char* area = seg_->area(set, me);
      for (int q = 0; q < n; ++q) {
        const int64_t len = Clamp(counts[q] - b, 0, k);
        if (q != me && len > 0) std::memcpy(area + q * k * esz, in + (off[q] + b) * esz, len * esz);
      }
      DT_RETURN_IF_ERROR(SyncChecked(c, set, first));
      const int64_t len = Clamp(counts[me] - b, 0, k);
      ReduceAll(out + b * esz,
                [&](int p) -> const char* {
                  return p == me ? in + (off[me] + b) * esz : seg_->area(set, p) + me * k * esz;
                },
                len, c);
    }
    return absl::OkStatus();
  }

  absl::Status Broadcast(const Collective& c) {
    const int64_t esz = DTypeSize(c.dtype()), numel = c.input.numel();
    char* x = static_cast<char*>(c.input.raw_data());
    const int root = c.peer;
    const int64_t k = seg_->area_bytes() / esz;
    const int64_t rounds = std::max<int64_t>(1, CeilDiv(numel, k));
    for (int64_t j = 0; j < rounds; ++j) {
      const auto [first, set, b] = BeginRound(c, j, k);
      const int64_t len = Clamp(numel - b, 0, k);
      if (rank() == root && len > 0) std::memcpy(seg_->area(set, root), x + b * esz, len * esz);
      DT_RETURN_IF_ERROR(SyncChecked(c, set, first));
      if (rank() != root && len > 0) std::memcpy(x + b * esz, seg_->area(set, root), len * esz);
    }
    return absl::OkStatus();
  }

  // all_to_all, all_to_all_v and all_to_all_views. The number of rounds depends on every pair's
  // count, which only the fingerprints tell (after the first sync).
  absl::Status AllToAll(const Collective& c, const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
    const int n = size(), me = rank();
    const int64_t esz = DTypeSize(c.dtype());
    const bool views = c.kind == CollectiveKind::kAllToAllViews;
    const char* in = views ? nullptr : static_cast<const char*>(c.input.raw_data());
    char* out = views ? nullptr : static_cast<char*>(c.output.raw_data());
    std::vector<ViewStream> sends, recvs;
    if (views) {
      for (int q = 0; q < n; ++q) {
        sends.emplace_back(c.send_views[q]);
        recvs.emplace_back(c.recv_views[q]);
      }
    }
    const std::vector<int64_t> soff = Offsets(send), roff = Offsets(recv);
    const int64_t k = std::max<int64_t>(1, seg_->area_bytes() / n / esz);  // per peer per round
    int64_t rounds = 1;
    for (int64_t j = 0; j < rounds; ++j) {
      const auto [first, set, b] = BeginRound(c, j, k);
      char* area = seg_->area(set, me);
      for (int q = 0; q < n; ++q) {
        const int64_t len = Clamp(send[q] - b, 0, k);
        if (q == me || len == 0) continue;
        if (views) {
          sends[q].Pack(b, len, area + q * k * esz);
        } else {
          std::memcpy(area + q * k * esz, in + (soff[q] + b) * esz, len * esz);
        }
      }
      DT_RETURN_IF_ERROR(SyncChecked(c, set, first));
      if (first) {
        int64_t most = 0;
        for (int p = 0; p < n; ++p) {
          const int64_t* f = seg_->fingerprint(set, p);
          const bool v = c.kind != CollectiveKind::kAllToAll;
          for (int q = 0; q < n; ++q) {
            if (p != q) most = std::max(most, v ? f[5 + q] : f[4] / n);
          }
        }
        rounds = std::max<int64_t>(1, CeilDiv(most, k));
        // Our own block, view to view or buffer to buffer.
        if (views) {
          ViewStream::Copy(recvs[me], sends[me]);
        } else if (send[me] > 0) {
          std::memcpy(out + roff[me] * esz, in + soff[me] * esz, send[me] * esz);
        }
      }
      for (int p = 0; p < n; ++p) {
        const int64_t len = Clamp(recv[p] - b, 0, k);
        if (p == me || len == 0) continue;
        const char* from = seg_->area(set, p) + me * k * esz;
        if (views) {
          recvs[p].Unpack(b, len, from);
        } else {
          std::memcpy(out + (roff[p] + b) * esz, from, len * esz);
        }
      }
    }
    return absl::OkStatus();
  }

  std::mutex mu_;  // one collective at a time
  std::unique_ptr<ShmSegment> seg_;
  CommPtr p2p_;  // send/recv: gloo, over the same members
  PeerWatch watch_;
  std::chrono::microseconds spin_{50}, yield_{0};
  uint64_t round_ = 0;  // rounds run (the buffer set alternates)
  uint64_t step_ = 0;   // syncs passed
  Clock::time_point deadline_{};
  absl::Status broken_;
};

// How many segments this process has made: part of their names.
std::atomic<int> g_segments{0};

// The job part of segment names: dtrun's DT_JOB_ID (dtrun removes /dev/shm/dtshm.<id>.* when the
// job ends, in case a member died between creating a segment and unlinking it; the world checked
// the id's form, env::CheckAll), else this process's pid and the time.
std::string JobId() {
  if (std::optional<std::string> job = env::Text("DT_JOB_ID").value_or(std::nullopt)) return *job;
  return absl::StrCat("p", ::getpid(), "-",
                      absl::Hex(std::chrono::steady_clock::now().time_since_epoch().count() & 0xffffffff));
}

}  // namespace

std::string ShmNamePrefix(absl::string_view job_id) { return absl::StrCat("dtshm.", job_id, "."); }

absl::StatusOr<CommPtr> MakeShmGroup(TcpStore& store, const std::string& gid, const std::vector<int>& ranks, int me,
                                     std::chrono::milliseconds timeout, CommPtr p2p, absl::string_view what) {
  const int n = static_cast<int>(ranks.size());
  const std::string name_key = absl::StrCat("g/", gid, "/shm/name");
  auto ok_key = [&](int i) { return absl::StrCat("g/", gid, "/shm/ok/", i); };
  auto wrap = [&](const absl::Status& st) {
    return absl::Status(st.code(), absl::StrCat(what, ": ", st.message()));
  };
  std::unique_ptr<ShmSegment> seg;
  std::string name;
  if (me == 0) {
    name = absl::StrCat("/", ShmNamePrefix(JobId()), gid, ".", g_segments++);
    absl::StatusOr<std::unique_ptr<ShmSegment>> made = ShmSegment::Create(name, n, AreaBytes(n));
    if (made.ok()) seg = std::move(*made);
    absl::Status set = store.Set(name_key, made.ok() ? name : absl::StrCat("!", made.status().message()));
    if (!set.ok()) {
      if (seg) ShmSegment::Unlink(name);
      return wrap(set);
    }
  }
  // From here the leader unlinks the name on every path: once every member has mapped the
  // segment, or when the handshake fails.
  struct Unlinker {
    std::string name;
    ~Unlinker() {
      if (!name.empty()) ShmSegment::Unlink(name);
    }
  } unlinker{seg ? name : ""};
  DT_RETURN_IF_ERROR(WaitForRanks(store, {name_key}, {ranks[0]}, timeout, what,
                                   "(the member that makes the segment) did not name it"));
  absl::StatusOr<std::optional<std::string>> published = store.Get(name_key);
  if (!published.ok()) return wrap(published.status());
  if (!published->has_value()) return absl::InternalError(absl::StrCat(what, ": store key '", name_key, "' vanished"));
  std::string mine;  // "" = mapped
  if (!(*published)->empty() && (**published)[0] == '!') {
    mine = (*published)->substr(1);
  } else if (me != 0) {
    name = **published;
    absl::StatusOr<std::unique_ptr<ShmSegment>> opened = ShmSegment::Open(name, n);
    if (opened.ok()) {
      seg = std::move(*opened);
    } else {
      mine = std::string(opened.status().message());
    }
  }
  if (seg) {
    RankHeader& h = seg->rank(me);
    h.pid = static_cast<int32_t>(::getpid());
    h.start_time = ProcessStartTime(::getpid());
    h.state.store(static_cast<uint32_t>(MemberState::kAttached));
  }
  DT_RETURN_IF_ERROR(wrap(store.Set(ok_key(me), mine.empty() ? "ok" : absl::StrCat("!", mine))));
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) keys.push_back(ok_key(i));
  DT_RETURN_IF_ERROR(WaitForRanks(store, keys, ranks, timeout, what, "did not map the segment"));
  absl::StatusOr<std::vector<std::optional<std::string>>> oks = store.Peek(keys, timeout);
  if (!oks.ok()) return wrap(oks.status());
  for (int i = 0; i < n; ++i) {
    const std::optional<std::string>& v = (*oks)[i];
    if (!v.has_value() || *v != "ok") {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": global rank ", ranks[i], " cannot use shared memory: ", v.has_value() ? v->substr(1) : "no answer"));
    }
  }
  std::vector<int32_t> pids(n);
  std::vector<uint64_t> starts(n);
  for (int i = 0; i < n; ++i) {
    pids[i] = seg->rank(i).pid;
    starts[i] = seg->rank(i).start_time;
  }
  PeerWatch watch(pids, starts, me);
  return CommPtr(std::make_shared<ShmComm>(std::move(seg), ranks, me, timeout, std::move(p2p), std::move(watch)));
}

}  // namespace dt::internal
