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
  // 4 ranks of one stage on 2 cores: all four busy whenever one is, so every
  // compute and collective time 2x, and the whole step.
  {
    const TrainConfig k = job(4, 1, 1);
    const double alone = run(m, own, k).iteration_s, shared = run(m, two, k).iteration_s;
    EXPECT_GT(alone, 0);
    EXPECT_NEAR(shared / alone, 2, 2e-9);
  }
  // Pipelined, 4 and 8 ranks on 2 cores: a stage that waits (fill, drain, a
  // neighbour's pass) leaves its share to the busy ones, so the step is
  // shorter than the uniform 2x / 4x (what the closed-form estimate still
  // charges) and no shorter than unshared.
  for (auto [tp, pp, dp, x] : {std::array{2, 2, 1, 2}, std::array{1, 2, 2, 2}, std::array{2, 2, 2, 4}}) {
    const TrainConfig k = job(tp, pp, dp);
    const TrainReport a = run(m, own, k), b = run(m, two, k);
    EXPECT_GT(a.iteration_s, 0);
    EXPECT_LT(b.iteration_s, x * a.iteration_s * (1 - 1e-3)) << tp << pp << dp;
    EXPECT_GT(b.iteration_s, a.iteration_s) << tp << pp << dp;
    EXPECT_NEAR(b.estimate_s / a.estimate_s, x, 1e-9 * x) << tp << pp << dp;
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

// pp 4 on one host of capacity 2 (issue 35: the pipelined layouts were
// priced 16-144 % slow because every rank paid the share of all four in the
// fill and drain too): the schedule charges a rank min(1, 2 / busy ranks).
// The step lies strictly below the uniform share's (2x the unshared step)
// and at or above both the host's work over its capacity and the unshared
// step; capacity >= ranks is the unshared step.
TEST(SimCpuTrain, APipelinesIdleStagesLeaveTheirShareOfTheCores) {
  const ModelSpec m = smallGpt(4);
  const TrainConfig k = job(1, 4, 1);
  const TrainReport own = run(m, cpuCluster(), k), two = run(m, cpuCluster(R"(, "cpu_cores": 2)"), k);
  const double uniform = 2 * own.iteration_s;
  EXPECT_LT(two.iteration_s, uniform * (1 - 1e-3));
  EXPECT_GE(two.iteration_s, own.iteration_s);
  // The host's compute (one rank per stage; the spec's times are the
  // uniform share's, 2x) over the capacity: the busy ranks' compute
  // progresses at most C calibrated threads' worth per second.  (The sends
  // stay out: a rank's send may overlap its own compute.)
  const IterationSpec& sp = two.schedule_spec;
  ASSERT_EQ(sp.cpu.ranks.size(), 1u);
  EXPECT_EQ(sp.cpu.ranks[0], (std::vector<double>{1, 1, 1, 1}));
  EXPECT_DOUBLE_EQ(sp.cpu.capacity, 2);
  EXPECT_DOUBLE_EQ(sp.cpu.time_scale, 2);
  double work = 0;
  for (const auto& ch : sp.chunks)
    for (const LayerPlan& lp : ch) work += static_cast<double>(sp.micro_batches) * (lp.fwd + lp.bwd + lp.recompute);
  for (double o : sp.optimizer_s) work += o;
  EXPECT_GT(work, 0);
  EXPECT_GE(two.iteration_s, work / sp.cpu.time_scale / sp.cpu.capacity * (1 - 1e-9));
  // The report's bound is that figure; GPUs (no cpu_cores) have none.
  ASSERT_TRUE(two.bounds.seconds.count("host_cores"));
  EXPECT_NEAR(two.bounds.seconds.at("host_cores"), work / 2 / 2, 1e-12 * work);
  EXPECT_FALSE(own.bounds.seconds.count("host_cores"));
  // 8 cores for 4 ranks: no sharing at all.
  EXPECT_DOUBLE_EQ(run(m, cpuCluster(R"(, "cpu_cores": 8)"), k).iteration_s, own.iteration_s);
  // Two hosts of 2 ranks and capacity 1 (node.gpus 2): stages 0-1 share one
  // host, 2-3 the other, so the uniform share (2x) is again the upper bound.
  const ClusterSpec hosts = [] {
    ClusterSpec c = cpuCluster(R"(, "cpu_cores": 1)");
    c.nodes = 2, c.node.gpus = 2;
    return c;
  }();
  const TrainReport h2 = run(m, hosts, k);
  EXPECT_EQ(h2.schedule_spec.cpu.ranks, (std::vector<std::vector<double>>{{1, 1, 0, 0}, {0, 0, 1, 1}}));
  EXPECT_LT(h2.iteration_s, uniform);
  EXPECT_GE(h2.iteration_s, own.iteration_s);
}

// Every validation layout (docs/validation.md, "CPU training runs"), and
// DualPipe's two copies per rank, on 2 cores of which other work leaves 1.25:
// the step is no shorter than the busiest host's compute over its capacity
// and no longer than the uniform share's.
TEST(SimCpuTrain, EveryLayoutLiesBetweenTheHostBoundAndTheUniformShare) {
  const ModelSpec m = smallGpt(4);
  const ClusterSpec own = cpuCluster(), busy = cpuCluster(R"(, "cpu_cores": 2, "cpu_capacity": 1.25)");
  for (auto [tp, pp, dp, dual] : {std::array{2, 1, 1, 0}, std::array{1, 2, 1, 0}, std::array{1, 1, 2, 0},
                                  std::array{4, 1, 1, 0}, std::array{2, 2, 1, 0}, std::array{2, 1, 2, 0},
                                  std::array{1, 2, 2, 0}, std::array{1, 4, 1, 0}, std::array{2, 2, 2, 0},
                                  std::array{1, 2, 4, 0}, std::array{1, 2, 1, 1}, std::array{2, 4, 1, 1}}) {
    TrainConfig k = job(tp, pp, dp);
    k.dualpipe = dual != 0;
    const TrainReport a = run(m, own, k), b = run(m, busy, k);
    const double uniform = std::max(1.0, std::min(tp * pp * dp, 8) / 1.25);
    ASSERT_TRUE(b.bounds.seconds.count("host_cores")) << tp << pp << dp << dual;
    EXPECT_GE(b.iteration_s, b.bounds.seconds.at("host_cores") * (1 - 1e-9)) << tp << pp << dp << dual;
    EXPECT_LE(b.iteration_s, uniform * a.iteration_s * (1 + 1e-9)) << tp << pp << dp << dual;
    EXPECT_GE(b.iteration_s, a.iteration_s * (1 - 1e-9)) << tp << pp << dp << dual;
  }
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
