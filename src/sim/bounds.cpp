#include "sim/bounds.hpp"

#include <algorithm>

#include "sim/nccl.hpp"

namespace chorus::sim {

std::string linkClassName(const ClusterSpec& c, LinkClass k) {
  const bool torus = c.network.topology == TopologyKind::Torus2d || c.network.topology == TopologyKind::Torus3d;
  switch (k) {
    case LinkClass::NvLink: return "nvlink_port";
    case LinkClass::Nic: return torus ? "torus_links" : "nic_port";
    case LinkClass::Uplink: return c.network.topology == TopologyKind::Dragonfly ? "group_uplink" : "leaf_uplink";
  }
  return "?";
}

LinkClass LinkDemand::dominant() const {
  size_t best = 0;
  for (size_t i = 1; i < s.size(); ++i)
    if (s[i] > s[best]) best = i;
  return static_cast<LinkClass>(best);
}

LinkLedger::LinkLedger(const ClusterSpec& c, int64_t job_gpus) : c_(c), gpus_(job_gpus), gpn_(c.node.gpus) {
  nvl_cap_ = (c.node.nvlink_bw * c.node.nvlink_efficiency).value();
  if (c.node.mesh && gpn_ > 1) {
    // A mesh node (docs/simulator.md, "Mesh nodes"): GPU 0's port is at most
    // the sum of its links to the node's others (the larger direction's,
    // whichever way a collective's bytes go), as the topology caps it.
    double out = 0, in = 0;
    if (c.node.pair_links.empty()) {
      out = in = c.node.peerBw().value() * static_cast<double>(gpn_ - 1);
    } else {
      for (int64_t b = 1; b < gpn_; ++b) {
        out += c.node.pairLinks(0, b) * c.node.peerBw().value();
        in += c.node.pairLinks(b, 0) * c.node.peerBw().value();
      }
    }
    nvl_cap_ = std::min(nvl_cap_, std::max(out, in) * c.node.nvlink_efficiency);
  }
  // NVLS as the network model decides it (network.cpp): on, or by default on
  // Hopper and Blackwell NVSwitch nodes.
  const GpuArch arch = gpuArch(c.gpu);
  nvls_ = c.node.nvls == 1 || (c.node.nvls == -1 && c.node.gpus > 1 && (arch == GpuArch::Hopper || arch == GpuArch::Blackwell));
  const double nic = (c.network.nic_bw * c.network.efficiency).value();
  switch (c.network.topology) {
    case TopologyKind::Torus2d: node_cap_ = 4 * nic; break;  // a node's 2 x dims links
    case TopologyKind::Torus3d: node_cap_ = 6 * nic; break;
    default: {
      node_cap_ = nic * c.network.nics_per_node;
      const int64_t pod_nodes =
          c.network.topology == TopologyKind::Dragonfly ? c.network.group_nodes : c.network.leaf_nodes;
      pod_gpus_ = pod_nodes * gpn_;
      pod_cap_ = node_cap_ * static_cast<double>(pod_nodes) / c.network.oversubscription;
    }
  }
}

int64_t LinkLedger::membersIn(const GroupSet& g, int64_t x, int64_t lo, int64_t hi) {
  const int64_t y = x - g.offset;
  const int64_t base = g.offset + y % g.stride + (y / (g.stride * g.size)) * g.stride * g.size;
  // members base + r stride, r in [0, size), inside [lo, hi)
  const int64_t r_lo = lo <= base ? 0 : (lo - base + g.stride - 1) / g.stride;
  const int64_t r_hi = hi <= base ? -1 : std::min(g.size - 1, (hi - 1 - base) / g.stride);
  return std::max<int64_t>(0, r_hi - r_lo + 1);
}

double LinkLedger::domainBytes(plan::Collective k, double bytes, const GroupSet& g, int64_t size) const {
  const int64_t end = std::min(size, gpus_);
  if (size <= 0 || end >= gpus_ || g.size < 2) return 0;  // the domain holds the whole job
  const double n = static_cast<double>(g.size);
  double total = 0;
  for (int64_t x = g.offset; x < std::max(end, g.offset); ++x) {
    const int64_t kin = membersIn(g, x, 0, size);
    if (kin <= 0 || kin >= g.size) continue;
    const double km = static_cast<double>(kin), out = (n - km) / n;
    double group_bytes = 0;  // what this group's members in the domain exchange with the rest, one direction
    switch (k) {
      // The domain's members need the other members' shards (all-gather), or
      // send the other members their shards' partial sums, pre-reduced in the
      // domain (reduce-scatter); an allreduce does both.
      case plan::Collective::AllGather:
      case plan::Collective::ReduceScatter: group_bytes = bytes * out; break;
      // With in-network reduction (IB SHARP) the reduced data crosses once.
      case plan::Collective::AllReduce: group_bytes = (c_.network.sharp ? 1 : 2) * bytes * out; break;
      // Every member sends a distinct 1/n of its buffer to every other.
      case plan::Collective::AllToAll: group_bytes = km * bytes * out; break;
      default: group_bytes = 0; break;
    }
    total += group_bytes / km;  // the group is met km times in the domain
  }
  return total;
}

LinkDemand LinkLedger::collective(plan::Collective k, double bytes, const GroupSet& g) const {
  LinkDemand d;
  if (g.size < 2 || bytes <= 0) return d;
  const double n = static_cast<double>(g.size);
  // NVLink port of GPU 0 when its whole group is in its node (a spanning
  // group's in-node share may also travel through the NICs: no bound).
  if (membersIn(g, g.offset, 0, gpn_) == g.size) {
    double per_gpu = 0;
    switch (k) {
      case plan::Collective::AllGather:
      case plan::Collective::ReduceScatter:
      case plan::Collective::AllToAll: per_gpu = bytes * (n - 1) / n; break;
      // In-switch reduction (NVLS) sends each GPU's data in once and the
      // result out once: (n - 1)/n of the buffer each way is the least any
      // plan moves; without it a reduce-scatter and an all-gather.
      case plan::Collective::AllReduce: per_gpu = (nvls_ ? 1 : 2) * bytes * (n - 1) / n; break;
      default: break;
    }
    d.s[0] = per_gpu / nvl_cap_;
  }
  d.s[1] = domainBytes(k, bytes, g, gpn_) / node_cap_;
  if (pod_gpus_ > 0) d.s[2] = domainBytes(k, bytes, g, pod_gpus_) / pod_cap_;
  return d;
}

LinkDemand LinkLedger::sendRecv(double bytes, const GroupSet& pairs, double sends) const {
  LinkDemand d;
  if (pairs.size < 2 || bytes <= 0) return d;
  auto crossing = [&](int64_t size) {
    double b = 0;
    for (int64_t x = pairs.offset; x < std::min(size, gpus_); ++x) {
      // The next stage's GPU; the last stage's neighbour is the one before it.
      const int64_t rank = ((x - pairs.offset) / pairs.stride) % pairs.size;
      const int64_t peer = rank + 1 < pairs.size ? x + pairs.stride : x - pairs.stride;
      if (peer / size != x / size) b += bytes * sends;
    }
    return b;
  };
  if (pairs.stride < gpn_ && (pairs.offset % gpn_) + pairs.stride < gpn_) d.s[0] = bytes * sends / nvl_cap_;
  d.s[1] = crossing(gpn_) / node_cap_;
  if (pod_gpus_ > 0 && pod_gpus_ < gpus_) d.s[2] = crossing(pod_gpus_) / pod_cap_;
  return d;
}

double scaleUpBound(const Topology& t, int64_t n, const std::vector<double>& pair_bytes) {
  std::map<int64_t, double> load;
  for (int64_t a = 0; a < n; ++a)
    for (int64_t b = 0; b < n; ++b) {
      const double x = pair_bytes[static_cast<size_t>(a * n + b)];
      if (a == b || x <= 0) continue;
      t.route(a, b, [&](int64_t l) { load[l] += x; });
    }
  double worst = 0;
  for (const auto& [l, x] : load) worst = std::max(worst, x / t.capacity(l).value());
  return worst;
}

double Bounds::max() const {
  double m = 0;
  for (const auto& [k, v] : seconds) m = std::max(m, v);
  return m;
}

}  // namespace chorus::sim
