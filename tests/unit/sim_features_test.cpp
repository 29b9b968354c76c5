// The simulator's search, trace, flow-level network and inference models:
// golden numbers where a derivation is short, invariants elsewhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <unistd.h>
#include <set>
#include <sstream>

#include "sim/compute.hpp"
#include "sim/placement.hpp"
#include "sim/report.hpp"
#include "sim/trace.hpp"
#include "support/sim_fixtures.hpp"

namespace chorus::sim {
namespace {

using fixtures::cluster;
using fixtures::gpt;



// One fat-tree node of the test cluster with its topology and analytical
// network model (the members own what the model refers to).
Topology topologyOf(const ClusterSpec& c) {
  auto t = Topology::build(c);
  EXPECT_TRUE(t.isOk()) << t.status().message();
  return std::move(t).value();  // throws, failing the test, when the build failed
}
struct OneNode {
  plan::Registry reg = plan::Registry::builtin();
  ClusterSpec c = cluster("fat-tree", 1);
  Topology topo = topologyOf(c);
  NetworkModel net{c, topo, reg};
};

// ---- placement in NVLink domains --------------------------------------------

// 4 racks of 72 GPUs with one 400 Gb/s NIC per GPU (NVL72-like).
ClusterSpec racks72() {
  return cluster("rail-optimized", 4, ", \"leaf_nodes\": 4", 72, 72);
}

TEST(SimPlacement, GroupsStayInsideADomain) {
  const ClusterSpec c = racks72();
  TrainConfig k;
  k.gpus = 256, k.tp = 1, k.pp = 4, k.dp = 64, k.ep = 64;
  EXPECT_EQ(alignedDomainUse(c, k), 64);  // one 64-GPU expert group per rack, 8 GPUs spare
  k.ep = 32, k.pp = 8, k.dp = 32;
  EXPECT_EQ(alignedDomainUse(c, k), 64);  // two expert groups of 32 per rack
  k.ep = 1, k.tp = 8, k.dp = 8, k.pp = 4;
  EXPECT_EQ(alignedDomainUse(c, k), 64);  // the tp x dp block of 64
  k.dp = 32, k.pp = 1;
  EXPECT_EQ(alignedDomainUse(c, k), 72);  // only the tp block of 8 fits: nine per rack
  k.tp = 4, k.dp = 4, k.pp = 16;          // blocks 4 and 16: 64 of 72
  EXPECT_EQ(alignedDomainUse(c, k), 64);
  k.gpus = 288, k.pp = 18;                 // the whole cluster: nothing to spare
  EXPECT_EQ(alignedDomainUse(c, k), 72);
  EXPECT_EQ(alignedDomainUse(cluster("fat-tree", 32), k), 8);

  auto p = placedCluster(c, 64, 256);
  ASSERT_TRUE(p.isOk()) << p.status().message();
  EXPECT_EQ(p->node.gpus, 64);
  EXPECT_EQ(p->node.domain_gpus, 72);
  EXPECT_EQ(p->network.nics_per_node, 64);
  EXPECT_EQ(describePlacement(*p, 256), "64 of 72 GPUs in each of 4 NVLink domains");
  for (int64_t bad : {0, -1, 73}) {
    auto e = placedCluster(c, bad, 256);
    ASSERT_FALSE(e.isOk());
    EXPECT_NE(e.status().message().find("must be in [1, 72]"), std::string::npos) << e.status().message();
  }
  auto few = placedCluster(c, 60, 256);  // 4 x 60 = 240 < 256
  ASSERT_FALSE(few.isOk());
  EXPECT_NE(few.status().message().find("240 GPUs, fewer than the job's 256"), std::string::npos)
      << few.status().message();
}

// Eight GPUs of one node, data-parallel, micro-batch 1, no recomputation,
// the closed form only.
// A small MoE GPT: 8 layers of h 2048, 16 experts of width 2048, top 2.
ModelSpec moe16() {
  ModelSpec m = gpt(8, 2048, 16);
  m.moe.experts = 16, m.moe.top_k = 2, m.moe.expert_ffn_hidden = 2048;
  return m;
}

TrainConfig dp8(int64_t global_batch, int64_t seq) {
  TrainConfig k;
  k.gpus = 8, k.tp = 1, k.pp = 1, k.dp = 8;
  k.global_batch = global_batch, k.micro_batch = 1, k.seq = seq, k.recompute = Recompute::None;
  k.schedule = false, k.stage_costs = false;
  return k;
}

// Under fp8 a GEMM keeps its input's fp8 cast for the weight gradient: per
// token and layer the QKV and FC1 inputs (2h each), the projection input (2h)
// and the FC2 input (2f) halve: 7h of a GPT's 34h.  Full recomputation keeps
// the layer inputs (16-bit) and one layer's activations, live again in its
// backward: one layer's 7h.
TEST(SimMemory, Fp8KeepsGemmInputsAtOneByte) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("fat-tree", 1);
  const ModelSpec m = gpt(8, 2048, 16);
  const TrainConfig k = dp8(64, 2048);
  auto act = [&](bool fp8, Recompute rc) {
    TrainConfig x = k;
    x.fp8 = fp8, x.recompute = rc;
    auto r = simulateTraining(m, c, x, reg);
    EXPECT_TRUE(r.isOk()) << r.status().message();
    return r.isOk() ? r->memory.activations_gib * 1024.0 * 1024 * 1024 : 0.0;
  };
  const double saved = 8.0 * 2048 * 7 * 2048;  // layers x tokens x 7h bytes
  EXPECT_NEAR(act(false, Recompute::None) - act(true, Recompute::None), saved, saved * 1e-9);
  EXPECT_NEAR(act(false, Recompute::Selective) - act(true, Recompute::Selective), saved, saved * 1e-9);
  EXPECT_NEAR(act(false, Recompute::Full) - act(true, Recompute::Full), saved / 8, saved * 1e-9);
}

// --recompute-modules (Megatron-Core's selective modules): each drops exactly
// its activations (per layer and token: layernorm its two outputs, 2 x 2h;
// mlp a dense layer's FC1 and activation outputs, 2 (mats-1) f + 2 f;
// moe_act the routed activation outputs, 2 top_k f_e; shared_experts the
// shared MLP's, 2 (mats-1) f_s + 2 f_s) and repeats its forward (the
// hardware FLOPs grow by exactly the recomputed GEMMs).  An MoE layer keeps
// its routed copies, the experts' FC1 input: one more routed expert per token
// costs 2h + 2 (mats-1) f_e + 2 f_e bytes.  Bad module names are refused.
TEST(SimMemory, RecomputeModulesDropWhatTheyRecompute) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("fat-tree", 1);
  ModelSpec dense = gpt(8, 2048, 16);
  ModelSpec moe = dense;
  moe.moe.experts = 8, moe.moe.top_k = 2, moe.moe.expert_ffn_hidden = 1024, moe.moe.shared_experts = 1;
  moe.moe.shared_expert_ffn_hidden = 2048;
  const double tok = 2048, h = 2048, L = 8, mats = dense.ffnMats();
  auto run = [&](const ModelSpec& m, Recompute rc, const char* mods) {
    TrainConfig x = dp8(64, 2048);
    if (m.moe.experts) x.ep = 8;
    x.recompute = rc;
    if (mods) {
      auto r = parseRecomputeModules(mods);
      EXPECT_TRUE(r.isOk()) << r.status().message();
      if (r.isOk()) x.recompute_modules = *r;
    }
    auto r = simulateTraining(m, c, x, reg);
    EXPECT_TRUE(r.isOk()) << r.status().message();
    return r;
  };
  auto act = [](const Result<TrainReport>& r) { return r.isOk() ? r->memory.activations_gib * 1024.0 * 1024 * 1024 : 0.0; };
  auto hwFlops = [&](const Result<TrainReport>& r) {
    return r.isOk() ? r->hardware_tflops_per_gpu * 1e12 * r->iteration_s * 8 : 0.0;
  };
  auto none = run(dense, Recompute::None, nullptr);
  auto ln = run(dense, Recompute::Selective, "layernorm");
  auto mlp = run(dense, Recompute::Selective, "layernorm,mlp");
  EXPECT_NEAR(act(none) - act(ln), L * tok * 2 * 2 * h, 1);
  const double f = 4 * h;
  EXPECT_NEAR(act(ln) - act(mlp), L * tok * (2 * (mats - 1) * f + 2 * f), 1);
  EXPECT_GT(ln->iteration_s, none->iteration_s);  // the layer norms again
  const double tokens = 64 * 2048;
  EXPECT_NEAR(hwFlops(mlp) - hwFlops(none), tokens * L * 2 * (mats - 1) * h * f, 1e-6 * hwFlops(none));
  auto moe_none = run(moe, Recompute::None, nullptr);
  auto moe_act = run(moe, Recompute::Selective, "moe_act");
  auto shared = run(moe, Recompute::Selective, "moe_act,shared_experts");
  EXPECT_NEAR(act(moe_none) - act(moe_act), L * tok * 2 * 2 * 1024, 1);
  EXPECT_NEAR(act(moe_act) - act(shared), L * tok * (2 * (mats - 1) * 2048 + 2 * 2048), 1);
  ModelSpec wider = moe;
  wider.moe.top_k = 3;
  auto three = run(wider, Recompute::None, nullptr);
  EXPECT_NEAR(act(three) - act(moe_none), L * tok * (2 * h + 2 * (mats - 1) * 1024 + 2 * 1024), 1);
  for (auto [text, what] : {std::pair{"moe", "is not modelled"}, std::pair{"layernorm,attn", "'attn' is not one of"},
                            std::pair{",", "name at least one module"}}) {
    auto e = parseRecomputeModules(text);
    ASSERT_FALSE(e.isOk()) << text;
    EXPECT_NE(e.status().message().find(what), std::string::npos) << e.status().message();
  }
  auto both = parseRecomputeModules("core_attn mla_up_proj");
  ASSERT_TRUE(both.isOk());
  EXPECT_EQ(both->describe(), "core_attn,mla_up_proj");
}

