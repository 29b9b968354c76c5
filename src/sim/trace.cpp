#include "sim/trace.hpp"

#include <cstdio>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <vector>

#include "sim/report.hpp"

namespace chorus::sim {
namespace {

using Op = PipelineOp;
std::vector<Op> deviceOrder(int64_t rank, int64_t p, int64_t v, int64_t mb) { return pipelineOrder(rank, p, v, mb); }

struct Event {
  std::string name;
  int64_t tid;
  double ts, dur;  // seconds
};

// One virtual stage's forward or backward: compute, then the exposed tensor-
// parallel communication, then the exposed ep/cp communication.
struct Pass {
  double comp = 0, tp = 0, other = 0;
  [[nodiscard]] double total() const { return comp + tp + other; }
};
struct ChunkCost {
  Pass f, b;
};
struct StageCost {
  double ag = 0, rs = 0, opt = 0;  // before the first forward; after the last backward
};

// Each (stage, chunk) from r.chunks, each stage's tail from r.stages; a report
// without them (hand-made in tests) costs every stage as r.stage, split evenly
// over its chunks.
void costs(const TrainReport& r, std::vector<ChunkCost>* chunks, std::vector<StageCost>* stages) {
  const TrainConfig& c = r.config;
  const int64_t p = c.pp, vs_count = static_cast<int64_t>(c.pp) * c.vpp;
  chunks->assign(static_cast<size_t>(vs_count), {});
  stages->assign(static_cast<size_t>(p), {});
  if (static_cast<int64_t>(r.chunks.size()) == vs_count && static_cast<int64_t>(r.stages.size()) == p) {
    for (int64_t k = 0; k < vs_count; ++k) {
      const TrainReport::Chunk& ch = r.chunks[static_cast<size_t>(k)];
      const double other = ch.other_comm_s / 2;  // split over both passes
      (*chunks)[static_cast<size_t>(k)] = {{ch.fwd_s, ch.tp_fwd_s, other}, {ch.bwd_s + ch.recompute_s, ch.tp_bwd_s, other}};
    }
    for (int64_t d = 0; d < p; ++d) {
      const TrainReport::StageTail& t = r.stages[static_cast<size_t>(d)];
      (*stages)[static_cast<size_t>(d)] = {t.dp_ag_s, t.dp_rs_s, t.optimizer_s};
    }
    return;
  }
  const TrainReport::Stage& st = r.stage;
  const double vf = static_cast<double>(c.vpp);
  const double other = st.other_comm_s / vf / 2;
  for (ChunkCost& ch : *chunks)
    ch = {{st.fwd_s / vf, st.tp_fwd_s / vf, other}, {(st.bwd_s + st.recompute_s) / vf, st.tp_bwd_s / vf, other}};
  for (StageCost& sc : *stages) sc = {st.dp_ag_s, st.dp_rs_s, st.optimizer_s};
}

// List-schedules the iteration; emit(event) receives every slice.
template <typename Emit>
Result<ScheduleSummary> schedule(const TrainReport& r, Emit&& emit) {
  const TrainConfig& c = r.config;
  const TrainReport::Stage& st = r.stage;
  const int64_t p = c.pp, v = c.vpp, mb = st.micro_batches, vs_count = p * v;
  if (p < 1 || v < 1 || mb < 1) return invalidArgument("trace: empty schedule (pp={} vpp={} micro-batches={})", p, v, mb);
  if (mb * vs_count > 50'000'000)
    return invalidArgument("trace: {} micro-batches x {} virtual stages is too many slices to draw", mb, vs_count);
  std::vector<ChunkCost> cost;
  std::vector<StageCost> tail;
  costs(r, &cost, &tail);
  const double p2p = st.p2p_s;
  std::vector<double> fend(static_cast<size_t>(mb * vs_count), -1), bend(static_cast<size_t>(mb * vs_count), -1);
  auto at = [&](std::vector<double>& x, int64_t m, int64_t vs) -> double& { return x[static_cast<size_t>(m * vs_count + vs)]; };
  std::vector<std::vector<Op>> order(static_cast<size_t>(p));
  for (int64_t d = 0; d < p; ++d) order[static_cast<size_t>(d)] = deviceOrder(d, p, v, mb);
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> free_at(static_cast<size_t>(p));
  for (int64_t d = 0; d < p; ++d) free_at[static_cast<size_t>(d)] = tail[static_cast<size_t>(d)].ag;  // parameter all-gather
  int64_t left = 2 * mb * v * p, events = 0;
  while (left > 0) {
    bool progressed = false;
    for (int64_t d = 0; d < p; ++d) {
      auto& ord = order[static_cast<size_t>(d)];
      size_t& i = next[static_cast<size_t>(d)];
      while (i < ord.size()) {
        const Op op = ord[i];
        const int64_t vs = op.chunk * p + d;
        double ready = 0;
        if (op.fwd) {
          if (vs > 0) {
            const double e = at(fend, op.micro, vs - 1);
            if (e < 0) break;
            ready = e + p2p;
          }
        } else if (vs + 1 < vs_count) {
          const double e = at(bend, op.micro, vs + 1);
          if (e < 0) break;
          ready = e + p2p;
        } else {
          const double e = at(fend, op.micro, vs);
          if (e < 0) break;
          ready = e;
        }
        double& fa = free_at[static_cast<size_t>(d)];
        const double start = std::max(fa, ready);
        const Pass& ps = op.fwd ? cost[static_cast<size_t>(vs)].f : cost[static_cast<size_t>(vs)].b;
        const double dur = ps.total();
        const std::string label = fmt::format("{} mb{} c{}", op.fwd ? "F" : "B", op.micro, op.chunk);
        emit(Event{label, d, start, dur});
        if (ps.tp > 0) emit(Event{op.fwd ? "tp fwd" : "tp bwd", 1000 + d, start + ps.comp, ps.tp});
        if (ps.other > 0) emit(Event{op.fwd ? "ep/cp fwd" : "ep/cp bwd", 4000 + d, start + ps.comp + ps.tp, ps.other});
        const bool sends = op.fwd ? vs + 1 < vs_count : vs > 0;
        if (sends && p2p > 0) emit(Event{op.fwd ? "send act" : "send grad", 2000 + d, start + dur, p2p});
        events += 1 + (ps.tp > 0) + (ps.other > 0) + (sends && p2p > 0);
        (op.fwd ? at(fend, op.micro, vs) : at(bend, op.micro, vs)) = start + dur;
        fa = start + dur;
        ++i, --left, progressed = true;
      }
    }
    if (!progressed) return internalError("trace: the pipeline schedule deadlocked (pp={} vpp={} mb={})", p, v, mb);
  }
  ScheduleSummary sum;
  for (int64_t d = 0; d < p; ++d) {
    const StageCost& sc = tail[static_cast<size_t>(d)];
    double t = free_at[static_cast<size_t>(d)];
    if (sc.ag > 0) emit(Event{"param all-gather", 3000 + d, 0, sc.ag}), ++events;
    if (sc.rs > 0) emit(Event{"grad reduce-scatter", 3000 + d, t, sc.rs}), t += sc.rs, ++events;
    emit(Event{"optimizer", d, t, sc.opt}), ++events;
    sum.makespan_s = std::max(sum.makespan_s, t + sc.opt);
  }
  sum.events = events;
  return sum;
}

}  // namespace

Result<ScheduleSummary> scheduleIteration(const TrainReport& r) {
  if (!r.schedule_spec.chunks.empty()) {
    CHORUS_ASSIGN_OR_RETURN(ScheduleResult sr, simulateSchedule(r.schedule_spec));
    return ScheduleSummary{sr.makespan_s, sr.tasks};
  }
  return schedule(r, [](const Event&) {});
}

// The simulated schedule's tasks, one track per stage and stream.
Result<ScheduleSummary> writeSimulatedTrace(const TrainReport& r, std::ostream& out) {
  CHORUS_ASSIGN_OR_RETURN(ScheduleResult sr, simulateSchedule(r.schedule_spec, true));
  std::string buf;
  buf.reserve(1 << 20);
  buf += "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  auto add = [&](std::string_view ev) {
    if (!first) buf += ",\n";
    first = false;
    buf += ev;
    if (buf.size() > (8u << 20)) out << buf, buf.clear();
  };
  for (int64_t d = 0; d < r.config.pp; ++d)
    for (int k = 0; k < kStreams; ++k) {
      const int64_t tid = d * kStreams + k;
      add(fmt::format(R"({{"ph": "M", "name": "thread_name", "pid": 0, "tid": {}, "args": {{"name": "stage {} {}"}}}})", tid,
                      d, kStreamNames[k]));
      add(fmt::format(R"({{"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": {}, "args": {{"sort_index": {}}}}})",
                      tid, tid));
    }
  for (const ScheduleResult::Slice& e : sr.slices)
    add(fmt::format(R"({{"ph": "X", "name": "{}", "pid": 0, "tid": {}, "ts": {:.3f}, "dur": {:.3f}}})", e.name,
                    e.stage * kStreams + e.stream, e.ts * 1e6, e.dur * 1e6));
  nlohmann::json meta = {{"iteration_time_s", r.iteration_s}, {"schedule_makespan_s", sr.makespan_s},
                         {"estimate_s", r.estimate_s}, {"breakdown", r.breakdown}, {"tasks", sr.tasks},
                         {"layers_per_task", sr.merged_layers}};
  buf += fmt::format("\n], \"otherData\": {}}}\n", meta.dump());
  out << buf;
  if (!out) return systemError("trace: writing failed (disk full or path not writable?)");
  return ScheduleSummary{sr.makespan_s, static_cast<int64_t>(sr.slices.size())};
}

