// The threads backend: N ranks as threads of one process.
//
// Note [Threads rendezvous]
// Every group (rank list) has a Hub shared by its members; collective #k of a group meets in the
// hub's Slot k. A rank posts pointers to its tensors and waits (phase 0) until every member has
// arrived; then each rank moves data directly between the members' buffers, and a second wait
// (phase 1) keeps every input alive until all peers have read it:
//
//   all_reduce       rank r reduces chunk r of every input (in rank order) into the slot's scratch
//                    (recycled through the hub: fresh pages would cost a page fault each);
//                    phase 1; every rank copies the scratch into its tensor
//   all_gather(_v)   rank r copies every input into its output; phase 1
//   reduce_scatter   rank r reduces block r of every input into its output; phase 1
//   all_to_all(_v)   rank r copies block r of every input into its output; phase 1
//   all_to_all_views rank r copies every member's send views for r straight into its own recv views
//                    (strided to strided, run by run: mesh/view_stream.h); phase 1
//   broadcast        non-roots copy the root's tensor; phase 1
// All of a job's hubs share one mutex and condition variable. Every wait ends by the collective's
// deadline (now + timeout()) or when the job is aborted: a rank's function returned an error, or a
// wait timed out (the timeout aborts the job so the rest fail fast instead of timing out one by
// one). A rank whose function has returned can never arrive, so waiting for it fails at once.
// Sends are eager (copied into a mailbox); receives happen on Wait().

#include <algorithm>
#include <numeric>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/mesh/backends.h"
#include "dtensor/mesh/collective.h"
#include "dtensor/mesh/reduce.h"
#include "dtensor/mesh/view_stream.h"
#include "dtensor/mesh/work.h"

namespace dt::internal {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kPhases = 2;

struct Slot {
  explicit Slot(int n) : args(n, nullptr), invalid(n), reached(n, 0) {}
  std::vector<const Collective*> args;  // per group rank, valid until that rank departs
  std::vector<absl::Status> invalid;    // a rank's own argument error (it still joins)
  std::vector<int> reached;             // 1 once a rank has arrived
  std::atomic<int> count[kPhases] = {0, 0};  // arrivals per phase (written under the job's lock)
  absl::Status failure;                 // set when a member left with an error
  int departed = 0;
  bool judged = false;
  absl::Status verdict;  // the same for every member: mismatched or invalid arguments
  Storage scratch;       // all_reduce
};

struct Message {
  DType dtype;
  int64_t numel;
  Storage bytes;
};

struct Hub {
  std::map<int64_t, std::shared_ptr<Slot>> slots;                 // by collective sequence number
  std::map<std::pair<int, int>, std::deque<Message>> mailboxes;  // (src, dst) group ranks
  std::vector<Storage> spare_scratch;  // all_reduce scratch for reuse (fresh pages cost page faults)
};

// State shared by the ranks of one RunThreads call.
class Job {
 public:
  Job(int n, WorldOptions options) : n_(n), options_(std::move(options)), exited_(n, false) {}

  int n() const { return n_; }
  const WorldOptions& options() const { return options_; }
  std::mutex& mu() { return mu_; }
  std::condition_variable& cv() { return cv_; }

  std::shared_ptr<Hub> HubFor(const std::vector<int>& ranks) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& hub = hubs_[ranks];
    if (!hub) hub = std::make_shared<Hub>();
    return hub;
  }
  // Both under mu().
  const absl::Status& abort_status() const { return abort_; }
  bool exited(int global_rank) const { return exited_[global_rank]; }

  void Abort(const absl::Status& why) {  // under mu()
    if (abort_.ok()) abort_ = why;
    cv_.notify_all();
  }
  void Finish(int rank, const absl::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    exited_[rank] = true;
    if (!status.ok()) {
      if (first_error_.ok()) first_error_ = status;
      Abort(absl::Status(status.code(), absl::StrCat("rank ", rank, " failed: ", status.message())));
    }
    cv_.notify_all();
  }
  absl::Status first_error() {
    std::lock_guard<std::mutex> lock(mu_);
    return first_error_;
  }

 private:
  const int n_;
  const WorldOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::vector<int>, std::shared_ptr<Hub>> hubs_;
  std::vector<bool> exited_;
  absl::Status abort_;
  absl::Status first_error_;
};

class ThreadsComm final : public Communicator {
 public:
  ThreadsComm(std::shared_ptr<Job> job, std::shared_ptr<Hub> hub, std::vector<int> ranks, int rank,
              std::chrono::milliseconds timeout)
      : Communicator(std::move(ranks), rank, kCPU, timeout), job_(std::move(job)), hub_(std::move(hub)) {}

