#include "sim/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <fmt/format.h>
#include <limits>

namespace chorus::sim {

LayerPlan& LayerPlan::operator+=(const LayerPlan& o) {
  fwd += o.fwd, bwd += o.bwd, recompute += o.recompute, attn_core_fwd += o.attn_core_fwd, bwd_async += o.bwd_async;
  wgrad += o.wgrad, wgrad_async += o.wgrad_async;
  tp_fwd += o.tp_fwd, tp_bwd += o.tp_bwd, tp_async += o.tp_async, tp_recompute += o.tp_recompute;
  cp += o.cp, ep += o.ep, dp_ag += o.dp_ag, dp_rs += o.dp_rs;
  return *this;
}

namespace {

enum Dim : uint8_t { kCompute, kTp, kCp, kEp, kDp, kPp, kOptimizer, kBubble, kDims };
constexpr const char* kDimNames[] = {"compute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s",
                                     "dp_comm_s", "pp_comm_s", "optimizer_s", "bubble_s"};
enum Stream : int { sCompute, sTp, sCp, sEp, sDpAg, sDpRs, sPp };
enum Kind : uint8_t { kF, kB, kR, kBGemm, kTpF, kTpB, kTpAsync, kTpR, kCpX, kEpX, kAg, kRs, kSendAct, kSendGrad, kOpt, kW };
constexpr const char* kKindNames[] = {"F",      "B",     "R",     "B gemm", "tp fwd",   "tp bwd",    "tp async", "tp recompute",
                                      "cp k/v", "ep a2a", "gather", "reduce-scatter", "send act", "send grad", "optimizer", "W"};

struct Label {
  Kind kind;
  int32_t micro = -1;
  int16_t chunk = -1, layer = -1;
};

struct Task {
  int32_t rank = 0, peer = -1;
  uint8_t stream = 0, dim = 0;
  bool comm = false;
  double work = 0;                    // compute: seconds at full speed; comm: seconds alone
  std::array<double, kLinkClasses> u{};  // comm: share of each link class at full speed
  Label label;
  double start = -1, end = -1, done = 0;
  int32_t binding = -1;
};

using Op = PipelineOp;

class Sim {
 public:
  Sim(const IterationSpec& s, int64_t ranks) : spec_(s), ranks_(ranks), queues_(static_cast<size_t>(ranks * kStreams)) {}

  // Adds a task (none when it has no work) after `deps`; returns its id or -1.
  int32_t add(int64_t rank, int stream, Dim dim, double work, std::initializer_list<int32_t> deps, Label label,
              const LinkDemand* link = nullptr, int64_t peer = -1) {
    return addAfter(rank, stream, dim, work, std::vector<int32_t>(deps), label, link, peer);
  }
  int32_t addAfter(int64_t rank, int stream, Dim dim, double work, const std::vector<int32_t>& deps, Label label,
                   const LinkDemand* link = nullptr, int64_t peer = -1) {
    if (!(work > 0)) return -1;
    Task t;
    t.rank = static_cast<int32_t>(rank), t.peer = static_cast<int32_t>(peer);
    t.stream = static_cast<uint8_t>(stream), t.dim = dim, t.comm = link != nullptr, t.work = work, t.label = label;
    if (link)
      for (size_t i = 0; i < t.u.size(); ++i) t.u[i] = link->s[i] / work;
    const auto id = static_cast<int32_t>(tasks_.size());
    tasks_.push_back(t);
    queues_[static_cast<size_t>(rank * kStreams + stream)].push_back(id);
    for (int32_t d : deps)
      if (d >= 0) edges_.push_back({d, id});
    return id;
  }
  void edge(int32_t from, int32_t to) {
    if (from >= 0 && to >= 0) edges_.push_back({from, to});
  }
  Task& task(int32_t id) { return tasks_[static_cast<size_t>(id)]; }
  [[nodiscard]] size_t size() const { return tasks_.size(); }

  Status run();
  void attribute(ScheduleResult* r) const;
  void slices(ScheduleResult* r) const;
  [[nodiscard]] double makespan() const { return makespan_; }

 private:
  void tryStart(size_t q);
  void rates();
  void cpuRates();

