// chorus-bench's command line: what its main does between parsing the options
// and measuring.
//
// The main (tools/chorus-bench.cpp) defines the CLI11 options into a
// BenchArgs, reads where the process runs into a BenchEnv, and hands both to
// planFromArgs: every check of the flags (the nccl-tests flags CPU ranks cannot
// honour, the sizes, -t/-g/--np), the data types and ops to sweep, and the
// launch decision (outside a job: launch --np, or -t x -g, local ranks of
// itself; under a launcher: be one rank).  A rank then takes the job's
// configuration with the benchmark's options over it (rankConfig: --timeout,
// --plan, --algo and the expansion of --algo all) and runs (runRank).
//
// Errors are Statuses whose message is what chorus-bench prints; exitStatus
// gives the process's exit status for one (2 for a usage error, as CLI11's
// own, 1 otherwise).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/config.hpp"
#include "common/status.hpp"
#include "toolkit/bench.hpp"
#include "toolkit/bench_ep.hpp"
#include "toolkit/bench_kv.hpp"

namespace chorus::tools::bench {

// The options of chorus-bench as its main parses them (the flag of each in
// its comment), with the main's defaults.
struct BenchArgs {
  std::string collective;             // positional
  std::string min_bytes = "32M";      // -b
  std::string max_bytes = "32M";      // -e
  std::string step_bytes = "1M";      // -i
  double step_factor = 1;             // -f
  int iters = 20;                     // -n
  int warmup = 5;                     // -w
  double warmup_ms = 0;               // --warmup-ms
  double min_ms = 0;                  // --min-ms
  std::string dtype = "float";        // -d: a data type or "all"
  std::string op = "sum";             // -o: an op or "all"
  int root = 0;                       // -r
  int check = 1;                      // -c
  std::string algo;                   // --algo: "" (the tuner), a name, or "all"
  std::vector<std::string> plan_paths;  // --plan
  std::string json_path;              // --json
  int np = 0;                         // --np
  bool np_given = false;              // --np was on the command line
  int threads = 1;                    // -t
  int gpus = 1;                       // -g
  int parallel_init = 0;              // -p
  int blocking = 1;                   // -z
  std::string memory = "host";        // --memory
  int average = 3;                    // -a
  int cudagraph = 0;                  // -G
  int cputime = 1;                    // -C
  bool cputime_given = false;         // -C was on the command line
  double timeout_s = 0;               // -T
  bool dtype_given = false;           // -d was on the command line
  // dispatch | combine (toolkit/bench_ep.hpp)
  size_t tokens = 4096;               // --tokens
  size_t hidden = 7168;               // --hidden
  int experts = 64;                   // --experts
  int topk = 8;                       // --topk
  int max_hosts = 0;                  // --max-hosts
  std::string form = "both";          // --form: ep, alltoallv or both
  int repeats = 1;                    // --repeats
  uint64_t seed = 1;                  // --seed
  // kv (toolkit/bench_kv.hpp)
  uint64_t kv_blocks = 64;            // --blocks
  uint32_t kv_layers = 32;            // --layers
  std::string kv_layout = "both";     // --layout: layer, block or both
  std::string kv_op = "both";         // --kv-op: write, read or both
  uint32_t kv_tp_prefill = 1, kv_tp_decode = 1;  // --tp-prefill, --tp-decode
};

// Where the process runs, as the main reads it from the environment.
struct BenchEnv {
  // A launcher (chorus-run, torchrun, mpirun, srun) already made this process
  // a rank (CHORUS_RANK, RANK, OMPI_COMM_WORLD_RANK or SLURM_PROCID is set).
  bool in_job = false;
  // chorus-bench launched this rank itself (CHORUS_BENCH_LAUNCHED): its
  // -t/-g/--np were the launcher's and are not this rank's business.
  bool self_launched = false;
  // Rank 0 of the job: the one that prints the notes of a job.
  bool rank0 = false;
};

// What planFromArgs decided.
struct BenchPlan {
  // > 0: this process is not a rank; it launches this many local ranks of
  // itself (launchSelf).  0: it is a rank of a job and runs the sweep.
  int launch_ranks = 0;
  // Lines for stderr ("chorus-bench: ..."), printed before launching: the
  // nccl-tests flags that are noted as having no effect on CPU ranks.
  std::vector<std::string> notes;
  // The sweep.  rankConfig fills what depends on the job's configuration
  // (algos, forced_algo, algo_spec, plan_paths).
  BenchOptions options;
  // dispatch | combine: the MoE benchmark (runEpBench) instead of the sweep.
  std::optional<EpBenchOptions> ep;
  // kv: the KV-cache transfer benchmark (runKvBench) instead of the sweep.
  std::optional<KvBenchOptions> kv;
  // Kept for rankConfig.
  std::string algo;
  std::vector<std::string> plan_paths;
  double timeout_s = 0;
};

// The flag checks, the sweep's options and the launch decision, in the order
// chorus-bench has always made them (the first error wins).
Result<BenchPlan> planFromArgs(const BenchArgs& a, const BenchEnv& env);

// A rank's communicator configuration: `job` (CHORUS_*, api::configFromEnv)
// with -T, --plan and --algo over it; sets plan.options' algos (--algo all:
// every registered algorithm of the collective, the plan files' included),
// forced_algo (--algo NAME), algo_spec and plan_paths.
Result<Config> rankConfig(BenchPlan& plan, Config job);

// Outside a job: prints plan.notes, launches plan.launch_ranks ranks of this
// program with the same arguments (argv) and returns the job's exit status.
int launchSelf(const BenchPlan& plan, int argc, char** argv);

// As a rank: rankConfig over the job's configuration (api::configFromEnv),
// the communicators, runBench, the note on the sizes a forced algorithm could
// not run; returns the exit status (0, or 1 when a check found wrong values, a
// size could not run, or anything failed).
int runRank(BenchPlan plan, const BenchEnv& env);

// The exit status for an error of the above: 2 for a usage error
// (chorusInvalidUsage), 1 for any other.
int exitStatus(const Status& s);

}  // namespace chorus::tools::bench
