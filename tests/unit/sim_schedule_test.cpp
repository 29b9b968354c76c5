// The iteration as a simulated schedule (src/sim/schedule.hpp): hand-made
// task graphs with their makespans derived beside them, and the overlaps a
// real layout's schedule must show.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sim/schedule.hpp"
#include "sim/topology.hpp"
#include "sim/train.hpp"
#include "support/sim_fixtures.hpp"

namespace chorus::sim {
namespace {

using fixtures::cluster;
using fixtures::gpt;

Transfer nic(double s, double share = 1) {
  Transfer t;
  t.s = s;
  t.link.s[static_cast<size_t>(LinkClass::Nic)] = s * share;
  return t;
}

IterationSpec oneStage(int layers) {
  IterationSpec sp;
  sp.comm_sm_fraction = 0;
  sp.chunks.assign(1, std::vector<LayerPlan>(static_cast<size_t>(layers)));
  sp.optimizer_s = {0};
  return sp;
}

// 1F1B without communication: (m + p - 1) (F + B) and the optimizer:
// (8 + 3) x 3 + 0.5 = 33.5 s; interleaving 2 chunks per GPU (each half the
// work) shrinks the bubble to (p - 1) / v: 8 x 3 + 1.5 x 3 + 0.5 = 29 s.
TEST(SimSchedule, PipelineMakespans) {
  for (int v : {1, 2}) {
    IterationSpec sp;
    sp.pp = 4, sp.vpp = v, sp.micro_batches = 8;
    LayerPlan lp;
    lp.fwd = 1.0 / v, lp.bwd = 2.0 / v;
    sp.chunks.assign(static_cast<size_t>(4 * v), {lp});
    sp.optimizer_s.assign(4, 0.5);
    auto r = simulateSchedule(sp);
    ASSERT_TRUE(r.isOk()) << r.status().message();
    EXPECT_NEAR(r->makespan_s, v == 1 ? 33.5 : 29.0, 1e-9) << v;
    EXPECT_NEAR(r->breakdown.at("compute_s"), 24, 1e-9);
    EXPECT_NEAR(r->breakdown.at("optimizer_s"), 0.5, 1e-9);
    EXPECT_NEAR(r->breakdown.at("bubble_s"), v == 1 ? 9 : 4.5, 1e-9);
  }
}

// ZB-H1 with F = B = W = 1 s (the backward 2 s of which 1 s weight
// gradients), 4 stages, 8 micro-batches: the bubble is (p - 1)(F + B - W) =
// 3 s instead of 1F1B's 9 s (Qi et al. 2024): 8 x 3 + 3 + 0.5 = 27.5 s.  The
// order keeps i W passes pending on stage i and every W after its own B;
// interleaving is refused.
TEST(SimSchedule, ZeroBubbleH1LeavesAThirdOfTheBubble) {
  IterationSpec sp;
  sp.pp = 4, sp.vpp = 1, sp.micro_batches = 8;
  LayerPlan lp;
  lp.fwd = 1, lp.bwd = 2, lp.wgrad = 1;
  sp.chunks.assign(4, {lp});
  sp.optimizer_s.assign(4, 0.5);
  sp.comm_sm_fraction = 0;
  sp.options.zero_bubble = true;
  auto r = simulateSchedule(sp);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_NEAR(r->makespan_s, 27.5, 1e-9);
  EXPECT_NEAR(r->breakdown.at("compute_s"), 24, 1e-9);
  EXPECT_NEAR(r->breakdown.at("bubble_s"), 3, 1e-9);
  for (int64_t rank = 0; rank < 4; ++rank) {
    const auto ops = pipelineOrder(rank, 4, 1, 8, true);
    ASSERT_EQ(ops.size(), 24u);
    int64_t pending = 0, most = 0;
    std::vector<char> b_done(8, 0);
    for (const PipelineOp& op : ops) {
      if (op.fwd) continue;
      if (!op.wgrad) {
        b_done[static_cast<size_t>(op.micro)] = 1, ++pending;
      } else {
        EXPECT_TRUE(b_done[static_cast<size_t>(op.micro)]) << "rank " << rank << ": W before its B";
        --pending;
      }
      most = std::max(most, pending);
    }
    EXPECT_EQ(most, rank + 1) << "rank " << rank;  // i deferred W passes plus the one just done
  }
  sp.vpp = 2;
  sp.chunks.assign(8, {lp});
  auto bad = simulateSchedule(sp);
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("zero-bubble (ZB-H1) needs vpp = 1"), std::string::npos);
}

// DualPipe (DeepSeek-V3 report sec. 3.2.1): on every rank each copy's
// micro-batches run forward and backward once each, in order, every split
// backward's W after it; with F = 1 s, B = 2 s of which W = 1 s, the
// simulated bubble is the report's (p/2 - 1)(F&B + B - 3W) = 2 (p/2 - 1) s
// (F&B = F + B: no communication to hide), against 1F1B's 3 (p - 1) s.  A
// combined pair starts when both its inputs have arrived.
TEST(SimSchedule, DualPipeHasTheReportsBubble) {
  for (int64_t p : {2, 4, 8})
    for (int64_t m : {2 * p, 4 * p}) {
      for (int64_t rank = 0; rank < p; ++rank) {
        std::vector<int> f(static_cast<size_t>(m), 0), b(static_cast<size_t>(m), 0), w(static_cast<size_t>(m), 0);
        std::vector<char> split(static_cast<size_t>(m), 0);
        std::vector<int64_t> last_f(2, -1), last_b(2, -1);
        for (const PipelineOp& op : dualPipeOrder(rank, p, m)) {
          const auto j = static_cast<size_t>(op.micro);
          ASSERT_EQ(op.micro / (m / 2), op.chunk) << "micro-batch of the other copy";
          if (op.fwd) {
            EXPECT_GT(op.micro, last_f[static_cast<size_t>(op.chunk)]);  // in order
            last_f[static_cast<size_t>(op.chunk)] = op.micro, ++f[j];
          } else if (op.wgrad) {
            EXPECT_TRUE(b[j] && split[j]) << "W before its B, rank " << rank;
            ++w[j];
          } else {
            EXPECT_TRUE(f[j]) << "B before its F, rank " << rank;
            EXPECT_GT(op.micro, last_b[static_cast<size_t>(op.chunk)]);
            last_b[static_cast<size_t>(op.chunk)] = op.micro, ++b[j], split[j] = op.split;
          }
        }
        for (size_t j = 0; j < static_cast<size_t>(m); ++j) {
          EXPECT_EQ(f[j], 1) << "p " << p << " m " << m << " rank " << rank << " micro " << j;
          EXPECT_EQ(b[j], 1);
          EXPECT_EQ(w[j], split[j] ? 1 : 0);
        }
      }
      IterationSpec sp;
      sp.pp = p, sp.vpp = 2, sp.micro_batches = m, sp.comm_sm_fraction = 0;
      LayerPlan lp;
      lp.fwd = 1, lp.bwd = 2, lp.wgrad = 1;
      sp.chunks.assign(static_cast<size_t>(2 * p), {lp});
      sp.optimizer_s.assign(static_cast<size_t>(p), 0);
      sp.options.dualpipe = true;
      auto dual = simulateSchedule(sp);
      ASSERT_TRUE(dual.isOk()) << dual.status().message();
      EXPECT_NEAR(dual->makespan_s, 3.0 * static_cast<double>(m) + 2.0 * static_cast<double>(p / 2 - 1), 1e-9)
          << "p " << p << " m " << m;
      IterationSpec one = sp;
      one.vpp = 1, one.chunks.resize(static_cast<size_t>(p)), one.options.dualpipe = false;
      auto plain = simulateSchedule(one);
      ASSERT_TRUE(plain.isOk());
      EXPECT_NEAR(plain->makespan_s, 3.0 * static_cast<double>(m + p - 1), 1e-9);
    }
  IterationSpec bad;
  bad.pp = 3, bad.vpp = 2, bad.micro_batches = 6;
  bad.chunks.assign(6, {LayerPlan{}});
  bad.optimizer_s.assign(3, 0);
  bad.options.dualpipe = true;
  auto r = simulateSchedule(bad);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("DualPipe needs"), std::string::npos) << r.status().message();
}

