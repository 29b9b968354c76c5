#include "sim/topology.hpp"

#include <algorithm>
#include <bit>
#include <functional>
#include <limits>

namespace chorus::sim {

Result<Topology> Topology::build(const ClusterSpec& c) {
  Topology t(c);
  t.gpn_ = c.node.gpus;
  t.gpus_ = c.gpus();
  t.ports_ = std::min(c.network.nics_per_node, c.node.gpus);
  t.nvl_cap_ = c.node.nvlink_bw * c.node.nvlink_efficiency;
  // A mesh node: each ordered pair of its GPUs has its own links, and a
  // GPU's port carries at most the sum of its links to the node's others.
  t.mesh_on_ = c.node.mesh && t.gpn_ > 1;
  if (t.mesh_on_) {
    if (c.node.peerBw().value() <= 0) return invalidArgument("cluster '{}': a mesh node needs a per-pair rate", c.name);
    t.mesh_cap_ = c.node.peerBw() * c.node.nvlink_efficiency;
    if (c.node.pair_links.empty()) {
      t.nvl_cap_ = std::min(t.nvl_cap_, t.mesh_cap_ * static_cast<double>(t.gpn_ - 1));
    } else {
      CHORUS_RETURN_IF_ERROR(t.buildPartialMesh());
    }
  }
  // Several NICs behind one GPU pool their bandwidth into its port.
  t.port_cap_ = c.network.nic_bw * (c.network.efficiency * c.network.nics_per_node / t.ports_);
  int64_t next = 0;
  t.nvl_tx_ = next, next += t.gpus_;
  t.nvl_rx_ = next, next += t.gpus_;
  t.mesh_ = next;
  if (t.mesh_on_) {
    if (t.gpn_ > 4096 || t.gpus_ * (t.gpn_ - 1) > (int64_t{1} << 40))
      return invalidArgument("cluster '{}': a mesh of {} GPUs per node is too large to route", c.name, t.gpn_);
    next += t.gpus_ * (t.gpn_ - 1);
  }
  switch (c.network.topology) {
    case TopologyKind::Torus2d:
    case TopologyKind::Torus3d:
      t.ndims_ = c.network.topology == TopologyKind::Torus2d ? 2 : 3;
      t.torus_ = next, next += int64_t{c.nodes} * t.ndims_ * 2;
      t.torus_cap_ = c.network.nic_bw * c.network.efficiency;
      t.port_tx_ = t.port_rx_ = t.up_ = t.down_ = next;
      break;
    default: {
      const int64_t nports = int64_t{c.nodes} * t.ports_;
      t.port_tx_ = next, next += nports;
      t.port_rx_ = next, next += nports;
      int64_t uppers = 0, ports_per_upper = 0;
      if (c.network.topology == TopologyKind::Dragonfly) {
        uppers = c.nodes / c.network.group_nodes;
        ports_per_upper = int64_t{c.network.group_nodes} * t.ports_;
      } else if (c.network.topology == TopologyKind::RailOptimized) {
        uppers = (c.nodes + c.network.leaf_nodes - 1) / c.network.leaf_nodes * t.ports_;
        ports_per_upper = c.network.leaf_nodes;
      } else {
        uppers = (c.nodes + c.network.leaf_nodes - 1) / c.network.leaf_nodes;
        ports_per_upper = int64_t{c.network.leaf_nodes} * t.ports_;
      }
      t.up_ = next, next += uppers;
      t.down_ = next, next += uppers;
      t.up_cap_ = t.port_cap_ * (static_cast<double>(ports_per_upper) / c.network.oversubscription);
      // One spine cable per NIC-port's worth of uplink bandwidth.
      t.lanes_ = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(ports_per_upper) / c.network.oversubscription));
      t.torus_ = next;
    }
  }
  t.end_ = next;
  if (t.gpus_ > std::numeric_limits<int32_t>::max())
    return invalidArgument("cluster '{}': {} GPUs (at most 2^31 - 1)", c.name, t.gpus_);
  t.node_.resize(static_cast<size_t>(t.gpus_));
  for (int64_t g = 0; g < t.gpus_; ++g) t.node_[static_cast<size_t>(g)] = static_cast<int32_t>(g / t.gpn_);
  if (t.ndims_ == 0) {
    t.port_.resize(static_cast<size_t>(t.gpus_));
    for (int64_t g = 0; g < t.gpus_; ++g)
      t.port_[static_cast<size_t>(g)] = static_cast<int32_t>((g / t.gpn_) * t.ports_ + (g % t.gpn_) * t.ports_ / t.gpn_);
    t.upper_.resize(static_cast<size_t>(int64_t{c.nodes} * t.ports_));
    for (int64_t p = 0; p < static_cast<int64_t>(t.upper_.size()); ++p)
      t.upper_[static_cast<size_t>(p)] = static_cast<int32_t>(t.upperOf(p / t.ports_, p % t.ports_));
    const int64_t block = int64_t{t.gpn_} *
                          (c.network.topology == TopologyKind::Dragonfly ? c.network.group_nodes : c.network.leaf_nodes);
    if (std::has_single_bit(static_cast<uint64_t>(block))) t.sym_block_ = block;
  }
  return t;
}

