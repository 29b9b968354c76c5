#include "comm/engine.hpp"

namespace chorus::comm {

void Completion::complete(const Status& st) {
  std::lock_guard l(mu_);
  result_ = st;
  done_ = true;
  cv_.notify_all();
}

Status Completion::wait() {
  std::unique_lock l(mu_);
  cv_.wait(l, [&] { return done_; });
  return result_;
}

void Engine::stop() {
  {
    std::lock_guard l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Engine::enqueue(std::vector<OpDesc> ops, exec::Stream* stream) {
  ensureThread();
  stream->enqueued();
  {
    std::lock_guard l(mu_);
    queue_.push_back(Batch{std::move(ops), stream});
  }
  cv_.notify_all();
}

// Work is queued ahead of this batch: the progress thread runs it in order.
Status Engine::queueAndWait(std::vector<OpDesc> ops, std::unique_lock<std::mutex>& l) {
  Completion done;
  queue_.push_back(Batch{std::move(ops), nullptr, &done});
  l.unlock();
  ensureThread();
  cv_.notify_all();
  return done.wait();
}

void Engine::ensureThread() {
  std::lock_guard l(mu_);
  if (!thread_.joinable()) thread_ = std::thread([this] { progressLoop(); });
  threaded_ = true;
}

void Engine::progressLoop() {
  std::unique_lock l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stop_ || (!queue_.empty() && !busy_); });
    if (queue_.empty() && stop_) return;
    if (queue_.empty()) continue;
    Batch b = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    l.unlock();
    Status st = run_(ctx_, b.ops);
    if (b.stream) b.stream->finished(st);
    if (b.waiter) b.waiter->complete(st);
    l.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

void Engine::drain() {
  std::unique_lock l(mu_);
  cv_.wait(l, [&] { return idle(); });
}

}  // namespace chorus::comm
