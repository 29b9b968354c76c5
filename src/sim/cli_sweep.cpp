// `chorus-sim sweep` (src/sim/sweep.hpp): the what-if grid's command.
#include <cstdio>
#include <fstream>
#include <optional>
#include <iostream>

#include "common/size.hpp"
#include "sim/cli.hpp"
#include "sim/cli_args.hpp"
#include "sim/nccl_topo.hpp"
#include "sim/report.hpp"
#include "sim/sweep.hpp"
#include "sim/uncertainty.hpp"

namespace chorus::sim {

int runSweepCommand(CliOptions o) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "chorus-sim: %s\n", s.message().c_str());
    return 1;
  };
  std::vector<SweepAxis> axes;
  for (const std::string& v : o.vary) {
    auto a = parseSweepAxis(v);
    if (!a.isOk()) return fail(a.status());
    axes.push_back(*a);
  }
  if (axes.empty()) return fail(invalidArgument("sweep: give at least one --vary KEY=V1,V2,... (keys: {})", sweepKeysText()));
  SweepJob job;
  // The job: a collective without --model, a training layout with --model
  // (a layout search with --job search).
  const std::string kind = o.sweep_job == "auto" ? (o.model_path.empty() ? "collective" : "train") : o.sweep_job;
  if (kind == "collective") job.kind = SweepJob::Kind::Collective;
  else if (kind == "train") job.kind = SweepJob::Kind::Train;
  else if (kind == "search") job.kind = SweepJob::Kind::Search;
  else if (kind == "serve") job.kind = SweepJob::Kind::Serve;
  else return fail(invalidArgument("--job '{}' is not one of collective, train, search, serve", o.sweep_job));
  // --tp 0 (not given): a training job's 1, a serving job's smallest replica that fits.
  const int serve_tp = o.sweep_tp;
  o.tc.tp = o.sweep_tp > 0 ? o.sweep_tp : 1;
  if (job.kind != SweepJob::Kind::Collective && o.model_path.empty())
    return fail(invalidArgument("--job {} needs --model", kind));
  auto mode = parseNetMode(o.network);
  if (!mode.isOk()) return fail(mode.status());
  auto lib = parseLibrary(o.library);
  if (!lib.isOk()) return fail(lib.status());
  job.mode = *mode, job.library = *lib;
  auto cluster = loadCluster(o.cluster_path);
  if (!cluster.isOk()) return fail(cluster.status());
  if (!o.node_topo_path.empty()) {  // the base's node from an NCCL topology file; the axes vary that base
    auto t = loadNodeTopo(o.node_topo_path);
    if (!t.isOk()) return fail(t.status());
    std::vector<std::string> report;
    *cluster = applyNodeTopo(*cluster, *t, o.node_topo_path, &report);
    for (const std::string& line : report) std::fprintf(stderr, "chorus-sim: --node-topo: %s\n", line.c_str());
  }
  auto reg = plan::Registry::withPlans(o.plan_paths);
  if (!reg.isOk()) return fail(reg.status());
  std::optional<ModelSpec> model;
  if (job.kind == SweepJob::Kind::Collective) {
    if (o.gpus < 1) return fail(invalidArgument("--gpus {} must be at least 1", o.gpus));
    auto b = chorus::parseSize(o.bytes_text, "--bytes");
    if (!b.isOk()) return fail(b.status());
    job.collective = o.collective, job.bytes = static_cast<double>(*b), job.gpus = o.gpus, job.algo = o.algo;
  } else {
    auto m = loadModel(o.model_path);
    if (!m.isOk()) return fail(m.status());
    model = std::move(*m);
    job.model = &*model;
    auto rc = parseRecompute(o.recompute);
    if (!rc.isOk()) return fail(rc.status());
    o.tc.recompute = *rc;
    auto mb = parseMicroBatch(o.micro);
    if (!mb.isOk()) return fail(mb.status());
    o.tc.micro_batch = *mb;
    o.tc.gpus = o.gpus;
    job.train = o.tc;
    job.search.gpus = o.gpus;
    job.search.global_batch = o.tc.global_batch;
    job.search.seq = o.tc.seq;
    job.search.top = 1;
    job.search.fp8 = o.tc.fp8;
    if (job.kind == SweepJob::Kind::Serve) {
      job.infer = o.ic;
      job.infer.gpus = o.gpus, job.infer.tp = serve_tp, job.infer.ep = o.tc.ep > 1 ? o.tc.ep : 0;
      job.infer.fp8 = o.tc.fp8;
      Status st = checkInferConfig(job.infer);
      if (!st.isOk()) return fail(st);
    }
  }
  auto pts = runSweep(*cluster, axes, job, *reg);
  if (!pts.isOk()) return fail(pts.status());
  nlohmann::json rows = nlohmann::json::array();
  for (const SweepPoint& p : *pts) rows.push_back(toJson(p));
  nlohmann::json doc = {{"cluster", cluster->name}, {"job", kind}, {"network", o.network}, {"library", o.library},
                        {"points", rows}};
  if (job.kind == SweepJob::Kind::Collective)
    doc["collective"] = {{"collective", o.collective}, {"bytes", job.bytes}, {"gpus", o.gpus}, {"algo", o.algo}};
  else
    doc["model"] = model->name, doc["gpus"] = o.gpus;
  if (job.kind == SweepJob::Kind::Serve) {
    const InferConfig& ic = job.infer;
    doc["serve"] = {{"input_len", ic.input_len}, {"output_len", ic.output_len}, {"requests", ic.requests},
                    {"load", ic.max_throughput ? "offline" : ic.concurrency > 0 ? "closed_loop" : "open_loop"},
                    {"rate", ic.rate}, {"concurrency", ic.concurrency}, {"ttft_slo_s", ic.ttft_slo_s},
                    {"tpot_slo_s", ic.tpot_slo_s}, {"tp", ic.tp}};
  }
  // The band of every time of the sweep: its points are of one kind on one cluster.
  const PredictionKind pk = job.kind == SweepJob::Kind::Collective ? PredictionKind::Collective
                            : job.kind == SweepJob::Kind::Serve    ? PredictionKind::Inference
                            : model->moe.experts > 0               ? PredictionKind::MoeTrain
                                                                   : PredictionKind::DenseTrain;
  const Band band = uncertaintyBand(pk, cluster->gpu.name);
  doc["uncertainty"] = band.toJson();
  nlohmann::json ax = nlohmann::json::array();
  for (const SweepAxis& a : axes) ax.push_back({{"key", a.key}, {"values", a.values}});
  doc["axes"] = ax;
  if (!o.sweep_out.empty()) {
    std::ofstream f(o.sweep_out);
    if (!f || !(f << doc.dump(2) << "\n")) return fail(systemError("--out: cannot write '{}'", o.sweep_out));
  }
  if (o.json) {
    std::cout << doc.dump(2) << "\n";
  } else {
    if (job.kind == SweepJob::Kind::Serve) {
      const InferConfig& ic = job.infer;
      bool load_axis = false;  // a rate or concurrency axis sets the load per point
      for (const SweepAxis& a : axes) load_axis = load_axis || a.key == "rate" || a.key == "concurrency";
      std::printf("# %s, %lld in / %lld out tokens, %s; SLOs TTFT %.3g s, TPOT %.3g ms\n", model->name.c_str(),
                  static_cast<long long>(ic.input_len), static_cast<long long>(ic.output_len),
                  load_axis ? "load per point" : ic.max_throughput ? "offline"
                  : ic.concurrency > 0 ? fmt::format("{} users", ic.concurrency).c_str()
                                       : fmt::format("{:g} req/s", ic.rate).c_str(),
                  ic.ttft_slo_s, 1e3 * ic.tpot_slo_s);
    }
    std::printf("# %s on %s, %zu points (%s, library %s)%s\n",
                job.kind == SweepJob::Kind::Collective
                    ? fmt::format("{} of {} on {} GPUs", o.collective, o.bytes_text, o.gpus).c_str()
                    : fmt::format("{} {} on {} GPUs", model->name, kind, o.gpus).c_str(),
                cluster->name.c_str(), pts->size(), o.network.c_str(), o.library.c_str(),
                o.sweep_out.empty() ? "" : fmt::format("; JSON: {} (plot: tools/sweep_plot.py {} out.png)",
                                                       o.sweep_out, o.sweep_out).c_str());
    std::fputs(formatSweep(axes, *pts, job.kind).c_str(), stdout);
    std::printf("# %s\n", band.line().c_str());
  }
  return 0;
}

}  // namespace chorus::sim
