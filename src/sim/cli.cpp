#include "sim/cli.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include "common/size.hpp"
#include "sim/cli_args.hpp"
#include "sim/infer_host.hpp"
#include "sim/model_info.hpp"
#include "sim/nccl_topo.hpp"
#include "sim/placement.hpp"
#include "sim/report.hpp"
#include "sim/trace.hpp"
#include "sim/uncertainty.hpp"

namespace chorus::sim {
namespace {

// The band of a training prediction (dense or MoE by the model) on cluster c.
Band trainBand(const ModelSpec& m, const ClusterSpec& c) {
  return uncertaintyBand(m.moe.experts > 0 ? PredictionKind::MoeTrain : PredictionKind::DenseTrain, c.gpu.name);
}

// 1536 -> "1.50 KiB".
std::string formatBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.2f} {}", b, units[u]);
}

int fail(const Status& s) {
  std::fprintf(stderr, "chorus-sim: %s\n", s.message().c_str());
  return 1;
}

// Every distinct collective of the iteration: bytes per call, the group set,
// the time of one call, the algorithm and the binding link (tier, direction).
void printCollectiveLines(const TrainReport& r) {
  if (r.collectives.empty()) return;
  std::printf("  collectives (one call each; bytes per call, nccl-tests convention):\n");
  for (const TrainReport::CollectiveLine& l : r.collectives)
    std::printf("    %-10s %-26s %10s  %5lld ranks x %-6lld %11.1f us  %-20s %s\n", l.dim.c_str(),
                l.collective.c_str(), formatBytes(l.bytes).c_str(), static_cast<long long>(l.ranks),
                static_cast<long long>(l.groups), 1e6 * l.time_s, l.algo.c_str(), l.link.c_str());
}

void printTrain(const ModelSpec& m, const ClusterSpec& c, const TrainReport& r) {
  const Band band = trainBand(m, c);
  std::printf("%s on %lld GPUs of %s: %.3f s/iteration%s, %.0f tokens/s, MFU %.1f%% (full attention, Megatron's formula; "
              "causal %.1f%%), %.1f GiB/GPU + %.1f reserve (headroom %.1f), bottleneck %s (%s)\n",
              m.name.c_str(), static_cast<long long>(r.config.gpus), c.name.c_str(), r.iteration_s,
              band.suffix().c_str(), r.tokens_per_s,
              100 * r.mfu, 100 * r.mfu_causal, r.memory_gib_per_gpu, r.memory.reserve_gib, r.memory.headroom_gib,
              r.bottleneck.c_str(), r.bottleneck_link.c_str());
  std::printf("  placement: %s\n", r.placement.c_str());
  if (r.config.schedule)
    std::printf("  simulated schedule: %lld tasks (%d layer%s per task); closed-form estimate %.3f s%s\n",
                static_cast<long long>(r.schedule_tasks), r.schedule_merged_layers,
                r.schedule_merged_layers == 1 ? "" : "s", r.estimate_s, band.suffix().c_str());
  for (const auto& [k, v] : r.breakdown) std::printf("  %-12s %.4f s%s\n", k.c_str(), v, band.suffix().c_str());
  printCollectiveLines(r);
  std::string bounds;
  for (const auto& [k, v] : r.bounds.seconds) bounds += fmt::format("{}{} {:.3f} s", bounds.empty() ? "" : ", ", k, v);
  std::printf("  lower bounds (each resource's bytes or FLOPs at its full rate; no iteration is shorter): %s\n"
              "  binding bound: %s (%.3f s of the %.3f s iteration)\n",
              bounds.c_str(), r.bounds.binding.c_str(), r.bounds.max(), r.iteration_s);
  std::printf("  %s\n", band.line().c_str());
}

void printServe(const ServeStats& s) {
  std::printf("  %-22s TTFT p50/p90/p99 %.3f/%.3f/%.3f s  TPOT p50/p90/p99 %.1f/%.1f/%.1f ms  %.2f req/s  goodput %.2f req/s (%.0f%% in SLO)%s\n",
              s.label().c_str(), s.ttft_p50_s, s.ttft_p90_s, s.ttft_p99_s, 1e3 * s.tpot_p50_s, 1e3 * s.tpot_p90_s,
              1e3 * s.tpot_p99_s, s.throughput_rps, s.goodput_rps, 100 * s.slo_attainment,
              s.mode == "disaggregated" ? fmt::format("  KV transfer {:.2f} ms per request (mean)", 1e3 * s.kv_transfer_mean_s).c_str()
                                        : "");
  if (s.overloaded) {
    std::printf("    OVERLOADED: %.2f req/s offered, capacity %.2f req/s (the same requests all queued at once); requests "
                "in the system %lld when the middle one arrives, %lld when the last one does%s: the latencies grow with "
                "--requests, not a steady state\n",
                s.offered_rps, s.capacity_rps, static_cast<long long>(s.backlog_mid), static_cast<long long>(s.backlog_end),
                s.queue_growing ? " (still growing)" : "");
  } else if (s.capacity_rps > 0) {
    std::printf("    stable: %.2f req/s offered, capacity %.2f req/s (%.0f%% utilised)\n", s.offered_rps, s.capacity_rps,
                100 * s.offered_rps / s.capacity_rps);
  }
}

