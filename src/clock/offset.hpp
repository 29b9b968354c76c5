// Clock offset between ranks: the trace clock and the PTP delay-request
// equations over a round trip, with a minimum-round-trip filter.
//
// Every rank timestamps its trace records with traceNowNs(): CLOCK_MONOTONIC
// plus CHORUS_CLOCK_OFFSET_NS (a testing knob that shifts one process's
// clock, as if it ran on a host whose clock is off by that much).  A rank
// estimates the offset of the reference clock (the store server's, i.e. rank
// 0's process) to its own by exchanges:
//
//   t1  local clock, request sent        t2  reference clock, request received
//   t4  local clock, reply received      t3  reference clock, reply sent
//
//   offset = ((t2 - t1) + (t3 - t4)) / 2      (reference = local + offset)
//   rtt    = (t4 - t1) - (t3 - t2)
//
// which is exact when the two directions take equal time.  Queueing and
// scheduling delay make one direction slower now and then; such exchanges
// have a longer round trip, so the estimate keeps only the exchanges whose
// round trip is within a small margin of the shortest (see estimateOffset).
#pragma once

#include <cstdint>
#include <span>

namespace chorus::clock {

// CLOCK_MONOTONIC in nanoseconds plus the injected CHORUS_CLOCK_OFFSET_NS.
int64_t traceNowNs();
// The injected offset: process-wide, set by each init from its config
// (Config::trace.clock_offset_ns); 0 until then.
int64_t injectedOffsetNs();
void setInjectedOffsetNs(int64_t ns);

struct Exchange {
  int64_t t1 = 0, t2 = 0, t3 = 0, t4 = 0;
  [[nodiscard]] int64_t rtt() const { return (t4 - t1) - (t3 - t2); }
  [[nodiscard]] int64_t offset() const { return ((t2 - t1) + (t3 - t4)) / 2; }
};

struct OffsetEstimate {
  int64_t offset_ns = 0;  // reference = local + offset
  int64_t rtt_ns = 0;     // the shortest round trip seen
  // Half the shortest round trip: the offset's error cannot exceed it (the
  // true one-way delays are between 0 and the round trip).
  int64_t bound_ns = 0;
  int used = 0;     // exchanges kept by the filter
  int samples = 0;  // exchanges given
};

// The minimum-round-trip filter: keeps the exchanges whose round trip is at
// most min_rtt + max(min_rtt / 8, 1 us) and returns the median of their
// offsets.  Empty input: samples = 0 and offset 0.
OffsetEstimate estimateOffset(std::span<const Exchange> xs);

}  // namespace chorus::clock
