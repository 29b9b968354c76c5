// Streams: FIFOs of operations executed in the background.
//
// A stream counts the operations queued on it and the ones finished, and
// keeps the first error.  Communicators execute the operations (each its own
// in issue order); the stream only tracks completion.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "common/status.hpp"

namespace chorus::exec {

class Stream {
 public:
  void enqueued() {
    std::lock_guard lock(mu_);
    ++queued_;
  }
  void finished(const Status& st) {
    std::lock_guard lock(mu_);
    ++finished_;
    if (!st.isOk() && error_.isOk()) error_ = st;
    cv_.notify_all();
  }
  // Waits for everything queued so far; returns (and keeps) the first error.
  Status synchronize() {
    std::unique_lock lock(mu_);
    const uint64_t target = queued_;
    cv_.wait(lock, [&] { return finished_ >= target; });
    return error_;
  }
  // chorusInProgress while work is queued, else the first error (or ok).
  Status query() {
    std::lock_guard lock(mu_);
    if (finished_ < queued_) return makeError(chorusInProgress, "stream has {} operation(s) in flight", queued_ - finished_);
    return error_;
  }
  [[nodiscard]] bool idle() {
    std::lock_guard lock(mu_);
    return finished_ >= queued_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t queued_ = 0, finished_ = 0;
  Status error_;
};

}  // namespace chorus::exec