// The metrics block as vLLM's benchmark_serving prints it (times in ms).
void printServeDetail(const ServeStats& s, int64_t requests) {
  std::printf("    requests %lld, duration %.2f s, %.3f req/s, output %.1f tok/s, total %.1f tok/s, %.1f tok/s per user, "
              "goodput %.3f req/s, at most %lld running per replica%s\n",
              static_cast<long long>(requests), s.duration_s, s.throughput_rps, s.tokens_per_s, s.total_tokens_per_s,
              s.per_user_tokens_per_s, s.goodput_rps, static_cast<long long>(s.max_running),
              s.preemptions > 0 ? fmt::format(", {} preemptions", s.preemptions).c_str() : "");
  for (auto [name, l] : {std::pair{"TTFT", s.ttft}, {"TPOT", s.tpot}, {"ITL", s.itl}, {"E2E", s.e2e}})
    std::printf("    %-4s mean %9.2f  p50 %9.2f  p90 %9.2f  p99 %9.2f ms\n", name, 1e3 * l.mean, 1e3 * l.p50, 1e3 * l.p90,
                1e3 * l.p99);
}

// What the collective, train, search and infer commands price on: the plans,
// the network mode and library, the cluster (placed as a training layout's
// ranks see it), its topology and network model, and the model.  Built on
// the heap once: the network model keeps references to the rest.
struct Setup {
  plan::Registry reg = plan::Registry::builtin();
  std::optional<NetMode> mode;
  std::optional<Library> lib;
  std::optional<ClusterSpec> cluster;
  std::optional<ModelSpec> model;
  ClusterSpec job_cluster;
  std::optional<Topology> topo;
  std::unique_ptr<NetworkModel> net;
};

// The network mode, library and cluster file, in this order (what every
// pricing command reads first).
Result<std::unique_ptr<Setup>> openCluster(const CliOptions& o) {
  auto s = std::make_unique<Setup>();
  // Each plan file is proven by the verifier as it loads (plan/plan_file.hpp).
  CHORUS_ASSIGN_OR_RETURN(s->reg, plan::Registry::withPlans(o.plan_paths));
  CHORUS_ASSIGN_OR_RETURN(NetMode mode, parseNetMode(o.network));
  s->mode = mode;
  CHORUS_ASSIGN_OR_RETURN(Library lib, parseLibrary(o.library));
  s->lib = lib;
  CHORUS_ASSIGN_OR_RETURN(ClusterSpec c, loadCluster(o.cluster_path));
  if (!o.node_topo_path.empty()) {  // the node from an NCCL topology file, the rest from the cluster file
    CHORUS_ASSIGN_OR_RETURN(NodeTopo t, loadNodeTopo(o.node_topo_path));
    std::vector<std::string> report;
    c = applyNodeTopo(c, t, o.node_topo_path, &report);
    for (const std::string& line : report) std::fprintf(stderr, "chorus-sim: --node-topo: %s\n", line.c_str());
  }
  s->cluster = std::move(c);
  return s;
}

// The keys of a Hugging Face config that were not read, in one line on stderr.
void printIgnoredKeys(const std::string& path, const ModelSpec& m) {
  if (m.ignored_keys.empty()) return;
  std::string keys;
  for (const std::string& k : m.ignored_keys) keys += " " + k;
  std::fprintf(stderr, "chorus-sim: %s: keys not read (they change no shape priced here):%s\n", path.c_str(), keys.c_str());
}

// Then the model (the keys it did not read listed on stderr) ...
Status loadModelFile(const CliOptions& o, Setup& s) {
  CHORUS_ASSIGN_OR_RETURN(ModelSpec m, loadModel(o.model_path, o.allow_unknown_keys));
  s.model = std::move(m);
  printIgnoredKeys(o.model_path, *s.model);
  return {};
}

// ... and the placement of a training layout (`layout`, or none), the
// topology and the network model.
Status buildNetwork(const CliOptions& o, Setup& s, const TrainConfig* layout) {
  s.job_cluster = *s.cluster;
  if (layout) {  // training: the cluster as the layout's placement sees it (sim/placement.hpp)
    const int64_t use = o.gpus_per_domain != 0 ? o.gpus_per_domain : alignedDomainUse(*s.cluster, *layout);
    CHORUS_ASSIGN_OR_RETURN(ClusterSpec placed, placedCluster(*s.cluster, use, layout->gpus));
    s.job_cluster = std::move(placed);
  }
  CHORUS_ASSIGN_OR_RETURN(Topology t, Topology::build(s.job_cluster));
  s.topo.emplace(std::move(t));
  s.net = std::make_unique<NetworkModel>(s.job_cluster, *s.topo, s.reg, *s.mode);
  s.net->setLibrary(*s.lib);
  return {};
}

// All of it, in that order, for a command without a training layout (search, infer).
Result<std::unique_ptr<Setup>> openModelAndNetwork(const CliOptions& o) {
  CHORUS_ASSIGN_OR_RETURN(std::unique_ptr<Setup> s, openCluster(o));
  CHORUS_RETURN_IF_ERROR(loadModelFile(o, *s));
  CHORUS_RETURN_IF_ERROR(buildNetwork(o, *s, nullptr));
  return s;
}

