// One rank of a fault scenario, run under dtrun (gloo) or mpirun (mpi) by fault_test.cc:
//
//   fault_worker die V       rank V starts a large all_reduce and abort()s while it runs
//   fault_worker kill V,W    ranks V and W start it and SIGKILL themselves, at about the same moment
//   fault_worker absent V    rank V never calls the second all_reduce (alive, sleeping)
//   fault_worker nogroup V   rank V never creates the group the others create
//   fault_worker mismatch V  rank V passes a different size to all_reduce
//   fault_worker die-views V, absent-views V   the same as die/absent with a large all_to_all_views
//                            (strided blocks) instead of the second all_reduce
//   fault_worker leave V     rank V destroys its world (and so its communicators), then sleeps
//   fault_worker leak V      rank V leaves a segment name in /dev/shm (as a rank killed between
//                            creating a group's segment and unlinking it would) and abort()s
//   fault_worker stop V      rank V stops itself (SIGSTOP: alive, answering nothing, closing no
//                            connection) after all_reduce #0; the others run all_reduce #1, then
//                            destroy their world (rank 0's store with it) and only then report, as
//                            a program that returns its error from the function owning the world
//                            does: the report's time includes the world's shutdown
//   fault_worker stop-early V  rank V stops itself before it makes its world; the others make
//                            theirs and its world group, then report the same way
//                            (a stopped victim is continued after the timeout + 4 s and exits 0)
//   fault_worker launch V    no fault (V unused): the stress test's job (launch_stress_test.cc):
//                            the world group and a second group, a few collectives checked, a
//                            report per rank, and a normal exit (the world goes at main's return)
//   fault_worker backend V   no fault: every rank reports its world group's backend and an
//                            all_reduce (code=OK when the sum is right) as
//                            FAULT-REPORT ... msg=backend=<name>
// The shm backend runs a collective on the calling thread (its ...Async returns finished work), so
// there the victims of die/kill/die-views die from a thread a few milliseconds into the collective.
// Every other rank prints one line
//   FAULT-REPORT rank=R code=CODE elapsed_ms=T msg=MESSAGE
// and exits 0. Survivors ignore SIGTERM so that they can report before the launcher's SIGKILL.

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "dtensor/mesh/world.h"

namespace {

void Report(int rank, const absl::Status& st, std::chrono::steady_clock::time_point start) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  std::printf("FAULT-REPORT rank=%d code=%s elapsed_ms=%lld msg=%s\n", rank,
              absl::StatusCodeToString(st.code()).c_str(), static_cast<long long>(ms.count()),
              std::string(st.message()).c_str());
  std::fflush(stdout);
}

// This process's rank as its launcher set it, before any world exists (dtrun, mpirun).
int LaunchRank() {
  for (const char* name : {"RANK", "OMPI_COMM_WORLD_RANK"}) {
    int r = -1;
    if (const char* v = std::getenv(name); v != nullptr && absl::SimpleAtoi(v, &r)) return r;
  }
  return -1;
}

