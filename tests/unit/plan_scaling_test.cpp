// PreMulSum's scale and Avg's division as steps of the plan (plan::Scaling,
// src/plan/scaling.cpp): every reducing plan the communicator can run --
// every registered algorithm, the canonical plans, the compressed plans --
// proven by the verifier with both ops; hand-built plans that scale twice,
// scale after sending, divide before the last combine or twice, or never,
// rejected; and the models price the steps.
#include <gtest/gtest.h>

#include <fmt/ranges.h>

#include <set>

#include "plan/canonical.hpp"
#include "plan/plan.hpp"
#include "plan/verify.hpp"
#include "sim/network.hpp"
#include "sim/topology.hpp"
#include "support/sim_fixtures.hpp"
#include "tune/cost_model.hpp"

namespace chorus::plan {
namespace {

VerifyCase scaledCase(Collective c, int n, uint64_t count, int root, bool inplace, uint64_t chunk, Scaling s) {
  VerifyCase vc;
  vc.shape.coll = c;
  vc.shape.nranks = n;
  vc.shape.count = count;
  vc.shape.root = root;
  vc.shape.inplace = inplace;
  vc.shape.chunk_elems = chunk;
  vc.shape.scaling = s;
  return vc;
}

// Two hosts, contiguous (the hierarchical plans need several).
std::vector<int> twoHosts(int n) {
  std::vector<int> h(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) h[static_cast<size_t>(r)] = r < (n + 1) / 2 ? 0 : 1;
  return h;
}

// Every reducing algorithm as the communicator runs it: plain, under
// canonical mode (its canonical replacement), compressed with a wire format;
// with and without a host layout; PreMulSum and Avg.
TEST(PlanScaling, EveryReducingPlanVerifiesWithPreMulSumAndAvg) {
  Registry reg = Registry::builtin();
  std::set<std::string> plans;
  int verified = 0;
  for (const auto& algo : reg.all()) {
    const Collective c = algo->collective();
    if (!reduces(c)) continue;
    for (Scaling s : {Scaling::PreMulSum, Scaling::Avg})
      for (int n : {1, 2, 3, 4, 5, 7, 8})
        for (uint64_t count : {0, 1, 7, 33})
          for (uint64_t chunk : {0, 4})
            for (bool inplace : {false, true})
              for (bool hosts : {false, true})
                for (bool canonical : {false, true})
                  for (int root = 0; root < (c == Collective::Reduce ? n : 1); root += 2) {
                    if (canonical && algo->compressed()) continue;
                    VerifyCase vc = scaledCase(c, n, count, root, inplace, chunk, s);
                    if (hosts) vc.hosts = twoHosts(n);
                    vc.shape.hosts = vc.hosts;
                    if (algo->compressed()) vc.shape.wire = kernels::WireFormat{kernels::WireFormat::Bf16, 128};
                    vc.shape.canonical = canonical;
                    const Algorithm* run = canonical ? canonicalPlanFor(algo.get(), vc.shape) : algo.get();
                    if (!run->supports(vc.shape)) continue;
                    Status st = verify(*run, vc);
                    ASSERT_TRUE(st.isOk()) << st.message();
                    plans.insert(fmt::format("{}:{}", collectiveName(c), run->name()));
                    ++verified;
                  }
  }
  for (const auto& algo : reg.all()) {
    // Exact plans sum words, which cannot be scaled: the call planner scales
    // their input and divides their output (exact_plan_test, repro_test).
    if (!reduces(algo->collective()) || algo->exact()) continue;
    EXPECT_TRUE(plans.count(fmt::format("{}:{}", collectiveName(algo->collective()), algo->name())))
        << algo->name() << " never verified; ran: " << fmt::format("{}", plans);
  }
  EXPECT_TRUE(plans.count("allreduce:canonical") && plans.count("reducescatter:canonical") &&
              plans.count("reduce:canonical"));
  EXPECT_GT(verified, 5000);
}

// The steps themselves: PreMulSum scales this rank's input once, into
// scratch (the user's input is never written) unless the input is the output
// of an in-place call; Avg divides the output once, at the end, and a
// reduce's non-roots not at all.
TEST(PlanScaling, StepsAreWhereTheOpNeedsThem) {
  Registry reg = Registry::builtin();
  auto count = [](const Program& p, StepOp op) {
    return std::count_if(p.steps.begin(), p.steps.end(), [&](const Step& s) { return s.op == op; });
  };
  Program p;
  const Algorithm* ring = reg.find(Collective::AllReduce, "ring");
  VerifyCase vc = scaledCase(Collective::AllReduce, 4, 100, 0, false, 0, Scaling::PreMulSum);
  expand(*ring, vc.shape, 1, &p);
  ASSERT_EQ(count(p, StepOp::Scale), 1);
  EXPECT_EQ(p.steps[0].op, StepOp::Scale);
  EXPECT_EQ(p.steps[0].src.buf, Buf::Input);
  EXPECT_EQ(p.steps[0].dst.buf, Buf::Scratch);
  for (size_t i = 1; i < p.size(); ++i) {
    EXPECT_NE(p.steps[i].src.buf, Buf::Input) << "step " << i << " reads the unscaled input";
    EXPECT_NE(p.steps[i].src2.buf, Buf::Input) << "step " << i << " reads the unscaled input";
  }
  vc.shape.inplace = true;  // the input is the output: scaled where it lies
  expand(*ring, vc.shape, 1, &p);
  EXPECT_EQ(p.steps[0].op, StepOp::Scale);
  EXPECT_EQ(p.steps[0].dst.buf, Buf::Output);
  EXPECT_EQ(p.steps[0].src.buf, Buf::Output);
  // An in-place reduce-scatter's output is one block of its input: staged.
  VerifyCase rs = scaledCase(Collective::ReduceScatter, 4, 10, 0, true, 0, Scaling::PreMulSum);
  expand(*reg.find(Collective::ReduceScatter, "ring"), rs.shape, 2, &p);
  EXPECT_EQ(p.steps[0].op, StepOp::Scale);
  EXPECT_EQ(p.steps[0].dst.buf, Buf::Scratch);

  VerifyCase avg = scaledCase(Collective::AllReduce, 4, 100, 0, false, 0, Scaling::Avg);
  expand(*ring, avg.shape, 1, &p);
  ASSERT_EQ(count(p, StepOp::Divide), 1);
  EXPECT_EQ(p.steps.back().op, StepOp::Divide);
  EXPECT_EQ(p.divisor, 4u);
  const Algorithm* tree = reg.find(Collective::Reduce, "binomial");
  VerifyCase red = scaledCase(Collective::Reduce, 4, 100, 2, false, 0, Scaling::Avg);
  expand(*tree, red.shape, 2, &p);
  EXPECT_EQ(count(p, StepOp::Divide), 1);
  expand(*tree, red.shape, 1, &p);
  EXPECT_EQ(count(p, StepOp::Divide), 0);
  // Sum, and the collectives that do not reduce, have none.
  VerifyCase sum = scaledCase(Collective::AllReduce, 4, 100, 0, false, 0, Scaling::None);
  expand(*ring, sum.shape, 1, &p);
  EXPECT_EQ(count(p, StepOp::Scale) + count(p, StepOp::Divide), 0);
  VerifyCase ag = scaledCase(Collective::AllGather, 4, 100, 0, false, 0, Scaling::Avg);
  expand(*reg.find(Collective::AllGather, "ring"), ag.shape, 1, &p);
  EXPECT_EQ(count(p, StepOp::Scale) + count(p, StepOp::Divide), 0);
}

// ---- Plans the verifier must reject ---------------------------------------

enum class Bug { None, ScaleTwice, ScaleAfterSend, NoScale, DivideEarly, DivideTwice, NoDivide };

// A direct allreduce that emits the op's steps itself (scalesItself), with
// one deliberate mistake: every rank sends its (scaled) input to every other
// rank and sums what it receives into its output.
class HandScaledAllReduce final : public Algorithm {
 public:
  explicit HandScaledAllReduce(Bug bug) : bug_(bug) {}
  std::string_view name() const override { return "hand_scaled"; }
  Collective collective() const override { return Collective::AllReduce; }
  bool scalesItself() const override { return true; }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t c = sh.count;
    Region mine = in(0, c);
    if (sh.scaling == Scaling::PreMulSum && bug_ != Bug::NoScale) {
      mine = b.scratch(c);
      if (bug_ == Bug::ScaleAfterSend)
        for (int p = 0; p < n; ++p)
          if (p != r) b.send(p, in(0, c));
      b.scale(mine, in(0, c));
      if (bug_ == Bug::ScaleTwice) b.scale(mine, mine);
    }
    if (bug_ == Bug::DivideEarly) {  // divides its own contribution, not the sum
      const Region d = b.scratch(c);
      b.copy(d, in(0, c));
      b.divide(d);
      mine = d;
    }
    if (bug_ != Bug::ScaleAfterSend)
      for (int p = 0; p < n; ++p)
        if (p != r) b.send(p, mine);
    b.copy(out(0, c), mine);
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      const Region slot = b.scratch(c);
      b.recv(p, slot);
      b.reduce(out(0, c), out(0, c), slot);
    }
    if (sh.scaling != Scaling::Avg || bug_ == Bug::NoDivide || bug_ == Bug::DivideEarly) return;
    b.divide(out(0, c));
    if (bug_ == Bug::DivideTwice) b.divide(out(0, c));
  }

