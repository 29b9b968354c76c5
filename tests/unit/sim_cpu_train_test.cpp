// chorus-sim train on CPU ranks (issue 35): the cluster's per-host core count
// (ranks beyond it time-share the cores), the model's element size, the SGD
// step and the framework's host time per layer pass.  Each test compares two
// runs that differ in that one input and checks the difference is the one its
// formula gives.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <string>

#include "plan/plan.hpp"
#include "sim/config.hpp"
#include "sim/train.hpp"
#include "support/sim_fixtures.hpp"

namespace chorus::sim {
namespace {

// A calibrated-CPU-like cluster: 8 ranks per host, rates round, no fixed
// costs, so that every figure below is a short formula.
ClusterSpec cpuCluster(std::string_view node_extra = "", std::string_view top_extra = "") {
  const std::string j = fmt::format(R"({{"name": "cpu", "nodes": 1 {},
    "gpu": {{"name": "cpu-rank", "peak_tflops": 0.002, "hbm_gib": 4, "hbm_gbyte_s": 4, "gemm_efficiency": 1,
             "gemm_half_size": 0, "hbm_efficiency": 1, "kernel_overhead_us": 0, "comm_sm_fraction": 0}},
    "node": {{"gpus": 8, "nvlink_gbyte_s": 2, "nvlink_latency_us": 5, "nvlink_efficiency": 1 {}}},
    "network": {{"topology": "fat-tree", "nics_per_node": 1, "nic_gbit_s": 16, "latency_us": 5,
                 "oversubscription": 1, "efficiency": 1}}}})",
                                    top_extra, node_extra);
  auto c = parseCluster(j, "cpu.json");
  EXPECT_TRUE(c.isOk()) << c.status().message();
  return *c;
}

ModelSpec smallGpt(double act_bytes = 2) {
  ModelSpec m = fixtures::gpt(4, 128, 8);
  m.vocab = 1024;
  m.dropout = false;
  m.act_bytes = act_bytes;
  return m;
}

TrainConfig job(int tp, int pp, int dp) {
  TrainConfig k;
  k.gpus = tp * pp * dp, k.tp = tp, k.pp = pp, k.dp = dp;
  k.global_batch = 16, k.micro_batch = 2, k.seq = 64, k.zero = 0;
  k.sequence_parallel = false, k.flash_attention = false, k.recompute = Recompute::None;
  k.async_tp = false, k.overlap_dp = false;
  return k;
}

TrainReport run(const ModelSpec& m, const ClusterSpec& c, const TrainConfig& k) {
  auto r = simulateTraining(m, c, k, plan::Registry::builtin());
  EXPECT_TRUE(r.isOk()) << r.status().message();
  return r.isOk() ? *r : TrainReport{};
}

TEST(SimCpuTrain, RanksBeyondTheCoresTimeShareThem) {
  const ModelSpec m = smallGpt();
  const ClusterSpec own = cpuCluster(), two = cpuCluster(R"(, "cpu_cores": 2)");
  EXPECT_EQ(own.node.cpu_cores, 0);
  EXPECT_EQ(two.node.cpu_cores, 2);
  // 2 ranks on 2 cores: each has one, the same as without a core count.
  for (auto [tp, pp, dp] : {std::array{2, 1, 1}, std::array{1, 2, 1}, std::array{1, 1, 2}}) {
    const TrainConfig k = job(tp, pp, dp);
    EXPECT_DOUBLE_EQ(run(m, two, k).iteration_s, run(m, own, k).iteration_s) << tp << pp << dp;
  }
  // 4 and 8 ranks on 2 cores: every compute and collective time 2x / 4x, so the whole step.
  for (auto [tp, pp, dp, x] : {std::array{4, 1, 1, 2}, std::array{2, 2, 1, 2}, std::array{1, 2, 2, 2},
                               std::array{2, 2, 2, 4}}) {
    const TrainConfig k = job(tp, pp, dp);
    const double alone = run(m, own, k).iteration_s, shared = run(m, two, k).iteration_s;
    EXPECT_GT(alone, 0);
    EXPECT_NEAR(shared / alone, x, 1e-9 * x) << tp << pp << dp;
  }
  // Other work left the job 1.25 cores' worth of one thread's rate: 4 ranks share it (3.2x), 2 ranks 1.6x.
  const ClusterSpec busy = cpuCluster(R"(, "cpu_cores": 2, "cpu_capacity": 1.25)");
  EXPECT_NEAR(run(m, busy, job(4, 1, 1)).iteration_s / run(m, own, job(4, 1, 1)).iteration_s, 3.2, 1e-9);
  EXPECT_NEAR(run(m, busy, job(1, 1, 2)).iteration_s / run(m, own, job(1, 1, 2)).iteration_s, 1.6, 1e-9);
  auto bad = parseCluster(R"({"name": "x", "nodes": 1, "gpu": {"name": "g", "peak_tflops": 1, "hbm_gib": 1,
    "hbm_gbyte_s": 1}, "node": {"gpus": 2, "nvlink_gbyte_s": 1, "nvlink_latency_us": 1, "cpu_cores": -1},
    "network": {"topology": "fat-tree", "nics_per_node": 1, "nic_gbit_s": 1, "latency_us": 1, "oversubscription": 1}})",
                          "bad.json");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("cpu_cores"), std::string::npos) << bad.status().message();
}

