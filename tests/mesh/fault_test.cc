// Faults across processes: a rank that dies mid-collective, one that never arrives, one that never
// creates a group, mismatched arguments — under dtrun (shm, gloo) and mpirun (mpi). Every survivor must
// get an error naming the collective, the group and (where the backend can know) the missing rank,
// within the timeout; the launcher must end the job with a non-zero status; nothing may hang.

#include <dirent.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "dtensor/tests/mesh/process_runner.h"

namespace dt {
namespace {

using testing::ReportOf;
using testing::RunCommand;

constexpr int kTimeoutMs = 3000;

std::string Gloo(const std::string& args, int nproc = 3) {
  return "DT_BACKEND=gloo DT_TIMEOUT_MS=" + std::to_string(kTimeoutMs) + " " DT_DTRUN " --nproc-per-node " +
         std::to_string(nproc) + " --grace-period 20 " DT_FAULT_WORKER " " + args;
}
// shm: every run gets a job id of its own, so that the test can check that no segment of it is left.
std::string g_job;
std::string Shm(const std::string& args, int nproc = 3, double grace_s = 20) {
  static int runs = 0;
  g_job = "faulttest-" + std::to_string(::getpid()) + "-" + std::to_string(runs++);
  return "DT_BACKEND=shm DT_JOB_ID=" + g_job + " DT_TIMEOUT_MS=" + std::to_string(kTimeoutMs) + " " DT_DTRUN
         " --nproc-per-node " + std::to_string(nproc) + " --grace-period " + std::to_string(grace_s) + " " DT_FAULT_WORKER
         " " + args;
}
// The names in /dev/shm of the last Shm() run's segments.
std::vector<std::string> SegmentsLeft() {
  std::vector<std::string> left;
  const std::string prefix = "dtshm." + g_job + ".";
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (const dirent* e = ::readdir(dir)) {
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) left.push_back(e->d_name);
    }
    ::closedir(dir);
  }
  return left;
}
// Every segment was unlinked by the ranks themselves: none left, none that dtrun had to remove.
void ExpectNoSegmentLeft(const std::string& output) {
  EXPECT_TRUE(SegmentsLeft().empty()) << "left in /dev/shm: " << SegmentsLeft().front();
  EXPECT_EQ(output.find("shared-memory segment"), std::string::npos) << output;
}

// OpenMPI leaks a little at MPI_Finalize: keep LeakSanitizer (the asan preset) out of it.
std::string Mpi(const std::string& args) {
  return "ASAN_OPTIONS=detect_leaks=0 DT_BACKEND=mpi DT_TIMEOUT_MS=" + std::to_string(kTimeoutMs) + " " DT_MPIEXEC
         " --allow-run-as-root --oversubscribe -np 3 " DT_FAULT_WORKER " " + args;
}

void ExpectContains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "missing '" << part << "' in: " << text;
}

// A survivor of a death reports it at once (UNAVAILABLE: a socket broke) or, where gloo leaves a
// transfer to a gone peer pending, at its timeout (DEADLINE_EXCEEDED; see Note [Gloo backend]);
// either way within the timeout plus the diagnosis (about a second), naming what died.
void ExpectDeathReport(const std::string& report) {
  const bool unavailable = report.find("code=UNAVAILABLE") != std::string::npos;
  const bool deadline = report.find("code=DEADLINE_EXCEEDED") != std::string::npos;
  EXPECT_TRUE(unavailable || deadline) << report;
  const size_t at = report.find("elapsed_ms=");
  ASSERT_NE(at, std::string::npos) << report;
  EXPECT_LT(std::stol(report.substr(at + 11)), kTimeoutMs + 2000) << report;
}

// The report of each of `ranks` says every one of `parts`; with `death`, each also reports a death
// in time (ExpectDeathReport).
void ExpectReportsSay(const std::string& output, const std::vector<int>& ranks,
                      const std::vector<std::string>& parts, bool death = false) {
  for (int rank : ranks) {
    const std::string report = ReportOf(output, rank);
    for (const std::string& part : parts) ExpectContains(report, part);
    if (death) ExpectDeathReport(report);
  }
}

// A backend's group over `group`, as every report names it: "<backend> group <group>, global rank
// <rank>: <what>".
std::string Where(const std::string& backend, int rank, const std::string& what,
                  const std::string& group = "[0, 1, 2]") {
  return backend + " group " + group + ", global rank " + std::to_string(rank) + ": " + what;
}

// The gloo and shm scenarios below run the same worker command on either backend under dtrun.
std::string Dtrun(const std::string& backend, const std::string& args, int nproc = 3) {
  return backend == "shm" ? Shm(args, nproc) : Gloo(args, nproc);
}

