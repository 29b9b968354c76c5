// The flow-level model without round barriers: every rank's expanded program
// runs as the executor runs it (src/exec/executor.hpp), and its messages are
// flows that share links max-min fairly.  Used by NetMode::Flow when the
// groups are small enough to expand (network.hpp, kMaxProgramRanks).
//
// What it keeps of the executor and the transports:
//  - a step starts when the steps it depends on have finished (the builder's
//    dependencies: data hazards and program order per peer);
//  - sends to a peer are posted in program order, receives from a peer too,
//    and a receive is posted no earlier than the send before it in program
//    order (the executor's receive gate);
//  - the messages of an ordered pair travel one after another on one stream
//    (a TCP connection, a shared-memory queue), matched in order;
//  - a message of at least network.rendezvous_bytes between nodes waits until
//    its receive is posted and a grant has crossed back (clear-to-send);
//    smaller ones go eagerly and wait at the receiver if they are early;
//  - a message is delivered its route's latency after its last byte left;
//  - a rank's local work (copies, reductions, reducing a received message)
//    runs one piece at a time on its own core, at the GPU's HBM rate
//    (3 x bytes for a reduction, 2 x bytes for a copy or the op's Scale and
//    Divide passes: reads and writes).
//
// A plan that carries its runtime's schedule (plan::PlanSpec::streams: the
// thread blocks and channels of an MSCCL program) runs as that runtime runs
// it instead (docs/msccl.md, "Pricing"):
//  - each thread block is a sequential stream: a step starts when the one
//    before it in its thread block has finished, and when its depid/deps
//    steps have (as well as the builder's data dependencies, which the
//    importer's race check proved the program orders anyway);
//  - every (ordered pair, channel) is a connection of its own that carries
//    its messages one after another, so channels and peers move data at once
//    and share the links max-min fairly; nothing else orders the posts (no
//    executor's receive gate, no per-peer posting order);
//  - messages go eagerly into the receiver's connection buffer (NCCL's
//    primitives under MSCCL: no rendezvous);
//  - the protocol's line format sets the bytes on the wire: LL stores 4
//    bytes of data with a 4-byte flag in every 8 (x2), LL128 120 of every
//    128 (x128/120), Simple the data alone (NCCL's src/device/prims_ll*.h).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <tuple>

#include "plan/plan_file.hpp"
#include "sim/network.hpp"

namespace chorus::sim {

using plan::StepOp;
namespace {

struct Flow {
  uint32_t step;  // the send (global step id)
  double left, rate = 0;
  int64_t route_begin, route_end;  // into routes
  Seconds lat;
};

// Per ordered pair and channel: the next message to start and whether one is on the wire.
struct PairStream {
  size_t next = 0;
  bool busy = false;
};

}  // namespace

// One collective's programs run as events: steps become ready as their
// dependencies finish, sends become flows whose rates are shared max-min
// fairly, receives finish when posted and delivered.
class NetworkModel::ProgramFlow {
 public:
  ProgramFlow(const NetworkModel& net, const plan::Algorithm& a, const plan::Shape& sh, const GroupSet& g)
      : net_(net), a_(a), g_(g), n_(static_cast<int>(g.size)), ranks_(g.size * g.groups),
        cap_(net.flowCapacities()), hbm_(net.c_.gpu.hbm_bw.value() * net.c_.gpu.hbm_efficiency),
        eb_(static_cast<double>(sh.elem_size)), rendezvous_(net.c_.network.rendezvous_bytes) {
    expand(sh);
    schedule();
  }
  Status matchMessages();
  Result<CollectiveCost> run();

 private:
  // At equal times: finishes, then deliveries, then grants, then newly ready steps.
  enum Kind : int { StepDone = 0, Deliver = 1, Grant = 2, Ready = 3 };
  using Event = std::tuple<double, int, uint32_t>;  // (time, kind, step)
  using Pair = std::pair<int64_t, int64_t>;
  using Conn = std::tuple<int64_t, int64_t, int32_t>;  // (from, to, channel)

