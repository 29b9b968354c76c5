// NCCL topology XML as chorus-sim's node description (sim/nccl_topo.hpp,
// chorus-sim --node-topo).  The expected figures are worked out here from
// each file's own numbers (GPU elements, link counts, net speeds, PCIe
// link widths and rates) and the vendors' published per-link rates, written
// again below, not taken from the code under test.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "sim/cli.hpp"
#include "sim/config.hpp"
#include "sim/nccl_topo.hpp"
#include "sim/report.hpp"

namespace chorus::sim {
namespace {

const std::string kData = std::string(CHORUS_SOURCE_DIR) + "/tests/data/topo/";
const std::string kCluster = std::string(CHORUS_SOURCE_DIR) + "/configs/clusters/h100-rail.json";

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// What a file says, counted with regular expressions over its text.
struct Counted {
  int gpus = 0;
  std::vector<int> links;  // per GPU: the sum of its link elements' count
  std::string gen;         // gcn (as written) or sm of the first GPU
  std::vector<double> net_mbit;
};
Counted count(const std::string& text) {
  Counted c;
  const std::regex gpu_re(R"re(<gpu\b([^>]*?)(/>|>([\s\S]*?)</gpu>))re");
  const std::regex link_re(R"re(<(nvlink|xgmi)\b[^>]*\bcount="(\d+)")re");
  const std::regex gcn_re(R"re(\bgcn="([^"]*)")re"), sm_re(R"re(\bsm="([^"]*)")re");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), gpu_re); it != std::sregex_iterator(); ++it) {
    ++c.gpus;
    const std::string attrs = (*it)[1], body = (*it)[3];
    std::smatch m;
    if (c.gen.empty()) {
      if (std::regex_search(attrs, m, gcn_re)) c.gen = m[1];
      else if (std::regex_search(attrs, m, sm_re)) c.gen = m[1];
    }
    int n = 0;
    for (auto l = std::sregex_iterator(body.begin(), body.end(), link_re); l != std::sregex_iterator(); ++l)
      n += std::stoi((*l)[2]);
    c.links.push_back(n);
  }
  const std::regex net_re(R"re(<net\b[^>]*\bspeed="(\d+)")re");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), net_re); it != std::sregex_iterator(); ++it)
    c.net_mbit.push_back(std::stod((*it)[1]));
  return c;
}

// Per link and direction, GB/s: half the vendors' per-link (AMD) or
// per-GPU / links (NVIDIA) bidirectional figures.
const std::map<std::string, double> kLinkRate = {
    {"gfx942", 128.0 / 2},  // MI300X: 128 GB/s per Infinity Fabric link
    {"910", 100.0 / 2},     // RCCL's "910" is gfx90a, MI250X: 100 GB/s per link
    {"908", 92.0 / 2},      // MI100: 92 GB/s per link
    {"90", 900.0 / 18 / 2},  // H100: 900 GB/s over 18 NVLink links
};
// PCIe per lane and direction, GB/s: Gen1/2 8b/10b, Gen3+ 128b/130b.
double lane(double gts) { return gts >= 8 ? gts * 128 / 130 / 8 : gts * 8 / 10 / 8; }

struct RealFile {
  std::string name;
  double nic_cap_gbit;  // the PCIe cap on the NICs, worked out from the file by hand (0: none below the line rate)
};

class RealTopo : public ::testing::TestWithParam<RealFile> {};

