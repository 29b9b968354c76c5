#include "trace/analysis.hpp"

#include <array>
#include <map>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <set>

#include "plan/plan.hpp"

namespace chorus::trace {
namespace {

constexpr uint64_t kP2PBit = uint64_t{1} << 63;    // point-to-point operations (comm/health.cpp, Health::begin)
constexpr uint64_t kCheckBit = uint64_t{1} << 62;  // signature exchanges (CHORUS_CHECK)
constexpr uint64_t kLargeMessage = 64 * 1024;      // transfers that measure bandwidth, not latency

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

std::string collName(uint8_t c) {
  if (isPointToPoint(c))
    return std::string(plan::pointToPointName(c == kOpSend ? plan::PointToPoint::Send : plan::PointToPoint::Recv));
  if (c >= plan::kNumCollectives) return fmt::format("collective{}", c);
  return std::string(plan::collectiveName(static_cast<plan::Collective>(c)));
}

std::string sizeText(uint64_t b) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return fmt::format("{} GiB", b >> 30);
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return fmt::format("{} MiB", b >> 20);
  if (b >= (1ull << 10) && b % (1ull << 10) == 0) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

std::string timeText(double us) {
  if (us >= 1e6) return fmt::format("{:.2f} s", us / 1e6);
  if (us >= 1e3) return fmt::format("{:.2f} ms", us / 1e3);
  return fmt::format("{:.1f} us", us);
}

std::string rankList(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{}", i ? "," : "", v[i]);
  return s;
}

// One matched message.
struct Transfer {
  int src = 0, dst = 0;
  uint64_t bytes = 0;
  int64_t send_start = 0, recv_start = 0, recv_end = 0;  // aligned
  uint64_t seq = 0;
  [[nodiscard]] int64_t begin() const { return std::max(send_start, recv_start); }
};

// Total length of the union of [begin, end) intervals, in microseconds.
double unionUs(std::vector<std::pair<int64_t, int64_t>> v) {
  std::sort(v.begin(), v.end());
  double total = 0;
  int64_t cur_b = 0, cur_e = 0;
  bool open = false;
  for (const auto& [b, e] : v) {
    if (open && b <= cur_e) {
      cur_e = std::max(cur_e, e);
      continue;
    }
    if (open) total += static_cast<double>(cur_e - cur_b);
    cur_b = b;
    cur_e = e;
    open = true;
  }
  if (open) total += static_cast<double>(cur_e - cur_b);
  return total / 1e3;
}

bool isTransfer(uint8_t kind) { return kind <= static_cast<uint8_t>(StepKind::RecvReduce); }
bool isSend(uint8_t kind) { return kind == static_cast<uint8_t>(StepKind::Send); }

// FIFO matching per ordered pair (see analysis.hpp).  Memory is O(steps),
// not O(ranks^2): the queues are keyed by the pairs that occur.
std::vector<Transfer> matchTransfers(const CommTrace& t) {
  const int n = t.nranks;
  using Key = std::pair<int, int>;  // (from, to)
  std::map<Key, std::vector<const StepRecord*>> sends, recvs;
  for (int r = 0; r < n; ++r)
    for (const StepRecord& s : t.ranks[r].file.steps) {
      if (!isTransfer(s.kind) || s.peer < 0 || s.peer >= n || s.peer == r) continue;
      if (isSend(s.kind))
        sends[{r, s.peer}].push_back(&s);
      else
        recvs[{s.peer, r}].push_back(&s);
    }
  auto by_post = [](const StepRecord* a, const StepRecord* b) { return a->start_ns < b->start_ns; };
  std::vector<Transfer> out;
  for (auto& [key, sv] : sends) {
    auto it = recvs.find(key);
    if (it == recvs.end()) continue;
    auto& rv = it->second;
    std::stable_sort(sv.begin(), sv.end(), by_post);
    std::stable_sort(rv.begin(), rv.end(), by_post);
    const auto [a, b] = key;
    for (size_t i = 0; i < std::min(sv.size(), rv.size()); ++i) {
      Transfer x;
      x.src = a;
      x.dst = b;
      x.bytes = rv[i]->bytes;
      x.send_start = t.ranks[a].toRef(sv[i]->start_ns);
      x.recv_start = t.ranks[b].toRef(rv[i]->start_ns);
      x.recv_end = t.ranks[b].toRef(rv[i]->end_ns);
      x.seq = rv[i]->seq;
      out.push_back(x);
    }
  }
  return out;
}

}  // namespace

int64_t RankTrace::toRef(int64_t local_ns) const {
  const auto& c = file.clocks;
  if (c.empty()) return local_ns;
  if (c.size() == 1 || local_ns <= c.front().local_ns) return local_ns + c.front().offset_ns;
  if (local_ns >= c.back().local_ns) return local_ns + c.back().offset_ns;
  auto it = std::upper_bound(c.begin(), c.end(), local_ns,
                             [](int64_t v, const ClockRecord& r) { return v < r.local_ns; });
  const ClockRecord& hi = *it;
  const ClockRecord& lo = *(it - 1);
  const double f = hi.local_ns == lo.local_ns ? 0.0
                                              : static_cast<double>(local_ns - lo.local_ns) /
                                                    static_cast<double>(hi.local_ns - lo.local_ns);
  return local_ns + lo.offset_ns + static_cast<int64_t>(f * static_cast<double>(hi.offset_ns - lo.offset_ns));
}

std::vector<int> CommTrace::missing() const {
  std::vector<int> m;
  for (int r = 0; r < nranks; ++r)
    if (ranks[r].file.header.nranks == 0) m.push_back(r);
  return m;
}

Result<std::vector<CommTrace>> groupTraces(std::vector<TraceFile> files) {
  std::map<uint64_t, CommTrace> by_comm;
  for (TraceFile& f : files) {
    CommTrace& c = by_comm[f.header.comm_id];
    if (c.nranks == 0) {
      c.comm_id = f.header.comm_id;
      c.nranks = f.header.nranks;
      c.ranks.resize(static_cast<size_t>(c.nranks));
    }
    if (f.header.nranks != c.nranks)
      return invalidArgument("{}: communicator {:016x} has {} ranks in one file and {} in another", f.path,
                             f.header.comm_id, c.nranks, f.header.nranks);
    RankTrace& slot = c.ranks[static_cast<size_t>(f.header.rank)];
    if (slot.file.header.nranks != 0)
      return invalidArgument("two traces of rank {} of communicator {:016x}: {} and {}", f.header.rank, c.comm_id,
                             slot.file.path, f.path);
    std::sort(f.clocks.begin(), f.clocks.end(),
              [](const ClockRecord& a, const ClockRecord& b) { return a.local_ns < b.local_ns; });
    slot.file = std::move(f);
  }
  std::vector<CommTrace> out;
  for (auto& [id, c] : by_comm) out.push_back(std::move(c));
  std::stable_sort(out.begin(), out.end(), [](const CommTrace& a, const CommTrace& b) { return a.nranks > b.nranks; });
  return out;
}

Result<std::vector<CommTrace>> loadTraceDir(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().extension() == ".trace") paths.push_back(e.path().string());
  if (ec) return makeError(chorusSystemError, "cannot read trace directory '{}': {}", dir, ec.message());
  if (paths.empty())
    return invalidArgument("no *.trace files in '{}' (run the job with CHORUS_TRACE={})", dir, dir);
  std::sort(paths.begin(), paths.end());
  std::vector<TraceFile> files;
  for (const std::string& p : paths) {
    CHORUS_ASSIGN_OR_RETURN(TraceFile f, readTraceFile(p));
    files.push_back(std::move(f));
  }
  return groupTraces(std::move(files));
}

