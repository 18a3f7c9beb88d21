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
//   Add(k, d)        new value                  k holds a decimal integer
//   Arrive(k, v)     none (fire and forget)     k = max(k, v); collective arrival markers
//   Hello(rank)      none                       names the connection; when it closes without Bye
//                                               the server appends the rank to key "dt/dead"
//   Bye              none                       clean shutdown
// Messages are [u32 length][u8 command][fields], strings as [u32 length][bytes].

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace dt::internal {

class TcpStoreServer {
 public:
  // Listens on all interfaces at `port` (0: any free port; see port()).
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(int port);
  // Waits up to `linger` for clients to disconnect, then stops.
  ~TcpStoreServer();
  int port() const { return port_; }
  void set_linger(std::chrono::milliseconds linger) { linger_ = linger; }

 private:
  struct State;
  TcpStoreServer() = default;
  void Loop();

  int port_ = 0;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::chrono::milliseconds linger_{10'000};
  std::unique_ptr<State> state_;
  std::thread thread_;
};

class TcpStore {
 public:
  // Connects to host:port, retrying until `timeout` (the server may start after us).
  static absl::StatusOr<std::unique_ptr<TcpStore>> Connect(const std::string& host, int port, int rank,
                                                           std::chrono::milliseconds timeout);
  ~TcpStore();  // says Bye

  absl::Status Set(const std::string& key, const std::string& value);
  absl::StatusOr<std::optional<std::string>> Get(const std::string& key);
  // OK when every key exists; DeadlineExceeded naming the missing keys after `timeout`.
  absl::Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // Wait + Get.
  absl::StatusOr<std::string> WaitGet(const std::string& key, std::chrono::milliseconds timeout);
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  // Best effort, no reply, on a second connection of its own so that it never waits behind a
  // long Wait() of another thread.
  void Arrive(const std::string& key, int64_t value);
  // Ranks whose store connection closed without Bye (they died), in order of death.
  std::vector<int> DeadRanks();
  std::string address() const;  // "host:port"

 private:
  TcpStore() = default;
  absl::StatusOr<std::string> Call(const std::string& request, std::chrono::milliseconds reply_timeout);

  std::mutex mu_;
  int fd_ = -1;
  std::mutex arrive_mu_;
  int arrive_fd_ = -1;
  std::string host_;
  int port_ = 0;
};

struct LaunchInfo;

// The store of a job: rank 0 starts the server at MASTER_PORT (any free port in a world of one)
// and every rank connects to it. `backend` names the caller in errors.
struct Rendezvous {
  std::unique_ptr<TcpStoreServer> server;  // rank 0 only; must outlive `store`
  std::shared_ptr<TcpStore> store;
};
absl::StatusOr<Rendezvous> StartRendezvous(const LaunchInfo& info, std::chrono::milliseconds timeout,
                                           absl::string_view backend);

// Group creation's first step: member `me` of `ranks` joins under "g/<gid>/join/<me>" and waits for
// the others; the error names the members that did not join within `timeout`. `what` prefixes it.
absl::Status JoinGroup(TcpStore& store, const std::string& gid, const std::vector<int>& ranks, int me,
                       std::chrono::milliseconds timeout, absl::string_view what);

// A short store key for a group: "<size>x<hash of the rank list>".
std::string GroupKey(const std::vector<int>& ranks);

}  // namespace dt::internal
