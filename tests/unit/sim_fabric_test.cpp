// Congestion that follows the traffic (issue 42, item 1; docs/simulator.md,
// "Congestion that follows the traffic"): an oversubscribed leaf tier is
// priced by the bytes each algorithm puts across it, not by dividing every
// NIC.  Every expected figure below is derived here from the cluster's
// parameters and the algorithm's edges, never copied from the simulator.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "sim/config.hpp"
#include "sim/network.hpp"
#include "sim/report.hpp"
#include "sim/topology.hpp"

namespace chorus::sim {
namespace {

// DGX-H100-like nodes: 8 GPUs, NVLink 450 GB/s x 0.824, `nics` NICs of 400
// Gb/s at network.efficiency 0.9 (default), on a fat-tree (or rail) with
// `leaf_nodes` nodes per leaf and the given oversubscription.
ClusterSpec fabric(const char* topo, int nodes, int leaf_nodes, double oversub, int nics = 8, int gpn = 8) {
  const std::string j = fmt::format(R"({{"name": "t", "nodes": {},
    "gpu": {{"name": "H100-SXM5", "peak_tflops": 989, "hbm_gib": 80, "hbm_gbyte_s": 3350}},
    "node": {{"gpus": {}, "nvlink_gbyte_s": 450, "nvlink_latency_us": 1, "nvlink_efficiency": 0.824}},
    "network": {{"topology": "{}", "nics_per_node": {}, "nic_gbit_s": 400, "latency_us": 2,
                 "oversubscription": {}, "leaf_nodes": {}}}}})",
                                    nodes, gpn, topo, nics, oversub, leaf_nodes);
  auto c = parseCluster(j, "t.json");
  EXPECT_TRUE(c.isOk()) << c.status().message();
  return *c;
}

CollectiveReport run(const ClusterSpec& c, int64_t gpus, const char* coll, double bytes, const char* algo,
                     Library lib = Library::Nccl, NetMode mode = NetMode::Analytical) {
  const plan::Registry reg = plan::Registry::builtin();
  auto r = simulateCollective(c, gpus, coll, bytes, algo, reg, mode, lib);
  EXPECT_TRUE(r.isOk()) << r.status().message();
  return r.isOk() ? *r : CollectiveReport{};
}

constexpr double kNic = 400e9 / 8 * 0.9;  // one NIC port, one direction (B/s)
constexpr double kGiB = 1073741824.0;

// NCCL's ring over 16 contiguous nodes (128 H100s), 2 nodes per leaf, 3:1.
// Every ring edge between nodes carries E = 2 (n-1)/n x S bytes (allreduce,
// all channels), spread over the node's 8 NICs: E / (8 x 45 GB/s) on the NICs.
// Leaves are {0,1}, {2,3}, ..., {14,15}; the ring's node edges 1->2, 3->4,
// ..., 15->0 leave a leaf: ONE crossing per leaf, so its uplinks carry E at
// 2 nodes x 8 NICs x 45 GB/s / 3 = 240 GB/s, slower than the NICs' 360 GB/s
// and NVLink's 370.8 GB/s.  The latency does not change, so
//   t(3:1) - t(1:1) = E / 240e9 - E / 360e9.
// (Dividing every NIC by 3, as before, would give E / 120e9 - E / 360e9.)
TEST(SimFabric, ContiguousRingPaysOnlyItsLeafCrossings) {
  const double S = kGiB, n = 128;
  const double E = 2 * (n - 1) / n * S;
  const double nic_node = 8 * kNic;                          // 360 GB/s
  const double up_per_edge = 2 * 8 * kNic / 3 / 1.0;         // 2 nodes' NICs / 3, shared by 1 crossing
  const double nvl = 450e9 * 0.824;
  ASSERT_LT(up_per_edge, std::min(nic_node, nvl));
  const CollectiveReport flat = run(fabric("fat-tree", 16, 2, 1), 128, "allreduce", S, "nccl:ring/Simple");
  const CollectiveReport over = run(fabric("fat-tree", 16, 2, 3), 128, "allreduce", S, "nccl:ring/Simple");
  const double expected = E / up_per_edge - E / std::min(nic_node, nvl);
  EXPECT_NEAR((over.time_us - flat.time_us) * 1e-6, expected, 1e-9 * expected);
  EXPECT_NEAR(over.latency_us, flat.latency_us, 1e-9);
  EXPECT_EQ(over.bottleneck, "leaf uplinks (leaf->spine)");
  EXPECT_EQ(flat.bottleneck, "nic (node->leaf)");
}