// Stops this process (SIGSTOP) until a child of it continues it, DT_TIMEOUT_MS + 4 s later; then
// leaves at once.
void StopSelf() {
  const char* ms = std::getenv("DT_TIMEOUT_MS");
  const int wait_ms = (ms != nullptr ? std::atoi(ms) : 3000) + 4000;
  const pid_t me = ::getpid();
  if (::fork() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
    ::kill(me, SIGCONT);
    ::_exit(0);
  }
  std::raise(SIGSTOP);
  std::_Exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dt;
  if (argc != 3) {
    std::fprintf(stderr, "usage: fault_worker MODE VICTIM[,VICTIM...] (the modes: tests/mesh/fault_worker.cc)\n");
    return 2;
  }
  const std::string mode = argv[1];
  std::set<int> victims;
  for (absl::string_view v : absl::StrSplit(argv[2], ',')) {
    int r = 0;
    if (absl::SimpleAtoi(v, &r)) victims.insert(r);
  }
  if (victims.empty()) {
    std::fprintf(stderr, "fault_worker: bad victim list '%s'\n", argv[2]);
    return 2;
  }
  const int victim = *victims.begin();
  std::signal(SIGTERM, SIG_IGN);
  const auto launched = std::chrono::steady_clock::now();
  if (mode == "stop-early" && LaunchRank() == victim) StopSelf();
  absl::StatusOr<std::shared_ptr<World>> w = World::FromEnv();
  if (!w.ok() && mode == "stop-early") {
    Report(LaunchRank(), w.status(), launched);
    std::_Exit(0);
  }
  if (!w.ok()) {
    std::fprintf(stderr, "FromEnv: %s\n", std::string(w.status().message()).c_str());
    return 3;
  }
  if (mode == "stop-early") {
    const int me = (*w)->rank();
    absl::Status st = (*w)->WorldGroup().status();
    w->reset();
    Report(me, st, launched);
    return 0;  // a normal exit: rank 0's store serves the others' diagnosis until they leave
  }
  World& world = **w;
  const int me = world.rank();
  CommPtr comm = world.WorldGroup().value();
  Tensor warm = Tensor::Ones({16}).value();
  if (!comm->AllReduce(warm, ReduceOp::kSum).ok()) return 4;  // all_reduce #0: everyone is up
  // A [rows, n*cols] f32 piece whose column blocks go to the peers (S(0) -> S(1)): 32 MiB in all.
  Tensor x, out;  // alive until the report
  auto views_exchange = [&]() -> WorkPtr {
    const int64_t n = world.size(), cols = 1024, rows = (8 << 20) / (n * cols);
    x = Tensor::Ones({rows, n * cols}).value();
    out = Tensor::Empty({n * rows, cols}).value();
    std::vector<TensorViews> send, recv;
    for (int64_t p = 0; p < n; ++p) {
      send.push_back({x.Narrow(1, p * cols, cols).value()});
      recv.push_back({out.Narrow(0, p * rows, rows).value()});
    }
    return comm->AllToAllViewsAsync(std::move(send), std::move(recv));
  };
  // shm: the victim dies from a thread while its own call runs (see the top of this file).
  const bool inline_calls = world.backend() == "shm";
  auto die_during_call = [&](int sig) {
    if (!inline_calls) return;
    std::thread([sig] {
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
      if (sig == SIGABRT) std::abort();
      std::raise(sig);
    }).detach();
  };
  const auto start = std::chrono::steady_clock::now();
  if (mode == "die-views") {
    if (me == victim) die_during_call(SIGABRT);
    WorkPtr work = views_exchange();
    if (me == victim) std::abort();
    Report(me, work->Wait(), start);
  } else if (mode == "absent-views") {
    if (me == victim) {
      std::this_thread::sleep_for(world.timeout() + std::chrono::seconds(2));
      return 0;
    }
    Report(me, views_exchange()->Wait(), start);
  } else if (mode == "die") {
    Tensor big = Tensor::Ones({8 << 20}).value();  // 32 MiB
    if (me == victim) die_during_call(SIGABRT);
    WorkPtr work = comm->AllReduceAsync(big, ReduceOp::kSum);
    // At once: 32 MiB over loopback can finish within a few tens of milliseconds on a quiet machine.
    if (me == victim) std::abort();
    Report(me, work->Wait(), start);
  } else if (mode == "kill") {
    // The victims leave all_reduce #0 within a millisecond of each other and die as they start #1.
    Tensor big = Tensor::Ones({8 << 20}).value();  // 32 MiB
    if (victims.count(me)) die_during_call(SIGKILL);
    WorkPtr work = comm->AllReduceAsync(big, ReduceOp::kSum);
    if (victims.count(me)) std::raise(SIGKILL);
    Report(me, work->Wait(), start);
  } else if (mode == "absent") {
    if (me == victim) {
      std::this_thread::sleep_for(world.timeout() + std::chrono::seconds(2));
      return 0;
    }
    Report(me, comm->AllReduce(warm, ReduceOp::kSum), start);
  } else if (mode == "leave") {
    if (me == victim) {
      const auto linger = world.timeout() + std::chrono::seconds(2);
      comm.reset();
      w->reset();  // the world and its communicators go
      std::this_thread::sleep_for(linger);
      return 0;
    }
    Report(me, comm->AllReduce(warm, ReduceOp::kSum), start);
  } else if (mode == "stop") {
    if (me == victim) StopSelf();
    absl::Status st = comm->AllReduce(warm, ReduceOp::kSum);
    comm.reset();
    w->reset();  // the world goes before the report, rank 0's store server with it
    Report(me, st, start);
  } else if (mode == "leak") {
    if (me == victim) {
      const char* job = std::getenv("DT_JOB_ID");
      const std::string name = std::string("/dev/shm/dtshm.") + (job ? job : "none") + ".leaked-by-test";
      std::FILE* f = std::fopen(name.c_str(), "w");
      if (f != nullptr) std::fclose(f);
      std::abort();
    }
    Report(me, absl::OkStatus(), start);
  } else if (mode == "launch") {
    std::vector<int> reversed(world.size());
    std::iota(reversed.begin(), reversed.end(), 0);
    std::reverse(reversed.begin(), reversed.end());
    absl::StatusOr<CommPtr> second = world.Group(reversed);
    absl::Status st = second.status();
    const int64_t n = world.size();
    for (const CommPtr& c : {comm, second.value_or(nullptr)}) {
      if (!st.ok()) break;
      Tensor x = Tensor::Full({4096}, static_cast<double>(me + 1)).value();
      st = c->AllReduce(x, ReduceOp::kSum);
      if (st.ok() && x.ToVector<float>()[4095] != static_cast<float>(n * (n + 1) / 2)) {
        st = absl::InternalError("wrong sum");
      }
      Tensor all = Tensor::Empty({n * 64}).value();
      if (st.ok()) st = c->AllGather(Tensor::Full({64}, static_cast<double>(me)).value(), all);
      if (st.ok()) st = c->Barrier();
    }
    Report(me, st, start);
    return st.ok() ? 0 : 1;
  } else if (mode == "backend") {
    Tensor x = Tensor::Full({1000}, 1.0).value();
    absl::Status st = comm->AllReduce(x, ReduceOp::kSum);
    if (st.ok() && x.ToVector<float>()[999] != static_cast<float>(world.size())) {
      st = absl::InternalError("wrong sum");
    }
    Report(me, st.ok() ? absl::OkStatus() : st, start);
    std::printf("BACKEND rank=%d world=%s group=%s\n", me, std::string(world.backend()).c_str(),
                std::string(comm->backend()).c_str());
    std::fflush(stdout);
    return st.ok() ? 0 : 1;
  } else if (mode == "nogroup") {
    if (me == victim) {
      std::this_thread::sleep_for(world.timeout() + std::chrono::seconds(2));
      return 0;
    }
    std::vector<int> all(world.size());
    std::iota(all.begin(), all.end(), 0);
    std::reverse(all.begin(), all.end());  // a new group: the world in reverse order
    Report(me, world.Group(all).status(), start);
  } else if (mode == "mismatch") {
    Tensor x = Tensor::Ones({me == victim ? 1000 : 1024}).value();
    absl::Status st = comm->AllReduce(x, ReduceOp::kSum);
    Report(me, st, start);
  } else {
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  }
  std::fflush(stdout);
  // After a timeout a communicator may hold threads that MPI or gloo never release (and MPI must
  // not be finalised): leave at once. A healthy world shuts down normally.
  // Linger while the others diagnose: rank 0 hosts the gloo store, and a rank that leaves without
  // saying goodbye to the store would be reported as dead too — also by a survivor that learns of
  // the failure only at its timeout (see Note [Gloo backend]), hence the timeout plus its diagnosis.
  std::this_thread::sleep_for(mode == "mismatch" ? std::chrono::milliseconds(1500)
                                                 : world.timeout() + std::chrono::milliseconds(1500));
  if (mode != "mismatch") std::_Exit(0);
  return 0;
}
