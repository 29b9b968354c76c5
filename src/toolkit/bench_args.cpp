#include "toolkit/bench_args.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <numeric>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>

#include "api/config.hpp"
#include "common/size.hpp"
#include "kernels/dtype.hpp"
#include "plan/plan.hpp"
#include "toolkit/launcher.hpp"

namespace chorus::tools::bench {
namespace {

// A usage error (exit status 2, as CLI11's own).
Status usage(std::string_view message) { return Status(chorusInvalidUsage, fmt::format("chorus-bench: {}", message)); }
// Any other error (exit status 1).
Status failure(std::string_view message) {
  return Status(chorusInvalidArgument, fmt::format("chorus-bench: {}", message));
}

// dispatch | combine: the MoE benchmark's options (toolkit/bench_ep.hpp).
Result<EpBenchOptions> epOptions(const BenchArgs& a) {
  EpBenchOptions e;
  e.combine = a.collective == "combine";
  if (!a.algo.empty() || !a.plan_paths.empty())
    return usage(fmt::format("{}: --algo and --plan choose a collective's plan; {} is not one", a.collective,
                             a.collective));
  e.tokens = a.tokens, e.hidden = a.hidden, e.experts = a.experts, e.topk = a.topk, e.max_hosts = a.max_hosts;
  if (a.tokens > (size_t{1} << 24) || a.hidden == 0 || a.hidden > (size_t{1} << 20))
    return usage(fmt::format("--tokens {} / --hidden {}: tokens must be at most 2^24 and hidden 1..2^20", a.tokens,
                             a.hidden));
  if (a.max_hosts < 0) return usage(fmt::format("--max-hosts {} must be >= 0 (0: no node limit)", a.max_hosts));
  if (a.repeats < 1 || a.repeats > 1000) return usage(fmt::format("--repeats {} must be in 1..1000", a.repeats));
  const std::string d = a.dtype_given ? a.dtype : "bf16";
  if (d == "fp8") {
    e.dtype = chorusBfloat16, e.compress = CHORUS_COMPRESS_FP8;
  } else if (d == "bf16" || d == "bfloat16") {
    e.dtype = chorusBfloat16;
  } else if (d == "float" || d == "float32") {
    e.dtype = chorusFloat32;
  } else {
    return usage(fmt::format("{} -d {}: the payload is bf16 (default), fp8 (bf16 data, fp8 dispatch wire) or float",
                             a.collective, d));
  }
  if (a.form == "ep") {
    e.forms = {EpForm::Ep};
  } else if (a.form == "alltoallv") {
    e.forms = {EpForm::AllToAllV};
  } else if (a.form != "both") {
    return usage(fmt::format("--form {}: ep, alltoallv or both", a.form));
  }
  e.iters = a.iters, e.warmup = a.warmup, e.repeats = a.repeats, e.check = a.check != 0, e.average = a.average;
  e.seed = a.seed;
  e.json_path = a.json_path;
  return e;
}

// kv: the KV-cache transfer benchmark's options (toolkit/bench_kv.hpp); the
// block sizes are the sweep's (-b, -e, -f, -i).
Result<KvBenchOptions> kvOptions(const BenchArgs& a, const SweepOptions& sweep) {
  KvBenchOptions k;
  if (!a.algo.empty() || !a.plan_paths.empty())
    return usage("kv: --algo and --plan choose a collective's plan; kv is not one");
  if (a.kv_blocks == 0 || a.kv_blocks > (uint64_t{1} << 20))
    return usage(fmt::format("--blocks {} must be in 1..2^20", a.kv_blocks));
  if (a.kv_layers == 0 || a.kv_layers > 1024) return usage(fmt::format("--layers {} must be in 1..1024", a.kv_layers));
  k.blocks = a.kv_blocks, k.layers = a.kv_layers;
  if (a.kv_tp_prefill == 0 || a.kv_tp_prefill > 64 || a.kv_tp_decode == 0 || a.kv_tp_decode > 64)
    return usage(fmt::format("--tp-prefill {} and --tp-decode {} must be in 1..64", a.kv_tp_prefill, a.kv_tp_decode));
  k.tp_prefill = a.kv_tp_prefill, k.tp_decode = a.kv_tp_decode;
  const uint64_t heads = std::lcm(uint64_t{a.kv_tp_prefill}, uint64_t{a.kv_tp_decode});
  if (a.kv_layout == "layer") {
    k.layouts = {0};
  } else if (a.kv_layout == "block") {
    k.layouts = {1};
  } else if (a.kv_layout != "both") {
    return usage(fmt::format("--layout {}: layer, block or both", a.kv_layout));
  }
  if (a.kv_op == "write") {
    k.writes = {true};
  } else if (a.kv_op == "read") {
    k.writes = {false};
  } else if (a.kv_op != "both") {
    return usage(fmt::format("--kv-op {}: write, read or both", a.kv_op));
  }
  auto sizes = sizeSweep(sweep);
  if (!sizes.isOk()) return usage(sizes.status().message());
  for (uint64_t b : *sizes)
    if (b < 2 * uint64_t{a.kv_layers} * heads)
      return usage(fmt::format("kv: a block of {} bytes is less than a byte per (layer, K|V{}) of --layers {}", b,
                               heads > 1 ? fmt::format(", head of the {} that TP {} and {} split", heads,
                                                       a.kv_tp_prefill, a.kv_tp_decode)
                                         : std::string(),
                               a.kv_layers));
  k.block_bytes = std::move(sizes.value());
  k.iters = a.iters, k.warmup = a.warmup, k.check = a.check != 0;
  k.json_path = a.json_path;
  return k;
}

}  // namespace

int exitStatus(const Status& s) { return s.code() == chorusInvalidUsage ? 2 : 1; }

Result<BenchPlan> planFromArgs(const BenchArgs& a, const BenchEnv& env) {
  // nccl-tests flags that do not apply to CPU ranks: refused when they would
  // change what is measured, noted when they would not.
  if (a.cudagraph != 0)
    return usage(fmt::format("-G {}: not applicable on CPU ranks: -G captures the iterations in a CUDA graph and "
                             "replays it; chorus collectives run on CPU threads, with no graph to capture (use -G 0 "
                             "or leave it out)",
                             a.cudagraph));
  if (a.cputime != 0 && a.cputime != 1) return usage(fmt::format("-C {}: must be 0 or 1", a.cputime));
  if (a.blocking != 0 && a.blocking != 1) return usage(fmt::format("-z {}: must be 0 or 1", a.blocking));
  if (a.parallel_init != 0 && a.parallel_init != 1)
    return usage(fmt::format("-p {}: must be 0 or 1", a.parallel_init));
  if (a.threads < 1)
    return usage(fmt::format("-t {}: the number of threads per process must be at least 1", a.threads));
  if (a.gpus < 1) return usage(fmt::format("-g {}: the number of GPUs (ranks) per thread must be at least 1", a.gpus));
  if (a.np_given && a.np < 1) return usage(fmt::format("--np {}: the number of ranks must be at least 1", a.np));
  if (a.np_given && (a.threads > 1 || a.gpus > 1) && a.np != a.threads * a.gpus)
    return usage(fmt::format("--np {} disagrees with -t {} x -g {} = {} ranks: give one of them", a.np, a.threads,
                             a.gpus, a.threads * a.gpus));
  if (a.timeout_s < 0 || a.timeout_s > 1e6)
    return usage(fmt::format("-T {}: the timeout must be 0 (none given) to 1e6 seconds", a.timeout_s));

  BenchPlan plan;
  BenchOptions& o = plan.options;
  if (a.collective == "dispatch" || a.collective == "combine") {
    auto ep = epOptions(a);
    if (!ep.isOk()) return ep.status();
    plan.ep = std::move(ep.value());
  } else if (a.collective != "kv") {
    auto coll = parseCollective(a.collective);
    if (!coll.isOk()) return failure(coll.status().message() + " or dispatch|combine|kv");
    o.collective = *coll;
  }
  for (auto [text, dst, flag] : {std::tuple{&a.min_bytes, &o.sweep.min_bytes, "-b"},
                                 std::tuple{&a.max_bytes, &o.sweep.max_bytes, "-e"},
                                 std::tuple{&a.step_bytes, &o.sweep.step_bytes, "-i"}}) {
    auto v = parseSize(*text, flag);
    if (!v.isOk()) return usage(v.status().message());
    *dst = *v;
  }
  o.sweep.step_factor = a.step_factor;
  o.iters = a.iters;
  o.warmup_ms = a.warmup_ms;
  o.min_time_ms = a.min_ms;
  o.warmup = a.warmup;
  o.root = a.root;
  o.check = a.check != 0;
  o.json_path = a.json_path;
  o.average = a.average;
  o.blocking = a.blocking == 1;
  o.memory = a.memory;
  if (a.dtype == "all") {
    o.dtypes.clear();
    for (int d = 0; d < chorusNumTypes; ++d) o.dtypes.push_back(static_cast<chorusDataType_t>(d));
  } else if (!plan.ep && !kernels::parseDtype(a.dtype, &o.dtypes[0])) {
    return failure(fmt::format("unknown data type '{}' (-d float, half, bf16, double, int32, ...)", a.dtype));
  }
  if (a.op == "all") {
    o.ops = {chorusSum, chorusProd, chorusMax, chorusMin, chorusAvg};
  } else {
    auto op = parseOp(a.op);
    if (!op.isOk()) return failure(op.status().message());
    o.ops = {*op};
  }
  if (auto sweep = sizeSweep(o.sweep); !sweep.isOk() && !plan.ep) return failure(sweep.status().message());
  if (a.collective == "kv") {
    auto kv = kvOptions(a, o.sweep);
    if (!kv.isOk()) return kv.status();
    plan.kv = std::move(kv.value());
  }
  plan.algo = a.algo;
  plan.plan_paths = a.plan_paths;
  plan.timeout_s = a.timeout_s;

  if (!env.in_job) {
    // Not a rank yet: become the launcher of a job of ourselves.  The ranks see
    // CHORUS_RANK and so ignore --np, -t and -g.
    if (a.parallel_init == 1)
      plan.notes.emplace_back(
          "chorus-bench: -p 1: not applicable on CPU ranks: each rank is a process of its own with one "
          "communicator, so there is no set of communicators to initialise in parallel; ignored");
    if (a.cputime_given && a.cputime == 0)
      plan.notes.emplace_back("chorus-bench: -C 0: not applicable on CPU ranks: there is no GPU event timer; times "
                              "are CPU wall time, as -C 1");
    // kv: the two agents, unless --np says otherwise (and fails in the ranks).
    plan.launch_ranks = a.np_given ? a.np : plan.kv && a.threads * a.gpus == 1 ? 2 : a.threads * a.gpus;
    return plan;
  }
  // The ranks chorus-bench launched itself see its own -t/-g/--np again.
  if (a.threads * a.gpus != 1 && !env.self_launched)
    return usage(fmt::format("-t {} -g {}: not applicable on CPU ranks: under a launcher every process is one rank "
                             "(nccl-tests drives -t x -g GPUs from one process); ask the launcher for more ranks "
                             "instead (chorus-run -n N, torchrun --nproc_per_node N, mpirun -n N)",
                             a.threads, a.gpus));
  return plan;
}

Result<Config> rankConfig(BenchPlan& plan, Config cfg) {
  BenchOptions& o = plan.options;
  if (plan.timeout_s > 0)
    cfg.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(plan.timeout_s * 1000)));
  cfg.tune.plan_paths.insert(cfg.tune.plan_paths.end(), plan.plan_paths.begin(), plan.plan_paths.end());
  o.plan_paths = cfg.tune.plan_paths;
  o.algos.clear();
  o.forced_algo.clear();
  if (plan.algo == "all") {
    auto loaded = plan::Registry::withPlans(cfg.tune.plan_paths);
    if (!loaded.isOk()) return failure(loaded.status().message());
    const plan::Registry registry = std::move(loaded.value());
    if (const std::optional<plan::Collective> pc = planCollective(o.collective))
      for (const plan::Algorithm* alg : registry.forCollective(*pc)) o.algos.emplace_back(alg->name());
    if (o.algos.empty())
      return failure(fmt::format("--algo all: {} has no algorithms to choose from", collectiveName(o.collective)));
  } else if (!plan.algo.empty()) {
    cfg.tune.algo_spec = withAlgo(cfg.tune.algo_spec, o.collective, plan.algo);
    o.forced_algo = plan.algo;
  }
  o.algo_spec = cfg.tune.algo_spec;
  return cfg;
}