 private:
  Bug bug_;
};

std::string rejection(Bug bug, Scaling s) {
  HandScaledAllReduce algo(bug);
  Status st = verify(algo, scaledCase(Collective::AllReduce, 3, 5, 0, false, 0, s));
  return st.isOk() ? "" : st.message();
}

TEST(PlanScaling, TheHandBuiltPlanVerifiesWithoutItsBug) {
  EXPECT_EQ(rejection(Bug::None, Scaling::PreMulSum), "");
  EXPECT_EQ(rejection(Bug::None, Scaling::Avg), "");
  EXPECT_EQ(rejection(Bug::None, Scaling::None), "");
}

TEST(PlanScaling, ScalingTwiceIsRejected) {
  const std::string why = rejection(Bug::ScaleTwice, Scaling::PreMulSum);
  EXPECT_NE(why.find("a second time"), std::string::npos) << why;
  EXPECT_NE(why.find("hand_scaled"), std::string::npos) << why;
}

TEST(PlanScaling, ScalingAfterSendingIsRejected) {
  const std::string why = rejection(Bug::ScaleAfterSend, Scaling::PreMulSum);
  EXPECT_NE(why.find("before it is scaled"), std::string::npos) << why;
}

TEST(PlanScaling, NeverScalingIsRejected) {
  const std::string why = rejection(Bug::NoScale, Scaling::PreMulSum);
  EXPECT_NE(why.find("before it is scaled"), std::string::npos) << why;
}