// --moe-node-limit G:K into the model, refused unless the dispatcher honours
// it; the model's own node-limited routing beside the all-to-all dispatcher
// is said on stderr (it is not used there).
Status applyNodeLimit(const CliOptions& o, TrainConfig::MoeDispatch dispatch, ModelSpec& m) {
  const bool hier = dispatch == TrainConfig::MoeDispatch::Hierarchical;
  if (o.moe_node_limit.empty()) {
    if (!hier && m.moe.experts > 0 && m.moe.n_group > 0 && m.moe.topk_group > 0 && m.moe.topk_group < m.moe.n_group)
      std::fprintf(stderr, "chorus-sim: note: the model's node-limited routing (n_group %d, topk_group %d) is not used by "
                   "--moe-dispatch alltoall (every routed copy is sent); --moe-dispatch hierarchical prices it\n",
                   m.moe.n_group, m.moe.topk_group);
    return {};
  }
  int g = 0, k = 0;
  char extra = 0;
  if (std::sscanf(o.moe_node_limit.c_str(), "%d:%d%c", &g, &k, &extra) != 2 || g < 1 || k < 1 || k > g)
    return invalidArgument("--moe-node-limit '{}': give G:K, K of G expert groups with 1 <= K <= G (DeepSeek-V3: 8:4)",
                           o.moe_node_limit);
  if (m.moe.experts == 0) return invalidArgument("--moe-node-limit {}: model '{}' has no experts", o.moe_node_limit, m.name);
  if (m.moe.experts % g != 0)
    return invalidArgument("--moe-node-limit {}: {} groups must divide the model's {} experts", o.moe_node_limit, g,
                           m.moe.experts);
  if (!hier)
    return invalidArgument("--moe-node-limit {}: the all-to-all dispatcher (--moe-dispatch alltoall, the default) sends "
                           "every routed copy and cannot honour node-limited routing; use --moe-dispatch hierarchical",
                           o.moe_node_limit);
  m.moe.n_group = g, m.moe.topk_group = k;
  return {};
}

}  // namespace

int runModelCommand(const CliOptions& o) {
  const std::string& model_path = o.model_path;
  const int64_t model_seq = o.model_seq;
  const bool json = o.json, verbose = o.verbose;
  auto model = loadModel(model_path, o.allow_unknown_keys);
  if (!model.isOk()) return fail(model.status());
  if (!json && !verbose) printIgnoredKeys(model_path, *model);
  auto info = describeModel(*model, model_seq);
  if (!info.isOk()) return fail(info.status());
  if (json) std::cout << toJson(*info).dump(2) << "\n";
  else std::fputs(formatModelInfo(*info, verbose).c_str(), stdout);
  return 0;
}

int runCollectiveCommand(const CliOptions& o) {
  const std::string &bytes_text = o.bytes_text, &collective = o.collective, &algo = o.algo, &network = o.network,
                    &library = o.library;
  const int64_t gpus = o.gpus;
  const bool json = o.json;
  // Every numeric flag's range, before any file is read or anything priced.
  {
    Status st = checkCollectiveArgs(gpus, 0);  // --bytes: chorus::parseSize below checks its grammar and range
    if (!st.isOk()) return fail(st);
  }
  auto compress = parseCompression(o.compress);
  if (!compress.isOk()) return fail(compress.status());
  auto setup = openCluster(o);
  if (!setup.isOk()) return fail(setup.status());
  const Setup& s = **setup;
  const plan::Registry& reg = s.reg;
  const std::optional<NetMode>& mode = s.mode;
  const std::optional<Library>& lib = s.lib;
  const std::optional<ClusterSpec>& cluster = s.cluster;
  if (Status st = checkPlanRanks(reg, collective, algo, gpus); !st.isOk()) return fail(st);
  // "--bytes A:B": a sweep from A to B doubling, as nccl-tests' -b A -e B -f 2.
  std::vector<double> sizes;
  if (const size_t colon = bytes_text.find(':'); colon != std::string::npos) {
    auto lo = chorus::parseSize(bytes_text.substr(0, colon), "--bytes"),
         hi = chorus::parseSize(bytes_text.substr(colon + 1), "--bytes");
    if (!lo.isOk()) return fail(lo.status());
    if (!hi.isOk()) return fail(hi.status());
    if (!(*lo >= 1 && *hi >= *lo))
      return fail(invalidArgument("--bytes '{}': a sweep MIN:MAX needs 1 <= MIN <= MAX", bytes_text));
    for (double b = static_cast<double>(*lo); b <= static_cast<double>(*hi); b *= 2) sizes.push_back(b);
  } else {
    auto bytes = chorus::parseSize(bytes_text, "--bytes");
    if (!bytes.isOk()) return fail(bytes.status());
    sizes.push_back(static_cast<double>(*bytes));
  }
  const Band band = uncertaintyBand(PredictionKind::Collective, cluster->gpu.name);
  nlohmann::json rows = nlohmann::json::array();
  for (double b : sizes) {
    auto r = simulateCollective(*cluster, gpus, collective, b, algo, reg, *mode, *lib, *compress);
    if (!r.isOk()) return fail(r.status());
    if (json) {
      nlohmann::json j = toJson(*r);
      j["network"] = network;
      j["library"] = library;
      j["uncertainty"] = band.toJson();
      j["time_us_range"] = band.range(r->time_us);
      rows.push_back(j);
    } else if (sizes.size() > 1) {
      if (b == sizes.front())
        std::printf("# %s on %lld GPUs of %s (%s, library %s)\n# %14s %12s %10s %10s  %-22s %s\n", r->collective.c_str(),
                    static_cast<long long>(gpus), cluster->name.c_str(), network.c_str(), library.c_str(), "size (B)",
                    "time (us)", "algbw", "busbw", "algo", "bottleneck");
      std::printf("  %14.0f %12.1f %10.2f %10.2f  %-22s %s%s\n", r->bytes, r->time_us, r->algbw_gbps, r->busbw_gbps,
                  r->algo.c_str(), r->bottleneck.c_str(), band.suffix().c_str());
    } else {
      std::printf("%s %.0f bytes on %lld GPUs of %s (%s): %.1f us%s, algbw %.2f GB/s, busbw %.2f GB/s, algo %s, bottleneck %s\n",
                  r->collective.c_str(), r->bytes, static_cast<long long>(gpus), cluster->name.c_str(), network.c_str(),
                  r->time_us, band.suffix().c_str(), r->algbw_gbps, r->busbw_gbps, r->algo.c_str(), r->bottleneck.c_str());
    }
  }
  if (json) std::cout << (rows.size() == 1 ? rows[0] : rows).dump(2) << "\n";
  else std::printf("%s%s\n", sizes.size() > 1 ? "# " : "  ", band.line().c_str());
  return 0;
}

