// The analytical network model: prices a collective's plan, round by round,
// on the routed topology.
//
// For each distinct round pattern (plan::Round) the flows of every
// concurrent group are placed once: each message adds its bytes to every link
// on its route, and the round costs
//     t = max route latency + max over links (bytes on link / link capacity)
// (the most loaded link sets the pace: contention is counted, as max-min
// sharing would for equal flows), or, when the receivers reduce, at least the
// reduction's HBM traffic (3 x bytes received / HBM bandwidth), which runs
// pipelined with the transfer.  A chain pays its latency once per hop.  The
// collective is the sum over rounds of repeat x t.
//
// The flow-level model (NetMode::Flow) replaces the per-round formula by an
// event-driven simulation of the round's flows: each flow follows its route
// with ECMP (an aggregated leaf uplink is `lanes` spine cables; a flow hashes
// onto one), concurrent flows share every link max-min fairly (progressive
// filling), and rates are recomputed whenever a flow finishes.  Hash
// collisions and uneven finishing are what it sees and the analytical model
// does not.
#pragma once

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "plan/plan.hpp"
#include "sim/config.hpp"
#include "sim/nccl.hpp"
#include "sim/topology.hpp"

namespace chorus::sim {

// Equal process groups laid out with a stride over GPU ids: group j's member
// r is base(j) + r * stride with base(j) = j % stride + (j / stride) * stride * size.
// This is one dimension of a mixed-radix rank layout (tp fastest, then cp,
// dp, pp: the Megatron order); all groups run the same collective at once.
struct GroupSet {
  int64_t size = 1;
  int64_t stride = 1;
  int64_t groups = 1;
  int64_t offset = 0;  // added to every GPU id
  [[nodiscard]] int64_t gpuOf(int64_t group, int64_t rank) const {
    return offset + group % stride + (group / stride) * stride * size + rank * stride;
  }
};

struct CollectiveCost {
  Seconds time;
  std::string algo;
  std::string bottleneck;    // the link that limited the slowest round (or "latency")
  Seconds latency;           // the part of time spent in route latency
};

enum class NetMode { Analytical, Flow };
// Flow mode simulates the expanded programs (no round barriers) when all the
// groups together have at most this many ranks, and round by round beyond.
constexpr int64_t kMaxProgramRanks = 256;
Result<NetMode> parseNetMode(std::string_view text);

// Not thread-safe: one model per thread (it keeps per-link scratch and a
// cache of priced collectives, which is what makes a layout search cheap).
class NetworkModel {
 public:
  NetworkModel(const ClusterSpec& c, const Topology& t, const plan::Registry& reg, NetMode mode = NetMode::Analytical)
      : c_(c), t_(t), reg_(reg), mode_(mode) {}
  [[nodiscard]] const ClusterSpec& cluster() const { return c_; }
  [[nodiscard]] NetMode mode() const { return mode_; }
  [[nodiscard]] const plan::Registry& registry() const { return reg_; }

  // Prices collective `coll` of `bytes` (nccl-tests convention: allreduce,
  // broadcast, reduce: the buffer; allgather, gather: the output; reduce-
  // scatter, scatter: the input; alltoall: what one rank sends in all) on
  // every group of `groups` at once.  algo "" or "auto" picks the fastest
  // algorithm whose plan supports the shape.
  // `scaling`: the reduction op's arithmetic (plan::Scaling: PreMulSum's
  // scale, Avg's division), priced as the local passes the plan runs.
  Result<CollectiveCost> collective(plan::Collective coll, Bytes bytes, const GroupSet& groups, std::string_view algo,
                                    plan::Scaling scaling = plan::Scaling::None);

  // Prices one point-to-point transfer per group member pair (src, dst) of
  // `bytes`, every group at once (pipeline sends between stages).
  Result<CollectiveCost> sendRecv(Bytes bytes, const GroupSet& pairs);

  // Slice size of pipelined plans (plan::Algorithm::pipelineSlices); 0, the
  // default, slices as the library does: 512 KiB when a group lies within one
  // node, 1 MiB when it spans nodes.
  void setChunkBytes(uint64_t bytes) {
    chunk_bytes_ = bytes;
    cache_.clear();
  }

