// What the shm backend stands on (mesh/shm_segment.h): segments, futex waits across processes, the
// host key, the watch on peer processes; and how the shm backend is chosen (DT_BACKEND, DT_SHM).
// The collectives themselves run in processes: mesh_shm_np* and ShmFaults.* (fault_test.cc).

#include "dtensor/mesh/shm_segment.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "dtensor/mesh/world.h"

namespace dt::internal {
namespace {

using Clock = std::chrono::steady_clock;

std::string TestName(const char* what) {
  return "/dtshm.unittest-" + std::to_string(::getpid()) + "." + what;
}

TEST(ShmSegment, CreateOpenAndLayout) {
  const std::string name = TestName("layout");
  auto made = ShmSegment::Create(name, 3, 64 << 10);
  ASSERT_TRUE(made.ok()) << made.status();
  auto opened = ShmSegment::Open(name, 3);
  ASSERT_TRUE(opened.ok()) << opened.status();
  ShmSegment::Unlink(name);
  ShmSegment& a = **made;
  ShmSegment& b = **opened;
  EXPECT_EQ(b.area_bytes(), 64 << 10);
  EXPECT_EQ(b.header().n, 3u);
  // Areas and results of both sets: disjoint, in order, aligned.
  const char* prev_end = reinterpret_cast<const char*>(a.fingerprint(1, 2) + a.fp_words());
  for (int set = 0; set < 2; ++set) {
    for (int r = 0; r <= 3; ++r) {
      const char* p = r < 3 ? a.area(set, r) : a.result(set);
      EXPECT_GE(p, prev_end);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
      prev_end = p + a.area_bytes();
    }
  }
  // The two mappings are one memory.
  a.area(1, 2)[5] = 42;
  a.rank(1).step.store(7);
  EXPECT_EQ(b.area(1, 2)[5], 42);
  EXPECT_EQ(b.rank(1).step.load(), 7u);
}

TEST(ShmSegment, ErrorsNameTheSegment) {
  const std::string name = TestName("errors");
  auto made = ShmSegment::Create(name, 2, 64 << 10);
  ASSERT_TRUE(made.ok()) << made.status();
  auto again = ShmSegment::Create(name, 2, 64 << 10);  // O_EXCL
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(again.status().message().find(name), absl::string_view::npos) << again.status();
  auto wrong = ShmSegment::Open(name, 3);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kDataLoss) << wrong.status();
  ShmSegment::Unlink(name);
  auto gone = ShmSegment::Open(name, 2);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable);
}

TEST(ShmSegment, FutexWakesAnotherProcess) {
  const std::string name = TestName("futex");
  auto made = ShmSegment::Create(name, 2, 64 << 10);
  ASSERT_TRUE(made.ok()) << made.status();
  ShmSegment::Unlink(name);
  SegmentHeader& h = (*made)->header();
  const pid_t child = ::fork();
  if (child == 0) {
    // Sleep on the word (up to 10 s) until the parent bumps it; exit 0 when woken in time.
    const auto start = Clock::now();
    while (h.epoch.load() == 0 && Clock::now() - start < std::chrono::seconds(10)) {
      h.sleepers.fetch_add(1);
      FutexWait(&h.epoch, 0, std::chrono::seconds(10));
      h.sleepers.fetch_sub(1);
    }
    ::_exit(h.epoch.load() != 0 && Clock::now() - start < std::chrono::seconds(5) ? 0 : 1);
  }
  while (h.sleepers.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  h.epoch.fetch_add(1);
  FutexWakeAll(&h.epoch);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(ShmSegment, FutexWaitTimesOut) {
  std::atomic<uint32_t> word{0};
  const auto start = Clock::now();
  FutexWait(&word, 0, std::chrono::milliseconds(30));
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(25));
}

TEST(PeerWatch, SeesAProcessExitBeforeItIsReaped) {
  const pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  PeerWatch watch({::getpid(), child}, {ProcessStartTime(::getpid()), ProcessStartTime(child)}, 0);
  EXPECT_TRUE(watch.Gone().empty());
  ::kill(child, SIGKILL);
  // Not reaped yet: a zombie is gone too.
  const std::vector<int> gone = watch.GoneSettled(Clock::now() + std::chrono::seconds(5));
  EXPECT_EQ(gone, std::vector<int>{1});
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_EQ(watch.Gone(), std::vector<int>{1});
}

TEST(PeerWatch, AReusedPidIsNotTheSameProcess) {
  // A start time that does not match: whatever runs under that pid now is not the member.
  PeerWatch watch({::getpid(), ::getppid()}, {ProcessStartTime(::getpid()), 1}, 0);
  EXPECT_EQ(watch.Gone(), std::vector<int>{1});
}

TEST(HostKey, IsStable) {
  const std::string key = HostKey();
  ASSERT_FALSE(key.empty());
  EXPECT_EQ(HostKey(), key);
  EXPECT_NE(key.find(" net="), std::string::npos) << key;
  EXPECT_GT(ProcessStartTime(::getpid()), 0u);
}

// DT_BACKEND / DT_SHM in a world of one rank started "by dtrun".
class ShmChoice : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("RANK", "0", 1);
    ::setenv("WORLD_SIZE", "1", 1);
  }
  void TearDown() override {
    for (const char* v : {"RANK", "WORLD_SIZE", "DT_BACKEND", "DT_SHM"}) ::unsetenv(v);
  }
};

TEST_F(ShmChoice, ShmUnlessTurnedOff) {
  ::setenv("DT_BACKEND", "shm", 1);
  {
    auto w = World::FromEnv();
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->backend(), "shm");
    EXPECT_EQ((*w)->WorldGroup().value()->backend(), "shm");
    Tensor x = Tensor::Full({3}, 2.0).value();
    ASSERT_TRUE((*w)->WorldGroup().value()->AllReduce(x, ReduceOp::kAvg).ok());
    EXPECT_EQ(x.ToVector<float>(), std::vector<float>(3, 2.0f));
  }
  ::setenv("DT_SHM", "0", 1);
  {
    auto w = World::FromEnv();
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->backend(), "gloo");
  }
  ::setenv("DT_SHM", "yes", 1);
  auto bad = World::FromEnv();
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("DT_SHM='yes'"), absl::string_view::npos) << bad.status();
}

}  // namespace
}  // namespace dt::internal