  void expand(const plan::Shape& sh);
  void schedule();
  [[nodiscard]] int32_t chanOf(uint32_t gid) const {
    if (!streamed_) return 0;
    const int64_t q = owner_[gid];
    return chan_[static_cast<size_t>(q % n_)][gid - base_[static_cast<size_t>(q)]];
  }
  [[nodiscard]] Conn connOf(uint32_t send) const {
    const int64_t q = owner_[send];
    return {q, peerOf(q, stepOf(send).peer), chanOf(send)};
  }
  // Rank q of the simulation is member q % n of group q / n; every group runs
  // the same programs.
  [[nodiscard]] const plan::Program& progOf(int64_t q) const { return progs_[static_cast<size_t>(q % n_)]; }
  [[nodiscard]] int64_t gpuOf(int64_t q) const { return g_.gpuOf(q / n_, q % n_); }
  [[nodiscard]] int64_t peerOf(int64_t q, int peer) const { return q - q % n_ + peer; }
  [[nodiscard]] const plan::Step& stepOf(uint32_t gid) const {
    const int64_t q = owner_[gid];
    return progOf(q).steps[gid - base_[static_cast<size_t>(q)]];
  }
  [[nodiscard]] bool crossNode(uint32_t send) const {
    const int64_t q = owner_[send];
    return net_.t_.nodeOf(gpuOf(q)) != net_.t_.nodeOf(gpuOf(peerOf(q, stepOf(send).peer)));
  }
  [[nodiscard]] double bytesOf(const plan::Step& s) const {
    return eb_ * static_cast<double>(s.op == StepOp::Send ? s.src.count : s.dst.count);
  }
  [[nodiscard]] bool needsGrant(uint32_t send, double bytes) const {
    return !streamed_ && bytes >= rendezvous_ && rendezvous_ > 0 && crossNode(send) && !granted_[send];
  }
  double onCpu(int64_t q, double at, double seconds);
  void tryFinishRecv(uint32_t r);
  void post(uint32_t gid);
  void postReady(uint32_t gid);
  void tryStart(const Conn& c);
  void complete(uint32_t gid);
  void rates();
  bool deliverSent();
  void handle(const Event& e);
  [[nodiscard]] CollectiveCost cost() const;

  const NetworkModel& net_;
  const plan::Algorithm& a_;
  const GroupSet& g_;
  const int n_;
  const int64_t ranks_;
  const std::vector<double> cap_;  // by flow link
  const double hbm_, eb_, rendezvous_;
  std::vector<plan::Program> progs_;
  // The runtime's schedule (streamed_): per member's program, each step's
  // channel and the steps it waits for besides the builder's (CSR, both ways).
  bool streamed_ = false;
  double wire_ = 1;  // bytes on the wire per byte of data (the protocol)
  std::vector<std::vector<int32_t>> chan_;
  std::vector<std::vector<uint32_t>> xdep_begin_, xdeps_, xsucc_begin_, xsucc_;
  std::vector<uint32_t> base_;  // rank q's steps are base_[q] .. base_[q + 1]
  uint32_t total_ = 0;
  std::vector<int64_t> owner_;
  // Matching: the k-th send from q to p pairs with p's k-th receive from q.
  std::map<Pair, std::vector<uint32_t>> sends_, recvs_;
  std::map<Conn, std::vector<uint32_t>> conn_sends_;  // each connection's sends in program order
  std::vector<uint32_t> match_, pending_;

