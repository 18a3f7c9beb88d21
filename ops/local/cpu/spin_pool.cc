// Note [Spinning workers]
// A decode step is some 200 small products (SmolLM2: 30 layers x 7 GEMVs of 10-60 us each, plus
// attention) separated by serial work on the calling thread (norms, RoPE, the KV cache). oneTBB's
// workers leave the arena when it runs dry and come back only after a wake-up through the market:
// sampled with gdb during a 2-thread SmolLM2 decode (AMD EPYC Zen 4 VM), the caller ran a GEMV in
// 16 of 25 samples and the worker took part in one; the others it spent in sched_yield, so a
// "2-thread" decode read its weights on one thread (130-155 tokens/s against 100-118 on one).
// These workers instead spin on a generation counter for kSpin after each job (the gaps between
// a step's products are far shorter), then sleep on a condition variable; the caller always takes
// tasks itself, so a job finishes even when no worker shows up (a forked child, a busy machine).
// llama.cpp's thread pool does the same. The workers count against the process's core budget
// (AvailableThreads: Note [One core budget per node]): with one thread per rank there are none.
//
// Job hand-over: the caller publishes the job's fields, then `accepting` (seq_cst), then bumps
// the generation. A worker announces itself in `in_flight` before it reads `accepting`; the caller,
// once every task is done, clears `accepting` and waits for `in_flight` to drain. Under the seq_cst
// order a worker that was not counted by then reads `accepting` false and leaves without touching
// the job, so the caller's fn (a reference to its stack) is never called after it returns.

#include "dtensor/ops/local/cpu/spin_pool.h"

#include "dtensor/ops/local/cpu/gemm_scratch.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dt::ops::cpu {

namespace {

constexpr std::chrono::microseconds kSpin{500};

inline void Pause() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

class SpinPool {
 public:
  // False when another caller holds the pool: the caller then runs the tasks itself.
  bool TryRun(int64_t n, int threads, absl::FunctionRef<void(int64_t)> fn) {
    std::unique_lock<std::mutex> run(run_mu_, std::try_to_lock);
    if (!run.owns_lock()) return false;
    const int helpers = threads - 1;
    while (static_cast<int>(workers_.size()) < helpers) {
      const int idx = static_cast<int>(workers_.size());
      workers_.emplace_back([this, idx] { Work(idx); });
      workers_.back().detach();
    }
    fn_ = &fn;
    n_ = n;
    helpers_ = helpers;
    next_.store(0);
    done_.store(0);
    accepting_.store(true);
    gen_.fetch_add(1);
    if (sleepers_.load() > 0) {
      std::lock_guard<std::mutex> lock(sleep_mu_);
      wake_.notify_all();
    }
    RunTasks();
    while (done_.load(std::memory_order_acquire) < n) Pause();
    accepting_.store(false);
    while (in_flight_.load() > 0) Pause();
    return true;
  }

 private:
  void RunTasks() {
    for (int64_t i = next_.fetch_add(1); i < n_; i = next_.fetch_add(1)) {
      (*fn_)(i);
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  void Work(int idx) {
    uint64_t seen = gen_.load();
    for (;;) {
      const auto until = std::chrono::steady_clock::now() + kSpin;
      int polls = 0;
      while (gen_.load(std::memory_order_relaxed) == seen) {
        Pause();
        if (++polls % 256 == 0 && std::chrono::steady_clock::now() > until) {
          std::unique_lock<std::mutex> lock(sleep_mu_);
          sleepers_.fetch_add(1);
          wake_.wait(lock, [&] { return gen_.load() != seen; });
          sleepers_.fetch_sub(1);
        }
      }
      seen = gen_.load();
      in_flight_.fetch_add(1);
      if (accepting_.load() && idx < helpers_) RunTasks();
      in_flight_.fetch_sub(1);
    }
  }

  std::mutex run_mu_;
  std::vector<std::thread> workers_;
  const absl::FunctionRef<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int helpers_ = 0;
  std::atomic<int64_t> next_{0}, done_{0};
  std::atomic<bool> accepting_{false};
  std::atomic<int> in_flight_{0};
  std::atomic<uint64_t> gen_{0};
  std::mutex sleep_mu_;
  std::condition_variable wake_;
  std::atomic<int> sleepers_{0};
};

}  // namespace

void ParallelTasks(int64_t n, absl::FunctionRef<void(int64_t)> fn) {
  const int threads = n > 1 ? static_cast<int>(std::min<int64_t>(gemm::AvailableThreads(), n)) : 1;
  if (threads > 1) {
    // Never destroyed: its workers may still spin while the process exits.
    static SpinPool* pool = new SpinPool;
    if (pool->TryRun(n, threads, fn)) return;
  }
  for (int64_t i = 0; i < n; ++i) fn(i);
}

}  // namespace dt::ops::cpu