// ZeRO-3 on one stage, two layers, F = B = 0.5 s, every gather and
// reduce-scatter 1 s alone and each filling the NIC.  Forward: gathers 0
// and 1 back to back [0, 1], [1, 2] (layer 1 prefetched while layer 0
// computes [1, 1.5]); F1 [2, 2.5].  Backward: gather 1 [2, 3], gather 0
// from 3; B1 [3, 3.5]; layer 1's reduce-scatter from 3.5 shares the NIC
// with gather 0, both at half speed: gather 0 ends at 4.5, the
// reduce-scatter at 5; B0 [4.5, 5]; reduce-scatter 0 [5, 6].  The NIC is
// busy from 0 to 6 (its 6 s of traffic): the makespan is 6 s, of which 2 s
// compute and 4 s exposed data-parallel communication.
TEST(SimSchedule, ZeroThreeGatherAndReduceShareTheNic) {
  IterationSpec sp = oneStage(2);
  sp.zero = 3;
  for (LayerPlan& lp : sp.chunks[0]) lp.fwd = lp.bwd = 0.5, lp.dp_ag = lp.dp_rs = nic(1);
  auto r = simulateSchedule(sp, true);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_NEAR(r->makespan_s, 6, 1e-9);
  EXPECT_NEAR(r->breakdown.at("compute_s"), 2, 1e-9);
  EXPECT_NEAR(r->breakdown.at("dp_comm_s"), 4, 1e-9);
  // A transfer that needs half of the NIC alone does not slow another such one.
  for (LayerPlan& lp : sp.chunks[0]) lp.dp_ag = lp.dp_rs = nic(1, 0.5);
  auto half = simulateSchedule(sp);
  ASSERT_TRUE(half.isOk());
  EXPECT_NEAR(half->makespan_s, 5.5, 1e-9);  // gather 0 ends at 4, B0 [4, 4.5], reduce-scatter 0 [4.5, 5.5]
}

