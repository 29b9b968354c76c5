// A routed data-center topology in O(GPUs) memory.
//
// Links are numbered in contiguous ranges by class, so a link's capacity and
// name follow from its index and nothing is stored per link; the network
// models keep one load counter per link.  Links are directional.
//
//   GPU g's scale-up port:       nvl_tx[g], nvl_rx[g]  (NVSwitch: full bisection inside the node)
//   mesh nodes (NodeSpec::mesh): pair[n][a][b], the links from local GPU a to
//                                local GPU b of node n (one per ordered pair;
//                                a transfer inside the node takes nvl_tx[a],
//                                pair[a][b], nvl_rx[b]); a partial mesh
//                                (NodeSpec::pair_links) gives each pair its
//                                own rate, and a pair without links goes
//                                a -> m -> b over the GPU m whose two links
//                                are widest (the narrower of the two; ties:
//                                the lowest m), taking m's rx and tx too
//   scale-out port p of node n:  port_tx, port_rx       (ports = min(nics, gpus) per node; GPU l uses port l*ports/gpus)
//   fat-tree / rail-optimized:   leaf_up[L], leaf_down[L]  (a leaf's aggregated uplinks to a
//                                non-blocking spine; capacity = leaf ports / oversubscription)
//   dragonfly:                   group_out[G], group_in[G] (a group's aggregated global links)
//   torus:                       one link per node, dimension and direction (dimension-order routing)
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "sim/config.hpp"

namespace chorus::sim {

class Topology {
 public:
  static Result<Topology> build(const ClusterSpec& c);

  [[nodiscard]] int64_t gpus() const { return gpus_; }
  [[nodiscard]] int64_t links() const { return end_; }
  [[nodiscard]] BytesPerSecond capacity(int64_t link) const;
  [[nodiscard]] std::string linkName(int64_t link) const;
  [[nodiscard]] int64_t nodeOf(int64_t gpu) const { return gpu / gpn_; }
  // Mesh nodes: whether the node is one, and the intermediate local GPU a
  // transfer from local GPU a to local GPU b goes through (-1: direct).
  [[nodiscard]] bool mesh() const { return mesh_on_; }
  [[nodiscard]] int64_t meshVia(int64_t a, int64_t b) const {
    return via_.empty() ? -1 : via_[static_cast<size_t>(a * gpn_ + b)];
  }
  // A mesh node's rate (with efficiency) from one GPU to `peers` others at
  // once: each GPU's `peers` widest routes to the others (a route's rate is
  // its narrowest link), summed, capped at its port; the least over the
  // node's GPUs.  The NCCL model's scale-up rate on a mesh.
  [[nodiscard]] double meshRate(int64_t peers) const;
  // ECMP view for the flow model: an aggregated leaf/group up or down link is
  // really `lanes()` parallel cables (one per spine) of `laneCapacity()` each,
  // and a flow hashes onto one of them.
  [[nodiscard]] bool isAggregated(int64_t link) const { return ndims_ == 0 && link >= up_ && link < torus_; }
  [[nodiscard]] int64_t lanes() const { return lanes_; }
  [[nodiscard]] BytesPerSecond laneCapacity() const { return up_cap_ / static_cast<double>(lanes_); }
  [[nodiscard]] int64_t firstAggregated() const { return up_; }

  // Symmetry (the analytical model's fast path for Xor patterns): GPUs come in
  // aligned blocks of symmetryBlock() — a leaf's (fat-tree, rail: every rail
  // of it) or a dragonfly group's — and translating GPU ids by a multiple of
  // the block maps links to equal links (same class and capacity).  0 when the
  // block is not a power of two (XOR by a multiple of it then would not
  // permute whole blocks) and for tori.
  [[nodiscard]] int64_t symmetryBlock() const { return sym_block_; }
  // The lowest GPU id behind a link: the GPU, the node's first GPU for a NIC
  // port, the leaf's or group's first GPU.  Not for tori.
  [[nodiscard]] int64_t firstGpuOf(int64_t link) const {
    if (link < nvl_rx_) return link - nvl_tx_;
    if (link < mesh_) return link - nvl_rx_;
    if (link < port_tx_) return (link - mesh_) / (gpn_ - 1);  // the sending GPU
    if (link < up_) return ((link - port_tx_) % (up_ - port_rx_)) / ports_ * gpn_;
    const int64_t u = (link - up_) % (down_ - up_);
    switch (c_.network.topology) {
      case TopologyKind::RailOptimized: return u / ports_ * c_.network.leaf_nodes * gpn_;
      case TopologyKind::Dragonfly: return u * c_.network.group_nodes * gpn_;
      default: return u * c_.network.leaf_nodes * gpn_;
    }
  }

