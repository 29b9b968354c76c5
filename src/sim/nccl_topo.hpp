// NCCL's topology XML (the format of NCCL_TOPO_FILE / NCCL_TOPO_DUMP_FILE,
// and RCCL's, which spells AMD's xGMI links <xgmi>) read as a node
// description: chorus-sim --node-topo FILE.xml.  What is derived and how, what
// comes from the base cluster file and what is refused: docs/simulator.md,
// "Node descriptions from NCCL topology files".  Reading uses the bounded
// reader of common/xml.hpp; every error names the file, the line, the element
// and, where one is at fault, the attribute.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.hpp"
#include "sim/config.hpp"

namespace chorus::sim {

// One GPU generation's scale-up link: its rate per link and direction.
struct LinkGeneration {
  std::string_view vendor;    // "nvidia" (keyed by sm) or "amd" (keyed by gcn)
  std::string_view key;       // "90", "gfx942", ...
  std::string_view name;      // "H100 (Hopper), NVLink 4"
  double gbyte_s_per_link;    // per direction
  std::string_view source;    // the published specification it comes from
};
const std::vector<LinkGeneration>& linkGenerations();

// A PCIe link_speed ("16.0 GT/s PCIe", "8 GT/s") as GB/s per lane and
// direction after line encoding (Gen1-5); 0 when the text is not one of them.
double pcieLaneGbyteS(std::string_view link_speed);

struct NodeTopoNet {
  std::string name;
  int dev = -1;
  double gbit_s = 0;          // speed / 1000
  int port = -1;              // -1: not given
  double latency_us = -1;     // -1: not given
  double pcie_gbyte_s = 0;    // bottleneck of its PCIe path (0: none on the path)
  bool used = false;          // counted in nics_per_node (the fastest NICs)
  std::vector<int> gpus;      // devs of the GPUs for which it is the nearest NIC in the tree
};

struct NodeTopo {
  int gpus = 0;
  std::string vendor;          // nvidia or amd
  std::string generation;      // the table row's name, or "" when no link needed it
  std::string link_element;    // "nvlink", "xgmi" or "" (no links)
  int links_min = 0, links_max = 0;  // sum of link counts per GPU, over the GPUs
  double link_gbyte_s = 0;     // per link, per direction (0: no links)
  double scaleup_gbyte_s = 0;  // per GPU, per direction: links_min x link rate, or the PCIe bottleneck
  bool via_pcie = false;       // no links: GPUs reach each other over PCIe
  // A mesh: every link's target is another GPU of the file (its <pci>
  // busid), and every pair of GPUs has links or a GPU linked to both
  // (NodeSpec::mesh).  pair_links_min/max: links per linked ordered pair
  // (0: not a mesh); unlinked_pairs: ordered pairs without a link (a partial
  // mesh).  pair_links: links per ordered pair by <gpu> element order,
  // row-major (NodeSpec::pair_links), set when the pairs differ (a partial
  // or uneven mesh), empty for a mesh of equal pairs.  mesh_note: why a node
  // with links is not a mesh ("" when it is).
  bool mesh = false;
  int pair_links_min = 0, pair_links_max = 0, unlinked_pairs = 0;
  std::vector<int> pair_links;
  std::string mesh_note;
  std::vector<NodeTopoNet> nets;
  int nics = 0;                // the fastest nets
  double nic_gbit_s = 0;       // their speed, capped by their PCIe path
  double nic_latency_us = -1;  // largest latency given (-1: none given or all 0)
  int gpus_per_nic = 0;        // most GPUs nearest to one used NIC (0: no NIC)
};

// `origin` names the file in errors.
Result<NodeTopo> parseNodeTopo(std::string_view xml, std::string_view origin);
Result<NodeTopo> loadNodeTopo(const std::string& path);

// `base` with the fields the topology gives replaced; `report` (if given)
// receives one line per field saying where its value came from.
ClusterSpec applyNodeTopo(const ClusterSpec& base, const NodeTopo& t, std::string_view origin,
                          std::vector<std::string>* report = nullptr);

}  // namespace chorus::sim
