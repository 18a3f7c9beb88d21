// The TCP store (requests, the dead/left lists, deadlines when the server says nothing) and the
// peer probes (alive, failing, gone, silent, unknown), on loopback in one process.

#include "dtensor/mesh/tcp_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "dtensor/mesh/peer_probe.h"
#include "dtensor/tests/test_util.h"

namespace dt::internal {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A listening socket on loopback that never accepts: the kernel completes handshakes from the
// backlog, and then nothing ever answers.
class SilentServer {
 public:
  explicit SilentServer(int backlog = 16) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(fd_, backlog), 0);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~SilentServer() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// A loopback port where nothing listens (bound once, then released).
int ClosedPort() {
  SilentServer s;
  const int port = s.port();
  s.Close();
  return port;
}

std::unique_ptr<TcpStore> Client(int port, int rank, milliseconds timeout = milliseconds(5000)) {
  return TcpStore::Connect("127.0.0.1", port, rank, timeout).value();
}

TEST(TcpStore, Requests) {
  auto server = TcpStoreServer::Start(0).value();
  auto store = Client(server->port(), 0);
  ASSERT_TRUE(store->Set("a", "1").ok());
  EXPECT_EQ(store->Get("a").value(), std::optional<std::string>("1"));
  EXPECT_EQ(store->Get("zz").value(), std::nullopt);
  ASSERT_TRUE(store->Set("n", "7").ok());
  store->Arrive("m", 4);
  store->Arrive("m", 2);  // max, not the last value
  EXPECT_TRUE(store->Wait({"a"}, milliseconds(100)).ok());
  absl::Status st = store->Wait({"a", "b"}, milliseconds(100));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(dt::testing::Contains(st, "missing keys: b"));
  // A second client's Set wakes a waiter.
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(50));
    EXPECT_TRUE(Client(server->port(), 1)->Set("b", "x").ok());
  });
  EXPECT_TRUE(store->Wait({"a", "b"}, milliseconds(5000)).ok());
  later.join();
  const auto deadline = Clock::now() + milliseconds(2000);
  std::vector<std::optional<std::string>> v;
  do {  // Arrive has no reply: it lands eventually
    v = store->Peek({"a", "zz", "n", "m"}, milliseconds(500)).value();
  } while (v[3] != std::optional<std::string>("4") && Clock::now() < deadline);
  EXPECT_EQ(v, (std::vector<std::optional<std::string>>{"1", std::nullopt, "7", "4"}));
}

// Note [The store lingers in the background]: destroying the server returns at once although a
// client is still connected (as a stopped rank's is), the server still answers that client, and
// once the client leaves, a new server gets the port at once.
TEST(TcpStore, ServerLingersForItsClientsInTheBackground) {
  auto server = TcpStoreServer::Start(0).value();
  const int port = server->port();
  auto client = Client(port, 1);
  auto t = Clock::now();
  server.reset();
  EXPECT_LT(SecondsSince(t), 0.5);
  ASSERT_TRUE(client->Set("k", "v").ok());
  EXPECT_EQ(client->Get("k").value(), std::optional<std::string>("v"));
  client.reset();  // Bye: the last client is gone, the lingering server stops
  t = Clock::now();
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> again = TcpStoreServer::Start(port);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_LT(SecondsSince(t), 2.0);
  EXPECT_EQ(Client(port, 0)->Get("k").value(), std::nullopt);  // a new store
}