int runTrainCommand(CliOptions o) {
  TrainConfig& tc = o.tc;
  const std::string &micro = o.micro, &rank_order = o.rank_order, &recompute = o.recompute,
                    &grad_dtype = o.grad_dtype, &moments = o.moments, &optimizer = o.optimizer, &recompute_modules = o.recompute_modules,
                    &pp_schedule = o.pp_schedule, &moe_dispatch = o.moe_dispatch, &network = o.network,
                    &trace_path = o.trace_path, &plot_path = o.plot_path;
  const bool json = o.json, no_sp = o.no_sp, no_flash = o.no_flash, estimate_only = o.estimate_only,
             sync_tp = o.sync_tp, no_overlap_dp = o.no_overlap_dp;
  {
    auto compress = parseCompression(o.compress);
    if (!compress.isOk()) return fail(compress.status());
    tc.grad_compress = *compress;
    auto mb = parseMicroBatch(micro);
    if (!mb.isOk()) return fail(mb.status());
    tc.micro_batch = *mb;
    if (tc.dp == 0) {  // --dp not given: the GPUs the other degrees leave
      const int64_t rest = static_cast<int64_t>(tc.tp) * tc.pp * tc.cp;
      if (rest < 1 || tc.gpus % rest != 0)
        return fail(invalidArgument("--dp not given and --gpus {} is not a multiple of tp x pp x cp = {} x {} x {} = {}; "
                                    "give --dp or change the degrees", tc.gpus, tc.tp, tc.pp, tc.cp, rest));
      tc.dp = static_cast<int>(tc.gpus / rest);
    }
    if (Status st = parseMemoryReserve(o.memory_reserve, &tc.memory_reserve_gib, &tc.memory_reserve_fraction); !st.isOk())
      return fail(st);
    Status st = checkTrainArgs(tc);
    if (!st.isOk()) return fail(st);
  }
  auto setup = openCluster(o);
  if (!setup.isOk()) return fail(setup.status());
  Setup& s = **setup;
  if (Status st = loadModelFile(o, s); !st.isOk()) return fail(st);
  if (rank_order != "tp-cp-ep-dp-pp" && rank_order != "tp-cp-ep-pp-dp")
    return fail(invalidArgument("--rank-order '{}' is not one of tp-cp-ep-dp-pp, tp-cp-ep-pp-dp", rank_order));
  tc.pp_before_dp = rank_order == "tp-cp-ep-pp-dp";  // the placement follows it
  if (Status st = buildNetwork(o, s, &tc); !st.isOk()) return fail(st);
  const std::optional<ModelSpec>& model = s.model;
  const std::optional<ClusterSpec>& cluster = s.cluster;
  NetworkModel& net = *s.net;
  auto rc = parseRecompute(recompute);
  if (!rc.isOk()) return fail(rc.status());
  tc.recompute = *rc;
  if (grad_dtype != "fp32" && grad_dtype != "bf16")
    return fail(invalidArgument("--grad-dtype '{}' is not one of fp32, bf16", grad_dtype));
  tc.grad_bytes = grad_dtype == "bf16" ? 2 : 4;
  if (moments != "fp32" && moments != "bf16")
    return fail(invalidArgument("--optimizer-moments '{}' is not one of fp32, bf16", moments));
  tc.moment_bytes = moments == "bf16" ? 2 : 4;
  if (optimizer != "adam" && optimizer != "sgd")
    return fail(invalidArgument("--optimizer '{}' is not one of adam, sgd", optimizer));
  tc.optimizer = optimizer == "sgd" ? TrainConfig::Optimizer::Sgd : TrainConfig::Optimizer::Adam;
  if (!recompute_modules.empty()) {
    if (tc.recompute != Recompute::Selective)
      return fail(invalidArgument("--recompute-modules {} needs --recompute selective (got --recompute {})",
                                  recompute_modules, recompute));
    auto mods = parseRecomputeModules(recompute_modules);
    if (!mods.isOk()) return fail(mods.status());
    tc.recompute_modules = *mods;
  }
  if (pp_schedule != "1f1b" && pp_schedule != "zb-h1" && pp_schedule != "dualpipe")
    return fail(invalidArgument("--pp-schedule '{}' is not one of 1f1b, zb-h1, dualpipe", pp_schedule));
  tc.zero_bubble = pp_schedule == "zb-h1";
  tc.dualpipe = pp_schedule == "dualpipe";
  if (o.clock != "sustained" && o.clock != "burst")
    return fail(invalidArgument("--clock '{}' is not one of sustained, burst", o.clock));
  tc.burst_clock = o.clock == "burst";
  tc.sequence_parallel = !no_sp;
  tc.flash_attention = !no_flash;
  tc.schedule = !estimate_only;
  tc.async_tp = !sync_tp;
  tc.overlap_dp = !no_overlap_dp;
  tc.grad_accum_fusion = !o.no_grad_accum_fusion;
  auto md = parseMoeDispatch(moe_dispatch);
  if (!md.isOk()) return fail(md.status());
  tc.moe_dispatch = *md;
  if (Status st = applyNodeLimit(o, tc.moe_dispatch, *s.model); !st.isOk()) return fail(st);
  auto r = simulateTraining(*model, tc, net);
  if (!r.isOk()) return fail(r.status());
  nlohmann::json j = toJson(*r);
  j["network"] = network;
  {
    const Band band = trainBand(*model, *cluster);
    j["uncertainty"] = band.toJson();
    j["iteration_time_s_range"] = band.range(r->iteration_s);
  }
  if (!trace_path.empty()) {
    std::ofstream f(trace_path);
    if (!f) return fail(systemError("--trace: cannot open '{}' for writing", trace_path));
    auto sum = writeTrainTrace(*r, f);
    if (!sum.isOk()) return fail(sum.status());
    j["trace"] = {{"path", trace_path}, {"events", sum->events}, {"schedule_makespan_s", sum->makespan_s}};
    if (!json)
      std::fprintf(stderr, "trace: %s (%lld events, list-scheduled makespan %.3f s)\n", trace_path.c_str(),
                   static_cast<long long>(sum->events), sum->makespan_s);
  }
  if (!plot_path.empty()) {
    Status st = plotBreakdown(*r, fmt::format("{} on {} GPUs: {:.3f} s/iteration, MFU {:.1f}%", model->name, tc.gpus,
                                              r->iteration_s, 100 * r->mfu), plot_path);
    j["plot"] = st.isOk() ? nlohmann::json(plot_path) : nlohmann::json(st.message());
    if (!st.isOk()) std::fprintf(stderr, "chorus-sim: plot skipped: %s\n", st.message().c_str());
    else if (!json) std::fprintf(stderr, "plot: %s\n", plot_path.c_str());
  }
  if (json) std::cout << j.dump(2) << "\n";
  else printTrain(*model, *cluster, *r);
  return 0;
}