// The issue's case: 1,024 H100s (128 nodes) on a rail-optimized fabric with
// 32 nodes per leaf, 2:1.  The ring's rail-aligned channels cross each leaf
// group once (edges 31->32, 63->64, 95->96, 127->0); a crossing edge's bytes
// meet 32 x 8 x 45 GB/s / 2 = 5,760 GB/s of uplinks against 360 GB/s of
// NICs, so the spine never binds: the ring (and NCCL's pick) is unchanged,
// where dividing the NICs by 2 halved it.
TEST(SimFabric, TwoToOneSpineLeavesAContiguousRingAsItIs) {
  const double up_per_edge = 32 * 8 * kNic / 2, nic_node = 8 * kNic;
  ASSERT_GT(up_per_edge, nic_node);
  for (const char* algo : {"nccl:ring/Simple", "auto"}) {
    const CollectiveReport flat = run(fabric("rail-optimized", 128, 32, 1), 1024, "allreduce", kGiB, algo);
    const CollectiveReport over = run(fabric("rail-optimized", 128, 32, 2), 1024, "allreduce", kGiB, algo);
    EXPECT_EQ(over.algo, flat.algo) << algo;
    EXPECT_NEAR(over.time_us, flat.time_us, 1e-9 * flat.time_us) << algo;
  }
}

// 1:1 is unchanged by construction: no leaf can carry more than its nodes'
// NICs, which already bound every edge.  Checked for ring, tree and the pick
// on a call spanning 8 leaves, and for a strided group set (one GPU per node
// per group, 8 groups at once: the DP groups of tp 8).
TEST(SimFabric, NonBlockingFabricPricesEdgesByTheirNics) {
  const ClusterSpec c = fabric("fat-tree", 16, 2, 1);
  const double S = kGiB, n = 128, nic_node = 8 * kNic, nvl = 450e9 * 0.824;
  const CollectiveReport ring = run(c, 128, "allreduce", S, "nccl:ring/Simple");
  // Bandwidth term: E over the slower of NVLink and the NICs.
  EXPECT_NEAR(ring.time_us - ring.latency_us, 2 * (n - 1) / n * S / std::min(nic_node, nvl) * 1e6, 1e-6);
  EXPECT_EQ(ring.bottleneck, "nic (node->leaf)");  // tier and direction
  const plan::Registry reg = plan::Registry::builtin();
  const Topology topo = *Topology::build(c);
  NetworkModel net(c, topo, reg);
  const GroupSet dp{16, 8, 8};  // member r of group j: GPU j + 8 r
  const NcclShape s = net.ncclShape(plan::Collective::AllReduce, Bytes(S), dp);
  EXPECT_EQ(s.leaf_up_bw, 0);  // no uplink can bind
  EXPECT_NEAR(s.net_bw, nic_node / 8, 1e-6);
}

