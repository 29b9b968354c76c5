// The cost model's formula on small plans, priced by hand, and the tuner's
// use of it: the choice follows the model and the host layout.
#include <gtest/gtest.h>

#include "plan/plan.hpp"
#include "exec/board_runner.hpp"
#include "tune/cost_model.hpp"
#include "tune/tuner.hpp"
#include "toolkit/tune.hpp"

namespace chorus::tune {
namespace {

using plan::Collective;

// Round numbers, so that the expectations below can be worked out by hand.
CostProfile testProfile(int cores) {
  CostProfile p;
  p.links["shm"] = {.alpha = us(1), .beta = SecondsPerByte(1e-9), .overhead = us(0.1)};
  p.links["tcp"] = {.alpha = us(10), .beta = SecondsPerByte(4e-9), .overhead = us(1)};
  p.gamma.fill(SecondsPerByte(0.5e-9));
  p.op_overhead = us(2);
  p.cores = cores;
  p.cache_size = mib(1);
  p.board_bytes = exec::kBoardBytes;  // as a one-host communicator's
  return p;
}

plan::Shape shape(int n, uint64_t count, std::vector<int>* hosts) {
  plan::Shape sh;
  sh.coll = Collective::AllReduce;
  sh.nranks = n;
  sh.count = count;
  sh.elem_size = 4;
  if (hosts) sh.hosts = *hosts;
  return sh;
}

double price(const plan::Registry& reg, std::string_view algo, const plan::Shape& sh, const CostProfile& p,
             const std::vector<int>& host_of) {
  auto t = predictSeconds(*reg.find(Collective::AllReduce, algo), sh, chorusFloat32, p, host_of);
  EXPECT_TRUE(t.isOk()) << t.status().message();
  return t.isOk() ? t->value() : -1;
}

// The one-shot plan on one host within the board's size costs the board's
// fixed cost, then per rank n - 1 reads and reductions of the peers' slots;
// above that size, or across hosts, it is an all-pairs round like any other
// (staged: the receives land in scratch, then a reduction pass each).
TEST(CostModel, OneShotIsPricedAtTheBoardsCostWithinItsSize) {
  const plan::Registry reg = plan::Registry::builtin();
  CostProfile p = testProfile(8);
  p.board_call = us(0.3);
  std::vector<int> one_host(3, 0), hosts{0, 1, 2};
  const double b = 4000;  // 1000 floats
  EXPECT_NEAR(price(reg, "oneshot", shape(3, 1000, &one_host), p, one_host), 0.3e-6 + 2 * (b * 1e-9 + b * 0.5e-9),
              1e-12);
  // With a measured read rate for the slots (chorus-tune), that instead of the shm link's β.
  CostProfile q = p;
  q.board_beta = SecondsPerByte(0.25e-9);
  EXPECT_NEAR(price(reg, "oneshot", shape(3, 1000, &one_host), q, one_host),
              0.3e-6 + 2 * (b * 0.25e-9 + b * 0.5e-9), 1e-12);
  auto back = CostProfile::fromJson(q.toJson());
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_NEAR(back->board_beta.value(), 0.25e-9, 1e-15);
  EXPECT_NEAR(back->board_call.value(), 0.3e-6, 1e-12);
  const double big = 4 * 2048.0;  // 2048 floats: twice the board
  EXPECT_NEAR(price(reg, "oneshot", shape(3, 2048, &one_host), p, one_host),
              2e-6 + 1e-6 + 2 * (0.1e-6 + big * 1e-9 + 2 * big * 0.5e-9) + 2 * 0.1e-6, 1e-12);
  EXPECT_NEAR(price(reg, "oneshot", shape(3, 1000, &hosts), p, hosts),
              2e-6 + 10e-6 + 2 * (1e-6 + b * 4e-9 + 2 * b * 0.5e-9) + 2 * 1e-6, 1e-12);
  // Without a board (board_bytes 0: the profile as its JSON gives it, before
  // a communicator sets what its board runner takes) the same small call is
  // an all-pairs round.
  CostProfile none = p;
  none.board_bytes = 0;
  EXPECT_EQ(back->board_bytes, 0u) << "the JSON does not carry it";
  EXPECT_NEAR(price(reg, "oneshot", shape(3, 1000, &one_host), none, one_host),
              2e-6 + 1e-6 + 2 * (0.1e-6 + b * 1e-9 + 2 * b * 0.5e-9) + 2 * 0.1e-6, 1e-12);
}

TEST(CostModel, OneMessagePerRankRoundsCostAlphaTwoOverheadsAndBytes) {
  const plan::Registry reg = plan::Registry::builtin();
  const CostProfile p = testProfile(8);
  // Ring on 2 ranks, 1000 floats: a reducing round and a copying round of 2000 bytes each; the
  // reducing receive reduces straight out of the shared-memory ring, so it pays the copy in (β / 2),
  // not the copy out (CostProfile::shm_ring_bytes).
  const double b = 2000;
  const double ring = 2e-6 + (1e-6 + 0.2e-6 + b * 0.5e-9 + b * 0.5e-9) + (1e-6 + 0.2e-6 + b * 1e-9);
  EXPECT_NEAR(price(reg, "ring", shape(2, 1000, nullptr), p, {}), ring, 1e-12);
  // Recursive doubling out of place reduces its first round straight out of
  // the transport; in place it lands it in scratch and reduces in a separate
  // pass (staged): twice γ.
  const double rd = 2e-6 + (1e-6 + 0.2e-6 + 2 * b * 0.5e-9 + 2 * b * 0.5e-9);
  EXPECT_NEAR(price(reg, "recursive_doubling", shape(2, 1000, nullptr), p, {}), rd, 1e-12);
  plan::Shape inplace = shape(2, 1000, nullptr);
  inplace.inplace = true;
  const double rd_inplace = 2e-6 + (1e-6 + 0.2e-6 + 2 * b * 1e-9 + 2 * 2 * b * 0.5e-9);
  EXPECT_NEAR(price(reg, "recursive_doubling", inplace, p, {}), rd_inplace, 1e-12);
  // The same ring with the two ranks on different hosts pays the TCP link.
  const double tcp = 2e-6 + (10e-6 + 2e-6 + b * 4e-9 + b * 0.5e-9) + (10e-6 + 2e-6 + b * 4e-9);
  EXPECT_NEAR(price(reg, "ring", shape(2, 1000, nullptr), p, {0, 1}), tcp, 1e-12);
}

TEST(CostModel, AllPairsRoundsOverlapLatencyButNotWork) {
  const plan::Registry reg = plan::Registry::builtin();
  std::vector<int> one_host(4, 0);
  const plan::Shape sh = shape(4, 4000, &one_host);  // blocks of 1000 floats
  const double b = 4000;
  // Each rank receives 3 blocks (α once) and sends 3; the reductions straight out of the ring.
  const double rs = 1e-6 + 3 * (0.1e-6 + b * 0.5e-9 + b * 0.5e-9) + 3 * 0.1e-6;
  const double ag = 1e-6 + 3 * (0.1e-6 + b * 1e-9) + 3 * 0.1e-6;
  EXPECT_NEAR(price(reg, "direct", sh, testProfile(8), {0, 0, 0, 0}), 2e-6 + rs + ag, 1e-12);
  // 4 ranks on 2 cores take turns: every round costs twice as much.
  EXPECT_NEAR(price(reg, "direct", sh, testProfile(2), {0, 0, 0, 0}), 2e-6 + 2 * (rs + ag), 1e-12);
}

// The double binary tree is a pipeline (plan.hpp: pipelineSlices): sliced, a
// rank works on every round's slice at once.  4 ranks on 4 hosts, 16 MiB in
// 1 MiB slices: per slice a rank receives 5 slices over the four rounds in
// sequence (the fill: 1 at up level 2, 2 at the root, 1 and 1 going down) and
// 3 per steady step, so 5 + 7 x 3 = 26 slices' work against 5 x 8 = 40
// unsliced: about 0.65 of it, with the latencies and overheads on top.
TEST(CostModel, SlicedDoubleTreeIsPricedAsAPipeline) {
  const plan::Registry reg = plan::Registry::builtin();
  const CostProfile p = testProfile(8);
  std::vector<int> hosts{0, 1, 2, 3};
  plan::Shape sh = shape(4, 4u << 20, &hosts);
  const double whole = price(reg, "double_tree", sh, p, hosts);
  sh.chunk_elems = 256u << 10;
  const double sliced = price(reg, "double_tree", sh, p, hosts);
  EXPECT_GT(sliced, 0.55 * whole);
  EXPECT_LT(sliced, 0.75 * whole);
}

TEST(CostModel, CallsBeyondTheCacheMoveAndReduceAtTheOutOfCacheRates) {
  const plan::Registry reg = plan::Registry::builtin();
  CostProfile p = testProfile(8);
  p.links["shm"].beta_large = SecondsPerByte(4e-9);
  p.reduce_mem = SecondsPerByte(2e-9);
  // 2 ranks x (input + output) of 2^20 floats = 16 MiB on the host, 16x the
  // 1 MiB cache: 1/16 of the bytes at the in-cache rates, 15/16 out of it.
  // The 2 MiB messages go by cross-memory attach (beyond shm_ring_bytes): β in full.
  const double hot = 1.0 / 16, b = 2.0 * (1 << 20);
  const double beta = hot * 1e-9 + (1 - hot) * 4e-9, gamma = hot * 0.5e-9 + (1 - hot) * 2e-9;
  const double ring = 2e-6 + (1e-6 + 0.2e-6 + b * beta + b * gamma) + (1e-6 + 0.2e-6 + b * beta);
  EXPECT_NEAR(price(reg, "ring", shape(2, 1 << 20, nullptr), p, {}), ring, 1e-9);
  // Within the cache the in-cache rates alone (the reducing receive out of the ring: β / 2).
  const double small = 2e-6 + 2 * (1e-6 + 0.2e-6) + 2000 * 0.5e-9 + 2000 * 1e-9 + 2000 * 0.5e-9;
  EXPECT_NEAR(price(reg, "ring", shape(2, 1000, nullptr), p, {}), small, 1e-12);
}

// A reducing receive over shared memory reduces straight out of the sender's
// ring: of the link's β (a copy into the ring and one out of it, as chorus-tune
// measures it with ring allgather rounds) it pays the copy in, β / 2, then γ.
// Messages from shm_ring_bytes on go by cross-memory attach (β in full); TCP
// receives land in a bounce buffer first (β in full); staged reductions land
// in scratch (β in full, 2γ).  An in-place call's footprint counts its buffer
// once.
TEST(CostModel, ReductionsOutOfTheShmRingPayHalfTheLinksBeta) {
  const plan::Registry reg = plan::Registry::builtin();
  CostProfile p = testProfile(8);
  const plan::Algorithm& ring = *reg.find(Collective::AllReduce, "ring");
  auto model = [&](const plan::Shape& sh, const std::vector<int>& hosts, const Links& links = {}) {
    auto t = modelSeconds(ring, sh, chorusFloat32, p, hosts, links);
    EXPECT_TRUE(t.isOk()) << t.status().message();
    return t.isOk() ? t->value() : -1;
  };
  // 2 ranks, 64 Ki floats: rounds of 128 KiB messages.
  const double b = 128 * 1024;
  plan::Shape sh = shape(2, 64 * 1024, nullptr);
  const double copy_round = 1e-6 + 0.2e-6 + b * 1e-9;
  EXPECT_NEAR(model(sh, {0, 0}), 2e-6 + (1e-6 + 0.2e-6 + b * 0.5e-9 + b * 0.5e-9) + copy_round, 1e-12);
  // The same bytes over TCP between two hosts: the bounce buffer's copy, β in full.
  EXPECT_NEAR(model(sh, {0, 1}), 2e-6 + 2 * (10e-6 + 2e-6 + b * 4e-9) + b * 0.5e-9, 1e-12);
  // A one-host communicator whose host-local transport is not shm: β in full.
  EXPECT_NEAR(model(sh, {0, 0}, Links{.intra = "other", .inter = "tcp"}),
              2e-6 + 2 * (1e-6 + 0.2e-6 + b * 1e-9) + b * 0.5e-9, 1e-12);
  // Slices at or above shm_ring_bytes go by cross-memory attach: β in full.
  p.shm_ring_bytes = 64 * 1024;
  EXPECT_NEAR(model(sh, {0, 0}), 2e-6 + 2 * (1e-6 + 0.2e-6 + b * 1e-9) + b * 0.5e-9, 1e-12);
  // ... unless the executor cuts them into smaller pipeline slices (the ring's rounds are unsliced in
  // the model, but the transport sees the slices).
  sh.chunk_elems = 8 * 1024;  // 32 KiB slices
  EXPECT_NEAR(model(sh, {0, 0}), 2e-6 + (1e-6 + 0.2e-6 + b * 0.5e-9 + b * 0.5e-9) + copy_round, 1e-12);
}

// Ranks on one machine over a network transport (CHORUS_TRANSPORT=tcp on one
// host: each rank a host group of its own) share the machine's cores: 4 ranks
// on 2 cores take turns, as 4 shared-memory ranks do; on 4 machines they do not.
TEST(CostModel, LoopbackRanksShareTheMachinesCores) {
  const plan::Registry reg = plan::Registry::builtin();
  const CostProfile p = testProfile(2);
  const plan::Algorithm& ring = *reg.find(Collective::AllReduce, "ring");
  const std::vector<int> hosts{0, 1, 2, 3};
  const plan::Shape sh = shape(4, 4000, nullptr);
  Links apart, loopback;
  loopback.one_machine = true;
  auto apart_t = modelSeconds(ring, sh, chorusFloat32, p, hosts, apart);
  auto loop_t = modelSeconds(ring, sh, chorusFloat32, p, hosts, loopback);
  ASSERT_TRUE(apart_t.isOk() && loop_t.isOk());
  // 6 rounds of 4000-byte messages over TCP; each round's work twice on one machine.
  const double b = 4000, round = 10e-6 + 2e-6 + b * 4e-9;
  EXPECT_NEAR(apart_t->value(), 2e-6 + 6 * round + 3 * b * 0.5e-9, 1e-12);
  EXPECT_NEAR(loop_t->value(), 2e-6 + 2 * (6 * round + 3 * b * 0.5e-9), 1e-12);
}

TEST(CostModel, AnInPlaceCallsFootprintCountsItsBufferOnce) {
  const plan::Registry reg = plan::Registry::builtin();
  CostProfile p = testProfile(8);
  p.links["shm"].beta_large = SecondsPerByte(4e-9);
  p.reduce_mem = SecondsPerByte(2e-9);
  p.shm_ring_bytes = 0;  // β in full: this test is of the cache share
  // 2 ranks x 2^18 floats: out of place 2 x (1 + 1) MiB = 4x the 1 MiB cache, in place 2 x 1 MiB = 2x.
  plan::Shape sh = shape(2, 1 << 18, nullptr);
  auto ringTime = [&](double hot) {
    const double b = 512.0 * 1024, beta = hot * 1e-9 + (1 - hot) * 4e-9, gamma = hot * 0.5e-9 + (1 - hot) * 2e-9;
    return 2e-6 + (1e-6 + 0.2e-6 + b * beta + b * gamma) + (1e-6 + 0.2e-6 + b * beta);
  };
  EXPECT_NEAR(price(reg, "ring", sh, p, {}), ringTime(0.25), 1e-12);
  sh.inplace = true;
  EXPECT_NEAR(price(reg, "ring", sh, p, {}), ringTime(0.5), 1e-12);
}

// chorus-tune's effective cache: the hot share h of a footprint equal to the
// nominal cache that reproduces the measured rate (time per byte
// h / hot + (1 - h) / cold), times the nominal cache; clamped to
// [nominal / 16, nominal].
TEST(CostModel, EffectiveCacheIsTheHotShareThatReproducesTheMeasuredRate) {
  const Bytes nominal = mib(32);
  const double hot = 90e9, cold = 10e9;
  // At the hot rate: the whole cache; faster still: clamped to it.
  EXPECT_EQ(effectiveCacheBytes(nominal, hot, hot, cold), nominal);
  EXPECT_EQ(effectiveCacheBytes(nominal, 2 * hot, hot, cold), nominal);
  // At the cold rate (or slower): a sixteenth.
  EXPECT_EQ(effectiveCacheBytes(nominal, cold, hot, cold), nominal * (1.0 / 16));
  EXPECT_EQ(effectiveCacheBytes(nominal, cold / 2, hot, cold), nominal * (1.0 / 16));
  // Half the bytes hot: the harmonic mix of the two rates gives 16 MiB.
  const double half = 1 / (0.5 / hot + 0.5 / cold);
  EXPECT_NEAR(effectiveCacheBytes(nominal, half, hot, cold).value(), mib(16).value(), 1.0);
  // What this VM measured (2 ranks, 32 MiB footprint: 25 GB/s): about 22 MiB.
  EXPECT_NEAR(effectiveCacheBytes(nominal, 25e9, hot, cold).value() / (1 << 20), 21.6, 0.1);
  // Rates it cannot order (no measurement, hot <= cold): the nominal cache.
  EXPECT_EQ(effectiveCacheBytes(nominal, 0, hot, cold), nominal);
  EXPECT_EQ(effectiveCacheBytes(nominal, 25e9, cold, hot), nominal);
  // Round trip through the model: a call whose footprint is the nominal
  // cache, priced with the effective cache, moves h of its bytes hot.
  const plan::Registry reg = plan::Registry::builtin();
  CostProfile p = testProfile(8);
  p.gamma[chorusFloat32] = inverse(gbytePerS(90));
  p.reduce_mem = inverse(gbytePerS(10));
  p.cache_size = mib(4);  // 2 ranks x (in + out) of 2^19 floats = 8 MiB: half of it hot
  const double at_half = price(reg, "ring", shape(2, 1 << 19, nullptr), p, {});
  p.cache_size = mib(8);  // the whole footprint hot
  EXPECT_GT(at_half, price(reg, "ring", shape(2, 1 << 19, nullptr), p, {}));
}

TEST(CostModel, ProfileJsonCarriesThePerMessageOverhead) {
  CostProfile p = testProfile(3);
  auto back = CostProfile::fromJson(p.toJson());
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_NEAR(back->links.at("shm").overhead.value(), 0.1e-6, 1e-15);
  EXPECT_NEAR(back->links.at("tcp").overhead.value(), 1e-6, 1e-15);
  EXPECT_EQ(back->cores, 3);
  EXPECT_EQ(back->cache_size, mib(1));
  p.links["shm"].beta_large = SecondsPerByte(2e-9);
  p.reduce_mem = SecondsPerByte(1e-9);
  back = CostProfile::fromJson(p.toJson());
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_NEAR(back->links.at("shm").beta_large.value(), 2e-9, 1e-18);
  EXPECT_NEAR(back->reduce_mem.value(), 1e-9, 1e-18);
  EXPECT_EQ(back->links.at("tcp").beta_large, SecondsPerByte());
  // A figure the file leaves out keeps its default: a link's latency too
  // (it used to come out a million times smaller, the default scaled to
  // microseconds a second time).
  auto partial = CostProfile::fromJson(R"({"shm": {"bandwidth_gbps": 6}, "tcp": {"alpha_us": 15}})");
  ASSERT_TRUE(partial.isOk()) << partial.status().message();
  EXPECT_NEAR(partial->links.at("shm").alpha.value(), CostProfile().links.at("shm").alpha.value(), 1e-15);
  EXPECT_NEAR(partial->links.at("tcp").alpha.value(), 15e-6, 1e-15);
  auto bad = CostProfile::fromJson(R"({"shm": {"overhead_us": -1}})");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("overhead_us"), std::string::npos) << bad.status().message();
}

Result<Choice> choose(const plan::Registry& reg, std::vector<int> host_of, uint64_t count, int cores) {
  Topology topo;
  topo.nranks = static_cast<int>(host_of.size());
  topo.host_of = host_of;
  topo.all_local = std::all_of(host_of.begin(), host_of.end(), [&](int h) { return h == host_of[0]; });
  topo.one_machine = topo.all_local;  // host groups here are separate machines
  auto t = Tuner::create(reg, topo, "", 0, testProfile(cores));
  if (!t.isOk()) return t.status();
  plan::Shape sh = shape(topo.nranks, count, &host_of);
  return t->choose(sh, chorusFloat32);
}

TEST(Tuner, PicksTheBoardTheDirectAllReduceOnOneHostAndTheHierarchicalOneAcrossHosts) {
  const plan::Registry reg = plan::Registry::builtin();
  // One host, as many cores as ranks: within the board's size the one-shot
  // plan (one board exchange); above it the direct plan's 2 rounds beat the
  // ring's 6 and the trees' staged or log-depth rounds.
  for (uint64_t count : {2, 256, 16384}) {
    auto ch = choose(reg, {0, 0, 0, 0}, count, 4);
    ASSERT_TRUE(ch.isOk()) << ch.status().message();
    EXPECT_EQ(ch->algo->name(), count * 4 <= exec::kBoardBytes ? "oneshot" : "direct") << count;
  }
  // 3 hosts of 2 ranks: only the hierarchical plan keeps 5/6 of the traffic
  // off the slow links.
  for (uint64_t count : {uint64_t{16384}, uint64_t{1} << 20}) {
    auto ch = choose(reg, {0, 0, 1, 1, 2, 2}, count, 2);
    ASSERT_TRUE(ch.isOk()) << ch.status().message();
    EXPECT_EQ(ch->algo->name(), "hierarchical") << count;
  }
  // An uneven layout: the hierarchical plan refuses and something else runs.
  auto ch = choose(reg, {0, 0, 0, 1, 1}, 1u << 20, 2);
  ASSERT_TRUE(ch.isOk()) << ch.status().message();
  EXPECT_NE(ch->algo->name(), "hierarchical");
  EXPECT_NE(ch->algo->name(), "direct");
}

TEST(Tuner, PrefersTheRingOverRabenseifnerForLargeMessagesOnOneHost) {
  // The staged reduction pass makes Rabenseifner dearer than the ring once the
  // bytes dominate (it used to be picked at 4 ranks >= 4 MiB, 2x slower).
  const plan::Registry reg = plan::Registry::builtin();
  const CostProfile p = testProfile(2);
  std::vector<int> hosts(4, 0);
  for (uint64_t count : {uint64_t{1} << 20, uint64_t{1} << 24}) {
    const plan::Shape sh = shape(4, count, &hosts);
    EXPECT_LT(price(reg, "ring", sh, p, hosts), price(reg, "rabenseifner", sh, p, hosts)) << count;
  }
}

// ---- measured corrections (chorus-tune) ---------------------------------------

Correction correction(std::string algo, int nranks, std::string link, std::vector<std::pair<double, double>> pts) {
  Correction c;
  c.collective = Collective::AllReduce;
  c.algo = std::move(algo);
  c.nranks = nranks;
  c.link = std::move(link);
  c.points = std::move(pts);
  return c;
}

TEST(CostModel, CorrectionsInterpolateInLogSizeAndMatchOnlyTheirCommunicator) {
  CostProfile p = testProfile(2);
  p.setCorrection(correction("ring", 4, "shm", {{1024, 2.0}, {4096, 8.0}}));
  const auto f = [&](double bytes, int n = 4, std::string_view l = "shm", std::string_view a = "ring") {
    return p.correctionFor(Collective::AllReduce, a, n, l, bytes);
  };
  EXPECT_DOUBLE_EQ(f(1024), 2.0);
  EXPECT_DOUBLE_EQ(f(4096), 8.0);
  EXPECT_NEAR(f(2048), 4.0, 1e-12);  // halfway in log size, geometric mean of the factors
  EXPECT_DOUBLE_EQ(f(16), 2.0);      // beyond the ends: the end's factor
  EXPECT_DOUBLE_EQ(f(1 << 30), 8.0);
  EXPECT_DOUBLE_EQ(f(2048, 2), 1.0);                   // another rank count
  EXPECT_DOUBLE_EQ(f(2048, 4, "tcp"), 1.0);   // another route
  EXPECT_DOUBLE_EQ(f(2048, 4, "shm", "direct"), 1.0);
  // setCorrection replaces the entry of the same communicator and algorithm.
  p.setCorrection(correction("ring", 4, "shm", {{1024, 3.0}}));
  EXPECT_EQ(p.corrections.size(), 1u);
  EXPECT_DOUBLE_EQ(f(1 << 20), 3.0);
}

TEST(CostModel, PredictionIsTheModelTimesTheMeasuredCorrection) {
  const plan::Registry reg = plan::Registry::builtin();
  CostProfile p = testProfile(2);
  std::vector<int> hosts(2, 0);
  const plan::Shape sh = shape(2, 1000, &hosts);
  const plan::Algorithm& ring = *reg.find(Collective::AllReduce, "ring");
  auto model = modelSeconds(ring, sh, chorusFloat32, p, hosts);
  ASSERT_TRUE(model.isOk());
  p.setCorrection(correction("ring", 2, "shm", {{4000, 1.5}}));
  EXPECT_NEAR(price(reg, "ring", sh, p, hosts), 1.5 * model->value(), 1e-15);
  // Over TCP (every rank on its own host) the shared-memory entry does not apply.
  auto tcp_model = modelSeconds(ring, sh, chorusFloat32, p, {0, 1});
  ASSERT_TRUE(tcp_model.isOk());
  EXPECT_NEAR(price(reg, "ring", sh, p, {0, 1}), tcp_model->value(), 1e-15);
  EXPECT_EQ(routeKey({0, 0, 0}, {}), "shm");
  EXPECT_EQ(routeKey({0, 1, 2}, {}), "tcp");
  EXPECT_EQ(routeKey({0, 0, 1, 1}, {}), "shm+tcp");
  EXPECT_EQ(routeKey({0, 1}, {"loop", "ucx"}), "ucx");
  EXPECT_EQ(routeKey({0, 0, 1, 1}, {"loop", "ucx"}), "loop+ucx");
}

TEST(Tuner, FollowsTheMeasuredCorrectionsWhenTheyReorderThePlans) {
  // The model alone picks the direct plan on one host at 4 ranks (above); a
  // profile whose measurements found it 50x slower than modelled there must
  // make the tuner pick something else, and its predicted time carry the factor.
  const plan::Registry reg = plan::Registry::builtin();
  CostProfile p = testProfile(4);
  p.setCorrection(correction("direct", 4, "shm", {{16, 50.0}, {1 << 28, 50.0}}));
  Topology topo{4, 4, true, {0, 0, 0, 0}, true, {}};
  auto t = Tuner::create(reg, topo, "", 0, p);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  std::vector<int> hosts(4, 0);
  auto ch = t->choose(shape(4, 256, &hosts), chorusFloat32);
  ASSERT_TRUE(ch.isOk()) << ch.status().message();
  EXPECT_NE(ch->algo->name(), "direct");
  plan::Shape sh = shape(4, 256, &hosts);
  auto direct = t->price(*reg.find(Collective::AllReduce, "direct"), sh, chorusFloat32);
  auto plain = modelSeconds(*reg.find(Collective::AllReduce, "direct"), sh, chorusFloat32, p, hosts);
  ASSERT_TRUE(direct.isOk() && plain.isOk());
  EXPECT_NEAR(*direct, 50.0 * plain->value(), 1e-12);
}

// chorus-tune's record of a run: when, how many passes of the figures, and
// the figures that still moved; two passes disagree on a figure when it
// moved by more than the tolerance (TCP's only when TCP was measured); a bad
// record in a profile is refused naming the key.
TEST(CostModel, ProfileRecordsItsRunAndWhichFiguresMoved) {
  CostProfile p;
  p.measured_at = "2026-12-02T05:00:00Z", p.passes = 3, p.unstable = {"shm.alpha_us 1 -> 2 (+100 %)"};
  auto back = CostProfile::fromJson(p.toJson());
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back->measured_at, p.measured_at);
  EXPECT_EQ(back->passes, 3);
  EXPECT_EQ(back->unstable, p.unstable);
  for (auto [json, key] : {std::pair{R"({"passes": 101})", "'passes'"}, std::pair{R"({"passes": "4"})", "'passes'"},
                           std::pair{R"({"unstable": [1]})", "'unstable'"}, std::pair{R"({"measured_at": 5})", "'measured_at'"}}) {
    auto bad = CostProfile::fromJson(json);
    ASSERT_FALSE(bad.isOk()) << json;
    EXPECT_NE(bad.status().message().find(key), std::string::npos) << bad.status().message();
  }
  CostProfile a;
  CostProfile b = a;
  b.links["shm"].alpha = a.links["shm"].alpha * 1.05, b.op_overhead = a.op_overhead * 0.95;
  EXPECT_TRUE(tools::disagreeingFigures(a, b, 0.10).empty());
  b.links["shm"].alpha = a.links["shm"].alpha * 1.2;
  auto moved = tools::disagreeingFigures(a, b, 0.10);
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_EQ(moved[0].rfind("shm.alpha_us ", 0), 0u) << moved[0];
  EXPECT_NE(moved[0].find("(+20 %)"), std::string::npos) << moved[0];
  b = a;
  b.links["tcp"].beta = a.links["tcp"].beta * 2;  // half the TCP bandwidth
  ASSERT_EQ(tools::disagreeingFigures(a, b, 0.10).size(), 1u);
  // A transport only one pass measured is not compared.
  b = a;
  b.links["ucx"] = a.links["tcp"];
  b.links["ucx"].alpha = a.links["tcp"].alpha * 3;
  EXPECT_TRUE(tools::disagreeingFigures(a, b, 0.10).empty());
}

