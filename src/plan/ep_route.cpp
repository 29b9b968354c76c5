#include "plan/ep_route.hpp"

#include <algorithm>
#include <map>
#include <numeric>

namespace chorus::plan::ep {

Geometry Geometry::make(int nranks, int experts, int topk, int max_hosts, std::span<const int> host_labels) {
  Geometry g;
  g.nranks = nranks, g.experts = experts, g.topk = topk, g.max_hosts = max_hosts;
  std::map<int, int> index;
  for (int r = 0; r < nranks; ++r) {
    const int label = static_cast<size_t>(r) < host_labels.size() ? host_labels[static_cast<size_t>(r)] : 0;
    g.host_of.push_back(index.try_emplace(label, static_cast<int>(index.size())).first->second);
  }
  g.host_ranks.assign(index.size(), {});
  g.local_index.assign(static_cast<size_t>(nranks), 0);
  for (int r = 0; r < nranks; ++r) {
    auto& hr = g.host_ranks[static_cast<size_t>(g.host_of[static_cast<size_t>(r)])];
    g.local_index[static_cast<size_t>(r)] = static_cast<int>(hr.size());
    hr.push_back(r);
  }
  return g;
}

Result<FirstHop> firstHop(const Geometry& g, int rank, std::span<const int32_t> ids) {
  const auto k = static_cast<size_t>(g.topk);
  const size_t tokens = ids.size() / k;
  const auto n = static_cast<size_t>(g.nranks);
  const auto nh = static_cast<size_t>(g.nhosts());
  FirstHop f;
  f.per_rank.assign(n, 0), f.per_host.assign(nh, 0), f.per_expert.assign(static_cast<size_t>(g.experts), 0);
  std::vector<std::vector<size_t>> to(n);
  std::vector<char> in_rank(n), in_host(nh);
  for (size_t t = 0; t < tokens; ++t) {
    std::fill(in_rank.begin(), in_rank.end(), 0);
    std::fill(in_host.begin(), in_host.end(), 0);
    for (size_t j = 0; j < k; ++j) {
      const int e = ids[t * k + j];
      const auto r = static_cast<size_t>(g.rankOf(e));
      f.per_expert[static_cast<size_t>(e)] += 1;
      in_rank[r] = 1;
      in_host[static_cast<size_t>(g.host_of[r])] = 1;
    }
    size_t hosts = 0;
    for (size_t h = 0; h < nh; ++h) {
      f.per_host[h] += in_host[h], hosts += in_host[h];
      if (in_host[h] && g.nodeLimited()) to[static_cast<size_t>(g.relayFor(rank, static_cast<int>(h)))].push_back(t);
    }
    if (g.nodeLimited() && hosts > static_cast<size_t>(g.max_hosts))
      return invalidArgument("topkIdx row {} (token {}) reaches {} hosts but maxHostsPerToken={} (route within at most "
                             "that many hosts, e.g. group-limited gating)", t, t, hosts, g.max_hosts);
    for (size_t r = 0; r < n; ++r) {
      f.per_rank[r] += in_rank[r];
      if (in_rank[r] && !g.nodeLimited()) to[r].push_back(t);
    }
  }
  f.send_counts.assign(n, 0);
  for (size_t r = 0; r < n; ++r) {
    f.send_counts[r] = to[r].size();
    f.send_order.insert(f.send_order.end(), to[r].begin(), to[r].end());
  }
  return f;
}

Result<Forward> forward(const Geometry& g, int rank, std::span<const int32_t> hop1_ids) {
  const auto k = static_cast<size_t>(g.topk);
  const auto n = static_cast<size_t>(g.nranks);
  const int my_host = g.host_of[static_cast<size_t>(rank)];
  const size_t rows = hop1_ids.size() / k;
  std::vector<std::vector<size_t>> to(n);
  std::vector<int> rs;
  for (size_t i = 0; i < rows; ++i) {
    const int32_t* ids = &hop1_ids[i * k];
    rs.clear();
    for (size_t j = 0; j < k; ++j)
      if (g.hostOfExpert(ids[j]) == my_host) rs.push_back(g.rankOf(ids[j]));
    if (rs.empty()) return internalError("a relayed row names no expert of this rank's host: the counts do not add up");
    std::sort(rs.begin(), rs.end());
    rs.erase(std::unique(rs.begin(), rs.end()), rs.end());
    for (int q : rs) to[static_cast<size_t>(q)].push_back(i);
  }
  Forward f;
  f.counts.assign(n, 0);
  for (size_t q = 0; q < n; ++q) {
    f.counts[q] = to[q].size();
    f.rows.insert(f.rows.end(), to[q].begin(), to[q].end());
  }
  return f;
}

void countLastHop(const Geometry& g, const int32_t* ids, int only_host, std::vector<uint64_t>& sc) {
  const auto k = static_cast<size_t>(g.topk);
  const int L = g.localExperts();
  const size_t w = 1 + static_cast<size_t>(L);
  std::vector<int32_t> row(ids, ids + k);
  std::sort(row.begin(), row.end());
  int last = -1;
  for (int32_t e : row) {
    const int r = g.rankOf(e);
    if (only_host >= 0 && g.host_of[static_cast<size_t>(r)] != only_host) continue;
    if (r != last) sc[static_cast<size_t>(r) * w] += 1, last = r;
    sc[static_cast<size_t>(r) * w + 1 + static_cast<size_t>(e - r * L)] += 1;
  }
}

namespace {
uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}
}  // namespace

void uniformRoute(uint64_t seed, int rank, size_t t, int experts, int topk, int nhosts, int max_hosts, int32_t* ids) {
  uint64_t state = mix(mix(seed * 0x9e3779b97f4a7c15ull + 1) ^ (static_cast<uint64_t>(rank) << 40) ^ t);
  auto next = [&] { return mix(state += 0x9e3779b97f4a7c15ull); };
  std::vector<int32_t> pool;
  if (max_hosts > 0 && nhosts > 1) {
    std::vector<int> hs(static_cast<size_t>(nhosts));
    std::iota(hs.begin(), hs.end(), 0);
    const int m = std::min(max_hosts, nhosts);
    for (int i = 0; i < m; ++i)
      std::swap(hs[static_cast<size_t>(i)],
                hs[static_cast<size_t>(i + static_cast<int>(next() % static_cast<uint64_t>(nhosts - i)))]);
    const int per_host = experts / nhosts;
    for (int i = 0; i < m; ++i)
      for (int e = 0; e < per_host; ++e) pool.push_back(hs[static_cast<size_t>(i)] * per_host + e);
  } else {
    pool.resize(static_cast<size_t>(experts));
    std::iota(pool.begin(), pool.end(), 0);
  }
  const auto size = static_cast<int>(pool.size());
  for (int j = 0; j < topk && j < size; ++j) {
    std::swap(pool[static_cast<size_t>(j)],
              pool[static_cast<size_t>(j + static_cast<int>(next() % static_cast<uint64_t>(size - j)))]);
    ids[j] = pool[static_cast<size_t>(j)];
  }
}

}  // namespace chorus::plan::ep
