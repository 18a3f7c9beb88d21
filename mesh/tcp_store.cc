#include "dtensor/mesh/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "dtensor/core/status.h"
#include "dtensor/mesh/agent_store.h"
#include "dtensor/mesh/backends.h"
#include "dtensor/mesh/collective.h"
#include "dtensor/mesh/sockets.h"

namespace dt::internal {
namespace {

using Clock = std::chrono::steady_clock;

enum Cmd : uint8_t {
  kHello = 1, kSet, kGet, kWait, kArrive, kBye, kPeek,
  kOk = 100, kValue, kMissing, kTimeout, kValues,
};

void PutU32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
void PutI64(std::string& s, int64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
void PutStr(std::string& s, const std::string& v) {
  PutU32(s, static_cast<uint32_t>(v.size()));
  s.append(v);
}
std::string Frame(uint8_t cmd, const std::string& body = "") {
  std::string s;
  PutU32(s, static_cast<uint32_t>(body.size() + 1));
  s.push_back(static_cast<char>(cmd));
  s.append(body);
  return s;
}

struct Reader {
  const std::string& s;
  size_t pos = 0;
  bool U32(uint32_t* v) {
    if (pos + 4 > s.size()) return false;
    std::memcpy(v, s.data() + pos, 4);
    pos += 4;
    return true;
  }
  bool I64(int64_t* v) {
    if (pos + 8 > s.size()) return false;
    std::memcpy(v, s.data() + pos, 8);
    pos += 8;
    return true;
  }
  bool Str(std::string* v) {
    uint32_t n = 0;
    if (!U32(&n) || pos + n > s.size()) return false;
    v->assign(s.data() + pos, n);
    pos += n;
    return true;
  }
  bool U8(uint8_t* v) {
    if (pos + 1 > s.size()) return false;
    *v = static_cast<uint8_t>(s[pos++]);
    return true;
  }
};

// ---- server -----------------------------------------------------------------------------------

struct StoreState {
  struct Client {
    std::string in;
    std::string out;  // replies the client has not taken yet (see Note [Store deadlines])
    int rank = -1;
    bool bye = false;
    bool broken = false;  // a send failed; dropped by the loop
  };
  struct Waiter {
    int fd;
    std::vector<std::string> keys;
    Clock::time_point deadline;
  };
  std::map<std::string, std::string> kv;
  std::map<int, Client> clients;
  std::vector<Waiter> waiters;
  std::vector<int> dead, left;
  bool stopping = false;  // the server is going away: the clients are not

  // Queues `data` for `fd` and sends what the socket takes now; never blocks.
  void Send(int fd, const std::string& data) {
    auto it = clients.find(fd);
    if (it == clients.end()) return;
    it->second.out.append(data);
    Flush(fd, it->second);
  }
  void Flush(int fd, Client& c) {
    while (!c.out.empty() && !c.broken) {
      const ssize_t n = ::send(fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.out.erase(0, static_cast<size_t>(n));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) c.broken = true;
        return;
      }
    }
  }
  std::vector<std::string> Missing(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& k : keys) if (!kv.count(k)) out.push_back(k);
    return out;
  }
  // Answers the waiters that are satisfied or past their deadline.
  void ServeWaiters(bool expire) {
    const auto now = Clock::now();
    for (size_t i = 0; i < waiters.size();) {
      std::vector<std::string> missing = Missing(waiters[i].keys);
      if (missing.empty()) {
        Send(waiters[i].fd, Frame(kOk));
      } else if (expire && now >= waiters[i].deadline) {
        std::string body;
        PutU32(body, static_cast<uint32_t>(missing.size()));
        for (const auto& k : missing) PutStr(body, k);
        Send(waiters[i].fd, Frame(kTimeout, body));
      } else {
        ++i;
        continue;
      }
      waiters.erase(waiters.begin() + static_cast<long>(i));
    }
  }
  void Drop(int fd) {
    auto it = clients.find(fd);
    if (it == clients.end()) return;
    if (it->second.rank >= 0 && !stopping) {
      std::vector<int>& list = it->second.bye ? left : dead;
      if (std::find(list.begin(), list.end(), it->second.rank) == list.end()) {
        list.push_back(it->second.rank);
        kv[std::string(it->second.bye ? TcpStore::kLeftKey : TcpStore::kDeadKey)] = absl::StrJoin(list, ",");
      }
    }
    clients.erase(it);
    waiters.erase(std::remove_if(waiters.begin(), waiters.end(), [&](const Waiter& w) { return w.fd == fd; }),
                  waiters.end());
    ::close(fd);
  }
  // Handles one request; false on a malformed one (the client is dropped).
  bool Handle(int fd, const std::string& msg) {
    Reader r{msg, 1};
    std::string key, value;
    int64_t num = 0;
    uint32_t u = 0;
    switch (static_cast<uint8_t>(msg[0])) {
      case kHello:
        if (!r.U32(&u)) return false;
        clients[fd].rank = static_cast<int>(u);
        return true;
      case kBye:
        clients[fd].bye = true;
        return true;
      case kSet:
        if (!r.Str(&key) || !r.Str(&value)) return false;
        kv[key] = value;
        Send(fd, Frame(kOk));
        ServeWaiters(false);
        return true;
      case kGet: {
        if (!r.Str(&key)) return false;
        auto it = kv.find(key);
        if (it == kv.end()) {
          Send(fd, Frame(kMissing));
        } else {
          std::string body;
          PutStr(body, it->second);
          Send(fd, Frame(kValue, body));
        }
        return true;
      }
      case kPeek: {
        if (!r.U32(&u)) return false;
        std::string body;
        PutU32(body, u);
        for (uint32_t i = 0; i < u; ++i) {
          if (!r.Str(&key)) return false;
          auto it = kv.find(key);
          body.push_back(it == kv.end() ? '\0' : '\1');
          PutStr(body, it == kv.end() ? std::string() : it->second);
        }
        Send(fd, Frame(kValues, body));
        return true;
      }
      case kWait: {
        Waiter w{fd, {}, {}};
        if (!r.I64(&num) || !r.U32(&u)) return false;
        w.deadline = Clock::now() + std::chrono::milliseconds(num);
        for (uint32_t i = 0; i < u; ++i) {
          if (!r.Str(&key)) return false;
          w.keys.push_back(key);
        }
        waiters.push_back(std::move(w));
        ServeWaiters(false);
        return true;
      }
      case kArrive: {
        if (!r.Str(&key) || !r.I64(&num)) return false;
        int64_t old = 0;
        auto it = kv.find(key);
        if (it != kv.end() && !absl::SimpleAtoi(it->second, &old)) old = 0;
        kv[key] = absl::StrCat(std::max(old, num));
        ServeWaiters(false);
        return true;
      }
      default:
        return false;
    }
  }
};

}  // namespace