// The crossings counted for strided groups and for NCCL's double binary
// tree.  DP groups of tp 8 on 16 nodes, 4 nodes per leaf, 2:1: each of the 8
// groups is a ring over nodes 0..15 (one rank per node), crossing each leaf
// once: 8 crossing edges per leaf.  NCCL's trees over 16 node-ranks
// (ncclGetBtree: parent of r = (r ^ b) | 2b for r's lowest set bit b, or r ^ b
// when that is out of range; ncclGetDtree: the second tree mirrors the first,
// r -> 15 - r, for an even count): the test enumerates both trees' edges and
// counts those with one end in each leaf, x 8 groups.
int64_t btreeParentRef(int64_t m, int64_t r) {
  if (r == 0) return -1;
  int64_t b = r & -r;  // lowest set bit
  int64_t up = (r ^ b) | (b << 1);
  return up >= m ? (r ^ b) : up;
}
TEST(SimFabric, CrossingsOfStridedRingsAndDoubleBinaryTrees) {
  const ClusterSpec c = fabric("fat-tree", 16, 4, 2);
  const plan::Registry reg = plan::Registry::builtin();
  const Topology topo = *Topology::build(c);
  NetworkModel net(c, topo, reg);
  const NcclShape s = net.ncclShape(plan::Collective::AllReduce, Bytes(kGiB), GroupSet{16, 8, 8});
  EXPECT_NEAR(s.leaf_up_bw, 4 * 8 * kNic / 2, 1e-3);
  EXPECT_EQ(s.ring_cross, 8);  // 8 groups x 1 edge leaving each leaf
  // Tree: edges with one end in the leaf, both trees, per group; x 8 groups.
  double worst = 0;
  for (int leaf = 0; leaf < 4; ++leaf) {
    int cross = 0;
    for (int r = 1; r < 16; ++r) {
      const int64_t p = btreeParentRef(16, r);
      if ((r / 4 == leaf) != (p / 4 == leaf)) ++cross;
      const int64_t mr = 15 - r, mp = 15 - p;  // the mirrored tree's edge
      if ((mr / 4 == leaf) != (mp / 4 == leaf)) ++cross;
    }
    worst = std::max(worst, 8.0 * cross);
  }
  EXPECT_EQ(s.tree_cross, worst);
  EXPECT_GT(s.tree_cross, 0);
}

// An all-to-all across leaves needs the bisection.  One GPU and one NIC per
// node, 64 nodes, 4 nodes per leaf.  NCCL's all-to-all is grouped
// point-to-point: every rank posts its 63 sends of S/64 at once (priced as
// chorus's pairwise exchange, all pairs in one round).  A NIC port carries
// 63 x S/64 at 45 GB/s.  Leaf L's 4 ranks each send S/64 to the 60 ranks
// outside it: 240 x S/64 through uplinks of 4 x 45 GB/s / oversubscription,
// i.e. 60 x oversub port-times.  So
//   t = 2 us + (S/64) / 45e9 x max(63, 60 x oversub):
// 63 port-times at 1:1 (the NICs bind), 120 at 2:1 (the uplinks): 1.90x,
// the all-to-all halves but for the 3 of 63 peers inside the leaf, where a
// contiguous ring would not notice the spine at all.
TEST(SimFabric, AllToAllAcrossLeavesHalvesOnATwoToOneSpine) {
  const double S = kGiB, n = 64, lat = 2e-6, port = S / n / kNic;
  auto expected = [&](double oversub) { return lat + port * std::max(n - 1, 60 * oversub); };
  const CollectiveReport flat = run(fabric("fat-tree", 64, 4, 1, 1, 1), 64, "alltoall", S, "auto");
  const CollectiveReport over = run(fabric("fat-tree", 64, 4, 2, 1, 1), 64, "alltoall", S, "auto");
  EXPECT_NEAR(flat.time_us * 1e-6, expected(1), 1e-9 * expected(1));
  EXPECT_NEAR(over.time_us * 1e-6, expected(2), 1e-9 * expected(2));
  EXPECT_NEAR(over.time_us / flat.time_us, 120.0 / 63, 0.01);
  // The report names the binding link with its tier and direction.
  EXPECT_NE(over.bottleneck.find("uplinks (leaf->spine)"), std::string::npos) << over.bottleneck;
  EXPECT_NE(flat.bottleneck.find("(node->leaf)"), std::string::npos) << flat.bottleneck;
}