// Megatron's asynchronous tp backward: the column-parallel collectives
// (0.6 s) run under the backward GEMMs (1 s of the 2 s backward), which
// run at 1 - 0.2 of their speed meanwhile: 0.6 x 0.8 = 0.48 s of GEMM done
// under the collective, 0.52 s after: the backward's GEMMs take 1.12 s, the
// layer F 1 + B 1 + 1.12 = 3.12 s.  On the critical path: 1 + 2 + 0.6 = 3.6 s.
TEST(SimSchedule, AsyncTensorParallelBackward) {
  IterationSpec sp = oneStage(1);
  sp.comm_sm_fraction = 0.2;
  LayerPlan& lp = sp.chunks[0][0];
  lp.fwd = 1, lp.bwd = 2, lp.bwd_async = 1;
  lp.tp_async.s = 0.6, lp.tp_async.link.s[0] = 0.6;
  auto on = simulateSchedule(sp);
  ASSERT_TRUE(on.isOk());
  EXPECT_NEAR(on->makespan_s, 3.12, 1e-9);
  EXPECT_NEAR(on->breakdown.at("tp_comm_s"), 0.12, 1e-9);  // the SMs it took
  sp.options.async_tp = false;
  auto off = simulateSchedule(sp);
  ASSERT_TRUE(off.isOk());
  EXPECT_NEAR(off->makespan_s, 3.6, 1e-9);
  EXPECT_NEAR(off->breakdown.at("tp_comm_s"), 0.6, 1e-9);
}

struct Slice {
  std::string name;
  double ts, end;
};
std::vector<Slice> slicesOf(const ScheduleResult& r, int64_t stage, int stream) {
  std::vector<Slice> out;
  for (const auto& s : r.slices)
    if (s.stage == stage && s.stream == stream) out.push_back({s.name, s.ts, s.ts + s.dur});
  return out;
}
bool overlaps(const std::vector<Slice>& a, const std::vector<Slice>& b) {
  for (const Slice& x : a)
    for (const Slice& y : b)
      if (x.ts < y.end - 1e-12 && y.ts < x.end - 1e-12) return true;
  return false;
}

// Megatron-Core's combined 1F1B (--moe-a2a-overlap) on one stage, one layer,
// 4 micro-batches, F = 1 s, B = 2 s, each pass's expert all-to-all 1 s.
// Apart: every F 1 + 1, every B 2 + 1: 20 s.  Combined: F0 [0, 1] and its
// a2a [1, 2]; then F1 with B0 from 2 (B0 needs F0 whole): F1 [2, 3], its
// a2a [3, 4] under B0 [3, 5], B0's a2a [5, 6]; the same from 6 and from 10;
// B3 alone from 14: [14, 16] and [16, 17].  17 s: every forward's a2a hides
// under a backward.  The order: one more warm-up forward, then pairs.
TEST(SimSchedule, CombinedOneFOneBHidesTheAllToAll) {
  IterationSpec sp = oneStage(1);
  sp.micro_batches = 4;
  LayerPlan& lp = sp.chunks[0][0];
  lp.fwd = 1, lp.bwd = 2, lp.ep = nic(1);
  auto apart = simulateSchedule(sp);
  ASSERT_TRUE(apart.isOk()) << apart.status().message();
  EXPECT_NEAR(apart->makespan_s, 20, 1e-9);
  EXPECT_NEAR(apart->breakdown.at("ep_comm_s"), 8, 1e-9);
  sp.options.a2a_overlap = true;
  auto combined = simulateSchedule(sp, true);
  ASSERT_TRUE(combined.isOk()) << combined.status().message();
  EXPECT_NEAR(combined->makespan_s, 17, 1e-9);
  EXPECT_NEAR(combined->breakdown.at("compute_s"), 12, 1e-9);
  EXPECT_NEAR(combined->breakdown.at("ep_comm_s"), 5, 1e-9);
  EXPECT_TRUE(overlaps(slicesOf(*combined, 0, 3), slicesOf(*combined, 0, 0)));
  const auto ops = pipelineOrder(0, 1, 1, 4, false, true);
  ASSERT_EQ(ops.size(), 8u);
  const char* want[] = {"F0", "F1+", "B0", "F2+", "B1", "F3+", "B2", "B3"};
  for (size_t i = 0; i < ops.size(); ++i)
    EXPECT_EQ((ops[i].fwd ? "F" : "B") + std::to_string(ops[i].micro) + (ops[i].combined ? "+" : ""), want[i]) << i;
  // Interleaved: every steady-state forward is combined, and the stages still agree.
  IterationSpec ip;
  ip.pp = 2, ip.vpp = 2, ip.micro_batches = 4, ip.comm_sm_fraction = 0;
  LayerPlan two;
  two.fwd = 0.5, two.bwd = 1, two.ep = nic(0.5);
  ip.chunks.assign(4, {two, two});
  ip.optimizer_s.assign(2, 0);
  auto plain = simulateSchedule(ip);
  ip.options.a2a_overlap = true;
  auto both = simulateSchedule(ip);
  ASSERT_TRUE(plain.isOk() && both.isOk());
  EXPECT_LT(both->makespan_s, plain->makespan_s);
  EXPECT_GE(both->makespan_s, 4 * 2 * 2 * 1.5);  // the compute of a stage: 4 micro-batches x 2 chunks x 2 layers
  ip.options.zero_bubble = true, ip.vpp = 1, ip.chunks.resize(2);
  auto zb = simulateSchedule(ip);
  ASSERT_FALSE(zb.isOk());
  EXPECT_NE(zb.status().message().find("two different orders"), std::string::npos) << zb.status().message();
}

