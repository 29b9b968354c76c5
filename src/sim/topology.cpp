#include "sim/topology.hpp"

#include <algorithm>
#include <bit>
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
    t.nvl_cap_ = std::min(t.nvl_cap_, t.mesh_cap_ * static_cast<double>(t.gpn_ - 1));
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

BytesPerSecond Topology::capacity(int64_t l) const {
  if (l < nvl_rx_ + gpus_) return nvl_cap_;
  if (l < mesh_ + (mesh_on_ ? gpus_ * (gpn_ - 1) : 0)) return mesh_cap_;
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
