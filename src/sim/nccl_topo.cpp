// NCCL topology XML as a node description (nccl_topo.hpp).  The document is
// read by common/xml.hpp, then checked element by element against the shape
// NCCL's dumps have (system > cpu > pci* > gpu | nic > net; gpu > nvlink |
// xgmi), and the node's figures are computed from the attributes the
// simulator needs.  No NCCL or RCCL code is used; the per-link rates are the
// vendors' published figures (the table below, cited in docs/simulator.md).
#include "sim/nccl_topo.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "common/xml.hpp"

namespace chorus::sim {

const std::vector<LinkGeneration>& linkGenerations() {
  // Per link and direction.  NVIDIA states NVLink totals per GPU in both
  // directions (V100 300 GB/s over 6 links, A100 600 GB/s over 12, H100
  // 900 GB/s over 18, B200 1.8 TB/s over 18): 25, 25, 25, 50 GB/s each way.
  // AMD states a peak per Infinity Fabric link, both directions together
  // (MI100 92 GB/s, MI250X 100 GB/s, MI300X 128 GB/s): half of it each way.
  static const std::vector<LinkGeneration> kTable = {
      {"nvidia", "70", "V100 (Volta), NVLink 2", 25, "NVIDIA Tesla V100 datasheet: 300 GB/s NVLink, 6 links"},
      {"nvidia", "80", "A100 (Ampere), NVLink 3", 25, "NVIDIA A100 datasheet: 600 GB/s NVLink, 12 links"},
      {"nvidia", "90", "H100 (Hopper), NVLink 4", 25, "NVIDIA H100 datasheet: 900 GB/s NVLink, 18 links"},
      {"nvidia", "100", "B200 (Blackwell), NVLink 5", 50, "NVIDIA DGX B200 / HGX B200 spec: 1.8 TB/s NVLink per GPU, 18 links"},
      {"amd", "gfx908", "MI100 (CDNA), Infinity Fabric", 46, "AMD Instinct MI100 datasheet: 3 links, 92 GB/s peak per link"},
      {"amd", "gfx90a", "MI250X / MI250 (CDNA 2), Infinity Fabric", 50,
       "AMD Instinct MI250X datasheet: 8 links, 100 GB/s peak per link"},
      {"amd", "gfx942", "MI300X (CDNA 3), Infinity Fabric", 64,
       "AMD Instinct MI300X datasheet: 7 links, 128 GB/s peak per link"},
  };
  return kTable;
}

double pcieLaneGbyteS(std::string_view s) {
  // "<number> GT/s" with an optional " PCIe" after it.
  size_t i = 0;
  while (i < s.size() && ((s[i] >= '0' && s[i] <= '9') || s[i] == '.')) ++i;
  double gt = 0;
  const auto r = std::from_chars(s.data(), s.data() + i, gt);
  if (i == 0 || r.ec != std::errc() || r.ptr != s.data() + i) return 0;
  const std::string_view rest = s.substr(i);
  if (rest != " GT/s" && rest != " GT/s PCIe") return 0;
  // Per lane and direction after line encoding (PCI-SIG base specifications):
  // Gen1/2 8b/10b, Gen3-5 128b/130b.
  if (gt == 2.5) return 2.5 * 8 / 10 / 8;
  if (gt == 5) return 5.0 * 8 / 10 / 8;
  if (gt == 8 || gt == 16 || gt == 32) return gt * 128 / 130 / 8;
  return 0;
}

namespace {

struct Node {
  const XmlElement* e;
  int parent;  // index, -1 for the root
  int depth;
};

class Reader {
 public:
  explicit Reader(std::string_view origin) : origin_(origin) {}

  Result<NodeTopo> run(const XmlElement& root) {
    if (root.name != "system")
      return fail(root, fmt::format("the root element is <{}>: a topology file's root is <system>", xmlShown(root.name)));
    CHORUS_RETURN_IF_ERROR(walk(root, -1, 0));
    CHORUS_RETURN_IF_ERROR(readGpus());
    CHORUS_RETURN_IF_ERROR(readNets());
    return t_;
  }

