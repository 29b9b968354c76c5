// chorus-bench: nccl-tests-style collective benchmark.
//
//   chorus-run -n 4 chorus-bench allreduce -b 8 -e 64M -f 2      (one rank of a job)
//   chorus-bench allreduce --np 4 -b 8 -e 64M -f 2               (launches its own job)
//   chorus-bench allreduce -g 4 -b 8 -e 64M -f 2                 (the same, as nccl-tests' -g 4)
//
// nccl-tests' flags keep their meaning where it applies to CPU ranks: -t/-g
// (ranks = threads x GPUs per process: here that many local rank processes),
// -a (how the ranks' times combine), -z (blocking calls or a queue), -T (a
// collective that hangs fails after SEC).  Where a flag asks for a GPU
// feature (-G CUDA graphs, -C 0 GPU event timing, -p 1 parallel init of a
// process's several GPUs) it is refused or noted with "not applicable on CPU
// ranks: ...", never ignored silently.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <optional>
#include <tuple>

#include "api/config.hpp"
#include "common/env.hpp"
#include "common/size.hpp"
#include "kernels/dtype.hpp"
#include "plan/plan.hpp"
#include "tools/bench.hpp"
#include "tools/launcher.hpp"

namespace {

namespace bench = chorus::tools::bench;

// Whether a launcher (chorus-run, torchrun, mpirun, srun) already made this process a rank.
bool inJob() {
  return chorus::env::raw("CHORUS_RANK") || chorus::env::getAny("RANK") ||
         chorus::env::getAny("OMPI_COMM_WORLD_RANK") || chorus::env::getAny("SLURM_PROCID");
}

int fail(const std::string& message) {
  fmt::print(stderr, "{}\n", message);
  return 1;
}

// A usage error: exit status 2, as CLI11's own.
int usage(const std::string& message) {
  fmt::print(stderr, "chorus-bench: {}\n", message);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-bench: nccl-tests-style benchmark of one collective over CPU ranks"};
  app.option_defaults()->always_capture_default();  // --help shows every default
  app.footer(fmt::format(
      "Sizes (-b, -e, -i): {}.\n"
      "Ranks: under a launcher (chorus-run, torchrun, mpirun, srun) each process is one rank; outside one, "
      "chorus-bench launches --np (or -t x -g) local ranks of itself.\n"
      "nccl-tests flags that ask for GPU features are refused with 'not applicable on CPU ranks'.",
      chorus::kSizeGrammarHelp));
  std::string collective, min_s = "32M", max_s = "32M", step_s = "1M", dtype_s = "float", op_s = "sum", algo,
                          json_path;
  double factor = 1;
  int iters = 20, warmup = 5, root = 0, check = 1, np = 0, threads = 1, gpus = 1, parallel_init = 0, blocking = 1,
      average = 3, cudagraph = 0, cputime = 1;
  double timeout_s = 0;
  app.add_option("collective", collective,
                 "allreduce|broadcast|reduce|allgather|reducescatter|alltoall|gather|scatter|sendrecv|barrier")
      ->required();
  app.add_option("-b,--minbytes", min_s, "smallest size");
  app.add_option("-e,--maxbytes", max_s, "largest size");
  app.add_option("-f,--stepfactor", factor, "multiply the size by this factor (> 1)");
  app.add_option("-i,--stepbytes", step_s, "add this to the size when -f is not > 1");
  app.add_option("-n,--iters", iters, "timed iterations per size");
  app.add_option("-w,--warmup_iters", warmup, "untimed iterations per size");
  double warmup_ms = 0, min_ms = 0;
  app.add_option("--warmup-ms", warmup_ms, "keep warming up until the slowest rank has spent this long (ms)")
      ->check(CLI::Range(0.0, 600000.0));
  app.add_option("--min-ms", min_ms, "time at least this long per size in one window, with more calls than -n if "
                                     "needed (ms)")
      ->check(CLI::Range(0.0, 600000.0));
  app.add_option("-d,--datatype", dtype_s, "data type (float, half, bf16, int32, ...) or all");
  app.add_option("-o,--op", op_s, "sum|prod|max|min|avg|all");
  app.add_option("-r,--root", root, "root rank of rooted collectives");
  app.add_option("-c,--check", check, "1: check every output element of one call per size; 0: no check");
  app.add_option("--algo", algo,
                 "force this algorithm (sets CHORUS_ALGO=<collective>:<NAME>); a size it cannot run is reported "
                 "with the reason and not measured (exit status 1); 'all': every registered algorithm of the "
                 "collective, in turn at each size, skipping (with a note) the sizes an algorithm cannot run")
      ->default_str("auto (the tuner chooses)");
  std::vector<std::string> plan_paths;
  app.add_option("--plan", plan_paths, "a plan file or directory (docs/plan-format.md; repeatable; adds to "
                                       "CHORUS_PLAN_PATH): proven as it loads, its plans can be forced with --algo");
  app.add_option("--json", json_path, "also write one JSON object per row to this file (JSON Lines)")
      ->default_str("none");
  app.add_option("--np", np, "outside a job: launch this many local ranks of this benchmark")
      ->default_str("-t x -g");
  app.add_option("-t,--nthreads", threads, "nccl-tests: threads per process, each driving -g ranks; here every "
                                           "rank is a process, so outside a job this launches -t x -g ranks, and "
                                           "under a launcher it must be 1");
  app.add_option("-g,--ngpus", gpus, "nccl-tests: GPUs (ranks) per thread; as -t: outside a job -t x -g local "
                                     "rank processes, under a launcher 1");
  app.add_option("-p,--parallel_init", parallel_init, "nccl-tests: initialise the ranks of a process in parallel; "
                                                      "not applicable on CPU ranks (one rank per process), 1 is "
                                                      "noted and has no effect");
  app.add_option("-z,--blocking", blocking, "1: every timed call returns when it is complete; 0: the timed calls "
                                            "are queued on a chorus stream and waited for once (nccl-tests' default "
                                            "is 0)");
  app.add_option("-a,--average", average, "time reported per size from each rank's mean: 0 rank 0's, 1 the mean "
                                          "over ranks, 2 the fastest rank's, 3 the slowest rank's (nccl-tests' "
                                          "default is 1)")
      ->check(CLI::Range(0, 3));
  app.add_option("-G,--cudagraph", cudagraph, "nccl-tests: replay the iterations as a CUDA graph; not applicable "
                                              "on CPU ranks, only 0 is accepted");
  app.add_option("-C,--report_cputime", cputime, "nccl-tests: 1 reports CPU wall time, 0 GPU event time; CPU "
                                                 "ranks have only the CPU clock, so times are always -C 1's");
  app.add_option("-T,--timeout", timeout_s, "a collective (or the init) that makes no progress for SEC seconds "
                                            "fails (CHORUS_TIMEOUT_MS), ending a hung benchmark with an error")
      ->default_str("CHORUS_TIMEOUT_MS (600 s)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  // nccl-tests flags that do not apply to CPU ranks: refused when they would
  // change what is measured, noted when they would not.
  if (cudagraph != 0)
    return usage(fmt::format("-G {}: not applicable on CPU ranks: -G captures the iterations in a CUDA graph and "
                             "replays it; chorus collectives run on CPU threads, with no graph to capture (use -G 0 "
                             "or leave it out)",
                             cudagraph));
  if (cputime != 0 && cputime != 1) return usage(fmt::format("-C {}: must be 0 or 1", cputime));
  if (blocking != 0 && blocking != 1) return usage(fmt::format("-z {}: must be 0 or 1", blocking));
  if (parallel_init != 0 && parallel_init != 1) return usage(fmt::format("-p {}: must be 0 or 1", parallel_init));
  if (threads < 1) return usage(fmt::format("-t {}: the number of threads per process must be at least 1", threads));
  if (gpus < 1) return usage(fmt::format("-g {}: the number of GPUs (ranks) per thread must be at least 1", gpus));
  if (app.count("--np") > 0 && np < 1) return usage(fmt::format("--np {}: the number of ranks must be at least 1", np));
  if (app.count("--np") > 0 && (threads > 1 || gpus > 1) && np != threads * gpus)
    return usage(fmt::format("--np {} disagrees with -t {} x -g {} = {} ranks: give one of them", np, threads, gpus,
                             threads * gpus));
  if (timeout_s < 0 || timeout_s > 1e6)
    return usage(fmt::format("-T {}: the timeout must be 0 (none given) to 1e6 seconds", timeout_s));
  const bool rank0 = chorus::env::getString("CHORUS_RANK") == "0" || chorus::env::getString("RANK") == "0" ||
                     chorus::env::getString("OMPI_COMM_WORLD_RANK") == "0";
  auto note = [&](const std::string& text) {
    if (!inJob() || rank0) fmt::print(stderr, "chorus-bench: {}\n", text);
  };

  bench::BenchOptions o;
  auto coll = bench::parseCollective(collective);
  if (!coll.isOk()) return fail("chorus-bench: " + coll.status().message());
  o.collective = *coll;
  for (auto [text, dst, flag] : {std::tuple{&min_s, &o.sweep.min_bytes, "-b"}, std::tuple{&max_s, &o.sweep.max_bytes, "-e"},
                                 std::tuple{&step_s, &o.sweep.step_bytes, "-i"}}) {
    auto v = chorus::parseSize(*text, flag);
    if (!v.isOk()) return usage(v.status().message());
    *dst = *v;
  }
  o.sweep.step_factor = factor;
  o.iters = iters;
  o.warmup_ms = warmup_ms;
  o.min_time_ms = min_ms;
  o.warmup = warmup;
  o.root = root;
  o.check = check != 0;
  o.json_path = json_path;
  o.average = average;
  o.blocking = blocking == 1;
  if (dtype_s == "all") {
    o.dtypes.clear();
    for (int d = 0; d < chorusNumTypes; ++d) o.dtypes.push_back(static_cast<chorusDataType_t>(d));
  } else if (!chorus::kernels::parseDtype(dtype_s, &o.dtypes[0])) {
    return fail(fmt::format("chorus-bench: unknown data type '{}' (-d float, half, bf16, double, int32, ...)", dtype_s));
  }
  if (op_s == "all") {
    o.ops = {chorusSum, chorusProd, chorusMax, chorusMin, chorusAvg};
  } else {
    auto op = bench::parseOp(op_s);
    if (!op.isOk()) return fail("chorus-bench: " + op.status().message());
    o.ops = {*op};
  }
  if (auto sweep = bench::sizeSweep(o.sweep); !sweep.isOk()) return fail("chorus-bench: " + sweep.status().message());

  if (!inJob()) {
    // Not a rank yet: become the launcher of a job of ourselves.  The ranks see
    // CHORUS_RANK and so ignore --np, -t and -g.
    if (parallel_init == 1)
      note("-p 1: not applicable on CPU ranks: each rank is a process of its own with one communicator, so there "
           "is no set of communicators to initialise in parallel; ignored");
    if (app.count("-C") > 0 && cputime == 0)
      note("-C 0: not applicable on CPU ranks: there is no GPU event timer; times are CPU wall time, as -C 1");
    chorus::tools::LaunchOptions lo;
    lo.nranks = app.count("--np") > 0 ? np : threads * gpus;
    std::error_code ec;
    auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    lo.argv.push_back(ec ? std::string(argv[0]) : self.string());
    for (int i = 1; i < argc; ++i) lo.argv.emplace_back(argv[i]);
    lo.prefix_stdout = false;  // only rank 0 prints the table
    lo.name = "chorus-bench";
    lo.extra_env = {{"CHORUS_BENCH_LAUNCHED", "1"}};
    auto report = chorus::tools::launch(lo);
    if (!report.isOk()) return fail(report.status().message());
    return report->exit_code;
  }
  // The ranks chorus-bench launched itself see its own -t/-g/--np again.
  const bool self_launched = chorus::env::getAny("CHORUS_BENCH_LAUNCHED").has_value();
  if (threads * gpus != 1 && !self_launched)
    return usage(fmt::format("-t {} -g {}: not applicable on CPU ranks: under a launcher every process is one rank "
                             "(nccl-tests drives -t x -g GPUs from one process); ask the launcher for more ranks "
                             "instead (chorus-run -n N, torchrun --nproc_per_node N, mpirun -n N)",
                             threads, gpus));
  // The job's configuration (CHORUS_*), with chorus-bench's options over it.
  auto job_cfg = chorus::api::configFromEnv();
  if (!job_cfg.isOk()) return fail(fmt::format("chorus-bench: {}", job_cfg.status().message()));
  chorus::Config cfg = job_cfg.value();
  if (timeout_s > 0) cfg.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(timeout_s * 1000)));

