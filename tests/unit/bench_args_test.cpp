// chorus-bench's and chorus-tune's command lines as their mains hand them to
// the library (toolkit/bench_args.hpp, toolkit/tune_args.hpp): the flag checks
// with their messages and exit statuses, the launch decision, --algo all's
// expansion, and chorus-tune's option checks.  No communicator, no launch.
#include "toolkit/bench_args.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "plan/plan.hpp"
#include "toolkit/tune_args.hpp"
#include "transport/registry.hpp"

namespace chorus::tools {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

namespace bench = chorus::tools::bench;

bench::BenchArgs args(std::string collective = "allreduce") {
  bench::BenchArgs a;
  a.collective = std::move(collective);
  return a;
}
// Outside a job, a rank of a job under a launcher, a rank chorus-bench launched.
constexpr bench::BenchEnv kOutside{};
constexpr bench::BenchEnv kUnderLauncher{.in_job = true, .self_launched = false, .rank0 = true};
constexpr bench::BenchEnv kSelfLaunched{.in_job = true, .self_launched = true, .rank0 = true};

// The refusal's whole message (as chorus-bench prints it) and its exit status.
void expectRefused(const Result<bench::BenchPlan>& r, const std::string& message, int exit_status) {
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().message(), message);
  EXPECT_EQ(bench::exitStatus(r.status()), exit_status);
}

TEST(BenchArgs, ThreadsAndGpusAreRefusedUnderALauncherButNotInASelfLaunch) {
  bench::BenchArgs a = args();
  a.threads = 2;
  expectRefused(bench::planFromArgs(a, kUnderLauncher),
                "chorus-bench: -t 2 -g 1: not applicable on CPU ranks: under a launcher every process is one rank "
                "(nccl-tests drives -t x -g GPUs from one process); ask the launcher for more ranks instead "
                "(chorus-run -n N, torchrun --nproc_per_node N, mpirun -n N)",
                2);
  a.threads = 1;
  a.gpus = 3;
  expectRefused(bench::planFromArgs(a, kUnderLauncher),
                "chorus-bench: -t 1 -g 3: not applicable on CPU ranks: under a launcher every process is one rank "
                "(nccl-tests drives -t x -g GPUs from one process); ask the launcher for more ranks instead "
                "(chorus-run -n N, torchrun --nproc_per_node N, mpirun -n N)",
                2);
  // The ranks chorus-bench launched see its own -t/-g again: a rank, not a launch.
  auto self = bench::planFromArgs(a, kSelfLaunched);
  ASSERT_TRUE(self.isOk()) << self.status().message();
  EXPECT_EQ(self->launch_ranks, 0);
  // Outside a job the same flags launch -t x -g ranks.
  auto outside = bench::planFromArgs(a, kOutside);
  ASSERT_TRUE(outside.isOk()) << outside.status().message();
  EXPECT_EQ(outside->launch_ranks, 3);
}

TEST(BenchArgs, LaunchesNpOrThreadsTimesGpusOutsideAJobAndRunsUnderOne) {
  bench::BenchArgs a = args();
  EXPECT_EQ(bench::planFromArgs(a, kOutside)->launch_ranks, 1);  // neither: one rank
  EXPECT_EQ(bench::planFromArgs(a, kUnderLauncher)->launch_ranks, 0);
  a.np = 4;
  a.np_given = true;
  EXPECT_EQ(bench::planFromArgs(a, kOutside)->launch_ranks, 4);
  EXPECT_EQ(bench::planFromArgs(a, kUnderLauncher)->launch_ranks, 0);  // the ranks ignore --np
  a.np = 6;
  a.threads = 2;
  a.gpus = 3;
  EXPECT_EQ(bench::planFromArgs(a, kOutside)->launch_ranks, 6);  // agreeing: fine
  a.np = 5;
  expectRefused(bench::planFromArgs(a, kOutside),
                "chorus-bench: --np 5 disagrees with -t 2 x -g 3 = 6 ranks: give one of them", 2);
  a = args();
  a.np = 0;
  a.np_given = true;
  expectRefused(bench::planFromArgs(a, kOutside), "chorus-bench: --np 0: the number of ranks must be at least 1", 2);
  a = args();
  a.threads = 0;
  expectRefused(bench::planFromArgs(a, kOutside),
                "chorus-bench: -t 0: the number of threads per process must be at least 1", 2);
  a = args();
  a.gpus = -1;
  expectRefused(bench::planFromArgs(a, kOutside),
                "chorus-bench: -g -1: the number of GPUs (ranks) per thread must be at least 1", 2);
}

