#include "sim/network.hpp"

#include <algorithm>
#include <limits>

namespace chorus::sim {

using plan::Collective;

double busBandwidthFactor(Collective coll, int64_t n) {
  const double f = n > 1 ? static_cast<double>(n - 1) / static_cast<double>(n) : 0;
  switch (coll) {
    case Collective::AllReduce: return 2 * f;
    case Collective::AllGather:
    case Collective::ReduceScatter:
    case Collective::AllToAll:
    case Collective::Gather:
    case Collective::Scatter: return f;
    default: return 1;
  }
}

NetworkModel::RoundCost NetworkModel::placeRound(const plan::Round& r, const GroupSet& g, uint64_t elem_bytes) {
  load_.assign(static_cast<size_t>(t_.links()), 0.0);
  Seconds lat(0);
  double max_recv = 0;
  const int n = static_cast<int>(g.size);
  std::vector<double> recv;  // bytes received per member of one group (reduction cost)
  if (r.reduce) recv.assign(static_cast<size_t>(n), 0.0);
  for (int64_t j = 0; j < g.groups; ++j) {
    plan::forEachMessage(r, n, [&](int s, int d, uint64_t e) {
      const double b = static_cast<double>(e * elem_bytes);
      lat = std::max(lat, t_.route(g.gpuOf(j, s), g.gpuOf(j, d), [&](int64_t l) { load_[static_cast<size_t>(l)] += b; }));
      if (j == 0 && r.reduce) recv[static_cast<size_t>(d)] += b;
    });
  }
  for (double b : recv) max_recv = std::max(max_recv, b);
  RoundCost rc;
  double worst = 0;
  for (int64_t l = 0; l < t_.links(); ++l) {
    const double x = load_[static_cast<size_t>(l)];
    if (x == 0) continue;
    const double tl = x / t_.capacity(l).value();
    if (tl > worst) worst = tl, rc.bottleneck = l;
  }
  const double reduce_t = 3 * max_recv / (c_.gpu.hbm_bw.value() * c_.gpu.hbm_efficiency);
  if (r.peers == plan::Peers::Chain) lat = lat * static_cast<double>(std::max(1, n - 1));
  rc.latency = lat;
  rc.time = lat + Seconds(std::max(worst, reduce_t));
  return rc;
}

Result<CollectiveCost> NetworkModel::price(const plan::Algorithm& a, const plan::Shape& sh, const GroupSet& g) {
  CHORUS_ASSIGN_OR_RETURN(std::vector<plan::Round> rounds, a.rounds(sh));
  CollectiveCost cost;
  cost.algo = std::string(a.name());
  // Rounds with equal patterns are placed once.
  using Key = std::tuple<plan::Peers, int64_t, int32_t, int32_t, uint64_t, bool, bool>;
  std::map<Key, RoundCost> seen;
  double slowest = -1;
  for (const plan::Round& r : rounds) {
    if (r.peers == plan::Peers::AllPairs && static_cast<double>(g.size) * g.size * g.groups > 2e8)
      return invalidArgument("{} '{}' on {} groups of {} ranks: an all-pairs round would place {:.3g} flows; "
                             "the analytical model enumerates flows and stops at 2e8 (use smaller groups)",
                             plan::collectiveName(a.collective()), a.name(), g.groups, g.size,
                             static_cast<double>(g.size) * g.size * g.groups);
    RoundCost rc;
    const Key k{r.peers, r.arg, r.root, r.fold, r.elems, r.subtree, r.reduce};
    if (auto it = seen.find(k); it != seen.end() && r.peers != plan::Peers::Explicit) {
      rc = it->second;
    } else {
      rc = placeRound(r, g, sh.elem_size);
      seen[k] = rc;
    }
    cost.time += rc.time * static_cast<double>(r.repeat);
    cost.latency += rc.latency * static_cast<double>(r.repeat);
    if (rc.time.value() * r.repeat > slowest) {
      slowest = rc.time.value() * r.repeat;
      cost.bottleneck = rc.bottleneck >= 0 && rc.latency * 2 < rc.time ? t_.linkName(rc.bottleneck) : "latency";
    }
  }
  return cost;
}

Result<CollectiveCost> NetworkModel::collective(Collective coll, Bytes bytes, const GroupSet& g, std::string_view algo) {
  if (g.size < 1 || g.groups < 1 || g.gpuOf(g.groups - 1, g.size - 1) >= t_.gpus())
    return invalidArgument("{} on {} groups of {} ranks (stride {}): needs GPU {} but the cluster has {} GPUs",
                           plan::collectiveName(coll), g.groups, g.size, g.stride,
                           g.gpuOf(g.groups - 1, g.size - 1), t_.gpus());
  plan::Shape sh;
  sh.coll = coll;
  sh.nranks = static_cast<int>(g.size);
  sh.elem_size = 1;
  const uint64_t b = static_cast<uint64_t>(bytes.value());
  switch (coll) {
    case Collective::AllGather:
    case Collective::Gather:
    case Collective::ReduceScatter:
    case Collective::Scatter:
    case Collective::AllToAll: sh.count = b / static_cast<uint64_t>(g.size); break;
    default: sh.count = b;
  }
  if (g.size == 1) return CollectiveCost{Seconds(0), "none", "none", Seconds(0)};
  std::vector<const plan::Algorithm*> cands;
  if (algo.empty() || algo == "auto") {
    cands = reg_.forCollective(coll);
  } else if (const plan::Algorithm* a = reg_.find(coll, algo)) {
    cands = {a};
  } else {
    std::string names;
    for (const plan::Algorithm* a : reg_.forCollective(coll)) names += fmt::format(" {}", a->name());
    return invalidArgument("no {} algorithm named '{}' (available:{})", plan::collectiveName(coll), algo, names);
  }
  Result<CollectiveCost> best = invalidArgument("no {} algorithm supports {} ranks", plan::collectiveName(coll), g.size);
  for (const plan::Algorithm* a : cands) {
    if (!a->supports(sh)) continue;
    Result<CollectiveCost> c = price(*a, sh, g);
    if (!c.isOk()) {
      if (cands.size() == 1) return c.status();
      continue;  // auto: an algorithm without a pattern at this scale is skipped
    }
    if (!best.isOk() || c->time < best->time) best = std::move(c);
  }
  return best;
}

Result<CollectiveCost> NetworkModel::sendRecv(Bytes bytes, const GroupSet& g) {
  // Every member sends to the next one in its group (a pipeline stage boundary);
  // one Shift round of the group set.
  plan::Round r{.peers = plan::Peers::Shift, .arg = 1, .elems = static_cast<uint64_t>(bytes.value())};
  if (g.size < 2) return CollectiveCost{Seconds(0), "p2p", "none", Seconds(0)};
  RoundCost rc = placeRound(r, g, 1);
  return CollectiveCost{rc.time, "p2p", rc.bottleneck >= 0 ? t_.linkName(rc.bottleneck) : "latency", rc.latency};
}

}  // namespace chorus::sim
