#include "dtensor/mesh/shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace dt::internal {
namespace {

constexpr uint64_t kMagic = 0x3176'6d68'7374'6400ull;  // "\0dtshmv1"
constexpr uint32_t kVersion = 1;

int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

struct Layout {
  int64_t rank_off, fp_off, data_off, total;
  int64_t fp_words;
};

Layout LayoutFor(int n, int64_t area_bytes) {
  Layout l;
  l.fp_words = 5 + 2 * static_cast<int64_t>(n);  // Fingerprint::Encode
  l.rank_off = RoundUp(sizeof(SegmentHeader), 64);
  l.fp_off = RoundUp(l.rank_off + n * static_cast<int64_t>(sizeof(RankHeader)), 64);
  // Each member's fingerprint in cache lines of its own.
  l.fp_words = RoundUp(l.fp_words * 8, 64) / 8;
  l.data_off = RoundUp(l.fp_off + 2 * n * l.fp_words * 8, 4096);
  l.total = l.data_off + 2 * (n + 1) * area_bytes;
  return l;
}

std::string Errno(int e) { return std::strerror(e); }

}  // namespace

ShmSegment::ShmSegment(char* base, int64_t size, int n, int64_t area_bytes)
    : base_(base), size_(size), n_(n), area_bytes_(area_bytes) {
  const Layout l = LayoutFor(n, area_bytes);
  rank_off_ = l.rank_off;
  fp_off_ = l.fp_off;
  data_off_ = l.data_off;
  fp_words_ = l.fp_words;
}

ShmSegment::~ShmSegment() { ::munmap(base_, static_cast<size_t>(size_)); }

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& name, int n, int64_t area_bytes) {
  const Layout l = LayoutFor(n, area_bytes);
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot create shared memory ", name, ": ", Errno(errno)));
  }
  auto fail = [&](absl::string_view what, int e) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    return absl::UnavailableError(absl::StrCat("shared memory ", name, " (", l.total, " bytes): ", what, ": ",
                                               Errno(e)));
  };
  if (::ftruncate(fd, l.total) != 0) return fail("ftruncate", errno);
  // Reserve every page now: touching a page of a full tmpfs later would raise SIGBUS.
  if (const int e = ::posix_fallocate(fd, 0, l.total); e != 0) {
    return fail("reserving its pages (is /dev/shm full or small?)", e);
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(l.total), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("mmap", errno);
  ::close(fd);
  std::unique_ptr<ShmSegment> seg(new ShmSegment(static_cast<char*>(p), l.total, n, area_bytes));
  // The pages are zero: every atomic starts at 0 (epoch, sleepers, steps, states, aborted).
  SegmentHeader& h = seg->header();
  h.n = static_cast<uint32_t>(n);
  h.area_bytes = static_cast<uint64_t>(area_bytes);
  h.fp_words = static_cast<uint64_t>(l.fp_words);
  h.total_bytes = static_cast<uint64_t>(l.total);
  h.version = kVersion;
  std::atomic_thread_fence(std::memory_order_release);
  h.magic = kMagic;  // the others read the header only after the name is published (the store)
  return seg;
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Open(const std::string& name, int n) {
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot open shared memory ", name, ": ", Errno(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(SegmentHeader))) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("shared memory ", name, " is too small (", st.st_size, " bytes)"));
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) return absl::UnavailableError(absl::StrCat("cannot map shared memory ", name, ": ", Errno(e)));
  const SegmentHeader& h = *static_cast<const SegmentHeader*>(p);
  const int64_t area = static_cast<int64_t>(h.area_bytes);
  const Layout l = LayoutFor(n, area);
  if (h.magic != kMagic || h.version != kVersion || static_cast<int>(h.n) != n ||
      static_cast<int64_t>(h.total_bytes) != l.total || st.st_size != l.total) {
    const std::string why = absl::StrCat("shared memory ", name, " is not a segment for ", n, " members (magic ",
                                         absl::Hex(h.magic), ", version ", h.version, ", members ", h.n, ", ",
                                         st.st_size, " bytes)");
    ::munmap(p, static_cast<size_t>(st.st_size));
    return absl::DataLossError(why);
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(static_cast<char*>(p), l.total, n, area));
}

void ShmSegment::Unlink(const std::string& name) { ::shm_unlink(name.c_str()); }

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  if (timeout.count() <= 0) return;
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