  const IterationSpec& spec_;
  int64_t ranks_;
  std::vector<Task> tasks_;
  std::vector<std::pair<int32_t, int32_t>> edges_;
  std::vector<std::vector<int32_t>> queues_;
  // run state
  std::vector<int32_t> dep_off_, deps_, succ_off_, succ_, pending_;
  std::vector<size_t> head_;
  std::vector<char> busy_;
  std::vector<int32_t> running_;
  std::vector<double> rate_;  // per running slot
  std::vector<int32_t> prev_in_queue_;
  std::vector<double> residual_, load_;
  std::vector<uint8_t> comm_dim_;  // per rank: a dimension in flight (kDims: none)
  std::vector<size_t> comm_, touched_;  // rates() scratch
  std::vector<double> fill_;
  std::vector<char> frozen_;
  std::vector<std::array<double, kDims>> slow_;  // per rank: compute slowed by collectives, by dimension
  // CPU ranks (spec_.cpu): per rank whether it is busy and its speed factor
  // (relative to the spec's times); per host its busy ranks.
  std::vector<char> cpu_busy_;
  std::vector<double> cpu_speed_, cpu_load_;
  double now_ = 0, makespan_ = 0;
};

void Sim::tryStart(size_t q) {
  if (busy_[q] || head_[q] >= queues_[q].size()) return;
  const int32_t id = queues_[q][head_[q]];
  if (pending_[static_cast<size_t>(id)] > 0) return;
  Task& t = task(id);
  t.start = now_;
  double latest = -1;
  auto consider = [&](int32_t d) {
    if (d >= 0 && tasks_[static_cast<size_t>(d)].end > latest) latest = tasks_[static_cast<size_t>(d)].end, t.binding = d;
  };
  consider(prev_in_queue_[static_cast<size_t>(id)]);
  for (int32_t k = dep_off_[static_cast<size_t>(id)]; k < dep_off_[static_cast<size_t>(id) + 1]; ++k)
    consider(deps_[static_cast<size_t>(k)]);
  busy_[q] = 1;
  ++head_[q];
  running_.push_back(id);
}

// Rates of the running tasks: collectives share each GPU's link classes
// max-min fairly (progressive filling of their speed relative to alone);
// compute runs at 1 - comm_sm_fraction while its GPU has a collective in flight.
void Sim::rates() {
  rate_.assign(running_.size(), 0);
  std::fill(comm_dim_.begin(), comm_dim_.end(), static_cast<uint8_t>(kDims));
  std::vector<size_t>& comm = comm_;
  comm.clear();
  for (size_t i = 0; i < running_.size(); ++i) {
    const Task& t = tasks_[static_cast<size_t>(running_[i])];
    if (!t.comm) continue;
    comm.push_back(i);
    comm_dim_[static_cast<size_t>(t.rank)] = t.dim;
    if (t.peer >= 0) comm_dim_[static_cast<size_t>(t.peer)] = t.dim;
  }
  // progressive filling
  std::vector<double>& f = fill_;
  std::vector<char>& frozen = frozen_;
  std::vector<size_t>& touched = touched_;
  f.assign(comm.size(), 0), frozen.assign(comm.size(), 0), touched.clear();
  auto res = [&](const Task& t, int side, size_t cls) {
    return static_cast<size_t>((side == 0 ? t.rank : t.peer) * kLinkClasses) + cls;
  };
  for (size_t ci = 0; ci < comm.size(); ++ci) {
    const Task& t = tasks_[static_cast<size_t>(running_[comm[ci]])];
    for (int side = 0; side < (t.peer >= 0 ? 2 : 1); ++side)
      for (size_t cls = 0; cls < kLinkClasses; ++cls)
        if (t.u[cls] > 0) {
          const size_t r = res(t, side, cls);
          if (residual_[r] < 0) residual_[r] = 1, touched.push_back(r);
        }
  }
  size_t left = comm.size();
  while (left > 0) {
    for (size_t r : touched) load_[r] = 0;
    double delta = std::numeric_limits<double>::infinity();
    for (size_t ci = 0; ci < comm.size(); ++ci) {
      if (frozen[ci]) continue;
      const Task& t = tasks_[static_cast<size_t>(running_[comm[ci]])];
      delta = std::min(delta, 1 - f[ci]);
      for (int side = 0; side < (t.peer >= 0 ? 2 : 1); ++side)
        for (size_t cls = 0; cls < kLinkClasses; ++cls)
          if (t.u[cls] > 0) load_[res(t, side, cls)] += t.u[cls];
    }
    for (size_t r : touched)
      if (load_[r] > 0) delta = std::min(delta, std::max(0.0, residual_[r]) / load_[r]);
    for (size_t r : touched) residual_[r] -= delta * load_[r];
    for (size_t ci = 0; ci < comm.size(); ++ci) {
      if (frozen[ci]) continue;
      f[ci] += delta;
      const Task& t = tasks_[static_cast<size_t>(running_[comm[ci]])];
      bool sat = f[ci] >= 1 - 1e-12;
      for (int side = 0; side < (t.peer >= 0 ? 2 : 1) && !sat; ++side)
        for (size_t cls = 0; cls < kLinkClasses; ++cls)
          if (t.u[cls] > 0 && residual_[res(t, side, cls)] <= 1e-12) sat = true;
      if (sat) frozen[ci] = 1, --left;
    }
  }
  for (size_t r : touched) residual_[r] = -1;
  for (size_t ci = 0; ci < comm.size(); ++ci) {
    const Task& t = tasks_[static_cast<size_t>(running_[comm[ci]])];
    rate_[comm[ci]] = std::min(1.0, f[ci]) / t.work;  // fraction per second
  }
  const double smf = spec_.comm_sm_fraction;
  for (size_t i = 0; i < running_.size(); ++i) {
    const Task& t = tasks_[static_cast<size_t>(running_[i])];
    if (t.comm) continue;
    rate_[i] = comm_dim_[static_cast<size_t>(t.rank)] != kDims ? 1 - smf : 1;  // seconds of work per second
  }
  if (spec_.cpu.on()) cpuRates();
}

// CPU ranks: every running task of a rank at the rank's share of its
// hosts' cores, min(1, capacity / busy ranks) of a calibrated thread on its
// slowest host, relative to the spec's times (which are time_scale x alone).
void Sim::cpuRates() {
  const CpuSharing& cs = spec_.cpu;
  std::fill(cpu_busy_.begin(), cpu_busy_.end(), 0);
  for (int32_t id : running_) cpu_busy_[static_cast<size_t>(tasks_[static_cast<size_t>(id)].rank)] = 1;
  for (size_t h = 0; h < cs.ranks.size(); ++h) {
    double k = 0;
    for (size_t d = 0; d < cpu_busy_.size(); ++d)
      if (cpu_busy_[d]) k += cs.ranks[h][d];
    cpu_load_[h] = k;
  }
  for (size_t d = 0; d < cpu_speed_.size(); ++d) {
    double share = 1;
    for (size_t h = 0; h < cs.ranks.size(); ++h)
      if (cs.ranks[h][d] > 0 && cpu_load_[h] > 0) share = std::min(share, cs.capacity / cpu_load_[h]);
    cpu_speed_[d] = cs.time_scale * share;
  }
  for (size_t i = 0; i < running_.size(); ++i)
    rate_[i] *= cpu_speed_[static_cast<size_t>(tasks_[static_cast<size_t>(running_[i])].rank)];
}

Status Sim::run() {
  const size_t n = tasks_.size();
  // CSR of dependencies and successors.
  dep_off_.assign(n + 1, 0), succ_off_.assign(n + 1, 0);
  for (const auto& [a, b] : edges_) ++dep_off_[static_cast<size_t>(b) + 1], ++succ_off_[static_cast<size_t>(a) + 1];
  for (size_t i = 0; i < n; ++i) dep_off_[i + 1] += dep_off_[i], succ_off_[i + 1] += succ_off_[i];
  deps_.resize(edges_.size()), succ_.resize(edges_.size());
  {
    std::vector<int32_t> dp(dep_off_.begin(), dep_off_.end() - 1), sp(succ_off_.begin(), succ_off_.end() - 1);
    for (const auto& [a, b] : edges_) {
      deps_[static_cast<size_t>(dp[static_cast<size_t>(b)]++)] = a;
      succ_[static_cast<size_t>(sp[static_cast<size_t>(a)]++)] = b;
    }
  }
  pending_.resize(n);
  for (size_t i = 0; i < n; ++i) pending_[i] = dep_off_[i + 1] - dep_off_[i];
  prev_in_queue_.assign(n, -1);
  for (const auto& q : queues_)
    for (size_t i = 1; i < q.size(); ++i) prev_in_queue_[static_cast<size_t>(q[i])] = q[i - 1];
  head_.assign(queues_.size(), 0), busy_.assign(queues_.size(), 0);
  residual_.assign(static_cast<size_t>(ranks_ * kLinkClasses), -1), load_.assign(residual_.size(), 0);
  comm_dim_.assign(static_cast<size_t>(ranks_), kDims);
  slow_.assign(static_cast<size_t>(ranks_), {});
  const bool cpu = spec_.cpu.on();
  cpu_busy_.assign(static_cast<size_t>(ranks_), 0), cpu_speed_.assign(static_cast<size_t>(ranks_), 1);
  cpu_load_.assign(spec_.cpu.ranks.size(), 0);
  for (size_t q = 0; q < queues_.size(); ++q) tryStart(q);
  size_t finished = 0;
  std::vector<int32_t> ended;
  while (!running_.empty()) {
    rates();
    double dt = std::numeric_limits<double>::infinity();
    size_t first = 0;
    for (size_t i = 0; i < running_.size(); ++i) {
      const Task& t = tasks_[static_cast<size_t>(running_[i])];
      const double left = t.comm ? 1 - t.done : t.work - t.done;
      const double need = rate_[i] > 0 ? left / rate_[i] : std::numeric_limits<double>::infinity();
      if (need < dt) dt = need, first = i;
    }
    if (!std::isfinite(dt)) return internalError("schedule: no running task can progress at t = {} s", now_);
    now_ += dt;
    ended.clear();
    for (size_t i = 0; i < running_.size(); ++i) {
      Task& t = tasks_[static_cast<size_t>(running_[i])];
      const double full = t.comm ? 1 : t.work;
      if (cpu && !t.comm) {
        // Its time beyond its work: the collectives' SMs take smf of every
        // second they are in flight (their dimension), the cores' share the
        // rest (its own dimension; less than nothing while it runs faster
        // than the spec's uniform share).  dt (1 - rate) in all.
        const double g = cpu_speed_[static_cast<size_t>(t.rank)];
        const uint8_t cd = comm_dim_[static_cast<size_t>(t.rank)];
        const double sms = cd != kDims ? spec_.comm_sm_fraction : 0;
        auto& sl = slow_[static_cast<size_t>(t.rank)];
        sl[t.dim] += dt * (1 - g) * (1 - sms);
        if (cd != kDims) sl[cd] += dt * sms;
      } else if (!t.comm && rate_[i] < 1) {
        slow_[static_cast<size_t>(t.rank)][comm_dim_[static_cast<size_t>(t.rank)]] += dt * (1 - rate_[i]);
      }
      t.done += rate_[i] * dt;
      if (i == first || t.done >= full * (1 - 1e-12)) t.done = full, ended.push_back(running_[i]);
    }
    for (int32_t id : ended) {
      Task& t = task(id);
      t.end = now_;
      makespan_ = std::max(makespan_, now_);
      running_.erase(std::find(running_.begin(), running_.end(), id));
      busy_[static_cast<size_t>(t.rank * kStreams + t.stream)] = 0;
      ++finished;
    }
    for (int32_t id : ended) {
      const Task& t = task(id);
      for (int32_t k = succ_off_[static_cast<size_t>(id)]; k < succ_off_[static_cast<size_t>(id) + 1]; ++k) {
        const int32_t s = succ_[static_cast<size_t>(k)];
        if (--pending_[static_cast<size_t>(s)] == 0)
          tryStart(static_cast<size_t>(tasks_[static_cast<size_t>(s)].rank * kStreams + tasks_[static_cast<size_t>(s)].stream));
      }
      tryStart(static_cast<size_t>(t.rank * kStreams + t.stream));
    }
  }
  if (finished != n)
    return internalError("schedule: deadlock, {} of {} tasks never started (pp={} vpp={} micro-batches={})", n - finished,
                         n, spec_.pp, spec_.vpp, spec_.micro_batches);
  return {};
}

// The pacing stage's timeline: compute, slowdown by collectives, and each
// wait charged along the chain of what it waited for.
void Sim::attribute(ScheduleResult* r) const {
  int32_t last = 0;
  for (size_t i = 0; i < tasks_.size(); ++i)
    if (tasks_[i].end > tasks_[static_cast<size_t>(last)].end) last = static_cast<int32_t>(i);
  const int64_t rank = tasks_[static_cast<size_t>(last)].rank;
  std::array<double, kDims> b{};
  auto blame = [&](int32_t id, double amount) {
    for (int depth = 0; amount > 1e-15 && depth < 100000; ++depth) {
      const int32_t d = tasks_[static_cast<size_t>(id)].binding;
      if (d < 0) break;
      const Task& w = tasks_[static_cast<size_t>(d)];
      if (!w.comm) break;  // waited for compute (another stage's): the bubble
      const double part = std::min(amount, w.end - w.start);
      b[w.dim] += part;
      amount -= part;
      id = d;
    }
    if (amount > 0) b[kBubble] += amount;
  };
  double prev = 0;
  for (int32_t id : queues_[static_cast<size_t>(rank * kStreams + sCompute)]) {
    const Task& t = tasks_[static_cast<size_t>(id)];
    blame(id, t.start - prev);
    b[t.dim] += t.work;
    prev = t.end;
  }
  for (int k = 0; k < kDims; ++k) b[static_cast<size_t>(k)] += slow_[static_cast<size_t>(rank)][static_cast<size_t>(k)];
  if (makespan_ > prev) {  // the stage's trailing collectives
    const Task& t = tasks_[static_cast<size_t>(last)];
    if (t.comm) {
      const double part = std::min(makespan_ - prev, t.end - t.start);
      b[t.dim] += part;
      if (makespan_ - prev > part) blame(last, makespan_ - prev - part);
    } else {
      b[kBubble] += makespan_ - prev;
    }
  }
  for (int k = 0; k < kDims; ++k) r->breakdown[kDimNames[k]] = b[static_cast<size_t>(k)];
}

void Sim::slices(ScheduleResult* r) const {
  r->slices.reserve(tasks_.size());
  for (const Task& t : tasks_) {
    const Label& l = t.label;
    std::string name = kKindNames[l.kind];
    if (l.micro >= 0) name += fmt::format(" mb{}", l.micro);
    if (l.chunk >= 0) name += fmt::format(" c{}", l.chunk);
    if (l.layer >= 0) name += fmt::format(" l{}", l.layer);
    r->slices.push_back({std::move(name), t.rank, t.stream, t.start, t.end - t.start});
  }
}

}  // namespace

std::vector<PipelineOp> pipelineOrder(int64_t rank, int64_t p, int64_t v, int64_t mb, bool zero_bubble, bool combine) {
  const int64_t total = mb * v;
  auto micro = [&](int64_t k) { return (k / (p * v)) * p + k % p; };
  auto chunk = [&](int64_t k, bool fwd) {
    const int64_t c = (k % (p * v)) / p;
    return fwd ? c : v - 1 - c;
  };
  // warm-up forwards, then one-forward-one-backward, then the cool-down backwards
  // (combined 1F1B: one more, so that a forward is ready to pair with every backward of the steady state)
  const int64_t warm = std::min((v == 1 ? p - rank - 1 : (p - rank - 1) * 2 + (v - 1) * p) + (combine ? 1 : 0), total);
  std::vector<PipelineOp> ops;
  ops.reserve(static_cast<size_t>(2 * total));
  int64_t f = 0, b = 0;
  for (; f < warm; ++f) ops.push_back({true, micro(f), chunk(f, true)});
  while (f < total) {
    ops.push_back({true, micro(f), chunk(f, true), false, combine}), ++f;
    ops.push_back({false, micro(b), chunk(b, false)}), ++b;
  }
  for (; b < total; ++b) ops.push_back({false, micro(b), chunk(b, false)});
  if (!zero_bubble || v != 1) return ops;
  std::vector<PipelineOp> zb;
  zb.reserve(ops.size() + static_cast<size_t>(total));
  std::vector<PipelineOp> pending;  // B done, W not yet (oldest first)
  size_t first = 0;
  for (const PipelineOp& op : ops) {
    zb.push_back(op);
    if (op.fwd) continue;
    zb.back().split = true;
    pending.push_back({false, op.micro, op.chunk, true});
    if (static_cast<int64_t>(pending.size() - first) > rank) zb.push_back(pending[first++]);
  }
  for (; first < pending.size(); ++first) zb.push_back(pending[first]);
  return zb;
}

std::vector<PipelineOp> dualPipeOrder(int64_t rank, int64_t p, int64_t m) {
  const int64_t h = p / 2, q = std::min(rank, p - 1 - rank), half = m / 2;
  const int64_t c0 = rank < h ? 0 : 1, c1 = 1 - c0;  // chunk 0: the copy entering nearest this rank
  std::array<int64_t, 2> nf{0, 0}, nb{0, 0};
  std::deque<PipelineOp> pending_w;  // split backwards whose W has not run, oldest first
  std::vector<PipelineOp> ops;
  ops.reserve(static_cast<size_t>(3 * m));
  auto F = [&](int64_t c, bool combined) {
    PipelineOp op{true, c * half + nf[static_cast<size_t>(c)]++, c};
    op.combined = combined;
    ops.push_back(op);
  };
  auto B = [&](int64_t c, bool split) {
    PipelineOp op{false, c * half + nb[static_cast<size_t>(c)]++, c};
    op.split = split;
    ops.push_back(op);
    if (split) pending_w.push_back({false, op.micro, c, true});
  };
  auto W = [&] {
    if (pending_w.empty()) return;
    ops.push_back(pending_w.front());
    pending_w.pop_front();
  };
  for (int64_t i = 0; i < 2 * (h - q - 1); ++i) F(c0, false);
  for (int64_t i = 0; i < q + 1; ++i) F(c0, false), F(c1, false);
  for (int64_t i = 0; i < h - q - 1; ++i) B(c1, true), W(), F(c1, false);
  for (int64_t i = 0; i < half - p + q + 1; ++i) F(c0, true), B(c1, false), F(c1, true), B(c0, false);
  for (int64_t i = 0; i < h - q - 1; ++i) B(c1, false), F(c1, true), B(c0, false);
  bool split = false;  // the second half of these backwards leave their W for the drain
  for (int64_t i = 0; i < q + 1; ++i) {
    if (i == (q + 1) / 2 && q % 2 == 1) split = true;
    B(c1, split);
    if (i == (q + 1) / 2 && q % 2 == 0) split = true;
    B(c0, split);
  }
  for (int64_t i = 0; i < h - q - 1; ++i) W(), B(c0, true);
  while (!pending_w.empty()) W();
  return ops;
}

namespace {

Status checkSpec(const IterationSpec& spec) {
  const int64_t p = spec.pp, v = spec.vpp, mb = spec.micro_batches, vs_count = p * v;
  if (p < 1 || v < 1 || mb < 1 || static_cast<int64_t>(spec.chunks.size()) != vs_count ||
      static_cast<int64_t>(spec.optimizer_s.size()) != p)
    return invalidArgument("schedule: pp={} vpp={} micro-batches={} with {} chunks and {} optimizer steps (need pp x vpp "
                           "and pp)", p, v, mb, spec.chunks.size(), spec.optimizer_s.size());
  const bool dp2 = spec.options.dualpipe;
  if (dp2 && (v != 2 || p < 2 || p % 2 != 0 || mb % 2 != 0 || mb < 2 * p || spec.options.zero_bubble ||
              spec.options.a2a_overlap))
    return invalidArgument("schedule: DualPipe needs two chunks (the copies), an even pp >= 2, an even number of "
                           "micro-batches >= 2 pp, and neither ZB-H1 nor the combined 1F1B (pp={} vpp={} micro-batches={})",
                           p, v, mb);
  if (v > 1 && !dp2 && mb % p != 0)
    return invalidArgument("schedule: interleaved micro-batches ({}) must be a multiple of pp={}", mb, p);
  if (spec.options.zero_bubble && v != 1)
    return invalidArgument("schedule: zero-bubble (ZB-H1) needs vpp = 1 (got {})", v);
  if (spec.options.zero_bubble && spec.options.a2a_overlap)
    return invalidArgument("schedule: zero-bubble (ZB-H1) and the combined 1F1B of a2a overlap are two different orders");
  if (const CpuSharing& cs = spec.cpu; cs.on()) {
    if (!(cs.capacity > 0) || !std::isfinite(cs.capacity) || !(cs.time_scale > 0) || !std::isfinite(cs.time_scale))
      return invalidArgument("schedule: CPU sharing needs a capacity > 0 and a time scale > 0 (got {} and {})",
                             cs.capacity, cs.time_scale);
    std::vector<double> placed(static_cast<size_t>(p), 0);
    for (const auto& host : cs.ranks) {
      if (static_cast<int64_t>(host.size()) != p)
        return invalidArgument("schedule: CPU sharing: a host lists {} pipeline ranks, the pipeline has {}",
                               host.size(), p);
      for (size_t d = 0; d < host.size(); ++d) {
        if (!(host[d] >= 0) || !std::isfinite(host[d]))
          return invalidArgument("schedule: CPU sharing: {} ranks of pipeline rank {} on a host", host[d], d);
        placed[d] += host[d];
      }
    }
    for (size_t d = 0; d < placed.size(); ++d)
      if (!(placed[d] > 0))
        return invalidArgument("schedule: CPU sharing: pipeline rank {} has no rank on any host", d);
  }
  return {};
}

// A send a pass's first task waits for: the neighbour's send of micro-batch
// and virtual stage `key`, forward (activation) or backward (gradient).
struct Late {
  int32_t task;
  size_t key;
  bool fwd;
};

// What one rank's passes share while its tasks are issued.
struct RankState {
  int64_t d = 0;
  std::vector<Op> ops;
  // The last backward of each chunk (ZeRO-0/1 reduce there) and whether its
  // first forward was seen (ZeRO-0..2 gather before it).
  std::vector<int64_t> last_bwd;
  std::vector<char> seen_fwd;
  // ZeRO-0..2: every layer's parameter gather, per chunk.
  std::vector<std::vector<int32_t>> param_ag;
  int32_t last_param_ag = -1;
  std::vector<int32_t> reduces;
  int32_t last_compute = -1;
  std::vector<int32_t> carry;  // the previous pass's last tasks: the next pass starts after its collectives
};

// One pass (a forward or a backward of one micro-batch through one virtual
// stage) is issued layer by layer, so that a combined forward and backward
// (options.a2a_overlap) can alternate their layers on the streams.
struct Pass {
  const Op* op = nullptr;
  size_t oi = 0;
  int64_t vs = 0;
  const std::vector<LayerPlan>* ch = nullptr;
  int16_t c16 = 0;
  int32_t m32 = 0;
  size_t key = 0;
  std::vector<int32_t> after;  // the frontier: the next task of this pass runs after these
  bool first_task = true;      // its first task waits for the neighbouring stage
  int32_t first_id = -1;       // that task
  std::vector<Late> waits;     // what it waits for (the neighbour's send)
  std::vector<int32_t> layer_end;
  size_t issued = 0;           // layers issued so far
  bool first_fwd = false, reduce_here = false;
  [[nodiscard]] bool more() const { return issued < ch->size(); }
};

// Run `id` after the frontier, then make it the frontier.
void chain(Pass& ps, int32_t id) {
  if (id >= 0) ps.after.assign(1, id);
}

// Two tasks side by side after the frontier; the frontier becomes both.
void fork(Pass& ps, int32_t a, int32_t b, const std::vector<int32_t>& before) {
  ps.after.clear();
  for (int32_t x : {a, b})
    if (x >= 0) ps.after.push_back(x);
  if (ps.after.empty()) ps.after = before;
}

// Issues every rank's tasks in its pipeline order into one Sim.
class Builder {
 public:
  explicit Builder(const IterationSpec& s)
      : spec(s), p(s.pp), v(s.vpp), mb(s.micro_batches), vs_count(s.pp * s.vpp), dp2(s.options.dualpipe), o(s.options),
        z3(s.zero >= 3), sim(s, s.pp), sent_f(static_cast<size_t>(mb * vs_count), -1), sent_b(sent_f.size(), -1) {
    mergeLayers();
  }
  void buildRank(int64_t d);
  Result<ScheduleResult> finish(bool keep_slices);