// --grad-dtype bf16 (Megatron-Bridge's grad_reduce_in_fp32 = false): the
// gradient buffer holds 2 B per parameter instead of 4, and the data-parallel
// reduce-scatter moves that buffer: half the bytes (the parameters' gather
// stays bf16).
// --optimizer-moments bf16: Adam's moments at 2 B each.
TEST(SimMemory, Bf16GradientBufferHalvesTheGradients) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("fat-tree", 1);
  TrainConfig k = dp8(64, 2048);
  auto fp32 = simulateTraining(gpt(8, 2048, 16), c, k, reg);
  k.grad_bytes = 2;
  auto bf16 = simulateTraining(gpt(8, 2048, 16), c, k, reg);
  ASSERT_TRUE(fp32.isOk() && bf16.isOk());
  EXPECT_NEAR(bf16->memory.grads_gib * 2, fp32->memory.grads_gib, 1e-12);
  EXPECT_DOUBLE_EQ(bf16->memory.optimizer_gib, fp32->memory.optimizer_gib);
  EXPECT_LE(bf16->iteration_s, fp32->iteration_s);
  // dp 8 in one node: the NVLink port carries the gather (2 B per parameter) and the reduce-scatter (4 or 2 B).
  EXPECT_NEAR(bf16->bounds.seconds.at("nvlink_port") / fp32->bounds.seconds.at("nvlink_port"), (2.0 + 2) / (2 + 4), 0.01);
  // bf16 Adam moments (--optimizer-moments bf16): 4 + 2 x 2 = 8 B of optimizer state per parameter, not 12.
  k.moment_bytes = 2;
  auto moments = simulateTraining(gpt(8, 2048, 16), c, k, reg);
  ASSERT_TRUE(moments.isOk());
  EXPECT_NEAR(moments->memory.optimizer_gib * 12, fp32->memory.optimizer_gib * 8, 1e-12);
  EXPECT_LE(moments->bounds.seconds.at("hbm"), fp32->bounds.seconds.at("hbm"));  // the step moves fewer bytes
  k.moment_bytes = 4;
  k.grad_bytes = 3;
  auto bad = simulateTraining(gpt(8, 2048, 16), c, k, reg);
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("2 (bf16) or 4 (fp32)"), std::string::npos) << bad.status().message();
}

// --attention-kernel fa2 on H100: the attention core at FlashAttention-2's
// curves, slower than the default FlashAttention-3 and nothing else changed;
// a name the GPU's data file lacks, or a kernel with --no-flash-attention, is refused.
TEST(SimTrain, AttentionKernelPricesOnlyTheCore) {
  const plan::Registry reg = plan::Registry::builtin();
  auto c = loadCluster(std::string(CHORUS_SOURCE_DIR) + "/configs/clusters/h100-rail.json");
  ASSERT_TRUE(c.isOk()) << c.status().message();
  TrainConfig k = dp8(64, 4096);
  auto fa3 = simulateTraining(gpt(8, 2048, 16), *c, k, reg);
  k.attention_kernel = "fa2";
  auto fa2 = simulateTraining(gpt(8, 2048, 16), *c, k, reg);
  ASSERT_TRUE(fa3.isOk() && fa2.isOk()) << (fa3.isOk() ? fa2.status().message() : fa3.status().message());
  EXPECT_GT(fa2->iteration_s, fa3->iteration_s);
  EXPECT_GT(fa2->stage.fwd_s, fa3->stage.fwd_s);
  EXPECT_DOUBLE_EQ(fa2->memory_gib_per_gpu, fa3->memory_gib_per_gpu);
  EXPECT_DOUBLE_EQ(fa2->bounds.seconds.at("tensor_cores"), fa3->bounds.seconds.at("tensor_cores"));  // the same FLOPs
  k.attention_kernel = "fa1";
  auto bad = simulateTraining(gpt(8, 2048, 16), *c, k, reg);
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("fa3, fa2"), std::string::npos) << bad.status().message();
  k.attention_kernel = "fa2";
  k.flash_attention = false;
  bad = simulateTraining(gpt(8, 2048, 16), *c, k, reg);
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("--no-flash-attention"), std::string::npos) << bad.status().message();
}

// --recompute-layers N (Megatron's block method): the first N layers of every
// virtual stage recompute, the others keep everything.  Every layer is full
// recomputation; memory and time lie between none and full, time growing
// with N; the range and the mode are checked.
TEST(SimMemory, RecomputeLayersIsBlockRecomputation) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("fat-tree", 2);
  const ModelSpec m = gpt(8, 2048, 16);
  TrainConfig k;
  k.gpus = 16, k.tp = 2, k.pp = 1, k.dp = 8;  // one stage of 8 layers
  k.global_batch = 64, k.micro_batch = 1, k.seq = 2048;
  auto run = [&](Recompute rc, int n, int pp = 1, int vpp = 1) {
    TrainConfig x = k;
    x.recompute = rc, x.recompute_layers = n, x.pp = pp, x.vpp = vpp, x.dp = 8 / pp;
    return simulateTraining(m, c, x, reg);
  };
  auto none = run(Recompute::None, 0), full = run(Recompute::Full, 0), all = run(Recompute::Full, 8),
       half = run(Recompute::Full, 4);
  for (auto* r : {&none, &full, &all, &half}) ASSERT_TRUE(r->isOk()) << r->status().message();
  EXPECT_DOUBLE_EQ(all->iteration_s, full->iteration_s);
  EXPECT_DOUBLE_EQ(all->memory_gib_per_gpu, full->memory_gib_per_gpu);
  EXPECT_LT(none->iteration_s, half->iteration_s);
  EXPECT_LT(half->iteration_s, full->iteration_s);
  // Activations: none = 8 kept + logits; full = 8 ckpt + kept (the layer live again in its backward) +
  // logits; half = 4 ckpt + 4 kept + kept + logits, where a checkpoint is the layer input, 2 B x s h / tp
  // (sequence-parallel).  So kept = (none - full + 8 ckpt) / 7 and half = (none + full) / 2 + kept / 2.
  const double ckpt = 2.0 * 2048 * 2048 / 2 / (1024.0 * 1024 * 1024);
  const double kept = (none->memory.activations_gib - full->memory.activations_gib + 8 * ckpt) / 7;
  EXPECT_NEAR(half->memory.activations_gib,
              (none->memory.activations_gib + full->memory.activations_gib) / 2 + kept / 2, 1e-9);
  // Every virtual stage's first layer: pp 2 x vpp 2 has 4 of them.
  auto four = run(Recompute::Full, 1, 2, 2), two_each = run(Recompute::Full, 2, 2, 2);
  ASSERT_TRUE(four.isOk()) << four.status().message();
  ASSERT_TRUE(two_each.isOk()) << two_each.status().message();
  EXPECT_LT(four->iteration_s, two_each->iteration_s);
  for (auto [rc, n, what] : {std::tuple{Recompute::Full, -1, "must be >= 0"},
                             std::tuple{Recompute::Selective, 1, "needs --recompute full"},
                             std::tuple{Recompute::None, 2, "needs --recompute full"},
                             std::tuple{Recompute::Full, 9, "more than the 8 layers of the largest"}}) {
    auto e = run(rc, n);
    ASSERT_FALSE(e.isOk()) << n;
    EXPECT_NE(e.status().message().find(what), std::string::npos) << e.status().message();
  }
  auto e = run(Recompute::Full, 3, 2, 2);  // virtual stages of 2 layers
  ASSERT_FALSE(e.isOk());
  EXPECT_NE(e.status().message().find("more than the 2 layers"), std::string::npos) << e.status().message();
}

// --mtp-layers D: each depth is a layer shaped as the last plus a 2h -> h
// projection and one more logits + loss on the last stage.  Against the same
// model with D more layers, the FLOPs differ by exactly D projections and D
// heads (fwd + bwd: 6 x tokens x h x (V + 2h)); the depth is range-checked.
TEST(SimMtp, EachDepthIsALayerAProjectionAndAHead) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("fat-tree", 1);
  const TrainConfig k = dp8(16, 1024);
  auto run = [&](int layers, int mtp) {
    TrainConfig x = k;
    x.mtp_layers = mtp;
    return simulateTraining(gpt(layers, 1024, 8), c, x, reg);
  };
  auto base = run(8, 0), deeper = run(9, 0), mtp = run(8, 1);
  for (auto* r : {&base, &deeper, &mtp}) ASSERT_TRUE(r->isOk()) << r->status().message();
  EXPECT_GT(mtp->iteration_s, deeper->iteration_s);
  EXPECT_GT(deeper->iteration_s, base->iteration_s);
  const double mb = 2, tokens = 1024, h = 1024, V = 51200;  // 16 sequences over dp 8: 2 micro-batches
  const double extra_flops = mb * 6 * tokens * h * (V + 2 * h);
  const double peak = c.gpu.peak16.value();
  EXPECT_NEAR((mtp->bounds.seconds.at("tensor_cores") - deeper->bounds.seconds.at("tensor_cores")) * peak, extra_flops,
              extra_flops * 1e-9);
  EXPECT_GT(mtp->memory_gib_per_gpu, deeper->memory_gib_per_gpu);  // + the projection, a second head's logits
  for (int bad : {-1, 9}) {
    auto e = run(8, bad);
    ASSERT_FALSE(e.isOk()) << bad;
    EXPECT_NE(e.status().message().find("--mtp-layers"), std::string::npos) << e.status().message();
  }
}

// --pp-schedule zb-h1 on a real layout: the same work, a smaller bubble (at
// most 1F1B's), the peak memory of 1F1B's first stage; 1F1B-only checks.
TEST(SimZeroBubble, SmallerBubbleSameWork) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("fat-tree", 2);
  const ModelSpec m = gpt(16, 2048, 16);
  TrainConfig k;
  k.gpus = 16, k.tp = 2, k.pp = 4, k.dp = 2;
  k.global_batch = 32, k.micro_batch = 1, k.seq = 2048, k.recompute = Recompute::None;
  auto run = [&](bool zb, int vpp = 1, int pp = 4) {
    TrainConfig x = k;
    x.zero_bubble = zb, x.vpp = vpp, x.pp = pp, x.dp = 8 / pp;
    return simulateTraining(m, c, x, reg);
  };
  auto one = run(false), zb = run(true);
  ASSERT_TRUE(one.isOk()) << one.status().message();
  ASSERT_TRUE(zb.isOk()) << zb.status().message();
  EXPECT_LT(zb->iteration_s, one->iteration_s);
  EXPECT_LT(zb->breakdown.at("bubble_s"), one->breakdown.at("bubble_s"));
  EXPECT_NEAR(zb->breakdown.at("compute_s"), one->breakdown.at("compute_s"), 1e-6 * one->breakdown.at("compute_s"));
  EXPECT_LT(zb->estimate_s, one->estimate_s);
  EXPECT_GE(zb->iteration_s, zb->bounds.max() * (1 - 1e-12));
  EXPECT_GE(zb->memory_gib_per_gpu, one->memory_gib_per_gpu);  // every stage holds p micro-batches
  for (auto [vpp, pp] : {std::pair{2, 4}, std::pair{1, 1}}) {
    auto e = run(true, vpp, pp);
    ASSERT_FALSE(e.isOk());
    EXPECT_NE(e.status().message().find("--pp-schedule zb-h1 needs pp >= 2 and vpp = 1"), std::string::npos)
        << e.status().message();
  }
}

