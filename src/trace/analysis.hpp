// Reading a job's traces (CHORUS_TRACE=DIR): one timeline, a Chrome trace,
// and the report that names the straggler and the slow link.
//
// Alignment: every rank's times are mapped onto rank 0's clock with the
// rank's clock records (offset estimates from init and every
// CHORUS_CLOCK_SYNC_S), interpolated linearly between estimates so that a
// drifting clock is followed; a rank without estimates is taken as offset 0.
//
// Transfers: a send and the receive that took it are matched the way the
// executor matches them (FIFO per ordered pair of ranks: the k-th send from a
// to b is the k-th receive at b from a).  A transfer's time runs from when
// both sides had posted it to when the receiver saw it complete, so a
// receiver that waits for a late sender does not make the link look slow.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.hpp"
#include "trace/record.hpp"

namespace chorus::trace {

// One rank's trace with its mapping onto the reference clock.
struct RankTrace {
  TraceFile file;
  // Rank 0's clock for a time of this rank's clock.
  [[nodiscard]] int64_t toRef(int64_t local_ns) const;
};

// Every rank of one communicator (ranks without a file are missing).
struct CommTrace {
  uint64_t comm_id = 0;
  int nranks = 0;
  std::vector<RankTrace> ranks;  // index = rank; file.path empty = missing
  [[nodiscard]] std::vector<int> missing() const;
  [[nodiscard]] const std::string& hostOf(int rank) const { return ranks[rank].file.header.host; }
};

// Reads every *.trace file of dir, grouped by communicator, largest first.
// Errors name the file; a directory without traces is an error.
Result<std::vector<CommTrace>> loadTraceDir(const std::string& dir);
// Groups already parsed files (for tests and tools); the same checks.
Result<std::vector<CommTrace>> groupTraces(std::vector<TraceFile> files);

// The Chrome trace-event JSON (Perfetto opens it): one process per rank, a
// track for its operations, one for sends, one for receives and one for
// local copies and reductions, on the aligned timeline (microseconds from the
// first event), with flow arrows from each send to its receive.
nlohmann::json chromeTrace(const std::vector<CommTrace>& comms);

// ---- the report ---------------------------------------------------------------

struct CollectiveStats {
  std::string coll;  // "allreduce"
  uint64_t bytes = 0;
  std::string algo;  // the most used
  int calls = 0;     // seen on every rank
  // Per call: from the last rank's arrival to the last rank's finish (the
  // collective's own time, without the wait for late ranks), median.
  double time_us = 0;
  double algbw_gbps = 0, busbw_gbps = 0;  // from time_us
  double predicted_us = -1;               // the tuner's model, median (< 0: none)
  // Arrival skew: last arrival minus first, median and max over the calls.
  double skew_us = 0, skew_max_us = 0;
  // The rank that arrived last most often, how often, and how late it was
  // against the median rank's arrival (median over the calls).
  int last_rank = -1;
  double last_share = 0;
  double last_late_us = 0;
  // Share of the ranks' time in the call that was spent waiting for the last
  // arrival (sum over ranks of last arrival - own arrival, over the sum of
  // end - own arrival).
  double wait_share = 0;
};

struct LinkStats {
  int src = -1, dst = -1;  // ranks
  std::string src_host, dst_host;
  bool same_host = false;
  uint64_t bytes = 0;
  int messages = 0;
  double busy_us = 0;      // time any of its transfers was in flight (union of their intervals)
  double gbps = 0;         // bytes / busy time (1e9 B/s)
  double class_median_gbps = 0;  // median over links of the same class (same host / across hosts)
};

// Links from one host to the other hosts (or to it), aggregated.
struct HostLinkStats {
  std::string host;
  std::vector<int> ranks;
  bool outbound = true;  // from this host (true) or into it
  uint64_t bytes = 0;
  double busy_us = 0;
  double gbps = 0;
  double median_gbps = 0;  // median over hosts, same direction
};

// A rank's behaviour across the calls.
struct RankStats {
  int rank = 0;
  std::string host;
  // Mean over calls of (its time outside the communicator before the call -
  // the median rank's): what it adds to everyone's wait.
  double excess_gap_us = 0;
  double last_share = 0;  // share of the calls it arrived last at
};

// A rank's clock alignment: the estimates its trace holds.
struct ClockInfo {
  int rank = 0;
  int estimates = 0;
  int64_t offset_ns = 0;  // the last estimate: rank 0's clock = this rank's + offset
  int64_t bound_ns = 0;   // its error bound (half the shortest round trip)
  int64_t drift_ppb = 0;  // offset change per time between the first and last estimate
};

struct Report {
  uint64_t comm_id = 0;
  int nranks = 0;
  int hosts = 0;
  std::vector<int> missing_ranks;
  std::vector<CollectiveStats> collectives;  // by kind, then size
  std::vector<RankStats> rank_stats;         // index = rank
  std::vector<LinkStats> links;              // slowest first
  std::vector<HostLinkStats> host_links;     // slowest first
  // The named culprits (-1 / empty when nothing stands out).
  int straggler = -1;
  double straggler_late_us = 0;
  int slow_src = -1, slow_dst = -1;  // the slowest link, when well below its class
  std::string slow_host;             // the host whose cross-host links are slow
  bool slow_host_outbound = true;
  // Set when another host's links in the other direction are as slow (all
  // their traffic crossed the same path, e.g. the ring's only link between
  // them), so the data cannot tell which end is slow.
  std::string slow_host_alt;
  double clock_bound_us = 0;  // largest error bound of the clock estimates used
  std::vector<ClockInfo> clocks;
  std::string verdict;        // one paragraph
};

// Analyses one communicator.  The straggler is the rank whose time outside
// the communicator between calls exceeds the median rank's by more than
// max(100 us, 5 x the clock error bound) on average, and by at least twice
// as much as any other rank's; a link (or a host's links) is slow below half
// the median of its class.
Report analyse(const CommTrace& t);
std::string formatReport(const Report& r);
nlohmann::json reportJson(const Report& r);

}  // namespace chorus::trace
