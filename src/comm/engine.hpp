// The engine that runs a communicator's batches in issue order.
//
// A blocking call (no stream) runs its batch on the caller's thread when the
// engine is idle, so small calls pay no thread hand-off; otherwise, and for
// stream calls, batches go to a FIFO that the progress thread (started on
// first use) executes.  One batch runs at a time, so operations match across
// ranks in the order each rank issued them.
//
// The caller-thread path is a template over the batch's runner, so a
// blocking call costs what running it inline costs (no indirect call); the
// progress thread runs queued batches through the function it was given.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "comm/op.hpp"
#include "common/status.hpp"
#include "exec/stream.hpp"

namespace chorus::comm {

// A blocking caller's wait for a batch the progress thread runs for it.
class Completion {
 public:
  void complete(const Status& st);
  Status wait();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status result_;
};

class Engine {
 public:
  // How the progress thread runs a queued batch.
  using RunFn = Status (*)(void* ctx, std::span<OpDesc> ops);

  Engine(RunFn run, void* ctx) : run_(run), ctx_(ctx) {}
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine() { stop(); }
  // Stops the progress thread (after the queued batches).
  void stop();

  // Runs run() on this thread when nothing is queued or running: true and
  // its status in *st; false when the batch must queue.  Without a progress
  // thread (no stream was ever used) nothing can be queued or running: this
  // thread is the only one that executes, and takes no lock.
  template <class F>
  bool tryRunHere(F&& run, Status* st) {
    if (!threaded_) {
      *st = run();
      return true;
    }
    std::unique_lock l(mu_);
    if (!idle()) return false;
    *st = runBusy(l, run);
    return true;
  }
  // A blocking batch: on this thread when idle, else queued behind the work
  // ahead of it (its order kept) and waited for.
  template <class F>
  Status runOrWait(std::vector<OpDesc>& ops, F&& run) {
    std::unique_lock l(mu_);
    if (idle()) return runBusy(l, run);
    return queueAndWait(std::move(ops), l);
  }
  // A stream's batch: queued; the stream hears when it finishes.
  void enqueue(std::vector<OpDesc> ops, exec::Stream* stream);
  // Runs f with the engine idle and kept so (no batch starts meanwhile).
  template <class F>
  auto whileIdle(F&& f) {
    std::unique_lock l(mu_);
    cv_.wait(l, [&] { return idle(); });
    return f();
  }
  // Waits for queued and running work.
  void drain();
  // Wakes waiters (an abort).
  void wake() { cv_.notify_all(); }

 private:
  struct Batch {
    std::vector<OpDesc> ops;
    exec::Stream* stream = nullptr;
    Completion* waiter = nullptr;  // a blocking caller's
  };
  [[nodiscard]] bool idle() const { return queue_.empty() && !busy_; }
  template <class F>
  Status runBusy(std::unique_lock<std::mutex>& l, F& run) {
    busy_ = true;
    l.unlock();
    Status st = run();
    l.lock();
    busy_ = false;
    l.unlock();
    cv_.notify_all();
    return st;
  }
  Status queueAndWait(std::vector<OpDesc> ops, std::unique_lock<std::mutex>& l);
  void ensureThread();
  void progressLoop();

  RunFn run_;
  void* ctx_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  bool busy_ = false;  // a batch is running
  bool stop_ = false;
  std::thread thread_;
  // Set (by the user's thread, in ensureThread) once the progress thread
  // exists; read by the user's thread only.
  bool threaded_ = false;
};

}  // namespace chorus::comm