TEST_P(RealTopo, ReadsWithTheFilesOwnNumbers) {
  const std::string path = kData + GetParam().name;
  const Counted c = count(slurp(path));
  ASSERT_GT(c.gpus, 0);
  auto t = loadNodeTopo(path);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  EXPECT_EQ(t->gpus, c.gpus);
  const int lmin = *std::min_element(c.links.begin(), c.links.end());
  const int lmax = *std::max_element(c.links.begin(), c.links.end());
  EXPECT_EQ(t->links_min, lmin);
  EXPECT_EQ(t->links_max, lmax);
  if (lmin > 0) {
    ASSERT_TRUE(kLinkRate.count(c.gen)) << c.gen;
    EXPECT_DOUBLE_EQ(t->link_gbyte_s, kLinkRate.at(c.gen));
    EXPECT_DOUBLE_EQ(t->scaleup_gbyte_s, lmin * kLinkRate.at(c.gen));
    EXPECT_FALSE(t->via_pcie);
  } else {
    EXPECT_TRUE(t->via_pcie);
  }
  const double fastest = *std::max_element(c.net_mbit.begin(), c.net_mbit.end()) / 1000;
  const int at_fastest = static_cast<int>(std::count(c.net_mbit.begin(), c.net_mbit.end(), fastest * 1000));
  EXPECT_EQ(t->nics, at_fastest);
  EXPECT_EQ(t->nets.size(), c.net_mbit.size());
  const double cap = GetParam().nic_cap_gbit;
  EXPECT_NEAR(t->nic_gbit_s, cap > 0 ? std::min(fastest, cap) : fastest, 1e-9);
  // Every GPU is nearest exactly one NIC.
  size_t assigned = 0;
  for (const NodeTopoNet& n : t->nets) assigned += n.gpus.size();
  EXPECT_EQ(assigned, static_cast<size_t>(c.gpus));
}

INSTANTIATE_TEST_SUITE_P(
    Rccl, RealTopo,
    ::testing::Values(
        // MI300X: NIC and GPU share a x16 Gen5 switch path (63 GB/s > 400 Gbit/s): no cap.
        RealFile{"topo_8p_940.xml", 0},
        // MI250X: each GCD's switch port is x8 at 16 GT/s: 8 x 1.969 GB/s = 126 Gbit/s < 200.
        RealFile{"topo_8p1h.xml", 8 * lane(16) * 8},
        // MI100: enp96s0f0 sits on a x1 2.5 GT/s link: 0.25 GB/s = 2 Gbit/s < 10.
        RealFile{"topo_4p3l.xml", 1 * lane(2.5) * 8},
        // MI50 without links: every path x16, Gen3 at worst (126 Gbit/s > 100).
        RealFile{"topo_8p_pcie_2nic.xml", 0},
        // MI100, 6 links per GPU.
        RealFile{"topo_8p6l_2nic.xml", 0},
        // The hand-written DGX H100 node.
        RealFile{"dgx_h100_handwritten.xml", 0}),
    [](const auto& info) {
      std::string n = info.param.name.substr(0, info.param.name.size() - 4);
      std::replace(n.begin(), n.end(), '.', '_');
      return n;
    });

TEST(NodeTopo, PcieWithoutLinksIsTheNarrowestLinkOnTheGpuPath) {
  // topo_8p_pcie_2nic: GPUs at 16 GT/s x16 behind switches at 8 GT/s x16.
  auto t = loadNodeTopo(kData + "topo_8p_pcie_2nic.xml");
  ASSERT_TRUE(t.isOk()) << t.status().message();
  EXPECT_NEAR(t->scaleup_gbyte_s, 16 * lane(8), 1e-9);
  EXPECT_EQ(t->gpus_per_nic, 4);  // 4 GPUs and one NIC under each CPU switch
}

TEST(NodeTopo, AffinityFollowsTheTree) {
  // MI300X: NIC k shares the first switch with GPU k.
  auto t = loadNodeTopo(kData + "topo_8p_940.xml");
  ASSERT_TRUE(t.isOk()) << t.status().message();
  ASSERT_EQ(t->nets.size(), 8U);
  for (size_t k = 0; k < 8; ++k) EXPECT_EQ(t->nets[k].gpus, std::vector<int>{static_cast<int>(k)}) << k;
  EXPECT_EQ(t->gpus_per_nic, 1);
}

TEST(NodeTopo, UnknownGenerationOfARealFileIsRefused) {
  // RCCL's topo_4p_940 names gcn 940 (pre-production MI300) with xGMI links.
  auto t = loadNodeTopo(kData + "topo_4p_940.xml");
  ASSERT_FALSE(t.isOk());
  const std::string m(t.status().message());
  EXPECT_NE(m.find("topo_4p_940.xml:"), std::string::npos) << m;
  EXPECT_NE(m.find("<gpu> attribute 'gcn' = '940'"), std::string::npos) << m;
}

