#include "sim/sweep.hpp"

#include <cmath>
#include <memory>

#include "common/size.hpp"
#include "sim/placement.hpp"
#include "sim/report.hpp"
#include "sim/topology.hpp"

namespace chorus::sim {
namespace {

constexpr const char* kClusterKeys[] = {"nic_gbit_s", "oversubscription", "nvlink_domain", "nvlink_gbyte_s",
                                        "hbm_gib",    "leaf_nodes",       "gpu"};
constexpr const char* kLayoutKeys[] = {"tp", "pp", "dp", "cp", "ep", "micro_batch"};
// Serving keys (a serve job's tp and ep are these, not the training layout's).
constexpr const char* kServeKeys[] = {"rate",  "concurrency", "gpus",  "decode_tp", "prefill_replicas", "pd",
                                      "max_batch", "input",   "output", "prefix_hit"};

Result<double> number(std::string_view key, std::string_view v) {
  const std::string s(v);
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(x) || x <= 0)
    return invalidArgument("--vary {}: '{}' is not a positive number", key, v);
  return x;
}

Result<int64_t> integer(std::string_view key, std::string_view v) {
  CHORUS_ASSIGN_OR_RETURN(double x, number(key, v));
  if (x != std::floor(x) || x > 1e9) return invalidArgument("--vary {}: '{}' is not a positive integer", key, v);
  return static_cast<int64_t>(x);
}

}  // namespace

std::string sweepKeysText() {
  std::string s;
  for (const char* k : kClusterKeys) s += fmt::format("{}{}", s.empty() ? "" : ", ", k);
  for (const char* k : kLayoutKeys) s += fmt::format(", {}", k);
  for (const char* k : kServeKeys) s += fmt::format(", {}", k);
  return s;
}

bool isServeKey(std::string_view key) {
  for (const char* k : kServeKeys)
    if (key == k) return true;
  return false;
}

bool isLayoutKey(std::string_view key) {
  for (const char* k : kLayoutKeys)
    if (key == k) return true;
  return false;
}

Result<SweepAxis> parseSweepAxis(std::string_view text) {
  const size_t eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0 || eq + 1 == text.size())
    return invalidArgument("--vary '{}' is not KEY=V1,V2,... (keys: {})", text, sweepKeysText());
  SweepAxis a;
  a.key = std::string(text.substr(0, eq));
  bool known = isLayoutKey(a.key) || isServeKey(a.key);
  for (const char* k : kClusterKeys) known = known || a.key == k;
  if (!known) return invalidArgument("--vary '{}': unknown key '{}' (keys: {})", text, a.key, sweepKeysText());
  std::string_view rest = text.substr(eq + 1);
  if (const size_t colon = rest.find(':'); colon != std::string_view::npos && a.key != "gpu" && a.key != "pd") {
    // LO:HI doubling, as --bytes sweeps.
    CHORUS_ASSIGN_OR_RETURN(double lo, number(a.key, rest.substr(0, colon)));
    CHORUS_ASSIGN_OR_RETURN(double hi, number(a.key, rest.substr(colon + 1)));
    if (hi < lo) return invalidArgument("--vary '{}': a range LO:HI needs LO <= HI", text);
    for (double x = lo; x <= hi * (1 + 1e-12); x *= 2) a.values.push_back(fmt::format("{:g}", x));
    return a;
  }
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view v = rest.substr(0, comma);
    if (v.empty()) return invalidArgument("--vary '{}': an empty value", text);
    a.values.emplace_back(v);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  if (a.values.empty()) return invalidArgument("--vary '{}': no values", text);
  return a;
}

