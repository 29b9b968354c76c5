// What-if sweeps (src/sim/sweep.hpp, `chorus-sim sweep`): the grid, the
// cluster edits each key makes, and that each point says what binds, where
// the binding resource is predicted from the cluster's numbers here.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <string>

#include "sim/config.hpp"
#include "sim/sweep.hpp"

namespace chorus::sim {
namespace {

ClusterSpec base(double oversub = 1) {
  const std::string j = fmt::format(R"({{"name": "t", "nodes": 64,
    "gpu": {{"name": "H100-SXM5", "peak_tflops": 989, "hbm_gib": 80, "hbm_gbyte_s": 3350}},
    "node": {{"gpus": 8, "nvlink_gbyte_s": 450, "nvlink_latency_us": 1, "nvlink_efficiency": 0.824}},
    "network": {{"topology": "rail-optimized", "nics_per_node": 8, "nic_gbit_s": 400, "latency_us": 2,
                 "oversubscription": {}, "leaf_nodes": 4}}}})", oversub);
  auto c = parseCluster(j, "t.json");
  EXPECT_TRUE(c.isOk()) << c.status().message();
  return *c;
}

SweepJob collectiveJob(const char* coll, const char* algo, int64_t gpus = 512) {
  SweepJob j;
  j.kind = SweepJob::Kind::Collective;
  j.collective = coll;
  j.algo = algo;
  j.bytes = 1073741824.0;
  j.gpus = gpus;
  return j;
}

// A ring allreduce over 8 nodes (64 GPUs: the latency stays small): each node edge carries 2(n-1)/n S through
// the node's 8 NICs, at g Gb/s each 8 x g/8 GB/s x 0.9 = 0.9 g GB/s per node,
// and through NVLink at 450 x 0.824 = 370.8 GB/s.  The NICs bind while 0.9 g < 370.8, i.e. g below
// 412 Gb/s; NVLink from there on.  Raising the NIC rate never slows it.
TEST(SimSweep, NicRateNeverSlowsAndTheBindingLinkMovesToNvlink) {
  const plan::Registry reg = plan::Registry::builtin();
  auto axis = parseSweepAxis("nic_gbit_s=100:1600");
  ASSERT_TRUE(axis.isOk()) << axis.status().message();
  ASSERT_EQ(axis->values.size(), 5u);  // 100, 200, 400, 800, 1600
  auto pts = runSweep(base(), {*axis}, collectiveJob("allreduce", "nccl:ring/Simple", 64), reg);
  ASSERT_TRUE(pts.isOk()) << pts.status().message();
  ASSERT_EQ(pts->size(), 5u);
  double prev = 1e300;
  for (const SweepPoint& p : *pts) {
    ASSERT_TRUE(p.ok) << p.error;
    const double g = std::stod(p.values.at(0).second);
    EXPECT_LE(p.time_s, prev * (1 + 1e-12)) << g;
    prev = p.time_s;
    const bool nic_binds = 0.9 * g < 370.8;
    EXPECT_EQ(p.binds, nic_binds ? "nic (node->leaf)" : "nvlink (gpu->nvswitch)") << g;
  }
}

// An all-to-all over 64 nodes, 4 nodes per leaf: at 1:1 the NICs bind; from
// 2:1 on the leaf uplinks do (a leaf's ranks send 60/64 of their bytes off
// the leaf through uplinks of 4 nodes' NICs / oversubscription), and every
// step of oversubscription makes it slower.
TEST(SimSweep, OversubscriptionMovesAnAllToAllOntoTheLeafUplinks) {
  const plan::Registry reg = plan::Registry::builtin();
  auto axis = parseSweepAxis("oversubscription=1,2,4");
  ASSERT_TRUE(axis.isOk());
  auto pts = runSweep(base(), {*axis}, collectiveJob("alltoall", "auto"), reg);
  ASSERT_TRUE(pts.isOk()) << pts.status().message();
  ASSERT_EQ(pts->size(), 3u);
  for (const SweepPoint& p : *pts) ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ((*pts)[0].binds.find("uplinks"), std::string::npos) << (*pts)[0].binds;
  EXPECT_NE((*pts)[1].binds.find("uplinks (leaf->spine)"), std::string::npos) << (*pts)[1].binds;
  EXPECT_NE((*pts)[2].binds.find("uplinks (leaf->spine)"), std::string::npos) << (*pts)[2].binds;
  EXPECT_GT((*pts)[1].time_s, (*pts)[0].time_s * 1.5);
  EXPECT_GT((*pts)[2].time_s, (*pts)[1].time_s * 1.5);
}

