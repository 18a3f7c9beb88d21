#pragma once
// Internal to mesh/: the Work handles the backends return.
//   AsyncWork     completed by another thread (a worker queue, a progress loop)
//   DeferredWork  runs its function on the first Wait() (threads-backend receives)
//   WorkQueue     one FIFO worker thread; Post() returns the item's AsyncWork. Gloo's calls block,
//                 so each gloo communicator runs them here to make XxxAsync truly asynchronous.

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "mesh/communicator.h"

namespace dt::internal {

class AsyncWork final : public Work {
 public:
  void Complete(absl::Status status);
  absl::Status Wait() override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  absl::Status status_;
};

class DeferredWork final : public Work {
 public:
  explicit DeferredWork(std::function<absl::Status()> fn) : fn_(std::move(fn)) {}
  absl::Status Wait() override;

 private:
  std::mutex mu_;
  std::function<absl::Status()> fn_;
  absl::Status status_;
};

class WorkQueue {
 public:
  WorkQueue();
  ~WorkQueue();  // runs what is queued, then joins the worker
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  std::shared_ptr<AsyncWork> Post(std::function<absl::Status()> fn);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<absl::Status()>, std::shared_ptr<AsyncWork>>> items_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace dt::internal