 private:
  Status fail(const XmlElement& e, std::string what) const {
    return invalidArgument("{}:{}: <{}>: {}", origin_, e.line, xmlShown(e.name), what);
  }
  Status failAttr(const XmlElement& e, const XmlAttribute& a, std::string what) const {
    return invalidArgument("{}:{}: <{}> attribute '{}' = '{}': {}", origin_, a.line, xmlShown(e.name), xmlShown(a.name),
                           xmlShown(a.value), what);
  }

  // Allowed parents of each element NCCL writes.
  Status walk(const XmlElement& e, int parent, int depth) {
    static const std::map<std::string, std::vector<std::string>, std::less<>> kParents = {
        {"system", {}},         {"cpu", {"system"}},           {"pci", {"cpu", "pci"}},
        {"gpu", {"pci"}},       {"nic", {"cpu", "pci"}},       {"net", {"nic"}},
        {"nvlink", {"gpu"}},    {"xgmi", {"gpu"}},             {"c2c", {"gpu"}},
    };
    const auto it = kParents.find(e.name);
    if (it == kParents.end())
      return fail(e, "not an element of NCCL's topology format (system, cpu, pci, gpu, nvlink, xgmi, c2c, nic, net)");
    if (parent >= 0) {
      const std::string& p = nodes_[static_cast<size_t>(parent)].e->name;
      if (std::find(it->second.begin(), it->second.end(), p) == it->second.end()) {
        std::string allowed;
        for (const std::string& a : it->second) allowed += (allowed.empty() ? "<" : ", <") + a + ">";
        return fail(e, fmt::format("inside <{}>: it belongs inside {}", p, allowed.empty() ? "nothing" : allowed));
      }
    } else if (!it->second.empty()) {
      return fail(e, "is the root: a topology file's root is <system>");
    }
    const int self = static_cast<int>(nodes_.size());
    nodes_.push_back({&e, parent, depth});
    for (const XmlElement& c : e.children) CHORUS_RETURN_IF_ERROR(walk(c, self, depth + 1));
    return {};
  }

  Result<const XmlAttribute*> need(const XmlElement& e, std::string_view attr, std::string_view why) const {
    const XmlAttribute* a = e.find(attr);
    if (!a) return fail(e, fmt::format("attribute '{}' missing ({})", attr, why));
    return a;
  }
  Result<int64_t> integer(const XmlElement& e, const XmlAttribute& a, int64_t lo, int64_t hi) const {
    int64_t v = 0;
    const std::string& s = a.value;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size())
      return failAttr(e, a, "not a whole number");
    if (v < lo || v > hi) return failAttr(e, a, fmt::format("must be in [{}, {}]", lo, hi));
    return v;
  }
  Result<double> number(const XmlElement& e, const XmlAttribute& a, double lo, double hi) const {
    double v = 0;
    const std::string& s = a.value;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size() || !std::isfinite(v))
      return failAttr(e, a, "not a number");
    if (v < lo || v > hi) return failAttr(e, a, fmt::format("must be in [{}, {}]", lo, hi));
    return v;
  }

