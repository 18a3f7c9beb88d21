#include "dtensor/mesh/work.h"

namespace dt::internal {

absl::Status DeferredWork::Wait() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fn_) {
    status_ = fn_();
    fn_ = nullptr;
  }
  return status_;
}

namespace {
struct Task {
  std::function<absl::Status()> fn;
  bool started = false;
  bool done = false;
  absl::Status status;
};
}  // namespace

struct WorkQueue::State {
  std::mutex mu;
  std::condition_variable has_items;
  std::condition_variable finished;
  std::deque<std::shared_ptr<Task>> items;
  bool stop = false;

  // Runs `task` (already popped and marked started) without the lock.
  void Run(std::unique_lock<std::mutex>& lock, Task& task) {
    lock.unlock();
    absl::Status st = task.fn();
    lock.lock();
    task.status = std::move(st);
    task.done = true;
    task.fn = nullptr;
    finished.notify_all();
  }
};

namespace {
class QueuedWork final : public Work {
 public:
  QueuedWork(std::shared_ptr<WorkQueue::State> state, std::shared_ptr<Task> task)
      : state_(std::move(state)), task_(std::move(task)) {}
  absl::Status Wait() override {
    std::unique_lock<std::mutex> lock(state_->mu);
    if (!task_->started && !state_->items.empty() && state_->items.front() == task_) {
      state_->items.pop_front();
      task_->started = true;
      state_->Run(lock, *task_);
    }
    state_->finished.wait(lock, [&] { return task_->done; });
    return task_->status;
  }

 private:
  std::shared_ptr<WorkQueue::State> state_;
  std::shared_ptr<Task> task_;
};
}  // namespace

WorkQueue::WorkQueue() : state_(std::make_shared<State>()) {
  worker_ = std::thread([s = state_] {
    std::unique_lock<std::mutex> lock(s->mu);
    while (true) {
      s->has_items.wait(lock, [&] { return s->stop || !s->items.empty(); });
      if (s->items.empty()) return;  // stop, and drained
      std::shared_ptr<Task> task = std::move(s->items.front());
      s->items.pop_front();
      task->started = true;
      s->Run(lock, *task);
    }
  });
}

WorkQueue::~WorkQueue() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->has_items.notify_all();
  worker_.join();
}

WorkPtr WorkQueue::Post(std::function<absl::Status()> fn) {
  auto task = std::make_shared<Task>();
  task->fn = std::move(fn);
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->items.push_back(task);
  }
  state_->has_items.notify_one();
  return std::make_shared<QueuedWork>(state_, std::move(task));
}

}  // namespace dt::internal
