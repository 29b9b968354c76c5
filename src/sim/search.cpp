#include "sim/search.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>

#include "sim/compute.hpp"
#include "sim/placement.hpp"
#include "sim/report.hpp"

namespace chorus::sim {
namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      d.push_back(i);
      if (i != n / i) d.push_back(n / i);
    }
  std::sort(d.begin(), d.end());
  return d;
}

// The network models of the placements the layouts ask for: `base` for the
// cluster as given, one more per other GPUs-per-domain count.
class PlacedNets {
 public:
  PlacedNets(NetworkModel& base, int64_t fixed) : base_(base), fixed_(fixed) {}
  Result<NetworkModel*> forLayout(const TrainConfig& k) {
    const ClusterSpec& c = base_.cluster();
    const int64_t use = fixed_ > 0 ? fixed_ : alignedDomainUse(c, k);
    if (use == c.node.gpus) return &base_;
    std::unique_ptr<Placed>& p = nets_[use];
    if (!p) {
      CHORUS_ASSIGN_OR_RETURN(ClusterSpec pc, placedCluster(c, use, k.gpus));
      p = std::make_unique<Placed>();
      p->c = std::move(pc);
      CHORUS_ASSIGN_OR_RETURN(Topology t, Topology::build(p->c));
      p->t.emplace(std::move(t));
      p->net.emplace(p->c, *p->t, base_.registry(), base_.mode());
      p->net->setLibrary(base_.library());
    }
    return &*p->net;
  }

 private:
  struct Placed {
    ClusterSpec c;
    std::optional<Topology> t;
    std::optional<NetworkModel> net;
  };
  NetworkModel& base_;
  int64_t fixed_;
  std::map<int64_t, std::unique_ptr<Placed>> nets_;
};

}  // namespace

Result<std::vector<std::string>> parsePpSchedules(std::string_view text) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= text.size()) {
    const size_t j = std::min(text.find(',', i), text.size());
    const std::string w(text.substr(i, j - i));
    i = j + 1;
    if (w.empty()) continue;
    if (w != "1f1b" && w != "zb-h1" && w != "dualpipe")
      return invalidArgument("--pp-schedules: '{}' is not one of 1f1b, zb-h1, dualpipe", w);
    if (std::find(out.begin(), out.end(), w) != out.end())
      return invalidArgument("--pp-schedules: '{}' given twice", w);
    out.push_back(w);
  }
  if (out.empty()) return invalidArgument("--pp-schedules '{}': name at least one of 1f1b, zb-h1, dualpipe", text);
  return out;
}

