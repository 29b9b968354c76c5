// The device worker (docs/device.md, "Returning before the queue"): one
// thread per communicator that runs the host parts of its calls on device
// streams, in the order they were issued, after the calls themselves have
// returned.  One FIFO per communicator keeps the issue order across ranks
// (every call of a communicator, device or host, reaches the engine in the
// order the user issued it: host calls drain the worker first).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace chorus::device {

class Worker {
 public:
  Worker() = default;
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  ~Worker() {
    {
      std::lock_guard l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  // Runs job after the jobs posted before it (the thread starts on first use).
  void post(std::function<void()> job) {
    {
      std::lock_guard l(mu_);
      jobs_.push_back(std::move(job));
      ++posted_;
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    }
    cv_.notify_all();
  }
  // Waits until every job posted so far has run.
  void drain() {
    std::unique_lock l(mu_);
    const uint64_t target = posted_;
    done_cv_.wait(l, [&] { return done_ >= target; });
  }
  // Whether a posted job has not finished yet.
  [[nodiscard]] bool busy() {
    std::lock_guard l(mu_);
    return done_ < posted_;
  }

 private:
  void loop() {
    std::unique_lock l(mu_);
    for (;;) {
      cv_.wait(l, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_, and nothing left
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      l.unlock();
      job();
      job = nullptr;  // its captures go before the job counts as done
      l.lock();
      ++done_;
      done_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>> jobs_;
  uint64_t posted_ = 0, done_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace chorus::device