// ---- Chrome trace -------------------------------------------------------------

nlohmann::json chromeTrace(const std::vector<CommTrace>& comms) {
  using nlohmann::json;
  int64_t t0 = INT64_MAX;
  for (const CommTrace& c : comms)
    for (const RankTrace& r : c.ranks) {
      for (const OpRecord& o : r.file.ops) t0 = std::min(t0, r.toRef(o.enqueue_ns));
      for (const StepRecord& s : r.file.steps) t0 = std::min(t0, r.toRef(s.start_ns));
    }
  if (t0 == INT64_MAX) t0 = 0;
  auto us = [&](int64_t ref_ns) { return static_cast<double>(ref_ns - t0) / 1e3; };

  json events = json::array();
  // Tracks per rank: operations, sends, receives, copies.  Slices on one
  // track must nest (the trace viewers drop or misdraw the others), and
  // transfers and batched operations overlap, so each kind gets as many lanes
  // as it has concurrent slices: a slice takes the lowest lane free at its
  // start.  Lane l of kind k is tid k * kLaneStride + l, named "sends 1", ...
  constexpr int kOps = 0, kSends = 1, kRecvs = 2, kLocal = 3, kLaneStride = 1000;
  uint64_t flow_id = 0;
  constexpr uint64_t kMaxFlows = 20000;
  for (size_t ci = 0; ci < comms.size(); ++ci) {
    const CommTrace& c = comms[ci];
    auto pidOf = [&](int rank) { return static_cast<int>(ci) * 100000 + rank; };
    // The lane of the send starting at (pid, t) and of the receive ending at
    // (pid, t), so a flow binds to its own slices.
    std::map<std::pair<int, int64_t>, int> send_lane, recv_lane;
    auto laneOf = [](const std::map<std::pair<int, int64_t>, int>& m, int pid, int64_t t, int dflt) {
      auto it = m.find({pid, t});
      return it == m.end() ? dflt : it->second;
    };
    for (int rank = 0; rank < c.nranks; ++rank) {
      const RankTrace& r = c.ranks[rank];
      if (r.file.header.nranks == 0) continue;
      const int pid = pidOf(rank);
      std::string pname = fmt::format("rank {} ({}, pid {})", rank, r.file.header.host, r.file.header.pid);
      if (comms.size() > 1) pname += fmt::format(" comm {:08x} of {}", c.comm_id >> 32, c.nranks);
      events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", pname}}}});
      events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
      // Slices of this rank by kind, placed into lanes once all are known.
      struct Slice {
        size_t event;
        int64_t start, end;  // reference clock, ns
      };
      std::array<std::vector<Slice>, 4> by_kind;
      std::map<uint64_t, const OpRecord*> ops;
      for (const OpRecord& o : r.file.ops) {
        ops[o.seq] = &o;
        const double dur = static_cast<double>(o.end_ns - o.start_ns) / 1e3;
        json args = {{"seq", o.seq & ~kP2PBit}, {"bytes", o.bytes}, {"count", o.count},
                     {"algo", r.file.algos[o.algo]}, {"ok", o.ok != 0},
                     {"queued_us", static_cast<double>(o.start_ns - o.enqueue_ns) / 1e3}};
        if (o.predicted_ns >= 0) args["predicted_us"] = static_cast<double>(o.predicted_ns) / 1e3;
        if (dur > 0)
          args["busbw_gbps"] = static_cast<double>(o.bytes) * busBwFactor(o.coll, c.nranks) / (dur * 1e3);
        // A send or receive is named by its peer; a rooted collective's root is in its args.
        const bool p2p = isPointToPoint(o.coll);
        if (p2p) args["peer"] = o.peer;
        else if (o.coll < plan::kNumCollectives && plan::facts(static_cast<plan::Collective>(o.coll)).rooted)
          args["root"] = o.root;
        std::string name = p2p ? fmt::format("{} {} {}", collName(o.coll), o.coll == kOpSend ? "to" : "from", o.peer)
                               : fmt::format("{} #{}", collName(o.coll), o.seq);
        by_kind[kOps].push_back({events.size(), r.toRef(o.start_ns), r.toRef(o.end_ns)});
        events.push_back({{"ph", "X"}, {"pid", pid}, {"tid", kOps}, {"name", name}, {"cat", "op"},
                          {"ts", us(r.toRef(o.start_ns))}, {"dur", dur}, {"args", args}});
      }
      for (const StepRecord& s : r.file.steps) {
        const auto kind = static_cast<StepKind>(s.kind);
        const int tid = kind == StepKind::Send ? kSends : isTransfer(s.kind) ? kRecvs : kLocal;
        std::string name;
        switch (kind) {
          case StepKind::Send: name = fmt::format("send to {}", s.peer); break;
          case StepKind::Recv: name = fmt::format("recv from {}", s.peer); break;
          case StepKind::RecvReduce: name = fmt::format("recv+reduce from {}", s.peer); break;
          case StepKind::Copy: name = "copy"; break;
          case StepKind::Reduce: name = "reduce"; break;
          case StepKind::Quantize: name = "quantize"; break;
          case StepKind::Dequantize: name = "dequantize"; break;
          case StepKind::DequantizeReduce: name = "dequantize+reduce"; break;
          case StepKind::Scale: name = "scale"; break;
          case StepKind::Divide: name = "divide"; break;
          case StepKind::Encode: name = "encode"; break;
          case StepKind::Decode: name = "decode"; break;
          case StepKind::DecodeAdd: name = "decode+add"; break;
          case StepKind::EncodeAdd: name = "encode+add"; break;
        }
        json args = {{"bytes", s.bytes}};
        if ((s.seq & kCheckBit) && !(s.seq & kP2PBit)) args["op"] = "signature check";
        else if (s.seq & kP2PBit) args["op"] = "point-to-point";
        else args["op"] = fmt::format("#{}", s.seq);
        by_kind[static_cast<size_t>(tid)].push_back({events.size(), r.toRef(s.start_ns), r.toRef(s.end_ns)});
        events.push_back({{"ph", "X"}, {"pid", pid}, {"tid", tid}, {"name", name}, {"cat", "step"},
                          {"ts", us(r.toRef(s.start_ns))}, {"dur", static_cast<double>(s.end_ns - s.start_ns) / 1e3},
                          {"args", args}});
      }
      const char* tracks[] = {"operations", "sends", "receives", "copy / reduce"};
      for (int kind = 0; kind < 4; ++kind) {
        auto& v = by_kind[static_cast<size_t>(kind)];
        std::stable_sort(v.begin(), v.end(), [](const Slice& a, const Slice& b) {
          return a.start != b.start ? a.start < b.start : a.end > b.end;
        });
        std::vector<int64_t> lane_end;  // when each lane's last slice ends
        for (const Slice& sl : v) {
          size_t lane = 0;
          while (lane < lane_end.size() && lane_end[lane] > sl.start) ++lane;
          if (lane == lane_end.size()) lane_end.push_back(0);
          lane_end[lane] = std::max(sl.end, sl.start);
          const int tid = kind * kLaneStride + static_cast<int>(lane);
          events[sl.event]["tid"] = tid;
          if (kind == kSends) send_lane[{pid, sl.start}] = tid;
          if (kind == kRecvs) recv_lane[{pid, sl.end}] = tid;
        }
        for (size_t lane = 0; lane < std::max<size_t>(lane_end.size(), 1); ++lane) {
          const int tid = kind * kLaneStride + static_cast<int>(lane);
          std::string tname = lane == 0 ? tracks[kind] : fmt::format("{} {}", tracks[kind], lane);
          events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", tname}}}});
          events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", pid}, {"tid", tid},
                            {"args", {{"sort_index", tid}}}});
        }
      }
    }
    for (const Transfer& x : matchTransfers(c)) {
      if (flow_id >= kMaxFlows) break;
      ++flow_id;
      events.push_back({{"ph", "s"}, {"id", flow_id}, {"pid", pidOf(x.src)},
                        {"tid", laneOf(send_lane, pidOf(x.src), x.send_start, kSends * kLaneStride)},
                        {"name", "message"}, {"cat", "transfer"}, {"ts", us(x.send_start)}});
      events.push_back({{"ph", "f"}, {"bp", "e"}, {"id", flow_id}, {"pid", pidOf(x.dst)},
                        {"tid", laneOf(recv_lane, pidOf(x.dst), x.recv_end, kRecvs * kLaneStride)},
                        {"name", "message"}, {"cat", "transfer"}, {"ts", us(x.recv_end)}});
    }
  }
  return json{{"traceEvents", events}, {"displayTimeUnit", "ns"},
              {"otherData", {{"producer", "chorus-trace merge"}, {"timeline", "rank 0's clock, us from the first event"}}}};
}

