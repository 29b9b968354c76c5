// Physical bounds of a training iteration: the busy time of every resource a
// GPU uses, which no prediction may undercut.
//
// Per GPU: its tensor cores (the FLOPs it executes at peak), its HBM (the
// bytes its kernels move at the rated bandwidth), and each link class its
// traffic crosses: its NVLink port, its share of its node's NIC ports and its
// share of its pod's uplinks (fat-tree or rail leaf group, dragonfly group).
// A link class's bound is the bytes that every collective and point-to-point
// transfer of the iteration must put on it, summed whether or not the
// transfer overlaps compute, over the capacity the network model gives that
// link (line rate x efficiency).  Bytes are lower bounds that hold for every
// point-to-point algorithm (no in-network reduction or multicast, which no
// modelled plan uses): see docs/simulator.md, "Physical bounds".
#pragma once

#include <array>
#include <map>
#include <string>
#include <vector>

#include "plan/plan.hpp"
#include "sim/config.hpp"
#include "sim/network.hpp"
#include "sim/topology.hpp"

namespace chorus::sim {

enum class LinkClass { NvLink = 0, Nic = 1, Uplink = 2 };
constexpr int kLinkClasses = 3;
// "nvlink_port", "nic_port", "leaf_uplink" (dragonfly: "group_uplink"; torus: "torus_links" for the NIC class).
std::string linkClassName(const ClusterSpec& c, LinkClass k);

// Seconds of each link class one transfer keeps busy (at the link's capacity).
struct LinkDemand {
  std::array<double, kLinkClasses> s{0, 0, 0};
  [[nodiscard]] double operator[](LinkClass k) const { return s[static_cast<size_t>(k)]; }
  LinkDemand& operator+=(const LinkDemand& o) {
    for (size_t i = 0; i < s.size(); ++i) s[i] += o.s[i];
    return *this;
  }
  [[nodiscard]] LinkDemand scaled(double x) const {
    LinkDemand d = *this;
    for (double& v : d.s) v *= x;
    return d;
  }
  // The class this transfer loads most (relative to capacity); NvLink when none.
  [[nodiscard]] LinkClass dominant() const;
};

// Lower-bound link demands of collectives on placed groups, for the
// representative GPU 0 (its NVLink port), its node (NIC ports) and its pod
// (uplinks).  O(GPUs per node) per call.
class LinkLedger {
 public:
  LinkLedger(const ClusterSpec& c, int64_t job_gpus);
  // Collective `k` of `bytes` (nccl-tests convention, as NetworkModel::collective)
  // run on every group of `g` at once.
  [[nodiscard]] LinkDemand collective(plan::Collective k, double bytes, const GroupSet& g) const;
  // Every member r of every pair group sends `bytes` to member r + 1 (the
  // pipeline's neighbours); per GPU on average `sends` such messages.
  [[nodiscard]] LinkDemand sendRecv(double bytes, const GroupSet& pairs, double sends = 1) const;

 private:
  // Members of GPU x's group of `g` inside [lo, hi).
  [[nodiscard]] static int64_t membersIn(const GroupSet& g, int64_t x, int64_t lo, int64_t hi);
  // Bytes entering (= leaving, for point-to-point algorithms) the domain
  // [0, size) for one run of the collective on all groups.
  [[nodiscard]] double domainBytes(plan::Collective k, double bytes, const GroupSet& g, int64_t size) const;
  const ClusterSpec& c_;
  int64_t gpus_ = 0, gpn_ = 1, pod_gpus_ = 0;
  double nvl_cap_ = 0, node_cap_ = 0, pod_cap_ = 0;
  bool nvls_ = false;  // in-switch reduction inside a node
};

// The busiest link's seconds when GPU a sends pair_bytes[a * n + b] bytes to
// GPU b, for a, b in [0, n) on one node of `t` (a plan whose bytes per pair
// are known, counted from its programs), each routed as the network model
// routes it: on a mesh node (docs/simulator.md, "Mesh nodes") the pair's own
// link, a pair without one over its intermediate GPU's two links; on a
// switch node the GPUs' ports.  No schedule of those bytes is shorter.
double scaleUpBound(const Topology& t, int64_t n, const std::vector<double>& pair_bytes);

// The resources' busy seconds over one iteration and the largest.
struct Bounds {
  std::map<std::string, double> seconds;  // tensor_cores, hbm, nvlink_port, nic_port, leaf_uplink
  std::string binding;
  [[nodiscard]] double max() const;
};

}  // namespace chorus::sim
