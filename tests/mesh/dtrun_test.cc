// dtrun: the environment it gives each rank, output prefixes, exit status, failure propagation,
// signal forwarding, the grace period, that no process outlives it, and that concurrent launches
// cannot lose their store's port to another process (Note [dtrun holds the store's port]).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <future>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "dtensor/tests/mesh/process_runner.h"

namespace dt {
namespace {

using testing::RunCommand;

const std::string kDtrun = DT_DTRUN;

// Running or sleeping; a zombie is dead (this machine's PID 1 does not reap orphans).
bool Alive(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_field, comm, state;
  if (!(stat >> pid_field >> comm >> state)) return false;
  return state != "Z" && state != "X";
}

TEST(Dtrun, GivesEachRankItsEnvironmentAndPrefixesItsOutput) {
  auto r = RunCommand(kDtrun + " --nproc-per-node 2 sh -c "
                      "'echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $NODE_RANK $MASTER_ADDR $MASTER_PORT; "
                      "echo oops >&2'");
  EXPECT_EQ(r.status, 0) << r.output;
  std::smatch m0, m1;
  ASSERT_TRUE(std::regex_search(r.output, m0, std::regex(R"(\[rank 0\] 0 2 0 2 0 127\.0\.0\.1 (\d+)\n)"))) << r.output;
  ASSERT_TRUE(std::regex_search(r.output, m1, std::regex(R"(\[rank 1\] 1 2 1 2 0 127\.0\.0\.1 (\d+)\n)"))) << r.output;
  EXPECT_EQ(m0[1], m1[1]);  // one free port for the job
  EXPECT_GT(std::stoi(m0[1]), 0);
  EXPECT_NE(r.output.find("[rank 1] oops\n"), std::string::npos) << r.output;
}

TEST(Dtrun, MultiNodeFlags) {
  auto r = RunCommand(kDtrun + " --nnodes 2 --node-rank 1 --master-addr 10.1.2.3 --master-port 29511 "
                      "--nproc-per-node 2 sh -c 'echo $RANK/$WORLD_SIZE local $LOCAL_RANK node $NODE_RANK "
                      "of $GROUP_WORLD_SIZE at $MASTER_ADDR:$MASTER_PORT'");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 2] 2/4 local 0 node 1 of 2 at 10.1.2.3:29511"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 3] 3/4 local 1 node 1 of 2 at 10.1.2.3:29511"), std::string::npos) << r.output;
}

TEST(Dtrun, ExitsWithTheFailingRanksStatusAndStopsTheOthers) {
  auto r = RunCommand(kDtrun + " --nproc-per-node 3 sh -c 'if [ $RANK = 1 ]; then sleep 0.2; exit 7; fi; sleep 30'");
  EXPECT_EQ(r.status, 7) << r.output;
  EXPECT_NE(r.output.find("dtrun: rank 1"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 5) << r.output;
}

// Note [dtrun waits with deadlines]: a rank that exits while a process it started still holds its
// output does not keep dtrun (and whoever waits for dtrun) waiting: 2 s later dtrun names the
// rank, kills its process group and ends.
TEST(Dtrun, EndsWhenARankLeavesAProcessHoldingItsOutput) {
  auto r = RunCommand(kDtrun + " --nproc-per-node 2 sh -c 'echo started; if [ $RANK = 1 ]; then sleep 60 & fi; exit 0'");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 1] started"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dtrun: rank 1 exited, but its stdout is still open 2 s later: a process it started "
                          "holds it; killing rank 1's process group"),
            std::string::npos)
      << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
}

TEST(Dtrun, RankKilledBySignal) {
  auto r = RunCommand(kDtrun + " --nproc-per-node 2 sh -c 'if [ $RANK = 0 ]; then kill -SEGV $$; fi; sleep 30'");
  EXPECT_EQ(r.status, 128 + SIGSEGV) << r.output;
  EXPECT_LT(r.seconds, 5) << r.output;
}