  // Whose collectives the job runs (sim/nccl.hpp).  Library::Nccl prices
  // allreduce, allgather, reducescatter, broadcast and reduce with NCCL's
  // algorithms and protocols as its tuner picks them ("auto"/"" algo) or as
  // named ("ring", "nvls", "tree/LL128", "nccl:ring"); a chorus plan name
  // still prices that plan, and the other collectives (and tori, which NCCL
  // does not model) use chorus's plans.  Library::Chorus: chorus's plans only
  // ("nccl:..." names still reach NCCL).  Library::Auto: the faster of the two.
  // The training, search and inference models read it from here.  Default:
  // NCCL, what the jobs being modelled run.
  void setLibrary(Library l) {
    library_ = l;
    cache_.clear();
  }
  [[nodiscard]] Library library() const { return library_; }
  // The NCCL model's view of one call: ranks per node, nodes, and the
  // bandwidths the group's members have while all groups run at once.
  [[nodiscard]] NcclShape ncclShape(plan::Collective coll, Bytes bytes, const GroupSet& g) const;
  // The leaf tier's share of `s` (NcclShape::leaf_up_bw and the crossings of
  // ring, double binary tree, SHARP and direct exchanges over every group of
  // `g`).  O(GPUs in the call) when it spans leaves of an oversubscribed
  // fabric, O(1) otherwise.
  void leafCrossings(const GroupSet& g, NcclShape* s) const;

  // Tests: price every round by routing each message with its bytes (the slow
  // reference), instead of from cached unit patterns.  Same results.
  void setReference(bool on) {
    reference_ = on;
    cache_.clear();
  }
  // Tests: unit patterns without the symmetry shortcut (every message placed).
  void setSymmetry(bool on) {
    symmetry_off_ = !on;
    patterns_.clear();
    cache_.clear();
  }

 private:
  Result<CollectiveCost> chorusCollective(plan::Collective coll, const plan::Shape& sh, const GroupSet& g,
                                          std::string_view algo);
  Result<CollectiveCost> price(const plan::Algorithm& a, const plan::Shape& sh, const GroupSet& g);
  [[nodiscard]] Seconds scalingTime(const plan::Shape& sh) const;
  struct RoundCost {
    Seconds time, latency;
    int64_t bottleneck = -1;
  };
  RoundCost placeRound(const plan::Round& r, const GroupSet& g, uint64_t elem_bytes);
  RoundCost referenceRound(const plan::Round& r, const GroupSet& g, uint64_t elem_bytes);
  // One repetition of a round's peer pattern placed with unit messages: the
  // most loaded link (relative to its capacity) and its load, the largest
  // route latency and the most any member of the first group receives.
  struct Pattern {
    Seconds lat;
    int64_t link = -1;
    double load = 0, max_recv = 0;
  };
  Pattern unitPattern(const plan::Round& r, const GroupSet& g);
  RoundCost flowRound(const plan::Round& r, const GroupSet& g, uint64_t elem_bytes);
  // The flow models' links: the topology's, then every lane of its
  // aggregated links.  Capacities by flow-link id; the route of a flow
  // src -> dst appended to `route` (ECMP: a hash of the endpoints picks the
  // lane), returning its latency; and the topology link a flow link belongs to.
  [[nodiscard]] std::vector<double> flowCapacities() const;
  Seconds flowRoute(int64_t src, int64_t dst, std::vector<int64_t>& route) const;
  [[nodiscard]] int64_t topologyLinkOf(int64_t flow_link) const;
  // NetMode::Flow for groups small enough to expand: every rank's program run
  // as the executor runs it, without round barriers (program_flow.cpp).
  Result<CollectiveCost> programFlow(const plan::Algorithm& a, const plan::Shape& sh, const GroupSet& g);
  class ProgramFlow;  // one run of programFlow (program_flow.cpp)
  // `hop`: the largest latency of the rounds (priced by the caller's fill).
  RoundCost steadyState(const std::vector<plan::Round>& rs, const GroupSet& g, uint64_t elem_bytes, Seconds hop);

  const ClusterSpec& c_;
  const Topology& t_;
  const plan::Registry& reg_;
  NetMode mode_;
  Library library_ = Library::Nccl;
  std::vector<double> load_;      // bytes per link, reset per pattern
  std::vector<int64_t> touched_;  // links with load_ != 0
  std::vector<double> recv_;      // per member of the first group (reductions)
  bool reference_ = false, symmetry_off_ = false;
  uint64_t chunk_bytes_ = 0;
  // NCCL's PXN routes the point-to-point calls it prices (collective's
  // all-to-all under Library::Nccl, sendRecv) while `pxn_` is set: pxnOn().
  [[nodiscard]] bool pxnOn() const;
  bool pxn_ = false;
  using PatternKey = std::tuple<plan::Peers, int64_t, int32_t, int32_t, bool, int64_t, int64_t, int64_t, int64_t, bool>;
  std::map<PatternKey, Pattern> patterns_;
  using CacheKey = std::tuple<int, double, int64_t, int64_t, int64_t, int64_t, std::string>;
  std::map<CacheKey, CollectiveCost> cache_;
};

double busBandwidthFactor(plan::Collective coll, int64_t n);

}  // namespace chorus::sim