int runSearchCommand(CliOptions o) {
  SearchConfig& sc = o.sc;
  const std::string &pp_schedules = o.pp_schedules, &moe_dispatch = o.moe_dispatch, &network = o.network;
  const bool json = o.json, no_progress = o.no_progress;
  {
    Status st = checkSearchArgs(sc);
    if (!st.isOk()) return fail(st);
    st = parseMemoryReserve(o.memory_reserve, &sc.memory_reserve_gib, &sc.memory_reserve_fraction);
    if (!st.isOk()) return fail(st);
  }
  auto setup = openModelAndNetwork(o);
  if (!setup.isOk()) return fail(setup.status());
  Setup& s = **setup;
  const std::optional<ModelSpec>& model = s.model;
  const std::optional<ClusterSpec>& cluster = s.cluster;
  NetworkModel& net = *s.net;
  auto schedules = parsePpSchedules(pp_schedules);
  if (!schedules.isOk()) return fail(schedules.status());
  sc.pp_schedules = *schedules;
  const bool bar = !no_progress && isatty(STDERR_FILENO);
  const auto t0 = std::chrono::steady_clock::now();
  auto progress = [&](int64_t done, int64_t total) {
    if (!bar) return;
    const int w = 40, filled = static_cast<int>(w * done / std::max<int64_t>(total, 1));
    std::fprintf(stderr, "\r[%s%s] %lld/%lld layouts", std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(w - filled), '.').c_str(), static_cast<long long>(done),
                 static_cast<long long>(total));
    if (done == total) std::fprintf(stderr, "\n");
  };
  auto md = parseMoeDispatch(moe_dispatch);
  if (!md.isOk()) return fail(md.status());
  sc.moe_dispatch = *md;
  if (Status st = applyNodeLimit(o, sc.moe_dispatch, *s.model); !st.isOk()) return fail(st);
  auto r = searchLayouts(*model, sc, net, progress);
  if (!r.isOk()) return fail(r.status());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const Band band = trainBand(*model, *cluster);
  if (json) {
    nlohmann::json j = toJson(*r);
    j["uncertainty"] = band.toJson();
    j["search_seconds"] = secs;
    j["model"] = model->name;
    j["cluster"] = cluster->name;
    j["network"] = network;
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("%s on %lld GPUs of %s, global batch %lld x seq %lld: %lld layouts, %lld fit, searched in %.1f s\n",
                model->name.c_str(), static_cast<long long>(sc.gpus), cluster->name.c_str(),
                static_cast<long long>(sc.global_batch), static_cast<long long>(sc.seq),
                static_cast<long long>(r->candidates), static_cast<long long>(r->feasible), secs);
    int i = 1;
    if (r->resimulated > 0)
      std::printf("ranked by the schedule of the best %lld by the closed-form estimate (estimates %.1f s, schedules "
                  "%.1f s)\n", static_cast<long long>(r->resimulated), r->estimate_seconds, r->schedule_seconds);
    for (const TrainReport& t : r->top)
      std::printf("%2d. %-62s %8.3f s%s (estimate %.3f s)  MFU %5.1f%%  %5.1f GiB + %.1f reserve, headroom %5.1f GiB  "
                  "binding %s  bottleneck %s\n", i++,
                  layoutName(t.config).c_str(), t.iteration_s, band.suffix().c_str(), t.estimate_s, 100 * t.mfu, t.memory_gib_per_gpu,
                  t.memory.reserve_gib, t.memory.headroom_gib, t.bounds.binding.c_str(), t.bottleneck.c_str());
    if (!r->top.empty()) {
      const TrainReport::Memory& mm = r->top.front().memory;
      std::printf("placement of 1.: %s\n", r->top.front().placement.c_str());
      if (mm.communicators > 0 || mm.context_gib > 0)
        std::printf("reserve of 1.: %.2f GiB = CUDA context %.2f + NCCL buffers %.2f (%d communicators) + allocator "
                    "fragmentation %.2f (--memory-reserve to set it)\n", mm.reserve_gib, mm.context_gib,
                    mm.comm_buffers_gib, mm.communicators, mm.fragmentation_gib);
    }
    if (r->dropped_memory > 0) {
      std::printf("dropped for memory: %lld layouts; the nearest misses:\n",
                  static_cast<long long>(r->dropped_memory));
      for (const TrainReport& t : r->dropped)
        std::printf("    %-62s estimate %8.3f s%s  needs %5.1f GiB + %.1f reserve > %.1f GiB HBM (short by %.1f GiB)\n",
                    layoutName(t.config).c_str(), t.iteration_s, band.suffix().c_str(), t.memory_gib_per_gpu,
                    t.memory.reserve_gib, t.memory_gib_per_gpu + t.memory.reserve_gib + t.memory.headroom_gib,
                    -t.memory.headroom_gib);
    }
    std::printf("%s\n", band.line().c_str());
  }
  return 0;
}