Result<ScheduleSummary> writeTrainTrace(const TrainReport& r, std::ostream& out) {
  if (!r.schedule_spec.chunks.empty()) return writeSimulatedTrace(r, out);
  // The estimate's own trace lays out Megatron's 1F1B / interleaved order only.
  if (r.config.zero_bubble || r.config.dualpipe || r.config.moe_a2a_overlap)
    return invalidArgument("--trace with --estimate draws the 1F1B and interleaved orders only; drop --estimate to trace "
                           "the simulated {} schedule", r.config.dualpipe ? "DualPipe"
                                                        : r.config.zero_bubble ? "ZB-H1" : "combined 1F1B");
  std::string buf;
  buf.reserve(1 << 20);
  buf += "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  auto add = [&](std::string_view ev) {
    if (!first) buf += ",\n";
    first = false;
    buf += ev;
    if (buf.size() > (8u << 20)) out << buf, buf.clear();
  };
  const int64_t p = r.config.pp;
  for (int64_t d = 0; d < p; ++d) {
    const std::pair<int64_t, std::string> tracks[] = {{d, fmt::format("stage {} compute", d)},
                                                       {1000 + d, fmt::format("stage {} tp comm", d)},
                                                       {2000 + d, fmt::format("stage {} pp send", d)},
                                                       {3000 + d, fmt::format("stage {} dp comm", d)},
                                                       {4000 + d, fmt::format("stage {} ep/cp comm", d)}};
    for (const auto& [tid, name] : tracks) {
      add(fmt::format(R"({{"ph": "M", "name": "thread_name", "pid": 0, "tid": {}, "args": {{"name": "{}"}}}})", tid, name));
      add(fmt::format(R"({{"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": {}, "args": {{"sort_index": {}}}}})",
                      tid, d * 5 + tid / 1000));
    }
  }
  CHORUS_ASSIGN_OR_RETURN(ScheduleSummary sum, schedule(r, [&](const Event& e) {
    add(fmt::format(R"({{"ph": "X", "name": "{}", "pid": 0, "tid": {}, "ts": {:.3f}, "dur": {:.3f}}})", e.name, e.tid,
                    e.ts * 1e6, e.dur * 1e6));
  }));
  nlohmann::json meta = {{"iteration_time_s", r.iteration_s}, {"schedule_makespan_s", sum.makespan_s},
                         {"breakdown", r.breakdown}};
  buf += fmt::format("\n], \"otherData\": {}}}\n", meta.dump());
  out << buf;
  if (!out) return systemError("trace: writing failed (disk full or path not writable?)");
  return sum;
}

