#pragma once
// Internal to mesh/: what the shared-memory communicator (mesh/shm_backend.cc) stands on — a POSIX
// shared-memory segment shared by the members of one group, futex waits on a word in it, the
// identity of a host, and a watch on the members' processes.
//
// Segment layout (offsets from the start of the mapping; n members, A = area bytes):
//
//   SegmentHeader                     magic, sizes, the futex word, the abort record
//   RankHeader[n]                     per member: its sync step, the collective it reached, its
//                                     state (attached, failing, left) and its pid
//   int64 fingerprints[2][n][W]       what each member passed (Fingerprint::Encode), per buffer set
//   data[2][n + 1][A]                 per buffer set: one area per member, then a result area
//
// Everything a member writes lives in its own cache lines; the only word everyone writes is the
// futex word (and the sleeper count beside it), touched only by ranks that go to sleep or wake
// sleepers. The two buffer sets alternate by round (Note [Shm rounds] in shm_backend.cc).

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dt::internal {

struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t n;
  uint64_t area_bytes;
  uint64_t fp_words;
  uint64_t total_bytes;
  // The futex word (Note [Shm waiting] in shm_backend.cc): bumped to wake sleepers.
  alignas(64) std::atomic<uint32_t> epoch;
  std::atomic<uint32_t> sleepers;
  // The first member to fail records why, so that the others can say so (0: nobody failed yet).
  alignas(64) std::atomic<uint32_t> aborted;
  int32_t abort_code;       // absl::StatusCode
  int32_t abort_rank;       // global rank
  char abort_reason[1024];  // NUL-terminated
};

// kFailedAndLeft: destroyed its communicator after one of its collectives failed; it leaves
// because of an error of its own, so it is no cause of another member's failure.
enum class MemberState : uint32_t { kAbsent = 0, kAttached = 1, kFailing = 2, kLeft = 3, kFailedAndLeft = 4 };

struct alignas(64) RankHeader {
  std::atomic<uint64_t> step;  // syncs passed through (Note [Shm waiting])
  alignas(64) std::atomic<int64_t> reached;  // seq + 1 of the last collective it entered
  std::atomic<uint32_t> state;               // MemberState
  int32_t pid;
  uint64_t start_time;  // of the process, in clock ticks since boot (/proc/<pid>/stat)
};

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free (address-free) to work across processes");

class ShmSegment {
 public:
  // Creates `name` (O_EXCL, mode 0600) for `n` members with areas of `area_bytes`, reserves its
  // pages (posix_fallocate: a full /dev/shm is an error here, not a SIGBUS later) and maps it.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(const std::string& name, int n, int64_t area_bytes);
  // Opens and maps a segment made by Create for `n` members, checking its header.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Open(const std::string& name, int n);
  // Removes the name (the memory lives on while mapped); a missing name is fine.
  static void Unlink(const std::string& name);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  int n() const { return n_; }
  int64_t area_bytes() const { return area_bytes_; }
  int64_t fp_words() const { return fp_words_; }
  SegmentHeader& header() const { return *reinterpret_cast<SegmentHeader*>(base_); }
  RankHeader& rank(int r) const { return reinterpret_cast<RankHeader*>(base_ + rank_off_)[r]; }
  int64_t* fingerprint(int set, int r) const {
    return reinterpret_cast<int64_t*>(base_ + fp_off_) + (static_cast<int64_t>(set) * n_ + r) * fp_words_;
  }
  char* area(int set, int r) const { return base_ + data_off_ + (static_cast<int64_t>(set) * (n_ + 1) + r) * area_bytes_; }
  char* result(int set) const { return area(set, n_); }

 private:
  ShmSegment(char* base, int64_t size, int n, int64_t area_bytes);
  char* base_;
  int64_t size_;
  int n_;
  int64_t area_bytes_, fp_words_;
  int64_t rank_off_ = 0, fp_off_ = 0, data_off_ = 0;
};

// FUTEX_WAIT on a word of a shared mapping (not FUTEX_PRIVATE): returns when woken, when the word
// is no longer `expected`, on a signal, or after `timeout`.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout);
void FutexWakeAll(std::atomic<uint32_t>* word);

// Which host (and which /dev/shm, network and PID namespace) this process runs in: the kernel's
// boot id, /dev/shm's device and inode, and the inodes of /proc/self/ns/net and /proc/self/ns/pid.
// Two processes may share a segment and watch each other's pids when their keys are equal. ""
// when any part cannot be read (then no group of this process uses shared memory).
std::string HostKey();

// The start time of process `pid` in clock ticks since boot (field 22 of /proc/<pid>/stat); 0 when
// it cannot be read. With the pid it names one process, whatever the pid is reused for later.
uint64_t ProcessStartTime(pid_t pid);

// Watches the processes of a group's other members (same PID namespace: see HostKey). Each is
// watched through a pidfd (readable once the process has exited, even before it is reaped), or,
// where pidfd_open is not allowed, kill(pid, 0) and /proc/<pid>/stat (gone, a zombie, or a
// different start time).
class PeerWatch {
 public:
  PeerWatch() = default;
  // `pids[i]` / `start_times[i]` per member; member `me` is not watched.
  PeerWatch(const std::vector<int32_t>& pids, const std::vector<uint64_t>& start_times, int me);
  ~PeerWatch();
  PeerWatch(PeerWatch&& other) noexcept;
  PeerWatch& operator=(PeerWatch&& other) noexcept;

  // The members whose process has exited, in member order.
  std::vector<int> Gone() const;
  // Gone(), after waiting until `until` for any other watched member to exit too (members killed
  // together die moments apart); returns early once every watched member is gone.
  std::vector<int> GoneSettled(std::chrono::steady_clock::time_point until) const;
  bool IsGone(size_t member) const;

 private:
  void Close();
  std::vector<int32_t> pids_;
  std::vector<uint64_t> start_times_;
  std::vector<int> fds_;  // pidfd per member, -1 for `me` and where none could be opened
  int me_ = -1;
};

}  // namespace dt::internal
