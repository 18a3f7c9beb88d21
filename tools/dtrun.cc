// dtrun: starts the ranks of one node of a distributed job, like torchrun. `dtrun --help` lists
// the flags; everything from PROG on is the program's own command line.
//
// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK (and torchrun's
// GROUP_RANK), GROUP_WORLD_SIZE (the number of nodes, torchrun's name), MASTER_ADDR and
// MASTER_PORT (a free port when none is given on one node: Note [dtrun holds the store's port]). Its
// stdout/stderr lines are prefixed with "[rank N] ". SIGINT/SIGTERM/SIGHUP are forwarded. When a
// rank fails (non-zero exit or a signal), the others get SIGTERM and, after the grace period
// (default 5 s), SIGKILL; dtrun then exits with the failed rank's status (128+signal for a
// signal). Each rank runs in its own process group, which is what gets signalled, and dies with
// dtrun (PR_SET_PDEATHSIG), so no orphans remain.
//
// Each rank also gets DT_JOB_ID (the caller's, when set: letters, digits, '-' and '_', at most 64;
// else one made here), which names the job's shared-memory segments (/dev/shm/dtshm.<id>.*, the
// shm backend: mesh/shm_backend.cc). The ranks unlink each segment as soon as every member has
// mapped it; when dtrun ends it removes any that a rank dying in between left behind.
//
// Note [dtrun signals around fork]
//   dtrun's signal handler writes the signal number to a self-pipe that the main loop reads. A
//   forked child inherits both the handler and the pipe until it execs, so a signal sent to the
//   child in that window (e.g. the SIGTERM that stops the other ranks when one fails at once)
//   would run dtrun's handler in the child: dtrun would report a signal it never received as its
//   own, and the child would swallow it and live on until the grace period's SIGKILL. So every
//   signal is blocked across fork(); the child resets the handlers and closes the pipe while they
//   are blocked, and only then unblocks them (a pending SIGTERM then kills it at once), then execs.
//
// Note [dtrun holds the store's port]
//   When dtrun picks MASTER_PORT itself (one node, no --master-port), it does not probe for a free
//   port and close it again: another process could take the port before rank 0 listens on it, and
//   the ranks would then wait on a stranger (seen as launches stuck in the store's connect while
//   other jobs ran). dtrun binds and listens on port 0 before any rank starts and hands that
//   listening socket to global rank 0 as an inherited file descriptor named by DT_STORE_FD; rank 0
//   serves its store on it (mesh/tcp_store.cc, TcpStoreServer::Adopt), and connections that the
//   other ranks make before rank 0 is up wait in the socket's backlog. The port is never free
//   between the pick and the store. A program that serves no store ignores DT_STORE_FD; one that
//   binds MASTER_PORT itself needs --master-port. With --master-port the user owns the port and
//   rank 0 binds it (a port in use is then an error naming it).
//
// Note [dtrun waits with deadlines]
//   dtrun blocks in one place, its poll loop, and every way out of it has a deadline: a failing
//   rank or a signal starts the grace period, after which the ranks are SIGKILLed; and once every
//   rank has exited, their output pipes get kDrain to reach their end. A pipe still open then is
//   held by a process a rank started and left behind (the rank's own process group, or a daemon);
//   dtrun names the rank, kills its process group and stops reading, instead of waiting for that
//   process to end (which may be never). The ranks' own waits are theirs: every collective and
//   rendezvous has the world's timeout (docs/mesh.md, "Every wait has a deadline").
//
// Note [dtrun exit status]
//   all ranks exit 0              -> 0
//   first failing rank exits k    -> k
//   first failing rank killed by s -> 128 + s
//   dtrun got SIGINT/SIGTERM (s)  -> 128 + s (after the ranks are gone)
//   bad command line              -> 2

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "dtensor/tools/flags.h"

ABSL_FLAG(int, nproc_per_node, 0, "ranks to start on this node (required)");
ABSL_FLAG(int, nnodes, 1, "nodes of the job; each runs its own dtrun");
ABSL_FLAG(int, node_rank, 0, "this node's index in [0, nnodes)");
ABSL_FLAG(std::string, master_addr, "127.0.0.1", "the address of node 0, where rank 0 serves the job's store");
ABSL_FLAG(int, master_port, 0,
          "the store's port; 0 (one node only): dtrun picks a free one and holds it for rank 0");
ABSL_FLAG(double, grace_period, 5.0,
          "seconds between SIGTERM and SIGKILL for the other ranks when one fails or dtrun is signalled");

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int nproc = 0;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  double grace_s = 5.0;
  std::vector<std::string> argv;
};

// How long the output pipes may stay open after every rank has exited (Note [dtrun waits with
// deadlines]).
constexpr auto kDrain = std::chrono::seconds(2);