  // The bottleneck (GB/s per direction) of the PCIe links of the pci
  // elements from `from` up to, not including, `stop` (-1: to the root);
  // 0 when none on the way states its link.  A pci element's link_speed and
  // link_width describe the link to its parent.
  Result<double> pcieUp(int from, int stop) const {
    double bw = 0;
    for (int i = from; i >= 0 && i != stop; i = nodes_[static_cast<size_t>(i)].parent) {
      const XmlElement& e = *nodes_[static_cast<size_t>(i)].e;
      if (e.name != "pci") continue;
      const XmlAttribute* sp = e.find("link_speed");
      const XmlAttribute* wd = e.find("link_width");
      if (!sp && !wd) continue;
      if (!sp || !wd) return fail(e, fmt::format("attribute '{}' missing (its '{}' is given)", sp ? "link_width" : "link_speed",
                                                  sp ? "link_speed" : "link_width"));
      const double lane = pcieLaneGbyteS(sp->value);
      if (lane <= 0)
        return failAttr(e, *sp, "not a PCIe rate this reader knows (2.5, 5, 8, 16 or 32 GT/s, optionally followed by ' PCIe')");
      CHORUS_ASSIGN_OR_RETURN(int64_t w, integer(e, *wd, 1, 32));
      const double link = lane * static_cast<double>(w);
      bw = bw == 0 ? link : std::min(bw, link);
    }
    return bw;
  }
  int lca(int a, int b) const {
    while (nodes_[static_cast<size_t>(a)].depth > nodes_[static_cast<size_t>(b)].depth) a = nodes_[static_cast<size_t>(a)].parent;
    while (nodes_[static_cast<size_t>(b)].depth > nodes_[static_cast<size_t>(a)].depth) b = nodes_[static_cast<size_t>(b)].parent;
    while (a != b) {
      a = nodes_[static_cast<size_t>(a)].parent;
      b = nodes_[static_cast<size_t>(b)].parent;
    }
    return a;
  }
  Result<double> pciePath(int a, int b) const {
    const int l = lca(a, b);
    CHORUS_ASSIGN_OR_RETURN(double x, pcieUp(a, l));
    CHORUS_ASSIGN_OR_RETURN(double y, pcieUp(b, l));
    return x == 0 ? y : y == 0 ? x : std::min(x, y);
  }

  Status readGpus() {
    const XmlElement* first = nullptr;
    std::string key;
    std::vector<int> links;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      const XmlElement& e = *nodes_[i].e;
      if (e.name != "gpu") continue;
      gpu_nodes_.push_back(static_cast<int>(i));
      int dev = static_cast<int>(gpu_nodes_.size()) - 1;
      if (const XmlAttribute* d = e.find("dev")) {
        CHORUS_ASSIGN_OR_RETURN(int64_t v, integer(e, *d, 0, 1 << 20));
        dev = static_cast<int>(v);
      }
      gpu_devs_.push_back(dev);
      std::string vendor, k;
      const XmlAttribute* gen = nullptr;
      if (const XmlAttribute* g = e.find("gcn")) {  // RCCL: AMD's GPU generation
        vendor = "amd";
        gen = g;
        k = g->value;
        std::transform(k.begin(), k.end(), k.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        if (k.rfind("gfx", 0) != 0) {  // RCCL's numeric spelling: 906, 908, 910 (= gfx90a), 940, 942
          CHORUS_ASSIGN_OR_RETURN(int64_t v, integer(e, *g, 0, 100000));
          k = v == 910 ? "gfx90a" : fmt::format("gfx{}", v);
        }
      } else {
        CHORUS_ASSIGN_OR_RETURN(const XmlAttribute* s, need(e, "sm", "an NVIDIA GPU's compute capability, or 'gcn' for AMD"));
        CHORUS_ASSIGN_OR_RETURN(int64_t v, integer(e, *s, 1, 10000));
        vendor = "nvidia";
        gen = s;
        k = std::to_string(v);
      }
      if (!first) {
        first = &e;
        key = k;
        t_.vendor = vendor;
      } else if (vendor != t_.vendor || k != key) {
        return failAttr(e, *gen, fmt::format("differs from the first GPU's ({} {} at line {}): one node, one GPU generation",
                                             t_.vendor, key, first->line));
      }
      int n = 0;
      std::map<std::string, int> to;  // links by target busid
      for (const XmlElement& c : e.children) {
        if (c.name == "c2c") continue;  // a GPU-CPU link (Grace): not a path between GPUs
        if (t_.link_element.empty()) t_.link_element = c.name;
        CHORUS_ASSIGN_OR_RETURN(const XmlAttribute* cnt, need(c, "count", "the number of links"));
        CHORUS_ASSIGN_OR_RETURN(int64_t v, integer(c, *cnt, 1, 1024));
        n += static_cast<int>(v);
        const XmlAttribute* tg = c.find("target");
        to[tg ? lowerCase(tg->value) : std::string()] += static_cast<int>(v);
      }
      links.push_back(n);
      link_targets_.push_back(std::move(to));
    }
    if (gpu_nodes_.empty())
      return invalidArgument("{}:{}: <system>: no <gpu> element: a node description needs at least one GPU", origin_,
                             nodes_[0].e->line);
    t_.gpus = static_cast<int>(gpu_nodes_.size());
    t_.links_min = *std::min_element(links.begin(), links.end());
    t_.links_max = *std::max_element(links.begin(), links.end());
    if (t_.links_max > 0) {
      const LinkGeneration* row = nullptr;
      std::string known;
      for (const LinkGeneration& g : linkGenerations()) {
        if (g.vendor == t_.vendor && g.key == key) row = &g;
        if (g.vendor == t_.vendor) known += fmt::format("{}{}", known.empty() ? "" : ", ", g.key);
      }
      const XmlAttribute* gen = first->find(t_.vendor == "amd" ? "gcn" : "sm");
      if (!row)
        return failAttr(*first, *gen,
                        fmt::format("{} GPU generation '{}' has <{}> links but no known per-link rate (known: {}); "
                                    "write the node in a cluster file instead",
                                    t_.vendor, key, t_.link_element, known));
      t_.generation = std::string(row->name);
      t_.link_gbyte_s = row->gbyte_s_per_link;
    }
    // Per GPU: its links, or its PCIe path to the root when it has none.
    for (size_t g = 0; g < gpu_nodes_.size(); ++g) {
      double bw = links[g] * t_.link_gbyte_s;
      if (links[g] == 0) {
        t_.via_pcie = true;
        CHORUS_ASSIGN_OR_RETURN(bw, pcieUp(gpu_nodes_[g], -1));
        if (bw <= 0)
          return fail(*nodes_[static_cast<size_t>(gpu_nodes_[g])].e,
                      "no <nvlink>/<xgmi> links and no <pci> link_speed/link_width above it: its bandwidth to the "
                      "other GPUs is unknown");
      }
      t_.scaleup_gbyte_s = g == 0 ? bw : std::min(t_.scaleup_gbyte_s, bw);
    }
    if (t_.links_max > 0) readMesh();
    return {};
  }