struct TcpStoreServer::Serving {
  int port = 0;
  StoreState state;
  std::atomic<bool> done{false};  // Loop returned
  ServingThread thread;           // last: its thread runs Loop
  void Loop();
};

namespace {

// Note [The store lingers in the background]
// Rank 0 runs the store. When its world goes, the other ranks may still need the store: to say
// goodbye, or to diagnose a failure of their own (Note [Gloo backend]: a peek at who died and
// who reached the collective). So the server serves on until every client has closed its
// connection, for at most TcpStoreServer::kLinger. It used to do so in the world's destructor,
// and a program that reports its error after its world is gone (most do: the world lives in the
// function that failed) then reported up to 10 s late: a stopped rank never closes its connection,
// and with DT_TIMEOUT_MS=15000 rank 0 reported at 25 s (issue 45). Now the destructor only wakes
// the server and hands it to this registry, which lets it finish in the background: the process
// waits for what is still lingering when it exits (this static's destructor; std::_Exit and
// signals do not wait), and a new server on the same port waits for the old one first, as it
// used to. A fork()ed child must leave with _exit (the lingering threads are not in it).
class Lingering {
 public:
  static Lingering& Get() {
    static Lingering lingering;
    return lingering;
  }
  ~Lingering() {
    std::lock_guard<std::mutex> lock(mu_);
    servers_.clear();  // each joins its thread: at most kLinger
  }
  void Add(std::unique_ptr<TcpStoreServer::Serving> s) {
    std::lock_guard<std::mutex> lock(mu_);
    Reap();
    servers_.push_back(std::move(s));
  }
  // Waits for the server still lingering on `port`, if any.
  void WaitFor(int port) {
    std::unique_ptr<TcpStoreServer::Serving> old;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Reap();
      for (auto& s : servers_) {
        if (s->port == port) {
          old = std::move(s);
          break;
        }
      }
      servers_.erase(std::remove(servers_.begin(), servers_.end(), nullptr), servers_.end());
    }
    old.reset();  // joins, outside the lock
  }