  absl::string_view backend() const override { return "threads"; }

 protected:
  bool HandlesViews() const override { return true; }
  WorkPtr Run(Collective c) override {
    if (c.kind == CollectiveKind::kSend) return Work::Done(Send(c));
    if (c.kind == CollectiveKind::kRecv) {
      return std::make_shared<DeferredWork>([this, c] { return Recv(c); });
    }
    return Work::Done(Execute(c, absl::OkStatus()));
  }
  WorkPtr RunInvalid(Collective c, absl::Status error) override {
    if (c.kind == CollectiveKind::kSend || c.kind == CollectiveKind::kRecv) return Work::Done(error);
    return Work::Done(Execute(c, error));
  }

 private:
  const char* In(const Slot& s, int i) const { return static_cast<const char*>(s.args[i]->input.raw_data()); }

  // Peers usually arrive within microseconds: poll `count` briefly (yielding the CPU) before
  // sleeping on the condition variable, whose wake-up takes a scheduler slice on a busy machine.
  static void SpinFor(std::unique_lock<std::mutex>& lock, const std::atomic<int>& count, int target) {
    lock.unlock();
    for (int i = 0; i < 200 && count.load(std::memory_order_acquire) < target; ++i) std::this_thread::yield();
    lock.lock();
  }

  // Enters phase 0 and waits for every member (see Note [Threads rendezvous]). Under the lock. Once
  // a member has left the slot with an error the slot is failed: nobody passes it afterwards, so
  // nobody reads the buffers of a rank that has gone.
  absl::Status Arrive(std::unique_lock<std::mutex>& lock, Slot& s, const Collective& c,
                      Clock::time_point deadline) {
    const int n = size();
    s.count[0]++;
    s.reached[rank()] = 1;
    job_->cv().notify_all();
    if (s.count[0] < n) SpinFor(lock, s.count[0], n);
    auto fail = [&](absl::Status st) {
      s.failure = st;
      job_->cv().notify_all();
      return st;
    };
    while (true) {
      if (!s.failure.ok()) {
        return absl::AbortedError(absl::StrCat(ErrorPrefix(c), ": a peer left: ", s.failure.message()));
      }
      if (s.count[0] == n) return absl::OkStatus();
      if (!job_->abort_status().ok()) {
        return fail(absl::AbortedError(absl::StrCat(ErrorPrefix(c), ": aborted: ", job_->abort_status().message())));
      }
      auto missing = [&](bool exited_only) {
        std::vector<int> out;
        for (int i = 0; i < n; ++i) {
          if (s.reached[i] == 0 && (!exited_only || job_->exited(global_ranks()[i]))) out.push_back(global_ranks()[i]);
        }
        return out;
      };
      if (const std::vector<int> gone = missing(/*exited_only=*/true); !gone.empty()) {
        return fail(absl::AbortedError(absl::StrCat(ErrorPrefix(c), ": global rank(s) ", RankList(gone),
                                                    " returned from their function without joining")));
      }
      if (job_->cv().wait_until(lock, deadline) == std::cv_status::timeout && s.count[0] < n &&
          s.failure.ok()) {
        absl::Status st = absl::DeadlineExceededError(absl::StrCat(
            ErrorPrefix(c), ": timed out after ", timeout().count(), " ms waiting for global rank(s) ",
            RankList(missing(/*exited_only=*/false))));
        job_->Abort(st);
        return fail(st);
      }
    }
  }

  // Phase 1: every member has passed phase 0 and only copies memory before it gets here, so this
  // wait needs no deadline, and must not be cut short while peers may still read our buffers.
  void AwaitCopies(Slot& s) {
    std::unique_lock<std::mutex> lock(job_->mu());
    s.count[1]++;
    job_->cv().notify_all();
    if (s.count[1] < size()) SpinFor(lock, s.count[1], size());
    job_->cv().wait(lock, [&] { return s.count[1] == size(); });
  }

  // A member's own argument error, or the first disagreement between members.
  std::string Judge(const Slot& s) const {
    std::vector<Fingerprint> members;
    for (int i = 0; i < size(); ++i) {
      if (!s.invalid[i].ok()) {
        return absl::StrCat("global rank ", global_ranks()[i], " passed invalid arguments: ", s.invalid[i].message());
      }
      members.push_back(Fingerprint::Of(*s.args[i]));
    }
    return FindDisagreement(members, global_ranks());
  }

