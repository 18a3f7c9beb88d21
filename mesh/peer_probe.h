#pragma once
// Internal to mesh/: is a peer process alive, gone, or out of reach? Asked directly of the peer,
// so the answer does not depend on the store (which may be the thing that is out of reach).
//
// Every gloo process runs a ProbeListener: a thread that answers each TCP connection on its port
// with one byte and closes it ('A', or 'F' once the process marked itself failing). Another
// process asks with PeerProbes:
//
//   what the prober sees                                  state     meaning
//   'A'                                                   kAlive    the process runs (its probe thread does)
//   'F'                                                   kFailing  it runs, but one of its communicators
//                                                                   failed (it is diagnosing, or leaving)
//   connection refused / reset / closed without a byte    kGone     the process exited; its host is up
//   connected, but no byte by the deadline                kStalled  its host's kernel answers, the process
//                                                                   does not: stopped (SIGSTOP), or so
//                                                                   starved of CPU that it cannot
//   no connection by the deadline (or host/net            kSilent   host down, or a network partition
//   unreachable)
//   no endpoint known, or no socket to probe with         kUnknown
//
// A process being killed while probed is kGone, not kAlive: the kernel may complete the handshake
// from the listen backlog, but only the thread writes the byte, and the socket is reset when the
// process's files close.

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "dtensor/mesh/sockets.h"

namespace dt::internal {

class ProbeListener {
 public:
  // Listens on every interface at a free port.
  static absl::StatusOr<std::unique_ptr<ProbeListener>> Start();
  int port() const { return port_; }
  // From now on answer 'F' (see above); for good.
  void MarkFailing() { failing_ = true; }

 private:
  ProbeListener() = default;
  void Loop();
  std::atomic<bool> failing_{false};
  int port_ = 0;
  ServingThread serving_;  // last: its thread runs Loop
};

enum class PeerState { kAlive, kFailing, kGone, kStalled, kSilent, kUnknown };

// Probes run concurrently: the constructor starts connecting to every endpoint ("host:port"; "" is
// kUnknown), Wait() collects the answers.
class PeerProbes {
 public:
  explicit PeerProbes(const std::vector<std::string>& endpoints);
  ~PeerProbes();
  PeerProbes(const PeerProbes&) = delete;
  PeerProbes& operator=(const PeerProbes&) = delete;

  // Waits until every probe is answered or `deadline`; what is still open then is kStalled
  // (connected) or kSilent.
  std::vector<PeerState> Wait(SteadyClock::time_point deadline);

 private:
  struct Probe {
    int fd = -1;
    bool connected = false;
    PeerState state = PeerState::kSilent;
    bool done = false;
  };
  void Finish(Probe& p, PeerState s);
  std::vector<Probe> probes_;
};

}  // namespace dt::internal
