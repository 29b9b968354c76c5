// The simulated iteration on a timeline: a Chrome trace (chrome://tracing,
// Perfetto).  A report with a simulated schedule (TrainReport::schedule_spec,
// src/sim/schedule.hpp) is drawn exactly as it was simulated: one track per
// pipeline stage and stream (compute, tp, cp, ep, dp gather, dp reduce, pp
// send), one slice per task.  A report without one (hand-made in tests) is
// list-scheduled from Megatron's 1F1B order (interleaved when vpp > 1) with
// each (stage, chunk) costed from TrainReport::chunks and ::stages.
//
// Also the breakdown plot: a small matplotlib script run by /usr/bin/python3
// (optional: a clear error when python3 or matplotlib is missing).
#pragma once

#include <ostream>
#include <string>

#include "common/status.hpp"
#include "sim/train.hpp"

namespace chorus::sim {

struct ScheduleSummary {
  double makespan_s = 0;  // first forward (its parameter all-gather) to the last optimizer step
  int64_t events = 0;
};

// Lays out the iteration and writes the trace JSON to `out`.
Result<ScheduleSummary> writeTrainTrace(const TrainReport& r, std::ostream& out);
// The same, only the schedule (no output): for tests and checks.
Result<ScheduleSummary> scheduleIteration(const TrainReport& r);

// Draws r's breakdown as a bar chart into `png` with matplotlib.
Status plotBreakdown(const TrainReport& r, const std::string& title, const std::string& png);

}  // namespace chorus::sim