  absl::Status Execute(const Collective& c, const absl::Status& invalid) {
    const auto deadline = Clock::now() + timeout();
    const int n = size(), me = rank();
    std::shared_ptr<Slot> slot;
    {
      std::unique_lock<std::mutex> lock(job_->mu());
      auto& entry = hub_->slots[c.seq];
      if (!entry) entry = std::make_shared<Slot>(n);
      slot = entry;
      slot->args[me] = &c;
      slot->invalid[me] = invalid;
      DT_RETURN_IF_ERROR(Arrive(lock, *slot, c, deadline));
      if (!slot->judged) {
        slot->judged = true;
        std::string why = Judge(*slot);
        if (!why.empty()) slot->verdict = absl::InvalidArgumentError(why);
        if (why.empty() && c.kind == CollectiveKind::kAllReduce && n > 1) {
          auto& spare = hub_->spare_scratch;
          auto fit = std::find_if(spare.begin(), spare.end(),
                                  [&](const Storage& st) { return st.nbytes() >= c.input.nbytes(); });
          if (fit != spare.end()) {
            slot->scratch = std::move(*fit);
            spare.erase(fit);
          } else {
            absl::StatusOr<Storage> scratch = Storage::Allocate(c.input.nbytes(), kCPU);
            if (!scratch.ok()) {
              slot->verdict = scratch.status();
            } else {
              slot->scratch = *std::move(scratch);
            }
          }
        }
      }
    }
    absl::Status status;
    if (!invalid.ok()) {
      status = invalid;
    } else if (!slot->verdict.ok()) {
      status = absl::Status(slot->verdict.code(), absl::StrCat(ErrorPrefix(c), ": ", slot->verdict.message()));
    } else {
      status = Move(*slot, c);
    }
    std::lock_guard<std::mutex> lock(job_->mu());
    if (++slot->departed == n) {
      if (slot->scratch.defined()) {
        auto& spare = hub_->spare_scratch;
        spare.push_back(std::move(slot->scratch));
        if (spare.size() > 2) spare.erase(spare.begin());  // keep the two most recent
      }
      hub_->slots.erase(c.seq);
    }
    return status;
  }

  // The data movement of a matched collective (see Note [Threads rendezvous]).
  absl::Status Move(Slot& s, const Collective& c) {
    using K = CollectiveKind;
    const int n = size(), me = rank();
    const int64_t esz = DTypeSize(c.dtype());
    char* out = static_cast<char*>(c.output.defined() ? c.output.raw_data() : c.input.raw_data());
    auto reduce_block = [&](char* dst, int64_t src_offset, int64_t count) {
      std::memcpy(dst, In(s, 0) + src_offset * esz, count * esz);
      for (int i = 1; i < n; ++i) ReduceInto(dst, In(s, i) + src_offset * esz, count, c.dtype(), c.op);
    };
    switch (c.kind) {
      case K::kBarrier:
        return absl::OkStatus();
      case K::kAllReduce: {
        if (n == 1) return absl::OkStatus();
        const int64_t numel = c.input.numel();
        const int64_t b = ChunkBegin(numel, n, me), e = ChunkBegin(numel, n, me + 1);
        char* scratch = static_cast<char*>(s.scratch.data());
        reduce_block(scratch + b * esz, b, e - b);
        AwaitCopies(s);
        std::memcpy(out, scratch, numel * esz);
        return absl::OkStatus();
      }
      case K::kAllGather:
      case K::kAllGatherV: {
        std::vector<int64_t> counts = c.kind == K::kAllGatherV ? c.counts
                                                               : std::vector<int64_t>(n, c.input.numel());
        std::vector<int64_t> off = Offsets(counts);
        for (int i = 0; i < n; ++i) std::memcpy(out + off[i] * esz, In(s, i), counts[i] * esz);
        break;
      }
      case K::kReduceScatter:
        reduce_block(out, me * c.output.numel(), c.output.numel());
        break;
      case K::kReduceScatterV:
        reduce_block(out, Offsets(c.counts)[me], c.counts[me]);
        break;
      case K::kAllToAll: {
        const int64_t block = c.input.numel() / n;
        for (int i = 0; i < n; ++i) std::memcpy(out + i * block * esz, In(s, i) + me * block * esz, block * esz);
        break;
      }
      case K::kAllToAllV: {
        std::vector<int64_t> recv_off = Offsets(c.recv_counts);
        for (int i = 0; i < n; ++i) {
          const std::vector<int64_t>& sent = s.args[i]->counts;
          const int64_t src_off = std::accumulate(sent.begin(), sent.begin() + me, int64_t{0});
          std::memcpy(out + recv_off[i] * esz, In(s, i) + src_off * esz, c.recv_counts[i] * esz);
        }
        break;
      }
      case K::kAllToAllViews:
        for (int i = 0; i < n; ++i) ViewStream::Copy(ViewStream(c.recv_views[i]), ViewStream(s.args[i]->send_views[me]));
        break;
      case K::kBroadcast:
        if (me != c.peer) std::memcpy(out, In(s, c.peer), c.input.nbytes());
        break;
      case K::kSend:
      case K::kRecv:
        break;
    }
    AwaitCopies(s);
    return absl::OkStatus();
  }

