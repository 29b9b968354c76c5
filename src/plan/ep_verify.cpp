// The proof of an expert-parallel step's routing (plan/ep_route.hpp,
// verifyRouting): the library's routing functions run for every rank, every
// (rank, token, choice) followed to where it lands.
#include <algorithm>

#include "plan/ep_route.hpp"

namespace chorus::plan::ep {
namespace {

struct Row {  // a token on the wire: its home rank and index
  int src;
  size_t t;
};

}  // namespace

Status verifyDelivery(const Geometry& g, std::span<const std::vector<int32_t>> ids, std::span<const FirstHop> hops,
                      std::span<const Forward> forwards) {
  const auto n = static_cast<size_t>(g.nranks);
  const auto k = static_cast<size_t>(g.topk);
  const auto L = static_cast<size_t>(g.localExperts());
  if (ids.size() != n || hops.size() != n || (g.nodeLimited() ? forwards.size() != n : !forwards.empty()))
    return invalidArgument("verifyDelivery: {} ranks but {} id sets, {} hops, {} forwards", n, ids.size(), hops.size(),
                           forwards.size());
  // delivered[r][t * k + j]: times (r, t, choice j) reached its expert's rank.
  std::vector<std::vector<uint32_t>> delivered(n), copies(n);
  for (size_t r = 0; r < n; ++r) {
    delivered[r].assign(ids[r].size(), 0);
    copies[r].assign(ids[r].size() / k * n, 0);  // per (token, destination rank or host)
  }
  // The first hop: each rank's send order, rank-major, arriving in source order.
  std::vector<std::vector<Row>> arrived(n);
  for (size_t r = 0; r < n; ++r) {
    const FirstHop& f = hops[r];
    if (f.send_counts.size() != n) return invalidArgument("rank {}'s first hop has {} counts for {} ranks", r, f.send_counts.size(), n);
    size_t p = 0;
    for (size_t q = 0; q < n; ++q)
      for (size_t i = 0; i < f.send_counts[q]; ++i, ++p) {
        if (p >= f.send_order.size()) return invalidArgument("rank {}'s send order is shorter than its counts", r);
        const size_t t = f.send_order[p];
        if (t >= ids[r].size() / k) return invalidArgument("rank {} sends token {} of {}", r, t, ids[r].size() / k);
        const size_t to = g.nodeLimited() ? static_cast<size_t>(g.host_of[q]) : q;
        if (++copies[r][t * n + to] > 1)
          return invalidArgument("rank {}'s token {} crosses to {} {} twice", r, t, g.nodeLimited() ? "host" : "rank", to);
        arrived[q].push_back({static_cast<int>(r), t});
      }
    if (p != f.send_order.size()) return invalidArgument("rank {}'s send order is longer than its counts", r);
  }
  for (size_t r = 0; r < n; ++r)
    for (size_t t = 0; t < ids[r].size() / k; ++t) {
      size_t hosts = 0;
      for (size_t h = 0; h < (g.nodeLimited() ? static_cast<size_t>(g.nhosts()) : 0); ++h) hosts += copies[r][t * n + h];
      if (g.nodeLimited() && hosts > static_cast<size_t>(g.max_hosts))
        return invalidArgument("rank {}'s token {} reaches {} hosts, more than maxHostsPerToken={}", r, t, hosts,
                               g.max_hosts);
    }
  // The last hop: direct routing delivers the first hop; node-limited routing
  // forwards inside the relay's host.
  std::vector<std::vector<Row>> last(n);           // rows reaching each rank
  std::vector<std::vector<uint64_t>> announced(n);  // countLastHop's counts, as each sender computes them
  const size_t w = 1 + L;
  for (size_t q = 0; q < n; ++q) announced[q].assign(n * w, 0);
  for (size_t q = 0; q < n; ++q) {
    if (!g.nodeLimited()) {
      for (size_t t = 0; t < ids[q].size() / k; ++t) countLastHop(g, &ids[q][t * k], -1, announced[q]);
      for (const Row& row : arrived[q]) last[q].push_back(row);
      continue;
    }
    const Forward& f = forwards[q];
    if (f.counts.size() != n) return invalidArgument("relay {} forwards with {} counts for {} ranks", q, f.counts.size(), n);
    size_t p = 0;
    for (size_t d = 0; d < n; ++d)
      for (size_t i = 0; i < f.counts[d]; ++i, ++p) {
        if (p >= f.rows.size() || f.rows[p] >= arrived[q].size())
          return invalidArgument("relay {} forwards a row it did not receive", q);
        if (g.host_of[d] != g.host_of[q])
          return invalidArgument("relay {} forwards to rank {} on another host", q, d);
        last[d].push_back(arrived[q][f.rows[p]]);
      }
    for (const Row& row : arrived[q])
      countLastHop(g, &ids[static_cast<size_t>(row.src)][row.t * k], g.host_of[q], announced[q]);
  }
  // What arrives: each row's choices whose expert lives here, per local expert.
  std::vector<std::vector<uint64_t>> got(n, std::vector<uint64_t>(w, 0));
  for (size_t d = 0; d < n; ++d)
    for (const Row& row : last[d]) {
      const auto src = static_cast<size_t>(row.src);
      size_t here = 0;
      for (size_t j = 0; j < k; ++j) {
        const int e = ids[src][row.t * k + j];
        if (static_cast<size_t>(g.rankOf(e)) != d) continue;
        ++here;
        ++got[d][1 + static_cast<size_t>(e) % L];
        if (++delivered[src][row.t * k + j] > 1)
          return invalidArgument("rank {}'s token {}, choice {} (expert {}) reaches rank {} twice", src, row.t, j, e, d);
      }
      if (here == 0) return invalidArgument("rank {}'s token {} reaches rank {}, which holds none of its experts", src, row.t, d);
      ++got[d][0];
    }
  for (size_t r = 0; r < n; ++r)
    for (size_t i = 0; i < delivered[r].size(); ++i)
      if (delivered[r][i] != 1)
        return invalidArgument("rank {}'s token {}, choice {} (expert {}) never reaches rank {}", r, i / k, i % k,
                               ids[r][i], g.rankOf(ids[r][i]));
  for (size_t d = 0; d < n; ++d) {
    std::vector<uint64_t> want(w, 0);
    for (size_t q = 0; q < n; ++q)
      for (size_t i = 0; i < w; ++i) want[i] += announced[q][d * w + i];
    for (size_t i = 0; i < w; ++i)
      if (got[d][i] != want[i])
        return invalidArgument("rank {}: the layout announces {} {} but {} arrive: the counts do not add up", d, want[i],
                               i == 0 ? std::string("rows") : fmt::format("rows for local expert {}", i - 1), got[d][i]);
  }
  // Combine reverses every exchange row for row: each last-hop row sends one
  // partial back along its path (to the relay, which sums its host's, then
  // home), so home gets one partial per first-hop row, and the partials'
  // experts are the deliveries above: each of the token's topk exactly once.
  return {};
}

Status verifyRouting(const Geometry& g, std::span<const std::vector<int32_t>> ids) {
  const auto n = static_cast<size_t>(g.nranks);
  const auto k = static_cast<size_t>(g.topk);
  std::vector<FirstHop> hops(n);
  for (size_t r = 0; r < n; ++r) {
    auto f = firstHop(g, static_cast<int>(r), ids[r]);
    if (!f.isOk()) return f.status().withContext(fmt::format("rank {}: ", r));
    hops[r] = std::move(*f);
  }
  std::vector<Forward> fw;
  if (g.nodeLimited()) {
    fw.resize(n);
    for (size_t q = 0; q < n; ++q) {
      std::vector<int32_t> hop1;
      for (size_t r = 0; r < n; ++r) {
        size_t start = 0;
        for (size_t qq = 0; qq < q; ++qq) start += hops[r].send_counts[qq];
        for (size_t i = 0; i < hops[r].send_counts[q]; ++i) {
          const size_t t = hops[r].send_order[start + i];
          hop1.insert(hop1.end(), ids[r].begin() + static_cast<std::ptrdiff_t>(t * k),
                      ids[r].begin() + static_cast<std::ptrdiff_t>((t + 1) * k));
        }
      }
      auto f = forward(g, static_cast<int>(q), hop1);
      if (!f.isOk()) return f.status().withContext(fmt::format("relay {}: ", q));
      fw[q] = std::move(*f);
    }
  }
  return verifyDelivery(g, ids, hops, fw);
}

}  // namespace chorus::plan::ep