Status applyClusterValue(ClusterSpec* c, std::string_view key, std::string_view value) {
  if (key == "gpu") {
    // "GPU type": the gpu block of another cluster file (its name, peaks, HBM, ...).
    CHORUS_ASSIGN_OR_RETURN(ClusterSpec other, loadCluster(std::string(value)));
    c->gpu = other.gpu;
    c->name += fmt::format(" with {}", other.gpu.name);
    return {};
  }
  CHORUS_ASSIGN_OR_RETURN(double x, number(key, value));
  if (key == "nic_gbit_s") {
    c->network.nic_bw = BytesPerSecond(x * 1e9 / 8);
  } else if (key == "oversubscription") {
    if (x < 1) return invalidArgument("--vary oversubscription: {} is below 1", value);
    c->network.oversubscription = x;
  } else if (key == "nvlink_gbyte_s") {
    c->node.nvlink_bw = BytesPerSecond(x * 1e9);
  } else if (key == "hbm_gib") {
    c->gpu.hbm = Bytes(x * 1073741824.0);
  } else if (key == "leaf_nodes") {
    CHORUS_ASSIGN_OR_RETURN(int64_t n, integer(key, value));
    c->network.leaf_nodes = static_cast<int>(n);
  } else if (key == "nvlink_domain") {
    // A larger NVLink domain of the same GPUs: the NICs per GPU, the GPUs
    // under one leaf and the cluster's GPUs stay as they were.
    CHORUS_ASSIGN_OR_RETURN(int64_t d, integer(key, value));
    const int64_t gpus = c->gpus(), old = c->node.gpus;
    const double nics_per_gpu = static_cast<double>(c->network.nics_per_node) / static_cast<double>(old);
    const int64_t leaf_gpus = int64_t{c->network.leaf_nodes} * old, group_gpus = int64_t{c->network.group_nodes} * old;
    if (gpus % d != 0) return invalidArgument("--vary nvlink_domain={}: the cluster's {} GPUs are not a multiple", d, gpus);
    c->node.gpus = static_cast<int>(d);
    c->nodes = static_cast<int>(gpus / d);
    c->network.nics_per_node = static_cast<int>(std::max(1.0, std::round(nics_per_gpu * static_cast<double>(d))));
    c->network.leaf_nodes = static_cast<int>(std::max<int64_t>(1, leaf_gpus / d));
    c->network.group_nodes = static_cast<int>(std::max<int64_t>(1, group_gpus / d));
    if (c->network.topology == TopologyKind::Torus2d || c->network.topology == TopologyKind::Torus3d)
      return invalidArgument("--vary nvlink_domain: not on a torus (its dims fix the node count)");
  } else {
    return invalidArgument("--vary: '{}' is not a cluster key ({})", key, sweepKeysText());
  }
  return {};
}

Status applyLayoutValue(TrainConfig* t, std::string_view key, std::string_view value) {
  CHORUS_ASSIGN_OR_RETURN(int64_t x, integer(key, value));
  if (key == "tp") t->tp = static_cast<int>(x);
  else if (key == "pp") t->pp = static_cast<int>(x);
  else if (key == "dp") t->dp = static_cast<int>(x);
  else if (key == "cp") t->cp = static_cast<int>(x);
  else if (key == "ep") t->ep = static_cast<int>(x);
  else if (key == "micro_batch") t->micro_batch = x;
  else return invalidArgument("--vary: '{}' is not a layout key", key);
  return {};
}

Status applyServeValue(InferConfig* ic, std::string_view key, std::string_view value, int* pd_decode) {
  *pd_decode = 0;
  if (key == "pd") {
    const size_t colon = value.find(':');
    if (colon == std::string_view::npos) return invalidArgument("--vary pd: '{}' is not P:D (prefill:decode replicas)", value);
    CHORUS_ASSIGN_OR_RETURN(int64_t pr, integer(key, value.substr(0, colon)));
    CHORUS_ASSIGN_OR_RETURN(int64_t d, integer(key, value.substr(colon + 1)));
    if (pr > (1 << 24) || d > (1 << 24)) return invalidArgument("--vary pd: '{}' is too large", value);
    ic->prefill_replicas = static_cast<int>(pr), *pd_decode = static_cast<int>(d);
    return {};
  }
  if (key == "rate" || key == "prefix_hit") {
    const std::string s(value);
    char* end = nullptr;
    const double x = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(x) || x < 0 || (key == "rate" && x == 0) ||
        (key == "prefix_hit" && x > 1))
      return invalidArgument("--vary {}: '{}' is not {}", key, value,
                             key == "rate" ? "a positive rate (requests/s)" : "a fraction in [0, 1]");
    if (key == "rate") ic->rate = x, ic->concurrency = 0;
    else ic->prefix_hit = x;
    return {};
  }
  CHORUS_ASSIGN_OR_RETURN(int64_t x, integer(key, value));
  if (key == "concurrency") ic->concurrency = x;
  else if (key == "gpus") ic->gpus = x;
  else if (key == "tp") ic->tp = static_cast<int>(x);
  else if (key == "ep") ic->ep = static_cast<int>(x);
  else if (key == "decode_tp") ic->decode_tp = static_cast<int>(x);
  else if (key == "prefill_replicas") ic->prefill_replicas = static_cast<int>(x);
  else if (key == "max_batch") ic->max_batch = x;
  else if (key == "input") ic->input_len = x;
  else if (key == "output") ic->output_len = x;
  else return invalidArgument("--vary: '{}' is not a serving key", key);
  return {};
}

