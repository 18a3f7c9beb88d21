#pragma once
// Internal to mesh/: the Work handles the backends return.
//   DeferredWork  runs its function on the first Wait() (threads-backend receives, gloo send/recv)
//   WorkQueue     one FIFO worker thread per gloo communicator (gloo's calls block, so this is what
//                 makes XxxAsync asynchronous). Wait() on the item at the head of the queue that the
//                 worker has not started runs it on the waiting thread instead: a synchronous call
//                 costs no thread hand-off (two wake-ups, which take milliseconds on a loaded box).

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "dtensor/mesh/comm_types.h"

namespace dt::internal {

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

  WorkPtr Post(std::function<absl::Status()> fn);

  struct State;

 private:
  std::shared_ptr<State> state_;
  std::thread worker_;
};

}  // namespace dt::internal