// A rank dies (the worker's `args`: "die N", "die-views N") in `op`: the job ends with the victim's
// abort(), passed on by dtrun, and every survivor reports the death in time naming its group,
// itself, `op` and `died`. shm sees a death only at its peer check: always UNAVAILABLE.
testing::ProcessResult RankDies(const std::string& backend, const std::string& args, const std::string& op,
                                const std::vector<int>& survivors, const std::string& died) {
  auto r = RunCommand(Dtrun(backend, args));
  EXPECT_EQ(r.status, 128 + 6) << r.output;
  for (int rank : survivors) {
    const std::string report = ReportOf(r.output, rank);
    if (backend == "shm") ExpectContains(report, "code=UNAVAILABLE");
    ExpectDeathReport(report);
    ExpectContains(report, Where(backend, rank, op));
    ExpectContains(report, died);
  }
  return r;
}

// Two ranks SIGKILLed at the same moment: every survivor names both, whichever death it saw
// first (a few tries: which one a survivor sees first varies).
void TwoRanksKilledAtOnce(const std::string& backend) {
  for (int run = 0; run < 3; ++run) {
    auto r = RunCommand(Dtrun(backend, "kill 3,4", 5));
    EXPECT_EQ(r.status, 128 + 9) << r.output;
    ExpectReportsSay(r.output, {0, 1, 2}, {"all_reduce #1", "global rank(s) [3, 4] died"}, /*death=*/true);
    EXPECT_LT(r.seconds, 15) << r.output;
    if (backend == "shm") ExpectNoSegmentLeft(r.output);
  }
}

// Rank 1 never reaches `op`: ranks 0 and 2 time out there, naming it where the backend can know
// (`missing`, empty where it cannot).
void ExpectNeverArrived(const std::string& output, const std::string& backend, const std::string& op,
                        const std::string& missing) {
  for (int rank : {0, 2}) {
    const std::string report = ReportOf(output, rank);
    ExpectContains(report, "code=DEADLINE_EXCEEDED");
    ExpectContains(report, Where(backend, rank, op));
    if (!missing.empty()) ExpectContains(report, missing);
    ExpectContains(report, "timed out after 3000 ms");
  }
}

// Rank 0 never creates the group [2, 1, 0]: the others time out creating it, naming rank 0.
void ExpectGroupNeverCreated(const std::string& output, const std::string& backend) {
  for (int rank : {1, 2}) {
    const std::string report = ReportOf(output, rank);
    ExpectContains(report, "code=DEADLINE_EXCEEDED");
    ExpectContains(report, Where(backend, rank, "creating the group", "[2, 1, 0]"));
    ExpectContains(report, "global rank(s) [0] did not join within 3000 ms");
  }
}

// Rank 1 is stopped (SIGSTOP) after all_reduce #0 (`stop`) or before it makes its world
// (`stop-early`): ranks 0 and 2 time out, naming it (`names`, where the backend can know), and
// report within the timeout + 2 s although they report only after destroying their world: rank
// 0's store server does not hold its report back waiting for the stopped rank's connection to
// close (Note [The store lingers in the background] in mesh/tcp_store.cc; issue 45 measured 10 s).
void ExpectStoppedRankReportedInTime(const std::string& output, const std::vector<std::string>& names) {
  for (int rank : {0, 2}) {
    const std::string report = ReportOf(output, rank);
    ExpectContains(report, "code=DEADLINE_EXCEEDED");
    for (const std::string& name : names) ExpectContains(report, name);
    const size_t at = report.find("elapsed_ms=");
    ASSERT_NE(at, std::string::npos) << report;
    EXPECT_LT(std::stol(report.substr(at + 11)), kTimeoutMs + 2000) << report;
  }
}

// Rank 2 passes fewer elements: every rank gets INVALID_ARGUMENT saying `what`.
void ExpectSizeMismatch(const std::string& output,
                        const std::string& what = "ranks disagree on the input size: global rank 0 passed 1024 "
                                                  "elements, global rank 2 passed 1000 elements") {
  ExpectReportsSay(output, {0, 1, 2}, {"code=INVALID_ARGUMENT", what});
}

TEST(GlooFaults, RankDiesMidCollective) {
  auto r = RankDies("gloo", "die 2", "all_reduce #1", {0, 1}, "global rank(s) [2] died");
  ExpectContains(r.output, "dtrun: rank 2");
  EXPECT_LT(r.seconds, 15) << r.output;
}