namespace {

// A serving point: the aggregated service, or the split the axes name.
void priceServe(const ClusterSpec& c, const SweepJob& job, const InferConfig& ic, int pd_decode,
                const plan::Registry& reg, SweepPoint* p) {
  auto err = [&](const Status& s) { p->ok = false, p->error = s.message(); };
  auto topo = Topology::build(c);
  if (!topo.isOk()) return err(topo.status());
  NetworkModel net(c, *topo, reg, job.mode);
  net.setLibrary(job.library);
  InferConfig cfg = ic;
  const bool split = cfg.prefill_replicas > 0;
  cfg.aggregated = !split, cfg.disaggregated = split;
  if (split && cfg.concurrency > 0)
    return err(invalidArgument("a disaggregated split (pd / prefill_replicas) needs an open-loop rate or offline load, "
                               "not --concurrency"));
  auto r = simulateInference(*job.model, cfg, net);
  if (!r.isOk()) return err(r.status());
  const ServeStats* s = &r->aggregated;
  if (split) {
    if (r->splits.empty())
      return err(invalidArgument("{} prefill replicas leave no whole decode replica on {} GPUs", cfg.prefill_replicas, cfg.gpus));
    s = &r->splits.front();
    if (pd_decode > 0 && s->decode_replicas != pd_decode)
      return err(invalidArgument("pd {}:{} does not fill {} GPUs (replicas of tp {}, decode tp {}: {}:{} does)",
                                 cfg.prefill_replicas, pd_decode, cfg.gpus, r->tp, s->decode_tp, s->prefill_replicas,
                                 s->decode_replicas));
  }
  p->ok = true;
  p->algo = s->label();
  p->time_s = s->ttft_p50_s, p->ttft_p90_s = s->ttft_p90_s;
  p->tpot_p50_s = s->tpot_p50_s, p->tpot_p90_s = s->tpot_p90_s;
  p->rate = s->tokens_per_s;
  p->tokens_per_s_per_gpu = s->tokens_per_s / static_cast<double>(cfg.gpus);
  p->throughput_rps = s->throughput_rps, p->goodput_rps = s->goodput_rps, p->slo_attainment = s->slo_attainment;
  p->capacity_rps = s->capacity_rps, p->overloaded = s->overloaded;
  // What binds: the queue (offered above capacity, or still growing), else
  // the SLO the most requests miss at p90, else nothing (the SLOs hold).
  if (s->overloaded) {
    p->binds = s->capacity_rps > 0 ? fmt::format("overloaded (capacity {:.3g} req/s)", s->capacity_rps)
                                   : std::string("overloaded (queue growing)");
  } else if (s->ttft_p90_s > cfg.ttft_slo_s && s->ttft_p90_s / cfg.ttft_slo_s >= s->tpot_p90_s / cfg.tpot_slo_s) {
    p->binds = fmt::format("TTFT SLO (p90 {:.3g} s > {:.3g})", s->ttft_p90_s, cfg.ttft_slo_s);
  } else if (s->tpot_p90_s > cfg.tpot_slo_s) {
    p->binds = fmt::format("TPOT SLO (p90 {:.3g} ms > {:.3g})", 1e3 * s->tpot_p90_s, 1e3 * cfg.tpot_slo_s);
  } else {
    p->binds = fmt::format("SLOs met ({:.0f} % of requests)", 100 * s->slo_attainment);
  }
}

// One point: the cluster and the job as the axes set them.
void pricePoint(const ClusterSpec& c, const SweepJob& job, const TrainConfig& tc, const plan::Registry& reg,
                SweepPoint* p) {
  auto err = [&](const Status& s) { p->ok = false, p->error = s.message(); };
  if (job.kind == SweepJob::Kind::Collective) {
    auto r = simulateCollective(c, job.gpus, job.collective, job.bytes, job.algo, reg, job.mode, job.library);
    if (!r.isOk()) return err(r.status());
    p->ok = true, p->time_s = r->time_us * 1e-6, p->rate = r->busbw_gbps, p->binds = r->bottleneck, p->algo = r->algo;
    return;
  }
  // Training: the cluster as the layout's placement sees it (as `train` does).
  ClusterSpec placed = c;
  if (job.kind == SweepJob::Kind::Train) {
    auto pc = placedCluster(c, alignedDomainUse(c, tc), tc.gpus);
    if (!pc.isOk()) return err(pc.status());
    placed = *pc;
  }
  auto topo = Topology::build(placed);
  if (!topo.isOk()) return err(topo.status());
  NetworkModel net(placed, *topo, reg, job.mode);
  net.setLibrary(job.library);
  const TrainReport* best = nullptr;
  Result<TrainReport> one = invalidArgument("unset");
  Result<SearchResult> found = invalidArgument("unset");
  if (job.kind == SweepJob::Kind::Train) {
    one = simulateTraining(*job.model, tc, net);
    if (!one.isOk()) return err(one.status());
    best = &*one;
  } else {
    found = searchLayouts(*job.model, job.search, net);
    if (!found.isOk()) return err(found.status());
    if (found->top.empty())
      return err(invalidArgument("no layout fits ({} enumerated{}{})", found->candidates,
                                 found->first_error.empty() ? "" : "; first: ", found->first_error));
    best = &found->top.front();
    p->algo = layoutName(best->config);
  }
  p->ok = true;
  p->time_s = best->iteration_s;
  p->rate = best->tokens_per_s;
  p->mfu = best->mfu;
  p->memory_gib = best->memory_gib_per_gpu;
  p->binds = fmt::format("{} ({})", best->bottleneck, best->bottleneck_link);
  p->bound = best->bounds.binding;
}

}  // namespace