TEST(SimCpuTrain, TheModelsElementSizeSetsEveryByteCount) {
  const ClusterSpec c = cpuCluster();
  const TrainConfig k = job(2, 2, 2);
  const TrainReport r16 = run(smallGpt(2), c, k), r32 = run(smallGpt(4), c, k);
  // The tp allreduce of one layer boundary, the pipeline's send and the dp
  // gradient collectives carry 4 B per element instead of 2.
  const double tokens = 2 * 64, h = 128;
  auto bytesOf = [](const TrainReport& r, std::string_view dim, std::string_view what) {
    for (const auto& l : r.collectives)
      if (l.dim == dim && l.collective == what) return l.bytes;
    return -1.0;
  };
  EXPECT_DOUBLE_EQ(bytesOf(r16, "tp_comm_s", "allreduce"), tokens * h * 2);
  EXPECT_DOUBLE_EQ(bytesOf(r32, "tp_comm_s", "allreduce"), tokens * h * 4);
  EXPECT_DOUBLE_EQ(bytesOf(r32, "pp_comm_s", "sendrecv"), 2 * bytesOf(r16, "pp_comm_s", "sendrecv"));
  // The parameters' all-gather (the second half of ZeRO-0's allreduce) in the model's dtype too.
  EXPECT_DOUBLE_EQ(bytesOf(r32, "dp_comm_s", "allgather"), 2 * bytesOf(r16, "dp_comm_s", "allgather"));
  EXPECT_GT(r32.iteration_s, r16.iteration_s);
  // The model file's key.
  auto m = parseModel(R"({"name": "g", "layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 256, "vocab": 128,
    "dropout": false, "tie_embeddings": false, "qkv_bias": true, "o_bias": true, "dtype": "fp32"})", "m.json");
  ASSERT_TRUE(m.isOk()) << m.status().message();
  EXPECT_EQ(m->act_bytes, 4);
  auto bad = parseModel(R"({"name": "g", "layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 256, "vocab": 128,
    "dropout": false, "tie_embeddings": false, "qkv_bias": true, "o_bias": true, "dtype": "fp64"})", "m.json");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("dtype"), std::string::npos) << bad.status().message();
}

TEST(SimCpuTrain, SgdReadsParameterAndGradientAndWritesTheParameter) {
  const ClusterSpec c = cpuCluster();
  TrainConfig k = job(1, 1, 1);
  k.optimizer = TrainConfig::Optimizer::Sgd;
  const TrainReport sgd = run(smallGpt(4), c, k);
  ASSERT_EQ(sgd.stages.size(), 1u);
  const double params = sgd.stages[0].params;
  EXPECT_GT(params, 0);
  // 4 + 4 + 4 B for the step, then the 4-B gradient zeroed, at 4 GB/s.
  EXPECT_NEAR(sgd.stage.optimizer_s, 16 * params / 4e9, 1e-12);
  EXPECT_NEAR(sgd.stages[0].optimizer_s, 16 * params / 4e9, 1e-12);
  k.optimizer = TrainConfig::Optimizer::Adam;
  const TrainReport adam = run(smallGpt(4), c, k);
  EXPECT_NEAR(adam.stage.optimizer_s, (38 + 4) * params / 4e9, 1e-12);
  EXPECT_NEAR(adam.iteration_s - sgd.iteration_s, (42 - 16) * params / 4e9, 1e-9);
}

TEST(SimCpuTrain, TheHostTimePerLayerPassIsPricedPerMicroBatchAndStep) {
  const ModelSpec m = smallGpt(4);
  const ClusterSpec none = cpuCluster();
  const ClusterSpec host = cpuCluster("", R"(, "host": {"layer_fwd_us": 1000, "layer_bwd_us": 2000,
    "head_fwd_us": 300, "head_bwd_us": 400, "step_layer_us": 500})");
  EXPECT_DOUBLE_EQ(host.host.layer_bwd.value(), 2e-3);
  // One rank, 8 micro-batches of 4 layers: 8 x (4 x 3 ms + 0.7 ms) + 4 x 0.5 ms more.
  const TrainConfig k = job(1, 1, 1);
  EXPECT_NEAR(run(m, host, k).iteration_s - run(m, none, k).iteration_s, 8 * (4 * 3e-3 + 0.7e-3) + 4 * 0.5e-3, 1e-9);
  // With 4 ranks on 2 cores the host time is shared like the rest.
  const ClusterSpec host2 = cpuCluster(R"(, "cpu_cores": 2)", R"(, "host": {"layer_fwd_us": 1000, "layer_bwd_us": 2000,
    "head_fwd_us": 300, "head_bwd_us": 400, "step_layer_us": 500})");
  const TrainConfig k4 = job(4, 1, 1);
  EXPECT_NEAR(run(m, host2, k4).iteration_s - run(m, cpuCluster(R"(, "cpu_cores": 2)"), k4).iteration_s,
              2 * (8 * (4 * 3e-3 + 0.7e-3) + 4 * 0.5e-3), 1e-9);
  auto bad = parseCluster(R"({"name": "x", "nodes": 1, "host": {"layer_fwd": 1}, "gpu": {"name": "g", "peak_tflops": 1,
    "hbm_gib": 1, "hbm_gbyte_s": 1}, "node": {"gpus": 2, "nvlink_gbyte_s": 1, "nvlink_latency_us": 1},
    "network": {"topology": "fat-tree", "nics_per_node": 1, "nic_gbit_s": 1, "latency_us": 1, "oversubscription": 1}})",
                          "bad.json");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("layer_fwd"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace chorus::sim