TEST(GlooFaults, RankDiesMidAllToAllViews) {
  auto r = RankDies("gloo", "die-views 1", "all_to_all_views #1", {0, 2}, "global rank(s) [1] died");
  EXPECT_LT(r.seconds, 15) << r.output;
}

TEST(GlooFaults, SurvivorsNameEveryRankThatDiedAtOnce) { TwoRanksKilledAtOnce("gloo"); }

TEST(GlooFaults, RankNeverArrives) {
  auto r = RunCommand(Gloo("absent 1"));
  ExpectNeverArrived(r.output, "gloo", "all_reduce #1", "global rank(s) [1] never reached it");
  EXPECT_LT(r.seconds, 20) << r.output;
}

TEST(GlooFaults, StoppedRankIsReportedInTimeAlsoAfterTheWorldIsGone) {
  auto r = RunCommand(Gloo("stop 1"));
  ExpectStoppedRankReportedInTime(
      r.output, {"all_reduce #1", "global rank(s) [1] not answering", "global rank(s) [1] never reached it",
                 "timed out after 3000 ms"});
  EXPECT_LT(r.seconds, 20) << r.output;
}

TEST(GlooFaults, RankStoppedBeforeItsWorldIsNamedInTime) {
  auto r = RunCommand(Gloo("stop-early 1"));
  ExpectStoppedRankReportedInTime(r.output, {"creating the group", "global rank(s) [1] did not join within 3000 ms"});
  EXPECT_LT(r.seconds, 20) << r.output;
}

TEST(GlooFaults, MemberNeverCreatesTheGroup) { ExpectGroupNeverCreated(RunCommand(Gloo("nogroup 0")).output, "gloo"); }

TEST(GlooFaults, MismatchedSizesAreInvalidArgumentEverywhere) {
  auto r = RunCommand("DT_VERIFY_COLLECTIVES=1 " + Gloo("mismatch 2"));
  EXPECT_EQ(r.status, 0) << r.output;
  ExpectSizeMismatch(r.output);
}

