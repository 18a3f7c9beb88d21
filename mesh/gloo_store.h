#pragma once
// Internal to mesh/ (and bench/collectives): gloo::rendezvous::Store over our TcpStore. Gloo
// expects stores to throw, so failures become gloo::IoException (caught where gloo is called).

#include <chrono>
#include <string>
#include <vector>

#include "gloo/common/error.h"
#include "gloo/rendezvous/store.h"
#include "dtensor/mesh/tcp_store.h"

namespace dt::internal {

class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(TcpStore& store, std::chrono::milliseconds timeout) : store_(store), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_.Set(key, std::string(data.begin(), data.end())));
  }
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> v = store_.WaitGet(key, timeout_);
    Check(v.status());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    Check(store_.Wait(keys, timeout));
  }

 private:
  static void Check(const absl::Status& st) {
    if (!st.ok()) throw gloo::IoException(std::string(st.message()));
  }
  TcpStore& store_;
  std::chrono::milliseconds timeout_;
};

}  // namespace dt::internal