TEST(CostModel, ProfileJsonCarriesCorrectionsAndRejectsBadOnes) {
  CostProfile p = testProfile(2);
  p.setCorrection(correction("ring", 2, "tcp", {{16, 1.25}, {65536, 0.5}}));
  auto back = CostProfile::fromJson(p.toJson());
  ASSERT_TRUE(back.isOk()) << back.status().message();
  ASSERT_EQ(back->corrections.size(), 1u);
  EXPECT_EQ(back->corrections[0].algo, "ring");
  EXPECT_EQ(back->corrections[0].link, "tcp");
  EXPECT_EQ(back->corrections[0].nranks, 2);
  EXPECT_EQ(back->corrections[0].points, (std::vector<std::pair<double, double>>{{16, 1.25}, {65536, 0.5}}));
  const std::string ok = R"("collective": "allreduce", "algo": "ring", "nranks": 2, "link": "shm")";
  for (const std::string& bad : std::vector<std::string>{
           R"({"corrections": {}})",
           R"({"corrections": [{"collective": "allreduce", "algo": "ring", "nranks": 2, "link": "NV-link", "points": [[16, 1]]}]})",
           R"({"corrections": [{"collective": "allreduce", "algo": "ring", "nranks": 2, "link": "shm+tcp+ucx", "points": [[16, 1]]}]})",
           R"({"links": {"Bad Name": {"alpha_us": 1}}})",
           R"({"links": {"ucx": 5}})",
           R"({"corrections": [{"collective": "reduceall", "algo": "ring", "nranks": 2, "link": "shm", "points": [[16, 1]]}]})",
           R"({"corrections": [{"collective": "allreduce", "algo": "", "nranks": 2, "link": "shm", "points": [[16, 1]]}]})",
           R"({"corrections": [{"collective": "allreduce", "algo": "ring", "nranks": 0, "link": "shm", "points": [[16, 1]]}]})",
           "{\"corrections\": [{" + ok + R"(, "points": []}]})",
           "{\"corrections\": [{" + ok + R"(, "points": [[64, 1], [16, 1]]}]})",
           "{\"corrections\": [{" + ok + R"(, "points": [[16, -1]]}]})",
           "{\"corrections\": [{" + ok + R"(, "points": [[16, 1, 2]]}]})",
           "{\"corrections\": [{" + ok + R"(, "points": [["16", 1]]}]})",
       }) {
    auto r = CostProfile::fromJson(bad);
    ASSERT_FALSE(r.isOk()) << bad;
    const std::string m = r.status().message();
    EXPECT_TRUE(m.find("corrections") != std::string::npos || m.find("link") != std::string::npos) << m;
  }
  // Any transport's figures, keyed by name; a route key of two transports;
  // the old "mixed" reads as shm+tcp.
  auto named = CostProfile::fromJson(
      R"({"links": {"ucx": {"alpha_us": 3, "bandwidth_gbps": 10}}, "corrections": [)"
      R"({"collective": "allreduce", "algo": "ring", "nranks": 2, "link": "shm+ucx", "points": [[16, 2]]},)"
      R"({"collective": "allreduce", "algo": "ring", "nranks": 4, "link": "mixed", "points": [[16, 3]]}]})");
  ASSERT_TRUE(named.isOk()) << named.status().message();
  EXPECT_NEAR(named->links.at("ucx").alpha.value(), 3e-6, 1e-15);
  EXPECT_EQ(named->corrections[0].link, "shm+ucx");
  EXPECT_EQ(named->corrections[1].link, "shm+tcp");
  auto again = CostProfile::fromJson(named->toJson());
  ASSERT_TRUE(again.isOk());
  EXPECT_NEAR(again->links.at("ucx").beta.value(), named->links.at("ucx").beta.value(), 1e-21);
}