constexpr const char* kUsage =
    "usage: dtrun --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P]\n"
    "             [--grace-period SECONDS] PROG ARGS...\n"
    "starts the N ranks of one node of a distributed job, like torchrun (tools/dtrun.cc)";

std::optional<Options> Parse(int argc, char** argv) {
  std::vector<std::string> positional =
      dt::cli::ParseFlags(argc, argv, kUsage, {.stop_at_positional = true});
  Options o;
  o.nproc = absl::GetFlag(FLAGS_nproc_per_node);
  o.nnodes = absl::GetFlag(FLAGS_nnodes);
  o.node_rank = absl::GetFlag(FLAGS_node_rank);
  o.master_addr = absl::GetFlag(FLAGS_master_addr);
  o.master_port = absl::GetFlag(FLAGS_master_port);
  o.grace_s = absl::GetFlag(FLAGS_grace_period);
  o.argv.assign(positional.begin() + 1, positional.end());
  auto bad = [](const char* why) {
    std::fprintf(stderr, "dtrun: %s (see dtrun --help)\n", why);
    return std::nullopt;
  };
  if (o.nproc <= 0) return bad("--nproc-per-node N (N >= 1) is required");
  if (o.nnodes <= 0) return bad("--nnodes must be at least 1");
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) return bad("--node-rank must be in [0, --nnodes)");
  if (o.master_port < 0 || o.master_port > 65535) return bad("--master-port must be a TCP port (1-65535)");
  if (o.grace_s < 0) return bad("--grace-period must not be negative");
  if (o.argv.empty()) return bad("no program to run");
  if (o.nnodes > 1 && o.master_port == 0) {
    return bad("--master-port is required with --nnodes > 1 (every node must agree on it)");
  }
  return o;
}

// A socket listening on a port the kernel picks (Note [dtrun holds the store's port]): its fd
// (close-on-exec: only rank 0 gets a copy) and port, or fd -1.
struct StoreSocket {
  int fd = -1;
  int port = 0;
};
StoreSocket ListenForStore() {
  StoreSocket s;
  s.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s.fd < 0) return s;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(s.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(s.fd, 1024) != 0 ||
      ::getsockname(s.fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(s.fd);
    return {};
  }
  s.port = ntohs(addr.sin_port);
  return s;
}

bool ValidJobId(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  for (char ch : id) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ||
                    ch == '_';
    if (!ok) return false;
  }
  return true;
}

// Removes /dev/shm/dtshm.<job>.* (what the shm backend names its segments); returns how many.
int RemoveSegments(const std::string& job) {
  const std::string prefix = "dtshm." + job + ".";
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  while (const dirent* e = ::readdir(dir)) {
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) != 0) continue;
    if (::unlink((std::string("/dev/shm/") + e->d_name).c_str()) == 0) ++removed;
  }
  ::closedir(dir);
  return removed;
}

int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  (void)!::write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;        // exit code, or 128 + signal
  int fds[2] = {-1, -1};  // stdout, stderr pipes (read ends)
  std::string partial[2];  // output after the last newline, held briefly (Note [Partial lines])
  std::optional<std::chrono::steady_clock::time_point> partial_since[2];
};

void WriteAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// Note [Partial lines]
// Output is prefixed line by line so that ranks do not interleave inside a line. A line that stays
// unfinished for 100 ms (a generator streaming tokens, a progress dot) is written anyway and left
// open: the same rank's next output continues it without a prefix; another rank's output on the
// same stream first ends it with a newline. A line finished within 100 ms stays whole.
constexpr auto kPartialHold = std::chrono::milliseconds(100);
int g_open_line[2] = {-1, -1};  // the rank whose line is open on stdout / stderr

void WriteLines(const Rank& r, int which, const std::string& text) {
  const std::string prefix = "[rank " + std::to_string(r.rank) + "] ";
  int& open = g_open_line[which];
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (open != r.rank) {
      if (open != -1) out += "\n";
      out += prefix;
    }
    const size_t nl = text.find('\n', i);
    const size_t end = nl == std::string::npos ? text.size() : nl + 1;
    out.append(text, i, end - i);
    open = nl == std::string::npos ? r.rank : -1;
    i = end;
  }
  if (!out.empty()) WriteAll(which == 0 ? STDOUT_FILENO : STDERR_FILENO, out);
}

// Writes the complete lines; `flush` (the pipe closed) also writes and ends a trailing partial one.
void Emit(Rank& r, int which, const char* data, size_t n, bool flush) {
  std::string& buf = r.partial[which];
  buf.append(data, n);
  const size_t last = buf.rfind('\n');
  if (last != std::string::npos) {
    WriteLines(r, which, buf.substr(0, last + 1));
    buf.erase(0, last + 1);
  }
  if (flush) {
    WriteLines(r, which, buf);
    buf.clear();
    if (g_open_line[which] == r.rank) {
      WriteAll(which == 0 ? STDOUT_FILENO : STDERR_FILENO, "\n");
      g_open_line[which] = -1;
    }
  }
  if (buf.empty()) {
    r.partial_since[which].reset();
  } else if (!r.partial_since[which]) {
    r.partial_since[which] = std::chrono::steady_clock::now();
  }
}

