// Launches under load: jobs of 2-4 ranks on gloo and shm started by dtrun several at a time while
// every core is kept busy (issue 45: a `bench_load --quick` launch among other dtrun jobs and
// builds was killed after 300 s without a word). Each job makes its world, its world group and
// a second group, runs a few collectives and exits (tests/mesh/fault_worker.cc, mode `launch`).
// None may outlive its deadline (its collective timeout, dtrun's grace period and slack): one
// that does is killed and named with its output. Every job must pass; a failure shows its
// output (which names what it waited for: Note [Store deadlines], docs/mesh.md "Every wait").
//
//   LaunchStress.*  30 jobs, 3 at a time: the default suite (label multiprocess), a few seconds
//   LaunchSoak.*    200 jobs, 4 at a time (label soak: not in CI; docs/mesh.md has its last run)

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "dtensor/tests/test_util.h"

namespace dt {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kTimeoutMs = 20000;  // each job's DT_TIMEOUT_MS
constexpr double kGraceS = 5;      // dtrun --grace-period
// A job that has not ended by then hangs: its collective timeout, the diagnosis (about a second),
// dtrun's grace period and slack for a loaded machine.
constexpr auto kDeadline = std::chrono::milliseconds(kTimeoutMs) + std::chrono::seconds(25);

std::string Scratch(const std::string& name) {
  static const dt::testing::ScratchDir dir("launch_stress");
  return dir.path + "/" + name;
}

// Keeps every core busy until destroyed.
class CpuLoad {
 public:
  CpuLoad() {
    const unsigned n = std::max(1u, std::thread::hardware_concurrency());
    for (unsigned i = 0; i < n; ++i) {
      threads_.emplace_back([this] {
        volatile uint64_t x = 0;
        while (!stop_) x = x + 1;
      });
    }
  }
  ~CpuLoad() {
    stop_ = true;
    for (std::thread& t : threads_) t.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

struct Job {
  int index = 0;
  std::string command, log;
  pid_t pid = -1;
  Clock::time_point start;
};

// Runs `command` with sh in a process group of its own, its output into `log`.
pid_t Spawn(const std::string& command, const std::string& log) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) ::_exit(126);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

// `jobs` launches, `parallel` at a time, beside a full CPU load; fails naming every job that hung
// or failed.
void RunLaunches(int jobs, int parallel) {
  CpuLoad load;
  std::vector<Job> running;
  int started = 0, passed = 0;
  std::vector<std::string> problems;
  double slowest = 0;
  auto describe = [](const Job& j, const std::string& what) {
    return what + ": job " + std::to_string(j.index) + ": " + j.command + "\n" + dt::testing::ReadFileBytes(j.log);
  };
  while (started < jobs || !running.empty()) {
    while (started < jobs && static_cast<int>(running.size()) < parallel) {
      Job j;
      j.index = started++;
      const int nproc = 2 + j.index % 3;
      const char* backend = (j.index / 3) % 2 == 0 ? "gloo" : "shm";
      j.log = Scratch("job" + std::to_string(j.index) + ".log");
      j.command = std::string("DT_BACKEND=") + backend + " DT_TIMEOUT_MS=" + std::to_string(kTimeoutMs) +
                  " DT_JOB_ID=stress-" + std::to_string(::getpid()) + "-" + std::to_string(j.index) + " " DT_DTRUN
                  " --nproc-per-node " + std::to_string(nproc) + " --grace-period " + std::to_string(kGraceS) +
                  " " DT_FAULT_WORKER " launch 0";
      j.start = Clock::now();
      j.pid = Spawn(j.command, j.log);
      ASSERT_GT(j.pid, 0);
      running.push_back(j);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (size_t i = 0; i < running.size();) {
      Job& j = running[i];
      int status = 0;
      const pid_t r = ::waitpid(j.pid, &status, WNOHANG);
      const double seconds = std::chrono::duration<double>(Clock::now() - j.start).count();
      if (r == j.pid) {
        slowest = std::max(slowest, seconds);
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (ok) {
          ++passed;
        } else {
          problems.push_back(describe(j, "failed (status " + std::to_string(status) + ")"));
        }
        running.erase(running.begin() + static_cast<long>(i));
        continue;
      }
      if (Clock::now() - j.start > kDeadline) {
        ::kill(-j.pid, SIGKILL);  // dtrun; its ranks die with it (PR_SET_PDEATHSIG)
        ::waitpid(j.pid, &status, 0);
        problems.push_back(describe(j, "HUNG: still running after " + std::to_string(seconds) + " s"));
        running.erase(running.begin() + static_cast<long>(i));
        continue;
      }
      ++i;
    }
  }
  std::printf("launch stress: %d of %d jobs passed, %zu hung or failed; the slowest took %.1f s\n", passed, jobs,
              problems.size(), slowest);
  for (const std::string& p : problems) ADD_FAILURE() << p;
}

TEST(LaunchStress, JobsStartedTogetherBesideCpuLoadEndInTime) { RunLaunches(30, 3); }

TEST(LaunchSoak, TwoHundredJobsStartedTogetherBesideCpuLoadEndInTime) { RunLaunches(200, 4); }

}  // namespace
}  // namespace dt