int launchSelf(const BenchPlan& plan, int argc, char** argv) {
  for (const std::string& n : plan.notes) fmt::print(stderr, "{}\n", n);
  LaunchOptions lo;
  lo.nranks = plan.launch_ranks;
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  lo.argv.push_back(ec ? std::string(argv[0]) : self.string());
  for (int i = 1; i < argc; ++i) lo.argv.emplace_back(argv[i]);
  lo.prefix_stdout = false;  // only rank 0 prints the table
  lo.name = "chorus-bench";
  lo.extra_env = {{"CHORUS_BENCH_LAUNCHED", "1"}};
  auto report = launch(lo);
  if (!report.isOk()) {
    fmt::print(stderr, "{}\n", report.status().message());
    return 1;
  }
  return report->exit_code;
}

int runRank(BenchPlan plan, const BenchEnv& env) {
  auto fail = [](const std::string& message) {
    fmt::print(stderr, "{}\n", message);
    return 1;
  };
  // The job's configuration (CHORUS_*), with chorus-bench's options over it.
  auto job = api::configFromEnv();
  if (!job.isOk()) return fail(fmt::format("chorus-bench: {}", job.status().message()));
  auto configured = rankConfig(plan, std::move(job.value()));
  if (!configured.isOk()) return fail(configured.status().message());
  const Config& cfg = configured.value();
  BenchOptions& o = plan.options;
  int unsupported = 0;
  o.unsupported = &unsupported;

  // Two communicators over the same ranks: the benchmark's own barriers and
  // reductions run on the first, made without tracing, so a trace
  // (chorus-trace report) holds only the measured calls of the second.
  chorusComm_t book = nullptr, comm = nullptr;
  {
    Config book_cfg = cfg;
    book_cfg.trace.dir.clear();
    if (chorusResult_t r = api::commInitFromEnv(&book, book_cfg); r != chorusSuccess)
      return fail(fmt::format("chorus-bench: chorusCommInitFromEnv failed: {}: {}", chorusGetErrorString(r),
                              chorusGetLastError(nullptr)));
  }
  if (chorusResult_t r = api::commInitFromEnv(&comm, cfg); r != chorusSuccess)
    return fail(fmt::format("chorus-bench: chorusCommInitFromEnv failed: {}: {}", chorusGetErrorString(r),
                            chorusGetLastError(nullptr)));
  o.bookkeeping = book;
  Result<uint64_t> wrong = uint64_t{0};
  if (plan.ep) {
    plan.ep->bookkeeping = book;
    wrong = runEpBench(*plan.ep, comm, stdout);
  } else if (plan.kv) {
    wrong = runKvBench(*plan.kv, book, stdout);
  } else {
    wrong = runBench(o, comm, stdout);
  }
  if (!wrong.isOk()) {
    fmt::print(stderr, "{}\n", wrong.status().message());
    chorusCommAbort(comm);
    chorusCommAbort(book);
    return 1;
  }
  if (unsupported > 0) {
    // Every rank fails alike, but only after rank 0 has said why: a launcher
    // stops the others as soon as one rank exits non-zero.
    if (!env.in_job || env.rank0)
      fmt::print(stderr,
                 "chorus-bench: --algo {} could not run {} size(s) of this sweep (the '#' lines say why); they were "
                 "not measured\n",
                 plan.algo, unsupported);
    (void)chorusBarrier(book, nullptr);
  }
  for (chorusComm_t c : {comm, book})
    if (chorusResult_t r = chorusCommDestroy(c); r != chorusSuccess)
      return fail(fmt::format("chorus-bench: chorusCommDestroy failed: {}: {}", chorusGetErrorString(r),
                              chorusGetLastError(nullptr)));
  return unsupported > 0 || *wrong != 0 ? 1 : 0;
}

}  // namespace chorus::tools::bench