  absl::Status Send(const Collective& c) {
    DT_ASSIGN_OR_RETURN(Storage bytes, Storage::Allocate(c.input.nbytes(), kCPU));
    std::memcpy(bytes.data(), c.input.raw_data(), c.input.nbytes());
    std::lock_guard<std::mutex> lock(job_->mu());
    hub_->mailboxes[{rank(), c.peer}].push_back(Message{c.dtype(), c.input.numel(), std::move(bytes)});
    job_->cv().notify_all();
    return absl::OkStatus();
  }

  absl::Status Recv(const Collective& c) {
    const auto deadline = Clock::now() + timeout();
    const int src_global = global_ranks()[c.peer];
    std::unique_lock<std::mutex> lock(job_->mu());
    auto& box = hub_->mailboxes[{c.peer, rank()}];
    while (box.empty()) {
      if (!job_->abort_status().ok()) {
        return absl::AbortedError(absl::StrCat(ErrorPrefix(c), ": aborted: ", job_->abort_status().message()));
      }
      if (job_->exited(src_global)) {
        return absl::AbortedError(
            absl::StrCat(ErrorPrefix(c), ": global rank ", src_global, " returned from its function without sending"));
      }
      if (job_->cv().wait_until(lock, deadline) == std::cv_status::timeout && box.empty()) {
        absl::Status st = absl::DeadlineExceededError(absl::StrCat(
            ErrorPrefix(c), ": timed out after ", timeout().count(), " ms waiting for global rank ", src_global));
        job_->Abort(st);
        return st;
      }
    }
    Message m = std::move(box.front());
    box.pop_front();
    lock.unlock();
    if (m.dtype != c.dtype() || m.numel != c.input.numel()) {
      return absl::InvalidArgumentError(absl::StrCat(ErrorPrefix(c), ": global rank ", src_global, " sent ",
                                                     DTypeName(m.dtype), "[", m.numel, "], expected ",
                                                     c.input.Describe()));
    }
    std::memcpy(c.input.raw_data(), m.bytes.data(), c.input.nbytes());
    return absl::OkStatus();
  }

  std::shared_ptr<Job> job_;
  std::shared_ptr<Hub> hub_;
};

// N ranks as threads of one process: one node.
LaunchInfo ThreadsLaunch(int n, int rank) {
  LaunchInfo info;
  info.launcher = "threads";
  info.rank = info.local_rank = rank;
  info.world_size = info.local_size = n;
  return info;
}

class ThreadsWorld final : public BackendWorld {
 public:
  ThreadsWorld(std::shared_ptr<Job> job, int rank)
      : BackendWorld(ThreadsLaunch(job->n(), rank), job->options()), job_(std::move(job)) {}
  absl::string_view backend() const override { return "threads"; }
  Device device() const override { return kCPU; }


 private:
  absl::StatusOr<CommPtr> MakeGroup(const std::vector<int>& ranks) override {
    return CommPtr(std::make_shared<ThreadsComm>(job_, job_->HubFor(ranks), ranks, IndexIn(ranks), options_.timeout));
  }

  std::shared_ptr<Job> job_;
};

}  // namespace

absl::Status RunThreadsJob(int n, const std::function<absl::Status(World&)>& fn, const WorldOptions& options) {
  auto job = std::make_shared<Job>(n, options);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      absl::Status status;
      {
        auto world = std::make_shared<ThreadsWorld>(job, r);
        status = fn(*world);
      }
      job->Finish(r, status);
    });
  }
  for (auto& t : threads) t.join();
  return job->first_error();
}

std::shared_ptr<World> MakeSingleThreadWorld(const WorldOptions& options) {
  return std::make_shared<ThreadsWorld>(std::make_shared<Job>(1, options), 0);
}

}  // namespace dt::internal
