// chorus-bench: nccl-tests-style collective benchmark.
//
//   chorus-run -n 4 chorus-bench allreduce -b 8 -e 64M -f 2      (one rank of a job)
//   chorus-bench allreduce --np 4 -b 8 -e 64M -f 2               (launches its own job)
//   chorus-bench allreduce -g 4 -b 8 -e 64M -f 2                 (the same, as nccl-tests' -g 4)
//   chorus-bench kv -b 64K -e 4M -f 4 --blocks 32                 (KV-cache blocks between 2 agents, docs/kv.md)
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

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common/env.hpp"
#include "common/size.hpp"
#include "toolkit/bench_args.hpp"

namespace {

namespace bench = chorus::tools::bench;

// Where this process runs: whether a launcher (chorus-run, torchrun, mpirun,
// srun) already made it a rank, whether chorus-bench launched it, rank 0.
bench::BenchEnv benchEnv() {
  namespace env = chorus::env;
  return {.in_job = env::raw("CHORUS_RANK") || env::getAny("RANK") || env::getAny("OMPI_COMM_WORLD_RANK") ||
                    env::getAny("SLURM_PROCID"),
          .self_launched = env::getAny("CHORUS_BENCH_LAUNCHED").has_value(),
          .rank0 = env::getString("CHORUS_RANK") == "0" || env::getString("RANK") == "0" ||
                   env::getString("OMPI_COMM_WORLD_RANK") == "0"};
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
  bench::BenchArgs a;  // the defaults are BenchArgs'
  app.add_option("collective", a.collective,
                 "allreduce|broadcast|reduce|allgather|reducescatter|alltoall|gather|scatter|sendrecv|barrier|dispatch|combine|"
                 "kv")
      ->required();
  app.add_option("-b,--minbytes", a.min_bytes, "smallest size");
  app.add_option("-e,--maxbytes", a.max_bytes, "largest size");
  app.add_option("-f,--stepfactor", a.step_factor, "multiply the size by this factor (> 1)");
  app.add_option("-i,--stepbytes", a.step_bytes, "add this to the size when -f is not > 1");
  app.add_option("-n,--iters", a.iters, "timed iterations per size");
  app.add_option("-w,--warmup_iters", a.warmup, "untimed iterations per size");
  app.add_option("--warmup-ms", a.warmup_ms, "keep warming up until the slowest rank has spent this long (ms)")
      ->check(CLI::Range(0.0, 600000.0));
  app.add_option("--min-ms", a.min_ms, "time at least this long per size in one window, with more calls than -n if "
                                       "needed (ms)")
      ->check(CLI::Range(0.0, 600000.0));
  app.add_option("-d,--datatype", a.dtype, "data type (float, half, bf16, int32, ...) or all");
  app.add_option("-o,--op", a.op, "sum|prod|max|min|avg|all");
  app.add_option("-r,--root", a.root, "root rank of rooted collectives");
  app.add_option("-c,--check", a.check, "1: check every output element of one call per size; 0: no check");
  app.add_option("--algo", a.algo,
                 "force this algorithm (sets CHORUS_ALGO=<collective>:<NAME>); a size it cannot run is reported "
                 "with the reason and not measured (exit status 1); 'all': every registered algorithm of the "
                 "collective, in turn at each size, skipping (with a note) the sizes an algorithm cannot run")
      ->default_str("auto (the tuner chooses)");
  app.add_option("--plan", a.plan_paths, "a plan file or directory (docs/plan-format.md; repeatable; adds to "
                                         "CHORUS_PLAN_PATH): proven as it loads, its plans can be forced with --algo");
  app.add_option("--json", a.json_path, "also write one JSON object per row to this file (JSON Lines)")
      ->default_str("none");
  app.add_option("--np", a.np, "outside a job: launch this many local ranks of this benchmark")
      ->default_str("-t x -g");
  app.add_option("-t,--nthreads", a.threads, "nccl-tests: threads per process, each driving -g ranks; here every "
                                             "rank is a process, so outside a job this launches -t x -g ranks, and "
                                             "under a launcher it must be 1");
  app.add_option("-g,--ngpus", a.gpus, "nccl-tests: GPUs (ranks) per thread; as -t: outside a job -t x -g local "
                                       "rank processes, under a launcher 1");
  app.add_option("-p,--parallel_init", a.parallel_init, "nccl-tests: initialise the ranks of a process in parallel; "
                                                        "not applicable on CPU ranks (one rank per process), 1 is "
                                                        "noted and has no effect");
  app.add_option("-z,--blocking", a.blocking, "1: every timed call returns when it is complete; 0: the timed calls "
                                              "are queued on a chorus stream and waited for once (nccl-tests' default "
                                              "is 0)");
  app.add_option("--memory", a.memory, "the buffers' memory space: host, or opencl (device buffers of this "
                                      "process's first OpenCL device, calls on an OpenCL stream; docs/device.md)")
      ->check(CLI::IsMember({"host", "opencl", "cuda"}));
  app.add_option("-a,--average", a.average, "time reported per size from each rank's mean: 0 rank 0's, 1 the mean "
                                            "over ranks, 2 the fastest rank's, 3 the slowest rank's (nccl-tests' "
                                            "default is 1)")
      ->check(CLI::Range(0, 3));
  app.add_option("-G,--cudagraph", a.cudagraph, "nccl-tests: replay the iterations as a CUDA graph; not applicable "
                                                "on CPU ranks, only 0 is accepted");
  app.add_option("-C,--report_cputime", a.cputime, "nccl-tests: 1 reports CPU wall time, 0 GPU event time; CPU "
                                                   "ranks have only the CPU clock, so times are always -C 1's");
  app.add_option("-T,--timeout", a.timeout_s, "a collective (or the init) that makes no progress for SEC seconds "
                                              "fails (CHORUS_TIMEOUT_MS), ending a hung benchmark with an error")
      ->default_str("CHORUS_TIMEOUT_MS (600 s)");
  app.add_option("--tokens", a.tokens, "dispatch|combine: tokens per rank");
  app.add_option("--hidden", a.hidden, "dispatch|combine: elements per token row");
  app.add_option("--experts", a.experts, "dispatch|combine: experts (a multiple of the ranks)");
  app.add_option("--topk", a.topk, "dispatch|combine: experts per token");
  app.add_option("--max-hosts", a.max_hosts, "dispatch|combine: node-limited routing, each token's experts on at most "
                                              "this many hosts (0: off)");
  app.add_option("--form", a.form, "dispatch|combine: ep (chorusEp*), alltoallv (the same exchange as chorusAllToAllV) "
                                   "or both, in turn at each repeat");
  app.add_option("--repeats", a.repeats, "dispatch|combine: rounds of every form in turn (paired), each printed");
  app.add_option("--seed", a.seed, "dispatch|combine: the routing's and the inputs' seed");
  app.add_option("--blocks", a.kv_blocks, "kv: KV blocks per batch (-b..-e: the bytes of one block, every layer's K "
                                         "and V)");
  app.add_option("--layers", a.kv_layers, "kv: layers of a block (a layer-major batch has 2 x layers descriptors "
                                         "per block)");
  app.add_option("--layout", a.kv_layout, "kv: layer (layer-major pools), block (block-major) or both, in turn");
  app.add_option("--tp-prefill", a.kv_tp_prefill, "kv: TP degree of rank 0's side (its pool holds that many ranks' "
                 "regions; default 1)");
  app.add_option("--tp-decode", a.kv_tp_decode, "kv: TP degree of rank 1's side; a batch is every (prefill rank, decode "
                 "rank) pair's pieces for the heads they share (default 1)");
  app.add_option("--kv-op", a.kv_op, "kv: write (rank 0 pushes to rank 1), read (rank 0 pulls) or both, in turn");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  a.np_given = app.count("--np") > 0;
  a.cputime_given = app.count("-C") > 0;
  a.dtype_given = app.count("-d") > 0;

  const bench::BenchEnv env = benchEnv();
  auto plan = bench::planFromArgs(a, env);
  if (!plan.isOk()) {
    fmt::print(stderr, "{}\n", plan.status().message());
    return bench::exitStatus(plan.status());
  }
  // Outside a job: launch --np (or -t x -g) ranks of ourselves; as a rank: measure.
  return plan->launch_ranks > 0 ? bench::launchSelf(*plan, argc, argv) : bench::runRank(std::move(*plan), env);
}