Status Topology::buildPartialMesh() {
  const NodeSpec& nd = c_.node;
  const int64_t dom = nd.domainSize(), n = gpn_;
  if (dom > NodeSpec::kMaxPartialMeshGpus)
    return invalidArgument("cluster '{}': a partial mesh of {} GPUs (at most {})", c_.name, dom, NodeSpec::kMaxPartialMeshGpus);
  if (static_cast<int64_t>(nd.pair_links.size()) != dom * dom)
    return invalidArgument("cluster '{}': node.pair_links has {} entries, not {} (the domain's GPUs squared)", c_.name,
                           nd.pair_links.size(), dom * dom);
  // The job's GPUs are the domain's first `n` (placedCluster); routes stay
  // among them.
  const auto un = static_cast<size_t>(n);
  pair_cap_.assign(un * un, 0.0);
  tx_cap_.assign(un, 0.0);
  rx_cap_.assign(un, 0.0);
  for (int64_t a = 0; a < n; ++a)
    for (int64_t b = 0; b < n; ++b) {
      if (a == b) continue;
      const double cap = nd.pairLinks(a, b) * mesh_cap_.value();
      pair_cap_[static_cast<size_t>(a * n + b)] = cap;
      tx_cap_[static_cast<size_t>(a)] += cap;
      rx_cap_[static_cast<size_t>(b)] += cap;
    }
  for (size_t a = 0; a < un; ++a) {
    tx_cap_[a] = std::min(tx_cap_[a], nvl_cap_.value());
    rx_cap_[a] = std::min(rx_cap_[a], nvl_cap_.value());
  }
  // A pair without links: through the GPU m linked to both whose narrower
  // link is widest, ties to the lowest m (NCCL's path search likewise keeps
  // the fewest hops, then the widest path, a path's width being its
  // narrowest link: docs/simulator.md, "Mesh nodes").
  via_.assign(un * un, -1);
  for (int64_t a = 0; a < n; ++a)
    for (int64_t b = 0; b < n; ++b) {
      if (a == b || pair_cap_[static_cast<size_t>(a * n + b)] > 0) continue;
      double best = 0;
      for (int64_t m = 0; m < n; ++m) {
        if (m == a || m == b) continue;
        const double w = std::min(pair_cap_[static_cast<size_t>(a * n + m)], pair_cap_[static_cast<size_t>(m * n + b)]);
        if (w > best) best = w, via_[static_cast<size_t>(a * n + b)] = static_cast<int32_t>(m);
      }
      if (best <= 0)
        return invalidArgument("cluster '{}': GPUs {} and {} of a mesh node have no link and no GPU of the job's {} "
                               "per node linked to both (routes take at most one intermediate GPU)",
                               c_.name, a, b, n);
    }
  return {};
}