// The analytical NCCL ring and the flow model agree on the crossings.  One
// NIC per node, so chorus's ring plan (which the flow model simulates message
// by message, max-min fair, ECMP over the spine cables) moves each inter-node
// edge through the node's one NIC as NCCL's rings do.  16 nodes of 4 GPUs, 2
// nodes per leaf, 3:1: one crossing per leaf at 2 x 45 / 3 = 30 GB/s against
// the NIC's 45.  Tolerance 5 % (they land within 2.2 % here): chorus's ring
// pays a route latency per round (2(n-1) rounds) where NCCL's latency model
// has its own constants, and the flow model shares links max-min fairly with
// ECMP hashing over the spine cables (an all-to-all lands within 3.3 %).  1:1
// is checked the same way.
TEST(SimFabric, AnalyticalAndFlowAgreeOnCrossings) {
  for (double oversub : {1.0, 3.0}) {
    const ClusterSpec c = fabric("fat-tree", 16, 2, oversub, 1, 4);
    const CollectiveReport nccl = run(c, 64, "allreduce", kGiB, "nccl:ring/Simple");
    const CollectiveReport flow = run(c, 64, "allreduce", kGiB, "ring", Library::Chorus, NetMode::Flow);
    const CollectiveReport ana = run(c, 64, "allreduce", kGiB, "ring", Library::Chorus, NetMode::Analytical);
    EXPECT_NEAR(flow.time_us / nccl.time_us, 1, 0.05) << oversub << " flow " << flow.time_us << " nccl " << nccl.time_us;
    EXPECT_NEAR(ana.time_us / nccl.time_us, 1, 0.05) << oversub << " analytical " << ana.time_us;
    // The bandwidth the crossing leaves: 30 GB/s per edge at 3:1, the NIC's 45 at 1:1.
    const double edge = oversub > 1 ? 2 * kNic / oversub : kNic;
    EXPECT_NEAR(nccl.time_us - nccl.latency_us, 2 * 63.0 / 64 * kGiB / edge * 1e6, 1e-6);
  }
  // The all-to-all of the test above, flow against analytical.
  for (double oversub : {1.0, 2.0}) {
    const ClusterSpec c = fabric("fat-tree", 64, 4, oversub, 1, 1);
    const CollectiveReport ana = run(c, 64, "alltoall", kGiB, "auto");
    const CollectiveReport flow = run(c, 64, "alltoall", kGiB, "auto", Library::Nccl, NetMode::Flow);
    EXPECT_NEAR(flow.time_us / ana.time_us, 1, 0.05) << oversub << " flow " << flow.time_us << " ana " << ana.time_us;
  }
}

