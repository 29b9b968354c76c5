#include "sim/nccl.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

namespace chorus::sim {
namespace {

using plan::Collective;

// NCCL's tuning constants (NVIDIA/nccl src/graph/tuning.cc, 2.30; transcribed
// in docs/simulator.md).  Latencies in us, bandwidths in GB/s.  Indexed
// [algorithm][protocol] in NcclAlgo / NcclProto order.
constexpr double kBaseLat[kNcclAlgos][kNcclProtos] = {
    {6.8, 14.0, 8.4},  // Tree
    {6.6, 14.0, 8.4},  // Ring
    {0, 0, 0},         // CollNetDirect
    {0, 0, 0},         // NVLS
    {0, 0, 0},         // NVLSTree
    {8, 8, 8},         // PAT
};
constexpr double kNvlinkLat[kNcclAlgos][kNcclProtos] = {
    {.6, 1.25, 4}, {.6, 1.9, 3.4}, {0, 0, 3.7}, {0, 0, 25}, {0, 0, 25}, {0, 0, 4}};
constexpr double kNetLat[kNcclAlgos][kNcclProtos] = {
    {5, 8.5, 14}, {2.7, 4, 14}, {0, 0, 31}, {0, 0, 18}, {0, 0, 20.9}, {0, 0, 14}};

// Per generation (Volta, Ampere, Hopper, Blackwell), for 1 / 2 / >= 3 nodes.
constexpr double kLlMaxBw[4][3] = {{39, 39, 20.4}, {87.7, 22.5, 19}, {141, 45, 35}, {282, 90, 70}};
constexpr double kPerChRingLL128[4] = {20, 20, 36.7, 40};
constexpr double kPerChTreeLL128[4][3] = {{20, 20, 20}, {20, 20, 20}, {36.7, 36.7, 29}, {55.6, 31.67, 20}};
constexpr double kPerChTree[4][3] = {{26.5, 18.5, 10}, {24, 23.6, 17.8}, {38.7, 41.4, 36}, {70, 42.8, 24}};
constexpr double kPerChNvlsTree[4][3] = {{0, 0, 0}, {0, 0, 0}, {0, 57.7, 45.5}, {0, 96, 80}};
constexpr double kNvlsEfficiency[4] = {0, 0, 0.85, 0.74};

// Tree correction factors by log2(bytes / 64), from 64 B; 1 beyond the list.
constexpr double kTreeCorrLL[] = {1, 1, 1, 1, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1};
constexpr double kTreeCorrLL128[] = {1, 1, 1, 1, 1, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1};
constexpr double kTreeCorrSimple[] = {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5,
                                      .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9};

// Channel/thread reduction for small messages (src/enqueue.cc): threads per
// channel and bytes per thread below which NCCL drops channels.
constexpr double kMaxThreads[kNcclProtos] = {512, 640, 512};
constexpr double kThreadThreshold[kNcclProtos] = {8, 8, 64};
constexpr double kCollNetThreshold = 512;
// NCCL's network overhead per ring step on multi-node jobs (Intel CPU hosts;
// 2 us on AMD), x3 for Simple.
constexpr double kNetOverheadUs = 1;

int gen(GpuArch a) {
  switch (a) {
    case GpuArch::Volta: return 0;
    case GpuArch::Hopper: return 2;
    case GpuArch::Blackwell: return 3;
    default: return 1;
  }
}
int nodeIdx(int64_t nodes) { return nodes <= 1 ? 0 : nodes == 2 ? 1 : 2; }
double log2Floor(int64_t x) { return x <= 1 ? 0 : std::floor(std::log2(static_cast<double>(x))); }

double treeCorrection(NcclProto p, double bytes) {
  const int i = bytes < 128 ? 0 : static_cast<int>(std::floor(std::log2(bytes / 64)));
  auto at = [&](const double* t, int len) { return i < len ? t[i] : 1.0; };
  switch (p) {
    case NcclProto::LL: return at(kTreeCorrLL, std::size(kTreeCorrLL));
    case NcclProto::LL128: return at(kTreeCorrLL128, std::size(kTreeCorrLL128));
    default: return at(kTreeCorrSimple, std::size(kTreeCorrSimple));
  }
}

std::string lower(std::string_view s) {
  std::string o(s);
  for (char& ch : o) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return o;
}

bool parseAlgo(std::string_view name, NcclAlgo* out) {
  const std::string s = lower(name);
  if (s == "ring") *out = NcclAlgo::Ring;
  else if (s == "tree") *out = NcclAlgo::Tree;
  else if (s == "nvls") *out = NcclAlgo::Nvls;
  else if (s == "nvlstree" || s == "nvls_tree") *out = NcclAlgo::NvlsTree;
  else if (s == "collnet" || s == "collnetdirect" || s == "collnet_direct") *out = NcclAlgo::CollNetDirect;
  else if (s == "pat") *out = NcclAlgo::Pat;
  else return false;
  return true;
}
bool parseProto(std::string_view name, NcclProto* out) {
  const std::string s = lower(name);
  if (s == "ll") *out = NcclProto::LL;
  else if (s == "ll128") *out = NcclProto::LL128;
  else if (s == "simple") *out = NcclProto::Simple;
  else return false;
  return true;
}
// "nccl:ring/LL128" -> algorithm and optional protocol.
bool splitName(std::string_view text, NcclAlgo* a, NcclProto* p, bool* has_proto) {
  if (text.substr(0, 5) == "nccl:") text.remove_prefix(5);
  const size_t slash = text.find('/');
  *has_proto = slash != std::string_view::npos;
  if (!parseAlgo(text.substr(0, slash), a)) return false;
  return !*has_proto || parseProto(text.substr(slash + 1), p);
}

// One (algorithm, protocol) on one shape, or nothing when NCCL would not run it.
bool price(const NcclShape& s, NcclAlgo a, NcclProto p, NcclCost* out) {
  const Collective c = s.coll;
  const bool ar = c == Collective::AllReduce, agrs = c == Collective::AllGather || c == Collective::ReduceScatter;
  const int g = gen(s.arch), ni = nodeIdx(s.nodes);
  const double inf = std::numeric_limits<double>::infinity();
  const double n = static_cast<double>(s.n), ppn = static_cast<double>(s.ppn), S = s.bytes;
  const double nch = kNcclChannels;
  // The links a ring-like algorithm runs on: NVLink inside a node, the
  // group's NICs between nodes, and where edges cross the leaf tier the
  // busiest leaf's uplinks; the slowest sets the bus bandwidth.  An edge
  // between nodes moves E bytes through a NIC (at net_bw) and, when it
  // leaves a leaf, through that leaf's uplinks, which the `cross` edges
  // leaving the busiest leaf share: per edge leaf_up_bw / cross
  // (docs/simulator.md, "Congestion that follows the traffic").
  // `per_edge` = NIC bytes per byte an edge puts on the uplinks.
  auto upRate = [&](double cross, double per_edge) {
    return s.leaf_up_bw > 0 && cross > 0 ? s.leaf_up_bw * per_edge / cross : inf;
  };
  const double intra = s.ppn > 1 ? s.nvl_bw : inf, nic = s.nodes > 1 ? s.net_bw : inf;
  // Ring: an edge's bytes go through one NIC and, crossing, once up and once down.
  const double ring_up = s.nodes > 1 ? upRate(s.ring_cross, 1) : inf;
  const double inter = std::min(nic, ring_up);
  const double bus = std::min(intra, inter);
  auto name3 = [&](double in, double n_ic, double up) -> std::string {
    if (in <= n_ic && in <= up) return s.intra_tier;
    return n_ic <= up ? "nic (node->leaf)" : s.up_tier;
  };
  const std::string link = name3(intra, nic, ring_up);
  double nsteps = ar ? 2 * (n - 1) : (c == Collective::Broadcast || c == Collective::Reduce) ? n : n - 1;
  double t_bw = 0, lat = 0, thr = kThreadThreshold[static_cast<int>(p)];
  std::string bottleneck = link;
  const bool simple = p == NcclProto::Simple;
  switch (a) {
    case NcclAlgo::Ring: {
      if (!(ar || agrs || c == Collective::Broadcast || c == Collective::Reduce)) return false;
      double bw = bus;
      if (p == NcclProto::LL) {
        bw = std::min(kLlMaxBw[g][ni] * 1e9, 0.5 * bus);
        thr *= n;
      } else if (p == NcclProto::LL128) {
        bw = std::min(0.92 * bus, nch * kPerChRingLL128[g] * 1e9);
      }
      if (bw < (p == NcclProto::Simple ? bus : p == NcclProto::LL ? 0.5 * bus : 0.92 * bus)) bottleneck = "protocol cap";
      t_bw = S * nsteps / n / bw;
      const double n_inter = s.nodes > 1 ? (ar ? 2.0 : 1.0) * static_cast<double>(s.nodes - 1) : 0;
      double intra_lat = kNvlinkLat[1][static_cast<int>(p)];
      if (s.nodes > 1) intra_lat = std::max(intra_lat, kNetOverheadUs * (simple ? 3 : 1));
      const double inter_lat = kNetLat[s.ppn == 1 ? 0 : 1][static_cast<int>(p)];
      lat = kBaseLat[1][static_cast<int>(p)] + (nsteps - n_inter) * intra_lat + n_inter * inter_lat;
      if (ar && simple && s.nodes > 1 && S / (nch * n) >= 64) lat *= s.arch == GpuArch::Volta ? 1.9 : 1.4;
      break;
    }
    case NcclAlgo::Tree: {
      if (!ar) return false;
      // A node's NICs carry 2S each way (up and down both trees); a tree edge
      // crossing the leaf tier puts S/2 on its uplinks and S/2 on its
      // downlinks: per edge the uplinks serve 4 leaf_up_bw / cross in NIC terms.
      const double tree_up = s.nodes > 1 ? upRate(s.tree_cross, 4) : inf;
      const double tbus = std::min({intra, nic, tree_up});
      bottleneck = name3(intra, nic, tree_up);
      double bw = 0;
      if (p == NcclProto::Simple) bw = std::min(0.92 * tbus, nch * kPerChTree[g][ni] * 1e9);
      else if (p == NcclProto::LL) bw = std::min(tbus / 3.8, kLlMaxBw[g][ni] * 1e9);
      else bw = std::min(tbus * (s.nodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0), nch * kPerChTreeLL128[g][ni] * 1e9);
      bw *= treeCorrection(p, S);
      t_bw = 2 * S / bw;  // up the tree and down again: algbw = bus / 2
      lat = kBaseLat[0][static_cast<int>(p)] +
            2 * ((ppn - 1) * kNvlinkLat[0][static_cast<int>(p)] + log2Floor(s.nodes) * kNetLat[0][static_cast<int>(p)]);
      break;
    }
    case NcclAlgo::Nvls:
    case NcclAlgo::NvlsTree: {
      const bool multi = a == NcclAlgo::NvlsTree;
      if (!simple || !s.nvls || s.ppn < 2 || kNvlsEfficiency[g] == 0) return false;
      if (multi ? !(ar && s.nodes > 1) : !((ar || agrs) && s.nodes == 1)) return false;
      // Bytes one GPU moves through its NVLink ports, busier direction:
      // allreduce = the multimem reduce-load of its 1/ppn slice (the switch
      // reads the slice from all ppn GPUs: S out per GPU) and the multicast
      // store of the result (S/ppn out, S in): S (ppn + 1) / ppn;
      // reduce-scatter: S out; all-gather: S in (the multicast brings every
      // rank's share, its own included).  At NCCL's NVLS efficiency.
      const double per_gpu = ar ? S * (ppn + 1) / ppn : S;
      const double t_link = per_gpu / (s.nvl_bw * kNvlsEfficiency[g]);
      // The switch adds (ppn - 1) x S / 4 fp32 values (nccl-tests' float).
      const double t_red = (ar || c == Collective::ReduceScatter) && s.nvls_reduce > 0
                               ? (ppn - 1) * S / 4 / s.nvls_reduce : 0;
      t_bw = std::max(t_link, t_red);
      bottleneck = t_red > t_link ? "nvswitch reduction" : s.intra_tier;
      lat = kNvlinkLat[3][2];
      if (multi) {
        // Between nodes a tree over the nodes' reduced buffers: on 2 nodes
        // each sends S and receives S (one direction each), beyond that
        // interior nodes send S up and S down.
        const double t_nic = (s.nodes == 2 ? 1.0 : 2.0) * S / s.net_bw;
        // Each tree edge crossing the leaf tier: S/2 each way (two trees).
        const double t_up = s.leaf_up_bw > 0 ? s.tree_cross * S / 2 / s.leaf_up_bw : 0;
        const double t_net = std::max(t_nic, t_up);
        const double cap = nch * kPerChNvlsTree[g][ni] * 1e9;
        const double t_cap = cap > 0 ? S * nsteps / n / cap : 0;
        if (t_net > t_bw) t_bw = t_net, bottleneck = t_up > t_nic ? s.up_tier : "nic (node->leaf)";
        if (t_cap > t_bw) t_bw = t_cap, bottleneck = "protocol cap";
        lat = kNvlinkLat[4][2] + 2 * log2Floor(s.nodes) * kNetLat[4][2];
      }
      break;
    }
    case NcclAlgo::CollNetDirect: {
      // IB SHARP: inside the node a direct reduce-scatter / all-gather over
      // NVLink; each GPU sends its S/ppn share into the switch tree and gets
      // the reduced share back.  NCCL: only up to 8 local ranks.
      if (!simple || !s.sharp || !ar || s.nodes < 2 || s.ppn > 8) return false;
      thr = kCollNetThreshold;
      const double t_intra = s.ppn > 1 ? 2 * (ppn - 1) / ppn * S / s.nvl_bw : 0;
      const double t_nic = S / (s.net_bw * (g >= 2 ? 0.85 : 1.0));
      // The leaf's switch reduces its nodes' shares: one reduced S per group
      // goes up to the spine and one result comes down.
      const double t_up = s.leaf_up_bw > 0 ? s.collnet_cross * S / s.leaf_up_bw : 0;
      const double t_net = std::max(t_nic, t_up);
      t_bw = std::max(t_intra, t_net);
      bottleneck = t_net >= t_intra ? (t_up > t_nic ? s.up_tier : "nic (node->leaf)") : s.intra_tier;
      lat = 2 * (std::min(1.0, ppn - 1) * kNvlinkLat[2][2] + 0.4 * (ppn - 1)) + kNetLat[2][2];
      break;
    }
    case NcclAlgo::Pat: {
      if (!simple || !agrs || s.ppn != 1 || s.nodes < 2) return false;
      t_bw = S / (0.75 * std::min(intra, nic));  // not converted: AG/RS on a non-ring algorithm
      bottleneck = "nic (node->leaf)";
      // Priced as a direct exchange at the leaf tier (each rank's S/n share
      // to or from every other rank crosses once): an upper bound on PAT's
      // crossings, which forward some shares inside the leaf.
      if (s.leaf_up_bw > 0 && s.direct_cross * S / s.leaf_up_bw > t_bw)
        t_bw = s.direct_cross * S / s.leaf_up_bw, bottleneck = s.up_tier;
      lat = kBaseLat[5][2] + log2Floor(s.nodes) * kNetLat[5][2] / 3.5 + 2.8 * n;
      break;
    }
  }
  // Small messages run on fewer channels (and threads): below
  // channels x threads x threshold bytes the bandwidth term stops shrinking.
  const double full = nch * kMaxThreads[static_cast<int>(p)] * thr;
  const double frac = std::clamp(S / full, 1.0 / (4 * nch), 1.0);
  out->tuner_s = lat * 1e-6 + t_bw;
  t_bw /= frac;
  out->algo = a;
  out->proto = p;
  out->latency_s = lat * 1e-6;
  out->time_s = out->latency_s + t_bw;
  out->channels = static_cast<int>(std::max(1.0, std::ceil(frac * nch)));
  out->bottleneck = out->latency_s * 2 > out->time_s ? "latency" : bottleneck;
  return true;
}

}  // namespace

Result<Library> parseLibrary(std::string_view text) {
  if (text == "nccl") return Library::Nccl;
  if (text == "chorus") return Library::Chorus;
  if (text == "auto") return Library::Auto;
  return invalidArgument("--library '{}' is not one of nccl, chorus, auto", text);
}

std::string_view libraryName(Library l) {
  switch (l) {
    case Library::Nccl: return "nccl";
    case Library::Chorus: return "chorus";
    case Library::Auto: return "auto";
  }
  return "?";
}

GpuArch gpuArch(const GpuSpec& g) {
  const std::string a = lower(g.arch.empty() ? g.name : g.arch);
  if (a == "volta" || a.find("v100") != std::string::npos) return GpuArch::Volta;
  if (a == "ampere" || a.find("a100") != std::string::npos || a.find("a800") != std::string::npos) return GpuArch::Ampere;
  if (a == "hopper" || a.find("h100") != std::string::npos || a.find("h800") != std::string::npos ||
      a.find("h200") != std::string::npos || a.find("h20") != std::string::npos)
    return GpuArch::Hopper;
  if (a == "blackwell" || a.find("b200") != std::string::npos || a.find("b100") != std::string::npos ||
      a.find("b300") != std::string::npos)
    return GpuArch::Blackwell;
  return GpuArch::Other;
}

std::string_view ncclAlgoName(NcclAlgo a) {
  switch (a) {
    case NcclAlgo::Tree: return "Tree";
    case NcclAlgo::Ring: return "Ring";
    case NcclAlgo::CollNetDirect: return "CollNetDirect";
    case NcclAlgo::Nvls: return "NVLS";
    case NcclAlgo::NvlsTree: return "NVLSTree";
    case NcclAlgo::Pat: return "PAT";
  }
  return "?";
}
std::string_view ncclProtoName(NcclProto p) {
  switch (p) {
    case NcclProto::LL: return "LL";
    case NcclProto::LL128: return "LL128";
    case NcclProto::Simple: return "Simple";
  }
  return "?";
}
std::string NcclCost::name() const { return fmt::format("{}/{}", ncclAlgoName(algo), ncclProtoName(proto)); }

bool ncclHasAlgorithms(Collective c) {
  return c == Collective::AllReduce || c == Collective::AllGather || c == Collective::ReduceScatter ||
         c == Collective::Broadcast || c == Collective::Reduce;
}

std::vector<NcclCost> ncclCandidates(const NcclShape& s) {
  std::vector<NcclCost> out;
  if (s.n < 2 || !ncclHasAlgorithms(s.coll)) return out;
  for (int a = 0; a < kNcclAlgos; ++a)
    for (int p = 0; p < kNcclProtos; ++p) {
      NcclCost c;
      if (price(s, static_cast<NcclAlgo>(a), static_cast<NcclProto>(p), &c)) out.push_back(std::move(c));
    }
  return out;
}

bool isNcclAlgoName(std::string_view algo) {
  NcclAlgo a;
  NcclProto p;
  bool hp = false;
  return splitName(algo, &a, &p, &hp);
}

Result<NcclCost> ncclPick(const NcclShape& s, std::string_view algo) {
  bool any = algo.empty() || algo == "auto" || algo == "nccl:auto", has_proto = false;
  NcclAlgo want_a = NcclAlgo::Ring;
  NcclProto want_p = NcclProto::Simple;
  if (!any && !splitName(algo, &want_a, &want_p, &has_proto))
    return invalidArgument("--algo '{}' is not an NCCL algorithm (ring, tree, nvls, nvlstree, collnet, pat, "
                           "optionally /LL, /LL128 or /Simple)", algo);
  const std::vector<NcclCost> all = ncclCandidates(s);
  const NcclCost* best = nullptr;
  std::string avail;
  for (const NcclCost& c : all) {
    avail += " " + c.name();
    if (!any && (c.algo != want_a || (has_proto && c.proto != want_p))) continue;
    if (!best || c.tuner_s < best->tuner_s) best = &c;
  }
  if (!best)
    return invalidArgument("NCCL {} '{}' does not apply to {} ranks ({} per node on {} nodes{}); available:{}",
                           plan::collectiveName(s.coll), any ? "auto" : algo, s.n, s.ppn, s.nodes,
                           s.nvls ? ", NVLS" : "", avail.empty() ? " none" : avail);
  return *best;
}

}  // namespace chorus::sim
