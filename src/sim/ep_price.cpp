#include "sim/ep_price.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "common/wire_format.hpp"
#include "plan/ep_route.hpp"

namespace chorus::sim {

double EpLinkBytes::busiest() const {
  double b = 0;
  for (size_t h = 0; h < up.size(); ++h) b = std::max({b, up[h], down[h]});
  return b;
}

namespace {

// Adds `bytes` from rank a to rank b: across the link of each host, or inside one.
struct Counter {
  const plan::ep::Geometry& g;
  EpLinkBytes& b;
  void add(int a, int to, double bytes) const {
    if (bytes == 0 || a == to) return;
    const int ha = g.host_of[static_cast<size_t>(a)], hb = g.host_of[static_cast<size_t>(to)];
    if (ha == hb) {
      b.inside += bytes;
    } else {
      b.up[static_cast<size_t>(ha)] += bytes;
      b.down[static_cast<size_t>(hb)] += bytes;
    }
  }
};

}  // namespace

Result<EpPrice> priceEp(const EpPriceCase& c) {
  if (c.hosts < 1 || c.ranks_per_host < 1 || c.hosts * c.ranks_per_host > 4096)
    return invalidArgument("--hosts {} x --ranks-per-host {}: 1..4096 ranks", c.hosts, c.ranks_per_host);
  const int n = c.hosts * c.ranks_per_host;
  if (c.experts < 1 || c.experts % n != 0)
    return invalidArgument("--experts {} must be a positive multiple of the {} ranks", c.experts, n);
  if (c.topk < 1 || c.topk > c.experts) return invalidArgument("--topk {} must be in 1..{}", c.topk, c.experts);
  if (c.max_hosts < 0) return invalidArgument("--max-hosts {} must be >= 0", c.max_hosts);
  if (c.max_hosts > 0 && c.topk > std::min(c.max_hosts, c.hosts) * (c.experts / c.hosts))
    return invalidArgument("--topk {} experts do not fit on --max-hosts {} hosts of {} experts", c.topk, c.max_hosts,
                           c.experts / c.hosts);
  if (c.hidden == 0 || c.tokens > (size_t{1} << 24)) return invalidArgument("--hidden must be > 0, --tokens <= 2^24");
  if (!(c.link_gbps > 0)) return invalidArgument("--link-gbps {} must be > 0", c.link_gbps);
  size_t elem = 0, payload = 0;
  if (c.dtype == "bf16" || c.dtype == "fp8") {
    elem = 2;
  } else if (c.dtype == "float") {
    elem = 4;
  } else {
    return invalidArgument("--dtype {}: bf16, float or fp8", c.dtype);
  }
  const size_t row = elem * c.hidden;
  payload = c.dtype == "fp8" ? wireBytes(WireFormat{WireFormat::Fp8E4m3, kFp8DefaultBlock}, c.hidden) : row;
  const auto k = static_cast<size_t>(c.topk);
  const double dispatch_row = static_cast<double>(plan::ep::dispatchRowBytes(payload, k));

  std::vector<int> labels(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) labels[static_cast<size_t>(r)] = r / c.ranks_per_host;
  const plan::ep::Geometry g = plan::ep::Geometry::make(n, c.experts, c.topk, c.max_hosts, labels);

  EpPrice p;
  p.link_bytes_per_s = c.link_gbps * 1e9 / 8;
  for (EpLinkBytes* b : {&p.ep_dispatch, &p.ep_combine, &p.a2a_dispatch, &p.a2a_combine})
    b->up.assign(static_cast<size_t>(c.hosts), 0), b->down.assign(static_cast<size_t>(c.hosts), 0);
  const Counter ed{g, p.ep_dispatch}, ec{g, p.ep_combine}, ad{g, p.a2a_dispatch}, ac{g, p.a2a_combine};

  // Every rank's routing and first hop, as ep_layout computes them.
  std::vector<std::vector<int32_t>> ids(static_cast<size_t>(n), std::vector<int32_t>(c.tokens * k));
  std::vector<plan::ep::FirstHop> hop(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    auto& mine = ids[static_cast<size_t>(r)];
    for (size_t t = 0; t < c.tokens; ++t)
      plan::ep::uniformRoute(c.seed, r, t, c.experts, c.topk, c.hosts, c.max_hosts, &mine[t * k]);
    CHORUS_ASSIGN_OR_RETURN(hop[static_cast<size_t>(r)], plan::ep::firstHop(g, r, mine));
    for (int q = 0; q < n; ++q) {
      const double rows = static_cast<double>(hop[static_cast<size_t>(r)].send_counts[static_cast<size_t>(q)]);
      ed.add(r, q, rows * dispatch_row);
      ec.add(q, r, rows * static_cast<double>(row));  // combine: the same rows back, in the datatype
    }
    // The all-to-all-v formulation: one row per (token, expert) each way.
    for (int32_t e : mine) {
      ad.add(r, g.rankOf(e), static_cast<double>(row + sizeof(float)));
      ac.add(g.rankOf(e), r, static_cast<double>(row));
    }
  }
  // Node-limited routing: each relay forwards inside its host what arrived
  // (the rows from each sender, in rank order: ep_layout's hop-1 arrival order).
  if (g.nodeLimited())
    for (int q = 0; q < n; ++q) {
      std::vector<int32_t> arrived;
      for (int r = 0; r < n; ++r) {
        const plan::ep::FirstHop& f = hop[static_cast<size_t>(r)];
        size_t start = 0;
        for (int qq = 0; qq < q; ++qq) start += f.send_counts[static_cast<size_t>(qq)];
        for (size_t i = 0; i < f.send_counts[static_cast<size_t>(q)]; ++i) {
          const size_t t = f.send_order[start + i];
          const auto& src = ids[static_cast<size_t>(r)];
          arrived.insert(arrived.end(), src.begin() + static_cast<std::ptrdiff_t>(t * k),
                         src.begin() + static_cast<std::ptrdiff_t>((t + 1) * k));
        }
      }
      CHORUS_ASSIGN_OR_RETURN(const plan::ep::Forward fw, plan::ep::forward(g, q, arrived));
      for (int d = 0; d < n; ++d) {
        const double rows = static_cast<double>(fw.counts[static_cast<size_t>(d)]);
        ed.add(q, d, rows * dispatch_row);
        ec.add(d, q, rows * static_cast<double>(row));
      }
    }
  // The routing priced is proven (plan::ep::verifyRouting): every token
  // reaches exactly its experts, once, within the node limit, and the counts
  // add up.
  CHORUS_RETURN_IF_ERROR(plan::ep::verifyRouting(g, ids));
  return p;
}

int runEpCommand(const EpPriceCase& c, bool json) {
  auto priced = priceEp(c);
  if (!priced.isOk()) {
    std::fprintf(stderr, "chorus-sim ep: %s\n", priced.status().message().c_str());
    return 1;
  }
  const EpPrice& p = *priced;
  struct Line {
    const char* form;
    const char* op;
    const EpLinkBytes* b;
  };
  const Line lines[] = {{"ep", "dispatch", &p.ep_dispatch},
                        {"ep", "combine", &p.ep_combine},
                        {"alltoallv", "dispatch", &p.a2a_dispatch},
                        {"alltoallv", "combine", &p.a2a_combine}};
  const double ep_bound = p.bound(p.ep_dispatch) + p.bound(p.ep_combine);
  const double a2a_bound = p.bound(p.a2a_dispatch) + p.bound(p.a2a_combine);
  if (json) {
    nlohmann::json j;
    j["hosts"] = c.hosts, j["ranks_per_host"] = c.ranks_per_host, j["tokens"] = c.tokens, j["hidden"] = c.hidden;
    j["experts"] = c.experts, j["topk"] = c.topk, j["max_hosts"] = c.max_hosts, j["dtype"] = c.dtype;
    j["link_gbps"] = c.link_gbps, j["seed"] = c.seed;
    for (const Line& l : lines) {
      nlohmann::json e;
      e["up_bytes"] = l.b->up, e["down_bytes"] = l.b->down, e["inside_bytes"] = l.b->inside;
      e["busiest_link_bytes"] = l.b->busiest(), e["bound_s"] = p.bound(*l.b);
      j[l.form][l.op] = e;
    }
    j["ep"]["bound_s"] = ep_bound, j["alltoallv"]["bound_s"] = a2a_bound;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("# chorus-sim ep: %d hosts x %d ranks, %zu tokens x %zu %s per rank, top-%d of %d experts, max hosts "
              "%d, %.3g Gbit/s links, seed %llu\n",
              c.hosts, c.ranks_per_host, c.tokens, c.hidden, c.dtype.c_str(), c.topk, c.experts, c.max_hosts,
              c.link_gbps, static_cast<unsigned long long>(c.seed));
  std::printf("# bytes from the library's routing (plan/ep_route.hpp), proven by plan::ep::verifyRouting; bound = "
              "busiest host link / link rate\n");
  std::printf("%-10s %-9s %14s %14s %14s %12s\n", "form", "op", "busiest (MB)", "links (MB)", "inside (MB)",
              "bound (ms)");
  for (const Line& l : lines) {
    double total = 0;
    for (double v : l.b->up) total += v;
    std::printf("%-10s %-9s %14.1f %14.1f %14.1f %12.1f\n", l.form, l.op, l.b->busiest() / 1e6, total / 1e6,
                l.b->inside / 1e6, p.bound(*l.b) * 1e3);
  }
  std::printf("dispatch+combine bound: ep %.1f ms, alltoallv %.1f ms (alltoallv / ep %.2f)\n", ep_bound * 1e3,
              a2a_bound * 1e3, a2a_bound / ep_bound);
  return 0;
}

}  // namespace chorus::sim