// Two axes make a grid, the first varying slowest; a larger NVLink domain of
// the same 512 GPUs keeps the NICs per GPU and the GPUs per leaf.
TEST(SimSweep, GridOrderAndDomainSize) {
  const plan::Registry reg = plan::Registry::builtin();
  auto a = parseSweepAxis("nvlink_domain=8,32");
  auto b = parseSweepAxis("oversubscription=1,2");
  ASSERT_TRUE(a.isOk() && b.isOk());
  auto pts = runSweep(base(), {*a, *b}, collectiveJob("allreduce", "auto"), reg);
  ASSERT_TRUE(pts.isOk()) << pts.status().message();
  ASSERT_EQ(pts->size(), 4u);
  EXPECT_EQ((*pts)[1].values[0].second, "8");
  EXPECT_EQ((*pts)[1].values[1].second, "2");
  EXPECT_EQ((*pts)[2].values[0].second, "32");
  ClusterSpec c = base();
  ASSERT_TRUE(applyClusterValue(&c, "nvlink_domain", "32").isOk());
  EXPECT_EQ(c.node.gpus, 32);
  EXPECT_EQ(c.gpus(), 512);
  EXPECT_EQ(c.network.nics_per_node, 32);
  EXPECT_EQ(c.network.leaf_nodes, 1);  // 4 nodes x 8 GPUs = 32 GPUs per leaf, as before
  // Errors name the key and the value.
  EXPECT_FALSE(parseSweepAxis("nic_gbps=1").isOk());
  EXPECT_NE(parseSweepAxis("nic_gbps=1").status().message().find("nic_gbps"), std::string::npos);
  EXPECT_FALSE(runSweep(base(), {*parseSweepAxis("nic_gbit_s=fast")}, collectiveJob("allreduce", "auto"), reg).isOk());
  EXPECT_FALSE(applyClusterValue(&c, "nvlink_domain", "48").isOk());  // 512 GPUs are not a multiple of 48
}

// A training job: the NIC rate never slows an iteration, each point names
// its bottleneck and binding bound, and a layout that does not divide is
// that point's error, not the sweep's.
TEST(SimSweep, TrainingPointsSayWhatBinds) {
  const plan::Registry reg = plan::Registry::builtin();
  auto m = loadModel(std::string(CHORUS_SOURCE_DIR) + "/configs/models/llama3-8b.json");
  ASSERT_TRUE(m.isOk()) << m.status().message();
  SweepJob j;
  j.kind = SweepJob::Kind::Train;
  j.model = &*m;
  j.train.gpus = 64;
  j.train.tp = 8;
  j.train.dp = 0;  // derived per point
  j.train.global_batch = 64;
  j.train.seq = 4096;
  j.train.schedule = false;
  auto nic = parseSweepAxis("nic_gbit_s=50,400");
  auto tp = parseSweepAxis("tp=3,8");
  ASSERT_TRUE(nic.isOk() && tp.isOk());
  auto pts = runSweep(base(), {*nic, *tp}, j, reg);
  ASSERT_TRUE(pts.isOk()) << pts.status().message();
  ASSERT_EQ(pts->size(), 4u);
  EXPECT_FALSE((*pts)[0].ok);  // tp 3 does not divide 64 GPUs
  EXPECT_FALSE((*pts)[0].error.empty());
  ASSERT_TRUE((*pts)[1].ok) << (*pts)[1].error;
  ASSERT_TRUE((*pts)[3].ok) << (*pts)[3].error;
  EXPECT_GE((*pts)[1].time_s, (*pts)[3].time_s);
  EXPECT_FALSE((*pts)[3].binds.empty());
  EXPECT_FALSE((*pts)[3].bound.empty());
}

