// chorus-bench dispatch | combine (toolkit/bench_ep.hpp): the routing it
// generates, its command line, and whole runs on threads as ranks (2 "hosts"
// of 2 ranks, net.host_id) with the check on: both formulations, direct and
// node-limited routing, bf16, float and fp8, every element right.
#include "toolkit/bench_ep.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "support/rank_threads.hpp"
#include "toolkit/bench_args.hpp"

namespace chorus::tools::bench {
namespace {

using ::testing::HasSubstr;

TEST(EpBenchRoute, DistinctIdsInRangeWithinTheHostLimit) {
  for (int max_hosts : {0, 1, 2, 3}) {
    std::set<int> seen;
    for (size_t t = 0; t < 500; ++t) {
      int32_t ids[8];
      epRoute(7, 3, t, 64, 8, 4, max_hosts, ids);
      std::set<int> experts(ids, ids + 8), hosts;
      EXPECT_EQ(experts.size(), 8u) << "token " << t;
      for (int32_t e : ids) {
        EXPECT_GE(e, 0);
        EXPECT_LT(e, 64);
        hosts.insert(e / 16);
        seen.insert(e);
      }
      if (max_hosts > 0) {
        EXPECT_LE(hosts.size(), static_cast<size_t>(max_hosts)) << "token " << t;
      }
      int32_t again[8];
      epRoute(7, 3, t, 64, 8, 4, max_hosts, again);
      EXPECT_TRUE(std::equal(ids, ids + 8, again)) << "not a function of (seed, rank, token)";
    }
    EXPECT_EQ(seen.size(), 64u) << "max_hosts " << max_hosts << ": some expert never chosen";
  }
  // Different ranks route differently.
  int32_t a[8], b[8];
  epRoute(7, 0, 5, 64, 8, 4, 2, a);
  epRoute(7, 1, 5, 64, 8, 4, 2, b);
  EXPECT_FALSE(std::equal(a, a + 8, b));
}

TEST(EpBenchRoute, ValuesAndWeightsAreExactSmallNumbers) {
  std::set<float> values, weights;
  for (size_t i = 0; i < 4000; ++i) {
    const float v = epValue(1, 2, 3, i);
    EXPECT_EQ(v, static_cast<float>(static_cast<int>(v)));
    EXPECT_GE(v, -8.0f);
    EXPECT_LE(v, 7.0f);
    values.insert(v);
    weights.insert(epWeight(1, 2, i, 0));
  }
  EXPECT_EQ(values.size(), 16u);
  EXPECT_EQ(weights.size(), 8u);
  EXPECT_NE(epValue(1, 2, 3, 0) * 1000 + epValue(1, 2, 3, 16), epValue(1, 2, 4, 0) * 1000 + epValue(1, 2, 4, 16));
}

TEST(EpBenchArgs, DispatchAndCombineTakeTheirOptions) {
  BenchEnv env{.in_job = true, .self_launched = false, .rank0 = true};
  BenchArgs a;
  a.collective = "combine";
  a.tokens = 100, a.hidden = 64, a.experts = 16, a.topk = 4, a.max_hosts = 2, a.form = "alltoallv";
  a.dtype = "fp8", a.dtype_given = true, a.repeats = 3;
  auto p = planFromArgs(a, env);
  ASSERT_TRUE(p.isOk()) << p.status().message();
  ASSERT_TRUE(p->ep.has_value());
  EXPECT_TRUE(p->ep->combine);
  EXPECT_EQ(p->ep->tokens, 100u);
  EXPECT_EQ(p->ep->max_hosts, 2);
  EXPECT_EQ(p->ep->dtype, chorusBfloat16);
  EXPECT_EQ(p->ep->compress, CHORUS_COMPRESS_FP8);
  EXPECT_EQ(p->ep->repeats, 3);
  ASSERT_EQ(p->ep->forms.size(), 1u);
  EXPECT_EQ(p->ep->forms[0], EpForm::AllToAllV);

  a.collective = "dispatch", a.dtype_given = false, a.dtype = "float";  // -d not given: bf16
  p = planFromArgs(a, env);
  ASSERT_TRUE(p.isOk());
  EXPECT_EQ(p->ep->dtype, chorusBfloat16);
  EXPECT_EQ(p->ep->compress, CHORUS_COMPRESS_OFF);
  EXPECT_FALSE(p->ep->combine);

  for (auto [change, want] : std::vector<std::pair<std::function<void(BenchArgs&)>, std::string>>{
           {[](BenchArgs& b) { b.form = "nccl"; }, "--form nccl: ep, alltoallv or both"},
           {[](BenchArgs& b) { b.dtype = "int8", b.dtype_given = true; }, "dispatch -d int8"},
           {[](BenchArgs& b) { b.max_hosts = -1; }, "--max-hosts -1"},
           {[](BenchArgs& b) { b.algo = "ring"; }, "--algo and --plan"},
           {[](BenchArgs& b) { b.repeats = 0; }, "--repeats 0"}}) {
    BenchArgs bad = a;
    change(bad);
    auto r = planFromArgs(bad, env);
    ASSERT_FALSE(r.isOk()) << want;
    EXPECT_THAT(r.status().message(), HasSubstr(want));
    EXPECT_EQ(exitStatus(r.status()), 2);
  }
}

// The whole benchmark, 4 ranks on 2 "hosts", -c 1: rank 0's table and every
// rank's count of wrong elements.
struct EpRun {
  bool combine;
  int max_hosts;
  std::string dtype;  // bf16, float, fp8
};
std::string runOnce(const EpRun& k, std::string* table) {
  auto msgs = chorus::testing::runRanksPerRank(
      4,
      [](int r) {
        Config cfg;
        cfg.net.host_id = fmt::format("epbench{}", r / 2);
        return cfg;
      },
      [&](int rank, chorusComm_t comm) -> std::string {
        EpBenchOptions o;
        o.combine = k.combine;
        o.tokens = 37, o.hidden = 40, o.experts = 8, o.topk = 3, o.max_hosts = k.max_hosts;
        o.dtype = k.dtype == "float" ? chorusFloat32 : chorusBfloat16;
        o.compress = k.dtype == "fp8" ? CHORUS_COMPRESS_FP8 : CHORUS_COMPRESS_OFF;
        o.iters = 2, o.warmup = 1, o.repeats = 2, o.seed = 11;
        std::FILE* out = rank == 0 ? std::tmpfile() : stdout;
        auto wrong = runEpBench(o, comm, out);
        if (rank == 0) {
          std::rewind(out);
          char buf[4096];
          size_t got;
          while ((got = std::fread(buf, 1, sizeof buf, out)) > 0) table->append(buf, got);
          std::fclose(out);
        }
        if (!wrong.isOk()) return fmt::format("rank {}: {}", rank, wrong.status().message());
        if (*wrong != 0) return fmt::format("rank {}: {} wrong elements", rank, *wrong);
        return "";
      });
  return chorus::testing::failures(msgs);
}

class EpBenchRun : public ::testing::TestWithParam<EpRun> {};
TEST_P(EpBenchRun, EveryElementRightInBothForms) {
  const EpRun k = GetParam();
  std::string table;
  EXPECT_EQ(runOnce(k, &table), "");
  EXPECT_THAT(table, HasSubstr(k.combine ? "# chorus-bench combine" : "# chorus-bench dispatch"));
  EXPECT_THAT(table, HasSubstr("# Out of bounds values : 0 OK"));
  EXPECT_THAT(table, HasSubstr(" ep "));
  if (k.dtype != "fp8") {
    EXPECT_THAT(table, HasSubstr(" alltoallv "));
    EXPECT_THAT(table, HasSubstr("time alltoallv / ep per repeat:"));
  } else {
    EXPECT_THAT(table, HasSubstr("alltoallv: not measured with a compressed dispatch"));
  }
}
INSTANTIATE_TEST_SUITE_P(Cases, EpBenchRun,
                         ::testing::Values(EpRun{false, 0, "bf16"}, EpRun{true, 0, "bf16"}, EpRun{false, 1, "bf16"},
                                           EpRun{true, 1, "bf16"}, EpRun{true, 2, "float"}, EpRun{false, 2, "fp8"},
                                           EpRun{true, 1, "fp8"}));

}  // namespace
}  // namespace chorus::tools::bench