TEST(PlanScaling, DividingBeforeTheLastCombineIsRejected) {
  const std::string why = rejection(Bug::DivideEarly, Scaling::Avg);
  EXPECT_NE(why.find("before its last combine"), std::string::npos) << why;
}

TEST(PlanScaling, DividingTwiceIsRejected) {
  const std::string why = rejection(Bug::DivideTwice, Scaling::Avg);
  EXPECT_NE(why.find("a second time"), std::string::npos) << why;
}

TEST(PlanScaling, NeverDividingIsRejected) {
  const std::string why = rejection(Bug::NoDivide, Scaling::Avg);
  EXPECT_NE(why.find("divided 0 times, not 1"), std::string::npos) << why;
}

// Steps of an op the call does not have: a scale in an Avg plan, a divide
// in a PreMulSum plan.
TEST(PlanScaling, StepsOfAnotherOpAreRejected) {
  HandScaledAllReduce premul(Bug::None);
  VerifyCase vc = scaledCase(Collective::AllReduce, 3, 5, 0, false, 0, Scaling::PreMulSum);
  std::vector<Program> progs(3);
  for (int r = 0; r < 3; ++r) expand(premul, vc.shape, r, &progs[static_cast<size_t>(r)]);
  vc.shape.scaling = Scaling::Avg;
  Status st = verifyPrograms("premul_as_avg", vc, progs);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("is not a PreMulSum"), std::string::npos) << st.message();
  vc.shape.scaling = Scaling::None;
  st = verifyPrograms("premul_as_sum", vc, std::move(progs));
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("is not a PreMulSum"), std::string::npos) << st.message();
}