// ---- report -------------------------------------------------------------------

namespace {

constexpr double kMaxDriftPpb = 1e9;  // 1 s per s: the drift a report shows at most

// The hosts and each rank's clock estimates.
void describeRanks(const CommTrace& t, Report& rep) {
  std::set<std::string> hosts;
  for (const RankTrace& r : t.ranks)
    if (r.file.header.nranks) hosts.insert(r.file.header.host);
  rep.hosts = static_cast<int>(hosts.size());
  for (int rank = 0; rank < t.nranks; ++rank) {
    const auto& cs = t.ranks[rank].file.clocks;
    for (const ClockRecord& c : cs) rep.clock_bound_us = std::max(rep.clock_bound_us, c.bound_ns / 1e3);
    if (cs.empty()) continue;
    ClockInfo ci;
    ci.rank = rank;
    ci.estimates = static_cast<int>(cs.size());
    ci.offset_ns = cs.back().offset_ns;
    ci.bound_ns = cs.back().bound_ns;
    // The records come from files we do not trust: a few ns between two
    // estimates with seconds of offset change between them would be a drift
    // far past any int64.  Report it saturated at +-1 s/s (1e9 ppb), already
    // no clock: the drift column then says "broken", not a wrapped number.
    const int64_t span = cs.back().local_ns - cs.front().local_ns;  // |times| <= 2^60: no overflow
    if (span > 0) {
      const double ppb = static_cast<double>(cs.back().offset_ns - cs.front().offset_ns) * 1e9 /
                         static_cast<double>(span);
      ci.drift_ppb = static_cast<int64_t>(std::clamp(ppb, -kMaxDriftPpb, kMaxDriftPpb));
    }
    rep.clocks.push_back(ci);
  }
}

// One collective call seen on every rank.
struct Call {
  std::vector<int64_t> arrive, end;
  // Each rank's time outside the communicator before this call: from the
  // end of its previous operation to this start (its own clock; -1: first).
  std::vector<int64_t> gap;
  const OpRecord* op0;
};
using CallGroups = std::map<std::pair<uint8_t, uint64_t>, std::vector<Call>>;  // by (kind, size)

// The collective calls that succeeded on every rank, grouped by (kind, size).
CallGroups groupCalls(const CommTrace& t) {
  const int n = t.nranks;
  std::vector<std::map<uint64_t, const OpRecord*>> ops(n);
  for (int r = 0; r < n; ++r)
    for (const OpRecord& o : t.ranks[r].file.ops)
      if (!(o.seq & (kP2PBit | kCheckBit))) ops[r][o.seq] = &o;
  CallGroups groups;
  for (auto& [seq, o0] : ops[0]) {
    Call c;
    c.op0 = o0;
    bool all = o0->ok != 0;
    for (int r = 0; r < n && all; ++r) {
      auto it = ops[r].find(seq);
      if (it == ops[r].end() || !it->second->ok || it->second->coll != o0->coll) {
        all = false;
        break;
      }
      c.arrive.push_back(t.ranks[r].toRef(it->second->start_ns));
      c.end.push_back(t.ranks[r].toRef(it->second->end_ns));
      c.gap.push_back(it == ops[r].begin() ? -1 : it->second->start_ns - std::prev(it)->second->end_ns);
    }
    if (all) groups[{o0->coll, o0->bytes}].push_back(std::move(c));
  }
  return groups;
}

// Per rank, over all calls: how often it arrived last and how much longer
// than the median rank it was away before the calls.
struct ArrivalTally {
  explicit ArrivalTally(int n) : excess_sum(static_cast<size_t>(n), 0), last_count(static_cast<size_t>(n), 0) {}
  std::vector<double> excess_sum;
  std::vector<int> last_count;
  int total_calls = 0;
  int gap_calls = 0;  // calls with a gap on every rank (none is the rank's first)
};

CollectiveStats collectiveStats(const CommTrace& t, std::pair<uint8_t, uint64_t> key, const std::vector<Call>& calls,
                                ArrivalTally& tally) {
  const int n = t.nranks;
  CollectiveStats s;
  s.coll = collName(key.first);
  s.bytes = key.second;
  s.calls = static_cast<int>(calls.size());
  std::map<uint16_t, int> algo_votes;
  std::vector<double> times, skews, preds, lates;
  std::vector<int> last_votes(static_cast<size_t>(n), 0);
  double wait_sum = 0, in_sum = 0;
  for (const Call& c : calls) {
    const int64_t last_arrival = *std::max_element(c.arrive.begin(), c.arrive.end());
    const int64_t first_arrival = *std::min_element(c.arrive.begin(), c.arrive.end());
    const int64_t last_end = *std::max_element(c.end.begin(), c.end.end());
    times.push_back(static_cast<double>(std::max<int64_t>(last_end - last_arrival, 0)) / 1e3);
    skews.push_back(static_cast<double>(last_arrival - first_arrival) / 1e3);
    const int last = static_cast<int>(std::max_element(c.arrive.begin(), c.arrive.end()) - c.arrive.begin());
    ++last_votes[static_cast<size_t>(last)];
    std::vector<double> a(c.arrive.begin(), c.arrive.end());
    const double late = (static_cast<double>(last_arrival) - median(a)) / 1e3;
    lates.push_back(late);
    ++tally.last_count[static_cast<size_t>(last)];
    ++tally.total_calls;
    if (std::find(c.gap.begin(), c.gap.end(), -1) == c.gap.end()) {
      std::vector<double> g(c.gap.begin(), c.gap.end());
      const double med = median(g);
      for (int r = 0; r < n; ++r)
        tally.excess_sum[static_cast<size_t>(r)] += (static_cast<double>(c.gap[r]) - med) / 1e3;
      ++tally.gap_calls;
    }
    for (int r = 0; r < n; ++r) {
      wait_sum += static_cast<double>(last_arrival - c.arrive[r]);
      in_sum += static_cast<double>(std::max<int64_t>(c.end[r] - c.arrive[r], 0));
    }
    ++algo_votes[c.op0->algo];
    if (c.op0->predicted_ns >= 0) preds.push_back(static_cast<double>(c.op0->predicted_ns) / 1e3);
  }
  uint16_t best_algo = 0;
  int best_votes = -1;
  for (auto [a, v] : algo_votes)
    if (v > best_votes) best_algo = a, best_votes = v;
  s.algo = best_algo < t.ranks[0].file.algos.size() ? t.ranks[0].file.algos[best_algo] : "";
  s.time_us = median(times);
  if (s.time_us > 0) {
    s.algbw_gbps = static_cast<double>(s.bytes) / (s.time_us * 1e3);
    s.busbw_gbps = s.algbw_gbps * busBwFactor(key.first, n);
  }
  s.predicted_us = preds.empty() ? -1 : median(preds);
  s.skew_us = median(skews);
  s.skew_max_us = *std::max_element(skews.begin(), skews.end());
  s.last_rank = static_cast<int>(std::max_element(last_votes.begin(), last_votes.end()) - last_votes.begin());
  s.last_share = static_cast<double>(last_votes[static_cast<size_t>(s.last_rank)]) / static_cast<double>(s.calls);
  s.last_late_us = median(lates);
  s.wait_share = in_sum > 0 ? wait_sum / in_sum : 0;
  return s;
}

// The straggler: the rank that spends the most time outside the
// communicator between calls, compared with the median rank.  Arriving last
// alone does not make one: a rank that finished the previous call last
// (behind a slow link) also arrives last at the next.
void findStraggler(const CommTrace& t, const ArrivalTally& tally, Report& rep) {
  const int n = t.nranks;
  const double late_threshold_us = std::max(100.0, 5 * rep.clock_bound_us);
  for (int r = 0; r < n; ++r) {
    RankStats rs;
    rs.rank = r;
    rs.host = t.hostOf(r);
    rs.excess_gap_us = tally.gap_calls ? tally.excess_sum[static_cast<size_t>(r)] / tally.gap_calls : 0;
    rs.last_share =
        tally.total_calls ? static_cast<double>(tally.last_count[static_cast<size_t>(r)]) / tally.total_calls : 0;
    rep.rank_stats.push_back(rs);
  }
  if (tally.gap_calls > 0) {
    std::vector<double> sorted = tally.excess_sum;
    std::sort(sorted.rbegin(), sorted.rend());
    const int cand = static_cast<int>(std::max_element(tally.excess_sum.begin(), tally.excess_sum.end()) -
                                      tally.excess_sum.begin());
    const double mean = tally.excess_sum[static_cast<size_t>(cand)] / tally.gap_calls;
    const double second = n > 1 ? std::max(sorted[1], 0.0) : 0.0;
    if (mean > late_threshold_us && sorted[0] >= 2 * second) {
      rep.straggler = cand;
      rep.straggler_late_us = mean;
    }
  }
}

// What the link analysis leaves for the host analysis and the verdict.
struct LinkTally {
  std::map<std::pair<int, int>, std::vector<std::pair<int64_t, int64_t>>> busy;  // transfers in flight, per link
  std::map<std::pair<int, int>, bool> has_large;  // links that carried a message >= kLargeMessage
  double same_med = 0, cross_med = 0;             // median link rate, same host and across hosts
};

LinkTally analyseLinks(const CommTrace& t, Report& rep) {
  LinkTally tally;
  auto& busy = tally.busy;
  auto& has_large = tally.has_large;
  const std::vector<Transfer> xs = matchTransfers(t);
  std::map<std::pair<int, int>, LinkStats> links;
  for (const Transfer& x : xs)
    if (x.bytes >= kLargeMessage) has_large[{x.src, x.dst}] = true;
  for (const Transfer& x : xs) {
    const bool large = has_large.count({x.src, x.dst}) != 0;
    if (large && x.bytes < kLargeMessage) continue;  // bandwidth from the large messages only
    LinkStats& l = links[{x.src, x.dst}];
    l.src = x.src;
    l.dst = x.dst;
    l.bytes += x.bytes;
    ++l.messages;
    busy[{x.src, x.dst}].push_back({x.begin(), std::max(x.recv_end, x.begin())});
  }
  // A link is busy while any of its transfers is: pipelined chunks posted
  // ahead overlap, and their durations must not be added up.
  for (auto& [k, l] : links) l.busy_us = unionUs(busy[k]);
  std::vector<double> same_rates, cross_rates;
  for (auto& [k, l] : links) {
    l.src_host = t.hostOf(l.src);
    l.dst_host = t.hostOf(l.dst);
    l.same_host = l.src_host == l.dst_host;
    l.gbps = l.busy_us > 0 ? static_cast<double>(l.bytes) / (l.busy_us * 1e3) : 0;
    if (has_large.count(k)) (l.same_host ? same_rates : cross_rates).push_back(l.gbps);
  }
  tally.same_med = median(same_rates);
  tally.cross_med = median(cross_rates);
  for (auto& [k, l] : links) {
    // Links that carried only small messages measure latency: not compared.
    l.class_median_gbps = has_large.count(k) ? (l.same_host ? tally.same_med : tally.cross_med) : 0;
    rep.links.push_back(l);
  }
  auto ratio = [](const LinkStats& l) { return l.class_median_gbps > 0 ? l.gbps / l.class_median_gbps : 1.0; };
  std::sort(rep.links.begin(), rep.links.end(), [&](const LinkStats& a, const LinkStats& b) { return ratio(a) < ratio(b); });
  if (!rep.links.empty() && ratio(rep.links.front()) < 0.5) {
    rep.slow_src = rep.links.front().src;
    rep.slow_dst = rep.links.front().dst;
  }
  return tally;
}

// Each host's cross-host links, outbound and inbound, against the other hosts.
void analyseHosts(const CommTrace& t, const LinkTally& links, Report& rep) {
  std::map<std::string, std::vector<int>> ranks_of;
  for (int r = 0; r < t.nranks; ++r) ranks_of[t.hostOf(r)].push_back(r);
  for (int dir = 0; dir < 2; ++dir) {
    std::vector<HostLinkStats> hs;
    for (auto& [h, rs] : ranks_of) {
      HostLinkStats s;
      s.host = h;
      s.ranks = rs;
      s.outbound = dir == 0;
      std::vector<std::pair<int64_t, int64_t>> spans;
      for (const LinkStats& l : rep.links) {
        if (l.same_host || !links.has_large.count({l.src, l.dst})) continue;
        if ((s.outbound ? l.src_host : l.dst_host) != h) continue;
        s.bytes += l.bytes;
        if (auto b = links.busy.find({l.src, l.dst}); b != links.busy.end())
          spans.insert(spans.end(), b->second.begin(), b->second.end());
      }
      s.busy_us = unionUs(spans);
      s.gbps = s.busy_us > 0 ? static_cast<double>(s.bytes) / (s.busy_us * 1e3) : 0;
      if (s.bytes > 0) hs.push_back(s);
    }
    // Each host against the median of the others.
    for (HostLinkStats& s : hs) {
      std::vector<double> others;
      for (const HostLinkStats& o : hs)
        if (&o != &s) others.push_back(o.gbps);
      s.median_gbps = median(others);
    }
    rep.host_links.insert(rep.host_links.end(), hs.begin(), hs.end());
  }
  auto hratio = [](const HostLinkStats& h) { return h.median_gbps > 0 ? h.gbps / h.median_gbps : 1.0; };
  std::sort(rep.host_links.begin(), rep.host_links.end(),
            [&](const HostLinkStats& a, const HostLinkStats& b) { return hratio(a) < hratio(b); });
  if (!rep.host_links.empty() && hratio(rep.host_links.front()) < 0.5) {
    const HostLinkStats& h = rep.host_links.front();
    rep.slow_host = h.host;
    rep.slow_host_outbound = h.outbound;
    if (rep.host_links.size() > 1) {
      const HostLinkStats& h2 = rep.host_links[1];
      if (h2.outbound != h.outbound && hratio(h2) <= hratio(h) * 1.1) rep.slow_host_alt = h2.host;
    }
  }
}

std::string verdict(const CommTrace& t, const Report& rep, int total_calls, const LinkTally& links) {
  std::string v = fmt::format("{} ranks on {} host(s), {} collective call(s) traced.", t.nranks, rep.hosts,
                              total_calls);
  const CollectiveStats* top = nullptr;
  double top_total = -1;
  for (const CollectiveStats& s : rep.collectives) {
    const double total = s.calls * (s.time_us + s.skew_us);
    if (total > top_total) top = &s, top_total = total;
  }
  if (top != nullptr) {
    v += fmt::format(" Most time goes to {} of {} ({} calls, {}): {} per call from the last arrival, busbw {:.2f} GB/s",
                     top->coll, sizeText(top->bytes), top->calls, top->algo, timeText(top->time_us), top->busbw_gbps);
    if (top->predicted_us > 0)
      v += fmt::format(", {:.2f}x the tuner's prediction of {}", top->time_us / top->predicted_us,
                       timeText(top->predicted_us));
    v += ".";
  }
  if (rep.straggler >= 0) {
    double wait = 0;
    for (const CollectiveStats& s : rep.collectives) wait = std::max(wait, s.wait_share);
    v += fmt::format(" Straggler: rank {} (host {}) spends {} more than the median rank outside chorus before each "
                     "call (computing, or blocked elsewhere) and arrives last in {:.0f} % of the calls; the ranks "
                     "spend up to {:.0f} % of their time in collectives waiting.",
                     rep.straggler, t.hostOf(rep.straggler), timeText(rep.straggler_late_us),
                     100 * rep.rank_stats[static_cast<size_t>(rep.straggler)].last_share, 100 * wait);
  } else if (top != nullptr) {
    v += fmt::format(" No straggler: median arrival skew {}.", timeText(top->skew_us));
  }
  if (!rep.slow_host.empty()) {
    const HostLinkStats& h = rep.host_links.front();
    v += fmt::format(" Slow link: host {} (ranks {}) {} other hosts at {:.3f} GB/s against {:.3f} GB/s for the "
                     "other hosts.",
                     h.host, rankList(h.ranks), h.outbound ? "sends to" : "receives from", h.gbps, h.median_gbps);
    if (!rep.slow_host_alt.empty())
      v += fmt::format(" (Or host {} {}: every byte between the two took the same path, so the trace cannot tell "
                       "which end is slow; a collective where each host talks to several others, e.g. alltoall, "
                       "can.)",
                       rep.slow_host_alt, h.outbound ? "receives slowly" : "sends slowly");
  }
  if (rep.slow_src >= 0) {
    const LinkStats& l = rep.links.front();
    v += fmt::format(" Slowest link: rank {} -> rank {} ({} -> {}) at {:.3f} GB/s, median of its class {:.3f} GB/s.",
                     l.src, l.dst, l.src_host, l.dst_host, l.gbps, l.class_median_gbps);
  } else if (rep.slow_host.empty() && !rep.links.empty()) {
    v += " Links are even";
    if (links.same_med > 0) v += fmt::format(": same host {:.2f} GB/s", links.same_med);
    if (links.cross_med > 0)
      v += fmt::format("{} across hosts {:.3f} GB/s", links.same_med > 0 ? "," : ":", links.cross_med);
    v += " (median per link while busy).";
  }
  return v;
}

}  // namespace

