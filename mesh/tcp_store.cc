#include "mesh/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/status.h"
#include "mesh/backends.h"

namespace dt::internal {
namespace {

using Clock = std::chrono::steady_clock;

enum Cmd : uint8_t {
  kHello = 1, kSet, kGet, kWait, kAdd, kArrive, kBye,
  kOk = 100, kValue, kMissing, kTimeout, kNumber,
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
};

bool SendAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads exactly `n` bytes by `deadline`. Error: "timeout", "closed" or strerror.
absl::Status RecvAll(int fd, char* buf, size_t n, Clock::time_point deadline) {
  size_t off = 0;
  while (off < n) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return absl::DeadlineExceededError("no reply in time");
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) continue;
    ssize_t got = ::recv(fd, buf + off, n - off, 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got == 0) return absl::UnavailableError("connection closed");
    if (got < 0) return absl::UnavailableError(std::strerror(errno));
    off += static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

void NoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

// ---- server -----------------------------------------------------------------------------------

struct TcpStoreServer::State {
  struct Client {
    std::string in;
    int rank = -1;
    bool bye = false;
  };
  struct Waiter {
    int fd;
    std::vector<std::string> keys;
    Clock::time_point deadline;
  };
  std::map<std::string, std::string> kv;
  std::map<int, Client> clients;
  std::vector<Waiter> waiters;
  std::vector<int> dead;

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
        SendAll(waiters[i].fd, Frame(kOk));
      } else if (expire && now >= waiters[i].deadline) {
        std::string body;
        PutU32(body, static_cast<uint32_t>(missing.size()));
        for (const auto& k : missing) PutStr(body, k);
        SendAll(waiters[i].fd, Frame(kTimeout, body));
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
    if (it->second.rank >= 0 && !it->second.bye &&
        std::find(dead.begin(), dead.end(), it->second.rank) == dead.end()) {
      dead.push_back(it->second.rank);
      kv["dt/dead"] = absl::StrJoin(dead, ",");
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
        SendAll(fd, Frame(kOk));
        ServeWaiters(false);
        return true;
      case kGet: {
        if (!r.Str(&key)) return false;
        auto it = kv.find(key);
        if (it == kv.end()) {
          SendAll(fd, Frame(kMissing));
        } else {
          std::string body;
          PutStr(body, it->second);
          SendAll(fd, Frame(kValue, body));
        }
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
      case kAdd:
      case kArrive: {
        if (!r.Str(&key) || !r.I64(&num)) return false;
        int64_t old = 0;
        auto it = kv.find(key);
        if (it != kv.end() && !absl::SimpleAtoi(it->second, &old)) old = 0;
        const int64_t now = msg[0] == kAdd ? old + num : std::max(old, num);
        kv[key] = absl::StrCat(now);
        if (msg[0] == kAdd) {
          std::string body;
          PutI64(body, now);
          SendAll(fd, Frame(kNumber, body));
        }
        ServeWaiters(false);
        return true;
      }
      default:
        return false;
    }
  }
};

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(int port) {
  std::unique_ptr<TcpStoreServer> s(new TcpStoreServer());
  s->state_ = std::make_unique<State>();
  s->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) return absl::InternalError(absl::StrCat("store: socket: ", std::strerror(errno)));
  int one = 1;
  ::setsockopt(s->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(s->listen_fd_, 1024) != 0) {
    const int err = errno;
    ::close(s->listen_fd_);
    s->listen_fd_ = -1;
    return absl::UnavailableError(absl::StrCat("store: cannot listen on port ", port, ": ", std::strerror(err),
                                               " (is another job using MASTER_PORT ", port, "?)"));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  s->port_ = ntohs(addr.sin_port);
  if (::pipe2(s->wake_, O_CLOEXEC) != 0) return absl::InternalError("store: pipe failed");
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

TcpStoreServer::~TcpStoreServer() {
  if (thread_.joinable()) {
    char c = 0;
    (void)!::write(wake_[1], &c, 1);
    thread_.join();
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  for (int fd : wake_) if (fd >= 0) ::close(fd);
}

void TcpStoreServer::Loop() {
  State& st = *state_;
  std::optional<Clock::time_point> stop_by;
  while (true) {
    if (stop_by && (st.clients.empty() || Clock::now() >= *stop_by)) break;
    std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (const auto& [fd, c] : st.clients) fds.push_back({fd, POLLIN, 0});
    int timeout_ms = 1000;
    for (const auto& w : st.waiters) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(w.deadline - Clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left + 1, 0, timeout_ms));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) {
      char c;
      (void)!::read(wake_[0], &c, 1);
      stop_by = Clock::now() + linger_;
    }
    if (fds[1].revents & POLLIN) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        NoDelay(fd);
        st.clients[fd];
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const int fd = fds[i].fd;
      char buf[65536];
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
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
  }
  for (auto it = st.clients.begin(); it != st.clients.end(); it = st.clients.begin()) {
    it->second.bye = true;  // we are leaving, not they
    st.Drop(it->first);
  }
}

// ---- client -----------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(const std::string& host, int port, int rank,
                                                            std::chrono::milliseconds timeout) {
  std::unique_ptr<TcpStore> s(new TcpStore());
  s->host_ = host;
  s->port_ = port;
  const auto deadline = Clock::now() + timeout;
  std::string last_error = "no attempt";
  auto connect_once = [&]() -> int {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai != 0) {
      last_error = absl::StrCat("cannot resolve '", host, "': ", ::gai_strerror(gai));
      return -1;
    }
    int out = -1;
    for (addrinfo* a = res; a != nullptr && out < 0; a = a->ai_next) {
      int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        out = fd;
      } else {
        last_error = std::strerror(errno);
        ::close(fd);
      }
    }
    ::freeaddrinfo(res);
    if (out >= 0) NoDelay(out);
    return out;
  };
  while (true) {
    s->fd_ = connect_once();
    if (s->fd_ >= 0) break;
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("store at ", host, ":", port, ": cannot connect within ",
                                                      timeout.count(), " ms: ", last_error,
                                                      " (is rank 0 running, and MASTER_ADDR/MASTER_PORT right?)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  s->arrive_fd_ = connect_once();  // anonymous (no Hello): only the main connection tracks death
  std::string body;
  PutU32(body, static_cast<uint32_t>(rank));
  if (!SendAll(s->fd_, Frame(kHello, body))) {
    return absl::UnavailableError(absl::StrCat("store at ", s->address(), ": connection lost"));
  }
  return s;
}

TcpStore::~TcpStore() {
  if (arrive_fd_ >= 0) ::close(arrive_fd_);
  if (fd_ >= 0) {
    SendAll(fd_, Frame(kBye));
    ::shutdown(fd_, SHUT_WR);
    ::close(fd_);
  }
}

std::string TcpStore::address() const { return absl::StrCat(host_, ":", port_); }

absl::StatusOr<std::string> TcpStore::Call(const std::string& request, std::chrono::milliseconds reply_timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  auto lost = [&](absl::string_view why) {
    return absl::UnavailableError(absl::StrCat("store at ", address(), ": ", why,
                                               " (rank 0, which runs the store, may have died)"));
  };
  if (fd_ < 0) return lost("not connected");
  if (!SendAll(fd_, request)) return lost(std::strerror(errno));
  uint32_t len = 0;
  const auto deadline = Clock::now() + reply_timeout;
  absl::Status st = RecvAll(fd_, reinterpret_cast<char*>(&len), 4, deadline);
  std::string reply;
  if (st.ok()) {
    reply.resize(len);
    st = RecvAll(fd_, reply.data(), len, deadline);
  }
  if (!st.ok() || len == 0) {
    ::close(fd_);  // the stream is out of step now
    fd_ = -1;
    return lost(st.ok() ? "empty reply" : st.message());
  }
  return reply;
}

absl::Status TcpStore::Set(const std::string& key, const std::string& value) {
  std::string body;
  PutStr(body, key);
  PutStr(body, value);
  DT_ASSIGN_OR_RETURN(std::string reply, Call(Frame(kSet, body), std::chrono::seconds(60)));
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> TcpStore::Get(const std::string& key) {
  std::string body;
  PutStr(body, key);
  DT_ASSIGN_OR_RETURN(std::string reply, Call(Frame(kGet, body), std::chrono::seconds(60)));
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
  DT_ASSIGN_OR_RETURN(std::string reply, Call(Frame(kWait, body), timeout + std::chrono::seconds(30)));
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
  return absl::DeadlineExceededError(absl::StrCat("store wait timed out after ", timeout.count(),
                                                  " ms; missing keys: ", absl::StrJoin(missing, ", ")));
}

absl::StatusOr<std::string> TcpStore::WaitGet(const std::string& key, std::chrono::milliseconds timeout) {
  DT_RETURN_IF_ERROR(Wait({key}, timeout));
  DT_ASSIGN_OR_RETURN(std::optional<std::string> v, Get(key));
  if (!v) return absl::InternalError(absl::StrCat("store key '", key, "' vanished"));
  return *std::move(v);
}

absl::StatusOr<int64_t> TcpStore::Add(const std::string& key, int64_t delta) {
  std::string body;
  PutStr(body, key);
  PutI64(body, delta);
  DT_ASSIGN_OR_RETURN(std::string reply, Call(Frame(kAdd, body), std::chrono::seconds(60)));
  Reader r{reply, 1};
  int64_t v = 0;
  if (!r.I64(&v)) return absl::InternalError(absl::StrCat("store at ", address(), ": malformed reply"));
  return v;
}

void TcpStore::Arrive(const std::string& key, int64_t value) {
  std::string body;
  PutStr(body, key);
  PutI64(body, value);
  std::lock_guard<std::mutex> lock(arrive_mu_);
  if (arrive_fd_ >= 0 && !SendAll(arrive_fd_, Frame(kArrive, body))) {
    ::close(arrive_fd_);
    arrive_fd_ = -1;
  }
}

std::vector<int> TcpStore::DeadRanks() {
  std::vector<int> out;
  absl::StatusOr<std::optional<std::string>> v = Get("dt/dead");
  if (!v.ok() || !v->has_value()) return out;
  for (absl::string_view part : absl::StrSplit(**v, ',')) {
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
  if (info.rank == 0) {
    DT_ASSIGN_OR_RETURN(r.server, TcpStoreServer::Start(single ? 0 : port));
    port = r.server->port();
  }
  const std::string host = info.rank == 0 ? "127.0.0.1" : info.master_addr;
  DT_ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> store, TcpStore::Connect(host, port, info.rank, timeout));
  r.store = std::move(store);
  return r;
}

absl::Status JoinGroup(TcpStore& store, const std::string& gid, const std::vector<int>& ranks, int me,
                       std::chrono::milliseconds timeout, absl::string_view what) {
  DT_RETURN_IF_ERROR(store.Set(absl::StrCat("g/", gid, "/join/", me), "1"));
  std::vector<std::string> keys;
  for (size_t i = 0; i < ranks.size(); ++i) keys.push_back(absl::StrCat("g/", gid, "/join/", i));
  absl::Status joined = store.Wait(keys, timeout);
  if (joined.ok()) return joined;
  std::vector<int> missing;
  for (size_t i = 0; i < ranks.size(); ++i) {
    absl::StatusOr<std::optional<std::string>> v = store.Get(keys[i]);
    if (v.ok() && !v->has_value()) missing.push_back(ranks[i]);
  }
  return absl::Status(joined.code(), absl::StrCat(what, ": global rank(s) [", absl::StrJoin(missing, ", "),
                                                  "] did not join within ", timeout.count(), " ms (",
                                                  joined.message(), ")"));
}

std::string GroupKey(const std::vector<int>& ranks) {
  uint64_t h = 1469598103934665603ull;
  for (int r : ranks) h = (h ^ static_cast<uint64_t>(r)) * 1099511628211ull;
  return absl::StrCat(ranks.size(), "x", absl::Hex(h));
}

}  // namespace dt::internal