  // A mesh when every link of every GPU targets another GPU of the file (by
  // the busid of the <pci> the GPU sits in; NVSwitches and CPUs are other
  // targets) and every pair has links or a GPU linked to both (a partial
  // mesh: RCCL's MI250X and 6-link MI100 models); the pair's rate is its
  // link count x the generation's per-link rate.
  void readMesh() {
    std::map<std::string, size_t> gpu_of;  // busid -> GPU index
    for (size_t g = 0; g < gpu_nodes_.size(); ++g) {
      const int p = nodes_[static_cast<size_t>(gpu_nodes_[g])].parent;
      if (p < 0) continue;
      if (const XmlAttribute* b = nodes_[static_cast<size_t>(p)].e->find("busid")) gpu_of[lowerCase(b->value)] = g;
    }
    const size_t n = gpu_nodes_.size();
    std::vector<int> pair(n * n, 0);
    for (size_t g = 0; g < n; ++g) {
      for (const auto& [target, count] : link_targets_[g]) {
        const auto it = gpu_of.find(target);
        if (it == gpu_of.end() || it->second == g) {
          t_.mesh_note = fmt::format("GPU {}'s <{}> links go to '{}', not another GPU of the file (a switch): "
                                     "modelled as a switch", gpu_devs_[g], t_.link_element,
                                     target.empty() ? "(no target)" : target);
          return;
        }
        pair[g * n + it->second] += count;
      }
    }
    int lo = 0, hi = 0, unlinked = 0;
    const bool small = n <= static_cast<size_t>(NodeSpec::kMaxPartialMeshGpus);
    for (size_t a = 0; a < n; ++a)
      for (size_t b = 0; b < n; ++b) {
        if (a == b) continue;
        const int k = pair[a * n + b];
        if (k == 0) {
          ++unlinked;
          bool relay = false;  // a GPU linked to both (not searched on nodes too large to route)
          for (size_t m = 0; m < n && !relay && small; ++m) relay = m != a && m != b && pair[a * n + m] > 0 && pair[m * n + b] > 0;
          if (!relay && !small) {
            t_.mesh_note = fmt::format("GPU-to-GPU <{}> links, but GPUs {} and {} have none, on a node of {} GPUs (a "
                                       "partial mesh is modelled up to {} GPUs): modelled as a switch at the GPU's "
                                       "links, optimistic for pairs that share or lack links", t_.link_element,
                                       gpu_devs_[a], gpu_devs_[b], n, NodeSpec::kMaxPartialMeshGpus);
            return;
          }
          if (!relay) {
            t_.mesh_note = fmt::format("GPU-to-GPU <{}> links, but GPUs {} and {} have none and no GPU is linked to "
                                       "both (the simulator routes a pair over at most one other GPU): modelled as a "
                                       "switch at the GPU's links, optimistic for pairs that share or lack links",
                                       t_.link_element, gpu_devs_[a], gpu_devs_[b]);
            return;
          }
          continue;
        }
        lo = lo == 0 ? k : std::min(lo, k);
        hi = std::max(hi, k);
      }
    t_.mesh = n > 1;
    t_.pair_links_min = lo;
    t_.pair_links_max = hi;
    t_.unlinked_pairs = unlinked;
    // Uneven pairs beyond the per-pair limit: the fewest-linked pair's rate
    // for all (the report says so).
    if (unlinked > 0 || (lo != hi && small)) t_.pair_links = std::move(pair);
  }
  static std::string lowerCase(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return s;
  }