  std::vector<int64_t> routes_;
  std::vector<Flow> flows_;  // active
  std::map<Conn, PairStream> streams_;
  std::vector<char> posted_, arrived_, granted_, ready_;
  std::vector<double> posted_at_, started_at_;  // streamed_: when a step was posted, a send's flow started
  std::vector<double> cpu_free_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  double now_ = 0, finish_ = 0;
  uint32_t done_ = 0;
  int64_t bottleneck_ = -1;             // of the current rates
  std::map<int64_t, double> limited_;  // seconds each link was the bottleneck
  Seconds max_lat_ = Seconds(0);
  // Posted so far, in program order per peer and direction.
  std::map<Pair, size_t> send_posted_, recv_posted_;
  // Scratch of rates().
  std::vector<double> residual_;
  std::vector<int64_t> count_, touched_;
};

void NetworkModel::ProgramFlow::expand(const plan::Shape& sh) {
  progs_.resize(static_cast<size_t>(n_));
  for (int r = 0; r < n_; ++r) plan::expand(a_, sh, r, &progs_[static_cast<size_t>(r)]);
  base_.assign(static_cast<size_t>(ranks_) + 1, 0);
  for (int64_t q = 0; q < ranks_; ++q)
    base_[static_cast<size_t>(q) + 1] = base_[static_cast<size_t>(q)] + static_cast<uint32_t>(progOf(q).size());
  total_ = base_.back();
  owner_.resize(total_);
  for (int64_t q = 0; q < ranks_; ++q)
    for (uint32_t i = base_[static_cast<size_t>(q)]; i < base_[static_cast<size_t>(q) + 1]; ++i) owner_[i] = q;
  match_.assign(total_, UINT32_MAX);
  pending_.assign(total_, 0);
  posted_.assign(total_, 0), arrived_.assign(total_, 0), granted_.assign(total_, 0), ready_.assign(total_, 0);
  cpu_free_.assign(static_cast<size_t>(ranks_), 0.0);
  residual_.assign(cap_.size(), 0.0);
  count_.assign(cap_.size(), 0);
}

// The schedule of a plan that carries one (plan::PlanSpec::streams): each
// step's channel, and as extra dependencies the previous step of its thread
// block and its depid/deps.  The op's Scale before and Divide after the
// plan's steps (plan::expand) keep the builder's dependencies alone.
void NetworkModel::ProgramFlow::schedule() {
  const auto* file = dynamic_cast<const plan::FileAlgorithm*>(&a_);
  if (file == nullptr || file->spec().streams.empty()) return;
  const plan::PlanSpec& spec = file->spec();
  if (spec.streams.size() != static_cast<size_t>(n_)) return;
  std::vector<size_t> lead(static_cast<size_t>(n_));
  for (int r = 0; r < n_; ++r) {
    const plan::Program& p = progs_[static_cast<size_t>(r)];
    size_t l = 0, t = 0;
    while (l < p.size() && p.steps[l].op == StepOp::Scale) ++l;
    while (t < p.size() - l && p.steps[p.size() - 1 - t].op == StepOp::Divide) ++t;
    if (p.size() != l + spec.streams[static_cast<size_t>(r)].size() + t) return;  // not the file's steps: no schedule
    lead[static_cast<size_t>(r)] = l;
  }
  streamed_ = true;
  posted_at_.assign(total_, 0.0);
  started_at_.assign(total_, 0.0);
  switch (spec.proto) {
    case plan::PlanProto::LL: wire_ = 2.0; break;
    case plan::PlanProto::LL128: wire_ = 128.0 / 120.0; break;
    default: wire_ = 1.0;
  }
  chan_.assign(static_cast<size_t>(n_), {});
  xdep_begin_.assign(static_cast<size_t>(n_), {});
  xdeps_.assign(static_cast<size_t>(n_), {});
  xsucc_begin_.assign(static_cast<size_t>(n_), {});
  xsucc_.assign(static_cast<size_t>(n_), {});
  for (int r = 0; r < n_; ++r) {
    const size_t R = static_cast<size_t>(r);
    const size_t m = progs_[R].size(), l = lead[R];
    const auto& st = spec.streams[R];
    chan_[R].assign(m, 0);
    auto& begin = xdep_begin_[R];
    auto& deps = xdeps_[R];
    begin.assign(1, 0);
    std::map<int32_t, uint32_t> last;  // thread block -> its latest step
    for (size_t i = 0; i < m; ++i) {
      if (i >= l && i - l < st.size()) {
        const plan::StepStream& ss = st[i - l];
        chan_[R][i] = ss.chan;
        if (ss.tb >= 0) {
          if (auto it = last.find(ss.tb); it != last.end()) deps.push_back(it->second);
          last[ss.tb] = static_cast<uint32_t>(i);
        }
        for (uint32_t w : ss.waits) deps.push_back(static_cast<uint32_t>(w + l));
      }
      begin.push_back(static_cast<uint32_t>(deps.size()));
    }
    std::vector<uint32_t> cnt(m + 1, 0);
    for (uint32_t d : deps) ++cnt[d + 1];
    for (size_t i = 0; i < m; ++i) cnt[i + 1] += cnt[i];
    xsucc_begin_[R] = cnt;
    xsucc_[R].assign(deps.size(), 0);
    std::vector<uint32_t> fill(cnt.begin(), cnt.end() - 1);
    for (uint32_t i = 0; i < m; ++i)
      for (uint32_t j = begin[i]; j < begin[i + 1]; ++j) xsucc_[R][fill[deps[j]]++] = i;
  }
}

// Pairs every send with its receive and counts each step's dependencies
// (with the executor's receive gate: a receive after a send in program order
// waits for that send to be posted).
Status NetworkModel::ProgramFlow::matchMessages() {
  for (int64_t q = 0; q < ranks_; ++q) {
    const plan::Program& p = progOf(q);
    bool after_send = false;
    for (uint32_t i = 0; i < p.size(); ++i) {
      const uint32_t gid = base_[static_cast<size_t>(q)] + i;
      const plan::Step& s = p.steps[i];
      pending_[gid] = static_cast<uint32_t>(p.depsOf(i).size());
      if (streamed_) {
        const size_t m = static_cast<size_t>(q % n_);
        pending_[gid] += xdep_begin_[m][i + 1] - xdep_begin_[m][i];
      }
      if (s.op == StepOp::Send) {
        sends_[{q, peerOf(q, s.peer)}].push_back(gid);
        conn_sends_[connOf(gid)].push_back(gid);
        after_send = true;
      } else if (s.op == StepOp::Recv || s.op == StepOp::RecvReduce) {
        recvs_[{peerOf(q, s.peer), q}].push_back(gid);
        if (after_send && !streamed_) ++pending_[gid];  // the receive gate
      }
    }
  }
  for (auto& [pair, ss] : sends_) {
    const auto& rs = recvs_[pair];
    if (rs.size() != ss.size())
      return internalError("{} '{}': rank {} sends {} messages to rank {}, which receives {}",
                           plan::collectiveName(a_.collective()), a_.name(), pair.first % n_, ss.size(), pair.second % n_,
                           rs.size());
    for (size_t k = 0; k < ss.size(); ++k) match_[ss[k]] = rs[k], match_[rs[k]] = ss[k];
  }
  return {};
}

// Runs local work on q's core from `at`; returns when it ends.
double NetworkModel::ProgramFlow::onCpu(int64_t q, double at, double seconds) {
  double& f = cpu_free_[static_cast<size_t>(q)];
  f = std::max(f, at) + seconds;
  return f;
}

// A receive that is posted and whose message is here finishes after its copy
// or reduction.
void NetworkModel::ProgramFlow::tryFinishRecv(uint32_t r) {
  if (!posted_[r] || !arrived_[r]) return;
  const plan::Step& s = stepOf(r);
  const double work = s.op == StepOp::RecvReduce ? 3 * bytesOf(s) / hbm_ : 0.0;
  if (streamed_ && work > 0) {
    // MSCCL's fused receive-reduce reduces the message as it streams in:
    // from when the receive was posted and the message began to arrive.
    const double from = std::max(posted_at_[r], started_at_[match_[r]]);
    events_.push({std::max(now_, onCpu(owner_[r], from, work)), StepDone, r});
    return;
  }
  events_.push({work > 0 ? onCpu(owner_[r], now_, work) : now_, StepDone, r});
}

void NetworkModel::ProgramFlow::post(uint32_t gid) {
  posted_[gid] = 1;
  if (streamed_) posted_at_[gid] = now_;
  const plan::Step& s = stepOf(gid);
  const int64_t q = owner_[gid];
  if (s.op == StepOp::Send) {
    // The receive gate: receives after this send, up to the next send.
    const plan::Program& p = progOf(q);
    for (uint32_t i = gid - base_[static_cast<size_t>(q)] + 1; i < p.size() && !streamed_; ++i) {
      const plan::Step& t = p.steps[i];
      if (t.op == StepOp::Send) break;
      if (t.op != StepOp::Recv && t.op != StepOp::RecvReduce) continue;
      const uint32_t r = base_[static_cast<size_t>(q)] + i;
      if (--pending_[r] == 0) events_.push({now_, Ready, r});
    }
    tryStart(connOf(gid));
  } else {
    const uint32_t snd = match_[gid];
    if (needsGrant(snd, bytesOf(s))) {  // the grant crosses back to the sender
      Seconds lat = net_.t_.route(gpuOf(q), gpuOf(owner_[snd]), [](int64_t) {}, net_.pxn_);
      events_.push({now_ + lat.value(), Grant, snd});
    }
    tryFinishRecv(gid);
  }
}

// Posts, in program order per peer and direction, every ready step.
void NetworkModel::ProgramFlow::postReady(uint32_t gid) {
  const plan::Step& s = stepOf(gid);
  const int64_t q = owner_[gid];
  if (plan::isLocal(s.op)) {  // compressed plans' (de)quantize steps are local work too
    // A copy, scale or divide reads and writes the region once; a reduction
    // (or a (de)quantize) reads more.
    const bool pass = s.op == StepOp::Copy || s.op == StepOp::Scale || s.op == StepOp::Divide;
    const double work = (pass ? 2 : 3) * eb_ * static_cast<double>(s.dst.count) / hbm_;
    events_.push({onCpu(q, now_, work), StepDone, gid});
    return;
  }
  if (streamed_) {  // no posting order: each connection starts its sends in order (tryStart)
    post(gid);
    return;
  }
  const bool snd = s.op == StepOp::Send;
  const Pair key = snd ? Pair{q, peerOf(q, s.peer)} : Pair{peerOf(q, s.peer), q};
  auto& order = snd ? sends_[key] : recvs_[key];
  size_t& k = (snd ? send_posted_ : recv_posted_)[key];
  while (k < order.size() && ready_[order[k]]) post(order[k++]);
}

// Starts a connection's next message (q to p on a channel) when it is free,
// the send is posted and, for a rendezvous message, its grant has arrived.
void NetworkModel::ProgramFlow::tryStart(const Conn& c) {
  const int64_t q = std::get<0>(c), p = std::get<1>(c);
  PairStream& st = streams_[c];
  const auto& order = conn_sends_[c];
  if (st.busy || st.next >= order.size()) return;
  const uint32_t gid = order[st.next];
  if (!posted_[gid]) return;
  const double bytes = bytesOf(stepOf(gid));
  if (needsGrant(gid, bytes)) return;
  ++st.next;
  st.busy = true;
  if (streamed_) started_at_[gid] = now_;
  Flow f{.step = gid, .left = bytes * wire_, .route_begin = static_cast<int64_t>(routes_.size()), .route_end = 0};
  f.lat = net_.flowRoute(gpuOf(q), gpuOf(p), routes_);
  f.route_end = static_cast<int64_t>(routes_.size());
  flows_.push_back(f);
}

void NetworkModel::ProgramFlow::complete(uint32_t gid) {
  ++done_;
  finish_ = std::max(finish_, now_);
  const int64_t q = owner_[gid];
  const plan::Program& p = progOf(q);
  const uint32_t i = gid - base_[static_cast<size_t>(q)];
  for (uint32_t succ : p.succOf(i)) {
    const uint32_t sg = base_[static_cast<size_t>(q)] + succ;
    if (--pending_[sg] == 0) events_.push({now_, Ready, sg});
  }
  if (streamed_) {
    const size_t m = static_cast<size_t>(q % n_);
    for (uint32_t k = xsucc_begin_[m][i]; k < xsucc_begin_[m][i + 1]; ++k) {
      const uint32_t sg = base_[static_cast<size_t>(q)] + xsucc_[m][k];
      if (--pending_[sg] == 0) events_.push({now_, Ready, sg});
    }
  }
}

// Max-min fair rates of the active flows (progressive filling).
void NetworkModel::ProgramFlow::rates() {
  touched_.clear();
  for (const Flow& f : flows_)
    for (int64_t i = f.route_begin; i < f.route_end; ++i) {
      const size_t l = static_cast<size_t>(routes_[static_cast<size_t>(i)]);
      if (count_[l]++ == 0) touched_.push_back(static_cast<int64_t>(l)), residual_[l] = cap_[l];
    }
  std::vector<char> frozen(flows_.size(), 0);
  size_t left = flows_.size();
  bool first = true;
  bottleneck_ = -1;
  while (left > 0) {
    double share = std::numeric_limits<double>::infinity();
    int64_t worst = -1;
    for (int64_t l : touched_) {
      const size_t ul = static_cast<size_t>(l);
      if (count_[ul] > 0 && residual_[ul] / static_cast<double>(count_[ul]) < share)
        share = residual_[ul] / static_cast<double>(count_[ul]), worst = l;
    }
    if (worst < 0) break;
    if (first) bottleneck_ = worst, first = false;
    for (size_t i = 0; i < flows_.size(); ++i) {
      if (frozen[i]) continue;
      Flow& f = flows_[i];
      bool on = false;
      for (int64_t k = f.route_begin; k < f.route_end && !on; ++k) on = routes_[static_cast<size_t>(k)] == worst;
      if (!on) continue;
      frozen[i] = 1, --left;
      f.rate = share;
      for (int64_t k = f.route_begin; k < f.route_end; ++k) {
        const size_t m = static_cast<size_t>(routes_[static_cast<size_t>(k)]);
        residual_[m] = std::max(0.0, residual_[m] - share);
        --count_[m];
      }
    }
  }
  for (size_t i = 0; i < flows_.size(); ++i)
    if (!frozen[i]) flows_[i].rate = std::numeric_limits<double>::infinity();  // a route without links
  for (int64_t l : touched_) count_[static_cast<size_t>(l)] = 0;
}

// Flows whose last byte has left: deliver after the route's latency.
// Returns whether any was.
bool NetworkModel::ProgramFlow::deliverSent() {
  bool any = false;
  for (size_t i = 0; i < flows_.size();) {
    Flow& f = flows_[i];
    if (f.left > 1e-6 * std::max(1.0, bytesOf(stepOf(f.step)) * wire_) && std::isfinite(f.rate)) {
      ++i;
      continue;
    }
    const uint32_t s = f.step;
    max_lat_ = std::max(max_lat_, f.lat);
    events_.push({now_ + f.lat.value(), Deliver, match_[s]});
    events_.push({now_, StepDone, s});  // the send's buffer is free
    const Conn c = connOf(s);
    streams_[c].busy = false;
    flows_[i] = flows_.back();
    flows_.pop_back();
    any = true;
    tryStart(c);
  }
  return any;
}

void NetworkModel::ProgramFlow::handle(const Event& e) {
  const auto [at, kind, gid] = e;
  switch (kind) {
    case StepDone: complete(gid); break;
    case Deliver: arrived_[gid] = 1, tryFinishRecv(gid); break;
    case Grant: {
      granted_[gid] = 1;
      tryStart(connOf(gid));
      break;
    }
    case Ready:
      ready_[gid] = 1;
      postReady(gid);
  }
}

Result<CollectiveCost> NetworkModel::ProgramFlow::run() {
  for (uint32_t gid = 0; gid < total_; ++gid)
    if (pending_[gid] == 0) events_.push({0.0, Ready, gid});
  bool dirty = true;
  while (done_ < total_) {
    if (dirty) rates(), dirty = false;
    double next_flow = std::numeric_limits<double>::infinity();
    for (const Flow& f : flows_) next_flow = std::min(next_flow, now_ + (f.rate > 0 ? f.left / f.rate : next_flow));
    const double next_event = events_.empty() ? std::numeric_limits<double>::infinity() : std::get<0>(events_.top());
    const double t = std::min(next_flow, next_event);
    if (!std::isfinite(t))
      return internalError("{} '{}' stalls in the program simulation after {} of {} steps (a plan that cannot finish)",
                           plan::collectiveName(a_.collective()), a_.name(), done_, total_);
    for (Flow& f : flows_) f.left = std::isfinite(f.rate) ? f.left - f.rate * (t - now_) : 0.0;
    if (!flows_.empty() && bottleneck_ >= 0) limited_[bottleneck_] += t - now_;
    now_ = t;
    if (next_flow <= next_event) {
      dirty = deliverSent() || dirty;
      continue;
    }
    const Event e = events_.top();
    events_.pop();
    const size_t before = flows_.size();
    handle(e);
    dirty = dirty || flows_.size() != before;
  }
  return cost();
}

CollectiveCost NetworkModel::ProgramFlow::cost() const {
  CollectiveCost cost;
  cost.algo = std::string(a_.name());
  cost.time = Seconds(finish_);
  cost.latency = max_lat_;
  int64_t worst = -1;
  for (const auto& [l, secs] : limited_)
    if (worst < 0 || secs > limited_.at(worst)) worst = l;
  if (worst >= 0) worst = net_.topologyLinkOf(worst);
  cost.bottleneck = worst >= 0 && max_lat_.value() * 2 < finish_ ? net_.t_.linkName(worst) : "latency";
  return cost;
}

Result<CollectiveCost> NetworkModel::programFlow(const plan::Algorithm& a, const plan::Shape& sh, const GroupSet& g) {
  ProgramFlow run(*this, a, sh, g);
  CHORUS_RETURN_IF_ERROR(run.matchMessages());
  return run.run();
}

}  // namespace chorus::sim