// Writes partial lines held longer than kPartialHold (Note [Partial lines]).
void EmitStale(Rank& r) {
  for (int w = 0; w < 2; ++w) {
    if (r.partial_since[w] && std::chrono::steady_clock::now() - *r.partial_since[w] >= kPartialHold) {
      WriteLines(r, w, r.partial[w]);
      r.partial[w].clear();
      r.partial_since[w].reset();
    }
  }
}

pid_t Spawn(const Options& o, const std::string& job, Rank& r, int world, int local, int store_fd) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) return -1;
  const pid_t parent = ::getpid();
  // See Note [dtrun signals around fork].
  sigset_t all, old;
  sigfillset(&all);
  ::sigprocmask(SIG_BLOCK, &all, &old);
  pid_t pid = ::fork();
  if (pid == 0) {
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) ::signal(s, SIG_DFL);
    ::close(g_signal_pipe[0]);
    ::close(g_signal_pipe[1]);
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // dtrun died before prctl
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    auto set = [](const char* k, const std::string& v) { ::setenv(k, v.c_str(), 1); };
    set("RANK", std::to_string(r.rank));
    set("WORLD_SIZE", std::to_string(world));
    set("LOCAL_RANK", std::to_string(local));
    set("LOCAL_WORLD_SIZE", std::to_string(o.nproc));
    set("NODE_RANK", std::to_string(o.node_rank));
    set("GROUP_RANK", std::to_string(o.node_rank));
    set("GROUP_WORLD_SIZE", std::to_string(o.nnodes));
    set("MASTER_ADDR", o.master_addr);
    set("MASTER_PORT", std::to_string(o.master_port));
    set("DT_JOB_ID", job);
    if (r.rank == 0 && store_fd >= 0) {
      const int inherited = ::dup(store_fd);  // dup clears close-on-exec
      if (inherited >= 0) set("DT_STORE_FD", std::to_string(inherited));
    }
    std::vector<char*> args;
    for (const auto& a : o.argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "dtrun: cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  ::close(out[1]);
  ::close(err[1]);
  if (pid < 0) {
    ::close(out[0]);
    ::close(err[0]);
    errno = fork_errno;  // for the caller's message
    return -1;
  }
  ::setpgid(pid, pid);  // also from here, so signals reach the group even before the child runs
  r.fds[0] = out[0];
  r.fds[1] = err[0];
  return pid;
}

