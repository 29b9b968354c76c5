// CHORUS_TRACE for a communicator: the rank's trace file, the estimate of
// rank 0's trace clock against this rank's, and one record per operation
// with the batch's arrival and end (docs/tracing.md).  Off (no recorder)
// without CHORUS_TRACE: callers on the hot path test on() first.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "bootstrap/store.hpp"
#include "comm/call_planner.hpp"
#include "comm/op.hpp"
#include "common/status.hpp"
#include "trace/record.hpp"

namespace chorus::comm {

class Tracing {
 public:
  // Opens the rank's file in dir under the communicator's id and host label.
  Status open(const std::string& dir, int rank, int nranks, uint64_t comm_id, const std::string& host);
  [[nodiscard]] bool on() const { return recorder_ != nullptr; }
  [[nodiscard]] trace::Recorder* recorder() const { return recorder_.get(); }

  // The latest estimate of rank 0's trace clock minus this rank's (0 before
  // any estimate).
  [[nodiscard]] int64_t clockOffsetNs() const { return clock_offset_ns_.load(std::memory_order_relaxed); }
  // Estimates it now over the store connection (rounds exchanges, the
  // minimum-round-trip filter of clock/offset.hpp) and records it (when on).
  // Any thread (the watchdog's re-estimates).
  Result<int64_t> syncClock(bootstrap::Store& store, int rounds);

  // When on: the batch's arrival, then its operations' records (the first n
  // of ops, the planner's jobs) at its end.
  void batchStarted();
  void batchEnded(std::span<const OpDesc> ops, size_t n, const CallPlanner& planner, int nranks, bool ok);

 private:
  std::unique_ptr<trace::Recorder> recorder_;
  int64_t batch_start_ns_ = 0;
  std::atomic<int64_t> clock_offset_ns_{0};
};

}  // namespace chorus::comm