// --moe-a2a-overlap on a real MoE layout: the exposed all-to-all shrinks,
// the compute is the same, every bound still holds, one more micro-batch is
// in flight; the layouts Megatron refuses are refused by name.
TEST(SimMoeDispatch, CombinedOneFOneBHidesTheAllToAllAndKeepsTheBounds) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("fat-tree", 4);
  const ModelSpec moe = moe16();
  TrainConfig k;
  k.gpus = 32, k.tp = 2, k.pp = 2, k.vpp = 2, k.dp = 8, k.ep = 8;
  k.global_batch = 64, k.micro_batch = 1, k.seq = 2048, k.recompute = Recompute::Selective;
  auto off = simulateTraining(moe, c, k, reg);
  k.moe_a2a_overlap = true;
  auto on = simulateTraining(moe, c, k, reg);
  ASSERT_TRUE(off.isOk()) << off.status().message();
  ASSERT_TRUE(on.isOk()) << on.status().message();
  EXPECT_LT(on->iteration_s, off->iteration_s);
  EXPECT_LT(on->breakdown.at("ep_comm_s"), off->breakdown.at("ep_comm_s"));
  EXPECT_LT(on->estimate_s, off->estimate_s);
  EXPECT_NEAR(on->breakdown.at("compute_s"), off->breakdown.at("compute_s"), 1e-6 * off->breakdown.at("compute_s"));
  EXPECT_GE(on->iteration_s, on->bounds.max() * (1 - 1e-12)) << on->bounds.binding;
  EXPECT_GT(on->memory.activations_gib, off->memory.activations_gib);
  struct Bad {
    const char* what;
    TrainConfig k;
    bool dense;
  };
  TrainConfig no_vpp = k, full = k, zb = k, no_ep = k;
  no_vpp.vpp = 1;
  full.recompute = Recompute::Full;
  zb.vpp = 1, zb.zero_bubble = true;
  no_ep.ep = 1;
  for (const Bad& b : {Bad{"needs --vpp >= 2", no_vpp, false}, Bad{"Megatron-Core refuses full recomputation", full, false},
                       Bad{"two different pipeline orders", zb, false}, Bad{"with ep=1", no_ep, false},
                       Bad{"a dense model", no_ep, true}}) {
    auto r = simulateTraining(b.dense ? gpt(8, 2048, 16) : moe, c, b.k, reg);
    ASSERT_FALSE(r.isOk()) << b.what;
    EXPECT_NE(r.status().message().find(b.what), std::string::npos) << r.status().message();
  }
}

// --pp-schedule dualpipe on a real MoE layout: every rank holds two stages
// (twice the parameters, gradients and optimizer state of 1F1B's stage),
// the same work spread evenly, a smaller bubble and the expert all-to-alls under the
// paired passes' compute; every bound holds; the layouts DualPipe cannot
// run are refused by name.
TEST(SimDualPipe, TwoCopiesSmallerBubbleHiddenAllToAll) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("fat-tree", 4);
  const ModelSpec moe = moe16();
  TrainConfig k;
  k.gpus = 32, k.tp = 1, k.pp = 4, k.dp = 8, k.ep = 8;
  k.global_batch = 128, k.micro_batch = 1, k.seq = 2048, k.recompute = Recompute::None;
  auto one = simulateTraining(moe, c, k, reg);
  k.dualpipe = true;
  auto dual = simulateTraining(moe, c, k, reg);
  ASSERT_TRUE(one.isOk()) << one.status().message();
  ASSERT_TRUE(dual.isOk()) << dual.status().message();
  EXPECT_LT(dual->iteration_s, one->iteration_s);
  EXPECT_LT(dual->breakdown.at("bubble_s"), one->breakdown.at("bubble_s"));
  EXPECT_LT(dual->breakdown.at("ep_comm_s"), one->breakdown.at("ep_comm_s"));
  // The same work, spread evenly: each rank holds a stage from each half, so the busiest rank's tensor-core time
  // (1F1B's last stage, with the logits) is no larger.
  EXPECT_LE(dual->bounds.seconds.at("tensor_cores"), one->bounds.seconds.at("tensor_cores") * (1 + 1e-12));
  EXPECT_GE(dual->iteration_s, dual->bounds.max() * (1 - 1e-12)) << dual->bounds.binding;
  EXPECT_GT(dual->memory.weights_gib, 1.5 * one->memory.weights_gib);
  EXPECT_EQ(dual->schedule_spec.vpp, 2);
  struct Bad {
    const char* what;
    TrainConfig k;
  };
  TrainConfig odd = k, vpp = k, few = k, a2a = k;
  odd.pp = 2, odd.dp = 16, odd.global_batch = 48;  // 3 micro-batches per pipeline
  vpp.vpp = 2;
  few.global_batch = 48;  // 6 micro-batches < 2 x pp
  a2a.moe_a2a_overlap = true;
  for (const Bad& bd : {Bad{"an even number of micro-batches per pipeline, at least 2 x pp = 4", odd},
                        Bad{"needs an even pp >= 2 and vpp = 1", vpp}, Bad{"at least 2 x pp = 8", few},
                        Bad{"drop --moe-a2a-overlap", a2a}}) {
    auto r = simulateTraining(moe, c, bd.k, reg);
    ASSERT_FALSE(r.isOk()) << bd.what;
    EXPECT_NE(r.status().message().find(bd.what), std::string::npos) << r.status().message();
  }
}

// --rank-order tp-cp-ep-pp-dp (Megatron's --use-tp-pp-dp-mapping): pipeline
// neighbours adjacent, data-parallel replicas pp apart.  With tp 4 on 8-GPU
// nodes, two pipeline stages share a node, so half the pipeline sends stay on
// NVLink, and the data-parallel reduce crosses nodes at stride tp x pp; the
// bounds hold either way; expert parallelism or cp and dp both above 1 are
// refused by name.
TEST(SimPlacement, RankOrderMovesThePipelineAndDataParallelGroups) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("fat-tree", 8);
  TrainConfig k;
  k.gpus = 64, k.tp = 4, k.pp = 4, k.dp = 4;
  k.global_batch = 64, k.micro_batch = 1, k.seq = 2048, k.recompute = Recompute::Selective;
  auto dp_inner = simulateTraining(gpt(16, 4096, 32), c, k, reg);
  k.pp_before_dp = true;
  auto pp_inner = simulateTraining(gpt(16, 4096, 32), c, k, reg);
  ASSERT_TRUE(dp_inner.isOk()) << dp_inner.status().message();
  ASSERT_TRUE(pp_inner.isOk()) << pp_inner.status().message();
  EXPECT_NE(dp_inner->iteration_s, pp_inner->iteration_s);
  EXPECT_LT(pp_inner->breakdown.at("pp_comm_s"), dp_inner->breakdown.at("pp_comm_s"));
  EXPECT_GE(pp_inner->iteration_s, pp_inner->bounds.max() * (1 - 1e-12));
  EXPECT_NE(pp_inner->placement.find("tp-cp-ep-pp-dp"), std::string::npos) << pp_inner->placement;
  ModelSpec moe = gpt(16, 4096, 32);
  moe.moe.experts = 8, moe.moe.top_k = 2, moe.moe.expert_ffn_hidden = 4096;
  TrainConfig e = k;
  e.ep = 2;
  auto bad = simulateTraining(moe, c, e, reg);
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("--rank-order tp-cp-ep-pp-dp is modelled without expert parallelism"),
            std::string::npos) << bad.status().message();
}

// --pp-layout (Megatron's --pipeline-model-parallel-layout): the virtual
// stages as written, repeats expanded, a loss-only stage kept as a stage that
// passes micro-batches on (its logits and loss, no layer); every bound holds;
// malformed layouts are refused with the position and the rule.
TEST(SimPipelineLayout, StagesAsWrittenAndErrorsByPosition) {
  auto lay = parsePipelineLayout("Et|(tt|)*3mL");
  ASSERT_TRUE(lay.isOk()) << lay.status().message();
  ASSERT_EQ(lay->size(), 5u);
  EXPECT_TRUE((*lay)[0].embedding);
  EXPECT_EQ((*lay)[0].layers, 1);
  EXPECT_EQ((*lay)[2].layers, 2);
  EXPECT_EQ((*lay)[4].layers, 0);
  EXPECT_EQ((*lay)[4].mtp, 1);
  EXPECT_TRUE((*lay)[4].loss);
  for (auto [text, what] : {std::pair{"Et|(tt|*3L", "'(' at 3 is not closed"}, std::pair{"Et|tx|L", "'x' at 4"},
                            std::pair{"tE|tL", "E (the embedding) must open the first stage"},
                            std::pair{"Et|m|tL", "MTP depths (m) belong to the last stage"},
                            std::pair{"Et|t*|L", "'*' at 4 needs a count"}, std::pair{"Et|tt", "end with L"}}) {
    auto e = parsePipelineLayout(text);
    ASSERT_FALSE(e.isOk()) << text;
    EXPECT_NE(e.status().message().find(what), std::string::npos) << e.status().message();
  }
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("fat-tree", 2);
  TrainConfig k;
  k.gpus = 16, k.tp = 2, k.pp = 2, k.vpp = 2, k.dp = 4;
  k.global_batch = 16, k.micro_batch = 1, k.seq = 2048, k.recompute = Recompute::None;
  auto uniform = simulateTraining(gpt(8, 2048, 16), c, k, reg);
  k.pp_layout = "Et|tttt|ttt|L";  // the last virtual stage holds only the logits and the loss
  auto laid = simulateTraining(gpt(8, 2048, 16), c, k, reg);
  ASSERT_TRUE(uniform.isOk()) << uniform.status().message();
  ASSERT_TRUE(laid.isOk()) << laid.status().message();
  EXPECT_NE(laid->iteration_s, uniform->iteration_s);
  EXPECT_GE(laid->iteration_s, laid->bounds.max() * (1 - 1e-12));
  ASSERT_EQ(laid->schedule_spec.chunks.size(), 4u);
  EXPECT_EQ(laid->schedule_spec.chunks[3].size(), 1u);  // the loss-only stage's pass
  EXPECT_EQ(laid->schedule_spec.chunks[1].size(), 4u);
  k.pp_layout = "Et|ttt|ttt|L";  // 7 layers for an 8-layer model
  auto short7 = simulateTraining(gpt(8, 2048, 16), c, k, reg);
  ASSERT_FALSE(short7.isOk());
  EXPECT_NE(short7.status().message().find("has 4 stages, 7 decoder layers"), std::string::npos) << short7.status().message();
  k.pp_layout = "Et|tttt|ttt|L", k.first_stage_layers = 1;
  auto both = simulateTraining(gpt(8, 2048, 16), c, k, reg);
  ASSERT_FALSE(both.isOk());
  EXPECT_NE(both.status().message().find("give one"), std::string::npos) << both.status().message();
}

