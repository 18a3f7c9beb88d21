#include "dtensor/mesh/agent_store.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "dtensor/mesh/backends.h"
#include "dtensor/mesh/sockets.h"

namespace dt::internal {
namespace {

constexpr uint8_t kValidate = 0, kSet = 1, kGet = 3, kCheck = 5;
constexpr uint32_t kMagic = 0x3C85F7CE;
constexpr uint8_t kReady = 0, kNotReady = 1;
// A value larger than this is not a port number: refuse instead of allocating it.
constexpr uint64_t kMaxValueBytes = 1 << 20;

void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutString(std::string* out, const std::string& s) {
  PutU64(out, s.size());
  out->append(s);
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AgentStoreClient>> AgentStoreClient::Connect(
    const std::string& host, int port, std::chrono::milliseconds timeout) {
  std::unique_ptr<AgentStoreClient> c(new AgentStoreClient());
  c->address_ = absl::StrCat(host, ":", port);
  c->timeout_ = timeout;
  const auto deadline = SteadyClock::now() + timeout;
  absl::StatusOr<int> fd = ConnectBy(host, port, deadline);
  if (!fd.ok()) {
    return absl::Status(fd.status().code(), absl::StrCat("torchrun's agent store at ", c->address_, ": ",
                                                         fd.status().message()));
  }
  c->fd_ = *fd;
  SetNoDelay(c->fd_);
  std::string hello(1, static_cast<char>(kValidate));
  for (int i = 0; i < 4; ++i) hello.push_back(static_cast<char>((kMagic >> (8 * i)) & 0xff));
  absl::Status sent = SendAllBy(c->fd_, hello, deadline);
  if (!sent.ok()) {
    return absl::Status(sent.code(), absl::StrCat("torchrun's agent store at ", c->address_, ": ", sent.message()));
  }
  return c;
}

AgentStoreClient::~AgentStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status AgentStoreClient::Set(const std::string& key, const std::string& value) {
  std::string req(1, static_cast<char>(kSet));
  PutString(&req, key);
  PutString(&req, value);
  absl::Status s = SendAllBy(fd_, req, SteadyClock::now() + timeout_);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("torchrun's agent store at ", address_, ": set '", key, "': ",
                                             s.message()));
}

absl::StatusOr<std::string> AgentStoreClient::WaitGet(const std::string& key, std::chrono::milliseconds timeout) {
  const auto deadline = SteadyClock::now() + timeout;
  auto fail = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("torchrun's agent store at ", address_, ": '", key, "': ",
                                               s.message()));
  };
  std::string check(1, static_cast<char>(kCheck));
  PutU64(&check, 1);
  PutString(&check, key);
  for (auto pause = std::chrono::milliseconds(1);; pause = std::min(pause * 2, std::chrono::milliseconds(50))) {
    if (absl::Status s = SendAllBy(fd_, check, deadline); !s.ok()) return fail(s);
    char answer = 0;
    if (absl::Status s = RecvAllBy(fd_, &answer, 1, deadline); !s.ok()) return fail(s);
    if (answer == kReady) break;
    if (answer != kNotReady) {
      return fail(absl::DataLossError(absl::StrCat("CHECK answered ", static_cast<int>(answer),
                                                   ", neither ready (0) nor not ready (1)")));
    }
    if (SteadyClock::now() + pause > deadline) {
      return fail(absl::DeadlineExceededError(absl::StrCat("not set within ", timeout.count(),
                                                           " ms (did rank 0 start?)")));
    }
    std::this_thread::sleep_for(pause);
  }
  std::string get(1, static_cast<char>(kGet));
  PutString(&get, key);
  if (absl::Status s = SendAllBy(fd_, get, deadline); !s.ok()) return fail(s);
  char len[8];
  if (absl::Status s = RecvAllBy(fd_, len, 8, deadline); !s.ok()) return fail(s);
  const uint64_t n = GetU64(len);
  if (n > kMaxValueBytes) {
    return fail(absl::DataLossError(absl::StrCat("value of ", n, " bytes, more than the ", kMaxValueBytes,
                                                 " a store address can need")));
  }
  std::string value(n, '\0');
  if (absl::Status s = RecvAllBy(fd_, value.data(), n, deadline); !s.ok()) return fail(s);
  return value;
}

std::string AgentStoreKey(const LaunchInfo& info) {
  return absl::StrCat("/dtensor/", info.run_id, "/", info.restart_count, "/store");
}

}  // namespace dt::internal
