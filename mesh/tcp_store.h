#pragma once
// Internal to mesh/: a small key-value store over TCP for rendezvous — gloo's connectFullMesh, NCCL
// unique ids, and fault diagnosis. Debian's gloo ships no TCP store (only file and redis stores).
//
// TcpStoreServer runs on global rank 0 at MASTER_ADDR:MASTER_PORT (one thread, poll()); every rank,
// rank 0 included, talks to it through one TcpStore client connection.
//
//   request          reply                      notes
//   Set(k, v)        ok
//   Get(k)           value or "missing"         never blocks
//   Wait(keys, t)    ok, or the missing keys    the server times the wait out after t
//   Arrive(k, v)     none (fire and forget)     k = max(k, v); collective arrival markers
//   Peek(keys)       each value or "missing"    never blocks; for diagnosis
//   Hello(rank)      none                       names the connection; when it closes without Bye
//                                               the server appends the rank to key "dt/dead",
//                                               after a Bye to key "dt/left"
//   Bye              none                       clean shutdown
// Messages are [u32 length][u8 command][fields], strings as [u32 length][bytes].
//
// Note [Store deadlines]
//   Every client call returns by a deadline, also when the server is behind a network partition
//   (nothing answers, no connection closes): Set/Get and connecting within the timeout given
//   to Connect (the world's), Wait within its own timeout plus kWaitGrace (the server answers at
//   the timeout; the grace covers its latency), Arrive's send within the timeout, Peek within the
//   (short) time its caller gives. A client connection has three sockets: the main one (Hello;
//   Set/Get/Wait, one call at a time), one for Arrive, and one for Peek made on first use, so
//   that diagnosing a failure never waits behind another thread's Wait. The server never blocks on
//   a client: replies to a client that does not read are queued.

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dtensor/mesh/sockets.h"

namespace dt::internal {

class TcpStoreServer {
 public:
  // Listens on all interfaces at `port` (0: any free port; see port()). A server of this process
  // still lingering on `port` is waited for first (Note [The store lingers in the background]).
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(int port);
  // Serves on `fd`, a socket that dtrun already listens on at `port` and handed to rank 0 (Note
  // [dtrun holds the store's port] in tools/dtrun.cc); takes ownership. InvalidArgument naming
  // DT_STORE_FD when `fd` is not a listening TCP socket on `port`.
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Adopt(int fd, int port);
  // Returns at once; the server serves on in the background until every client has closed its
  // connection, for at most kLinger (Note [The store lingers in the background]).
  ~TcpStoreServer();
  int port() const;

  static constexpr std::chrono::milliseconds kLinger{10'000};
  struct Serving;  // the server's state and thread (tcp_store.cc)

 private:
  explicit TcpStoreServer(std::unique_ptr<Serving> serving);
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Serve(int listen_fd, int port);
  std::unique_ptr<Serving> serving_;
};

class TcpStore {
 public:
  // Connects to host:port, retrying until `timeout` (the server may start after us). `timeout`
  // also bounds every later call (see Note [Store deadlines]).
  static absl::StatusOr<std::unique_ptr<TcpStore>> Connect(const std::string& host, int port, int rank,
                                                           std::chrono::milliseconds timeout);
  ~TcpStore();  // says Bye

  // Errors: Unavailable (connection lost), DeadlineExceeded (no reply within the timeout).
  absl::Status Set(const std::string& key, const std::string& value);
  absl::StatusOr<std::optional<std::string>> Get(const std::string& key);
  // OK when every key exists; DeadlineExceeded naming the missing keys after `timeout`.
  absl::Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // Wait + Get.
  absl::StatusOr<std::string> WaitGet(const std::string& key, std::chrono::milliseconds timeout);
  // Best effort, no reply, on a connection of its own so that it never waits behind a long Wait()
  // of another thread.
  void Arrive(const std::string& key, int64_t value);
  // For diagnosis: the values of `keys` (nullopt where missing), all within `timeout`, on a
  // connection of its own.
  absl::StatusOr<std::vector<std::optional<std::string>>> Peek(const std::vector<std::string>& keys,
                                                               std::chrono::milliseconds timeout);
  std::string address() const;  // "host:port"

  // The keys listing the ranks whose store connection closed without Bye (they died), and with
  // Bye (they left), in order ("4,5"; see ParseRankList).
  static constexpr absl::string_view kDeadKey = "dt/dead";
  static constexpr absl::string_view kLeftKey = "dt/left";
  static constexpr std::chrono::milliseconds kWaitGrace{1000};

 private:
  using Clock = std::chrono::steady_clock;
  struct Conn {
    std::timed_mutex mu;
    int fd = -1;
  };
  TcpStore() = default;
  // One request and its reply on `conn` by `deadline`; `reconnect`: connect first when needed.
  absl::StatusOr<std::string> Call(Conn& conn, const std::string& request, Clock::time_point deadline,
                                   bool reconnect = false);

  Conn main_, arrive_, peek_;
  std::string host_;
  int port_ = 0;
  std::chrono::milliseconds timeout_{0};
};

// "4,5" -> {4, 5}; what does not parse is skipped.
std::vector<int> ParseRankList(absl::string_view list);

struct LaunchInfo;

// The store of a job: rank 0 starts the server at MASTER_PORT (any free port in a world of one)
// and every rank connects to it. `backend` names the caller in errors.
struct Rendezvous {
  std::unique_ptr<TcpStoreServer> server;  // rank 0 only; must outlive `store`
  std::shared_ptr<TcpStore> store;
};
absl::StatusOr<Rendezvous> StartRendezvous(const LaunchInfo& info, std::chrono::milliseconds timeout,
                                           absl::string_view backend);

// Waits until every one of `keys` exists, `keys[i]` being what global rank `ranks[i]` publishes;
// on a timeout the error names the ranks whose key is missing: "<what>: global rank(s) [1] <did>
// within 3000 ms (...)".
absl::Status WaitForRanks(TcpStore& store, const std::vector<std::string>& keys, const std::vector<int>& ranks,
                          std::chrono::milliseconds timeout, absl::string_view what, absl::string_view did);

// Group creation's first step: member `me` of `ranks` joins under "g/<gid>/join/<me>" and waits for
// the others; the error names the members that did not join within `timeout`. `what` prefixes it.
absl::Status JoinGroup(TcpStore& store, const std::string& gid, const std::vector<int>& ranks, int me,
                       std::chrono::milliseconds timeout, absl::string_view what);

// How long diagnosing a failure may take (store peeks, peer probes; see Note [Gloo backend]): a
// quarter of the timeout, within [500 ms, 1 s].
std::chrono::milliseconds DiagnosisTime(std::chrono::milliseconds timeout);

// A short store key for a group: "<size>x<hash of the rank list>".
std::string GroupKey(const std::vector<int>& ranks);

}  // namespace dt::internal