// A collective priced on base + the DGX-like XML equals the one priced on
// h100-rail.json, though the base says otherwise about the node.
TEST(NodeTopo, DgxXmlPricesLikeTheJsonCluster) {
  auto json = parseCluster(R"({
    "name": "base", "nodes": 16384,
    "gpu": {"name": "H100-SXM5-80GB", "peak_tflops": 989, "fp8_tflops": 1979, "hbm_gib": 80, "hbm_gbyte_s": 3350, "sms": 132},
    "node": {"gpus": 4, "nvlink_gbyte_s": 100, "nvlink_latency_us": 1.0, "nvlink_efficiency": 0.824, "nvls": true},
    "network": {"topology": "rail-optimized", "nics_per_node": 2, "nic_gbit_s": 100, "latency_us": 2.0,
                "oversubscription": 1, "leaf_nodes": 32, "sharp": false}})",
                           "base.json");
  ASSERT_TRUE(json.isOk()) << json.status().message();
  auto t = loadNodeTopo(kData + "dgx_h100_handwritten.xml");
  ASSERT_TRUE(t.isOk()) << t.status().message();
  std::vector<std::string> report;
  const ClusterSpec derived = applyNodeTopo(*json, *t, "dgx.xml", &report);
  auto rail = loadCluster(kCluster);
  ASSERT_TRUE(rail.isOk()) << rail.status().message();
  EXPECT_EQ(derived.node.gpus, 8);
  EXPECT_EQ(derived.network.nics_per_node, 8);
  EXPECT_EQ(derived.node.nvlink_bw.value(), rail->node.nvlink_bw.value());
  EXPECT_EQ(derived.network.nic_bw.value(), rail->network.nic_bw.value());
  const plan::Registry reg = plan::Registry::builtin();
  for (const int64_t gpus : {8, 64}) {
    for (const char* coll : {"allreduce", "allgather"}) {
      auto a = simulateCollective(derived, gpus, coll, 1 << 28, "auto", reg, NetMode::Analytical, Library::Nccl);
      auto b = simulateCollective(*rail, gpus, coll, 1 << 28, "auto", reg, NetMode::Analytical, Library::Nccl);
      ASSERT_TRUE(a.isOk() && b.isOk());
      EXPECT_EQ(a->time_us, b->time_us) << coll << " " << gpus;
    }
  }
  // The report names the source of each field.
  std::string all;
  for (const std::string& l : report) all += l + "\n";
  EXPECT_NE(all.find("node.gpus = 8: file"), std::string::npos) << all;
  EXPECT_NE(all.find("network.latency_us = 2: base"), std::string::npos) << all;
}

// Malformed or unsupported input: an error naming the line, the element and
// the attribute.
struct Bad {
  const char* label;
  std::string xml;
  std::string expect;  // a substring of the message
};

std::string gpuNode(const std::string& gpu_attrs, const std::string& net_attrs = R"(speed="100000" port="1")") {
  return fmt::format(R"(<system version="2">
  <cpu numaid="0">
    <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
      <gpu dev="0" {}>
        <nvlink target="0000:02:00.0" count="12" tclass="0x068000"/>
      </gpu>
    </pci>
    <nic>
      <net name="n0" dev="0" {}/>
    </nic>
  </cpu>
</system>
)",
                     gpu_attrs, net_attrs);
}

class BadTopo : public ::testing::TestWithParam<Bad> {};

TEST_P(BadTopo, NamesElementAttributeAndLine) {
  auto t = parseNodeTopo(GetParam().xml, "bad.xml");
  ASSERT_FALSE(t.isOk());
  const std::string m(t.status().message());
  EXPECT_NE(m.find(GetParam().expect), std::string::npos) << m;
}

