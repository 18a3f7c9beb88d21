#include "dtensor/mesh/sockets.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dt::internal {
namespace {

int MillisLeft(SteadyClock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

// Waits for `events` on fd: >0 ready, 0 deadline passed, <0 poll failed.
int PollBy(int fd, short events, SteadyClock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, MillisLeft(deadline));
    if (r < 0 && errno == EINTR) continue;
    return r;
  }
}

}  // namespace

absl::Status ServingThread::Start(int listen_fd, std::function<void()> loop, absl::string_view who) {
  listen_fd_ = listen_fd;
  if (::pipe2(wake_, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat(who, ": pipe failed"));
  thread_ = std::thread(std::move(loop));
  return absl::OkStatus();
}

void ServingThread::Wake() {
  char c = 0;
  if (wake_[1] >= 0) (void)!::write(wake_[1], &c, 1);
}

ServingThread::~ServingThread() {
  if (thread_.joinable()) {
    Wake();
    thread_.join();
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  for (int fd : wake_) {
    if (fd >= 0) ::close(fd);
  }
}

absl::StatusOr<Listener> ListenAny(int port, int backlog) {
  Listener l;
  l.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (l.fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  int one = 1;
  ::setsockopt(l.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  if (::bind(l.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(l.fd, backlog) != 0 ||
      ::getsockname(l.fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(l.fd);
    return absl::UnavailableError(std::strerror(err));
  }
  l.port = ntohs(addr.sin_port);
  return l;
}

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

absl::StatusOr<int> StartConnect(const std::string& host, int port, int* connect_errno) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (gai != 0 || res == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot resolve '", host, "': ", ::gai_strerror(gai)));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ::freeaddrinfo(res);
    return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  int rc;
  do {
    rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
  } while (rc != 0 && errno == EINTR);
  const int err = errno;
  ::freeaddrinfo(res);
  if (rc != 0 && err != EINPROGRESS) {
    if (connect_errno != nullptr) *connect_errno = err;
    ::close(fd);
    return absl::UnavailableError(std::strerror(err));
  }
  SetNoDelay(fd);
  return fd;
}

absl::Status FinishConnect(int fd, SteadyClock::time_point deadline) {
  const int r = PollBy(fd, POLLOUT, deadline);
  if (r == 0) return absl::DeadlineExceededError("no answer in time");
  if (r < 0) return absl::UnavailableError(absl::StrCat("poll: ", std::strerror(errno)));
  int err = 0;
  socklen_t len = sizeof(err);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) return absl::UnavailableError(std::strerror(err));
  return absl::OkStatus();
}

absl::StatusOr<int> ConnectBy(const std::string& host, int port, SteadyClock::time_point deadline) {
  absl::StatusOr<int> fd = StartConnect(host, port);
  if (!fd.ok()) return fd;
  absl::Status st = FinishConnect(*fd, deadline);
  if (!st.ok()) {
    ::close(*fd);
    return st;
  }
  return fd;
}

absl::Status SendAllBy(int fd, absl::string_view data, SteadyClock::time_point deadline) {
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const int r = PollBy(fd, POLLOUT, deadline);
      if (r == 0) return absl::DeadlineExceededError("cannot send in time");
      if (r < 0) return absl::UnavailableError(absl::StrCat("poll: ", std::strerror(errno)));
      continue;
    }
    return absl::UnavailableError(n == 0 ? "connection closed" : std::strerror(errno));
  }
  return absl::OkStatus();
}

absl::Status RecvAllBy(int fd, char* buf, size_t n, SteadyClock::time_point deadline) {
  size_t off = 0;
  while (off < n) {
    const ssize_t got = ::recv(fd, buf + off, n - off, MSG_DONTWAIT);
    if (got > 0) {
      off += static_cast<size_t>(got);
      continue;
    }
    if (got == 0) return absl::UnavailableError("connection closed");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return absl::UnavailableError(std::strerror(errno));
    const int r = PollBy(fd, POLLIN, deadline);
    if (r == 0) return absl::DeadlineExceededError("no reply in time");
    if (r < 0) return absl::UnavailableError(absl::StrCat("poll: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::string LocalAddressFor(const std::string& master, const std::string& iface) {
  std::string out;
  if (!iface.empty()) {
    ifaddrs* ifs = nullptr;
    if (::getifaddrs(&ifs) == 0) {
      for (ifaddrs* i = ifs; i != nullptr && out.empty(); i = i->ifa_next) {
        if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || iface != i->ifa_name) continue;
        char buf[INET_ADDRSTRLEN];
        const auto* a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
        if (::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf)) != nullptr) out = buf;
      }
      ::freeifaddrs(ifs);
    }
    return out.empty() ? "127.0.0.1" : out;
  }
  if (master.empty() || master == "localhost" || absl::StartsWith(master, "127.")) return "127.0.0.1";
  // A connected UDP socket's local address: the interface that routes to the master.
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(master.c_str(), "9", &hints, &res) == 0 && res != nullptr) {
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      sockaddr_in local{};
      socklen_t len = sizeof(local);
      char buf[INET_ADDRSTRLEN];
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
          ::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf)) != nullptr) {
        out = buf;
      }
    }
    if (fd >= 0) ::close(fd);
    ::freeaddrinfo(res);
  }
  return out.empty() || out == "0.0.0.0" ? "127.0.0.1" : out;
}

bool SplitHostPort(absl::string_view endpoint, std::string* host, int* port) {
  const size_t colon = endpoint.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  if (!absl::SimpleAtoi(endpoint.substr(colon + 1), port) || *port <= 0 || *port > 65535) return false;
  *host = std::string(endpoint.substr(0, colon));
  return true;
}

}  // namespace dt::internal