Report analyse(const CommTrace& t) {
  Report rep;
  rep.comm_id = t.comm_id;
  rep.nranks = t.nranks;
  rep.missing_ranks = t.missing();
  describeRanks(t, rep);
  if (!rep.missing_ranks.empty() || t.nranks == 0) {
    rep.verdict = fmt::format("Traces of rank(s) {} are missing: no cross-rank analysis (was the job run with "
                              "CHORUS_TRACE on every rank, and did it finish?).",
                              rankList(rep.missing_ranks));
    return rep;
  }
  ArrivalTally arrivals(t.nranks);
  for (const auto& [key, calls] : groupCalls(t)) rep.collectives.push_back(collectiveStats(t, key, calls, arrivals));
  findStraggler(t, arrivals, rep);
  const LinkTally links = analyseLinks(t, rep);
  if (rep.hosts >= 2) analyseHosts(t, links, rep);
  rep.verdict = verdict(t, rep, arrivals.total_calls, links);
  return rep;
}

std::string formatReport(const Report& r) {
  std::string s = fmt::format("communicator {:016x}: {} ranks, {} host(s); clock alignment error bound {}\n\n",
                              r.comm_id, r.nranks, r.hosts, timeText(r.clock_bound_us));
  if (!r.collectives.empty()) {
    s += fmt::format("{:>13} {:>10} {:>6} {:>18} {:>11} {:>9} {:>11} {:>7} {:>10} {:>10} {:>5} {:>10} {:>6}\n",
                     "collective", "size", "calls", "algo", "time", "busbw", "predicted", "meas/", "skew", "skew max",
                     "last", "late by", "wait");
    s += fmt::format("{:>13} {:>10} {:>6} {:>18} {:>11} {:>9} {:>11} {:>7} {:>10} {:>10} {:>5} {:>10} {:>6}\n", "",
                     "", "", "", "(median)", "GB/s", "", "pred", "(median)", "", "rank", "(median)", "share");
    for (const CollectiveStats& c : r.collectives)
      s += fmt::format("{:>13} {:>10} {:>6} {:>18} {:>11} {:>9.3f} {:>11} {:>7} {:>10} {:>10} {:>5} {:>10} {:>5.0f}%\n",
                       c.coll, sizeText(c.bytes), c.calls, c.algo, timeText(c.time_us), c.busbw_gbps,
                       c.predicted_us >= 0 ? timeText(c.predicted_us) : "-",
                       c.predicted_us > 0 ? fmt::format("{:.2f}", c.time_us / c.predicted_us) : "-",
                       timeText(c.skew_us), timeText(c.skew_max_us), c.last_rank, timeText(c.last_late_us),
                       100 * c.wait_share);
    s += "\n";
  }
  if (!r.links.empty()) {
    s += "links (slowest first, against the median of links of the same class):\n";
    s += fmt::format("  {:>5} {:>5} {:>10} {:>9} {:>12} {:>10} {:>10}  {}\n", "src", "dst", "class", "messages",
                     "bytes", "GB/s", "median", "hosts");
    const size_t shown = std::min<size_t>(r.links.size(), 12);
    for (size_t i = 0; i < shown; ++i) {
      const LinkStats& l = r.links[i];
      s += fmt::format("  {:>5} {:>5} {:>10} {:>9} {:>12} {:>10.3f} {:>10}  {} -> {}\n", l.src, l.dst,
                       l.same_host ? "same host" : "cross host", l.messages, l.bytes, l.gbps,
                       l.class_median_gbps > 0 ? fmt::format("{:.3f}", l.class_median_gbps) : "-", l.src_host,
                       l.dst_host);
    }
    if (r.links.size() > shown) s += fmt::format("  ... {} more\n", r.links.size() - shown);
    s += "\n";
  }
  if (!r.host_links.empty()) {
    s += "hosts' cross-host links (against the median of the other hosts):\n";
    for (const HostLinkStats& h : r.host_links)
      s += fmt::format("  {:<40} ranks {:<10} {:>8} {:>10.3f} GB/s  others {:>8.3f} GB/s\n", h.host, rankList(h.ranks),
                       h.outbound ? "out" : "in", h.gbps, h.median_gbps);
    s += "\n";
  }
  if (!r.clocks.empty()) {
    s += "clock alignment (rank 0's clock = rank's + offset; bound = half the shortest round trip):\n";
    for (const ClockInfo& c : r.clocks)
      s += fmt::format("  rank {:>4}: offset {:>16} ns  bound {:>9} ns  estimates {:>3}  drift {} ppb\n", c.rank,
                       c.offset_ns, c.bound_ns, c.estimates, c.drift_ppb);
    s += "\n";
  }
  s += "verdict: " + r.verdict + "\n";
  return s;
}