INSTANTIATE_TEST_SUITE_P(
    Inputs, BadTopo,
    ::testing::Values(
        Bad{"Truncated", gpuNode(R"(sm="80")").substr(0, 150), "bad.xml:4: <gpu>"},
        Bad{"WrongNesting",
            "<system>\n  <cpu>\n    <gpu dev=\"0\" sm=\"80\"/>\n  </cpu>\n</system>\n",
            "bad.xml:3: <gpu>: inside <cpu>: it belongs inside <pci>"},
        Bad{"UnknownGeneration", gpuNode(R"(sm="75")"), "bad.xml:4: <gpu> attribute 'sm' = '75': nvidia GPU generation"},
        Bad{"UnknownAmdGeneration", gpuNode(R"(gcn="gfx1100")"), "bad.xml:4: <gpu> attribute 'gcn' = 'gfx1100'"},
        Bad{"NonNumericSpeed", gpuNode(R"(sm="80")", R"(speed="fast")"),
            "bad.xml:9: <net> attribute 'speed' = 'fast': not a number"},
        Bad{"NoGpus", "<system version=\"2\">\n  <cpu numaid=\"0\"/>\n</system>\n",
            "bad.xml:1: <system>: no <gpu> element"},
        Bad{"NoGeneration", gpuNode(R"(rank="0")"), "bad.xml:4: <gpu>: attribute 'sm' missing"},
        Bad{"NonNumericCount",
            "<system>\n<cpu>\n<pci>\n<gpu sm=\"90\">\n<nvlink count=\"x\"/>\n</gpu>\n</pci>\n</cpu>\n</system>\n",
            "bad.xml:5: <nvlink> attribute 'count' = 'x': not a whole number"},
        Bad{"UnknownElement", "<system>\n<cpu>\n<gpux/>\n</cpu>\n</system>\n", "bad.xml:3: <gpux>: not an element"},
        Bad{"WrongRoot", "<topology/>\n", "bad.xml:1: <topology>: the root element"},
        Bad{"BadPcieRate",
            "<system>\n<cpu>\n<pci link_speed=\"fast\" link_width=\"16\">\n<gpu sm=\"80\"/>\n</pci>\n</cpu>\n</system>\n",
            "bad.xml:3: <pci> attribute 'link_speed' = 'fast'"}),
    [](const auto& info) { return std::string(info.param.label); });

// Every prefix of a real file is refused with a message, none read past the text.
TEST(NodeTopo, EveryTruncationIsAnError) {
  const std::string text = slurp(kData + "topo_8p1h.xml");
  ASSERT_GT(text.size(), 1000U);
  for (size_t n = 0; n + 1 < text.size(); n += 7) {
    auto t = parseNodeTopo(std::string_view(text).substr(0, n), "cut.xml");
    EXPECT_FALSE(t.isOk()) << n;
    if (!t.isOk()) {
      EXPECT_EQ(std::string(t.status().message()).rfind("cut.xml:", 0), 0U) << t.status().message();
    }
  }
}

// The command line: --node-topo reads the file, and a bad file fails the command.
TEST(NodeTopo, CollectiveCommandTakesNodeTopo) {
  CliOptions o;
  o.cluster_path = kCluster;
  o.node_topo_path = kData + "topo_8p_940.xml";
  o.gpus = 16;
  o.bytes_text = "64M";
  EXPECT_EQ(runCollectiveCommand(o), 0);
  const std::string bad = (std::filesystem::temp_directory_path() / fmt::format("chorus-topo-{}.xml", getpid())).string();
  std::ofstream(bad) << "<system>\n<cpu>\n";
  o.node_topo_path = bad;
  EXPECT_EQ(runCollectiveCommand(o), 1);
  std::filesystem::remove(bad);
}

// chorus-sim sweep --node-topo: the base cluster's node from the file (the
// sweep read only the cluster file before); a bad file fails the command.
TEST(NodeTopo, SweepCommandTakesNodeTopo) {
  CliOptions o;
  o.cluster_path = kCluster;
  o.node_topo_path = kData + "topo_8p_940.xml";
  o.gpus = 16;
  o.collective = "allreduce";
  o.bytes_text = "64M";
  o.vary = {"nic_gbit_s=200,400"};
  o.json = true;
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(runSweepCommand(o), 0);
  ::testing::internal::GetCapturedStdout();
  const std::string note = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(note.find("--node-topo"), std::string::npos) << note;
  const std::string bad = (std::filesystem::temp_directory_path() / fmt::format("chorus-topo-sw-{}.xml", getpid())).string();
  std::ofstream(bad) << "<system>\n<cpu>\n";
  o.node_topo_path = bad;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(runSweepCommand(o), 1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find(bad), std::string::npos) << err;
  std::filesystem::remove(bad);
}