int runInferCommand(CliOptions o) {
  InferConfig& ic = o.ic;
  const std::string &concurrency_text = o.concurrency_text, &lengths = o.lengths, &kv_alloc = o.kv_alloc,
                    &draft_path = o.draft_path, &plot_path = o.plot_path, &trace_path = o.trace_path;
  const bool json = o.json;
  std::vector<int64_t> sweep;
  std::vector<double> rates;
  {
    if (!o.rate_text.empty()) {
      auto rs = parseRates(o.rate_text);
      if (!rs.isOk()) return fail(rs.status());
      rates = *rs;
      ic.rate = rates.front();
    }
    if (!concurrency_text.empty()) {
      auto c = parseConcurrency(concurrency_text);
      if (!c.isOk()) return fail(c.status());
      sweep = *c;
      ic.concurrency = sweep.front();
    }
    Status st = checkInferConfig(ic);
    if (!st.isOk()) return fail(st);
  }
  {  // a host emulation of the prefill/decode demo (sim/infer_host.hpp)
    std::ifstream f(o.cluster_path);
    std::stringstream text;
    if (f) text << f.rdbuf();
    if (f && isHostEmulation(text.str())) {
      auto r = runHostInference(o.model_path, o.allow_unknown_keys, o.cluster_path, text.str(), ic, json);
      if (!r.isOk()) return fail(r.status());
      std::fputs(r->c_str(), stdout);
      return 0;
    }
  }
  auto setup = openModelAndNetwork(o);
  if (!setup.isOk()) return fail(setup.status());
  Setup& s = **setup;
  const std::optional<ModelSpec>& model = s.model;
  const std::optional<ClusterSpec>& cluster = s.cluster;
  NetworkModel& net = *s.net;
  auto d = parseLengthDist(lengths);
  if (!d.isOk()) return fail(d.status());
  if (kv_alloc != "reserve" && kv_alloc != "paged")
    return fail(invalidArgument("--kv-alloc '{}' is not one of reserve, paged", kv_alloc));
  ic.kv_paged = kv_alloc == "paged";
  if (!draft_path.empty()) {
    auto dm = loadModel(draft_path, o.allow_unknown_keys);
    if (!dm.isOk()) return fail(dm.status());
    ic.draft_model = std::make_shared<const ModelSpec>(*dm);
  }
  ic.dist = *d;
  const Band band = uncertaintyBand(PredictionKind::Inference, cluster->gpu.name);
  if (!plot_path.empty() && sweep.size() < 2)
    return fail(invalidArgument("--plot '{}' draws a concurrency sweep: give --concurrency a list (1,2,4,...)", plot_path));
  if (!trace_path.empty() && sweep.size() > 1)
    return fail(invalidArgument("--trace '{}' records one run: give --concurrency one value", trace_path));
  ic.record = !trace_path.empty();
  if (rates.size() > 1 && (!sweep.empty() || ic.max_throughput))
    return fail(invalidArgument("--rate '{}' sweeps open-loop rates: drop --concurrency / --max-throughput", o.rate_text));
  if (o.max_rate && (rates.size() > 1 || !sweep.empty() || ic.max_throughput || !trace_path.empty()))
    return fail(invalidArgument("--max-rate searches the rate itself: give no --rate list, --concurrency, "
                                "--max-throughput or --trace"));
  if (o.max_rate) {
    auto found = findMaxRates(*model, ic, net, o.slo_attainment);
    if (!found.isOk()) return fail(found.status());
    if (json) {
      nlohmann::json rows = nlohmann::json::array();
      for (const MaxRate& x : *found)
        rows.push_back({{"mode", x.mode}, {"prefill_replicas", x.prefill_replicas}, {"decode_replicas", x.decode_replicas},
                        {"capacity_rps", x.capacity_rps}, {"max_rate_rps", x.max_rate_rps},
                        {"slo_attainment_at_max", x.attainment_at_max}, {"capped_at_capacity", x.capped},
                        {"simulations", x.runs}});
      std::cout << nlohmann::json{{"max_rate", {{"slo_attainment", o.slo_attainment}, {"ttft_slo_s", ic.ttft_slo_s},
                                                {"tpot_slo_s", ic.tpot_slo_s}, {"e2e_slo_s", ic.e2e_slo_s},
                                                {"modes", rows}}},
                                  {"uncertainty", band.toJson()}}.dump(2) << "\n";
    } else {
      std::printf("%s on %lld GPUs of %s, %lld in / %lld out tokens: the highest rate with %.0f%% of requests within "
                  "TTFT %.2f s and TPOT %.0f ms\n", model->name.c_str(), static_cast<long long>(ic.gpus),
                  cluster->name.c_str(), static_cast<long long>(ic.input_len), static_cast<long long>(ic.output_len),
                  100 * o.slo_attainment, ic.ttft_slo_s, 1e3 * ic.tpot_slo_s);
      for (const MaxRate& x : *found)
        std::printf("  %-34s max rate %8.3f req/s (%.3f req/s per GPU)  capacity %8.3f req/s%s\n", x.mode.c_str(),
                    x.max_rate_rps, x.max_rate_rps / static_cast<double>(ic.gpus), x.capacity_rps,
                    x.max_rate_rps == 0 ? "  (no rate meets the SLOs)"
                    : x.capped          ? "  (= capacity: the SLOs still hold there)"
                                        : "");
      std::printf("%s\n", band.line().c_str());
    }
    return 0;
  }
  if (rates.size() > 1) {  // one open-loop service per rate
    nlohmann::json runs = nlohmann::json::array();
    if (!json)
      std::printf("%s on %lld GPUs of %s, %lld in / %lld out tokens, open loop\n"
                  "  rate req/s  served req/s  capacity  goodput  TTFT p50/p99 s     TPOT p50 ms  best\n",
                  model->name.c_str(), static_cast<long long>(ic.gpus), cluster->name.c_str(),
                  static_cast<long long>(ic.input_len), static_cast<long long>(ic.output_len));
    for (double rate : rates) {
      InferConfig k = ic;
      k.rate = rate;
      auto r = simulateInference(*model, k, net);
      if (!r.isOk()) return fail(r.status());
      const ServeStats& a = r->aggregated;
      if (json) {
        runs.push_back(toJson(*r));
      } else {
        std::printf("  %10.3f %13.3f %9.3f %8.3f  %7.3f/%-9.3f %11.1f  %s%s\n", rate, a.throughput_rps, a.capacity_rps,
                    a.goodput_rps, a.ttft.p50, a.ttft.p99, 1e3 * a.tpot.p50, r->best.c_str(),
                    a.overloaded ? "  OVERLOADED (aggregated)" : "");
      }
    }
    if (json) std::cout << nlohmann::json{{"rate_sweep", runs}, {"uncertainty", band.toJson()}}.dump(2) << "\n";
    else std::printf("%s\n", band.line().c_str());
    return 0;
  }
  if (sweep.size() > 1) {  // a concurrency sweep: one closed-loop run per value
    nlohmann::json runs = nlohmann::json::array();
    std::vector<std::pair<int64_t, InferReport>> points;
    if (!json)
      std::printf("%s on %lld GPUs of %s, %lld in / %lld out tokens, closed loop\n"
                  "  users  req/s  out tok/s  tok/s/user  TTFT p50/p99 ms   ITL p50/p99 ms  TPOT p50 ms  E2E p50 s\n",
                  model->name.c_str(), static_cast<long long>(ic.gpus), cluster->name.c_str(),
                  static_cast<long long>(ic.input_len), static_cast<long long>(ic.output_len));
    for (int64_t n : sweep) {
      InferConfig k = ic;
      k.concurrency = n;
      auto r = simulateInference(*model, k, net);
      if (!r.isOk()) return fail(r.status());
      const ServeStats& s = r->aggregated;
      points.emplace_back(n, *r);
      if (json) {
        nlohmann::json j = toJson(*r);
        runs.push_back(j);
      } else {
        std::printf("  %5lld %6.2f %10.1f %11.1f %8.1f/%-8.1f %7.2f/%-8.2f %10.2f %10.2f\n", static_cast<long long>(n),
                    s.throughput_rps, s.tokens_per_s, s.per_user_tokens_per_s, 1e3 * s.ttft.p50, 1e3 * s.ttft.p99,
                    1e3 * s.itl.p50, 1e3 * s.itl.p99, 1e3 * s.tpot.p50, s.e2e.p50);
      }
    }
    if (json) std::cout << nlohmann::json{{"sweep", runs}, {"uncertainty", band.toJson()}}.dump(2) << "\n";
    else std::printf("%s\n", band.line().c_str());
    if (!plot_path.empty()) {
      Status st = plotServeSweep(points, fmt::format("{} on {} GPUs, {}/{} tokens", model->name, ic.gpus,
                                                     ic.input_len, ic.output_len), plot_path);
      if (!st.isOk()) std::fprintf(stderr, "chorus-sim: plot skipped: %s\n", st.message().c_str());
      else if (!json) std::fprintf(stderr, "plot: %s\n", plot_path.c_str());
    }
    return 0;
  }
  auto r = simulateInference(*model, ic, net);
  if (!r.isOk()) return fail(r.status());
  if (!trace_path.empty()) {
    std::ofstream f(trace_path);
    if (!f) return fail(systemError("--trace: cannot open '{}' for writing", trace_path));
    Status st = writeServeTrace(*r, f);
    if (!st.isOk()) return fail(st);
    if (!json)
      std::fprintf(stderr, "trace: %s (%zu steps, %zu requests)\n", trace_path.c_str(), r->steps.size(), r->requests.size());
  }
  if (json) {
    nlohmann::json j = toJson(*r);
    j["uncertainty"] = band.toJson();
    std::cout << j.dump(2) << "\n";
  } else {
    const std::string load = ic.max_throughput ? "offline (all at once)"
                             : ic.concurrency > 0 ? fmt::format("{} users, closed loop", ic.concurrency)
                                                  : fmt::format("{:.1f} req/s", ic.rate);
    if (r->ep > 1)
      std::printf("expert parallel: replicas of %d GPUs, %d attention groups of tp %d; all-to-all latency %.1f us\n",
                  r->ep, r->ep / r->tp, r->tp, 1e6 * r->a2a_latency_s);
    std::printf("%s on %lld GPUs of %s: %d replicas of tp %d; %s, %lld in / %lld out tokens; prefill %.1f ms%s per "
                "request, decode step %.1f ms%s (batch 1), KV %.1f MB per request, weights %.1f GB per GPU\n",
                model->name.c_str(), static_cast<long long>(ic.gpus), cluster->name.c_str(), r->replicas, r->tp,
                load.c_str(), static_cast<long long>(ic.input_len), static_cast<long long>(ic.output_len),
                1e3 * r->prefill_s_per_request, band.suffix().c_str(), 1e3 * r->decode_step_s, band.suffix().c_str(),
                r->kv_bytes_per_request / 1e6,
                r->weight_bytes_per_gpu / 1e9);
    std::printf("  engine costs: sampling %.3f ms per token (batch 1); host %.2f ms per step, %.2f ms per request%s%s\n",
                1e3 * r->sample_s, 1e3 * ic.step_overhead_s, 1e3 * ic.request_overhead_s,
                ic.kv_paged ? fmt::format("; paged decode attention +{:.0f} %", 100 * ic.paged_overhead).c_str() : "",
                ic.prefix_hit > 0 ? fmt::format("; prefix cache hit {:.0f} % of each prompt", 100 * ic.prefix_hit).c_str() : "");
    if (ic.spec_tokens > 0)
      std::printf("  speculative decoding: %d drafted tokens per step, acceptance %.2f: %.2f tokens per step expected, "
                  "drafting %.1f ms per step (batch 1)\n",
                  ic.spec_tokens, ic.spec_acceptance, r->expected_tokens_per_step, 1e3 * r->draft_step_s);
    printServe(r->aggregated);
    printServeDetail(r->aggregated, ic.requests);
    if (!r->splits.empty()) {
      std::printf("  disaggregated splits, best first (goodput, then TTFT p50):\n");
      for (const ServeStats& sp : r->splits) printServe(sp);
    }
    std::printf("  best under SLOs (TTFT %.2f s, TPOT %.0f ms): %s\n", ic.ttft_slo_s, 1e3 * ic.tpot_slo_s, r->best.c_str());
    std::printf("  %s\n", band.line().c_str());
  }
  return 0;
}

}  // namespace chorus::sim
