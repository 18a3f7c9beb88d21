#include "dtensor/mesh/peer_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"

namespace dt::internal {

absl::StatusOr<std::unique_ptr<ProbeListener>> ProbeListener::Start() {
  std::unique_ptr<ProbeListener> l(new ProbeListener());
  absl::StatusOr<Listener> sock = ListenAny(0, 256);
  if (!sock.ok()) return absl::Status(sock.status().code(), absl::StrCat("probe: cannot listen: ", sock.status().message()));
  l->port_ = sock->port;
  DT_RETURN_IF_ERROR(l->serving_.Start(sock->fd, [p = l.get()] { p->Loop(); }, "probe"));
  return l;
}

void ProbeListener::Loop() {
  while (true) {
    pollfd fds[2] = {{serving_.wake_fd(), POLLIN, 0}, {serving_.listen_fd(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (fds[0].revents & POLLIN) return;
    if (!(fds[1].revents & POLLIN)) continue;
    while (true) {
      const int fd = ::accept4(serving_.listen_fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) break;
      const char answer = failing_ ? 'F' : 'A';
      (void)!::send(fd, &answer, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      ::close(fd);
    }
  }
}

PeerProbes::PeerProbes(const std::vector<std::string>& endpoints) : probes_(endpoints.size()) {
  for (size_t i = 0; i < endpoints.size(); ++i) {
    Probe& p = probes_[i];
    std::string host;
    int port = 0;
    if (!SplitHostPort(endpoints[i], &host, &port)) {
      Finish(p, PeerState::kUnknown);
      continue;
    }
    int err = 0;
    absl::StatusOr<int> fd = StartConnect(host, port, &err);
    if (!fd.ok()) {
      // Refused at once: nothing listens there any more; another connect error (no route): we
      // cannot reach it; no connect at all (no socket, e.g. out of descriptors): we do not know.
      Finish(p, err == ECONNREFUSED ? PeerState::kGone : err != 0 ? PeerState::kSilent : PeerState::kUnknown);
      continue;
    }
    p.fd = *fd;
  }
}

PeerProbes::~PeerProbes() {
  for (Probe& p : probes_) {
    if (p.fd >= 0) ::close(p.fd);
  }
}

void PeerProbes::Finish(Probe& p, PeerState s) {
  p.state = s;
  p.done = true;
  if (p.fd >= 0) ::close(p.fd);
  p.fd = -1;
}

std::vector<PeerState> PeerProbes::Wait(SteadyClock::time_point deadline) {
  while (true) {
    std::vector<pollfd> fds;
    std::vector<Probe*> owners;
    for (Probe& p : probes_) {
      if (p.done) continue;
      fds.push_back({p.fd, static_cast<short>(p.connected ? POLLIN : POLLOUT), 0});
      owners.push_back(&p);
    }
    if (fds.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
    // One last look after the deadline: answers that arrived meanwhile still count.
    const int r = ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      Probe& p = *owners[i];
      if (fds[i].revents == 0) continue;
      if (!p.connected) {
        int err = 0;
        socklen_t len = sizeof(err);
        if (::getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        if (err == ECONNREFUSED || err == ECONNRESET) {
          Finish(p, PeerState::kGone);
        } else if (err != 0) {
          Finish(p, PeerState::kSilent);  // host or network unreachable, timed out
        } else {
          p.connected = true;  // and the answer may be there already
        }
        if (p.done) continue;
      }
      char b = 0;
      const ssize_t n = ::recv(p.fd, &b, 1, MSG_DONTWAIT);
      if (n == 1) {
        Finish(p, b == 'F' ? PeerState::kFailing : PeerState::kAlive);
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        Finish(p, PeerState::kGone);  // reset or closed without an answer: the process went away
      }
    }
    if (left <= 0) break;  // that was the last look
  }
  std::vector<PeerState> out;
  for (Probe& p : probes_) {
    out.push_back(p.done ? p.state : p.connected ? PeerState::kStalled : PeerState::kSilent);
  }
  return out;
}

}  // namespace dt::internal
