// Collectives as NCCL runs them: its algorithms (Ring, Tree, NVLS, NVLSTree,
// CollNetDirect, PAT) and protocols (LL, LL128, Simple), priced the way
// NCCL's tuner prices them (src/graph/tuning.cc: base and per-step latencies,
// per-protocol bandwidth fractions and per-channel caps) but with the
// bandwidths taken from the cluster's links and the bytes each GPU really
// moves (NVLS: in-switch reduction and multicast), so nothing here is
// fitted to a measured curve.  docs/simulator.md, "Collectives as NCCL runs
// them", lists every constant and its source.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "plan/plan.hpp"
#include "sim/config.hpp"

namespace chorus::sim {

// Which library's collectives a job runs: NCCL's algorithms, chorus's plans,
// or whichever of the two is faster.
enum class Library { Nccl, Chorus, Auto };
Result<Library> parseLibrary(std::string_view text);
std::string_view libraryName(Library l);

enum class GpuArch { Other, Volta, Ampere, Hopper, Blackwell };
// gpu.arch, or the generation named in gpu.name (A100, H100/H800/H200/GH200, B100/B200/GB200, V100).
GpuArch gpuArch(const GpuSpec& g);

enum class NcclAlgo { Tree, Ring, CollNetDirect, Nvls, NvlsTree, Pat };
enum class NcclProto { LL, LL128, Simple };
constexpr int kNcclAlgos = 6, kNcclProtos = 3;
std::string_view ncclAlgoName(NcclAlgo a);    // "Ring", "NVLS", ...
std::string_view ncclProtoName(NcclProto p);  // "LL", "LL128", "Simple"

// One collective call of one group, with what the group's members can use
// while every group of the call runs at once.
struct NcclShape {
  plan::Collective coll = plan::Collective::AllReduce;
  double bytes = 0;   // nccl-tests convention (allgather: the output, reducescatter: the input)
  int64_t n = 1;      // ranks
  int64_t ppn = 1;    // ranks per node (NVLink domain)
  int64_t nodes = 1;  // nodes the group spans
  double nvl_bw = 0;  // one GPU's NVLink bandwidth, one direction, as NCCL's Simple protocol drives it (B/s)
  double net_bw = 0;  // the group's share of one node's NICs, one direction, all of its ranks together (B/s)
  double nvls_reduce = 0;  // the group's share of its node's NVSwitch reduction throughput (fp32 adds/s)
  bool nvls = false, sharp = false;
  GpuArch arch = GpuArch::Other;
  // The leaf tier (dragonfly: the group tier) as this call loads it, every
  // group at once (docs/simulator.md, "Congestion that follows the traffic").
  // leaf_up_bw: one leaf group's uplink capacity, one direction, all rails of
  // its nodes together (B/s; = its nodes' NIC rate / oversubscription); 0 when
  // no uplink can bind (oversubscription 1, or every group inside one leaf).
  // The crossings are the most any one leaf carries, per direction, in units of
  // one inter-node edge's bytes:
  //   ring_cross: ring edges (consecutive nodes in rank order, and the wrap)
  //               leaving the leaf, summed over the call's groups;
  //   tree_cross: edges of NCCL's double binary tree over the nodes (both
  //               trees) with exactly one end in the leaf;
  //   collnet_cross: groups with nodes inside and outside the leaf (SHARP
  //               sends one reduced buffer per leaf up the switch tree);
  //   direct_cross: sum over groups of k (n - k) / n, k = the group's ranks
  //               in the leaf: a direct exchange's share of S leaving it.
  double leaf_up_bw = 0;
  double ring_cross = 0, tree_cross = 0, collnet_cross = 0, direct_cross = 0;
  std::string up_tier = "leaf uplinks (leaf->spine)";  // how the report names that link
  // How the report names the scale-up port: a mesh node (NodeSpec::mesh) has
  // no switch; nvl_bw there is the links to the group's other ranks on the node.
  std::string intra_tier = "nvlink (gpu->nvswitch)";
};

struct NcclCost {
  NcclAlgo algo = NcclAlgo::Ring;
  NcclProto proto = NcclProto::Simple;
  double time_s = 0, latency_s = 0;
  double tuner_s = 0;      // NCCL's own cost of the pair (all channels): what its tuner compares
  int channels = 0;        // channels the call runs on (fewer for small messages)
  // The binding link with its tier and direction: "nvlink (gpu->nvswitch)",
  // "nic (node->leaf)", "leaf uplinks (leaf->spine)" (dragonfly: "group
  // uplinks (group->global)"), or "nvswitch reduction", "protocol cap", "latency".
  std::string bottleneck;
  [[nodiscard]] std::string name() const;  // "NVLS/Simple"
};

// Channels of NCCL's rings and NVLS on one node (its graph search finds 16 on
// DGX-class NVSwitch nodes; docs).
constexpr int kNcclChannels = 16;

// Whether NCCL runs this collective with its own algorithms (allreduce,
// allgather, reducescatter, broadcast, reduce); the others are grouped
// point-to-point in NCCL and are priced from chorus's plans.
bool ncclHasAlgorithms(plan::Collective c);

// Every (algorithm, protocol) NCCL would consider for the shape, with its
// time.  Empty when none applies.
std::vector<NcclCost> ncclCandidates(const NcclShape& s);
// NCCL's choice: the candidate of least tuner cost (latency + bytes over the
// full-channel bandwidth, as NCCL's tuner compares them before it drops
// channels for small messages), or, with `algo` = "ring", "nvls",
// "tree/LL128", ... (case-insensitive), the cheapest of that algorithm (and
// protocol).  Errors name the value and what is available.
Result<NcclCost> ncclPick(const NcclShape& s, std::string_view algo);
// Whether `algo` names an NCCL algorithm (optionally "/protocol"), with or without a "nccl:" prefix.
bool isNcclAlgoName(std::string_view algo);

}  // namespace chorus::sim