// A cluster file's "node_topo" key names an NCCL topology file (relative to
// the cluster file's directory): loadCluster applies it as --node-topo does,
// so every command that reads the cluster file prices the node it names.
TEST(NodeTopo, ClusterFileKeyNamesTheNode) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("chorus-topo-key-{}", getpid());
  fs::remove_all(dir);
  fs::create_directories(dir / "topo");
  fs::copy_file(kData + "topo_8p_940.xml", dir / "topo" / "mi300x.xml");
  nlohmann::json j = nlohmann::json::parse(slurp(kCluster));
  j["node_topo"] = "topo/mi300x.xml";
  const std::string path = (dir / "cluster.json").string();
  std::ofstream(path) << j.dump(1);

  auto c = loadCluster(path);
  ASSERT_TRUE(c.isOk()) << c.status().message();
  auto base = loadCluster(kCluster);
  auto t = loadNodeTopo(kData + "topo_8p_940.xml");
  ASSERT_TRUE(base.isOk() && t.isOk());
  const ClusterSpec flag = applyNodeTopo(*base, *t, "x");
  ASSERT_NE(flag.node.nvlink_bw, base->node.nvlink_bw);  // the file changes the node
  EXPECT_EQ(c->node.gpus, flag.node.gpus);
  EXPECT_EQ(c->node.nvlink_bw, flag.node.nvlink_bw);
  EXPECT_EQ(c->network.nics_per_node, flag.network.nics_per_node);
  EXPECT_EQ(c->network.nic_bw, flag.network.nic_bw);
  EXPECT_EQ(c->node.nvls, flag.node.nvls);
  EXPECT_NE(c->name.find("(node from " + (dir / "topo" / "mi300x.xml").string() + ")"), std::string::npos) << c->name;

  // The collective command prices the cluster file's node as it does --node-topo's.
  CliOptions o;
  o.cluster_path = path;
  o.gpus = 16;
  o.bytes_text = "64M";
  o.json = true;
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(runCollectiveCommand(o), 0);
  const std::string by_key = ::testing::internal::GetCapturedStdout();
  o.cluster_path = kCluster;
  o.node_topo_path = kData + "topo_8p_940.xml";
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(runCollectiveCommand(o), 0);
  const std::string by_flag = ::testing::internal::GetCapturedStdout();
  ::testing::internal::GetCapturedStderr();
  auto a = nlohmann::json::parse(by_key, nullptr, false), b = nlohmann::json::parse(by_flag, nullptr, false);
  ASSERT_TRUE(a.is_object()) << by_key;
  ASSERT_TRUE(b.is_object()) << by_flag;
  a.erase("cluster");
  b.erase("cluster");
  EXPECT_EQ(a, b);

  // A file it cannot read fails the cluster file, naming the key.
  j["node_topo"] = "topo/none.xml";
  std::ofstream(path) << j.dump(1);
  auto bad = loadCluster(path);
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("node_topo"), std::string::npos) << bad.status().message();
  j["node_topo"] = 7;
  std::ofstream(path) << j.dump(1);
  EXPECT_FALSE(loadCluster(path).isOk());
  fs::remove_all(dir);

  // The MI300X cluster of the test data: its node from RCCL's file (8 GPUs,
  // 7 xGMI links x 64 GB/s), its GPU from AMD's data sheet.
  auto mi = loadCluster(kData + "mi300x-rail.json");
  ASSERT_TRUE(mi.isOk()) << mi.status().message();
  EXPECT_EQ(mi->node.gpus, 8);
  EXPECT_NEAR(mi->node.nvlink_bw / gbytePerS(1), 7 * 64, 1e-9);
  EXPECT_EQ(mi->network.nics_per_node, 8);
  EXPECT_NEAR(mi->gpu.hbm_bw / gbytePerS(1), 5300, 1e-9);
  EXPECT_NE(mi->name.find("topo_8p_940.xml"), std::string::npos) << mi->name;
}

}  // namespace
}  // namespace chorus::sim