 private:
  void Reap() {
    servers_.erase(std::remove_if(servers_.begin(), servers_.end(),
                                  [](const auto& s) { return s->done.load(); }),
                   servers_.end());
  }
  std::mutex mu_;
  std::vector<std::unique_ptr<TcpStoreServer::Serving>> servers_;
};

}  // namespace

TcpStoreServer::TcpStoreServer(std::unique_ptr<Serving> serving) : serving_(std::move(serving)) {}

int TcpStoreServer::port() const { return serving_->port; }

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(int port) {
  if (port != 0) Lingering::Get().WaitFor(port);
  absl::StatusOr<Listener> sock = ListenAny(port, 1024);
  if (!sock.ok()) {
    return absl::Status(sock.status().code(), absl::StrCat("store: cannot listen on port ", port, ": ", sock.status().message(),
                                                           " (is another job using MASTER_PORT ", port, "?)"));
  }
  return Serve(sock->fd, sock->port);
}

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Adopt(int fd, int port) {
  int listening = 0;
  socklen_t len = sizeof(listening);
  sockaddr_in addr{};
  socklen_t alen = sizeof(addr);
  const bool ok = ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening != 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) == 0 &&
                  addr.sin_family == AF_INET && ntohs(addr.sin_port) == port;
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DT_STORE_FD=", fd, " is not a socket listening on MASTER_PORT ", port,
        " (dtrun hands one to rank 0; unset DT_STORE_FD when not started by dtrun)"));
  }
  // Close-on-exec and non-blocking from here on, like a socket of our own.
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return Serve(fd, port);
}

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Serve(int listen_fd, int port) {
  // Made before the server, so that it outlives any static that holds one (destroyed in reverse).
  Lingering::Get();
  auto serving = std::make_unique<Serving>();
  serving->port = port;
  DT_RETURN_IF_ERROR(serving->thread.Start(listen_fd, [p = serving.get()] { p->Loop(); }, "store"));
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(std::move(serving)));
}

TcpStoreServer::~TcpStoreServer() {
  serving_->thread.Wake();
  Lingering::Get().Add(std::move(serving_));
}