void SignalAll(std::vector<Rank>& ranks, int sig) {
  for (Rank& r : ranks) {
    if (r.running) ::kill(-r.pid, sig);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<Options> parsed = Parse(argc, argv);
  if (!parsed) return 2;
  Options o = *parsed;
  StoreSocket store;  // Note [dtrun holds the store's port]
  if (o.master_port == 0) {
    store = ListenForStore();
    if (store.fd < 0) {
      std::fprintf(stderr, "dtrun: cannot listen on a free port for the store (%s); pass --master-port\n",
                   std::strerror(errno));
      return 2;
    }
    o.master_port = store.port;
  }
  std::string job;
  if (const char* id = std::getenv("DT_JOB_ID"); id != nullptr && *id != '\0') {
    job = id;
    if (!ValidJobId(job)) {
      std::fprintf(stderr, "dtrun: DT_JOB_ID='%s': expected 1-64 letters, digits, '-' or '_'\n", id);
      return 2;
    }
  } else {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "d%d-%llx", static_cast<int>(::getpid()),
                  static_cast<unsigned long long>(Clock::now().time_since_epoch().count() & 0xffffffffff));
    job = buf;
  }
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return 2;
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) ::sigaction(s, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  const int world = o.nnodes * o.nproc;
  std::vector<Rank> ranks(o.nproc);
  int exit_code = 0;
  bool failing = false;
  std::optional<Clock::time_point> kill_at;
  for (int local = 0; local < o.nproc; ++local) {
    Rank& r = ranks[local];
    r.rank = o.node_rank * o.nproc + local;
    r.pid = Spawn(o, job, r, world, local, world > 1 ? store.fd : -1);
    if (r.pid < 0) {
      std::fprintf(stderr, "dtrun: cannot start rank %d: %s\n", r.rank, std::strerror(errno));
      exit_code = 1;
      failing = true;
      break;
    }
    r.running = true;
  }
  if (store.fd >= 0) ::close(store.fd);  // rank 0 holds it now
  if (failing) {
    SignalAll(ranks, SIGTERM);
    kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.grace_s * 1000));
  }

  auto open_pipes = [&] {
    int n = 0;
    for (const Rank& r : ranks) n += (r.fds[0] >= 0) + (r.fds[1] >= 0);
    return n;
  };
  auto running = [&] {
    int n = 0;
    for (const Rank& r : ranks) n += r.running;
    return n;
  };
  std::optional<Clock::time_point> exited_at;  // when the last rank was reaped
  while (running() > 0 || open_pipes() > 0) {
    if (running() == 0 && !exited_at) exited_at = Clock::now();
    if (exited_at && Clock::now() - *exited_at >= kDrain) {
      for (Rank& r : ranks) {
        for (int w = 0; w < 2; ++w) {
          if (r.fds[w] < 0) continue;
          std::fprintf(stderr,
                       "dtrun: rank %d exited, but its %s is still open %lld s later: a process it started holds "
                       "it; killing rank %d's process group and not waiting for it\n",
                       r.rank, w == 0 ? "stdout" : "stderr",
                       static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(kDrain).count()),
                       r.rank);
          ::kill(-r.pid, SIGKILL);
          Emit(r, w, "", 0, true);
          ::close(r.fds[w]);
          r.fds[w] = -1;
        }
      }
      break;
    }
    std::vector<pollfd> fds{{g_signal_pipe[0], POLLIN, 0}};
    std::vector<std::pair<Rank*, int>> owners{{nullptr, 0}};
    for (Rank& r : ranks) {
      for (int w = 0; w < 2; ++w) {
        if (r.fds[w] >= 0) {
          fds.push_back({r.fds[w], POLLIN, 0});
          owners.push_back({&r, w});
        }
      }
    }
    int timeout_ms = exited_at ? 50 : 200;
    if (kill_at) {
      timeout_ms = static_cast<int>(std::clamp<int64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(*kill_at - Clock::now()).count(), 0, 200));
    }
    for (const Rank& r : ranks) {
      if (r.partial_since[0] || r.partial_since[1]) timeout_ms = std::min(timeout_ms, 50);
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) {
      unsigned char sigs[64];
      ssize_t n = ::read(g_signal_pipe[0], sigs, sizeof(sigs));
      for (ssize_t k = 0; k < n; ++k) {
        const int sig = sigs[k];
        if (sig == SIGCHLD) continue;
        std::fprintf(stderr, "dtrun: got signal %d (%s); forwarding it to the ranks\n", sig, strsignal(sig));
        SignalAll(ranks, sig);
        if (!failing) {
          failing = true;
          exit_code = 128 + sig;
        }
        if (!kill_at) kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.grace_s * 1000));
      }
    }
    for (size_t k = 1; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Rank& r = *owners[k].first;
      const int w = owners[k].second;
      char buf[65536];
      ssize_t n = ::read(r.fds[w], buf, sizeof(buf));
      if (n > 0) {
        Emit(r, w, buf, static_cast<size_t>(n), false);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        Emit(r, w, "", 0, true);
        ::close(r.fds[w]);
        r.fds[w] = -1;
      }
    }
    for (Rank& r : ranks) EmitStale(r);
    // Reap.
    for (Rank& r : ranks) {
      if (!r.running) continue;
      int st = 0;
      pid_t p = ::waitpid(r.pid, &st, WNOHANG);
      if (p != r.pid) continue;
      r.running = false;
      r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (r.status != 0 && !failing) {
        failing = true;
        exit_code = r.status;
        if (WIFSIGNALED(st)) {
          std::fprintf(stderr, "dtrun: rank %d (pid %d) was killed by signal %d (%s); stopping the other ranks\n",
                       r.rank, r.pid, WTERMSIG(st), strsignal(WTERMSIG(st)));
        } else {
          std::fprintf(stderr, "dtrun: rank %d (pid %d) exited with status %d; stopping the other ranks\n", r.rank,
                       r.pid, r.status);
        }
        SignalAll(ranks, SIGTERM);
        kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.grace_s * 1000));
      }
      // The group may still hold children of the rank; they go with it.
      if (failing) ::kill(-r.pid, SIGKILL);
    }
    if (kill_at && Clock::now() >= *kill_at && running() > 0) {
      std::fprintf(stderr, "dtrun: %d rank(s) still running after the %.1f s grace period; killing them\n",
                   running(), o.grace_s);
      SignalAll(ranks, SIGKILL);
      kill_at = Clock::now() + std::chrono::hours(1);
    }
  }
  if (const int left = RemoveSegments(job); left > 0) {
    std::fprintf(stderr, "dtrun: removed %d shared-memory segment(s) the job left in /dev/shm (dtshm.%s.*)\n", left,
                 job.c_str());
  }
  return exit_code;
}