 private:
  void mergeLayers();
  void gatherParams(RankState& rs);
  Pass begin(RankState& rs, size_t oi);
  int32_t track(Pass& ps, int32_t id);
  void stepF(RankState& rs, Pass& ps);
  void finishF(const RankState& rs, Pass& ps);
  void stepB(RankState& rs, Pass& ps);
  void finishB(RankState& rs, Pass& ps);
  void passW(RankState& rs, size_t oi);
  void combined(RankState& rs, size_t oi);

  // Neighbouring virtual stages: interleaved, chunk c's last stage feeds
  // chunk c + 1's first; DualPipe's copies are separate pipelines, the
  // second laid out from rank p - 1 down.
  [[nodiscard]] bool hasPrev(int64_t vs) const { return dp2 ? vs % p > 0 : vs > 0; }
  [[nodiscard]] bool hasNext(int64_t vs) const { return dp2 ? vs % p < p - 1 : vs + 1 < vs_count; }
  [[nodiscard]] int64_t rankOf(int64_t vs) const { return dp2 && vs / p == 1 ? p - 1 - vs % p : vs % p; }
  [[nodiscard]] int64_t vsOf(int64_t chunk, int64_t rank) const { return chunk * p + stageOnRank(chunk, rank, p, dp2); }

  const IterationSpec& spec;
  const int64_t p, v, mb, vs_count;
  const bool dp2;
  const ScheduleOptions& o;
  const bool z3;
  int64_t group = 1;  // consecutive layers merged into one
  std::vector<std::vector<LayerPlan>> chunks;
  Sim sim;
  // Per (micro-batch, virtual stage): the task a neighbour's pass waits for.
  std::vector<int32_t> sent_f, sent_b;
  std::vector<Late> late;
};

// Merge consecutive layers of a chunk when the schedule would be too large.
void Builder::mergeLayers() {
  int64_t layers = 0;
  for (const auto& ch : spec.chunks) layers += static_cast<int64_t>(ch.size());
  constexpr int64_t kTasksPerLayer = 16;
  const int64_t estimate = layers * mb * kTasksPerLayer;
  group = std::max<int64_t>(1, (estimate + spec.options.max_tasks - 1) / spec.options.max_tasks);
  chunks.resize(static_cast<size_t>(vs_count));
  for (int64_t k = 0; k < vs_count; ++k) {
    const auto& src = spec.chunks[static_cast<size_t>(k)];
    for (size_t i = 0; i < src.size(); ++i) {
      if (i % static_cast<size_t>(group) == 0) chunks[static_cast<size_t>(k)].emplace_back();
      chunks[static_cast<size_t>(k)].back() += src[i];
    }
  }
}

// ZeRO-0..2: every layer's parameters gathered once (after last iteration's
// optimizer step), in the order the first forwards use them.
void Builder::gatherParams(RankState& rs) {
  rs.param_ag.assign(static_cast<size_t>(v), {});
  if (z3) return;
  for (int64_t c = 0; c < v; ++c) {
    const auto& ch = chunks[static_cast<size_t>(vsOf(c, rs.d))];
    for (size_t j = 0; j < ch.size(); ++j) {
      const int32_t g = sim.add(rs.d, sDpAg, kDp, ch[j].dp_ag.s, {}, {kAg, -1, static_cast<int16_t>(c), static_cast<int16_t>(j)},
                                &ch[j].dp_ag.link);
      rs.param_ag[static_cast<size_t>(c)].push_back(g);
      if (g >= 0) rs.last_param_ag = g;
    }
  }
}

Pass Builder::begin(RankState& rs, size_t oi) {
  Pass ps;
  const Op& op = rs.ops[oi];
  ps.op = &op, ps.oi = oi, ps.vs = vsOf(op.chunk, rs.d);
  ps.ch = &chunks[static_cast<size_t>(ps.vs)];
  ps.c16 = static_cast<int16_t>(op.chunk), ps.m32 = static_cast<int32_t>(op.micro);
  ps.key = static_cast<size_t>(op.micro * vs_count + ps.vs);
  ps.after = rs.carry;
  ps.layer_end.assign(ps.ch->size(), -1);
  if (op.fwd) {
    ps.first_fwd = !rs.seen_fwd[static_cast<size_t>(op.chunk)];
    rs.seen_fwd[static_cast<size_t>(op.chunk)] = 1;
  } else {
    // Under zero-bubble the B pass leaves its weight gradients to the W pass (and so its reduces).
    ps.reduce_here = !op.split &&
                     (spec.zero >= 2 || static_cast<int64_t>(oi) == rs.last_bwd[static_cast<size_t>(op.chunk)]);
  }
  return ps;
}

// The pass's first task waits for the neighbour.
int32_t Builder::track(Pass& ps, int32_t id) {
  if (id < 0) return id;
  if (ps.first_task) {
    if (ps.op->fwd && hasPrev(ps.vs)) ps.waits.push_back({id, static_cast<size_t>(ps.op->micro * vs_count + ps.vs - 1), true});
    if (!ps.op->fwd && hasNext(ps.vs))
      ps.waits.push_back({id, static_cast<size_t>(ps.op->micro * vs_count + ps.vs + 1), false});
    late.insert(late.end(), ps.waits.begin(), ps.waits.end());
    ps.first_id = id;
    ps.first_task = false;
  }
  return id;
}

// One layer of a forward pass: its parameter gather (ZeRO-3, or the first
// forward's), compute (the attention core beside the ring's transfers under
// context parallelism), tensor-parallel and expert collectives.
void Builder::stepF(RankState& rs, Pass& ps) {
  const int64_t d = rs.d;
  const size_t j = ps.issued++;
  const LayerPlan& lp = (*ps.ch)[j];
  const auto l16 = static_cast<int16_t>(j);
  const Label lab{kF, ps.m32, ps.c16, l16};
  if (z3) {
    const int32_t free_dep = j >= static_cast<size_t>(o.prefetch) + 1 ? ps.layer_end[j - static_cast<size_t>(o.prefetch) - 1] : -1;
    const int32_t g = sim.add(d, sDpAg, kDp, lp.dp_ag.s, {free_dep}, {kAg, ps.m32, ps.c16, l16}, &lp.dp_ag.link);
    if (g >= 0) ps.after.push_back(g);
  } else if (ps.first_fwd) {
    const int32_t g = o.overlap_dp ? rs.param_ag[static_cast<size_t>(ps.op->chunk)][j] : rs.last_param_ag;
    if (g >= 0) ps.after.push_back(g);
  }
  const bool ring = lp.cp.s > 0;
  const double core = ring ? std::min(lp.attn_core_fwd, lp.fwd) : 0;
  chain(ps, track(ps, sim.addAfter(d, sCompute, kCompute, lp.fwd - core, ps.after, lab)));
  if (ring) {
    const std::vector<int32_t> before = ps.after;
    const int32_t cc = track(ps, sim.addAfter(d, sCompute, kCompute, core, before, lab));
    const int32_t cx = track(ps, sim.addAfter(d, sCp, kCp, lp.cp.s, before, {kCpX, ps.m32, ps.c16, l16}, &lp.cp.link));
    fork(ps, cc, cx, before);
  }
  if (!ps.after.empty()) rs.last_compute = ps.after.front();
  ps.layer_end[j] = ps.after.empty() ? -1 : ps.after.front();
  chain(ps, track(ps, sim.addAfter(d, sTp, kTp, lp.tp_fwd.s, ps.after, {kTpF, ps.m32, ps.c16, l16}, &lp.tp_fwd.link)));
  chain(ps, track(ps, sim.addAfter(d, sEp, kEp, lp.ep.s, ps.after, {kEpX, ps.m32, ps.c16, l16}, &lp.ep.link)));
}

void Builder::finishF(const RankState& rs, Pass& ps) {
  int32_t s = -1;
  if (hasNext(ps.vs))
    s = sim.addAfter(rs.d, sPp, kPp, spec.p2p.s, ps.after, {kSendAct, ps.m32, ps.c16, -1}, &spec.p2p.link, rankOf(ps.vs + 1));
  sent_f[ps.key] = s >= 0 ? s : (ps.after.empty() ? -1 : ps.after.front());
}

// One layer of a backward pass, last layer first: its gather (ZeRO-3),
// recomputation, tensor-parallel collectives, the backward compute (split
// around the ring and the asynchronous tp GEMMs), the expert collective and,
// where the gradients are whole, the data-parallel reduce.
void Builder::stepB(RankState& rs, Pass& ps) {
  const int64_t d = rs.d;
  const size_t jj = ps.ch->size() - 1 - ps.issued++;
  const LayerPlan& lp = (*ps.ch)[jj];
  const auto l16 = static_cast<int16_t>(jj);
  const bool zb = ps.op->split;  // its weight gradients left to a W pass
  const int32_t m32 = ps.m32;
  const int16_t c16 = ps.c16;
  if (z3) {
    const size_t ahead = jj + static_cast<size_t>(o.prefetch) + 1;
    const int32_t free_dep = ahead < ps.ch->size() ? ps.layer_end[ahead] : -1;
    const int32_t g = sim.add(d, sDpAg, kDp, lp.dp_ag.s, {free_dep}, {kAg, m32, c16, l16}, &lp.dp_ag.link);
    if (g >= 0) ps.after.push_back(g);
  }
  chain(ps, track(ps, sim.addAfter(d, sCompute, kCompute, lp.recompute, ps.after, {kR, m32, c16, l16})));
  chain(ps, track(ps, sim.addAfter(d, sTp, kTp, lp.tp_recompute.s, ps.after, {kTpR, m32, c16, l16}, &lp.tp_recompute.link)));
  chain(ps, track(ps, sim.addAfter(d, sTp, kTp, lp.tp_bwd.s, ps.after, {kTpB, m32, c16, l16}, &lp.tp_bwd.link)));
  const bool ring = lp.cp.s > 0;
  const double b_async = zb ? lp.bwd_async - lp.wgrad_async : lp.bwd_async;  // the async GEMMs this pass runs
  const double b_main = (zb ? lp.bwd - lp.wgrad : lp.bwd) - b_async;
  const double core = ring ? std::min(2 * lp.attn_core_fwd, b_main) : 0;
  chain(ps, track(ps, sim.addAfter(d, sCompute, kCompute, b_main - core, ps.after, {kB, m32, c16, l16})));
  if (ring) {
    const std::vector<int32_t> before = ps.after;
    const int32_t cc = track(ps, sim.addAfter(d, sCompute, kCompute, core, before, {kB, m32, c16, l16}));
    const int32_t cx = track(ps, sim.addAfter(d, sCp, kCp, lp.cp.s, before, {kCpX, m32, c16, l16}, &lp.cp.link));
    fork(ps, cc, cx, before);
  }
  if (o.async_tp) {
    const std::vector<int32_t> before = ps.after;
    const int32_t g = track(ps, sim.addAfter(d, sCompute, kCompute, b_async, before, {kBGemm, m32, c16, l16}));
    const int32_t a = track(ps, sim.addAfter(d, sTp, kTp, lp.tp_async.s, before, {kTpAsync, m32, c16, l16}, &lp.tp_async.link));
    fork(ps, g, a, before);
    if (g >= 0) rs.last_compute = g;
  } else {
    chain(ps, track(ps, sim.addAfter(d, sCompute, kCompute, b_async, ps.after, {kBGemm, m32, c16, l16})));
    if (!ps.after.empty()) rs.last_compute = ps.after.front();
    chain(ps, track(ps, sim.addAfter(d, sTp, kTp, lp.tp_async.s, ps.after, {kTpAsync, m32, c16, l16}, &lp.tp_async.link)));
  }
  chain(ps, track(ps, sim.addAfter(d, sEp, kEp, lp.ep.s, ps.after, {kEpX, m32, c16, l16}, &lp.ep.link)));
  ps.layer_end[jj] = ps.after.empty() ? -1 : ps.after.front();
  if (ps.reduce_here && (o.overlap_dp || z3)) {
    const int32_t r = sim.addAfter(d, sDpRs, kDp, lp.dp_rs.s, ps.after, {kRs, m32, c16, l16}, &lp.dp_rs.link);
    if (r >= 0) rs.reduces.push_back(r);
  }
}

void Builder::finishB(RankState& rs, Pass& ps) {
  int32_t s = -1;
  if (hasPrev(ps.vs))
    s = sim.addAfter(rs.d, sPp, kPp, spec.p2p.s, ps.after, {kSendGrad, ps.m32, ps.c16, -1}, &spec.p2p.link, rankOf(ps.vs - 1));
  sent_b[ps.key] = s >= 0 ? s : (ps.after.empty() ? -1 : ps.after.front());
  if (ps.reduce_here && !o.overlap_dp && !z3)  // every reduce-scatter after the compute
    for (size_t jj = ps.ch->size(); jj-- > 0;) {
      const int32_t r = sim.addAfter(rs.d, sDpRs, kDp, (*ps.ch)[jj].dp_rs.s, ps.after,
                                     {kRs, ps.m32, ps.c16, static_cast<int16_t>(jj)}, &(*ps.ch)[jj].dp_rs.link);
      if (r >= 0) rs.reduces.push_back(r);
    }
}

// Zero-bubble W pass: the weight-gradient GEMMs of the layers, last layer
// first, on the compute stream after its B (stream order); the B's own
// collectives may still run.  The gradients are whole after it, so the
// data-parallel reduce follows it.
void Builder::passW(RankState& rs, size_t oi) {
  const int64_t d = rs.d;
  const Op& op = rs.ops[oi];
  const auto& ch = chunks[static_cast<size_t>(vsOf(op.chunk, d))];
  const auto c16 = static_cast<int16_t>(op.chunk);
  const auto m32 = static_cast<int32_t>(op.micro);
  const bool reduce_here = spec.zero >= 2 || static_cast<int64_t>(oi) == rs.last_bwd[static_cast<size_t>(op.chunk)];
  std::vector<int32_t> w_after;
  for (size_t jj = ch.size(); jj-- > 0;) {
    const LayerPlan& lp = ch[jj];
    const auto l16 = static_cast<int16_t>(jj);
    const int32_t w = sim.addAfter(d, sCompute, kCompute, lp.wgrad, w_after, {kW, m32, c16, l16});
    if (w >= 0) w_after.assign(1, w), rs.last_compute = w;
    if (reduce_here && (o.overlap_dp || z3)) {
      const int32_t r = sim.addAfter(d, sDpRs, kDp, lp.dp_rs.s, w_after, {kRs, m32, c16, l16}, &lp.dp_rs.link);
      if (r >= 0) rs.reduces.push_back(r);
    }
  }
  if (reduce_here && !o.overlap_dp && !z3)
    for (size_t jj = ch.size(); jj-- > 0;) {
      const int32_t r = sim.addAfter(d, sDpRs, kDp, ch[jj].dp_rs.s, w_after, {kRs, m32, c16, static_cast<int16_t>(jj)},
                                     &ch[jj].dp_rs.link);
      if (r >= 0) rs.reduces.push_back(r);
    }
  if (!w_after.empty()) rs.carry.push_back(w_after.front());
}

// A forward and the next backward as one step, their layers alternating on
// every stream: each pass's expert dispatch and combine (and its other
// collectives) run under the other pass's compute.
void Builder::combined(RankState& rs, size_t oi) {
  Pass f = begin(rs, oi), b = begin(rs, oi + 1);
  while (f.more() || b.more()) {
    if (f.more()) stepF(rs, f);
    if (b.more()) stepB(rs, b);
  }
  finishF(rs, f), finishB(rs, b);
  // The step starts when both its inputs have arrived (the framework
  // receives the activation and the gradient together before it).
  for (const Late& w : b.waits)
    if (f.first_id >= 0) late.push_back({f.first_id, w.key, w.fwd});
  for (const Late& w : f.waits)
    if (b.first_id >= 0) late.push_back({b.first_id, w.key, w.fwd});
  rs.carry = f.after;
  rs.carry.insert(rs.carry.end(), b.after.begin(), b.after.end());
}

// Rank d's passes in its pipeline order, then its optimizer step after its
// reduces and its last compute.
void Builder::buildRank(int64_t d) {
  RankState rs;
  rs.d = d;
  rs.ops = dp2 ? dualPipeOrder(d, p, mb) : pipelineOrder(d, p, v, mb, o.zero_bubble, o.a2a_overlap);
  // Zero-bubble: the gradients are whole after the W pass, so the reduces follow the Ws.
  rs.last_bwd.assign(static_cast<size_t>(v), -1);
  for (size_t i = 0; i < rs.ops.size(); ++i)
    if (!rs.ops[i].fwd && (rs.ops[i].wgrad || !rs.ops[i].split)) rs.last_bwd[static_cast<size_t>(rs.ops[i].chunk)] = static_cast<int64_t>(i);
  rs.seen_fwd.assign(static_cast<size_t>(v), 0);
  gatherParams(rs);
  for (size_t oi = 0; oi < rs.ops.size(); ++oi) {
    const Op& op = rs.ops[oi];
    if (op.wgrad) {
      passW(rs, oi);
      continue;
    }
    if (op.fwd && op.combined && oi + 1 < rs.ops.size() && !rs.ops[oi + 1].fwd) {
      combined(rs, oi);
      ++oi;
      continue;
    }
    Pass ps = begin(rs, oi);
    while (ps.more()) op.fwd ? stepF(rs, ps) : stepB(rs, ps);
    op.fwd ? finishF(rs, ps) : finishB(rs, ps);
    rs.carry = ps.after;
  }
  std::vector<int32_t> opt_deps = rs.reduces;
  opt_deps.push_back(rs.last_compute);
  sim.addAfter(d, sCompute, kOptimizer, spec.optimizer_s[static_cast<size_t>(d)], opt_deps, {kOpt, -1, -1, -1});
}

Result<ScheduleResult> Builder::finish(bool keep_slices) {
  for (const Late& l : late) sim.edge(l.fwd ? sent_f[l.key] : sent_b[l.key], l.task);
  CHORUS_RETURN_IF_ERROR(sim.run());
  ScheduleResult r;
  r.makespan_s = sim.makespan();
  r.tasks = static_cast<int64_t>(sim.size());
  r.merged_layers = static_cast<int>(group);
  sim.attribute(&r);
  if (keep_slices) sim.slices(&r);
  return r;
}

}  // namespace

Result<ScheduleResult> simulateSchedule(const IterationSpec& spec, bool keep_slices) {
  CHORUS_RETURN_IF_ERROR(checkSpec(spec));
  Builder b(spec);
  for (int64_t d = 0; d < spec.pp; ++d) b.buildRank(d);
  return b.finish(keep_slices);
}

}  // namespace chorus::sim