  // Calls f(link) for every link on the route src -> dst (GPU ids) and
  // returns the route's latency.  O(hops).
  // `pxn` (NCCL's PXN, PCI x NVLink): a message to another node leaves
  // through the NIC of the source node's GPU on the destination's rail (the
  // GPU with the destination's local index), reached over NVLink first, so
  // it stays on the destination's rail: src -> relay over NVLink, the
  // relay's port, the rail's leaf, the destination's port.
  template <typename F>
  Seconds route(int64_t src, int64_t dst, F&& f, bool pxn = false) const {
    // Node, port and leaf of a GPU come from O(GPUs) tables built once: the
    // divisions they replace dominated the cost of placing a round.
    const size_t us = static_cast<size_t>(src), ud = static_cast<size_t>(dst);
    const int64_t sn = node_[us], dn = node_[ud];
    if (sn == dn) {
      if (src == dst) return Seconds(0);
      f(nvl_tx_ + src);
      const int hops = mesh_on_ ? meshHops(src, dst, f) : 1;
      f(nvl_rx_ + dst);
      return c_.node.nvlink_latency * static_cast<double>(hops);
    }
    if (ndims_ > 0) return torusRoute(sn, dn, f);
    Seconds hop(0);
    int64_t sp = port_[us];
    const int64_t dp = port_[ud];
    if (pxn && sp % ports_ != dp % ports_) {  // another rail: relay through the local GPU on the destination's rail
      const int64_t relay = sn * gpn_ + dst % gpn_;
      f(nvl_tx_ + src);
      const int hops = mesh_on_ && relay != src ? meshHops(src, relay, f) : 1;
      f(nvl_rx_ + relay);
      sp = port_[static_cast<size_t>(relay)];
      hop = c_.node.nvlink_latency * static_cast<double>(hops);
    }
    f(port_tx_ + sp);
    const int64_t sl = upper_[static_cast<size_t>(sp)], dl = upper_[static_cast<size_t>(dp)];
    if (sl != dl) {
      f(up_ + sl);
      f(down_ + dl);
    }
    f(port_rx_ + dp);
    return c_.network.latency + hop;
  }

 private:
  explicit Topology(const ClusterSpec& c) : c_(c) {}
  // The partial mesh's tables (pair_cap_, via_, tx_cap_, rx_cap_).
  Status buildPartialMesh();
  // The leaf (fat-tree, rail) or group (dragonfly) above a node's port.
  [[nodiscard]] int64_t upperOf(int64_t node, int64_t port) const {
    switch (c_.network.topology) {
      case TopologyKind::RailOptimized: return (node / c_.network.leaf_nodes) * ports_ + port;
      case TopologyKind::Dragonfly: return node / c_.network.group_nodes;
      default: return node / c_.network.leaf_nodes;
    }
  }
  template <typename F>
  Seconds torusRoute(int64_t sn, int64_t dn, F&& f) const {
    int64_t cur[3], dst[3];
    coords(sn, cur);
    coords(dn, dst);
    int hops = 0;
    for (int d = 0; d < ndims_; ++d) {
      const int64_t k = c_.network.dims[d];
      int64_t fwd = ((dst[d] - cur[d]) % k + k) % k;
      const int dir = fwd <= k - fwd ? 1 : -1;
      int64_t steps = dir > 0 ? fwd : k - fwd;
      for (; steps > 0; --steps, ++hops) {
        f(torus_ + (nodeAt(cur) * ndims_ + d) * 2 + (dir > 0 ? 0 : 1));
        cur[d] = ((cur[d] + dir) % k + k) % k;
      }
    }
    return c_.network.latency * hops;
  }
  void coords(int64_t node, int64_t* x) const {
    for (int d = 0; d < 3; ++d) {
      x[d] = node % c_.network.dims[d];
      node /= c_.network.dims[d];
    }
  }
  [[nodiscard]] int64_t nodeAt(const int64_t* x) const {
    return x[0] + c_.network.dims[0] * (x[1] + int64_t{c_.network.dims[1]} * x[2]);
  }

  // The mesh link from GPU a to GPU b of the same node.
  [[nodiscard]] int64_t meshLink(int64_t a, int64_t b) const {
    const int64_t la = a % gpn_, lb = b % gpn_;
    return mesh_ + (a - la) / gpn_ * gpn_ * (gpn_ - 1) + la * (gpn_ - 1) + (lb < la ? lb : lb - 1);
  }

  // The mesh links between GPU a's port and GPU b's (same node): the pair's
  // link, or the two links through the intermediate GPU and its rx and tx.
  template <typename F>
  int meshHops(int64_t a, int64_t b, F& f) const {
    const int64_t m = meshVia(a % gpn_, b % gpn_);
    if (m < 0) {
      f(meshLink(a, b));
      return 1;
    }
    const int64_t mid = a - a % gpn_ + m;
    f(meshLink(a, mid));
    f(nvl_rx_ + mid);
    f(nvl_tx_ + mid);
    f(meshLink(mid, b));
    return 2;
  }

  ClusterSpec c_;
  int64_t gpus_ = 0, gpn_ = 1, ports_ = 1;
  bool mesh_on_ = false;
  int ndims_ = 0;
  // First link index of each class (the next class's start ends it).
  int64_t nvl_tx_ = 0, nvl_rx_ = 0, mesh_ = 0, port_tx_ = 0, port_rx_ = 0, up_ = 0, down_ = 0, torus_ = 0, end_ = 0;
  int64_t lanes_ = 1;
  int64_t sym_block_ = 0;
  BytesPerSecond nvl_cap_, mesh_cap_, port_cap_, up_cap_, torus_cap_;
  // A partial mesh (NodeSpec::pair_links; all empty otherwise), by local
  // GPU: each ordered pair's capacity (0: no link), the intermediate GPU of
  // each pair (-1: direct), each GPU's tx and rx port (min of nvl_cap_ and
  // the sum of its links out, in).
  std::vector<double> pair_cap_;
  std::vector<int32_t> via_;
  std::vector<double> tx_cap_, rx_cap_;
  std::vector<int32_t> node_;   // per GPU: its node
  std::vector<int32_t> port_;   // per GPU: its scale-out port (node * ports + local port); not for tori
  std::vector<int32_t> upper_;  // per port: the leaf or group above it
};

}  // namespace chorus::sim