TEST(Dtrun, ASigtermToARankThatIsStillStartingIsNeitherDtrunsNorLost) {
  // Rank 0 fails at once, while dtrun may still be starting the others: the SIGTERM that stops
  // them can land between fork() and exec(). It must kill that rank (no wait for the grace
  // period) and must not be reported as a signal dtrun received (See Note [dtrun signals around
  // fork] in tools/dtrun.cc). Several tries, since the window is short.
  for (int i = 0; i < 8; ++i) {
    auto r = RunCommand(kDtrun + " --nproc-per-node 8 --grace-period 30 sh -c "
                        "'if [ $RANK = 0 ]; then exit 3; fi; exec sleep 60'");
    EXPECT_EQ(r.status, 3) << r.output;
    EXPECT_EQ(r.output.find("got signal"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("grace period"), std::string::npos) << r.output;
    EXPECT_LT(r.seconds, 15) << r.output;
    auto f = RunCommand(kDtrun + " --nproc-per-node 4 false");
    EXPECT_EQ(f.status, 1) << f.output;
    EXPECT_EQ(f.output.find("got signal"), std::string::npos) << f.output;
  }
}

TEST(Dtrun, KillsRanksThatIgnoreSigtermAfterTheGracePeriod) {
  auto r = RunCommand(kDtrun + " --nproc-per-node 2 --grace-period 1 sh -c "
                      "'trap \"\" TERM; if [ $RANK = 1 ]; then sleep 0.5; exit 3; fi; sleep 30'");
  EXPECT_EQ(r.status, 3) << r.output;
  EXPECT_NE(r.output.find("grace period"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 6) << r.output;
}

TEST(Dtrun, ForwardsSigintAndLeavesNoProcessBehind) {
  // Each rank starts a background sleep (a grandchild) and reports its pid; SIGINT to dtrun must
  // end the ranks and their children.
  // The ranks must have set their trap (they print "child" after it) before the SIGINT comes.
  auto r = RunCommand("sh -c 'out=$(mktemp); " + kDtrun + " --nproc-per-node 2 sh -c \"trap \\\"echo got INT; "
                      "exit 1\\\" INT; sleep 300 & echo child \\$!; wait\" > $out 2>&1 & d=$!; "
                      "for i in $(seq 1 300); do [ $(grep -c child $out) -ge 2 ] && break; sleep 0.1; done; "
                      "kill -INT $d; wait $d; echo dtrun=$?; cat $out; rm -f $out'");
  EXPECT_NE(r.output.find("dtrun=130"), std::string::npos) << r.output;
  std::smatch m;
  std::string rest = r.output;
  int children = 0;
  while (std::regex_search(rest, m, std::regex(R"(\[rank \d\] child (\d+))"))) {
    const int pid = std::stoi(m[1]);
    EXPECT_FALSE(Alive(pid)) << "process " << pid << " outlived dtrun";
    ++children;
    rest = m.suffix();
  }
  EXPECT_EQ(children, 2) << r.output;
}

TEST(Dtrun, BadCommandLines) {
  EXPECT_EQ(RunCommand(kDtrun + " echo hi").status, 2);
  EXPECT_EQ(RunCommand(kDtrun + " --nproc-per-node 0 echo hi").status, 2);
  EXPECT_EQ(RunCommand(kDtrun + " --nproc-per-node 2").status, 2);
  EXPECT_EQ(RunCommand(kDtrun + " --nproc-per-node 2 --nnodes 2 echo hi").status, 2);  // needs a port
  EXPECT_EQ(RunCommand(kDtrun + " --nproc-per-node 1 /nonexistent/program").status, 127);
}

// Loopback churn that squats on free ports: it walks the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range, where port-0 binds come from), binds and listens on
// each port that is free and keeps the last 1024 open. A port that a launcher finds free and
// releases again before its store listens is taken within a pass, and its store then cannot
// listen or its ranks reach a stranger: the race of Note [dtrun holds the store's port], which
// this makes likely instead of rare.
class PortSquatter {
 public:
  PortSquatter() : thread_([this] { Run(); }) {}
  ~PortSquatter() {
    stop_ = true;
    thread_.join();
  }
  int bound() const { return bound_; }

 private:
  void Run() {
    int lo = 32768, hi = 60999;
    std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> lo >> hi;
    std::vector<int> held(1024, -1);
    size_t next = 0;
    for (int port = lo; !stop_; port = port >= hi ? lo : port + 1) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_ANY);
      addr.sin_port = htons(static_cast<uint16_t>(port));
      if (fd < 0) continue;
      if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 4) != 0) {
        ::close(fd);
        continue;
      }
      ++bound_;
      if (held[next] >= 0) ::close(held[next]);
      held[next] = fd;
      next = (next + 1) % held.size();
    }
    for (int fd : held) {
      if (fd >= 0) ::close(fd);
    }
  }
  std::atomic<bool> stop_{false};
  std::atomic<int> bound_{0};
  std::thread thread_;
};

// Two 4-rank jobs at a time, 50 times, beside the squatter: every job rendezvouses through its
// store and sums over shm; none may fail or hang (each is killed after 60 s, which a hang would
// hit). With a launcher that probes a free port and closes it, most rounds fail here.
TEST(DtrunStore, ConcurrentLaunchesUnderPortChurnNeverHang) {
  PortSquatter squatter;
  const std::string job = "DT_BACKEND=shm DT_TIMEOUT_MS=20000 timeout -s KILL 60 " + kDtrun +
                          " --nproc-per-node 4 " DT_FAULT_WORKER " backend 0";
  for (int round = 0; round < 50; ++round) {
    std::vector<std::future<testing::ProcessResult>> jobs;
    for (int k = 0; k < 2; ++k) jobs.push_back(std::async(std::launch::async, [&] { return RunCommand(job); }));
    for (auto& f : jobs) {
      const testing::ProcessResult r = f.get();
      ASSERT_EQ(r.status, 0) << "round " << round << " (" << r.seconds << " s): " << r.output;
      for (int rank = 0; rank < 4; ++rank) {
        EXPECT_NE(r.output.find("FAULT-REPORT rank=" + std::to_string(rank) + " code=OK"), std::string::npos)
            << "round " << round << ": " << r.output;
      }
    }
  }
  EXPECT_GT(squatter.bound(), 1000);
}

}  // namespace
}  // namespace dt