// NCCL's PXN (docs/simulator.md, "PXN") on a rail-optimized fabric: 4 nodes
// of 8 GPUs and 8 NICs, all 4 under one leaf per rail (rail r's leaf joins
// the 4 nodes' port r; different rails meet only at the spine).  An
// all-to-all of S per rank, m = S/32 per message, every message in flight at
// once (NCCL's grouped point-to-point):
//  - without PXN a GPU's message to another node leaves through its own
//    NIC: 24 m per port (NIC-bound: 24 port-times of m / 45 GB/s), and the
//    21 of 24 that go to another rail climb to the spine: rail r's leaf sends
//    4 nodes x 21 m through 4 x 45 GB/s / oversub = 21 x oversub port-times.
//    1:1: the NICs bind (24 > 21); 2:1: the uplinks (42 port-times), 1.75x.
//  - with PXN the message first crosses NVLink to the local GPU on the
//    destination's rail, which sends it on that rail: still 24 m per port
//    (that GPU relays for its 7 neighbours: 8 GPUs x 3 remote nodes), no
//    byte climbs to the spine, NVLink carries 7 + 21 = 28 m per GPU at
//    370.8 GB/s (under the NIC's 24 m at 45): 24 port-times at any
//    oversubscription, and one NVLink hop (1 us) more latency.
// NCCL turns PXN on by default (NCCL_PXN_DISABLE=0, NCCL_P2P_PXN_LEVEL=2);
// `"pxn": false` in the cluster file is NCCL_PXN_DISABLE=1; chorus's own
// all-to-all plans do not relay; a node of one GPU has nobody to relay through.
TEST(SimFabric, PxnKeepsARailAllToAllOffTheSpine) {
  const double S = kGiB, port = S / 32 / kNic, lat = 2e-6, nvl = 1e-6;
  auto cluster = [](double oversub, const char* pxn) {
    ClusterSpec c = fabric("rail-optimized", 4, 4, oversub);
    if (std::string(pxn) != "auto") c.network.pxn = std::string(pxn) == "on" ? 1 : 0;
    return c;
  };
  for (double oversub : {1.0, 2.0}) {
    const CollectiveReport off = run(cluster(oversub, "off"), 32, "alltoall", S, "auto");
    const CollectiveReport on = run(cluster(oversub, "auto"), 32, "alltoall", S, "auto");
    const CollectiveReport forced = run(cluster(oversub, "on"), 32, "alltoall", S, "auto");
    EXPECT_NEAR(off.time_us * 1e-6, lat + port * std::max(24.0, 21 * oversub), 1e-9) << oversub;
    EXPECT_NEAR(on.time_us * 1e-6, lat + nvl + port * 24, 1e-9) << oversub;
    EXPECT_DOUBLE_EQ(forced.time_us, on.time_us);
    EXPECT_EQ(on.bottleneck.find("uplinks"), std::string::npos) << on.bottleneck;
    if (oversub > 1) {
      EXPECT_NE(off.bottleneck.find("uplinks (leaf->spine)"), std::string::npos) << off.bottleneck;
      EXPECT_NEAR((off.time_us - 2) / (on.time_us - 3), 42.0 / 24, 1e-6);
    }
    // The flow model routes the same relays (max-min fair, within 5 %).
    const CollectiveReport flow = run(cluster(oversub, "auto"), 32, "alltoall", S, "auto", Library::Nccl, NetMode::Flow);
    EXPECT_NEAR(flow.time_us / on.time_us, 1, 0.05) << oversub << " flow " << flow.time_us << " ana " << on.time_us;
  }
  // Chorus's transport does not relay: its pairwise all-to-all pays the spine.
  const CollectiveReport chorus = run(cluster(2, "auto"), 32, "alltoall", S, "pairwise", Library::Chorus);
  EXPECT_NEAR(chorus.time_us * 1e-6, lat + port * 42, 1e-9);
  // One GPU per node: no NVLink peer to relay through, PXN changes nothing.
  const ClusterSpec single = fabric("rail-optimized", 32, 32, 2, 1, 1);
  ClusterSpec single_off = single;
  single_off.network.pxn = 0;
  EXPECT_DOUBLE_EQ(run(single, 32, "alltoall", S, "auto").time_us, run(single_off, 32, "alltoall", S, "auto").time_us);
  // The cluster file's key: a boolean, absent = NCCL's default (-1); anything else is refused by name.
  auto withPxn = [](const char* v) {
    return parseCluster(fmt::format(R"({{"name": "t", "nodes": 2,
      "gpu": {{"name": "g", "peak_tflops": 989, "hbm_gib": 80, "hbm_gbyte_s": 3350}},
      "node": {{"gpus": 8, "nvlink_gbyte_s": 450, "nvlink_latency_us": 1}},
      "network": {{"topology": "rail-optimized", "nics_per_node": 8, "nic_gbit_s": 400, "latency_us": 2,
                   "oversubscription": 1{}}}}})", v), "t.json");
  };
  ASSERT_TRUE(withPxn("").isOk() && withPxn(R"(, "pxn": false)").isOk() && withPxn(R"(, "pxn": true)").isOk());
  EXPECT_EQ(withPxn("")->network.pxn, -1);
  EXPECT_EQ(withPxn(R"(, "pxn": false)")->network.pxn, 0);
  EXPECT_EQ(withPxn(R"(, "pxn": true)")->network.pxn, 1);
  auto bad = withPxn(R"(, "pxn": "yes")");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("network.pxn"), std::string::npos) << bad.status().message();
  // A send/recv between the same local GPU of two nodes stays on its rail either way.
  const plan::Registry reg = plan::Registry::builtin();
  for (const char* pxn : {"auto", "off"}) {
    const ClusterSpec c = cluster(2, pxn);
    auto topo = Topology::build(c);
    ASSERT_TRUE(topo.isOk());
    NetworkModel net(c, *topo, reg);
    auto sr = net.sendRecv(Bytes(S), GroupSet{2, 8, 8});  // GPU g -> g + 8, g < 8
    ASSERT_TRUE(sr.isOk()) << sr.status().message();
    EXPECT_NEAR(sr->time.value(), lat + S / kNic, 1e-9) << pxn;
  }
}

}  // namespace
}  // namespace chorus::sim