// Real layouts: ZeRO-3 gathers run while layers compute; an interleaved
// pipeline's sends run while the sender computes; an MoE layer's all-to-all
// sits between its layer's compute.  And the schedule is a real schedule:
// every resource bound holds, the breakdown sums to the makespan.
TEST(SimSchedule, RealLayoutsShowTheirOverlaps) {
  const plan::Registry reg = plan::Registry::builtin();
  const ClusterSpec c = cluster("fat-tree", 4);
  auto topo = Topology::build(c);
  ASSERT_TRUE(topo.isOk());
  NetworkModel net(c, *topo, reg);
  ModelSpec moe = gpt(8, 2048, 16);
  moe.moe.experts = 8, moe.moe.top_k = 2, moe.moe.expert_ffn_hidden = 2048;
  struct Case {
    const char* what;
    ModelSpec m;
    TrainConfig k;
    int stream_a, stream_b;  // streams that must overlap on some stage
  };
  TrainConfig z3;
  z3.gpus = 32, z3.tp = 8, z3.dp = 4, z3.zero = 3, z3.global_batch = 8, z3.micro_batch = 1;
  TrainConfig ipp;
  ipp.gpus = 32, ipp.tp = 4, ipp.pp = 4, ipp.vpp = 2, ipp.dp = 2, ipp.global_batch = 16, ipp.micro_batch = 1;
  TrainConfig epl;
  epl.gpus = 32, epl.tp = 2, epl.dp = 16, epl.ep = 8, epl.global_batch = 32, epl.micro_batch = 1;
  const Case cases[] = {{"zero-3", gpt(8, 4096, 32), z3, 4 /* dp gather */, 0 /* compute */},
                        {"interleaved", gpt(16, 4096, 32), ipp, 6 /* pp send */, 0},
                        {"ep", moe, epl, 5 /* dp reduce */, 0}};
  for (const Case& k : cases) {
    auto r = simulateTraining(k.m, k.k, net);
    ASSERT_TRUE(r.isOk()) << k.what << ": " << r.status().message();
    auto s = simulateSchedule(r->schedule_spec, true);
    ASSERT_TRUE(s.isOk()) << k.what;
    EXPECT_DOUBLE_EQ(s->makespan_s, r->iteration_s) << k.what;
    bool any = false;
    for (int64_t d = 0; d < k.k.pp; ++d) any |= overlaps(slicesOf(*s, d, k.stream_a), slicesOf(*s, d, k.stream_b));
    EXPECT_TRUE(any) << k.what;
    double sum = 0;
    for (const auto& [name, x] : r->breakdown) sum += x;
    EXPECT_NEAR(sum, r->iteration_s, 1e-9 * r->iteration_s) << k.what;
    EXPECT_GE(r->iteration_s, r->bounds.max()) << k.what;
    if (std::string(k.what) == "ep") {
      EXPECT_GT(r->breakdown.at("ep_comm_s"), 0);
      // Each layer's all-to-all starts after its forward compute and ends before the next layer's.
      const auto a2a = slicesOf(*s, 0, 3);
      EXPECT_EQ(a2a.size(), static_cast<size_t>(2 * 8 * 2));  // forward + backward, 8 layers, 2 micro-batches
      EXPECT_FALSE(overlaps(a2a, slicesOf(*s, 0, 0)));
    }
  }
}

}  // namespace
}  // namespace chorus::sim