  Status readNets() {
    std::vector<int> net_nodes;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      const XmlElement& e = *nodes_[i].e;
      if (e.name != "net") continue;
      NodeTopoNet n;
      if (const XmlAttribute* a = e.find("name")) n.name = a->value;
      if (const XmlAttribute* a = e.find("dev")) {
        CHORUS_ASSIGN_OR_RETURN(int64_t v, integer(e, *a, 0, 1 << 20));
        n.dev = static_cast<int>(v);
      }
      CHORUS_ASSIGN_OR_RETURN(const XmlAttribute* sp, need(e, "speed", "the NIC's line rate in Mbit/s"));
      CHORUS_ASSIGN_OR_RETURN(double mbit, number(e, *sp, 1, 1e8));
      n.gbit_s = mbit / 1000;
      if (const XmlAttribute* a = e.find("port")) {
        CHORUS_ASSIGN_OR_RETURN(int64_t v, integer(e, *a, 0, 1 << 16));
        n.port = static_cast<int>(v);
      }
      if (const XmlAttribute* a = e.find("latency")) {
        CHORUS_ASSIGN_OR_RETURN(n.latency_us, number(e, *a, 0, 1e6));
      }
      if (n.name.empty()) n.name = fmt::format("net{}", t_.nets.size());
      t_.nets.push_back(std::move(n));
      net_nodes.push_back(static_cast<int>(i));
    }
    if (t_.nets.empty()) return {};
    double fastest = 0;
    for (const NodeTopoNet& n : t_.nets) fastest = std::max(fastest, n.gbit_s);
    for (NodeTopoNet& n : t_.nets) n.used = n.gbit_s == fastest;
    // Each GPU's nearest used NIC in the tree (fewest hops; among equals the
    // one with the fewest GPUs so far, then the first).
    for (size_t g = 0; g < gpu_nodes_.size(); ++g) {
      int best = -1, best_d = 0;
      for (size_t k = 0; k < t_.nets.size(); ++k) {
        if (!t_.nets[k].used) continue;
        const int a = gpu_nodes_[g], b = net_nodes[k];
        const int d = nodes_[static_cast<size_t>(a)].depth + nodes_[static_cast<size_t>(b)].depth -
                      2 * nodes_[static_cast<size_t>(lca(a, b))].depth;
        if (best < 0 || d < best_d ||
            (d == best_d && t_.nets[k].gpus.size() < t_.nets[static_cast<size_t>(best)].gpus.size())) {
          best = static_cast<int>(k);
          best_d = d;
        }
      }
      t_.nets[static_cast<size_t>(best)].gpus.push_back(gpu_devs_[g]);
    }
    t_.nic_gbit_s = fastest;
    for (size_t k = 0; k < t_.nets.size(); ++k) {
      NodeTopoNet& n = t_.nets[k];
      if (!n.used) continue;
      ++t_.nics;
      t_.gpus_per_nic = std::max(t_.gpus_per_nic, static_cast<int>(n.gpus.size()));
      if (n.latency_us > 0) t_.nic_latency_us = std::max(t_.nic_latency_us, n.latency_us);
      // The PCIe path to its nearest GPU (or to the root when no GPU is nearest).
      int to = -1;
      for (size_t g = 0; g < gpu_nodes_.size() && !n.gpus.empty(); ++g)
        if (gpu_devs_[g] == n.gpus.front()) to = gpu_nodes_[g];
      CHORUS_ASSIGN_OR_RETURN(n.pcie_gbyte_s, to >= 0 ? pciePath(net_nodes[k], to) : pcieUp(net_nodes[k], -1));
      if (n.pcie_gbyte_s > 0) t_.nic_gbit_s = std::min(t_.nic_gbit_s, n.pcie_gbyte_s * 8);
    }
    return {};
  }

  std::string_view origin_;
  std::vector<Node> nodes_;
  std::vector<int> gpu_nodes_, gpu_devs_;
  std::vector<std::map<std::string, int>> link_targets_;  // per GPU: links by target busid ("": no target)
  NodeTopo t_;
};

}  // namespace