void TcpStoreServer::Serving::Loop() {
  StoreState& st = state;
  std::optional<Clock::time_point> stop_by;
  while (true) {
    if (stop_by && (st.clients.empty() || Clock::now() >= *stop_by)) break;
    std::vector<pollfd> fds{{thread.wake_fd(), POLLIN, 0}, {thread.listen_fd(), POLLIN, 0}};
    for (const auto& [fd, c] : st.clients) {
      fds.push_back({fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
    }
    int timeout_ms = 1000;
    for (const auto& w : st.waiters) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(w.deadline - Clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left + 1, 0, timeout_ms));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) {
      char c;
      (void)!::read(thread.wake_fd(), &c, 1);
      if (!stop_by) stop_by = Clock::now() + kLinger;
    }
    if (fds[1].revents & POLLIN) {
      int fd = ::accept4(thread.listen_fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        SetNoDelay(fd);
        st.clients[fd];
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      const int fd = fds[i].fd;
      if (fds[i].revents & POLLOUT) {
        auto it = st.clients.find(fd);
        if (it != st.clients.end()) st.Flush(fd, it->second);
      }
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      if (!st.clients.count(fd)) continue;
      char buf[65536];
      ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (n <= 0) {
        st.Drop(fd);
        continue;
      }
      std::string& in = st.clients[fd].in;
      in.append(buf, static_cast<size_t>(n));
      bool ok = true;
      while (ok && in.size() >= 4) {
        uint32_t len;
        std::memcpy(&len, in.data(), 4);
        if (len == 0 || len > (1u << 30)) { ok = false; break; }
        if (in.size() < 4 + len) break;
        std::string msg = in.substr(4, len);
        in.erase(0, 4 + len);
        ok = st.Handle(fd, msg);
      }
      if (!ok) st.Drop(fd);
    }
    st.ServeWaiters(true);
    std::vector<int> broken;
    for (const auto& [fd, c] : st.clients) {
      if (c.broken) broken.push_back(fd);
    }
    for (int fd : broken) st.Drop(fd);
  }
  st.stopping = true;  // we are leaving, not they
  while (!st.clients.empty()) st.Drop(st.clients.begin()->first);
  done = true;
}

// ---- client -----------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(const std::string& host, int port, int rank,
                                                            std::chrono::milliseconds timeout) {
  std::unique_ptr<TcpStore> s(new TcpStore());
  s->host_ = host;
  s->port_ = port;
  s->timeout_ = timeout;
  const auto deadline = Clock::now() + timeout;
  std::string last_error = "no attempt";
  while (true) {
    absl::StatusOr<int> fd = ConnectBy(host, port, deadline);
    if (fd.ok()) {
      s->main_.fd = *fd;
      break;
    }
    last_error = std::string(fd.status().message());
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("store at ", host, ":", port, ": cannot connect within ",
                                                      timeout.count(), " ms: ", last_error,
                                                      " (is rank 0 running, and MASTER_ADDR/MASTER_PORT right?)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Anonymous (no Hello): only the main connection tracks death.
  absl::StatusOr<int> arrive = ConnectBy(host, port, std::max(deadline, Clock::now() + std::chrono::seconds(1)));
  if (arrive.ok()) s->arrive_.fd = *arrive;
  std::string body;
  PutU32(body, static_cast<uint32_t>(rank));
  if (!SendAllBy(s->main_.fd, Frame(kHello, body), Clock::now() + timeout).ok()) {
    return absl::UnavailableError(absl::StrCat("store at ", s->address(), ": connection lost"));
  }
  return s;
}

TcpStore::~TcpStore() {
  for (Conn* c : {&arrive_, &peek_}) {
    if (c->fd >= 0) ::close(c->fd);
  }
  if (main_.fd >= 0) {
    (void)SendAllBy(main_.fd, Frame(kBye), Clock::now() + std::chrono::seconds(1));
    ::shutdown(main_.fd, SHUT_WR);
    ::close(main_.fd);
  }
}

std::string TcpStore::address() const { return absl::StrCat(host_, ":", port_); }

absl::StatusOr<std::string> TcpStore::Call(Conn& conn, const std::string& request, Clock::time_point deadline,
                                           bool reconnect) {
  const auto start = Clock::now();
  auto waited = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  };
  std::unique_lock<std::timed_mutex> lock(conn.mu, std::defer_lock);
  if (!lock.try_lock_until(deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("store at ", address(), ": another call on this connection "
                                                    "did not finish within ", waited(), " ms"));
  }
  auto lost = [&](absl::string_view why) {
    return absl::UnavailableError(absl::StrCat("store at ", address(), ": ", why,
                                               " (rank 0, which runs the store, may have died)"));
  };
  if (conn.fd < 0 && reconnect) {
    absl::StatusOr<int> fd = ConnectBy(host_, port_, deadline);
    if (!fd.ok()) {
      if (absl::IsDeadlineExceeded(fd.status())) {
        return absl::DeadlineExceededError(absl::StrCat("store at ", address(), ": no answer within ", waited(),
                                                        " ms (rank 0, which runs the store, may have died or be "
                                                        "out of reach)"));
      }
      return lost(fd.status().message());
    }
    conn.fd = *fd;
  }
  if (conn.fd < 0) return lost("not connected");
  absl::Status st = SendAllBy(conn.fd, request, deadline);
  uint32_t len = 0;
  std::string reply;
  if (st.ok()) st = RecvAllBy(conn.fd, reinterpret_cast<char*>(&len), 4, deadline);
  if (st.ok() && len > 0 && len <= (1u << 30)) {
    reply.resize(len);
    st = RecvAllBy(conn.fd, reply.data(), len, deadline);
  }
  if (!st.ok() || len == 0 || len > (1u << 30)) {
    ::close(conn.fd);  // the stream is out of step now
    conn.fd = -1;
    if (absl::IsDeadlineExceeded(st)) {
      return absl::DeadlineExceededError(absl::StrCat("store at ", address(), ": no reply within ", waited(),
                                                      " ms (rank 0, which runs the store, may have died or be out "
                                                      "of reach)"));
    }
    return lost(st.ok() ? "malformed reply" : st.message());
  }
  return reply;
}

absl::Status TcpStore::Set(const std::string& key, const std::string& value) {
  std::string body;
  PutStr(body, key);
  PutStr(body, value);
  DT_ASSIGN_OR_RETURN(std::string reply, Call(main_, Frame(kSet, body), Clock::now() + timeout_));
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> TcpStore::Get(const std::string& key) {
  std::string body;
  PutStr(body, key);
  DT_ASSIGN_OR_RETURN(std::string reply, Call(main_, Frame(kGet, body), Clock::now() + timeout_));
  if (static_cast<uint8_t>(reply[0]) == kMissing) return std::optional<std::string>();
  Reader r{reply, 1};
  std::string value;
  if (!r.Str(&value)) return absl::InternalError(absl::StrCat("store at ", address(), ": malformed reply"));
  return std::optional<std::string>(std::move(value));
}

absl::Status TcpStore::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::string body;
  PutI64(body, timeout.count());
  PutU32(body, static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) PutStr(body, k);
  DT_ASSIGN_OR_RETURN(std::string reply, Call(main_, Frame(kWait, body), Clock::now() + timeout + kWaitGrace));
  if (static_cast<uint8_t>(reply[0]) == kOk) return absl::OkStatus();
  Reader r{reply, 1};
  uint32_t n = 0;
  std::vector<std::string> missing;
  if (r.U32(&n)) {
    for (uint32_t i = 0; i < n; ++i) {
      std::string k;
      if (r.Str(&k)) missing.push_back(std::move(k));
    }
  }
  return absl::DeadlineExceededError(absl::StrCat("store at ", address(), ": wait timed out after ",
                                                  timeout.count(), " ms; missing keys: ",
                                                  absl::StrJoin(missing, ", ")));
}

absl::StatusOr<std::string> TcpStore::WaitGet(const std::string& key, std::chrono::milliseconds timeout) {
  DT_RETURN_IF_ERROR(Wait({key}, timeout));
  DT_ASSIGN_OR_RETURN(std::optional<std::string> v, Get(key));
  if (!v) return absl::InternalError(absl::StrCat("store key '", key, "' vanished"));
  return *std::move(v);
}

void TcpStore::Arrive(const std::string& key, int64_t value) {
  std::string body;
  PutStr(body, key);
  PutI64(body, value);
  const auto deadline = Clock::now() + timeout_;
  std::unique_lock<std::timed_mutex> lock(arrive_.mu, std::defer_lock);
  if (!lock.try_lock_until(deadline)) return;
  if (arrive_.fd >= 0 && !SendAllBy(arrive_.fd, Frame(kArrive, body), deadline).ok()) {
    ::close(arrive_.fd);  // a partial frame would put the stream out of step
    arrive_.fd = -1;
  }
}

absl::StatusOr<std::vector<std::optional<std::string>>> TcpStore::Peek(const std::vector<std::string>& keys,
                                                                      std::chrono::milliseconds timeout) {
  std::string body;
  PutU32(body, static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) PutStr(body, k);
  DT_ASSIGN_OR_RETURN(std::string reply, Call(peek_, Frame(kPeek, body), Clock::now() + timeout, true));
  Reader r{reply, 1};
  uint32_t n = 0;
  std::vector<std::optional<std::string>> out;
  if (static_cast<uint8_t>(reply[0]) != kValues || !r.U32(&n) || n != keys.size()) {
    return absl::InternalError(absl::StrCat("store at ", address(), ": malformed reply"));
  }
  for (uint32_t i = 0; i < n; ++i) {
    uint8_t present = 0;
    std::string v;
    if (!r.U8(&present) || !r.Str(&v)) {
      return absl::InternalError(absl::StrCat("store at ", address(), ": malformed reply"));
    }
    out.push_back(present ? std::optional<std::string>(std::move(v)) : std::nullopt);
  }
  return out;
}

std::vector<int> ParseRankList(absl::string_view list) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    int r;
    if (absl::SimpleAtoi(part, &r)) out.push_back(r);
  }
  return out;
}

