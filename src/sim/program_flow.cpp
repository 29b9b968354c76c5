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
//    (3 x bytes for a reduction, 2 x bytes for a copy: reads and writes).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <tuple>

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

}  // namespace

Result<CollectiveCost> NetworkModel::programFlow(const plan::Algorithm& a, const plan::Shape& sh, const GroupSet& g) {
  const int n = static_cast<int>(g.size);
  const int64_t ranks = g.size * g.groups;
  // Rank q of the simulation is member q % n of group q / n; every group runs
  // the same programs.
  std::vector<plan::Program> progs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) plan::expand(a, sh, r, &progs[static_cast<size_t>(r)]);
  std::vector<uint32_t> base(static_cast<size_t>(ranks) + 1, 0);
  for (int64_t q = 0; q < ranks; ++q)
    base[static_cast<size_t>(q) + 1] = base[static_cast<size_t>(q)] + static_cast<uint32_t>(progs[static_cast<size_t>(q % n)].size());
  const uint32_t total = base.back();
  auto progOf = [&](int64_t q) -> const plan::Program& { return progs[static_cast<size_t>(q % n)]; };
  auto gpuOf = [&](int64_t q) { return g.gpuOf(q / n, q % n); };
  auto peerOf = [&](int64_t q, int peer) { return q - q % n + peer; };
  std::vector<int64_t> owner(total);
  for (int64_t q = 0; q < ranks; ++q)
    for (uint32_t i = base[static_cast<size_t>(q)]; i < base[static_cast<size_t>(q) + 1]; ++i) owner[i] = q;
  auto stepOf = [&](uint32_t gid) -> const plan::Step& {
    const int64_t q = owner[gid];
    return progOf(q).steps[gid - base[static_cast<size_t>(q)]];
  };

  // Matching: the k-th send from q to p pairs with p's k-th receive from q.
  std::map<std::pair<int64_t, int64_t>, std::vector<uint32_t>> sends, recvs;
  std::vector<uint32_t> match(total, UINT32_MAX), pending(total, 0);
  for (int64_t q = 0; q < ranks; ++q) {
    const plan::Program& p = progOf(q);
    bool after_send = false;
    for (uint32_t i = 0; i < p.size(); ++i) {
      const uint32_t gid = base[static_cast<size_t>(q)] + i;
      const plan::Step& s = p.steps[i];
      pending[gid] = static_cast<uint32_t>(p.depsOf(i).size());
      if (s.op == StepOp::Send) {
        sends[{q, peerOf(q, s.peer)}].push_back(gid);
        after_send = true;
      } else if (s.op == StepOp::Recv || s.op == StepOp::RecvReduce) {
        recvs[{peerOf(q, s.peer), q}].push_back(gid);
        if (after_send) ++pending[gid];  // the receive gate
      }
    }
  }
  for (auto& [pair, ss] : sends) {
    const auto& rs = recvs[pair];
    if (rs.size() != ss.size())
      return internalError("{} '{}': rank {} sends {} messages to rank {}, which receives {}",
                           plan::collectiveName(a.collective()), a.name(), pair.first % n, ss.size(), pair.second % n,
                           rs.size());
    for (size_t k = 0; k < ss.size(); ++k) match[ss[k]] = rs[k], match[rs[k]] = ss[k];
  }

  const std::vector<double> cap = flowCapacities();
  const size_t nl = cap.size();
  const double hbm = c_.gpu.hbm_bw.value() * c_.gpu.hbm_efficiency;
  const double eb = static_cast<double>(sh.elem_size);
  const double rendezvous = c_.network.rendezvous_bytes;

  std::vector<int64_t> routes;
  std::vector<Flow> flows;  // active
  // Per ordered pair: the next message to start and whether one is on the wire.
  struct Stream {
    size_t next = 0;
    bool busy = false;
  };
  std::map<std::pair<int64_t, int64_t>, Stream> streams;
  std::vector<char> posted(total, 0), arrived(total, 0), granted(total, 0);
  std::vector<double> cpu_free(static_cast<size_t>(ranks), 0.0);
  // Timed events: (time, kind, step).
  // At equal times: finishes, then deliveries, then grants, then newly ready steps.
  enum Kind : int { StepDone = 0, Deliver = 1, Grant = 2, Ready = 3 };
  using Event = std::tuple<double, int, uint32_t>;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  double now = 0, finish = 0;
  uint32_t done = 0;
  int64_t bottleneck = -1;  // of the current rates
  std::map<int64_t, double> limited;  // seconds each link was the bottleneck
  Seconds max_lat(0);

  auto crossNode = [&](uint32_t send) {
    const int64_t q = owner[send];
    return t_.nodeOf(gpuOf(q)) != t_.nodeOf(gpuOf(peerOf(q, stepOf(send).peer)));
  };
  auto bytesOf = [&](const plan::Step& s) {
    return eb * static_cast<double>(s.op == StepOp::Send ? s.src.count : s.dst.count);
  };
  // Runs local work on q's core from `at`; returns when it ends.
  auto onCpu = [&](int64_t q, double at, double seconds) {
    double& f = cpu_free[static_cast<size_t>(q)];
    f = std::max(f, at) + seconds;
    return f;
  };
  std::function<void(int64_t, int64_t)> tryStart;
  // A receive that is posted and whose message is here finishes after its
  // copy or reduction.
  auto tryFinishRecv = [&](uint32_t r) {
    if (!posted[r] || !arrived[r]) return;
    const plan::Step& s = stepOf(r);
    const double work = s.op == StepOp::RecvReduce ? 3 * bytesOf(s) / hbm : 0.0;
    events.push({work > 0 ? onCpu(owner[r], now, work) : now, StepDone, r});
  };
  auto post = [&](uint32_t gid) {
    posted[gid] = 1;
    const plan::Step& s = stepOf(gid);
    const int64_t q = owner[gid];
    if (s.op == StepOp::Send) {
      // The receive gate: receives after this send, up to the next send.
      const plan::Program& p = progOf(q);
      for (uint32_t i = gid - base[static_cast<size_t>(q)] + 1; i < p.size(); ++i) {
        const plan::Step& t = p.steps[i];
        if (t.op == StepOp::Send) break;
        if (t.op != StepOp::Recv && t.op != StepOp::RecvReduce) continue;
        const uint32_t r = base[static_cast<size_t>(q)] + i;
        if (--pending[r] == 0) events.push({now, Ready, r});
      }
      tryStart(q, peerOf(q, s.peer));
    } else {
      const uint32_t snd = match[gid];
      if (bytesOf(s) >= rendezvous && rendezvous > 0 && crossNode(snd) && !granted[snd]) {
        // The grant crosses back to the sender.
        Seconds lat = t_.route(gpuOf(q), gpuOf(owner[snd]), [](int64_t) {});
        events.push({now + lat.value(), Grant, snd});
      }
      tryFinishRecv(gid);
    }
  };
  // Posts, in program order per peer and direction, every ready step.
  std::map<std::pair<int64_t, int64_t>, size_t> send_posted, recv_posted;
  std::vector<char> ready(total, 0);
  auto postReady = [&](uint32_t gid) {
    const plan::Step& s = stepOf(gid);
    const int64_t q = owner[gid];
    if (s.op == StepOp::Copy || s.op == StepOp::Reduce) {
      const double work = (s.op == StepOp::Copy ? 2 : 3) * eb * static_cast<double>(s.dst.count) / hbm;
      events.push({onCpu(q, now, work), StepDone, gid});
      return;
    }
    const bool snd = s.op == StepOp::Send;
    const std::pair<int64_t, int64_t> key = snd ? std::pair{q, peerOf(q, s.peer)} : std::pair{peerOf(q, s.peer), q};
    auto& order = snd ? sends[key] : recvs[key];
    size_t& k = (snd ? send_posted : recv_posted)[key];
    while (k < order.size() && ready[order[k]]) post(order[k++]);
  };
  tryStart = [&](int64_t q, int64_t p) {
    Stream& st = streams[{q, p}];
    const auto& order = sends[{q, p}];
    if (st.busy || st.next >= order.size()) return;
    const uint32_t gid = order[st.next];
    if (!posted[gid]) return;
    const plan::Step& s = stepOf(gid);
    const double bytes = bytesOf(s);
    if (bytes >= rendezvous && rendezvous > 0 && crossNode(gid) && !granted[gid]) return;
    ++st.next;
    st.busy = true;
    Flow f{.step = gid, .left = bytes, .route_begin = static_cast<int64_t>(routes.size()), .route_end = 0};
    f.lat = flowRoute(gpuOf(q), gpuOf(p), routes);
    f.route_end = static_cast<int64_t>(routes.size());
    flows.push_back(f);
  };
  auto complete = [&](uint32_t gid) {
    ++done;
    finish = std::max(finish, now);
    const int64_t q = owner[gid];
    const plan::Program& p = progOf(q);
    for (uint32_t succ : p.succOf(gid - base[static_cast<size_t>(q)])) {
      const uint32_t sg = base[static_cast<size_t>(q)] + succ;
      if (--pending[sg] == 0) events.push({now, Ready, sg});
    }
  };

  for (uint32_t gid = 0; gid < total; ++gid)
    if (pending[gid] == 0) events.push({0.0, Ready, gid});
  // Max-min fair rates of the active flows (progressive filling).
  std::vector<double> residual(nl);
  std::vector<int64_t> count(nl, 0);
  std::vector<int64_t> touched;
  auto rates = [&]() {
    touched.clear();
    for (const Flow& f : flows)
      for (int64_t i = f.route_begin; i < f.route_end; ++i) {
        const size_t l = static_cast<size_t>(routes[static_cast<size_t>(i)]);
        if (count[l]++ == 0) touched.push_back(static_cast<int64_t>(l)), residual[l] = cap[l];
      }
    std::vector<char> frozen(flows.size(), 0);
    size_t left = flows.size();
    bool first = true;
    bottleneck = -1;
    while (left > 0) {
      double share = std::numeric_limits<double>::infinity();
      int64_t worst = -1;
      for (int64_t l : touched) {
        const size_t ul = static_cast<size_t>(l);
        if (count[ul] > 0 && residual[ul] / static_cast<double>(count[ul]) < share)
          share = residual[ul] / static_cast<double>(count[ul]), worst = l;
      }
      if (worst < 0) break;
      if (first) bottleneck = worst, first = false;
      for (size_t i = 0; i < flows.size(); ++i) {
        if (frozen[i]) continue;
        Flow& f = flows[i];
        bool on = false;
        for (int64_t k = f.route_begin; k < f.route_end && !on; ++k) on = routes[static_cast<size_t>(k)] == worst;
        if (!on) continue;
        frozen[i] = 1, --left;
        f.rate = share;
        for (int64_t k = f.route_begin; k < f.route_end; ++k) {
          const size_t m = static_cast<size_t>(routes[static_cast<size_t>(k)]);
          residual[m] = std::max(0.0, residual[m] - share);
          --count[m];
        }
      }
    }
    for (size_t i = 0; i < flows.size(); ++i)
      if (!frozen[i]) flows[i].rate = std::numeric_limits<double>::infinity();  // a route without links
    for (int64_t l : touched) count[static_cast<size_t>(l)] = 0;
  };

  bool dirty = true;
  while (done < total) {
    if (dirty) rates(), dirty = false;
    double next_flow = std::numeric_limits<double>::infinity();
    for (const Flow& f : flows) next_flow = std::min(next_flow, now + (f.rate > 0 ? f.left / f.rate : next_flow));
    const double next_event = events.empty() ? std::numeric_limits<double>::infinity() : std::get<0>(events.top());
    const double t = std::min(next_flow, next_event);
    if (!std::isfinite(t))
      return internalError("{} '{}' stalls in the program simulation after {} of {} steps (a plan that cannot finish)",
                           plan::collectiveName(a.collective()), a.name(), done, total);
    for (Flow& f : flows) f.left = std::isfinite(f.rate) ? f.left - f.rate * (t - now) : 0.0;
    if (!flows.empty() && bottleneck >= 0) limited[bottleneck] += t - now;
    now = t;
    if (next_flow <= next_event) {
      // Flows whose last byte has left: deliver after the route's latency.
      for (size_t i = 0; i < flows.size();) {
        Flow& f = flows[i];
        if (f.left > 1e-6 * std::max(1.0, bytesOf(stepOf(f.step))) && std::isfinite(f.rate)) {
          ++i;
          continue;
        }
        const uint32_t s = f.step;
        max_lat = std::max(max_lat, f.lat);
        events.push({now + f.lat.value(), Deliver, match[s]});
        events.push({now, StepDone, s});  // the send's buffer is free
        const int64_t q = owner[s];
        streams[{q, peerOf(q, stepOf(s).peer)}].busy = false;
        flows[i] = flows.back();
        flows.pop_back();
        dirty = true;
        tryStart(q, peerOf(q, stepOf(s).peer));
      }
      continue;
    }
    const auto [at, kind, gid] = events.top();
    events.pop();
    switch (kind) {
      case StepDone: complete(gid); break;
      case Deliver: arrived[gid] = 1, tryFinishRecv(gid); break;
      case Grant: {
        granted[gid] = 1;
        const int64_t q = owner[gid];
        const size_t before = flows.size();
        tryStart(q, peerOf(q, stepOf(gid).peer));
        dirty = dirty || flows.size() != before;
        break;
      }
      case Ready:
        ready[gid] = 1;
        {
          const size_t before = flows.size();
          postReady(gid);
          dirty = dirty || flows.size() != before;
        }
    }
  }
  CollectiveCost cost;
  cost.algo = std::string(a.name());
  cost.time = Seconds(finish);
  cost.latency = max_lat;
  int64_t worst = -1;
  for (const auto& [l, secs] : limited)
    if (worst < 0 || secs > limited[worst]) worst = l;
  if (worst >= 0) worst = topologyLinkOf(worst);
  cost.bottleneck = worst >= 0 && max_lat.value() * 2 < finish ? t_.linkName(worst) : "latency";
  return cost;
}

}  // namespace chorus::sim