TEST(BenchArgs, GpuFlagsAreRefusedOrNoted) {
  bench::BenchArgs a = args();
  a.cudagraph = 1;
  expectRefused(bench::planFromArgs(a, kOutside),
                "chorus-bench: -G 1: not applicable on CPU ranks: -G captures the iterations in a CUDA graph and "
                "replays it; chorus collectives run on CPU threads, with no graph to capture (use -G 0 or leave it "
                "out)",
                2);
  a = args();
  a.cputime = 2;
  expectRefused(bench::planFromArgs(a, kOutside), "chorus-bench: -C 2: must be 0 or 1", 2);
  a = args();
  a.blocking = 3;
  expectRefused(bench::planFromArgs(a, kOutside), "chorus-bench: -z 3: must be 0 or 1", 2);
  a = args();
  a.parallel_init = 2;
  expectRefused(bench::planFromArgs(a, kOutside), "chorus-bench: -p 2: must be 0 or 1", 2);
  a = args();
  a.timeout_s = -1;
  expectRefused(bench::planFromArgs(a, kOutside),
                "chorus-bench: -T -1: the timeout must be 0 (none given) to 1e6 seconds", 2);

  // -p 1 and an explicit -C 0 are noted by the launching process, and have no effect.
  a = args();
  a.parallel_init = 1;
  a.cputime = 0;
  a.cputime_given = true;
  auto noted = bench::planFromArgs(a, kOutside);
  ASSERT_TRUE(noted.isOk()) << noted.status().message();
  ASSERT_EQ(noted->notes.size(), 2u);
  EXPECT_THAT(noted->notes[0], StartsWith("chorus-bench: -p 1: not applicable on CPU ranks"));
  EXPECT_THAT(noted->notes[1], StartsWith("chorus-bench: -C 0: not applicable on CPU ranks"));
  a.cputime_given = false;  // -C 0 only as a default is not the user's
  EXPECT_EQ(bench::planFromArgs(a, kOutside)->notes.size(), 1u);
  EXPECT_TRUE(bench::planFromArgs(a, kSelfLaunched)->notes.empty());  // the ranks say nothing
}

TEST(BenchArgs, BadSizesAreRefusedNamingTheFlag) {
  for (auto [flag, field] : {std::pair{"-b", &bench::BenchArgs::min_bytes}, std::pair{"-e", &bench::BenchArgs::max_bytes},
                             std::pair{"-i", &bench::BenchArgs::step_bytes}}) {
    bench::BenchArgs a = args();
    a.*field = "12X";
    auto r = bench::planFromArgs(a, kOutside);
    ASSERT_FALSE(r.isOk()) << flag;
    EXPECT_THAT(r.status().message(), StartsWith(fmt::format("chorus-bench: {} '12X'", flag)));
    EXPECT_THAT(r.status().message(), HasSubstr("unknown suffix 'X'"));
    EXPECT_EQ(bench::exitStatus(r.status()), 2) << flag;
  }
  // A sweep that cannot be made is an error of the run (1), as before.
  bench::BenchArgs a = args();
  a.min_bytes = "1M";
  a.max_bytes = "8";
  expectRefused(bench::planFromArgs(a, kOutside),
                "chorus-bench: minimum size 1048576 B (-b) is larger than the maximum 8 B (-e)", 1);
  // The first refusal in chorus-bench's order wins: the flags before the sizes.
  a.cudagraph = 1;
  EXPECT_THAT(bench::planFromArgs(a, kOutside).status().message(), StartsWith("chorus-bench: -G 1:"));
}

