// chorus-bench: nccl-tests-style collective benchmark.
//
//   chorus-run -n 4 chorus-bench allreduce -b 8 -e 64M -f 2      (one rank of a job)
//   chorus-bench allreduce --np 4 -b 8 -e 64M -f 2               (launches its own job)
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "common/env.hpp"
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-bench: nccl-tests-style benchmark of one collective"};
  std::string collective, min_s = "32M", max_s = "32M", step_s = "1M", dtype_s = "float", op_s = "sum", algo,
                          json_path;
  double factor = 1;
  int iters = 20, warmup = 5, root = 0, check = 1, np = 0;
  double timeout_s = 0;
  app.add_option("collective", collective,
                 "allreduce|broadcast|reduce|allgather|reducescatter|alltoall|gather|scatter|sendrecv|barrier")
      ->required();
  app.add_option("-b,--minbytes", min_s, "smallest size (K/M/G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", max_s, "largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", factor, "multiply the size by this factor (> 1)")->capture_default_str();
  app.add_option("-i,--stepbytes", step_s, "add this to the size when -f is not > 1")->capture_default_str();
  app.add_option("-n,--iters", iters, "timed iterations per size")->capture_default_str();
  app.add_option("-w,--warmup_iters", warmup, "untimed iterations per size")->capture_default_str();
  double warmup_ms = 0, min_ms = 0;
  app.add_option("--warmup-ms", warmup_ms, "keep warming up until the slowest rank has spent this long (ms)")
      ->check(CLI::Range(0.0, 600000.0));
  app.add_option("--min-ms", min_ms, "time at least this long per size in one window, with more calls than -n if "
                                     "needed (ms)")
      ->check(CLI::Range(0.0, 600000.0));
  app.add_option("-d,--datatype", dtype_s, "data type (float, half, bf16, int32, ...) or all")->capture_default_str();
  app.add_option("-o,--op", op_s, "sum|prod|max|min|avg|all")->capture_default_str();
  app.add_option("-r,--root", root, "root rank of rooted collectives")->capture_default_str();
  app.add_option("-c,--check", check, "1: check every output element")->capture_default_str();
  app.add_option("--algo", algo,
                 "force this algorithm (sets CHORUS_ALGO=<collective>:<NAME>); 'all': one sweep per registered "
                 "algorithm of the collective");
  app.add_option("--json", json_path, "also write one JSON object per row to this file (JSON Lines)");
  app.add_option("-g,--np", np, "outside a job: launch this many local ranks of this benchmark");
  app.add_option("--timeout", timeout_s, "with --np: stop the job after SEC seconds (exit 124)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  bench::BenchOptions o;
  auto coll = bench::parseCollective(collective);
  if (!coll.isOk()) return fail("chorus-bench: " + coll.status().message());
  o.collective = *coll;
  for (auto [text, dst] : {std::pair{&min_s, &o.sweep.min_bytes}, std::pair{&max_s, &o.sweep.max_bytes},
                           std::pair{&step_s, &o.sweep.step_bytes}}) {
    auto v = bench::parseSize(*text);
    if (!v.isOk()) return fail("chorus-bench: " + v.status().message());
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
    // CHORUS_RANK and so ignore --np.
    chorus::tools::LaunchOptions lo;
    lo.nranks = np > 0 ? np : 1;
    std::error_code ec;
    auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    lo.argv.push_back(ec ? std::string(argv[0]) : self.string());
    for (int i = 1; i < argc; ++i) lo.argv.emplace_back(argv[i]);
    lo.prefix_stdout = false;  // only rank 0 prints the table
    lo.name = "chorus-bench";
    if (timeout_s > 0)
      lo.timeout = std::chrono::ceil<std::chrono::milliseconds>(std::chrono::duration<double>(timeout_s));
    auto report = chorus::tools::launch(lo);
    if (!report.isOk()) return fail(report.status().message());
    return report->exit_code;
  }

  if (algo == "all") {
    chorus::plan::Collective pc;
    const chorus::plan::Registry registry = chorus::plan::Registry::builtin();
    if (chorus::plan::parseCollective(collective, &pc))
      for (const chorus::plan::Algorithm* a : registry.forCollective(pc)) o.algos.emplace_back(a->name());
    if (o.algos.empty()) return fail(fmt::format("chorus-bench: --algo all: {} has no algorithms to choose from", collective));
  } else if (!algo.empty()) {
    std::string forced = bench::withAlgo(chorus::env::getString("CHORUS_ALGO"), o.collective, algo);
    ::setenv("CHORUS_ALGO", forced.c_str(), 1);  // before init, which reads it
  }
  chorusComm_t comm = nullptr;
  if (chorusResult_t r = chorusCommInitFromEnv(&comm); r != chorusSuccess)
    return fail(fmt::format("chorus-bench: chorusCommInitFromEnv failed: {}: {}", chorusGetErrorString(r),
                            chorusGetLastError(nullptr)));
  auto wrong = bench::runBench(o, comm, stdout);
  if (!wrong.isOk()) {
    fmt::print(stderr, "{}\n", wrong.status().message());
    chorusCommAbort(comm);
    return 1;
  }
  if (chorusResult_t r = chorusCommDestroy(comm); r != chorusSuccess)
    return fail(fmt::format("chorus-bench: chorusCommDestroy failed: {}: {}", chorusGetErrorString(r),
                            chorusGetLastError(nullptr)));
  return *wrong == 0 ? 0 : 1;
}