Result<std::vector<SweepPoint>> runSweep(const ClusterSpec& base, const std::vector<SweepAxis>& axes,
                                         const SweepJob& job, const plan::Registry& reg) {
  const bool serve = job.kind == SweepJob::Kind::Serve;
  for (const SweepAxis& a : axes) {
    const bool serve_key = isServeKey(a.key) || (serve && (a.key == "tp" || a.key == "ep"));
    if (serve && isLayoutKey(a.key) && !serve_key)
      return invalidArgument("--vary {}: a serve job varies rate, concurrency, gpus, tp, decode_tp, ep, "
                             "prefill_replicas, pd, max_batch, input, output, prefix_hit and cluster keys", a.key);
    if (!serve && isServeKey(a.key))
      return invalidArgument("--vary {}: a serving key needs --job serve (with --model)", a.key);
    if (!serve && isLayoutKey(a.key) && job.kind != SweepJob::Kind::Train)
      return invalidArgument("--vary {}: layout keys need a training job (--model with --tp/--pp/...; a search "
                             "picks its own layouts)", a.key);
  }
  size_t total = 1;
  for (const SweepAxis& a : axes) total *= a.values.size();
  if (total > 100000) return invalidArgument("--vary: {} points (at most 100000)", total);
  std::vector<SweepPoint> out;
  std::vector<size_t> idx(axes.size(), 0);
  for (size_t n = 0; n < total; ++n) {
    SweepPoint p;
    ClusterSpec c = base;
    TrainConfig tc = job.train;
    InferConfig ic = job.infer;
    int pd_decode = 0;
    Status st;
    for (size_t i = 0; i < axes.size() && st.isOk(); ++i) {
      const std::string& v = axes[i].values[idx[i]];
      const std::string& k = axes[i].key;
      p.values.emplace_back(k, v);
      int d = 0;
      if (serve && (isServeKey(k) || k == "tp" || k == "ep")) st = applyServeValue(&ic, k, v, &d), pd_decode = d ? d : pd_decode;
      else st = isLayoutKey(k) ? applyLayoutValue(&tc, k, v) : applyClusterValue(&c, k, v);
    }
    if (!st.isOk()) return st;  // a bad value is the user's error, not a point's
    if (serve) {
      priceServe(c, job, ic, pd_decode, reg, &p);
      out.push_back(std::move(p));
      for (size_t i = axes.size(); i-- > 0;) {
        if (++idx[i] < axes[i].values.size()) break;
        idx[i] = 0;
      }
      continue;
    }
    // dp 0 (no --dp): what is left of the GPUs after tp, pp and cp.
    if (job.kind == SweepJob::Kind::Train && job.train.dp == 0) {
      const int64_t rest = int64_t{tc.tp} * tc.pp * tc.cp;
      tc.dp = rest > 0 && tc.gpus % rest == 0 ? static_cast<int>(tc.gpus / rest) : 0;
    }
    pricePoint(c, job, tc, reg, &p);
    out.push_back(std::move(p));
    for (size_t i = axes.size(); i-- > 0;) {  // the last axis varies fastest
      if (++idx[i] < axes[i].values.size()) break;
      idx[i] = 0;
    }
  }
  return out;
}

