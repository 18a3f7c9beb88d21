#include "mesh/work.h"

namespace dt::internal {

void AsyncWork::Complete(absl::Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  status_ = std::move(status);
  done_ = true;
  cv_.notify_all();
}

absl::Status AsyncWork::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  return status_;
}

absl::Status DeferredWork::Wait() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fn_) {
    status_ = fn_();
    fn_ = nullptr;
  }
  return status_;
}

WorkQueue::WorkQueue() : worker_([this] { Loop(); }) {}

WorkQueue::~WorkQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

std::shared_ptr<AsyncWork> WorkQueue::Post(std::function<absl::Status()> fn) {
  auto work = std::make_shared<AsyncWork>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    items_.emplace_back(std::move(fn), work);
  }
  cv_.notify_one();
  return work;
}

void WorkQueue::Loop() {
  while (true) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stop_ || !items_.empty(); });
    if (items_.empty()) return;  // stop_ and drained
    auto item = std::move(items_.front());
    items_.pop_front();
    lock.unlock();
    item.second->Complete(item.first());
  }
}

}  // namespace dt::internal
