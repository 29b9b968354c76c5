// Mesh nodes (NodeSpec::mesh; docs/simulator.md, "Mesh nodes"): a node whose
// GPUs are joined pair by pair by their own links (AMD's xGMI), not through a
// switch.  A transfer between two of its GPUs is capped at that pair's links;
// transfers to different peers run at once, each on its own links.  The
// bounds here are worked out from the plans' own programs (bytes each ordered
// pair of ranks sends, counted from the expanded steps) and the per-pair rate
// the cluster states, not from the code under test.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "plan/plan_file.hpp"
#include "sim/config.hpp"
#include "sim/nccl_topo.hpp"
#include "sim/report.hpp"

namespace chorus::sim {
namespace {

namespace fs = std::filesystem;

const fs::path kSrc = fs::path(CHORUS_SOURCE_DIR);
const std::string kMi300x = (kSrc / "tests/data/topo/mi300x-rail.json").string();
const std::string kH100 = (kSrc / "configs/clusters/h100-rail.json").string();

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

ClusterSpec cluster(const std::string& path) {
  auto c = loadCluster(path);
  EXPECT_TRUE(c.isOk()) << c.status().message();
  return c.isOk() ? *c : ClusterSpec{};
}

// The most bytes any ordered pair of ranks exchanges in `a`'s programs at the
// shape the simulator builds for `bytes` (sim/network.cpp: one-byte elements,
// allgather/reducescatter/alltoall counts per rank, 512 KiB slices on one node;
// the other form when the plan claims only one).
double busiestPairBytes(const plan::Algorithm& a, int n, double bytes) {
  plan::Shape sh;
  sh.coll = a.collective();
  sh.nranks = n;
  sh.elem_size = 1;
  sh.chunk_elems = plan::kChunkBytesOneHost;
  const bool per_rank = sh.coll == plan::Collective::AllGather || sh.coll == plan::Collective::ReduceScatter ||
                        sh.coll == plan::Collective::AllToAll;
  sh.count = static_cast<uint64_t>(bytes) / (per_rank ? static_cast<uint64_t>(n) : 1);
  if (!a.supports(sh)) sh.inplace = true;
  if (!a.supports(sh)) return -1;
  std::vector<double> pair(static_cast<size_t>(n * n), 0.0);
  for (int r = 0; r < n; ++r) {
    plan::Program p;
    plan::expand(a, sh, r, &p);
    for (const plan::Step& s : p.steps)
      if (s.op == plan::StepOp::Send) pair[static_cast<size_t>(r * n + s.peer)] += static_cast<double>(plan::regionBytes(s.src, 1));
  }
  return *std::max_element(pair.begin(), pair.end());
}

// RCCL's 8-GPU MSCCL files and every chorus plan of the four collectives that
// takes 8 ranks, priced on one MI300X node: no plan moves its busiest pair's
// bytes faster than that pair's one xGMI link allows (64 GB/s per direction,
// AMD's 128 GB/s per link in both directions, times the model's link
// efficiency), in either network mode.  Fails on the switch model, which gave
// every pair the GPU's 448 GB/s (checked by clearing node.mesh in cluster()).
TEST(SimMesh, NoPlanBeatsThePairLink) {
  const ClusterSpec c = cluster(kMi300x);
  ASSERT_TRUE(c.node.mesh);
  const double link = c.node.peerBw().value() * c.node.nvlink_efficiency;
  ASSERT_NEAR(c.node.peerBw().value(), 64e9, 1);  // what the test's claim is about
  plan::Registry reg = plan::Registry::builtin();
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(kSrc / "tests/data/msccl")) {
    if (e.path().extension() != ".xml") continue;
    const std::string text = slurp(e.path());
    if (text.find("ngpus=\"8\"") == std::string::npos) continue;
    const std::string name = e.path().stem().string();
    auto spec = plan::parseMscclXml(text, name + ".xml");
    ASSERT_TRUE(spec.isOk()) << name << ": " << spec.status().message();
    auto algo = plan::buildPlan(std::move(*spec));
    ASSERT_TRUE(algo.isOk()) << name << ": " << algo.status().message();
    reg.add(std::move(*algo));
    files.push_back(name);
  }
  ASSERT_GE(files.size(), 15u);
  const double bytes = 1572864;  // 1.5 MiB: whole chunks of every file
  int checked = 0, from_files = 0;
  for (const auto& up : reg.all()) {
    const plan::Algorithm& a = *up;
    const plan::Collective k = a.collective();
    if (k != plan::Collective::AllReduce && k != plan::Collective::AllGather && k != plan::Collective::AllToAll &&
        k != plan::Collective::ReduceScatter)
      continue;
    if (a.compressed() || a.exact()) continue;
    const double pair = busiestPairBytes(a, 8, bytes);
    if (pair <= 0) continue;
    const bool file = std::find(files.begin(), files.end(), a.name()) != files.end();
    for (NetMode mode : {NetMode::Analytical, NetMode::Flow}) {
      auto r = simulateCollective(c, 8, plan::collectiveName(k), bytes, a.name(), reg, mode, Library::Chorus);
      if (!r.isOk()) continue;  // a plan without a pattern at this shape
      EXPECT_GE(r->time_us * 1e-6, pair / link * (1 - 1e-9))
          << a.name() << " (" << plan::collectiveName(k) << ", " << (mode == NetMode::Flow ? "flow" : "analytical")
          << "): " << r->time_us << " us for " << pair << " bytes on its busiest pair";
      ++checked;
      from_files += file ? 1 : 0;
    }
  }
  EXPECT_GE(from_files, 2 * static_cast<int>(files.size()) - 2);
  EXPECT_GE(checked, from_files + 20);
}

// NCCL/RCCL's own collectives on a mesh: a group with two ranks on the node
// reaches its peer over that pair's links only, however many channels it runs.
TEST(SimMesh, NcclModelOnTwoRanksGetsOnePairsLinks) {
  const ClusterSpec c = cluster(kMi300x);
  const double link = c.node.peerBw().value() * c.node.nvlink_efficiency;
  const plan::Registry reg = plan::Registry::builtin();
  const double bytes = 256.0 * (1 << 20);
  auto r = simulateCollective(c, 2, "allreduce", bytes, "auto", reg, NetMode::Analytical, Library::Nccl);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  // A 2-rank allreduce sends each rank's half and receives the other's reduced
  // half: S bytes over the one pair (any algorithm: half out, half back).
  EXPECT_GE(r->time_us * 1e-6, bytes / link * (1 - 1e-9)) << r->time_us << " us, " << r->algo;
  // On all 8 GPUs RCCL's channels can spread over all 7 links: faster per byte.
  auto r8 = simulateCollective(c, 8, "allreduce", bytes, "auto", reg, NetMode::Analytical, Library::Nccl);
  ASSERT_TRUE(r8.isOk()) << r8.status().message();
  EXPECT_LT(r8->time_us, r->time_us);
}

// The model shows why RCCL's all-pairs files win on MI300X: a ring's step talks
// to one peer (one link of the 7), the all-pairs exchange to all 7 at once.
// On the mesh the ring costs several times what it costs behind a switch of the
// same per-GPU rate; the all-pairs plan costs the same on both.
TEST(SimMesh, RingUsesOneLinkAllPairsUsesAll) {
  const ClusterSpec mesh = cluster(kMi300x);
  ClusterSpec sw = mesh;
  sw.node.mesh = false;
  sw.node.peer_bw = BytesPerSecond(0);
  plan::Registry reg = plan::Registry::builtin();
  const std::string f = "allreduce-allpairs-8n-simple_2";
  auto spec = plan::parseMscclXml(slurp(kSrc / "tests/data/msccl" / (f + ".xml")), f + ".xml");
  ASSERT_TRUE(spec.isOk()) << spec.status().message();
  auto algo = plan::buildPlan(std::move(*spec));
  ASSERT_TRUE(algo.isOk()) << algo.status().message();
  reg.add(std::move(*algo));
  const double bytes = 48.0 * (1 << 20);
  auto price = [&](const ClusterSpec& c, const std::string& a) {
    auto r = simulateCollective(c, 8, "allreduce", bytes, a, reg, NetMode::Analytical, Library::Chorus);
    EXPECT_TRUE(r.isOk()) << a << ": " << r.status().message();
    return r.isOk() ? r->time_us : -1.0;
  };
  const double ring_mesh = price(mesh, "ring"), ring_sw = price(sw, "ring");
  const double ap_mesh = price(mesh, f), ap_sw = price(sw, f);
  EXPECT_GT(ring_mesh / ring_sw, 4.0) << ring_mesh << " vs " << ring_sw;
  EXPECT_NEAR(ap_mesh / ap_sw, 1.0, 0.05) << ap_mesh << " vs " << ap_sw;
  EXPECT_LT(ap_mesh, ring_mesh);
}

// A mesh whose pair links are as fast as the GPU's port prices every plan as
// the switch node does (the port binds first), and the switch node is the one
// the cluster files without "mesh" describe.
TEST(SimMesh, MeshAsFastAsThePortIsTheSwitch) {
  const ClusterSpec sw = cluster(kH100);
  ASSERT_FALSE(sw.node.mesh);
  ClusterSpec mesh = sw;
  mesh.node.mesh = true;
  mesh.node.peer_bw = sw.node.nvlink_bw;
  const plan::Registry reg = plan::Registry::builtin();
  for (const char* coll : {"allreduce", "allgather", "alltoall"})
    for (const char* a : {"ring", "auto"})
      for (NetMode mode : {NetMode::Analytical, NetMode::Flow}) {
        auto x = simulateCollective(sw, 8, coll, 8 << 20, a, reg, mode, Library::Chorus);
        auto y = simulateCollective(mesh, 8, coll, 8 << 20, a, reg, mode, Library::Chorus);
        if (!x.isOk()) continue;  // no ring of that collective
        ASSERT_TRUE(y.isOk()) << y.status().message();
        EXPECT_NEAR(y->time_us, x->time_us, x->time_us * 1e-9) << coll << " " << a;
      }
}

// The topology reader: RCCL's MI300X model is a full mesh of one xGMI link per
// pair (64 GB/s per direction), its 4-GPU MI100 model one of 46 GB/s links;
// the DGX H100 node's NVLinks go to NVSwitches (a switch), and the MI250X and
// 6-link MI100 models are partial meshes (pairs without a link): not modelled
// as a mesh, and the report says why.
TEST(SimMesh, TopoReaderTellsMeshFromSwitch) {
  const std::string dir = (kSrc / "tests/data/topo/").string();
  struct Want {
    const char* file;
    bool mesh;
    double peer;
  };
  for (const Want& w : {Want{"topo_8p_940.xml", true, 128.0 / 2}, Want{"topo_4p3l.xml", true, 92.0 / 2},
                        Want{"dgx_h100_handwritten.xml", false, 0}, Want{"topo_8p1h.xml", false, 0},
                        Want{"topo_8p6l_2nic.xml", false, 0}, Want{"topo_8p_pcie_2nic.xml", false, 0}}) {
    SCOPED_TRACE(w.file);
    auto t = loadNodeTopo(dir + w.file);
    ASSERT_TRUE(t.isOk()) << t.status().message();
    EXPECT_EQ(t->mesh, w.mesh);
    const ClusterSpec base = cluster(kH100);
    std::vector<std::string> report;
    const ClusterSpec c = applyNodeTopo(base, *t, w.file, &report);
    EXPECT_EQ(c.node.mesh, w.mesh);
    std::string all;
    for (const std::string& l : report) all += l + "\n";
    if (w.mesh) {
      EXPECT_EQ(t->pair_links_min, 1);
      EXPECT_DOUBLE_EQ(c.node.peerBw().value(), w.peer * 1e9);
      EXPECT_NE(all.find(fmt::format("peer_gbyte_s = {:g}", w.peer)), std::string::npos) << all;
    } else {
      EXPECT_NE(all.find("node.mesh = off"), std::string::npos) << all;
    }
  }
  // Two links per pair are twice one: the 4-GPU file with every count doubled.
  std::string text = slurp(dir + "topo_4p3l.xml");
  for (size_t at = 0; (at = text.find("count=\"1\"", at)) != std::string::npos;) text.replace(at, 9, "count=\"2\"");
  auto t = parseNodeTopo(text, "x.xml");
  ASSERT_TRUE(t.isOk()) << t.status().message();
  EXPECT_TRUE(t->mesh);
  EXPECT_EQ(t->pair_links_min, 2);
  EXPECT_DOUBLE_EQ(applyNodeTopo(cluster(kH100), *t, "x.xml").node.peerBw().value(), 92e9);
}

// The cluster file's keys: "mesh": true derives the pair rate from the GPU's,
// "peer_gbyte_s" states it (and implies the mesh), and the two disagreeing is
// an error.
TEST(SimMesh, ClusterKeys) {
  nlohmann::json j = nlohmann::json::parse(slurp(kH100));
  j["node"]["mesh"] = true;
  auto c = parseCluster(j.dump(), "m.json");
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_TRUE(c->node.mesh);
  EXPECT_DOUBLE_EQ(c->node.peerBw().value(), c->node.nvlink_bw.value() / (c->node.gpus - 1));
  j["node"].erase("mesh");
  j["node"]["peer_gbyte_s"] = 50;
  c = parseCluster(j.dump(), "m.json");
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_TRUE(c->node.mesh);
  EXPECT_DOUBLE_EQ(c->node.peerBw().value(), 50e9);
  j["node"]["mesh"] = false;
  c = parseCluster(j.dump(), "m.json");
  ASSERT_FALSE(c.isOk());
  EXPECT_NE(c.status().message().find("peer_gbyte_s"), std::string::npos) << c.status().message();
  j["node"]["mesh"] = "yes";
  EXPECT_FALSE(parseCluster(j.dump(), "m.json").isOk());
}

}  // namespace
}  // namespace chorus::sim
