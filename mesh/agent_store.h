#pragma once
// Internal to mesh/: joining torchrun's rendezvous. torchrun's agent already serves a c10d TCPStore
// on MASTER_ADDR:MASTER_PORT and tells its workers so with TORCHELASTIC_USE_AGENT_STORE=True, so a
// worker that starts its own store there fails ("cannot listen on port …: Address already in
// use").
//
// Note [Joining torchrun's store]
// Our store (mesh/tcp_store.h) does more than c10d's: arrival markers, peeks that never wait, and
// knowing which rank's connection closed without a goodbye (dead-rank diagnosis). So under torchrun
// rank 0 still runs our server, on a free port, and the agent's store is used for one thing only:
// rank 0 publishes that port under a key naming the run and the restart
// ("/dtensor/<TORCHELASTIC_RUN_ID>/<TORCHELASTIC_RESTART_COUNT>/store"), every other rank waits
// for it there and then connects to MASTER_ADDR:<port> (rank 0 runs on the agent's host: torchrun
// derives MASTER_ADDR from it). Nothing else changes, so the same program runs under dtrun,
// torchrun, mpirun and srun.
//
// AgentStoreClient speaks the part of the c10d TCPStore wire protocol this needs (learned from
// PyTorch's TCPStore and checked against torch 2.15's server, tests/mesh/agent_store_test.cc):
//   connect       [u8 0 VALIDATE][u32 0x3C85F7CE]                    no reply
//   set           [u8 1 SET][u64 n][key][u64 m][value]                no reply
//   get           [u8 3 GET][u64 n][key]                              [u64 m][value]
//   check         [u8 5 CHECK][u64 1][u64 n][key]                     [u8 0 ready | 1 not ready]
// Integers are little-endian. Keys are sent as given: torch's own clients prefix theirs with "/".
// Waiting is a CHECK every few milliseconds until the deadline (no server-side wait to cancel).

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace dt::internal {

struct LaunchInfo;

class AgentStoreClient {
 public:
  // Connects to the c10d store at host:port within `timeout`, which also bounds every later call.
  static absl::StatusOr<std::unique_ptr<AgentStoreClient>> Connect(const std::string& host, int port,
                                                                   std::chrono::milliseconds timeout);
  ~AgentStoreClient();

  absl::Status Set(const std::string& key, const std::string& value);
  // The value of `key` once it exists; DeadlineExceeded naming the key after `timeout`.
  absl::StatusOr<std::string> WaitGet(const std::string& key, std::chrono::milliseconds timeout);

 private:
  AgentStoreClient() = default;
  std::string address_;
  int fd_ = -1;
  std::chrono::milliseconds timeout_{0};
};

// The key rank 0 publishes our store's port under (see the Note).
std::string AgentStoreKey(const LaunchInfo& info);

}  // namespace dt::internal
