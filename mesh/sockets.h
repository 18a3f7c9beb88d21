#pragma once
// Internal to mesh/: TCP over IPv4 with deadlines, for the store (mesh/tcp_store.h) and the peer
// probes (mesh/peer_probe.h). Every socket made here is non-blocking and close-on-exec; every call
// returns by its deadline, also when the other side is behind a network partition (a blocking
// connect() would wait for the kernel's SYN retries, about two minutes).

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dt::internal {

using SteadyClock = std::chrono::steady_clock;

// Starts connecting to host:port (name or dotted quad); the socket is non-blocking and may still
// be connecting (see FinishConnect). Errors: unresolvable host, or the connect failed at once
// (e.g. "Connection refused" on a reachable host where nothing listens; its errno goes to
// `connect_errno` when given).
absl::StatusOr<int> StartConnect(const std::string& host, int port, int* connect_errno = nullptr);
// Waits until the connection started by StartConnect is up: OK, DeadlineExceeded, or the error.
absl::Status FinishConnect(int fd, SteadyClock::time_point deadline);
// StartConnect + FinishConnect; closes the socket on failure.
absl::StatusOr<int> ConnectBy(const std::string& host, int port, SteadyClock::time_point deadline);

// Writes all of `data`: OK, DeadlineExceeded, or Unavailable (the connection is gone).
absl::Status SendAllBy(int fd, absl::string_view data, SteadyClock::time_point deadline);
// Reads exactly `n` bytes: OK, DeadlineExceeded, or Unavailable ("connection closed", ...).
absl::Status RecvAllBy(int fd, char* buf, size_t n, SteadyClock::time_point deadline);

void SetNoDelay(int fd);

// A listening socket on every interface at `port` (0: a free one), SO_REUSEADDR set. Returns the
// socket and the port it got; on failure closes it and says why (errno's text).
struct Listener {
  int fd = -1;
  int port = 0;
};
absl::StatusOr<Listener> ListenAny(int port, int backlog);

// A listening socket served on a thread of its own (the store's server, the probe listener). The
// loop polls wake_fd() beside listen_fd() and winds down once wake_fd() is readable; the destructor
// makes it so, joins the thread and closes the socket and the pipe. Declare it after every member
// the loop uses, so that it goes (and the thread ends) first.
class ServingThread {
 public:
  ServingThread() = default;
  ~ServingThread();
  ServingThread(const ServingThread&) = delete;
  ServingThread& operator=(const ServingThread&) = delete;
  // Owns `listen_fd` from here on (also on failure) and runs `loop` on a new thread. `who` names
  // the server in the error ("store: pipe failed").
  absl::Status Start(int listen_fd, std::function<void()> loop, absl::string_view who);
  int listen_fd() const { return listen_fd_; }
  int wake_fd() const { return wake_[0]; }
  // Makes wake_fd() readable (the loop winds down) without waiting for the thread.
  void Wake();

 private:
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread thread_;
};

// The IPv4 address other hosts reach this process at: loopback when `master` is local, else the
// address of the interface that routes to `master` (or of `iface` when it is set).
std::string LocalAddressFor(const std::string& master, const std::string& iface = "");

// "host:port" -> host and port; false when malformed.
bool SplitHostPort(absl::string_view endpoint, std::string* host, int* port);

}  // namespace dt::internal