Status plotBreakdown(const TrainReport& r, const std::string& title, const std::string& png) {
  // The script reads {"title", "png", "breakdown"} on stdin.
  static constexpr const char* kScript = R"PY(
import json, sys
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except Exception as e:
    sys.stderr.write("matplotlib is not available (%s); install python3-matplotlib\n" % e)
    sys.exit(3)
d = json.load(sys.stdin)
items = [(k[:-2] if k.endswith("_s") else k, v) for k, v in d["breakdown"].items() if v > 0]
items.sort(key=lambda kv: -kv[1])
fig, ax = plt.subplots(figsize=(8, 0.5 * len(items) + 1.5))
names = [k for k, _ in items][::-1]
vals = [v for _, v in items][::-1]
total = sum(vals)
bars = ax.barh(names, vals, color="#4878a8")
for b, v in zip(bars, vals):
    ax.text(b.get_width(), b.get_y() + b.get_height() / 2, " %.3g s (%.1f%%)" % (v, 100 * v / total), va="center")
ax.set_xlabel("seconds per iteration")
ax.set_title(d["title"])
ax.set_xlim(0, max(vals) * 1.35)
fig.tight_layout()
try:
    fig.savefig(d["png"], dpi=120)
except Exception as e:
    sys.stderr.write("cannot write %s: %s\n" % (d["png"], e))
    sys.exit(4)
)PY";
  const std::string cmd = std::string("/usr/bin/python3 -c '") + kScript + "'";
  FILE* f = popen(cmd.c_str(), "w");
  if (!f) return systemError("--plot: cannot run /usr/bin/python3 (install python3 and python3-matplotlib)");
  const nlohmann::json in = {{"title", title}, {"png", png}, {"breakdown", r.breakdown}};
  const std::string text = in.dump();
  std::fwrite(text.data(), 1, text.size(), f);
  const int rc = pclose(f);
  if (rc == -1 || !WIFEXITED(rc)) return systemError("--plot: /usr/bin/python3 did not finish");
  if (WEXITSTATUS(rc) == 3) return systemError("--plot: matplotlib is not available (install python3-matplotlib)");
  if (WEXITSTATUS(rc) == 4) return systemError("--plot: cannot write '{}' (does its folder exist and is it writable?)", png);
  if (WEXITSTATUS(rc) != 0)
    return systemError("--plot: /usr/bin/python3 exited with {} while drawing '{}' (is the path writable?)",
                       WEXITSTATUS(rc), png);
  return {};
}

}  // namespace chorus::sim