std::vector<TrainConfig> enumerateLayouts(const ModelSpec& m, const ClusterSpec& c, const SearchConfig& sc) {
  std::vector<TrainConfig> out;
  const int64_t n = sc.gpus;
  if (n < 1) return out;
  // tp stays inside the scale-up domain (tensor parallelism's per-layer
  // collectives need NVLink bandwidth) and divides the heads.
  for (int64_t tp = 1; tp <= std::min<int64_t>(c.node.gpus, m.heads); tp *= 2) {
    if (n % tp != 0 || m.heads % tp != 0) continue;
    for (int64_t cp = 1; cp <= 32; cp *= 2) {
      if (n % (tp * cp) != 0 || sc.seq % (tp * cp) != 0) continue;
      for (int64_t pp : divisors(n / (tp * cp))) {
        if (pp > m.layers) break;
        const int64_t dp = n / (tp * cp * pp);
        if (sc.global_batch % dp != 0) continue;
        // (ep, etp): classic (etp 0: ep inside dp x cp, experts split over
        // tp) and, with tp > 1, folded with etp 1 (MoE parallel folding: ep
        // across tp x cp x dp) where that is a different layout.
        std::vector<std::pair<int64_t, int>> eps{{1, 0}};
        if (m.moe.experts > 0) {
          for (int64_t e : divisors(dp * cp))
            if (e > 1 && m.moe.experts % e == 0) eps.push_back({e, 0});
          if (tp > 1)
            for (int64_t e : divisors(tp * dp * cp))
              if (e > 1 && m.moe.experts % e == 0) eps.push_back({e, 1});
        }
        for (auto [ep, etp] : eps)
          for (int64_t vpp : {1, 2, 3, 4}) {
            if (vpp > 1 && (pp == 1 || m.layers < pp * vpp || m.layers % (pp * vpp) != 0)) continue;
            for (int64_t b = 1; b <= sc.max_micro_batch; b *= 2) {
              if (sc.global_batch % (dp * b) != 0) break;
              const int64_t mb = sc.global_batch / (dp * b);
              if (vpp > 1 && mb % pp != 0) continue;
              for (int zero = 0; zero <= 3; ++zero) {
                if (dp * cp == 1 && zero > 0) break;  // nothing to shard
                for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
                  TrainConfig k;
                  k.gpus = n;
                  k.tp = static_cast<int>(tp), k.pp = static_cast<int>(pp), k.dp = static_cast<int>(dp);
                  k.cp = static_cast<int>(cp), k.ep = static_cast<int>(ep), k.vpp = static_cast<int>(vpp);
                  k.etp = etp;
                  k.global_batch = sc.global_batch;
                  k.micro_batch = b;
                  k.seq = sc.seq;
                  k.recompute = r;
                  k.zero = zero;
                  k.sequence_parallel = true;
                  k.flash_attention = sc.flash_attention;
                  k.fp8 = sc.fp8;
                  k.attention_kernel = sc.attention_kernel;
                  if (m.moe.experts > 0) {
                    k.moe_dispatch = sc.moe_dispatch;
                    k.fp8_dispatch = sc.fp8_dispatch;
                    k.moe_imbalance = sc.moe_imbalance;
                    k.moe_a2a_overlap = sc.moe_a2a_overlap && ep > 1 && (pp == 1 || vpp > 1) && r != Recompute::Full;
                  }
                  k.algo = sc.algo;
                  k.stage_costs = false;  // only the trace draws them
                  k.memory_reserve_gib = sc.memory_reserve_gib, k.memory_reserve_fraction = sc.memory_reserve_fraction;
                  k.memory_check = false;  // over the HBM: reported as dropped, with its memory
                  k.schedule = false;     // ranked by the closed-form estimate; the best are re-simulated
                  // Each listed pipeline schedule this layout can run.
                  for (const std::string& sched : sc.pp_schedules) {
                    TrainConfig x = k;
                    if (sched == "zb-h1") {
                      if (vpp != 1 || pp < 2 || x.moe_a2a_overlap) continue;
                      x.zero_bubble = true;
                    } else if (sched == "dualpipe") {
                      if (vpp != 1 || pp < 2 || pp % 2 != 0 || mb % 2 != 0 || mb < 2 * pp) continue;
                      x.dualpipe = true, x.moe_a2a_overlap = false;  // DualPipe pairs the passes itself
                    }
                    out.push_back(std::move(x));
                  }
                }
              }
            }
          }
      }
    }
  }
  return out;
}