double Topology::meshRate(int64_t peers) const {
  if (!mesh_on_ || peers < 1) return nvl_cap_.value();
  if (pair_cap_.empty()) return std::min(nvl_cap_.value(), mesh_cap_.value() * static_cast<double>(peers));
  const int64_t n = gpn_;
  double least = -1;
  std::vector<double> r;
  for (int64_t a = 0; a < n; ++a) {
    r.clear();
    for (int64_t b = 0; b < n; ++b) {
      if (b == a) continue;
      const int64_t m = meshVia(a, b);
      r.push_back(m < 0 ? pair_cap_[static_cast<size_t>(a * n + b)]
                        : std::min(pair_cap_[static_cast<size_t>(a * n + m)], pair_cap_[static_cast<size_t>(m * n + b)]));
    }
    std::sort(r.begin(), r.end(), std::greater<>());
    double sum = 0;
    for (size_t i = 0; i < r.size() && static_cast<int64_t>(i) < peers; ++i) sum += r[i];
    sum = std::min({sum, tx_cap_[static_cast<size_t>(a)], rx_cap_[static_cast<size_t>(a)]});
    least = least < 0 ? sum : std::min(least, sum);
  }
  return least;
}

BytesPerSecond Topology::capacity(int64_t l) const {
  if (l < nvl_rx_) return tx_cap_.empty() ? nvl_cap_ : BytesPerSecond(tx_cap_[static_cast<size_t>((l - nvl_tx_) % gpn_)]);
  if (l < nvl_rx_ + gpus_)
    return rx_cap_.empty() ? nvl_cap_ : BytesPerSecond(rx_cap_[static_cast<size_t>((l - nvl_rx_) % gpn_)]);
  if (l < mesh_ + (mesh_on_ ? gpus_ * (gpn_ - 1) : 0)) {
    if (pair_cap_.empty()) return mesh_cap_;
    const int64_t k = l - mesh_, la = (k / (gpn_ - 1)) % gpn_, j = k % (gpn_ - 1);
    return BytesPerSecond(pair_cap_[static_cast<size_t>(la * gpn_ + (j < la ? j : j + 1))]);
  }
  if (ndims_ > 0) return torus_cap_;
  if (l < up_) return port_cap_;
  return up_cap_;
}

std::string Topology::linkName(int64_t l) const {
  // Each name carries its tier and direction (issue 42): the scale-up port,
  // the NIC (node <-> leaf; dragonfly: node <-> group router), the leaf's or
  // group's links to the tier above.
  const bool df = c_.network.topology == TopologyKind::Dragonfly;
  const char* upper = df ? "group" : "leaf";
  if (mesh_on_) {  // no switch: a GPU's port is the sum of its mesh links
    if (l < nvl_rx_) return fmt::format("scale-up tx of gpu {} (all its mesh links)", l - nvl_tx_);
    if (l < mesh_) return fmt::format("scale-up rx of gpu {} (all its mesh links)", l - nvl_rx_);
    if (l < mesh_ + gpus_ * (gpn_ - 1)) {
      const int64_t k = l - mesh_, a = k / (gpn_ - 1), j = k % (gpn_ - 1), la = a % gpn_;
      return fmt::format("mesh link gpu {} -> gpu {}", a, a - la + (j < la ? j : j + 1));
    }
  }
  if (l < nvl_rx_) return fmt::format("nvlink tx of gpu {} (gpu->nvswitch)", l - nvl_tx_);
  if (l < nvl_rx_ + gpus_) return fmt::format("nvlink rx of gpu {} (nvswitch->gpu)", l - nvl_rx_);
  if (ndims_ > 0) {
    const int64_t k = l - torus_;
    return fmt::format("torus link of node {} dim {} dir {}", k / (ndims_ * 2), (k / 2) % ndims_, k % 2 ? '-' : '+');
  }
  if (l < port_rx_)
    return fmt::format("nic tx of node {} port {} (node->{})", (l - port_tx_) / ports_, (l - port_tx_) % ports_, upper);
  if (l < up_)
    return fmt::format("nic rx of node {} port {} ({}->node)", (l - port_rx_) / ports_, (l - port_rx_) % ports_, upper);
  if (l < down_) return fmt::format("{} {} uplinks ({}->{})", upper, l - up_, upper, df ? "global" : "spine");
  return fmt::format("{} {} downlinks ({}->{})", upper, l - down_, df ? "global" : "spine", upper);
}

}  // namespace chorus::sim