// Experts folded over tp (--etp 1) with ep x etp < tp: at dp = 1 the
// experts are still replicated over an expert-data-parallel group (tp / ep
// = 2 GPUs here), whose gradients must be reduced: the schedule prices that
// reduce (it skipped every data-parallel collective at dp x cp = 1 and beat
// the NIC bound by a third in the property test's draw).
TEST(SimMoeDispatch, FoldedExpertsReduceOverTheirGroupAtDpOne) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("rail-optimized", 4, ", \"leaf_nodes\": 2", 2, 1);  // 2 GPUs and 1 NIC per node
  ModelSpec moe = gpt(8, 1024, 16);
  moe.moe.experts = 16, moe.moe.top_k = 2, moe.moe.expert_ffn_hidden = 1024, moe.moe.dense_layers = 1;
  TrainConfig k;
  k.gpus = 4, k.tp = 4, k.pp = 1, k.dp = 1, k.ep = 2, k.etp = 1;
  k.global_batch = 1, k.micro_batch = 1, k.seq = 2048, k.recompute = Recompute::Full;
  k.sequence_parallel = false;
  auto r = simulateTraining(moe, c, k, reg);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_GT(r->stage.dp_rs_s, 0);
  EXPECT_GE(r->iteration_s, r->bounds.max() * (1 - 1e-12)) << r->bounds.binding;
}

// A 64-way expert group packed into 72-GPU racks straddles two of them and
// its all-to-all crosses NICs; aligned to 64 per rack it stays on NVLink.
TEST(SimPlacement, AnExpertGroupThatStraddlesRacksPaysForItsNics) {
  const plan::Registry reg = plan::Registry::builtin();
  ModelSpec moe = gpt(8, 2048, 16);
  moe.moe.experts = 64, moe.moe.top_k = 4, moe.moe.expert_ffn_hidden = 1024;
  TrainConfig k;
  k.gpus = 256, k.tp = 1, k.pp = 4, k.dp = 64, k.ep = 64;
  k.global_batch = 512, k.micro_batch = 1, k.seq = 2048, k.recompute = Recompute::None;
  k.schedule = false, k.stage_costs = false;
  auto run = [&](int64_t use) {
    auto c = placedCluster(racks72(), use, k.gpus);
    EXPECT_TRUE(c.isOk()) << c.status().message();
    auto r = simulateTraining(moe, *c, k, reg);
    EXPECT_TRUE(r.isOk()) << r.status().message();
    return *r;
  };
  const TrainReport aligned = run(64), packed = run(72);
  EXPECT_EQ(aligned.placement, "64 of 72 GPUs in each of 4 NVLink domains");
  EXPECT_EQ(packed.placement, "72 GPUs in each of 4 NVLink domains");
  EXPECT_LT(aligned.breakdown.at("ep_comm_s"), packed.breakdown.at("ep_comm_s") / 4);
  EXPECT_LT(aligned.iteration_s, packed.iteration_s);
  EXPECT_EQ(packed.bottleneck, "ep_comm_s");
  EXPECT_NE(packed.bottleneck_link.find("nic"), std::string::npos) << packed.bottleneck_link;
}

// ---- expert dispatch -----------------------------------------------------------

struct MoeCase {
  plan::Registry reg = plan::Registry::builtin();
  ClusterSpec c = cluster("fat-tree", 4);  // 32 GPUs, 8 per node
  ModelSpec m = [] {
    ModelSpec x = gpt(8, 2048, 16);
    x.moe.experts = 32, x.moe.top_k = 4, x.moe.expert_ffn_hidden = 1024;
    return x;
  }();
  TrainConfig k = [] {
    TrainConfig x;
    x.gpus = 32, x.tp = 1, x.pp = 1, x.dp = 32, x.ep = 32;  // the expert group spans the 4 nodes
    x.global_batch = 64, x.micro_batch = 1, x.seq = 2048, x.recompute = Recompute::None;
    x.schedule = false, x.stage_costs = false;
    return x;
  }();
  Result<TrainReport> run(const ModelSpec& model, const TrainConfig& cfg) { return simulateTraining(model, c, cfg, reg); }
  double ep(const TrainConfig& cfg) {
    auto r = run(m, cfg);
    EXPECT_TRUE(r.isOk()) << r.status().message();
    return r.isOk() ? r->breakdown.at("ep_comm_s") : 0;
  }
};

TEST(SimMoeDispatch, ImbalanceSlowsTheBusiestRankAndIsRangeChecked) {
  MoeCase x;
  TrainConfig k = x.k;
  const double balanced = x.ep(k);
  k.moe_imbalance = 2;  // one local expert (32 / 32) at twice the mean: the rank receives twice the copies
  EXPECT_GT(x.ep(k), 1.5 * balanced);
  auto r1 = x.run(x.m, x.k), r2 = x.run(x.m, k);
  ASSERT_TRUE(r1.isOk() && r2.isOk());
  EXPECT_GT(r2->breakdown.at("compute_s"), r1->breakdown.at("compute_s"));  // its grouped GEMM too
  for (double bad : {0.5, 0.0, 9.0}) {  // 9 > experts / top_k = 8
    k.moe_imbalance = bad;
    auto e = x.run(x.m, k);
    ASSERT_FALSE(e.isOk()) << bad;
    EXPECT_NE(e.status().message().find("--moe-imbalance"), std::string::npos) << e.status().message();
  }
  TrainConfig dense = x.k;
  dense.ep = 1, dense.moe_imbalance = 2;
  auto e = x.run(gpt(8, 2048, 16), dense);
  ASSERT_FALSE(e.isOk());
  EXPECT_NE(e.status().message().find("has no experts"), std::string::npos) << e.status().message();
}

TEST(SimMoeDispatch, Fp8DispatchHalvesOneDirection) {
  MoeCase x;
  TrainConfig k = x.k;
  const double bf16 = x.ep(k);
  k.fp8_dispatch = true;
  const double fp8 = x.ep(k);
  EXPECT_LT(fp8, 0.85 * bf16);  // the dispatch at about half the bytes,
  EXPECT_GT(fp8, 0.70 * bf16);  // the combine unchanged
}

TEST(SimMoeDispatch, HierarchicalSendsEachTokenOncePerNode) {
  MoeCase x;
  TrainConfig k = x.k;
  auto flat = x.run(x.m, k);
  k.moe_dispatch = TrainConfig::MoeDispatch::Hierarchical;
  auto hier = x.run(x.m, k);
  ModelSpec limited = x.m;  // node-limited routing: 4 groups (one per node), each token inside one
  limited.moe.n_group = 4, limited.moe.topk_group = 1;
  auto lim = x.run(limited, k);
  ASSERT_TRUE(flat.isOk() && hier.isOk() && lim.isOk());
  // 4 copies per token, 3 of 4 nodes remote: flat sends 3 copies over the NICs,
  // hierarchical one per distinct remote node (4 (1 - C(24,4)/C(32,4)) x 3/4 = 2.05), node-limited 3/4.
  const double fn = flat->bounds.seconds.at("nic_port"), hn = hier->bounds.seconds.at("nic_port"),
               ln = lim->bounds.seconds.at("nic_port");
  EXPECT_LT(hn, 0.8 * fn);
  EXPECT_LT(ln, 0.5 * hn);
  EXPECT_LT(hier->breakdown.at("ep_comm_s"), flat->breakdown.at("ep_comm_s"));
  EXPECT_LT(lim->breakdown.at("ep_comm_s"), hier->breakdown.at("ep_comm_s"));
  // An expert group that does not fill whole nodes cannot be split that way.
  ModelSpec odd = x.m;
  odd.moe.experts = 24;
  TrainConfig bad = k;
  bad.gpus = 24, bad.dp = 24, bad.ep = 12, bad.global_batch = 48;
  auto e = x.run(odd, bad);
  ASSERT_FALSE(e.isOk());
  EXPECT_NE(e.status().message().find("must fill whole"), std::string::npos) << e.status().message();
}

// Inside a node DeepEP delivers a token once per GPU that holds one of its
// experts (the GPU's local experts share that copy), and permutes no tokens
// before the dispatch: with 32 experts on the 8 GPUs of one node, 4 per GPU,
// and group-limited routing (8 groups of 4 = one GPU each, top-4 groups), a
// token's 8 copies reach 4 (1 - C(12,8)/C(16,8)) = 3.85 GPUs, so NVLink
// carries 0.48 of the all-to-all dispatcher's bytes.  Megatron-LM's MoE layer
// benchmark measures this case (bench/validation/moe_layer.py).
TEST(SimMoeDispatch, DeepEpSendsOneCopyPerGpuInsideANode) {
  MoeCase x;
  x.c = cluster("fat-tree", 1);
  ModelSpec m = x.m;
  m.moe.experts = 32, m.moe.top_k = 8, m.moe.n_group = 8, m.moe.topk_group = 4;
  TrainConfig k = x.k;
  k.gpus = 8, k.dp = 8, k.ep = 8, k.global_batch = 8;
  auto flat = x.run(m, k);
  k.moe_dispatch = TrainConfig::MoeDispatch::Hierarchical;
  auto deepep = x.run(m, k);
  ASSERT_TRUE(flat.isOk() && deepep.isOk()) << flat.status().message() << deepep.status().message();
  const double share = 4 * (1 - 495.0 / 12870) / 8;
  const TrainReport::MoeBlock &a = flat->moe_block, &b = deepep->moe_block;
  // The dispatch's bandwidth term scales with the bytes (its latency does not).
  EXPECT_NEAR(b.dispatch_s / a.dispatch_s, share, 0.05);
  EXPECT_LT(b.permute_s, 0.6 * a.permute_s);
  EXPECT_DOUBLE_EQ(b.experts_fwd_s, a.experts_fwd_s);  // the experts compute the same tokens
  // The block is its parts: forward = experts + router + permutes + dispatch + combine.
  for (const TrainReport::MoeBlock* blk : {&a, &b}) {
    EXPECT_NEAR(blk->forward_s,
                blk->experts_fwd_s + blk->shared_fwd_s + blk->router_s + blk->permute_s + blk->dispatch_s + blk->combine_s,
                1e-9);
    EXPECT_GT(blk->backward_s, 1.8 * blk->experts_fwd_s);  // dgrad + wgrad
  }
  EXPECT_EQ(simulateTraining(gpt(8, 2048, 16), x.c, [&] {
              TrainConfig d = k;
              d.ep = 1, d.moe_dispatch = TrainConfig::MoeDispatch::AllToAll;
              return d;
            }(), x.reg)->moe_block.forward_s, 0.0);  // no MoE layer: no block
}