nlohmann::json reportJson(const Report& r) {
  using nlohmann::json;
  json j;
  j["comm_id"] = fmt::format("{:016x}", r.comm_id);
  j["nranks"] = r.nranks;
  j["hosts"] = r.hosts;
  j["missing_ranks"] = r.missing_ranks;
  j["clock_bound_us"] = r.clock_bound_us;
  j["clocks"] = json::array();
  for (const ClockInfo& c : r.clocks)
    j["clocks"].push_back({{"rank", c.rank}, {"estimates", c.estimates}, {"offset_ns", c.offset_ns},
                           {"bound_ns", c.bound_ns}, {"drift_ppb", c.drift_ppb}});
  j["collectives"] = json::array();
  for (const CollectiveStats& c : r.collectives)
    j["collectives"].push_back({{"collective", c.coll},        {"bytes", c.bytes},
                                {"algo", c.algo},              {"calls", c.calls},
                                {"time_us", c.time_us},        {"algbw_gbps", c.algbw_gbps},
                                {"busbw_gbps", c.busbw_gbps},  {"predicted_us", c.predicted_us},
                                {"skew_us", c.skew_us},        {"skew_max_us", c.skew_max_us},
                                {"last_rank", c.last_rank},    {"last_share", c.last_share},
                                {"last_late_us", c.last_late_us}, {"wait_share", c.wait_share}});
  j["links"] = json::array();
  for (const LinkStats& l : r.links)
    j["links"].push_back({{"src", l.src}, {"dst", l.dst}, {"src_host", l.src_host}, {"dst_host", l.dst_host},
                          {"same_host", l.same_host}, {"bytes", l.bytes}, {"messages", l.messages},
                          {"busy_us", l.busy_us}, {"gbps", l.gbps}, {"class_median_gbps", l.class_median_gbps}});
  j["host_links"] = json::array();
  for (const HostLinkStats& h : r.host_links)
    j["host_links"].push_back({{"host", h.host}, {"ranks", h.ranks}, {"direction", h.outbound ? "out" : "in"},
                               {"bytes", h.bytes}, {"gbps", h.gbps}, {"median_gbps", h.median_gbps}});
  j["ranks"] = json::array();
  for (const RankStats& rs : r.rank_stats)
    j["ranks"].push_back({{"rank", rs.rank}, {"host", rs.host}, {"excess_gap_us", rs.excess_gap_us},
                          {"last_share", rs.last_share}});
  j["straggler"] = r.straggler >= 0 ? json(r.straggler) : json(nullptr);
  j["straggler_late_us"] = r.straggler_late_us;
  j["slow_link"] = r.slow_src >= 0 ? json{{"src", r.slow_src}, {"dst", r.slow_dst}} : json(nullptr);
  j["slow_host"] = r.slow_host.empty()
                       ? json(nullptr)
                       : json{{"host", r.slow_host}, {"direction", r.slow_host_outbound ? "out" : "in"},
                              {"ranks", r.host_links.front().ranks},
                              {"ambiguous_with", r.slow_host_alt.empty() ? json(nullptr) : json(r.slow_host_alt)}};
  j["verdict"] = r.verdict;
  return j;
}

}  // namespace chorus::trace