nlohmann::json toJson(const SweepPoint& p) {
  nlohmann::json v = nlohmann::json::object();
  for (const auto& [k, x] : p.values) v[k] = x;
  nlohmann::json j = {{"values", v}, {"ok", p.ok}};
  if (!p.ok) {
    j["error"] = p.error;
    return j;
  }
  j["time_s"] = p.time_s;
  j["binds"] = p.binds;
  if (p.tokens_per_s_per_gpu > 0 || p.throughput_rps > 0) {  // serve
    j["mode"] = p.algo;
    j["ttft_p50_s"] = p.time_s, j["ttft_p90_s"] = p.ttft_p90_s;
    j["tpot_p50_s"] = p.tpot_p50_s, j["tpot_p90_s"] = p.tpot_p90_s;
    j["output_tokens_per_s"] = p.rate, j["output_tokens_per_s_per_gpu"] = p.tokens_per_s_per_gpu;
    j["throughput_rps"] = p.throughput_rps, j["goodput_rps"] = p.goodput_rps;
    j["slo_attainment"] = p.slo_attainment, j["overloaded"] = p.overloaded;
    if (p.capacity_rps > 0) j["capacity_rps"] = p.capacity_rps;
    return j;
  }
  if (!p.algo.empty()) j["algo"] = p.algo;
  if (!p.bound.empty()) {
    j["tokens_per_s"] = p.rate;
    j["mfu"] = p.mfu;
    j["memory_gib_per_gpu"] = p.memory_gib;
    j["binding_bound"] = p.bound;
  } else {
    j["busbw_gbps"] = p.rate;
  }
  return j;
}

std::string formatSweep(const std::vector<SweepAxis>& axes, const std::vector<SweepPoint>& pts, SweepJob::Kind kind) {
  std::string s = " ";
  for (const SweepAxis& a : axes) s += fmt::format(" {:>16}", a.key);
  const bool coll = kind == SweepJob::Kind::Collective;
  if (kind == SweepJob::Kind::Serve) {
    s += fmt::format(" {:>10} {:>10} {:>10} {:>12} {:>9} {:>9}  {:<26} {}\n", "TTFT p50", "TTFT p90", "TPOT p50",
                     "tok/s/GPU", "req/s", "goodput", "mode", "binds");
    for (const SweepPoint& p : pts) {
      s += " ";
      for (const auto& [k, v] : p.values) s += fmt::format(" {:>16}", v.size() > 16 ? v.substr(v.size() - 16) : v);
      if (!p.ok) {
        s += fmt::format("  -- {}\n", p.error);
        continue;
      }
      s += fmt::format(" {:9.3f}s {:9.3f}s {:8.1f}ms {:12.1f} {:9.3f} {:9.3f}  {:<26} {}\n", p.time_s, p.ttft_p90_s,
                       1e3 * p.tpot_p50_s, p.tokens_per_s_per_gpu, p.throughput_rps, p.goodput_rps, p.algo, p.binds);
    }
    return s;
  }
  s += coll ? fmt::format(" {:>12} {:>10}  {:<22} {}\n", "time (us)", "busbw", "algo", "binds")
            : fmt::format(" {:>10} {:>12} {:>6} {:>7}  {:<44} {}{}\n", "time (s)", "tokens/s", "MFU", "GiB",
                          "binds (step bottleneck, its link)", "binding bound",
                          kind == SweepJob::Kind::Search ? "  best layout" : "");
  for (const SweepPoint& p : pts) {
    s += " ";
    for (const auto& [k, v] : p.values) s += fmt::format(" {:>16}", v.size() > 16 ? v.substr(v.size() - 16) : v);
    if (!p.ok) {
      s += fmt::format("  -- {}\n", p.error);
      continue;
    }
    s += coll ? fmt::format(" {:12.1f} {:10.2f}  {:<22} {}\n", p.time_s * 1e6, p.rate, p.algo, p.binds)
              : fmt::format(" {:10.3f} {:12.0f} {:5.1f}% {:7.1f}  {:<44} {}{}\n", p.time_s, p.rate, 100 * p.mfu,
                            p.memory_gib, p.binds, p.bound, p.algo.empty() ? "" : "  " + p.algo);
  }
  return s;
}

}  // namespace chorus::sim