// --clock burst prices the tensor cores at the boost clock of the kernel
// benchmarks (a short benchmark such as Megatron-LM's MoE layer test), the
// default at the GPU's sustained clock (a training run): the experts' GEMMs
// are at most 1 / sustained_clock_ratio slower sustained (less where the fixed
// cost or HBM binds), the all-to-alls the same.
TEST(SimMoeDispatch, BurstClockSpeedsTheTensorCoresOnly) {
  MoeCase x;
  const double ratio = computeSpecFor(x.c.gpu)->sustained;
  ASSERT_LT(ratio, 1.0);
  TrainConfig k = x.k;
  auto held = x.run(x.m, k);
  k.burst_clock = true;
  auto burst = x.run(x.m, k);
  ASSERT_TRUE(held.isOk() && burst.isOk());
  const TrainReport::MoeBlock &a = held->moe_block, &b = burst->moe_block;
  EXPECT_LT(b.experts_fwd_s, a.experts_fwd_s);
  EXPECT_GE(b.experts_fwd_s, ratio * a.experts_fwd_s - 1e-12);
  EXPECT_DOUBLE_EQ(b.dispatch_s, a.dispatch_s);
  EXPECT_DOUBLE_EQ(b.permute_s, a.permute_s);
  EXPECT_LT(burst->iteration_s, held->iteration_s);
}

// ---- compressed reductions (sim/compress.hpp) ------------------------------------

TEST(SimCompress, ParsesTheWireAndRefusesWhatItCannotCompress) {
  auto bf16 = parseCompression("bf16"), fp8 = parseCompression("fp8"), fp8b = parseCompression("fp8:32");
  ASSERT_TRUE(bf16.isOk() && fp8.isOk() && fp8b.isOk());
  EXPECT_DOUBLE_EQ(bf16->wireBytes(), 2);
  EXPECT_DOUBLE_EQ(fp8->wireBytes(), 1 + 4.0 / 128);
  EXPECT_DOUBLE_EQ(fp8b->wireBytes(), 1 + 4.0 / 32);
  EXPECT_FALSE(parseCompression("none")->on());
  for (const char* bad : {"fp8:16", "fp8:2000", "fp8:x", "fp8x", "int8"}) {
    auto e = parseCompression(bad);
    ASSERT_FALSE(e.isOk()) << bad;
    EXPECT_NE(e.status().message().find("--compress"), std::string::npos) << e.status().message();
  }
  Status prod = checkCompression(*fp8, plan::Collective::Broadcast, 4);
  ASSERT_FALSE(prod.isOk());
  EXPECT_NE(prod.message().find("allreduce, reducescatter and allgather"), std::string::npos) << prod.message();
  Status same = checkCompression(*bf16, plan::Collective::AllReduce, 2);  // bf16 data on a bf16 wire
  ASSERT_FALSE(same.isOk());
  EXPECT_NE(same.message().find("narrower"), std::string::npos) << same.message();
  EXPECT_TRUE(checkCompression(*fp8, plan::Collective::AllReduce, 2).isOk());
  EXPECT_EQ(quantizations(plan::Collective::AllReduce), 2);
  EXPECT_EQ(quantizations(plan::Collective::ReduceScatter), 1);
  EXPECT_EQ(quantizations(plan::Collective::AllGather), 1);
}

// Eight single-GPU nodes, one 22.5 GB/s NIC port each: the allreduce is
// bound by the port, and a compressed plan moves the same per-rank traffic
// times wire / data bytes (fp8: 1.03 of 4 B), plus its quantize passes over
// HBM (about S (2 + 3r) bytes at 2039 GB/s x 0.8).
TEST(SimCompress, ACompressedAllreduceMovesTheWireBytes) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("fat-tree", 8, "", 1, 1);
  const double S = 1073741824.0;
  auto none = simulateCollective(c, 8, "allreduce", S, "", reg);
  auto bf16 = simulateCollective(c, 8, "allreduce", S, "", reg, NetMode::Analytical, Library::Chorus, *parseCompression("bf16"));
  auto fp8 = simulateCollective(c, 8, "allreduce", S, "", reg, NetMode::Analytical, Library::Chorus, *parseCompression("fp8"));
  ASSERT_TRUE(none.isOk() && bf16.isOk() && fp8.isOk()) << none.status().message() << bf16.status().message()
                                                        << fp8.status().message();
  EXPECT_DOUBLE_EQ(fp8->wire_bytes, S * (1 + 4.0 / 128) / 4);
  EXPECT_EQ(fp8->quantizations, 2);
  EXPECT_EQ(none->quantizations, 0);
  EXPECT_GT(fp8->quantize_us, 0);
  EXPECT_LT(bf16->time_us, 0.6 * none->time_us);
  EXPECT_GT(bf16->time_us, 0.45 * none->time_us);
  EXPECT_LT(fp8->time_us, 0.35 * none->time_us);
  EXPECT_GT(fp8->time_us, 0.25 * none->time_us);
  EXPECT_NEAR(fp8->busbw_gbps * fp8->time_us, none->busbw_gbps * none->time_us, 1e-6 * none->busbw_gbps * none->time_us);  // data bytes
  auto bcast = simulateCollective(c, 8, "broadcast", S, "", reg, NetMode::Analytical, Library::Chorus, *parseCompression("fp8"));
  EXPECT_FALSE(bcast.isOk());
}

// train --compress: the data-parallel gradients' reduce-scatter carries the
// wire format (fp8: 1.03 B per parameter instead of the fp32 buffer's 4); the
// parameters' all-gather stays bf16 (2 B).  dp 8 over eight single-GPU nodes:
// the NIC-port bound is (2 + wire) x P x 7/8 / 22.5 GB/s.
TEST(SimCompress, TrainReduceScattersTheGradientsOnTheWire) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("fat-tree", 8, "", 1, 1);
  TrainConfig k = dp8(64, 2048);
  auto none = simulateTraining(gpt(8, 2048, 16), c, k, reg);
  k.grad_compress = *parseCompression("fp8");
  auto fp8 = simulateTraining(gpt(8, 2048, 16), c, k, reg);
  ASSERT_TRUE(none.isOk() && fp8.isOk()) << none.status().message() << fp8.status().message();
  EXPECT_NEAR(fp8->bounds.seconds.at("nic_port") / none->bounds.seconds.at("nic_port"), (2 + 1 + 4.0 / 128) / (2 + 4),
              1e-9);
  EXPECT_LT(fp8->breakdown.at("dp_comm_s"), none->breakdown.at("dp_comm_s"));
  k.grad_bytes = 2, k.grad_compress = *parseCompression("bf16");  // a bf16 buffer on a bf16 wire: nothing to gain
  auto same = simulateTraining(gpt(8, 2048, 16), c, k, reg);
  ASSERT_FALSE(same.isOk());
  EXPECT_NE(same.status().message().find("--compress bf16"), std::string::npos) << same.status().message();
}

// ---- flow-level network ------------------------------------------------------

// Equal flows on dedicated links finish together: the flow model reproduces
// the analytical bandwidth terms of sim_model_test (ring in a node: 14 x 2^27 B
// / 240e9 B/s; across two nodes: 30 x 2^26 B / 22.5e9 B/s).  At these sizes it
// runs the expanded programs (no round barriers), whose 512 KiB / 1 MiB slices
// overlap each step's latency with the next slice's transfer, so one latency
// remains (1 us in a node, 2 us across) instead of one per step.
TEST(SimFlow, EqualFlowsMatchTheAnalyticalModel) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("fat-tree", 4);
  auto in = simulateCollective(c, 8, "allreduce", 1073741824.0, "ring", reg, NetMode::Flow);
  auto across = simulateCollective(c, 16, "allreduce", 1073741824.0, "ring", reg, NetMode::Flow);
  ASSERT_TRUE(in.isOk() && across.isOk());
  EXPECT_NEAR(in->time_us, 1 + 14 * (134217728 / 240e9 * 1e6), 1e-3);
  EXPECT_NEAR(across->time_us, 2 + 30 * (67108864 / 22.5e9 * 1e6), 1e-3);
}

// A pipelined plan (the double binary tree, sliced) on 4 single-GPU nodes, one
// 22.5e9 B/s port each, 16 MiB in 1 MiB slices (S = 8 per tree).
//  - Analytical: the fill is the four rounds once with a slice (up level 2: one
//    slice per port; up level 1 and down level 1: two; down level 2: one) plus
//    their 2 us latencies; each of the 7 further steps moves every round's
//    slice at once: three slices out of (and into) every port.
//    = (1 + 2 + 2 + 1 + 7 x 3) x 2^20 / 22.5e9 + 4 x 2 us.
//  - Unsliced (one chunk): the same rounds with 8 MiB each, one after another.
//  - Flow (the programs run): never faster than the ports allow (each sends
//    3 x 8 MiB), and within 30 % of it.
TEST(SimFlow, PipelinedTreeIsPricedAsAPipeline) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("fat-tree", 4, R"(, "leaf_nodes": 4)", 1, 1);
  const Topology topo = topologyOf(c);
  const GroupSet all{4, 1, 1};
  const double slice = 1048576 / 22.5e9, ports = 3 * 8388608 / 22.5e9;
  NetworkModel ana(c, topo, reg, NetMode::Analytical), flow(c, topo, reg, NetMode::Flow);
  auto a = ana.collective(plan::Collective::AllReduce, Bytes(16777216), all, "double_tree");
  auto f = flow.collective(plan::Collective::AllReduce, Bytes(16777216), all, "double_tree");
  ASSERT_TRUE(a.isOk() && f.isOk());
  EXPECT_NEAR(a->time.value(), 27 * slice + 8e-6, 1e-12);
  EXPECT_GE(f->time.value(), ports);
  EXPECT_LE(f->time.value(), 1.3 * ports);
  ana.setChunkBytes(uint64_t{1} << 30);
  auto whole = ana.collective(plan::Collective::AllReduce, Bytes(16777216), all, "double_tree");
  ASSERT_TRUE(whole.isOk());
  EXPECT_NEAR(whole->time.value(), 48 * slice + 8e-6, 1e-12);
}

// The program simulation keeps the TCP transport's clear-to-send: with every
// message between nodes waiting for its receive and a grant (one route
// latency back), a ring across nodes takes longer than with eager messages.
TEST(SimFlow, ClearToSendCostsTheGrantsTrip) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec eager = cluster("fat-tree", 4, R"(, "leaf_nodes": 4)", 1, 1);
  const ClusterSpec cts = cluster("fat-tree", 4, R"(, "leaf_nodes": 4, "rendezvous_bytes": 1)", 1, 1);
  auto e = simulateCollective(eager, 4, "allreduce", 4194304.0, "ring", reg, NetMode::Flow);
  auto r = simulateCollective(cts, 4, "allreduce", 4194304.0, "ring", reg, NetMode::Flow);
  ASSERT_TRUE(e.isOk() && r.isOk()) << r.status().message();
  EXPECT_GT(r->time_us, e->time_us + 2);
  EXPECT_LT(r->time_us, e->time_us + 6 * 2 * 2 + 1);  // at most a grant per ring step on the critical path
}

