// CPU ranks time-sharing their hosts' cores inside the simulated schedule
// (src/sim/schedule.hpp, CpuSharing; issue 35): while k of a host's ranks are
// busy each runs at min(1, capacity / k) of a calibrated thread, so a
// pipeline's idle stages (fill, drain, waits) leave their share to the busy
// ones.  Hand-made pipelines with their makespans derived beside them.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "sim/schedule.hpp"

namespace chorus::sim {
namespace {

// pp stages of one layer each (forward f, backward b at a calibrated
// thread's speed), m micro-batches, no communication, no optimizer.
IterationSpec pipeline(int64_t pp, int64_t m, double f, double b) {
  IterationSpec sp;
  sp.pp = pp, sp.vpp = 1, sp.micro_batches = m;
  sp.comm_sm_fraction = 0;
  LayerPlan lp;
  lp.fwd = f, lp.bwd = b;
  sp.chunks.assign(static_cast<size_t>(pp), {lp});
  sp.optimizer_s.assign(static_cast<size_t>(pp), 0);
  return sp;
}

// The same pipeline as the training model hands it over: every time `scale`
// times its time alone (the uniform share), and the hosts' ranks.
IterationSpec shared(IterationSpec sp, double capacity, double scale, std::vector<std::vector<double>> ranks) {
  for (auto& ch : sp.chunks)
    for (LayerPlan& lp : ch) lp.fwd *= scale, lp.bwd *= scale;
  for (double& o : sp.optimizer_s) o *= scale;
  sp.cpu.capacity = capacity, sp.cpu.time_scale = scale, sp.cpu.ranks = std::move(ranks);
  return sp;
}

double makespan(const IterationSpec& sp) {
  auto r = simulateSchedule(sp);
  EXPECT_TRUE(r.isOk()) << r.status().message();
  return r.isOk() ? r->makespan_s : -1;
}

// One micro-batch through 2 stages on one core: the stages never compute at
// once, so each runs at a whole core: (F + F + B + B) = 6 s, not the uniform
// share's 2 x 6 = 12 s.
TEST(SimCpuShare, StagesThatNeverOverlapRunAtAWholeCore) {
  const IterationSpec alone = pipeline(2, 1, 1, 2);
  EXPECT_NEAR(makespan(alone), 6, 1e-12);
  EXPECT_NEAR(makespan(shared(alone, 1, 2, {{1, 1}})), 6, 1e-12);
}

// Two micro-batches through 2 stages on one core (F = 1 s, B = 2 s):
//   0-1  stage 0 F0 alone;  1-3  F1 and stage 1's F0 at half a core each;
//   3-5  stage 1 B0 alone;  5-7  stage 0 B0 and stage 1 F1 at half (F1 done, B0 half);
//   7-9  B0's other half and stage 1 B1 at half;  9-10  B1 alone;  10-12  stage 0 B1.
// One core never idles: the makespan is the total work, 2 x 2 x 3 = 12 s
// (the uniform share: 2 x (m + p - 1) x 3 = 18 s).  Stage 0 (the last to
// finish) computed 1 + 2 + 4 + 2 = 9 s and waited 3 s.
TEST(SimCpuShare, OneCoreIsWorkConserving) {
  const IterationSpec alone = pipeline(2, 2, 1, 2);
  EXPECT_NEAR(makespan(alone), 9, 1e-12);
  auto r = simulateSchedule(shared(alone, 1, 2, {{1, 1}}));
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_NEAR(r->makespan_s, 12, 1e-9);
  EXPECT_NEAR(r->breakdown.at("compute_s"), 9, 1e-9);
  EXPECT_NEAR(r->breakdown.at("bubble_s"), 3, 1e-9);
  double sum = 0;
  for (const auto& [k, x] : r->breakdown) sum += x;
  EXPECT_NEAR(sum, r->makespan_s, 1e-9);
}

// 4 stages on one host of capacity 2, 8 micro-batches: strictly faster than
// the uniform share (2 x the unshared makespan), and no faster than the
// work over the capacity or the unshared makespan (the critical path).
TEST(SimCpuShare, APipelineOnSharedCoresLiesBetweenItsBounds) {
  const IterationSpec alone = pipeline(4, 8, 1, 2);
  const double unshared = makespan(alone);
  EXPECT_NEAR(unshared, (8 + 3) * 3, 1e-9);
  const double work = 4 * 8 * 3.0, s = makespan(shared(alone, 2, 2, {{1, 1, 1, 1}}));
  EXPECT_LT(s, 2 * unshared * (1 - 1e-3));
  EXPECT_GE(s, std::max(work / 2, unshared) * (1 - 1e-12));
  // A larger capacity never slows it; capacity >= ranks is the unshared schedule.
  const double s3 = makespan(shared(alone, 3, 4.0 / 3, {{1, 1, 1, 1}}));
  EXPECT_LE(s3, s * (1 + 1e-12));
  EXPECT_DOUBLE_EQ(makespan(shared(alone, 4, 1, {{1, 1, 1, 1}})), unshared);
}

// A stage's ranks share only their own host's cores: 2 stages of 2 ranks
// (tp 2) on two hosts of one core each run at half a core always, the
// uniform share; on one host of 2 cores the idle stage's core goes to the
// busy one.
TEST(SimCpuShare, OnlyRanksOfTheSameHostShare) {
  const IterationSpec alone = pipeline(2, 4, 1, 2);
  const double unshared = makespan(alone);
  EXPECT_NEAR(makespan(shared(alone, 1, 2, {{2, 0}, {0, 2}})), 2 * unshared, 1e-9);
  const double one_host = makespan(shared(alone, 2, 2, {{2, 2}}));
  EXPECT_LT(one_host, 2 * unshared * (1 - 1e-3));
  // A stage split over two hosts runs at its slower host's rate: stage 1's
  // second rank shares host 1 with both of stage 0's ranks (3 ranks, 1 core).
  const double split = makespan(shared(alone, 1, 3, {{1, 1}, {2, 1}}));
  EXPECT_GT(split, makespan(shared(alone, 1, 2, {{1, 1}, {1, 1}})));
}

// A collective under the backward GEMMs (asynchronous tp, comm_sm_fraction
// 0.5) on shared cores: the pacing stage's breakdown still sums to the step,
// no entry is negative, the collective's part is charged to tp, and the step
// is no shorter than unshared.
TEST(SimCpuShare, TheBreakdownSumsToTheStepWithCollectivesInFlight) {
  IterationSpec alone = pipeline(2, 4, 1, 2);
  alone.comm_sm_fraction = 0.5;
  for (auto& ch : alone.chunks) {
    ch[0].bwd_async = 1;
    ch[0].tp_async.s = 1.5;
    ch[0].tp_async.link.s[static_cast<size_t>(LinkClass::NvLink)] = 1.5;
  }
  const double unshared = makespan(alone);
  IterationSpec sp = shared(alone, 1, 2, {{1, 1}});
  for (auto& ch : sp.chunks) {
    ch[0].bwd_async *= 2;
    ch[0].tp_async.s *= 2;
    ch[0].tp_async.link.s[static_cast<size_t>(LinkClass::NvLink)] *= 2;
  }
  auto r = simulateSchedule(sp);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  double sum = 0;
  for (const auto& [k, x] : r->breakdown) {
    EXPECT_GE(x, -1e-12) << k;
    sum += x;
  }
  EXPECT_NEAR(sum, r->makespan_s, 1e-9);
  EXPECT_GT(r->breakdown.at("tp_comm_s"), 0);
  EXPECT_GE(r->makespan_s, unshared * (1 - 1e-12));
}

TEST(SimCpuShare, RefusesAnIncompleteDescription) {
  const IterationSpec alone = pipeline(2, 2, 1, 2);
  EXPECT_FALSE(simulateSchedule(shared(alone, 0, 1, {{1, 1}})).isOk());     // no capacity
  EXPECT_FALSE(simulateSchedule(shared(alone, 1, 1, {{1, 1, 1}})).isOk());  // 3 pipeline ranks of 2
  EXPECT_FALSE(simulateSchedule(shared(alone, 1, 1, {{1, 0}})).isOk());     // pipeline rank 1 nowhere
  EXPECT_FALSE(simulateSchedule(shared(alone, 1, 1, {{1, -1}})).isOk());
}

}  // namespace
}  // namespace chorus::sim