  cfg.tune.plan_paths.insert(cfg.tune.plan_paths.end(), plan_paths.begin(), plan_paths.end());
  o.plan_paths = cfg.tune.plan_paths;
  if (algo == "all") {
    chorus::plan::Collective pc;
    auto loaded = chorus::plan::Registry::withPlans(cfg.tune.plan_paths);
    if (!loaded.isOk()) return fail(fmt::format("chorus-bench: {}", loaded.status().message()));
    const chorus::plan::Registry registry = std::move(loaded.value());
    if (chorus::plan::parseCollective(collective, &pc))
      for (const chorus::plan::Algorithm* a : registry.forCollective(pc)) o.algos.emplace_back(a->name());
    if (o.algos.empty()) return fail(fmt::format("chorus-bench: --algo all: {} has no algorithms to choose from", collective));
  } else if (!algo.empty()) {
    cfg.tune.algo_spec = bench::withAlgo(cfg.tune.algo_spec, o.collective, algo);
    o.forced_algo = algo;
  }
  int unsupported = 0;
  o.unsupported = &unsupported;

  o.algo_spec = cfg.tune.algo_spec;

  // Two communicators over the same ranks: the benchmark's own barriers and
  // reductions run on the first, made without tracing, so a trace
  // (chorus-trace report) holds only the measured calls of the second.
  chorusComm_t book = nullptr, comm = nullptr;
  {
    chorus::Config book_cfg = cfg;
    book_cfg.trace.dir.clear();
    if (chorusResult_t r = chorus::api::commInitFromEnv(&book, book_cfg); r != chorusSuccess)
      return fail(fmt::format("chorus-bench: chorusCommInitFromEnv failed: {}: {}", chorusGetErrorString(r),
                              chorusGetLastError(nullptr)));
  }
  if (chorusResult_t r = chorus::api::commInitFromEnv(&comm, cfg); r != chorusSuccess)
    return fail(fmt::format("chorus-bench: chorusCommInitFromEnv failed: {}: {}", chorusGetErrorString(r),
                            chorusGetLastError(nullptr)));
  o.bookkeeping = book;
  auto wrong = bench::runBench(o, comm, stdout);
  if (!wrong.isOk()) {
    fmt::print(stderr, "{}\n", wrong.status().message());
    chorusCommAbort(comm);
    chorusCommAbort(book);
    return 1;
  }
  if (unsupported > 0) {
    // Every rank fails alike, but only after rank 0 has said why: a launcher
    // stops the others as soon as one rank exits non-zero.
    note(fmt::format("--algo {} could not run {} size(s) of this sweep (the '#' lines say why); they were not "
                     "measured",
                     algo, unsupported));
    (void)chorusBarrier(book, nullptr);
  }
  for (chorusComm_t c : {comm, book})
    if (chorusResult_t r = chorusCommDestroy(c); r != chorusSuccess)
      return fail(fmt::format("chorus-bench: chorusCommDestroy failed: {}: {}", chorusGetErrorString(r),
                              chorusGetLastError(nullptr)));
  return unsupported > 0 || *wrong != 0 ? 1 : 0;
}