// ECMP: 4 single-GPU nodes, 2 per leaf, so a leaf's uplink is 2 spine lanes of
// one NIC's rate (22.5e9 B/s).  Shift-by-2 sends two flows of 2^20 B out of
// each leaf.  The analytical model spreads them perfectly (2 x 2^20 B over 2
// lanes = one NIC time); the flow model hashes each onto a lane, so a
// collision doubles the time.  Either way it is never faster.
TEST(SimFlow, EcmpCollisionsAreNeverFaster) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("fat-tree", 4, R"(, "leaf_nodes": 2)", 1, 1);
  auto topo = Topology::build(c);
  ASSERT_TRUE(topo.isOk());
  EXPECT_EQ(topo->lanes(), 2);
  NetworkModel ana(c, *topo, reg, NetMode::Analytical), flow(c, *topo, reg, NetMode::Flow);
  const GroupSet pairs{2, 2, 2};  // {0, 2} and {1, 3}: every flow crosses the spine
  auto a = ana.sendRecv(Bytes(1048576), pairs);
  auto f = flow.sendRecv(Bytes(1048576), pairs);
  ASSERT_TRUE(a.isOk() && f.isOk());
  const double one = 2e-6 + 1048576 / 22.5e9;
  EXPECT_NEAR(a->time.value(), one, 1e-12);
  const double ratio = (f->time.value() - 2e-6) / (one - 2e-6);
  EXPECT_TRUE(std::abs(ratio - 1) < 1e-9 || std::abs(ratio - 2) < 1e-9) << ratio;
}

// Max-min fairness with events: 3 GPUs in a node, a pairwise all-to-all of
// 3 x 2^20 B: every port carries 2 flows of 2^20 B at 240e9 / 2 each, all
// finish together at 2^21 / 240e9 s after the 1 us latency.
TEST(SimFlow, MaxMinSharesAPort) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("fat-tree", 1, "", 3, 1);
  auto r = simulateCollective(c, 3, "alltoall", 3 * 1048576.0, "pairwise", reg, NetMode::Flow);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  auto ana = simulateCollective(c, 3, "alltoall", 3 * 1048576.0, "pairwise", reg, NetMode::Analytical);
  ASSERT_TRUE(ana.isOk());
  EXPECT_NEAR(r->time_us, ana->time_us, 1e-6);
}

// ---- layout search ------------------------------------------------------------

TEST(SimSearch, CandidatesAreValidAndTheBestIsTheFastest) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("fat-tree", 4);
  const ModelSpec m = gpt(8, 4096, 32);
  SearchConfig sc;
  sc.gpus = 32;
  sc.global_batch = 64;
  sc.seq = 2048;
  sc.top = 5;
  const std::vector<TrainConfig> cands = enumerateLayouts(m, c, sc);
  ASSERT_FALSE(cands.empty());
  for (const TrainConfig& k : cands) {
    EXPECT_EQ(int64_t{k.tp} * k.pp * k.dp * k.cp, 32);
    EXPECT_EQ(sc.global_batch % (k.dp * k.micro_batch), 0);
    EXPECT_LE(k.tp, 8);
  }
  auto topo = Topology::build(c);
  ASSERT_TRUE(topo.isOk());
  NetworkModel net(c, *topo, reg);
  int64_t calls = 0;
  auto r = searchLayouts(m, sc, net, [&](int64_t done, int64_t total) {
    ++calls;
    EXPECT_LE(done, total);
  });
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_GT(calls, 1);
  EXPECT_EQ(r->candidates, static_cast<int64_t>(cands.size()));
  ASSERT_EQ(r->top.size(), 5u);
  for (size_t i = 1; i < r->top.size(); ++i) EXPECT_LE(r->top[i - 1].iteration_s, r->top[i].iteration_s);
  EXPECT_EQ(r->resimulated, 64);
  // Exhaustive check with fresh models (no shared cache): no candidate's
  // estimate beats the best estimate kept, and with every feasible layout
  // re-simulated, no schedule beats the top.
  double best_estimate = 1e300, best_schedule = 1e300;
  for (TrainConfig k : cands) {
    k.schedule = true;
    if (auto t = simulateTraining(m, c, k, reg); t.isOk())
      best_estimate = std::min(best_estimate, t->estimate_s), best_schedule = std::min(best_schedule, t->iteration_s);
  }
  double kept_estimate = 1e300;
  for (const TrainReport& t : r->top) kept_estimate = std::min(kept_estimate, t.estimate_s);
  EXPECT_GE(kept_estimate, best_estimate);
  sc.resimulate = 1 << 20;
  auto all = searchLayouts(m, sc, net);
  ASSERT_TRUE(all.isOk()) << all.status().message();
  EXPECT_EQ(all->resimulated, all->feasible);
  EXPECT_DOUBLE_EQ(all->top[0].iteration_s, best_schedule);
  EXPECT_GE(r->top[0].iteration_s, best_schedule);
}

// --pp-schedules: the search tries each listed pipeline schedule on the
// layouts that can run it (ZB-H1: vpp 1, pp >= 2; DualPipe: also an even pp
// and an even number of micro-batches >= 2 pp), and ranks them together.
TEST(SimSearch, TriesEachListedPipelineScheduleWhereItRuns) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("fat-tree", 4);
  const ModelSpec m = gpt(8, 4096, 32);
  SearchConfig sc;
  sc.gpus = 32, sc.global_batch = 64, sc.seq = 2048, sc.top = 3, sc.resimulate = 16;
  const size_t plain = enumerateLayouts(m, c, sc).size();
  auto list = parsePpSchedules("1f1b,zb-h1,dualpipe");
  ASSERT_TRUE(list.isOk());
  sc.pp_schedules = *list;
  const std::vector<TrainConfig> cands = enumerateLayouts(m, c, sc);
  size_t zb = 0, dual = 0;
  for (const TrainConfig& k : cands) {
    if (k.zero_bubble) {
      ++zb;
      EXPECT_TRUE(k.vpp == 1 && k.pp >= 2) << layoutName(k);
    }
    if (k.dualpipe) {
      ++dual;
      const int64_t mb = k.global_batch / (int64_t{k.dp} * k.micro_batch);
      EXPECT_TRUE(k.vpp == 1 && k.pp % 2 == 0 && mb % 2 == 0 && mb >= 2 * k.pp) << layoutName(k);
    }
    EXPECT_FALSE(k.zero_bubble && k.dualpipe);
  }
  EXPECT_GT(zb, 0u);
  EXPECT_GT(dual, 0u);
  EXPECT_EQ(cands.size(), plain + zb + dual);
  auto topo = Topology::build(c);
  ASSERT_TRUE(topo.isOk());
  NetworkModel net(c, *topo, reg);
  auto r = searchLayouts(m, sc, net);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  ASSERT_FALSE(r->top.empty());
  for (size_t i = 1; i < r->top.size(); ++i) EXPECT_LE(r->top[i - 1].iteration_s, r->top[i].iteration_s);
  for (auto [text, what] : {std::pair{"1f1b,zb", "'zb' is not one of"}, std::pair{"dualpipe,dualpipe", "given twice"},
                            std::pair{",", "name at least one"}}) {
    auto e = parsePpSchedules(text);
    ASSERT_FALSE(e.isOk()) << text;
    EXPECT_NE(e.status().message().find(what), std::string::npos) << e.status().message();
  }
}

TEST(SimSearch, NothingFitsIsAClearError) {
  OneNode node;
  NetworkModel& net = node.net;
  SearchConfig sc;
  sc.gpus = 8;
  sc.global_batch = 8;
  auto r = searchLayouts(gpt(96, 12288, 96), sc, net);  // 175B on 8 GPUs
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("does not fit"), std::string::npos) << r.status().message();
}

// The default reserve per GPU: the CUDA context (0.5 GiB), NCCL's buffers
// (16 channels x 2 connections x (4 + 4.7 + 0.5) MiB per communicator) and
// 5 % of what the layout allocates; a layout that fits the bare HBM but not
// with the reserve is refused, naming the reserve; --memory-reserve 0 admits
// it again; a fraction is of the HBM.
TEST(SimMemory, TheReserveKeepsHeadroom) {
  OneNode node;
  TrainConfig k = dp8(8, 2048);
  k.memory_reserve_gib = 0;
  auto bare = simulateTraining(gpt(24, 4096, 32), k, node.net);
  ASSERT_TRUE(bare.isOk()) << bare.status().message();
  const double used = bare->memory_gib_per_gpu, hbm = 80;
  EXPECT_NEAR(bare->memory.headroom_gib, hbm - used, 1e-9);
  k.memory_reserve_gib = -1;  // the default: dp 8 is one communicator
  auto def = simulateTraining(gpt(24, 4096, 32), k, node.net);
  ASSERT_TRUE(def.isOk()) << def.status().message();
  const double reserve = 0.5 + 16 * 2 * (4 + 4.7 + 0.5) / 1024 + 0.05 * used;
  EXPECT_NEAR(def->memory.reserve_gib, reserve, 1e-9);
  EXPECT_EQ(def->memory.communicators, 1);
  EXPECT_NEAR(def->memory.headroom_gib, hbm - used - reserve, 1e-9);
  k.memory_reserve_fraction = 0.1;
  auto frac = simulateTraining(gpt(24, 4096, 32), k, node.net);
  ASSERT_TRUE(frac.isOk());
  EXPECT_NEAR(frac->memory.reserve_gib, 8, 1e-9);
  // A reserve that leaves less than the layout needs: refused, and the
  // message blames the reserve.
  k.memory_reserve_fraction = 0, k.memory_reserve_gib = hbm - used + 0.1;
  auto tight = simulateTraining(gpt(24, 4096, 32), k, node.net);
  ASSERT_FALSE(tight.isOk());
  EXPECT_NE(tight.status().message().find("reserve"), std::string::npos) << tight.status().message();
  EXPECT_NE(tight.status().message().find("--memory-reserve"), std::string::npos) << tight.status().message();
  double gib = 0, fraction = 0;
  ASSERT_TRUE(parseMemoryReserve("6GiB", &gib, &fraction).isOk());
  EXPECT_EQ(gib, 6);
  ASSERT_TRUE(parseMemoryReserve("8%", &gib, &fraction).isOk());
  EXPECT_DOUBLE_EQ(fraction, 0.08);
  ASSERT_TRUE(parseMemoryReserve("default", &gib, &fraction).isOk());
  EXPECT_LT(gib, 0);
  for (const char* bad : {"x", "-1", "100%", "6 GiB"}) EXPECT_FALSE(parseMemoryReserve(bad, &gib, &fraction).isOk()) << bad;
}

