#include "sim/network.hpp"

#include <algorithm>
#include <bit>
#include <limits>
#include <cmath>
#include <queue>

#include "plan/plan_file.hpp"

namespace chorus::sim {

using plan::Collective;

double busBandwidthFactor(Collective coll, int64_t n) { return plan::busBwFactor(coll, n); }

Result<NetMode> parseNetMode(std::string_view text) {
  if (text == "analytical") return NetMode::Analytical;
  if (text == "flow") return NetMode::Flow;
  return invalidArgument("--network '{}' is not one of analytical, flow", text);
}

// The reference: every message of every group routed with its bytes, O(messages x hops)
// per round.  placeRound() gives the same figures from cached unit patterns.
NetworkModel::RoundCost NetworkModel::referenceRound(const plan::Round& r, const GroupSet& g, uint64_t elem_bytes) {
  // Only the links this round touches are reset and scanned: O(messages x hops).
  if (load_.size() != static_cast<size_t>(t_.links())) load_.assign(static_cast<size_t>(t_.links()), 0.0);
  for (int64_t l : touched_) load_[static_cast<size_t>(l)] = 0;
  touched_.clear();
  Seconds lat(0);
  double max_recv = 0;
  const int n = static_cast<int>(g.size);
  std::vector<double> recv;  // bytes received per member of one group (reduction cost)
  if (r.reduce) recv.assign(static_cast<size_t>(n), 0.0);
  for (int64_t j = 0; j < g.groups; ++j) {
    plan::forEachMessage(r, n, [&](int s, int d, uint64_t e) {
      const double b = static_cast<double>(e * elem_bytes);
      lat = std::max(lat, t_.route(g.gpuOf(j, s), g.gpuOf(j, d), [&](int64_t l) {
        double& x = load_[static_cast<size_t>(l)];
        if (x == 0) touched_.push_back(l);
        x += b;
      }, pxn_));
      if (j == 0 && r.reduce) recv[static_cast<size_t>(d)] += b;
    });
  }
  for (double b : recv) max_recv = std::max(max_recv, b);
  RoundCost rc;
  double worst = 0;
  for (int64_t l : touched_) {
    const double x = load_[static_cast<size_t>(l)];
    const double tl = x / t_.capacity(l).value();
    if (tl > worst || (tl == worst && l < rc.bottleneck)) worst = tl, rc.bottleneck = l;
  }
  const double reduce_t = 3 * max_recv / (c_.gpu.hbm_bw.value() * c_.gpu.hbm_efficiency);
  if (r.peers == plan::Peers::Chain) lat = lat * static_cast<double>(std::max(1, n - 1));
  rc.latency = lat;
  rc.time = lat + Seconds(std::max(worst, reduce_t));
  return rc;
}

NetworkModel::RoundCost NetworkModel::placeRound(const plan::Round& r, const GroupSet& g, uint64_t elem_bytes) {
  if (mode_ == NetMode::Flow) return flowRound(r, g, elem_bytes);
  if (reference_ || r.peers == plan::Peers::Explicit) return referenceRound(r, g, elem_bytes);
  // Every message of a patterned round carries elems x a multiplicity that
  // does not depend on elems (1, or the subtree size), so the link loads are
  // elems x elem_bytes x the loads of the same pattern with unit messages:
  // one placement serves every size, both directions of a halving/doubling
  // pair and every plan using the same pattern (recursive doubling and
  // Rabenseifner share their Xor masks).
  const PatternKey key{r.peers, r.arg, r.root, r.fold, r.subtree, g.size, g.stride, g.groups, g.offset, pxn_};
  auto it = patterns_.find(key);
  if (it == patterns_.end()) it = patterns_.emplace(key, unitPattern(r, g)).first;
  const Pattern& p = it->second;
  // The same arithmetic as referenceRound: loads are exact integers in double,
  // so scaling the unit load is exact.
  const double k = static_cast<double>(r.elems * elem_bytes);
  RoundCost rc;
  double worst = 0;
  if (k > 0 && p.link >= 0) {
    worst = p.load * k / t_.capacity(p.link).value();
    rc.bottleneck = p.link;
  }
  const double reduce_t = r.reduce ? 3 * (p.max_recv * k) / (c_.gpu.hbm_bw.value() * c_.gpu.hbm_efficiency) : 0.0;
  Seconds lat = p.lat;
  if (r.peers == plan::Peers::Chain) lat = lat * static_cast<double>(std::max<int64_t>(1, g.size - 1));
  rc.latency = lat;
  rc.time = lat + Seconds(std::max(worst, reduce_t));
  return rc;
}

NetworkModel::Pattern NetworkModel::unitPattern(const plan::Round& round, const GroupSet& g) {
  plan::Round r = round;
  r.elems = 1;
  r.msgs.clear();
  if (load_.size() != static_cast<size_t>(t_.links())) load_.assign(static_cast<size_t>(t_.links()), 0.0);
  for (int64_t l : touched_) load_[static_cast<size_t>(l)] = 0;
  touched_.clear();
  const int n = static_cast<int>(g.size);
  recv_.assign(static_cast<size_t>(n), 0.0);
  Pattern p;
  Seconds lat(0);
  auto add = [&](int64_t l, double w) {
    double& x = load_[static_cast<size_t>(l)];
    if (x == 0) touched_.push_back(l);
    x += w;
  };
  // Symmetry: an Xor round (no fold) of one whole, block-aligned group of
  // consecutive GPUs is invariant under v -> v ^ c, and for c a multiple of
  // the topology's symmetry block B that is a translation by whole blocks,
  // which maps every link to an equal one.  So every link, every receiver and
  // every route has an equal one attached to the group's first block: placing
  // the messages that start or end there (2B, not n) gives the same most
  // loaded link, the same lowest id among equals, the same largest receive
  // and the same latency.  O(B) instead of O(n) per pattern.
  const int64_t B = t_.symmetryBlock();
  if (r.peers == plan::Peers::Xor && r.fold == 0 && g.groups == 1 && g.stride == 1 && B > 0 && g.size > B &&
      std::has_single_bit(static_cast<uint64_t>(g.size)) && g.offset % B == 0 && !symmetry_off_) {
    const int64_t base = g.offset;
    for (int64_t v = 0; v < B; ++v) {
      const int64_t w = v ^ r.arg;
      if (w >= g.size) continue;
      lat = std::max(lat, t_.route(base + v, base + w, [&](int64_t l) { add(l, 1.0); }, pxn_));
      if (w < B) {
        recv_[static_cast<size_t>(w)] += 1;
      } else {
        t_.route(base + w, base + v, [&](int64_t l) { add(l, 1.0); }, pxn_);
        recv_[static_cast<size_t>(v)] += 1;
      }
    }
    double worst = 0;
    for (int64_t l : touched_) {
      const int64_t first = t_.firstGpuOf(l) - base;
      if (first < 0 || first >= B) continue;  // another block's link: only partly loaded here
      const double x = load_[static_cast<size_t>(l)];
      const double tl = x / t_.capacity(l).value();
      if (tl > worst || (tl == worst && l < p.link)) worst = tl, p.link = l, p.load = x;
    }
    for (double b : recv_) p.max_recv = std::max(p.max_recv, b);
    p.lat = lat;
    return p;
  }
  for (int64_t j = 0; j < g.groups; ++j) {
    const int64_t base = g.gpuOf(j, 0), stride = g.stride;
    if (j == 0) {
      plan::forEachMessage(r, n, [&](int s, int d, uint64_t e) {
        const double w = static_cast<double>(e);
        lat = std::max(lat, t_.route(base + s * stride, base + d * stride, [&](int64_t l) { add(l, w); }, pxn_));
        recv_[static_cast<size_t>(d)] += w;
      });
    } else {
      plan::forEachMessage(r, n, [&](int s, int d, uint64_t e) {
        const double w = static_cast<double>(e);
        lat = std::max(lat, t_.route(base + s * stride, base + d * stride, [&](int64_t l) { add(l, w); }, pxn_));
      });
    }
  }
  for (double b : recv_) p.max_recv = std::max(p.max_recv, b);
  // The most loaded link relative to its capacity; ties go to the lowest id,
  // as in referenceRound.
  double worst = 0;
  for (int64_t l : touched_) {
    const double x = load_[static_cast<size_t>(l)];
    const double tl = x / t_.capacity(l).value();
    if (tl > worst || (tl == worst && l < p.link)) worst = tl, p.link = l, p.load = x;
  }
  p.lat = lat;
  return p;
}

// A pipelined plan (plan.hpp, Algorithm::pipelineSlices): its first slice
// passes every round in sequence (the fill), and each further slice costs one
// steady-state step, in which every round works on some slice at once: the
// links carry all rounds' slice messages together, the receivers reduce all
// of theirs, and no step is shorter than one hop's latency.
NetworkModel::RoundCost NetworkModel::steadyState(const std::vector<plan::Round>& rs, const GroupSet& g,
                                                  uint64_t elem_bytes, Seconds hop) {
  const int n = static_cast<int>(g.size);
  plan::Round all{.peers = plan::Peers::Explicit};
  std::vector<double> recv(static_cast<size_t>(n), 0.0);
  for (const plan::Round& r : rs)
    for (uint64_t k = 0; k < r.repeat; ++k)
      plan::forEachMessage(r, n, [&](int s, int d, uint64_t e) {
        all.msgs.push_back({s, d, e});
        if (r.reduce) recv[static_cast<size_t>(d)] += static_cast<double>(e * elem_bytes);
      });
  RoundCost rc = mode_ == NetMode::Flow ? flowRound(all, g, elem_bytes) : referenceRound(all, g, elem_bytes);
  const double max_recv = *std::max_element(recv.begin(), recv.end());
  const double reduce_t = 3 * max_recv / (c_.gpu.hbm_bw.value() * c_.gpu.hbm_efficiency);
  rc.time = std::max(std::max(rc.time - rc.latency, Seconds(reduce_t)), hop);
  rc.latency = hop;
  return rc;
}

// The op's Scale or Divide pass (plan::Scaling) on the busiest rank: a
// read and a write of the region at the GPU's HBM rate, as program_flow.cpp
// prices those steps; it runs before the first or after the last round.
Seconds NetworkModel::scalingTime(const plan::Shape& sh) const {
  const double elems = static_cast<double>(std::max(plan::scalingElems(sh, 0), plan::scalingElems(sh, sh.root)));
  return Seconds(2 * elems * sh.elem_size / (c_.gpu.hbm_bw.value() * c_.gpu.hbm_efficiency));
}

Result<CollectiveCost> NetworkModel::price(const plan::Algorithm& a, const plan::Shape& sh, const GroupSet& g) {
  // A plan that carries its runtime's schedule (MSCCL's thread blocks and
  // channels, plan::PlanSpec::streams) runs as that runtime runs it, in either
  // mode: its concurrency is not a sequence of rounds (program_flow.cpp).
  if ((mode_ == NetMode::Flow || plan::hasSchedule(a)) && g.size * g.groups <= kMaxProgramRanks)
    return programFlow(a, sh, g);
  CHORUS_ASSIGN_OR_RETURN(std::vector<plan::Round> rounds, a.rounds(sh));
  CollectiveCost cost;
  cost.algo = std::string(a.name());
  cost.time = scalingTime(sh);
  if (const uint64_t S = a.pipelineSlices(sh); S > 1) {
    for (plan::Round& r : rounds) {
      r.elems = (r.elems + S - 1) / S;
      for (plan::RoundMessage& m : r.msgs) m.elems = (m.elems + S - 1) / S;
    }
    Seconds hop(0);  // the largest round latency: no steady step is shorter
    for (const plan::Round& r : rounds) {
      const RoundCost rc = placeRound(r, g, sh.elem_size);
      cost.time += rc.time * static_cast<double>(r.repeat);
      cost.latency += rc.latency * static_cast<double>(r.repeat);
      hop = std::max(hop, rc.latency);
    }
    const RoundCost steady = steadyState(rounds, g, sh.elem_size, hop);
    cost.time += steady.time * static_cast<double>(S - 1);
    cost.latency += steady.latency * static_cast<double>(S - 1);
    cost.bottleneck = steady.bottleneck >= 0 && steady.latency * 2 < steady.time ? t_.linkName(steady.bottleneck) : "latency";
    return cost;
  }
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

Result<CollectiveCost> NetworkModel::collective(Collective coll, Bytes bytes, const GroupSet& g, std::string_view algo,
                                                plan::Scaling scaling) {
  if (g.size < 1 || g.groups < 1 || g.gpuOf(g.groups - 1, g.size - 1) >= t_.gpus())
    return invalidArgument("{} on {} groups of {} ranks (stride {}): needs GPU {} but the cluster has {} GPUs",
                           plan::collectiveName(coll), g.groups, g.size, g.stride,
                           g.gpuOf(g.groups - 1, g.size - 1), t_.gpus());
  plan::Shape sh;
  sh.coll = coll;
  sh.nranks = static_cast<int>(g.size);
  sh.elem_size = 1;
  sh.scaling = plan::reduces(coll) ? scaling : plan::Scaling::None;
  // Pipelined plans are sliced as the library slices them (Tuner::defaultChunk:
  // 512 KiB within a node, 1 MiB across nodes) unless setChunkBytes chose.
  sh.chunk_elems = chunk_bytes_ != 0 ? chunk_bytes_
                   : t_.nodeOf(g.gpuOf(0, 0)) == t_.nodeOf(g.gpuOf(0, g.size - 1))
                       ? plan::kChunkBytesOneHost
                       : plan::kChunkBytesAcrossHosts;
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
  const CacheKey key{static_cast<int>(coll) | static_cast<int>(sh.scaling) << 8, bytes.value(), g.size, g.stride,
                     g.groups, g.offset, std::string(algo)};
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  // Which library prices the call (setLibrary): NCCL for the collectives it
  // has algorithms for, on switched (non-torus) clusters.
  const bool torus = c_.network.topology == TopologyKind::Torus2d || c_.network.topology == TopologyKind::Torus3d;
  const bool named = !algo.empty() && algo != "auto";
  const bool prefixed = algo.substr(0, 5) == "nccl:";
  bool nccl = false;
  if (prefixed) {
    if (torus || !ncclHasAlgorithms(coll))
      return invalidArgument("--algo '{}': the NCCL model covers allreduce, allgather, reducescatter, broadcast and "
                             "reduce on switched clusters, not {} on a {}", algo, plan::collectiveName(coll),
                             topologyName(c_.network.topology));
    nccl = true;
  } else if (library_ != Library::Chorus && !torus && ncclHasAlgorithms(coll)) {
    nccl = !named || (isNcclAlgoName(algo) && (library_ == Library::Nccl || reg_.find(coll, algo) == nullptr));
  }
  Result<CollectiveCost> best = invalidArgument("no {} algorithm supports {} ranks", plan::collectiveName(coll), g.size);
  if (nccl) {
    CHORUS_ASSIGN_OR_RETURN(NcclCost nc, ncclPick(ncclShape(coll, bytes, g), algo));
    best = CollectiveCost{Seconds(nc.time_s), "nccl:" + nc.name(), nc.bottleneck, Seconds(nc.latency_s)};
    if (library_ == Library::Auto && !named) {
      Result<CollectiveCost> ch = chorusCollective(coll, sh, g, algo);
      if (ch.isOk() && ch->time < best->time) best = std::move(ch);
    }
  } else if (library_ == Library::Nccl && !named && !torus && coll == Collective::AllToAll) {
    // NCCL's all-to-all is grouped point-to-point, one send and one receive
    // per peer: chorus's pairwise exchange moves the same bytes per link with
    // a latency per peer (Bruck's fewer, fuller rounds are not what NCCL runs),
    // routed through PXN relays when NCCL would use them.
    pxn_ = pxnOn();
    best = chorusCollective(coll, sh, g, "pairwise");
    pxn_ = false;
  } else {
    best = chorusCollective(coll, sh, g, algo);
  }
  if (best.isOk()) cache_[key] = *best;
  return best;
}

Result<CollectiveCost> NetworkModel::chorusCollective(Collective coll, const plan::Shape& sh, const GroupSet& g,
                                                      std::string_view algo) {
  std::vector<const plan::Algorithm*> cands;
  if (algo.empty() || algo == "auto") {
    cands = reg_.forCollective(coll);
  } else if (const plan::Algorithm* a = reg_.find(coll, algo)) {
    cands = {a};
  } else {
    std::string names;
    for (const plan::Algorithm* a : reg_.forCollective(coll)) names += fmt::format(" {}", a->name());
    return invalidArgument("no {} algorithm named '{}' (available:{}{})", plan::collectiveName(coll), algo, names,
                           ncclHasAlgorithms(coll) ? "; NCCL's with --library nccl or nccl:NAME" : "");
  }
  Result<CollectiveCost> best = invalidArgument("no {} algorithm supports {} ranks", plan::collectiveName(coll), g.size);
  for (const plan::Algorithm* a : cands) {
    // A plan that claims only the other form of the call (in place or out of
    // place: MSCCL's files often claim one) moves the same bytes between the
    // same ranks in it, so it is priced in that form.
    plan::Shape other = sh;
    other.inplace = !sh.inplace;
    const plan::Shape& use = !a->supports(sh) && a->supports(other) ? other : sh;
    if (!a->supports(use)) {
      // A named plan that does not take the call says what it needs.
      if (cands.size() == 1 && !a->requirement().empty())
        return invalidArgument("{} '{}' does not take {} ranks and a count of {} (bytes): it needs {}",
                               plan::collectiveName(coll), a->name(), g.size, sh.count, a->requirement());
      continue;
    }
    Result<CollectiveCost> c = price(*a, use, g);
    if (!c.isOk()) {
      if (cands.size() == 1) return c.status();
      continue;  // auto: an algorithm without a pattern at this scale is skipped
    }
    if (!best.isOk() || c->time < best->time) best = std::move(c);
  }
  return best;
}

NcclShape NetworkModel::ncclShape(Collective coll, Bytes bytes, const GroupSet& g) const {
  NcclShape s;
  s.coll = coll;
  s.bytes = bytes.value();
  s.n = g.size;
  s.arch = gpuArch(c_.gpu);
  // Group 0's ranks per node and nodes (rank ids rise with the rank, so a
  // node's ranks are consecutive).
  int64_t prev = -1, run = 0;
  s.nodes = 0;
  for (int64_t r = 0; r < g.size; ++r) {
    const int64_t node = t_.nodeOf(g.gpuOf(0, r));
    if (node != prev) ++s.nodes, prev = node, run = 0;
    s.ppn = std::max(s.ppn, ++run);
  }
  // GPUs of its first node that take part in the call (any group): they
  // share the node's NICs and NVSwitch reduction evenly.
  const int64_t gpn = c_.node.gpus, first = t_.nodeOf(g.gpuOf(0, 0)), span = g.stride * g.size;
  int64_t active = 0;
  for (int64_t id = first * gpn; id < (first + 1) * gpn; ++id) {
    const int64_t rel = id - g.offset;
    if (rel < 0) continue;
    const int64_t j = rel / span * g.stride + rel % span % g.stride;
    if (j < g.groups) ++active;
  }
  active = std::max(active, s.ppn);
  const double share = static_cast<double>(s.ppn) / static_cast<double>(active);
  s.nvl_bw = c_.node.nvlink_bw.value() * c_.node.nvlink_efficiency;
  if (c_.node.mesh && s.ppn > 1) {
    // A mesh node: a rank reaches the group's other ranks on its node over
    // one set of links each, so whatever NCCL/RCCL spreads its channels over
    // it has at most (ppn - 1) pairs' links (docs/simulator.md, "Mesh nodes").
    // A partial mesh: each GPU's (ppn - 1) widest routes (a pair without
    // links counts at its two-hop route's narrower link), the least GPU's.
    const double links = c_.node.pair_links.empty()
                             ? c_.node.peerBw().value() * c_.node.nvlink_efficiency * static_cast<double>(s.ppn - 1)
                             : t_.meshRate(s.ppn - 1);
    s.nvl_bw = std::min(s.nvl_bw, links);
    s.intra_tier = "mesh links (gpu->its peers)";
  }
  s.net_bw = c_.network.nic_bw.value() * c_.network.efficiency * c_.network.nics_per_node * share;
  // The leaf tier (dragonfly: groups): priced by the edges that cross it
  // (leafCrossings), not by dividing the NICs.
  leafCrossings(g, &s);
  const GpuArch a = s.arch;
  s.nvls = c_.node.nvls == 1 || (c_.node.nvls == -1 && gpn > 1 && (a == GpuArch::Hopper || a == GpuArch::Blackwell));
  // NVSwitch reduction throughput per node (fp32 adds/s): Hopper nodes have
  // one third-generation NVSwitch per two GPUs at 400 GFLOPS each, Blackwell
  // one NVLink switch chip per four GPUs at 3.6 TFLOPS each (docs).
  double red = c_.node.nvls_reduce_tflops * 1e12;
  if (red == 0) red = a == GpuArch::Hopper      ? 0.4e12 * static_cast<double>(gpn) / 2
                      : a == GpuArch::Blackwell ? 3.6e12 * static_cast<double>(gpn) / 4
                                                : 0.0;
  s.nvls_reduce = red * share;
  s.sharp = c_.network.sharp;
  return s;
}

namespace {

// Parent of node-rank r in NCCL's binary tree over m ranks (src/graph/trees.cc,
// ncclGetBtree): r's lowest set bit b; parent (r ^ b) | 2b, or r ^ b when that
// is out of range.  -1 for the root 0.
int64_t btreeParent(int64_t m, int64_t r) {
  if (r == 0) return -1;
  int64_t bit = 1;
  while (bit < m && !(bit & r)) bit <<= 1;
  int64_t up = (r ^ bit) | (bit << 1);
  if (up >= m) up = r ^ bit;
  return up;
}

// Parent in the second tree of NCCL's double binary tree (ncclGetDtree): the
// first tree mirrored (m even) or shifted by one (m odd).
int64_t dtreeParent(int64_t m, int64_t r) {
  if (m % 2 == 1) {
    const int64_t u = btreeParent(m, (r - 1 + m) % m);
    return u < 0 ? -1 : (u + 1) % m;
  }
  const int64_t u = btreeParent(m, m - 1 - r);
  return u < 0 ? -1 : m - 1 - u;
}

}  // namespace

void NetworkModel::leafCrossings(const GroupSet& g, NcclShape* s) const {
  const bool dragonfly = c_.network.topology == TopologyKind::Dragonfly;
  const int64_t per_leaf = dragonfly ? c_.network.group_nodes : c_.network.leaf_nodes;
  s->up_tier = dragonfly ? "group uplinks (group->global)" : "leaf uplinks (leaf->spine)";
  // With 1:1 uplinks no leaf can carry more than its nodes' NICs, which the
  // NIC term already prices; nothing crosses when the call stays in one leaf.
  const int64_t lo = t_.nodeOf(g.gpuOf(0, 0)) / per_leaf, hi = t_.nodeOf(g.gpuOf(g.groups - 1, g.size - 1)) / per_leaf;
  if (c_.network.oversubscription <= 1 || s->nodes < 2 || lo == hi) return;
  s->leaf_up_bw = c_.network.nic_bw.value() * c_.network.efficiency * c_.network.nics_per_node *
                  static_cast<double>(per_leaf) / c_.network.oversubscription;
  const size_t leaves = static_cast<size_t>(t_.nodeOf(t_.gpus() - 1) / per_leaf + 1);
  std::vector<double> ring(leaves, 0), tree(leaves, 0), coll(leaves, 0), direct(leaves, 0);
  std::vector<int64_t> seq, k(leaves, 0);  // a group's nodes in rank order; its ranks per leaf
  std::vector<size_t> touched;
  const double n = static_cast<double>(g.size);
  for (int64_t j = 0; j < g.groups; ++j) {
    seq.clear();
    for (int64_t r = 0; r < g.size; ++r) {
      const int64_t node = t_.nodeOf(g.gpuOf(j, r));
      if (seq.empty() || seq.back() != node) seq.push_back(node);
      const size_t L = static_cast<size_t>(node / per_leaf);
      if (k[L]++ == 0) touched.push_back(L);
    }
    const int64_t m = static_cast<int64_t>(seq.size());
    auto leafOf = [&](int64_t i) { return static_cast<size_t>(seq[static_cast<size_t>(i)] / per_leaf); };
    if (m > 1) {
      for (int64_t i = 0; i < m; ++i)  // ring edges i -> i + 1, and the wrap
        if (leafOf(i) != leafOf((i + 1) % m)) ring[leafOf(i)] += 1;
      for (int64_t i = 1; i < m; ++i)  // every node but the root has one parent per tree
        if (leafOf(i) != leafOf(btreeParent(m, i))) tree[leafOf(i)] += 1, tree[leafOf(btreeParent(m, i))] += 1;
      for (int64_t i = 0; i < m; ++i)
        if (const int64_t p = dtreeParent(m, i); p >= 0 && leafOf(i) != leafOf(p)) tree[leafOf(i)] += 1, tree[leafOf(p)] += 1;
    }
    const bool spans = touched.size() > 1;
    for (size_t L : touched) {
      if (spans) coll[L] += 1;
      direct[L] += static_cast<double>(k[L]) * (n - static_cast<double>(k[L])) / n;
      k[L] = 0;
    }
    touched.clear();
  }
  s->ring_cross = *std::max_element(ring.begin(), ring.end());
  s->tree_cross = *std::max_element(tree.begin(), tree.end());
  s->collnet_cross = *std::max_element(coll.begin(), coll.end());
  s->direct_cross = *std::max_element(direct.begin(), direct.end());
}

// NCCL (2.12 on) relays a point-to-point message to another node through the
// local GPU on the destination's rail when the node's GPUs share NVLink:
// NCCL_PXN_DISABLE defaults to 0 and NCCL_P2P_PXN_LEVEL to 2 ("use PXN as
// much as possible to maximize aggregation"); network.pxn forces it either
// way.  Chorus's own transport does not relay.
bool NetworkModel::pxnOn() const {
  if (library_ == Library::Chorus || c_.network.pxn == 0) return false;
  const bool torus = c_.network.topology == TopologyKind::Torus2d || c_.network.topology == TopologyKind::Torus3d;
  if (torus || c_.node.gpus < 2 || std::min(c_.network.nics_per_node, c_.node.gpus) < 2) return false;
  return c_.network.pxn == 1 || c_.node.nvlink_bw.value() > 0;
}

Result<CollectiveCost> NetworkModel::sendRecv(Bytes bytes, const GroupSet& g) {
  // Every member sends to the next one in its group (a pipeline stage boundary);
  // one Shift round of the group set.
  plan::Round r{.peers = plan::Peers::Shift, .arg = 1, .elems = static_cast<uint64_t>(bytes.value())};
  if (g.size < 2) return CollectiveCost{Seconds(0), "p2p", "none", Seconds(0)};
  pxn_ = pxnOn();
  RoundCost rc = placeRound(r, g, 1);
  pxn_ = false;
  return CollectiveCost{rc.time, "p2p", rc.bottleneck >= 0 ? t_.linkName(rc.bottleneck) : "latency", rc.latency};
}

namespace {

// Flows of one round, their routes (CSR) and the max-min fair rates.
struct FlowSet {
  std::vector<double> bytes, left, rate;
  std::vector<int64_t> route_begin{0};
  std::vector<int64_t> route;  // link ids (aggregated links expanded to lanes)
};

// Progressive filling: repeatedly saturate the link with the smallest fair
// share among the active, unfrozen flows.  Shares only grow as flows freeze
// (a frozen flow took at most the share), so a lazy min-heap suffices:
// O(flows x hops x log links) per call.  Returns the first bottleneck link.
int64_t maxMinRates(FlowSet& fs, const std::vector<char>& active, const std::vector<double>& cap,
                    const std::vector<int64_t>& link_begin, const std::vector<int64_t>& link_flows,
                    std::vector<double>& residual, std::vector<int64_t>& count) {
  const size_t nl = cap.size(), nf = fs.bytes.size();
  residual = cap;
  count.assign(nl, 0);
  std::vector<char> frozen(nf, 0);
  for (size_t f = 0; f < nf; ++f) {
    fs.rate[f] = 0;
    if (!active[f]) continue;
    for (int64_t i = fs.route_begin[f]; i < fs.route_begin[f + 1]; ++i) ++count[static_cast<size_t>(fs.route[static_cast<size_t>(i)])];
  }
  using Item = std::pair<double, int64_t>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> heap;
  for (size_t l = 0; l < nl; ++l)
    if (count[l] > 0) heap.push({residual[l] / static_cast<double>(count[l]), static_cast<int64_t>(l)});
  int64_t first = -1;
  while (!heap.empty()) {
    auto [share, l] = heap.top();
    heap.pop();
    const size_t ul = static_cast<size_t>(l);
    if (count[ul] == 0) continue;
    const double cur = residual[ul] / static_cast<double>(count[ul]);
    if (cur > share * (1 + 1e-12)) {
      heap.push({cur, l});
      continue;
    }
    if (first < 0) first = l;
    for (int64_t i = link_begin[ul]; i < link_begin[ul + 1]; ++i) {
      const size_t f = static_cast<size_t>(link_flows[static_cast<size_t>(i)]);
      if (!active[f] || frozen[f]) continue;
      frozen[f] = 1;
      fs.rate[f] = cur;
      for (int64_t k = fs.route_begin[f]; k < fs.route_begin[f + 1]; ++k) {
        const size_t m = static_cast<size_t>(fs.route[static_cast<size_t>(k)]);
        residual[m] = std::max(0.0, residual[m] - cur);
        --count[m];
      }
    }
  }
  return first;
}

}  // namespace

std::vector<double> NetworkModel::flowCapacities() const {
  const int64_t base = t_.links(), lanes = t_.lanes(), agg0 = t_.firstAggregated();
  std::vector<double> cap(static_cast<size_t>(base + (base - agg0) * lanes));
  for (int64_t l = 0; l < base; ++l) cap[static_cast<size_t>(l)] = t_.capacity(l).value();
  for (size_t l = static_cast<size_t>(base); l < cap.size(); ++l) cap[l] = t_.laneCapacity().value();
  return cap;
}

Seconds NetworkModel::flowRoute(int64_t src, int64_t dst, std::vector<int64_t>& route) const {
  const int64_t base = t_.links(), lanes = t_.lanes(), agg0 = t_.firstAggregated();
  // ECMP: a deterministic hash of the endpoints picks the lane.
  const uint64_t hsh = (static_cast<uint64_t>(src) * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(dst) * 0xC2B2AE3D27D4EB4Full);
  const int64_t lane = static_cast<int64_t>((hsh >> 17) % static_cast<uint64_t>(lanes));
  return t_.route(src, dst, [&](int64_t l) { route.push_back(t_.isAggregated(l) ? base + (l - agg0) * lanes + lane : l); },
                  pxn_);
}

int64_t NetworkModel::topologyLinkOf(int64_t flow_link) const {
  const int64_t base = t_.links();
  return flow_link >= base ? t_.firstAggregated() + (flow_link - base) / t_.lanes() : flow_link;
}

NetworkModel::RoundCost NetworkModel::flowRound(const plan::Round& r, const GroupSet& g, uint64_t elem_bytes) {
  FlowSet fs;
  Seconds lat(0);
  double max_recv = 0;
  const int n = static_cast<int>(g.size);
  std::vector<double> recv;
  if (r.reduce) recv.assign(static_cast<size_t>(n), 0.0);
  for (int64_t j = 0; j < g.groups; ++j) {
    plan::forEachMessage(r, n, [&](int s, int d, uint64_t e) {
      const double b = static_cast<double>(e * elem_bytes);
      lat = std::max(lat, flowRoute(g.gpuOf(j, s), g.gpuOf(j, d), fs.route));
      fs.route_begin.push_back(static_cast<int64_t>(fs.route.size()));
      fs.bytes.push_back(b);
      if (j == 0 && r.reduce) recv[static_cast<size_t>(d)] += b;
    });
  }
  for (double b : recv) max_recv = std::max(max_recv, b);
  const size_t nf = fs.bytes.size();
  const std::vector<double> cap = flowCapacities();
  const size_t nl = cap.size();
  // Link -> flows (CSR).
  std::vector<int64_t> link_begin(nl + 1, 0), link_flows(fs.route.size());
  for (int64_t l : fs.route) ++link_begin[static_cast<size_t>(l) + 1];
  for (size_t l = 0; l < nl; ++l) link_begin[l + 1] += link_begin[l];
  {
    std::vector<int64_t> fill(link_begin.begin(), link_begin.end() - 1);
    for (size_t f = 0; f < nf; ++f)
      for (int64_t i = fs.route_begin[f]; i < fs.route_begin[f + 1]; ++i)
        link_flows[static_cast<size_t>(fill[static_cast<size_t>(fs.route[static_cast<size_t>(i)])]++)] = static_cast<int64_t>(f);
  }
  fs.left = fs.bytes;
  fs.rate.assign(nf, 0);
  std::vector<char> active(nf, 1);
  for (size_t f = 0; f < nf; ++f)
    if (fs.bytes[f] <= 0 || fs.route_begin[f] == fs.route_begin[f + 1]) active[f] = 0;
  std::vector<double> residual;
  std::vector<int64_t> count;
  double now = 0;
  int64_t bottleneck = -1;
  size_t live = static_cast<size_t>(std::count(active.begin(), active.end(), 1));
  while (live > 0) {
    const int64_t b = maxMinRates(fs, active, cap, link_begin, link_flows, residual, count);
    if (bottleneck < 0) bottleneck = b;
    double dt = std::numeric_limits<double>::infinity();
    for (size_t f = 0; f < nf; ++f)
      if (active[f] && fs.rate[f] > 0) dt = std::min(dt, fs.left[f] / fs.rate[f]);
    if (!std::isfinite(dt)) break;  // no capacity: cannot happen with positive capacities
    now += dt;
    for (size_t f = 0; f < nf; ++f) {
      if (!active[f]) continue;
      fs.left[f] -= fs.rate[f] * dt;
      if (fs.left[f] <= fs.bytes[f] * 1e-9) active[f] = 0, --live;
    }
  }
  RoundCost rc;
  rc.bottleneck = bottleneck >= 0 ? topologyLinkOf(bottleneck) : -1;  // report the leaf, not the lane
  const double reduce_t = 3 * max_recv / (c_.gpu.hbm_bw.value() * c_.gpu.hbm_efficiency);
  if (r.peers == plan::Peers::Chain) lat = lat * static_cast<double>(std::max(1, n - 1));
  rc.latency = lat;
  rc.time = lat + Seconds(std::max(now, reduce_t));
  return rc;
}

}  // namespace chorus::sim
