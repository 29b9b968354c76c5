// The proof of an expert-parallel step's routing (plan::ep::verifyRouting,
// src/plan/ep_verify.cpp): the library's routing is proven for random
// routings on many rank counts and host layouts, direct and node-limited;
// deliberately wrong hops (a token dropped, sent twice, sent where none of
// its experts lives, forwarded across hosts, beyond the node limit) are
// refused, naming what broke.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <vector>

#include "plan/ep_route.hpp"

namespace chorus::plan::ep {
namespace {

using ::testing::HasSubstr;

// Random ids for every rank: top-k distinct experts, within max_hosts hosts.
std::vector<std::vector<int32_t>> randomIds(const Geometry& g, size_t tokens, std::mt19937& rng) {
  std::vector<std::vector<int32_t>> ids(static_cast<size_t>(g.nranks));
  for (auto& mine : ids)
    for (size_t t = 0; t < tokens; ++t) {
      std::vector<int32_t> pool;
      if (g.nodeLimited()) {
        std::vector<int> hosts(static_cast<size_t>(g.nhosts()));
        for (int h = 0; h < g.nhosts(); ++h) hosts[static_cast<size_t>(h)] = h;
        std::shuffle(hosts.begin(), hosts.end(), rng);
        hosts.resize(static_cast<size_t>(std::min(g.max_hosts, g.nhosts())));
        for (int e = 0; e < g.experts; ++e)
          if (std::find(hosts.begin(), hosts.end(), g.hostOfExpert(e)) != hosts.end()) pool.push_back(e);
      } else {
        for (int e = 0; e < g.experts; ++e) pool.push_back(e);
      }
      std::shuffle(pool.begin(), pool.end(), rng);
      const size_t k = std::min(pool.size(), static_cast<size_t>(g.topk));
      for (size_t j = 0; j < static_cast<size_t>(g.topk); ++j) mine.push_back(pool[j % k]);
    }
  return ids;
}

struct Layout {
  std::vector<int> hosts;  // host label per rank
  int experts_per_rank, topk, max_hosts;
};

TEST(EpVerify, ProvesTheLibrarysRouting) {
  const std::vector<Layout> layouts = {
      {{0}, 4, 2, 0},           {{0, 0}, 3, 4, 0},          {{0, 1}, 2, 3, 1},        {{0, 0, 1, 1}, 2, 3, 1},
      {{0, 0, 1, 1}, 4, 5, 2},  {{0, 1, 0, 1}, 2, 2, 1},    {{0, 0, 0, 1, 1, 2}, 2, 4, 2},
      {{0, 1, 2, 0, 1, 2}, 1, 2, 2}, {{0, 0, 1, 1, 2, 2, 3, 3}, 8, 8, 2}, {{0, 0, 1, 1, 2, 2, 3, 3}, 2, 6, 0},
      {{0, 1, 2, 3, 4, 5, 6}, 3, 4, 3}};
  std::mt19937 rng(7);
  int proven = 0;
  for (const Layout& l : layouts) {
    const int n = static_cast<int>(l.hosts.size());
    const int k = std::min(l.topk, n * l.experts_per_rank);
    const Geometry g = Geometry::make(n, n * l.experts_per_rank, k, l.max_hosts, l.hosts);
    if (l.max_hosts > 0) {  // enough experts on max_hosts hosts for k distinct picks
      int smallest = n;
      for (const auto& hr : g.host_ranks) smallest = std::min(smallest, static_cast<int>(hr.size()));
      if (smallest * l.experts_per_rank * l.max_hosts < k) continue;
    }
    for (size_t tokens : {size_t{0}, size_t{1}, size_t{17}}) {
      const auto ids = randomIds(g, tokens, rng);
      Status s = verifyRouting(g, ids);
      EXPECT_TRUE(s.isOk()) << fmt::format("{} ranks, max_hosts {}: {}", n, l.max_hosts, s.message());
      ++proven;
    }
  }
  EXPECT_GE(proven, 30);
}

// Hops computed by the library, then broken one way each.
struct Broken {
  Geometry g;
  std::vector<std::vector<int32_t>> ids;
  std::vector<FirstHop> hops;
  std::vector<Forward> fw;
};
Broken routed(int max_hosts) {
  Broken b;
  b.g = Geometry::make(4, 8, 3, max_hosts, std::vector<int>{0, 0, 1, 1});
  std::mt19937 rng(3);
  b.ids = randomIds(b.g, 9, rng);
  for (int r = 0; r < 4; ++r) b.hops.push_back(*firstHop(b.g, r, b.ids[static_cast<size_t>(r)]));
  if (max_hosts > 0)
    for (int q = 0; q < 4; ++q) {
      std::vector<int32_t> hop1;
      for (int r = 0; r < 4; ++r) {
        const FirstHop& f = b.hops[static_cast<size_t>(r)];
        size_t start = 0;
        for (int qq = 0; qq < q; ++qq) start += f.send_counts[static_cast<size_t>(qq)];
        for (size_t i = 0; i < f.send_counts[static_cast<size_t>(q)]; ++i) {
          const size_t t = f.send_order[start + i];
          for (size_t j = 0; j < 3; ++j) hop1.push_back(b.ids[static_cast<size_t>(r)][t * 3 + j]);
        }
      }
      b.fw.push_back(*forward(b.g, q, hop1));
    }
  EXPECT_TRUE(verifyDelivery(b.g, b.ids, b.hops, b.fw).isOk());
  return b;
}

TEST(EpVerify, RefusesWrongHops) {
  {  // a token dropped from rank 0's first hop
    Broken b = routed(0);
    auto& f = b.hops[0];
    size_t q = 0;
    while (f.send_counts[q] == 0) ++q;
    f.send_counts[q] -= 1;
    f.send_order.erase(f.send_order.begin());
    EXPECT_THAT(verifyDelivery(b.g, b.ids, b.hops, b.fw).message(), HasSubstr("never reaches"));
  }
  {  // a token sent twice to one rank
    Broken b = routed(0);
    auto& f = b.hops[1];
    size_t q = 0;
    while (f.send_counts[q] == 0) ++q;
    f.send_counts[q] += 1;
    f.send_order.insert(f.send_order.begin(), f.send_order.front());
    EXPECT_THAT(verifyDelivery(b.g, b.ids, b.hops, b.fw).message(), HasSubstr("twice"));
  }
  {  // a token sent to a rank holding none of its experts
    Broken b = routed(0);
    const auto& ids = b.ids[2];
    size_t t = 0, far = 0;
    for (;; ++t) {
      std::vector<int> rs;
      for (size_t j = 0; j < 3; ++j) rs.push_back(b.g.rankOf(ids[t * 3 + j]));
      for (far = 0; far < 4 && std::find(rs.begin(), rs.end(), static_cast<int>(far)) != rs.end(); ++far) {}
      if (far < 4) break;
    }
    auto& f = b.hops[2];
    size_t start = 0;
    for (size_t q = 0; q < far; ++q) start += f.send_counts[q];
    f.send_order.insert(f.send_order.begin() + static_cast<std::ptrdiff_t>(start), t);
    f.send_counts[far] += 1;
    EXPECT_THAT(verifyDelivery(b.g, b.ids, b.hops, b.fw).message(), HasSubstr("holds none of its experts"));
  }
  {  // a relay forwarding to another host
    Broken b = routed(1);
    auto& fw = b.fw[0];
    size_t d = 0;
    while (fw.counts[d] == 0) ++d;
    fw.counts[d] -= 1, fw.counts[2] += 1;  // rank 2 is on host 1, the relay (rank 0) on host 0
    std::rotate(fw.rows.begin(), fw.rows.begin() + 1, fw.rows.end());
    EXPECT_THAT(verifyDelivery(b.g, b.ids, b.hops, b.fw).message(), HasSubstr("on another host"));
  }
  {  // routing beyond the node limit: hops made for 2 hosts, checked against 1
    Broken b = routed(2);
    Geometry one = b.g;
    one.max_hosts = 1;
    bool beyond = false;
    for (const auto& mine : b.ids)
      for (size_t t = 0; t < mine.size() / 3; ++t) {
        std::vector<int> hs;
        for (size_t j = 0; j < 3; ++j) hs.push_back(b.g.hostOfExpert(mine[t * 3 + j]));
        beyond |= std::count(hs.begin(), hs.end(), hs[0]) != 3;
      }
    ASSERT_TRUE(beyond) << "the draw has no token on 2 hosts";
    EXPECT_THAT(verifyDelivery(one, b.ids, b.hops, b.fw).message(), HasSubstr("more than maxHostsPerToken=1"));
  }
}

}  // namespace
}  // namespace chorus::plan::ep