// A memory error suggests only what the run can still change: never the
// ZeRO stage it already has, nor more recomputation than full.
TEST(SimMemory, HintsFollowTheFlagsGiven) {
  OneNode node;
  TrainConfig k = dp8(8, 2048);
  k.zero = 3, k.recompute = Recompute::Full;
  auto r = simulateTraining(gpt(96, 12288, 96), k, node.net);  // 175B on 8 GPUs: no ZeRO stage saves it
  ASSERT_FALSE(r.isOk());
  const std::string msg = r.status().message();
  EXPECT_EQ(msg.find("--zero"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("--recompute"), std::string::npos) << msg;
  EXPECT_NE(msg.find("more tp/pp"), std::string::npos) << msg;
  k.zero = 1, k.recompute = Recompute::None;
  auto r1 = simulateTraining(gpt(96, 12288, 96), k, node.net);
  ASSERT_FALSE(r1.isOk());
  EXPECT_NE(r1.status().message().find("--zero 2"), std::string::npos) << r1.status().message();
  EXPECT_NE(r1.status().message().find("--recompute selective/full"), std::string::npos) << r1.status().message();
}

// The search reports each layout's headroom, and counts and lists the layouts
// it dropped for memory (the nearest misses first, each over the HBM by its own
// figures); a larger reserve drops more.
TEST(SimSearch, ReportsHeadroomAndTheLayoutsDroppedForMemory) {
  OneNode node;
  SearchConfig sc;
  sc.gpus = 8, sc.global_batch = 16, sc.seq = 2048, sc.resimulate = 0;
  const ModelSpec m = gpt(32, 6144, 48);
  auto r = searchLayouts(m, sc, node.net);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  for (const TrainReport& t : r->top) {
    EXPECT_GE(t.memory.headroom_gib, 0);
    EXPECT_NEAR(t.memory.headroom_gib, 80 - t.memory_gib_per_gpu - t.memory.reserve_gib, 1e-9);
  }
  EXPECT_GT(r->dropped_memory, 0);
  EXPECT_LE(r->feasible + r->dropped_memory, r->candidates);
  ASSERT_FALSE(r->dropped.empty());
  for (size_t i = 0; i < r->dropped.size(); ++i) {
    EXPECT_GT(r->dropped[i].memory_gib_per_gpu + r->dropped[i].memory.reserve_gib, 80);
    if (i > 0) EXPECT_GE(r->dropped[i - 1].memory.headroom_gib, r->dropped[i].memory.headroom_gib);
  }
  sc.memory_reserve_gib = 20;
  auto tight = searchLayouts(m, sc, node.net);
  ASSERT_TRUE(tight.isOk()) << tight.status().message();
  EXPECT_GT(tight->dropped_memory, r->dropped_memory);
  for (const TrainReport& t : tight->top) EXPECT_LE(t.memory_gib_per_gpu, 60);
}

// ---- trace / schedule -----------------------------------------------------------

TrainReport stageOnly(int pp, int vpp, int64_t mb, double f, double b) {
  TrainReport r;
  r.config.pp = pp;
  r.config.vpp = vpp;
  r.stage.fwd_s = f;
  r.stage.bwd_s = b;
  r.stage.micro_batches = mb;
  r.stage.optimizer_s = 0.5;
  return r;
}

// 1F1B without communication: (m + p - 1) (F + B), then the optimizer:
// (8 + 3) x 3 + 0.5 = 33.5 s.  Interleaving 2 chunks per GPU shrinks the
// bubble to (p - 1) / v: 8 x 3 + 1.5 x 3 + 0.5 = 29 s.
TEST(SimTrace, OneFOneBMakespan) {
  auto plain = scheduleIteration(stageOnly(4, 1, 8, 1, 2));
  ASSERT_TRUE(plain.isOk()) << plain.status().message();
  EXPECT_NEAR(plain->makespan_s, 33.5, 1e-9);
  auto inter = scheduleIteration(stageOnly(4, 2, 8, 1, 2));
  ASSERT_TRUE(inter.isOk()) << inter.status().message();
  EXPECT_NEAR(inter->makespan_s, 29.0, 1e-9);
}

TEST(SimTrace, ChromeTraceHasATrackPerStageAndStream) {
  const plan::Registry reg = plan::Registry::builtin();
  TrainConfig cfg;
  cfg.gpus = 32, cfg.tp = 8, cfg.pp = 2, cfg.dp = 2, cfg.global_batch = 8, cfg.micro_batch = 1, cfg.zero = 1;
  auto r = simulateTraining(gpt(8, 4096, 32), cluster("fat-tree", 4), cfg, reg);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  std::stringstream out;
  auto sum = writeTrainTrace(*r, out);
  ASSERT_TRUE(sum.isOk()) << sum.status().message();
  const nlohmann::json j = nlohmann::json::parse(out.str());
  std::set<std::string> tracks;
  int64_t slices = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") tracks.insert(e["args"]["name"].get<std::string>());
    if (e["ph"] == "X") ++slices;
  }
  EXPECT_EQ(slices, sum->events);
  for (const char* t : {"stage 0 compute", "stage 1 compute", "stage 0 tp comm", "stage 1 pp send", "stage 0 dp gather",
                        "stage 1 dp reduce", "stage 1 ep comm", "stage 1 cp comm"})
    EXPECT_TRUE(tracks.count(t)) << t;
  // The trace is the simulated schedule: its makespan is the iteration time.
  EXPECT_DOUBLE_EQ(sum->makespan_s, r->iteration_s);
  EXPECT_DOUBLE_EQ(j["otherData"]["iteration_time_s"].get<double>(), r->iteration_s);
  EXPECT_NEAR(j["otherData"]["estimate_s"].get<double>() / r->iteration_s, 1.0, 0.1);
}

// The trace's slices by (track, name) in seconds: "F mb0 c1" on track d is
// micro-batch 0's forward of stage d's chunk 1.
std::map<std::pair<int64_t, std::string>, double> traceSlices(const TrainReport& r, ScheduleSummary* sum) {
  std::stringstream out;
  auto s = writeTrainTrace(r, out);
  EXPECT_TRUE(s.isOk()) << s.status().message();
  if (s.isOk()) *sum = *s;
  std::map<std::pair<int64_t, std::string>, double> slices;
  const nlohmann::json j = nlohmann::json::parse(out.str());
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "X") slices[{e["tid"].get<int64_t>(), e["name"].get<std::string>()}] = e["dur"].get<double>() * 1e-6;
  return slices;
}

// Every stage's own work, back to back, is a lower bound on the makespan.
void expectMakespanCoversEveryStage(const TrainReport& r, double makespan) {
  const int64_t p = r.config.pp;
  for (int64_t d = 0; d < p; ++d) {
    double work = r.stages[static_cast<size_t>(d)].dp_ag_s + r.stages[static_cast<size_t>(d)].dp_rs_s +
                  r.stages[static_cast<size_t>(d)].optimizer_s;
    for (int64_t c = 0; c < r.config.vpp; ++c) {
      const TrainReport::Chunk& ch = r.chunks[static_cast<size_t>(c * p + d)];
      work += static_cast<double>(r.stage.micro_batches) *
              (ch.fwd_s + ch.bwd_s + ch.recompute_s + ch.tp_fwd_s + ch.tp_bwd_s + ch.other_comm_s);
    }
    EXPECT_GE(makespan, work * (1 - 1e-12)) << "stage " << d;
  }
}

// 10 layers on 4 stages split 3, 3, 2, 2 (the first L mod p stages one layer
// more); tp = 1, so the embedding costs nothing and only the last stage adds
// the logits.  With one layer's forward Lf and the logits' G, the pacing
// stage of the analytical model is 3 Lf + G (r.stage.fwd_s), and the trace's
// forwards are F0 = F1 = 3 Lf, F2 = 2 Lf, F3 = 2 Lf + G = r.stage.fwd_s - Lf
// where Lf = F1 - F2.  (Costed as the pacing stage, all four were 3 Lf + G.)
TEST(SimTrace, UnevenStagesCostTheirOwnLayers) {
  OneNode node;
  TrainConfig cfg;
  cfg.gpus = 8, cfg.tp = 1, cfg.pp = 4, cfg.dp = 2, cfg.global_batch = 8, cfg.micro_batch = 1, cfg.zero = 1;
  cfg.recompute = Recompute::None;
  cfg.schedule = false;  // the per-chunk costs, list-scheduled (the simulated schedule: SimSchedule.*)
  auto r = simulateTraining(gpt(10, 2048, 16), cfg, node.net);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  ASSERT_EQ(r->chunks.size(), 4u);
  const int layers[] = {3, 3, 2, 2};
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(r->chunks[k].layers, layers[k]) << k;
  EXPECT_TRUE(r->chunks[0].embedding);
  EXPECT_TRUE(r->chunks[3].logits);
  ScheduleSummary sum;
  auto sl = traceSlices(*r, &sum);
  const double us = 2e-9;  // the trace's microseconds have 3 decimals
  auto fwd = [&](int64_t d) { return sl.at({d, "F mb0 c0"}); };
  auto bwd = [&](int64_t d) { return sl.at({d, "B mb0 c0"}); };
  const double lf = fwd(1) - fwd(2), lb = bwd(1) - bwd(2);
  ASSERT_GT(lf, 1e-4);
  EXPECT_NEAR(fwd(0), fwd(1), us);
  EXPECT_NEAR(fwd(1), 3 * lf, 3 * us);
  EXPECT_NEAR(bwd(1), 3 * lb, 3 * us);
  EXPECT_NEAR(fwd(3), r->stage.fwd_s - lf, 3 * us);
  EXPECT_NEAR(bwd(3), r->stage.bwd_s - lb, 3 * us);
  EXPECT_GT(fwd(3), fwd(2));  // the logits
  // The analytical model paces every stage as 3 Lf + G; the schedule's slowest
  // stage is lighter, so its makespan is shorter.
  EXPECT_LT(sum.makespan_s, r->iteration_s);
  expectMakespanCoversEveryStage(*r, sum.makespan_s);
}

// Interleaved: 10 layers over pp 2 x vpp 2 virtual stages split 3, 3, 2, 2;
// virtual stage k = chunk x pp + stage, so stage 0 holds 3 (chunk 0) and 2
// (chunk 1) layers, stage 1 holds 3 and 2 + the logits.  The analytical
// pacing stage is ceil(10 / 2) = 5 layers + G: G = r.stage.fwd_s - 5 Lf.
TEST(SimTrace, InterleavedChunksCostTheirOwnLayers) {
  OneNode node;
  TrainConfig cfg;
  cfg.gpus = 8, cfg.tp = 1, cfg.pp = 2, cfg.vpp = 2, cfg.dp = 4, cfg.global_batch = 8, cfg.micro_batch = 1;
  cfg.recompute = Recompute::None;
  cfg.schedule = false;  // the per-chunk costs, list-scheduled (the simulated schedule: SimSchedule.*)
  auto r = simulateTraining(gpt(10, 2048, 16), cfg, node.net);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  ScheduleSummary sum;
  auto sl = traceSlices(*r, &sum);
  const double us = 2e-9;
  const double c0 = sl.at({0, "F mb0 c0"}), c1 = sl.at({0, "F mb0 c1"});
  const double lf = c0 - c1;
  EXPECT_NEAR(c0, 3 * lf, 3 * us);
  EXPECT_NEAR(sl.at({1, "F mb0 c0"}), c0, us);
  EXPECT_NEAR(sl.at({1, "F mb0 c1"}), 2 * lf + (r->stage.fwd_s - 5 * lf), 5 * us);
  expectMakespanCoversEveryStage(*r, sum.makespan_s);
}