namespace {

std::string ReadLine(const char* path) {
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line)) return "";
  return std::string(absl::StripAsciiWhitespace(line));
}

bool StatOf(const char* path, struct stat* st) { return ::stat(path, st) == 0; }

}  // namespace

std::string HostKey() {
  const std::string boot = ReadLine("/proc/sys/kernel/random/boot_id");
  struct stat shm {}, net {}, pid {};
  if (boot.empty() || !StatOf("/dev/shm", &shm) || !StatOf("/proc/self/ns/net", &net) ||
      !StatOf("/proc/self/ns/pid", &pid)) {
    return "";
  }
  return absl::StrCat(boot, " shm=", shm.st_dev, ":", shm.st_ino, " net=", net.st_ino, " pid=", pid.st_ino);
}

uint64_t ProcessStartTime(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string s = ss.str();
  const size_t close = s.rfind(')');  // the command name may contain spaces and parentheses
  if (!f || close == std::string::npos) return 0;
  std::istringstream rest(s.substr(close + 2));
  std::string field;
  // Fields after the name start at 3 (state); the start time is field 22.
  for (int i = 3; i <= 22; ++i) {
    if (!(rest >> field)) return 0;
  }
  uint64_t v = 0;
  for (char ch : field) {
    if (ch < '0' || ch > '9') return 0;
    v = v * 10 + static_cast<uint64_t>(ch - '0');
  }
  return v;
}

PeerWatch::PeerWatch(const std::vector<int32_t>& pids, const std::vector<uint64_t>& start_times, int me)
    : pids_(pids), start_times_(start_times), fds_(pids.size(), -1), me_(me) {
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (static_cast<int>(i) == me_) continue;
#ifdef SYS_pidfd_open
    const long fd = ::syscall(SYS_pidfd_open, static_cast<pid_t>(pids_[i]), 0);
    // A pidfd opened after the pid was reused would watch the wrong process: check the start time.
    if (fd >= 0 && start_times_[i] != 0 && ProcessStartTime(pids_[i]) != start_times_[i]) {
      ::close(static_cast<int>(fd));
      fds_[i] = -2;  // gone already
      continue;
    }
    fds_[i] = static_cast<int>(fd);
#endif
  }
}

PeerWatch::~PeerWatch() { Close(); }

void PeerWatch::Close() {
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
  fds_.clear();
}

PeerWatch::PeerWatch(PeerWatch&& o) noexcept
    : pids_(std::move(o.pids_)), start_times_(std::move(o.start_times_)), fds_(std::move(o.fds_)), me_(o.me_) {
  o.fds_.clear();
}

PeerWatch& PeerWatch::operator=(PeerWatch&& o) noexcept {
  if (this != &o) {
    Close();
    pids_ = std::move(o.pids_);
    start_times_ = std::move(o.start_times_);
    fds_ = std::move(o.fds_);
    me_ = o.me_;
    o.fds_.clear();
  }
  return *this;
}

bool PeerWatch::IsGone(size_t i) const {
  if (static_cast<int>(i) == me_ || i >= fds_.size()) return false;
  if (fds_[i] == -2) return true;
  if (fds_[i] >= 0) {
    pollfd p{fds_[i], POLLIN, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
  }
  if (::kill(pids_[i], 0) != 0 && errno == ESRCH) return true;
  // A zombie (exited, not yet reaped) still answers kill(); a reused pid has another start time.
  std::ifstream f(absl::StrCat("/proc/", pids_[i], "/stat"));
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = s.rfind(')');
  if (!f.good() && s.empty()) return true;
  if (close != std::string::npos && close + 2 < s.size() && (s[close + 2] == 'Z' || s[close + 2] == 'X')) return true;
  return start_times_[i] != 0 && ProcessStartTime(pids_[i]) != start_times_[i];
}

std::vector<int> PeerWatch::Gone() const {
  std::vector<int> gone;
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (IsGone(i)) gone.push_back(static_cast<int>(i));
  }
  return gone;
}

std::vector<int> PeerWatch::GoneSettled(std::chrono::steady_clock::time_point until) const {
  std::vector<int> gone = Gone();
  const size_t watched = pids_.empty() ? 0 : pids_.size() - 1;
  while (gone.size() < watched && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    gone = Gone();
  }
  return gone;
}

}  // namespace dt::internal