TEST(BenchArgs, SweepTypesAndOps) {
  bench::BenchArgs a = args("reducescatter");
  a.min_bytes = "8";
  a.max_bytes = "1M";
  a.step_factor = 32;
  a.dtype = "all";
  a.op = "all";
  a.check = 0;
  a.average = 1;
  a.blocking = 0;
  a.json_path = "rows.jsonl";
  auto r = bench::planFromArgs(a, kSelfLaunched);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const bench::BenchOptions& o = r->options;
  EXPECT_EQ(o.collective, bench::Collective::ReduceScatter);
  EXPECT_EQ(o.sweep.min_bytes, 8u);
  EXPECT_EQ(o.sweep.max_bytes, 1u << 20);
  EXPECT_EQ(o.sweep.step_factor, 32);
  EXPECT_EQ(o.dtypes.size(), static_cast<size_t>(chorusNumTypes));
  EXPECT_THAT(o.ops, ElementsAre(chorusSum, chorusProd, chorusMax, chorusMin, chorusAvg));
  EXPECT_FALSE(o.check);
  EXPECT_EQ(o.average, 1);
  EXPECT_FALSE(o.blocking);
  EXPECT_EQ(o.json_path, "rows.jsonl");

  a.dtype = "float17";
  expectRefused(bench::planFromArgs(a, kOutside),
                "chorus-bench: unknown data type 'float17' (-d float, half, bf16, double, int32, ...)", 1);
  a = args();
  a.op = "mean";
  auto op = bench::planFromArgs(a, kOutside);
  ASSERT_FALSE(op.isOk());
  EXPECT_THAT(op.status().message(), StartsWith("chorus-bench: "));
  EXPECT_THAT(op.status().message(), HasSubstr("mean"));
  EXPECT_EQ(bench::exitStatus(op.status()), 1);
  auto coll = bench::planFromArgs(args("allreduse"), kOutside);
  ASSERT_FALSE(coll.isOk());
  EXPECT_THAT(coll.status().message(), StartsWith("chorus-bench: unknown collective 'allreduse'"));
  EXPECT_EQ(bench::exitStatus(coll.status()), 1);
}

TEST(BenchArgs, AlgoAllExpandsToEveryRegisteredAlgorithmOfTheCollective) {
  const plan::Registry registry = plan::Registry::builtin();
  for (const char* name : {"allreduce", "allgather", "broadcast", "alltoall"}) {
    bench::BenchArgs a = args(name);
    a.algo = "all";
    auto r = bench::planFromArgs(a, kSelfLaunched);
    ASSERT_TRUE(r.isOk()) << r.status().message();
    Config job;
    job.tune.algo_spec = "reduce:ring";
    auto cfg = bench::rankConfig(*r, job);
    ASSERT_TRUE(cfg.isOk()) << cfg.status().message();
    std::vector<std::string> expected;
    for (const plan::Algorithm* alg : registry.forCollective(*bench::planCollective(r->options.collective)))
      expected.emplace_back(alg->name());
    ASSERT_FALSE(expected.empty()) << name;
    EXPECT_EQ(r->options.algos, expected) << name;
    EXPECT_TRUE(r->options.forced_algo.empty());
    // --algo all forces each in turn at run time: the job's overrides stay as they were.
    EXPECT_EQ(cfg->tune.algo_spec, "reduce:ring");
    EXPECT_EQ(r->options.algo_spec, "reduce:ring");
  }
  // sendrecv is not a collective of plan's: nothing to choose from.
  bench::BenchArgs a = args("sendrecv");
  a.algo = "all";
  auto r = bench::planFromArgs(a, kSelfLaunched);
  ASSERT_TRUE(r.isOk());
  auto cfg = bench::rankConfig(*r, Config{});
  ASSERT_FALSE(cfg.isOk());
  EXPECT_EQ(cfg.status().message(), "chorus-bench: --algo all: sendrecv has no algorithms to choose from");
  EXPECT_EQ(bench::exitStatus(cfg.status()), 1);
}