absl::StatusOr<Rendezvous> StartRendezvous(const LaunchInfo& info, std::chrono::milliseconds timeout,
                                           absl::string_view backend) {
  const bool single = info.world_size == 1;
  if (!single && (info.master_addr.empty() || info.master_port == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backend ", backend, ": rank ", info.rank, " of ", info.world_size, " (launcher ", info.launcher,
        ") needs MASTER_ADDR and MASTER_PORT for its store; dtrun sets them, or export them"));
  }
  Rendezvous r;
  int port = info.master_port;
  std::unique_ptr<AgentStoreClient> agent;  // torchrun: Note [Joining torchrun's store]
  if (info.agent_store && !single) {
    DT_ASSIGN_OR_RETURN(agent, AgentStoreClient::Connect(info.master_addr, info.master_port, timeout));
  }
  if (info.rank == 0 && info.store_fd >= 0 && !single && !agent) {
    // Note [dtrun holds the store's port] (tools/dtrun.cc); consumed once, so a child of this
    // process does not try to adopt it too.
    ::unsetenv("DT_STORE_FD");
    DT_ASSIGN_OR_RETURN(r.server, TcpStoreServer::Adopt(info.store_fd, port));
  } else if (info.rank == 0) {
    DT_ASSIGN_OR_RETURN(r.server, TcpStoreServer::Start(single || agent ? 0 : port));
    port = r.server->port();
    if (agent) DT_RETURN_IF_ERROR(agent->Set(AgentStoreKey(info), absl::StrCat(port)));
  } else if (agent) {
    DT_ASSIGN_OR_RETURN(std::string published, agent->WaitGet(AgentStoreKey(info), timeout));
    if (!absl::SimpleAtoi(published, &port) || port <= 0 || port > 65535) {
      return absl::DataLossError(absl::StrCat("torchrun's agent store: key '", AgentStoreKey(info),
                                              "' holds '", published, "', not the port of rank 0's store"));
    }
  }
  const std::string host = info.rank == 0 ? "127.0.0.1" : info.master_addr;
  DT_ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> store, TcpStore::Connect(host, port, info.rank, timeout));
  r.store = std::move(store);
  return r;
}