// DeepSeek-like leading dense layers: 4 layers on 4 stages, layer 0 dense
// (ffn 4h), layers 1-3 MoE (8 experts of 1024, top 2).  Stage 0's forward is
// one dense layer, priced as the same layer of the dense model of the same
// shape (stage 1 of gpt(4, ...)); stage 1's is one MoE layer, a different price.
TEST(SimTrace, LeadingDenseLayersCostAsDense) {
  OneNode node;
  TrainConfig cfg;
  cfg.gpus = 8, cfg.tp = 1, cfg.pp = 4, cfg.dp = 2, cfg.global_batch = 8, cfg.micro_batch = 1;
  cfg.recompute = Recompute::None;
  cfg.schedule = false;  // the per-chunk costs, list-scheduled (the simulated schedule: SimSchedule.*)
  ModelSpec moe = gpt(4, 2048, 16);
  moe.moe.experts = 8, moe.moe.top_k = 2, moe.moe.expert_ffn_hidden = 1024, moe.moe.dense_layers = 1;
  auto rm = simulateTraining(moe, cfg, node.net);
  ASSERT_TRUE(rm.isOk()) << rm.status().message();
  auto rd = simulateTraining(gpt(4, 2048, 16), cfg, node.net);
  ASSERT_TRUE(rd.isOk()) << rd.status().message();
  ScheduleSummary sm, sd;
  auto slm = traceSlices(*rm, &sm), sld = traceSlices(*rd, &sd);
  const double us = 2e-9;
  EXPECT_NEAR(slm.at({0, "F mb0 c0"}), sld.at({1, "F mb0 c0"}), us);
  EXPECT_NEAR(slm.at({0, "B mb0 c0"}), sld.at({1, "B mb0 c0"}), us);
  EXPECT_GT(std::abs(slm.at({1, "F mb0 c0"}) - slm.at({0, "F mb0 c0"})), 1e-5);
  EXPECT_NEAR(slm.at({1, "F mb0 c0"}), slm.at({2, "F mb0 c0"}), us);
  // The first stage's parameters: one dense layer (and the embedding), the
  // second's one MoE layer with all 8 experts (ep = 1).
  EXPECT_NEAR(rm->stages[0].params, moe.layerParams(0) + 51200.0 * 2048, 1);
  EXPECT_NEAR(rm->stages[1].params, moe.layerParams(1), 1);
  expectMakespanCoversEveryStage(*rm, sm.makespan_s);
}

// --plot draws with /usr/bin/python3 + matplotlib; where they are missing the
// error says so (and the test is skipped, as the plot is optional).
TEST(SimTrace, PlotWritesAPng) {
  const plan::Registry reg = plan::Registry::builtin();
  TrainConfig cfg;
  cfg.gpus = 8, cfg.tp = 8, cfg.global_batch = 4, cfg.micro_batch = 1, cfg.zero = 0;
  auto r = simulateTraining(gpt(4, 4096, 32), cluster("fat-tree", 1), cfg, reg);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const std::string png = testing::TempDir() + fmt::format("sim_plot_{}.png", ::getpid());
  // matplotlib comes with scripts/setup.sh (python3-matplotlib): required here.
  Status st = plotBreakdown(*r, "test", png);
  ASSERT_TRUE(st.isOk()) << st.message();
  FILE* f = std::fopen(png.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  unsigned char magic[4] = {};
  EXPECT_EQ(std::fread(magic, 1, 4, f), 4u);
  std::fclose(f);
  std::remove(png.c_str());
  EXPECT_EQ(magic[1], 'P');
  EXPECT_EQ(magic[2], 'N');
  EXPECT_EQ(magic[3], 'G');
  EXPECT_FALSE(plotBreakdown(*r, "test", "/nonexistent-dir/x.png").isOk());
}

// ---- inference ----------------------------------------------------------------------

// Decode at batch 1 reads every weight but the input embedding and the KV
// cache once: (params - V h) x 2 B + ctx x 2 x layers x h x 2 B at
// 2039e9 x 0.8 B/s, plus 8 kernels of 4 us per layer (tp = 1: no allreduce).
TEST(SimInfer, DecodeStepIsWeightAndKvBound) {
  OneNode node;
  NetworkModel& net = node.net;
  ModelSpec m = gpt(4, 4096, 32);
  InferConfig ic;
  ic.gpus = 8, ic.tp = 1, ic.rate = 5, ic.requests = 200, ic.input_len = 1024, ic.output_len = 32;
  auto r = simulateInference(m, ic, net);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const double bytes = (m.params() - 51200.0 * 4096) * 2 + 1024.0 * 2 * 4 * 4096 * 2;
  EXPECT_NEAR(r->decode_step_s, bytes / (2039e9 * 0.8) + 4 * 8 * 4e-6, 1e-12);
  EXPECT_EQ(r->replicas, 8);
  EXPECT_EQ(r->splits.size(), 7u);  // every prefill:decode split
  for (const ServeStats& s : r->splits) {
    EXPECT_EQ(s.prefill_replicas + s.decode_replicas, 8);
    EXPECT_GE(s.slo_attainment, 0);
    EXPECT_LE(s.slo_attainment, 1);
    EXPECT_LE(s.goodput_rps, s.throughput_rps + 1e-12);
    EXPECT_GT(s.kv_transfer_mean_s, 0);
  }
}

TEST(SimInfer, LoadRaisesLatencyAndTheStreamIsDeterministic) {
  OneNode node;
  NetworkModel& net = node.net;
  InferConfig ic;
  ic.gpus = 8, ic.tp = 2, ic.requests = 400, ic.input_len = 2048, ic.output_len = 64, ic.dist = LengthDist::Uniform;
  ic.rate = 2;
  auto light = simulateInference(gpt(16, 4096, 32), ic, net);
  ic.rate = 200;
  auto heavy = simulateInference(gpt(16, 4096, 32), ic, net);
  auto again = simulateInference(gpt(16, 4096, 32), ic, net);
  ASSERT_TRUE(light.isOk() && heavy.isOk() && again.isOk());
  EXPECT_GT(heavy->aggregated.ttft_p99_s, light->aggregated.ttft_p99_s);
  EXPECT_GT(heavy->aggregated.throughput_rps, light->aggregated.throughput_rps);
  EXPECT_EQ(heavy->aggregated.ttft_p50_s, again->aggregated.ttft_p50_s);
  EXPECT_EQ(heavy->best, again->best);
}

// ---- multi-head latent attention ---------------------------------------------

ModelSpec mlaModel() {
  auto m = parseModel(R"({"name": "mla", "layers": 61, "hidden": 7168, "heads": 128, "ffn_hidden": 18432,
    "vocab": 129280, "activation": "swiglu", "dropout": false,
    "mla": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128},
    "moe": {"experts": 256, "top_k": 8, "expert_ffn_hidden": 2048, "shared_experts": 1, "dense_layers": 3}})",
                      "mla.json");
  EXPECT_TRUE(m.isOk()) << m.status().message();
  return m.isOk() ? *m : ModelSpec{};
}

// DeepSeek-V3's shapes: the attention weights by hand, and the totals land on
// the published 671 B parameters / 37 B activated (the DeepSeek-V3 report;
// derived here from the shapes, not stored).
TEST(SimMla, ParametersAndCacheFollowTheLatentShapes) {
  const ModelSpec m = mlaModel();
  const double h = 7168, q = h * 1536 + 1536 + 1536 * 128 * 192, kv = h * 576 + 512 + 512 * 128 * 256;
  EXPECT_DOUBLE_EQ(m.attnInParams(), q + kv);
  EXPECT_DOUBLE_EQ(m.attnParams(), q + kv + 128 * 128 * h);
  EXPECT_NEAR(m.params() / 1e9, 671, 671 * 0.02);
  EXPECT_NEAR(m.activeParams() / 1e9, 37, 37 * 0.05);
  // The cache holds the 512-wide latent and the 64-wide rotary key, on every tp GPU.
  EXPECT_DOUBLE_EQ(m.kvCacheElems(), 576);
  EXPECT_DOUBLE_EQ(m.kvCacheSplit(8), 1);
  EXPECT_DOUBLE_EQ(m.kvWidth(), 128.0 * (192 + 128));
  // Without MLA (the same model read as MHA with head dim 56) the cache is 2 x 128 x 56 per token and layer.
  ModelSpec mha = m;
  mha.mla = {};
  EXPECT_DOUBLE_EQ(mha.kvCacheElems(), 2 * 7168);
  EXPECT_DOUBLE_EQ(mha.kvCacheSplit(8), 8);
  // Bad MLA blocks are refused with the key named.
  for (const char* bad : {R"({"name": "x", "layers": 1, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 64,
                              "vocab": 8, "mla": {"kv_lora_rank": 16, "qk_nope_head_dim": 8, "v_head_dim": 8}})",
                          R"({"name": "x", "layers": 1, "hidden": 64, "heads": 4, "ffn_hidden": 64, "vocab": 8,
                              "mla": {"qk_nope_head_dim": 8, "v_head_dim": 8}})",
                          R"({"name": "x", "layers": 1, "hidden": 64, "heads": 4, "ffn_hidden": 64, "vocab": 8,
                              "mla": {"kv_lora_rank": 16, "qk_nope_head_dim": 0, "v_head_dim": 8}})"}) {
    auto r = parseModel(bad, "bad.json");
    ASSERT_FALSE(r.isOk()) << bad;
    EXPECT_NE(r.status().message().find("bad.json"), std::string::npos) << r.status().message();
  }
}

// Decode reads the latent cache: at batch 1 and a long context an 8-layer
// dense MLA model's step is shorter than the same model read as MHA (head dim
// 56, a 2 x 7168-wide cache), on one GPU, where the KV bytes dominate.
TEST(SimMla, DecodeReadsTheLatentCache) {
  OneNode node;
  NetworkModel& net = node.net;
  InferConfig ic;
  ic.gpus = 8, ic.tp = 1, ic.rate = 1, ic.requests = 20, ic.input_len = 16384, ic.output_len = 8;
  ModelSpec m = mlaModel();
  m.layers = 8;
  m.moe = {};
  ModelSpec mha = m;
  mha.mla = {};
  auto with = simulateInference(m, ic, net);
  auto without = simulateInference(mha, ic, net);
  ASSERT_TRUE(with.isOk()) << with.status().message();
  ASSERT_TRUE(without.isOk()) << without.status().message();
  EXPECT_DOUBLE_EQ(with->kv_bytes_per_request, 8.0 * 576 * 2 * 16384);
  EXPECT_DOUBLE_EQ(without->kv_bytes_per_request, 8.0 * 2 * 7168 * 2 * 16384);
  EXPECT_LT(with->decode_step_s, without->decode_step_s);
}

}  // namespace
}  // namespace chorus::sim