// A serving job (--job serve): rate x P:D split on 8 GPUs of Llama 3 8B.
// Each point is the split it names (or the aggregated service); a rate far
// above the service's capacity is named as overload, with the capacity the
// same requests reach offline; the offered rate never lowers TTFT; a split
// that does not fill the GPUs is that point's error.
TEST(SimSweep, ServingPointsSayWhatBinds) {
  const plan::Registry reg = plan::Registry::builtin();
  auto m = loadModel(std::string(CHORUS_SOURCE_DIR) + "/configs/models/llama3-8b.json");
  ASSERT_TRUE(m.isOk()) << m.status().message();
  SweepJob j;
  j.kind = SweepJob::Kind::Serve;
  j.model = &*m;
  j.infer.gpus = 8, j.infer.tp = 1, j.infer.requests = 400, j.infer.input_len = 2048, j.infer.output_len = 128;
  auto rate = parseSweepAxis("rate=1,1000");
  auto pd = parseSweepAxis("pd=2:6,3:5,3:3");
  ASSERT_TRUE(rate.isOk() && pd.isOk()) << (rate.isOk() ? pd.status().message() : rate.status().message());
  EXPECT_EQ(pd->values.size(), 3u);  // P:D is a value, not a LO:HI range
  auto pts = runSweep(base(), {*rate, *pd}, j, reg);
  ASSERT_TRUE(pts.isOk()) << pts.status().message();
  ASSERT_EQ(pts->size(), 6u);
  for (size_t i : {0u, 1u, 3u, 4u}) ASSERT_TRUE((*pts)[i].ok) << i << ": " << (*pts)[i].error;
  EXPECT_EQ((*pts)[0].algo.rfind("disaggregated 2:6", 0), 0u) << (*pts)[0].algo;
  EXPECT_EQ((*pts)[1].algo.rfind("disaggregated 3:5", 0), 0u) << (*pts)[1].algo;
  EXPECT_FALSE((*pts)[2].ok);  // 3:3 leaves two GPUs out
  EXPECT_NE((*pts)[2].error.find("3:5"), std::string::npos) << (*pts)[2].error;
  // 1000 req/s of 2k-token prompts is far above what 8 GPUs prefill.
  for (size_t i : {3u, 4u}) {
    EXPECT_TRUE((*pts)[i].overloaded);
    EXPECT_NE((*pts)[i].binds.find("overloaded"), std::string::npos) << (*pts)[i].binds;
    EXPECT_GT((*pts)[i].capacity_rps, 0);
    EXPECT_LT((*pts)[i].capacity_rps, 1000);
    EXPECT_GT((*pts)[i].time_s, (*pts)[i - 3].time_s);  // TTFT p50 grows with the offered load
  }
  EXPECT_FALSE((*pts)[0].overloaded);
  // The aggregated service when no split is named; serving keys need --job serve.
  auto agg = runSweep(base(), {*parseSweepAxis("tp=1,2")}, j, reg);
  ASSERT_TRUE(agg.isOk()) << agg.status().message();
  ASSERT_TRUE((*agg)[0].ok && (*agg)[1].ok) << (*agg)[0].error << (*agg)[1].error;
  EXPECT_EQ((*agg)[0].algo, "aggregated");
  EXPECT_GT((*agg)[0].tokens_per_s_per_gpu, 0);
  SweepJob train;
  train.kind = SweepJob::Kind::Train;
  train.model = &*m;
  EXPECT_FALSE(runSweep(base(), {*rate}, train, reg).isOk());
  EXPECT_FALSE(runSweep(base(), {*parseSweepAxis("pp=1,2")}, j, reg).isOk());
  EXPECT_FALSE(parseSweepAxis("pd=1").isOk() && runSweep(base(), {*parseSweepAxis("pd=1")}, j, reg).isOk());
  // JSON carries the serving figures tools/sweep_plot.py draws.
  const nlohmann::json js = toJson((*pts)[0]);
  for (const char* k : {"ttft_p50_s", "tpot_p50_s", "output_tokens_per_s_per_gpu", "goodput_rps", "overloaded", "mode"})
    EXPECT_TRUE(js.contains(k)) << k;
  EXPECT_NE(formatSweep({*rate, *pd}, *pts, SweepJob::Kind::Serve).find("TTFT p50"), std::string::npos);
}

}  // namespace
}  // namespace chorus::sim