absl::Status WaitForRanks(TcpStore& store, const std::vector<std::string>& keys, const std::vector<int>& ranks,
                          std::chrono::milliseconds timeout, absl::string_view what, absl::string_view did) {
  absl::Status waited = store.Wait(keys, timeout);
  if (waited.ok()) return waited;
  absl::StatusOr<std::vector<std::optional<std::string>>> v = store.Peek(keys, DiagnosisTime(timeout));
  if (!v.ok()) {
    return absl::Status(waited.code(), absl::StrCat(what, ": ", waited.message(),
                                                    "; cannot tell who is missing: ", v.status().message()));
  }
  std::vector<int> missing;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!(*v)[i].has_value()) missing.push_back(ranks[i]);
  }
  return absl::Status(waited.code(), absl::StrCat(what, ": global rank(s) [", absl::StrJoin(missing, ", "), "] ",
                                                  did, " within ", timeout.count(), " ms (", waited.message(), ")"));
}

absl::Status JoinGroup(TcpStore& store, const std::string& gid, const std::vector<int>& ranks, int me,
                       std::chrono::milliseconds timeout, absl::string_view what) {
  absl::Status set = store.Set(absl::StrCat("g/", gid, "/join/", me), "1");
  if (!set.ok()) return absl::Status(set.code(), absl::StrCat(what, ": ", set.message()));
  std::vector<std::string> keys;
  for (size_t i = 0; i < ranks.size(); ++i) keys.push_back(absl::StrCat("g/", gid, "/join/", i));
  return WaitForRanks(store, keys, ranks, timeout, what, "did not join");
}

std::chrono::milliseconds DiagnosisTime(std::chrono::milliseconds timeout) {
  return std::clamp<std::chrono::milliseconds>(timeout / 4, std::chrono::milliseconds(500),
                                               std::chrono::milliseconds(1000));
}

std::string GroupKey(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size(), "x", absl::Hex(GroupHash(ranks)));
}

}  // namespace dt::internal