TEST(GlooFaults, WithoutVerificationGlooItselfKillsTheJob) {
  // gloo's default. Documented: gloo's own size check throws on its I/O thread, which terminates
  // the process; dtrun then ends the job. No hang either way.
  auto r = RunCommand(Gloo("mismatch 2"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_LT(r.seconds, 20) << r.output;
}

// shm: a survivor sees a death at its next check of the peers (every 20 ms while it sleeps) plus
// the 200 ms it waits for others dying with it; bounded here by the timeout, as on gloo.
TEST(ShmFaults, RankDiesMidCollective) {
  auto r = RankDies("shm", "die 2", "all_reduce #1", {0, 1}, "global rank(s) [2] died (process gone)");
  ExpectContains(r.output, "dtrun: rank 2");
  EXPECT_LT(r.seconds, 15) << r.output;
  ExpectNoSegmentLeft(r.output);
}

TEST(ShmFaults, RankDiesMidAllToAllViews) {
  auto r = RankDies("shm", "die-views 1", "all_to_all_views #1", {0, 2}, "global rank(s) [1] died");
  ExpectNoSegmentLeft(r.output);
}

TEST(ShmFaults, SurvivorsNameEveryRankThatDiedAtOnce) { TwoRanksKilledAtOnce("shm"); }

TEST(ShmFaults, RankNeverArrives) {
  auto r = RunCommand(Shm("absent 1"));
  ExpectNeverArrived(r.output, "shm", "all_reduce #1", "global rank(s) [1] never reached it");
  EXPECT_LT(r.seconds, 20) << r.output;
  ExpectNoSegmentLeft(r.output);
}

TEST(ShmFaults, StoppedRankIsReportedInTimeAlsoAfterTheWorldIsGone) {
  auto r = RunCommand(Shm("stop 1"));
  ExpectStoppedRankReportedInTime(r.output, {"all_reduce #1", "global rank(s) [1] never reached it",
                                             "timed out after 3000 ms"});
  EXPECT_LT(r.seconds, 20) << r.output;
  ExpectNoSegmentLeft(r.output);
}

TEST(ShmFaults, RankStoppedBeforeItsWorldIsNamedInTime) {
  auto r = RunCommand(Shm("stop-early 1"));
  ExpectStoppedRankReportedInTime(r.output, {"creating the group", "global rank(s) [1] did not join within 3000 ms"});
  EXPECT_LT(r.seconds, 20) << r.output;
  ExpectNoSegmentLeft(r.output);
}

TEST(ShmFaults, RankDestroysItsCommunicator) {
  auto r = RunCommand(Shm("leave 1"));
  ExpectReportsSay(r.output, {0, 2},
                   {"code=UNAVAILABLE", "global rank(s) [1] left (its communicator was destroyed)"},
                   /*death=*/true);
  ExpectNoSegmentLeft(r.output);
}

TEST(ShmFaults, MemberNeverCreatesTheGroup) {
  auto r = RunCommand(Shm("nogroup 0"));
  ExpectGroupNeverCreated(r.output, "shm");
  ExpectNoSegmentLeft(r.output);
}

TEST(ShmFaults, MismatchedSizesAreInvalidArgumentEverywhereAlways) {
  // shm compares the arguments from the segment in every collective, verification or not.
  auto r = RunCommand(Shm("mismatch 2"));
  EXPECT_EQ(r.status, 0) << r.output;
  ExpectSizeMismatch(r.output);
  ExpectNoSegmentLeft(r.output);
}

TEST(ShmFaults, DtrunRemovesASegmentLeftByADeadRank) {
  auto r = RunCommand(Shm("leak 1", 3, /*grace_s=*/1));
  EXPECT_EQ(r.status, 128 + 6) << r.output;
  ExpectContains(r.output, "dtrun: removed 1 shared-memory segment(s) the job left in /dev/shm");
  EXPECT_TRUE(SegmentsLeft().empty()) << SegmentsLeft().front();
}

TEST(ShmFaults, FullDevShmFallsBackToGloo) {
  // A /dev/shm of 64 KiB (a private mount namespace with a tmpfs of its own; needs root): the
  // segment cannot be made, every member learns so through the store, and the group runs on gloo
  // with one line on stderr. No crash (the pages are reserved up front, so no SIGBUS), no leak.
  if (RunCommand("unshare -m true").status != 0) GTEST_SKIP() << "no mount namespaces here (not root?)";
  const std::string cmd = Shm("backend 0", 2);
  auto r = RunCommand("unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs /dev/shm && " + cmd + "'");
  EXPECT_EQ(r.status, 0) << r.output;
  ExpectContains(r.output, "cannot use shared memory");
  ExpectContains(r.output, "this group uses gloo");
  for (int rank : {0, 1}) {
    ExpectContains(ReportOf(r.output, rank), "code=OK");
    ExpectContains(r.output, "BACKEND rank=" + std::to_string(rank) + " world=shm group=gloo");
  }
}

TEST(MpiFaults, RankDiesMpirunEndsTheJob) {
  // mpirun kills the survivors as soon as a rank dies: no report, a non-zero status, no hang.
  auto r = RunCommand(Mpi("die 2"));
  EXPECT_NE(r.status, 0) << r.output;
  ExpectContains(r.output, "exited on signal 6");
  EXPECT_LT(r.seconds, 20) << r.output;
}

TEST(MpiFaults, RankNeverArrives) {
  auto r = RunCommand(Mpi("absent 1"));
  ExpectNeverArrived(r.output, "mpi", "all_reduce #1", "");
  EXPECT_NE(r.status, 0) << r.output;  // the survivors leave without MPI_Finalize
  EXPECT_LT(r.seconds, 20) << r.output;
}

TEST(MpiFaults, RankNeverArrivesAtAllToAllViews) {
  auto r = RunCommand(Mpi("absent-views 1"));
  ExpectNeverArrived(r.output, "mpi", "all_to_all_views #1", "");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_LT(r.seconds, 20) << r.output;
}

// mpi has no store of ours: the stopped rank is a timeout like any absent one, and destroying the
// world adds nothing to the report's time.
TEST(MpiFaults, StoppedRankIsReportedInTimeAlsoAfterTheWorldIsGone) {
  auto r = RunCommand(Mpi("stop 1"));
  ExpectStoppedRankReportedInTime(r.output, {"all_reduce #1", "timed out after 3000 ms"});
  EXPECT_LT(r.seconds, 20) << r.output;
}

TEST(MpiFaults, MemberNeverCreatesTheGroup) {
  auto r = RunCommand(Mpi("nogroup 0"));
  ExpectReportsSay(r.output, {1, 2},
                   {"code=DEADLINE_EXCEEDED", "creating the group: not every member called Group() within 3000 ms"});
  EXPECT_LT(r.seconds, 20) << r.output;
}

TEST(MpiFaults, MismatchedSizesAreInvalidArgumentEverywhere) {
  auto r = RunCommand(Mpi("mismatch 2"));
  EXPECT_EQ(r.status, 0) << r.output;
  ExpectSizeMismatch(r.output, "ranks disagree on the input size");
}

}  // namespace
}  // namespace dt