TEST(TcpStore, ListsRanksThatDiedAndRanksThatLeft) {
  auto server = TcpStoreServer::Start(0).value();
  auto store = Client(server->port(), 0);
  Client(server->port(), 3).reset();  // says Bye
  const pid_t child = ::fork();
  if (child == 0) {
    auto s = TcpStore::Connect("127.0.0.1", server->port(), 4, milliseconds(5000));
    ::_exit(s.ok() ? 0 : 1);  // no destructor, no Bye: the connection closes as the process dies
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_EQ(status, 0);
  const std::vector<std::string> keys{std::string(TcpStore::kDeadKey), std::string(TcpStore::kLeftKey)};
  const auto deadline = Clock::now() + milliseconds(5000);
  std::vector<std::optional<std::string>> v;
  do {
    v = store->Peek(keys, milliseconds(500)).value();
  } while ((!v[0] || !v[1]) && Clock::now() < deadline);
  EXPECT_EQ(v[0], std::optional<std::string>("4"));
  EXPECT_EQ(v[1], std::optional<std::string>("3"));
  EXPECT_EQ(ParseRankList("4,5,x,6"), (std::vector<int>{4, 5, 6}));
}

TEST(TcpStore, EveryCallReturnsByItsDeadlineWhenTheServerSaysNothing) {
  SilentServer silent;
  const milliseconds timeout(300);
  auto store = Client(silent.port(), 0, timeout);  // the handshake needs no server thread
  auto t = Clock::now();
  absl::Status st = store->Set("k", "v");
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_LT(SecondsSince(t), 1.5);
  t = Clock::now();
  EXPECT_FALSE(store->Get("k").ok());  // the connection is out of step now: fails at once
  EXPECT_LT(SecondsSince(t), 0.5);
  t = Clock::now();
  st = store->Peek({"k"}, milliseconds(100)).status();  // its own connection
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_LT(SecondsSince(t), 1.0);

  auto waiter = Client(silent.port(), 1, timeout);
  t = Clock::now();
  EXPECT_FALSE(waiter->Wait({"k"}, milliseconds(200)).ok());
  EXPECT_LT(SecondsSince(t), 0.2 + std::chrono::duration<double>(TcpStore::kWaitGrace).count() + 1.0);

  // Nothing listening: connecting gives up at its timeout.
  t = Clock::now();
  EXPECT_EQ(TcpStore::Connect("127.0.0.1", ClosedPort(), 0, timeout).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(SecondsSince(t), 1.5);
}

TEST(TcpStore, DiagnosisTimeIsAQuarterOfTheTimeoutWithinBounds) {
  EXPECT_EQ(DiagnosisTime(milliseconds(300'000)), milliseconds(1000));
  EXPECT_EQ(DiagnosisTime(milliseconds(3000)), milliseconds(750));
  EXPECT_EQ(DiagnosisTime(milliseconds(100)), milliseconds(500));
}

std::string Local(int port) { return "127.0.0.1:" + std::to_string(port); }

// A listening socket whose accept queue is full: the kernel drops new handshakes (SYNs), as
// toward a host that is down or cut off.
class UnreachableServer {
 public:
  UnreachableServer() : full_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(listener_.port()));
    EXPECT_EQ(::connect(full_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);  // fills it
  }
  ~UnreachableServer() { ::close(full_); }
  int port() const { return listener_.port(); }

 private:
  SilentServer listener_{0};
  int full_;
};

TEST(PeerProbe, TellsAliveFailingGoneStalledSilentAndUnknownApart) {
  auto listener = ProbeListener::Start().value();
  SilentServer stalled;  // handshakes, but nobody answers: like a stopped process
  UnreachableServer unreachable;  // no handshake: like a host that is down
  const std::vector<std::string> endpoints{Local(listener->port()), Local(ClosedPort()), Local(stalled.port()),
                                           Local(unreachable.port()), "", "no-port"};
  auto t = Clock::now();
  std::vector<PeerState> s = PeerProbes(endpoints).Wait(Clock::now() + milliseconds(1000));
  EXPECT_EQ(s, (std::vector<PeerState>{PeerState::kAlive, PeerState::kGone, PeerState::kStalled,
                                       PeerState::kSilent, PeerState::kUnknown, PeerState::kUnknown}));
  EXPECT_LT(SecondsSince(t), 2.0);  // the stalled and silent ones take the whole second

  listener->MarkFailing();
  EXPECT_EQ(PeerProbes({Local(listener->port())}).Wait(Clock::now() + milliseconds(2000)),
            std::vector<PeerState>{PeerState::kFailing});

  // A process that goes away while probed (its listening socket closes with the handshake done
  // but unanswered) is gone, not stalled.
  PeerProbes pending({Local(stalled.port())});
  std::this_thread::sleep_for(milliseconds(50));
  stalled.Close();
  EXPECT_EQ(pending.Wait(Clock::now() + milliseconds(2000)), std::vector<PeerState>{PeerState::kGone});
}

}  // namespace
}  // namespace dt::internal