TEST(BenchArgs, RankConfigPutsTheOptionsOverTheJobs) {
  bench::BenchArgs a = args("allgather");
  a.algo = "ring";
  a.timeout_s = 2.5;
  a.plan_paths = {"mine.plan"};
  auto r = bench::planFromArgs(a, kSelfLaunched);
  ASSERT_TRUE(r.isOk());
  Config job;
  job.tune.algo_spec = "allreduce:rd;allgather:bruck";
  job.tune.plan_paths = {"job.plan"};
  const auto job_timeout = job.timeout;
  auto cfg = bench::rankConfig(*r, job);
  ASSERT_TRUE(cfg.isOk());
  EXPECT_EQ(cfg->timeout, std::chrono::milliseconds(2500));
  EXPECT_THAT(cfg->tune.plan_paths, ElementsAre("job.plan", "mine.plan"));
  EXPECT_EQ(r->options.plan_paths, cfg->tune.plan_paths);
  EXPECT_EQ(cfg->tune.algo_spec, bench::withAlgo(job.tune.algo_spec, bench::Collective::AllGather, "ring"));
  EXPECT_EQ(r->options.algo_spec, cfg->tune.algo_spec);
  EXPECT_EQ(r->options.forced_algo, "ring");
  EXPECT_TRUE(r->options.algos.empty());
  // No -T: the job's timeout.
  a.timeout_s = 0;
  a.algo.clear();
  auto r2 = bench::planFromArgs(a, kSelfLaunched);
  auto cfg2 = bench::rankConfig(*r2, job);
  EXPECT_EQ(cfg2->timeout, job_timeout);
  EXPECT_EQ(cfg2->tune.algo_spec, job.tune.algo_spec);
  EXPECT_TRUE(r2->options.forced_algo.empty());
}

TEST(TuneArgs, OptionsAreCheckedAsUsageErrors) {
  TuneArgs a;
  auto o = tuneOptionsFromArgs(a);
  ASSERT_TRUE(o.isOk()) << o.status().message();
  EXPECT_EQ(o->transports, transport::registry().names());
  EXPECT_THAT(o->collectives, ElementsAre("allreduce", "allgather", "reducescatter", "alltoall", "broadcast"));
  EXPECT_EQ(o->max_bytes, 64u << 20);

  a.no_tcp = true;
  a.collectives = "none";
  a.max_bytes = "1K";
  o = tuneOptionsFromArgs(a);
  ASSERT_TRUE(o.isOk());
  EXPECT_EQ(std::count(o->transports.begin(), o->transports.end(), "tcp"), 0);
  EXPECT_TRUE(o->collectives.empty());
  EXPECT_EQ(o->max_bytes, 1024u);

  a = TuneArgs{};
  a.transports = "carrier-pigeon";
  o = tuneOptionsFromArgs(a);
  ASSERT_FALSE(o.isOk());
  EXPECT_EQ(o.status().code(), chorusInvalidUsage);
  EXPECT_EQ(o.status().message(), fmt::format("chorus-tune: --transports: 'carrier-pigeon' is not a registered "
                                              "transport (registered: {})",
                                              transport::registry().namesText()));
  a = TuneArgs{};
  a.collectives = "allreduce,allgatherv";
  o = tuneOptionsFromArgs(a);
  ASSERT_FALSE(o.isOk());
  EXPECT_THAT(o.status().message(), StartsWith("chorus-tune: --collectives: 'allgatherv' is not a priced collective"));
  a = TuneArgs{};
  a.max_bytes = "8";
  o = tuneOptionsFromArgs(a);
  ASSERT_FALSE(o.isOk());
  EXPECT_EQ(o.status().message(), "chorus-tune: --max-bytes '8' is 8 bytes: it must be at least 16 bytes (e.g. 64M)");
  a.max_bytes = "64Q";
  o = tuneOptionsFromArgs(a);
  ASSERT_FALSE(o.isOk());
  EXPECT_THAT(o.status().message(), StartsWith("chorus-tune: --max-bytes '64Q'"));
  EXPECT_EQ(o.status().code(), chorusInvalidUsage);
}

TEST(TuneArgs, RankCounts) {
  EXPECT_THAT(parseRankCounts("2"), ElementsAre(2));
  EXPECT_THAT(parseRankCounts("2,4,64"), ElementsAre(2, 4, 64));
  for (const char* bad : {"", "1", "65", "2,,4", "2,x", ",4", "2.5"}) EXPECT_TRUE(parseRankCounts(bad).empty()) << bad;
}

}  // namespace
}  // namespace chorus::tools