Result<SearchResult> searchLayouts(const ModelSpec& m, const SearchConfig& sc, NetworkModel& net,
                                   const std::function<void(int64_t, int64_t)>& progress) {
  const ClusterSpec& c = net.cluster();
  if (sc.gpus < 1 || sc.gpus > c.gpus())
    return invalidArgument("search: --gpus {} is outside [1, {}] for cluster '{}'", sc.gpus, c.gpus(), c.name);
  if (sc.top < 1) return invalidArgument("search: --top {} must be >= 1", sc.top);
  CHORUS_RETURN_IF_ERROR(checkAttentionKernel(c.gpu, sc.attention_kernel));
  if (sc.resimulate < 0) return invalidArgument("search: --resimulate {} must be >= 0", sc.resimulate);
  if (sc.gpus_per_domain != 0) CHORUS_RETURN_IF_ERROR(placedCluster(c, sc.gpus_per_domain, sc.gpus).status());
  PlacedNets nets(net, sc.gpus_per_domain);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<TrainConfig> cands = enumerateLayouts(m, c, sc);
  SearchResult res;
  res.candidates = static_cast<int64_t>(cands.size());
  if (cands.empty())
    return invalidArgument("search: no layout of {} GPUs divides global batch {} and seq {} for model '{}' (try a "
                           "global batch that is a multiple of a larger power of two)",
                           sc.gpus, sc.global_batch, sc.seq, m.name);
  const int64_t total = res.candidates;
  const int64_t step = std::max<int64_t>(1, total / 200);
  auto slower = [](const TrainReport& a, const TrainReport& b) { return a.iteration_s < b.iteration_s; };
  const int keep = std::max(sc.top, sc.resimulate);
  for (int64_t i = 0; i < total; ++i) {
    if (progress && i % step == 0) progress(i, total);
    const TrainConfig& k = cands[static_cast<size_t>(i)];
    Result<NetworkModel*> kn = nets.forLayout(k);
    Result<TrainReport> r = kn.isOk() ? simulateTraining(m, k, **kn) : Result<TrainReport>(kn.status());
    if (!r.isOk()) {
      if (res.first_error.empty()) res.first_error = r.status().message();
      continue;
    }
    if (r->memory.headroom_gib < 0) {
      ++res.dropped_memory;
      if (res.first_error.empty())
        res.first_error = fmt::format("{} does not fit: {:.1f} GiB + {:.1f} GiB reserve > {:.1f} GiB HBM", layoutName(k),
                                      r->memory_gib_per_gpu, r->memory.reserve_gib, toGib(c.gpu.hbm));
      // The nearest misses: the smallest shortfall first (ties: the faster).
      auto nearer = [](const TrainReport& a, const TrainReport& b) {
        return a.memory.headroom_gib != b.memory.headroom_gib ? a.memory.headroom_gib > b.memory.headroom_gib
                                                              : a.iteration_s < b.iteration_s;
      };
      if (static_cast<int>(res.dropped.size()) < sc.dropped_shown || nearer(*r, res.dropped.back())) {
        res.dropped.insert(std::upper_bound(res.dropped.begin(), res.dropped.end(), *r, nearer), std::move(*r));
        if (static_cast<int>(res.dropped.size()) > sc.dropped_shown) res.dropped.pop_back();
      }
      continue;
    }
    ++res.feasible;
    // Keep the top k sorted (k is small).
    if (static_cast<int>(res.top.size()) < keep || r->iteration_s < res.top.back().iteration_s) {
      res.top.insert(std::upper_bound(res.top.begin(), res.top.end(), *r, slower), std::move(*r));
      if (static_cast<int>(res.top.size()) > keep) res.top.pop_back();
    }
  }
  if (progress) progress(total, total);
  const auto t1 = std::chrono::steady_clock::now();
  res.estimate_seconds = std::chrono::duration<double>(t1 - t0).count();
  // The best by the estimate, simulated as schedules and ranked by them.
  if (sc.resimulate > 0) {
    const size_t n = std::min(res.top.size(), static_cast<size_t>(sc.resimulate));
    std::vector<TrainReport> sim;
    sim.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      TrainConfig k = res.top[i].config;
      k.schedule = true;
      k.memory_check = true;
      CHORUS_ASSIGN_OR_RETURN(NetworkModel * kn, nets.forLayout(k));
      Result<TrainReport> r = simulateTraining(m, k, *kn);
      if (!r.isOk()) return r.status();  // it was feasible a moment ago: a bug, not a layout to skip
      r->schedule_spec = IterationSpec{};  // the search keeps the numbers, not the task graph
      sim.push_back(std::move(*r));
    }
    std::stable_sort(sim.begin(), sim.end(), slower);
    res.top = std::move(sim);
    res.resimulated = static_cast<int64_t>(n);
  }
  if (static_cast<int>(res.top.size()) > sc.top) res.top.resize(static_cast<size_t>(sc.top));
  res.schedule_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  if (res.top.empty())
    return invalidArgument("search: none of {} layouts fits on {} GPUs of '{}' (first: {})", total, sc.gpus, c.name,
                           res.first_error);
  return res;
}

}  // namespace chorus::sim