// A plain plan (no steps of the op) checked as a PreMulSum or Avg plan: the
// verifier does not take a sum for either.
TEST(PlanScaling, PlansWithoutTheOpsStepsAreRejected) {
  Registry reg = Registry::builtin();
  const Algorithm* ring = reg.find(Collective::AllReduce, "ring");
  VerifyCase vc = scaledCase(Collective::AllReduce, 4, 9, 0, false, 0, Scaling::None);
  std::vector<Program> progs(4);
  for (int r = 0; r < 4; ++r) expand(*ring, vc.shape, r, &progs[static_cast<size_t>(r)]);
  vc.shape.scaling = Scaling::PreMulSum;
  Status st = verifyPrograms("ring_unscaled", vc, progs);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("before it is scaled"), std::string::npos) << st.message();
  vc.shape.scaling = Scaling::Avg;
  st = verifyPrograms("ring_undivided", vc, std::move(progs));
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("divided 0 times"), std::string::npos) << st.message();
}

// ---- Prices ------------------------------------------------------------------

// The cost model and the simulator charge the op's pass: more than the sum,
// by about one pass over the data, and the flow model (which runs the steps)
// agrees that it costs something.
TEST(PlanScaling, ModelsPriceTheSteps) {
  Registry reg = Registry::builtin();
  const Algorithm* ring = reg.find(Collective::AllReduce, "ring");
  tune::CostProfile prof;
  const std::vector<int> hosts(4, 0);
  Shape sh = scaledCase(Collective::AllReduce, 4, 1 << 20, 0, false, 0, Scaling::None).shape;
  const double sum = tune::modelSeconds(*ring, sh, chorusFloat32, prof, hosts)->value();
  for (Scaling s : {Scaling::PreMulSum, Scaling::Avg}) {
    sh.scaling = s;
    const double scaled = tune::modelSeconds(*ring, sh, chorusFloat32, prof, hosts)->value();
    const double pass = (Bytes(4.0 * (1 << 20)) * prof.gamma[chorusFloat32]).value();
    EXPECT_GT(scaled, sum);
    EXPECT_NEAR(scaled - sum, pass, pass * 1.01);  // one pass, out of the cache at most γ_mem
  }
}

// The simulator: the analytical model adds the pass at the GPU's HBM rate
// (2 x bytes: read and write), the flow model runs the expanded steps.
TEST(PlanScaling, SimulatorPricesTheSteps) {
  Registry reg = Registry::builtin();
  const sim::ClusterSpec c = sim::fixtures::cluster("fat-tree", 1);
  auto topo = sim::Topology::build(c);
  ASSERT_TRUE(topo.isOk());
  const sim::GroupSet g{.size = 8};
  const double bytes = 64 << 20;
  const double hbm = c.gpu.hbm_bw.value() * c.gpu.hbm_efficiency;
  for (sim::NetMode mode : {sim::NetMode::Analytical, sim::NetMode::Flow}) {
    sim::NetworkModel net(c, *topo, reg, mode);
    net.setLibrary(sim::Library::Chorus);
    auto sum = net.collective(Collective::AllReduce, Bytes(bytes), g, "ring");
    auto avg = net.collective(Collective::AllReduce, Bytes(bytes), g, "ring", Scaling::Avg);
    auto pm = net.collective(Collective::ReduceScatter, Bytes(bytes), g, "ring", Scaling::PreMulSum);
    auto rs = net.collective(Collective::ReduceScatter, Bytes(bytes), g, "ring");
    ASSERT_TRUE(sum.isOk() && avg.isOk() && pm.isOk() && rs.isOk());
    EXPECT_GT(avg->time.value(), sum->time.value());
    EXPECT_GT(pm->time.value(), rs->time.value());
    if (mode == sim::NetMode::Analytical) {
      EXPECT_NEAR(avg->time.value() - sum->time.value(), 2 * bytes / hbm, 1e-12);
      EXPECT_NEAR(pm->time.value() - rs->time.value(), 2 * bytes / hbm, 1e-12);  // the whole input, scaled
    }
  }
}

}  // namespace
}  // namespace chorus::plan