// The model prices each message with the figures of the transport that
// carries it (tune::Links, keyed by registered name): a slower transport
// between hosts makes the same plan slower, and a transport the profile has
// no figures for is priced with the defaults of its kind.
TEST(CostModel, PricesEachLinkByItsTransportsName) {
  const plan::Registry reg = plan::Registry::builtin();
  const plan::Algorithm& ring = *reg.find(Collective::AllReduce, "ring");
  CostProfile p = testProfile(4);
  std::vector<int> hosts = {0, 0, 1, 1};
  const plan::Shape sh = shape(4, 1 << 16, &hosts);
  auto tcp = modelSeconds(ring, sh, chorusFloat32, p, hosts, {"shm", "tcp"});
  auto unknown = modelSeconds(ring, sh, chorusFloat32, p, hosts, {"shm", "ucx"});
  ASSERT_TRUE(tcp.isOk() && unknown.isOk());
  EXPECT_NEAR(unknown->value(), tcp->value(), 1e-15);  // no figures for ucx: the profile's tcp figures
  p.links["ucx"] = p.links.at("tcp");
  p.links["ucx"].beta = p.links.at("tcp").beta * 4;
  auto slow = modelSeconds(ring, sh, chorusFloat32, p, hosts, {"shm", "ucx"});
  ASSERT_TRUE(slow.isOk());
  EXPECT_GT(slow->value(), tcp->value() * 1.5);
  // Within one host only the intra link counts.
  std::vector<int> one = {0, 0, 0, 0};
  const plan::Shape sh1 = shape(4, 1 << 16, &one);
  EXPECT_NEAR(modelSeconds(ring, sh1, chorusFloat32, p, one, {"shm", "ucx"})->value(),
              modelSeconds(ring, sh1, chorusFloat32, p, one, {"shm", "tcp"})->value(), 1e-15);
}


// ---- the collective table's defaults ----------------------------------------

// The tuner's fallback algorithm of every collective is the collective
// table's default_algo: a registry without one of them is refused naming it,
// and CHORUS_ALGO's error lists the table's collectives.
TEST(Tuner, TakesEachCollectivesDefaultFromTheCollectiveTable) {
  const plan::Registry reg = plan::Registry::builtin();
  Topology topo;
  topo.nranks = 4;
  topo.host_of = {0, 0, 0, 0};
  for (const plan::CollectiveFacts& f : plan::kCollectiveFacts) {
    plan::Collective c;
    ASSERT_TRUE(plan::parseCollective(f.name, &c));
    EXPECT_NE(reg.find(c, f.default_algo), nullptr) << f.name << ": " << f.default_algo;
  }
  ASSERT_TRUE(Tuner::create(reg, topo, "", 0).isOk());
  auto bad = Tuner::create(reg, topo, "allreduse:ring", 0);
  ASSERT_FALSE(bad.isOk());
  for (const plan::CollectiveFacts& f : plan::kCollectiveFacts)
    EXPECT_NE(bad.status().message().find(std::string(f.name)), std::string::npos) << f.name;
}

}  // namespace
}  // namespace chorus::tune