Result<NodeTopo> parseNodeTopo(std::string_view xml, std::string_view origin) {
  XmlLimits lim;
  lim.max_bytes = size_t{8} << 20;
  lim.max_depth = 32;  // PCIe switches nest deeper than MSCCL's programs
  CHORUS_ASSIGN_OR_RETURN(XmlElement root, parseXml(xml, origin, lim));
  return Reader(origin).run(root);
}

Result<NodeTopo> loadNodeTopo(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return invalidArgument("--node-topo: cannot open '{}'", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return parseNodeTopo(ss.str(), path);
}

ClusterSpec applyNodeTopo(const ClusterSpec& base, const NodeTopo& t, std::string_view origin,
                          std::vector<std::string>* report) {
  ClusterSpec c = base;
  std::vector<std::string> r;
  c.name = fmt::format("{} (node from {})", base.name, origin);
  c.node.gpus = t.gpus;
  r.push_back(fmt::format("node.gpus = {}: file ({} <gpu> elements, {})", t.gpus, t.gpus, t.vendor));
  c.node.nvlink_bw = gbytePerS(t.scaleup_gbyte_s);
  if (!t.via_pcie)
    r.push_back(fmt::format("node.nvlink_gbyte_s = {:g}: file ({} x {:g} GB/s per link and direction, {}; links per GPU "
                            "{}..{}, the fewest taken)",
                            t.scaleup_gbyte_s, t.links_min, t.link_gbyte_s, t.generation, t.links_min, t.links_max));
  else
    r.push_back(fmt::format("node.nvlink_gbyte_s = {:g}: file (PCIe: the narrowest link_width x link_speed on a GPU's "
                            "path to the CPU{})",
                            t.scaleup_gbyte_s, t.links_max > 0 ? ", some GPUs have no links" : ", no <nvlink>/<xgmi> links"));
  c.node.mesh = t.mesh;
  c.node.peer_bw = gbytePerS(t.mesh ? t.pair_links_min * t.link_gbyte_s : 0);
  c.node.pair_links.clear();
  if (t.mesh && !t.pair_links.empty()) {  // per-pair rates: peer_bw is one link's
    c.node.pair_links = t.pair_links;
    c.node.peer_bw = gbytePerS(t.link_gbyte_s);
    std::string rows;
    for (int a = 0; a < t.gpus; ++a) {
      rows += a == 0 ? "" : "; ";
      for (int b = 0; b < t.gpus; ++b) rows += fmt::format("{}{}", b == 0 ? "" : " ", t.pair_links[static_cast<size_t>(a * t.gpus + b)]);
    }
    r.push_back(fmt::format("node.mesh = on, peer_gbyte_s = {:g} per link, peer_links from the file ({} <{}> links per "
                            "linked GPU pair, {}; no switch; links per pair by <gpu> order: {}){}",
                            t.link_gbyte_s, t.pair_links_min == t.pair_links_max
                                ? fmt::format("{}", t.pair_links_min) : fmt::format("{}..{}", t.pair_links_min, t.pair_links_max),
                            t.link_element, t.generation, rows,
                            t.unlinked_pairs > 0
                                ? fmt::format("; a partial mesh: {} of the {} ordered GPU pairs have no link and go over "
                                              "the GPU linked to both whose narrower link is widest", t.unlinked_pairs,
                                              t.gpus * (t.gpus - 1))
                                : std::string()));
  } else if (t.mesh)
    r.push_back(fmt::format("node.mesh = on, peer_gbyte_s = {:g}: file (every GPU pair joined by its own <{}> links, {} "
                            "per pair{}, {:g} GB/s each; no switch)",
                            t.pair_links_min * t.link_gbyte_s, t.link_element, t.pair_links_min,
                            t.pair_links_max > t.pair_links_min ? fmt::format(" (up to {}: the fewest taken)", t.pair_links_max)
                                                                : std::string(),
                            t.link_gbyte_s));
  else
    r.push_back(fmt::format("node.mesh = off: file ({})", t.mesh_note.empty() ? "no GPU-to-GPU links" : t.mesh_note));
  if (t.vendor == "amd" && c.node.nvls != 0) {  // NVLink SHARP is an NVSwitch feature
    c.node.nvls = 0;
    r.push_back("node.nvls = off: file (AMD GPUs; the base's NVLS setting is for NVSwitch nodes)");
  }
  if (t.nics > 0) {
    c.network.nics_per_node = t.nics;
    c.network.nic_bw = gbitPerS(t.nic_gbit_s);
    std::string ignored;
    for (const NodeTopoNet& n : t.nets)
      if (!n.used) ignored += fmt::format(" {} ({:g} Gbit/s)", n.name, n.gbit_s);
    r.push_back(fmt::format("network.nics_per_node = {}: file (the <net> elements at the fastest speed{}{})", t.nics,
                            ignored.empty() ? "" : "; slower ones not counted:", ignored));
    double fastest = 0;
    for (const NodeTopoNet& n : t.nets) fastest = std::max(fastest, n.gbit_s);
    r.push_back(fmt::format("network.nic_gbit_s = {:g}: file (speed {:g} Mbit/s{})", t.nic_gbit_s, fastest * 1000,
                            t.nic_gbit_s < fastest ? ", capped by the PCIe path to the nearest GPU" : ""));
    if (t.nic_latency_us > 0) {
      c.network.latency = us(t.nic_latency_us);
      r.push_back(fmt::format("network.latency_us = {:g}: file (<net> latency)", t.nic_latency_us));
    } else {
      r.push_back(fmt::format("network.latency_us = {:g}: base (no <net> gives a latency above 0)",
                              base.network.latency.value() * 1e6));
    }
    std::string aff;
    for (const NodeTopoNet& n : t.nets) {
      if (!n.used) continue;
      aff += fmt::format(" {}:", n.name);
      for (int g : n.gpus) aff += fmt::format(" {}", g);
      aff += ";";
    }
    r.push_back(fmt::format("GPUs nearest each NIC (shown, not modelled; at most {} per NIC):{}", t.gpus_per_nic, aff));
  } else {
    r.push_back(fmt::format("network.nics_per_node = {}, nic_gbit_s = {:g}, latency_us = {:g}: base (no <net> element)",
                            base.network.nics_per_node, base.network.nic_bw.value() * 8 / 1e9,
                            base.network.latency.value() * 1e6));
  }
  r.push_back("base: nodes, gpu (name, flops, memory, arch), nvlink_latency_us, nvlink_efficiency, nvls (NVIDIA), and the "
              "network's topology, oversubscription, efficiency, leaf_nodes, sharp");
  if (report) *report = std::move(r);
  return c;
}

}  // namespace chorus::sim
