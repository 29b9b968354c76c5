// chorus-sim ep (src/sim/ep_price.cpp): the bytes on each host's link for a
// MoE dispatch + combine, from the library's routing, against a count made
// here from the routing alone (a token crosses once to each other host it
// has experts on with node-limited routing, once to each other-host rank
// without, one row per (token, expert) for all-to-all-v); the bound; bad cases.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "plan/ep_route.hpp"
#include "sim/ep_price.hpp"

namespace chorus::sim {
namespace {

TEST(EpPrice, LinkBytesAreTheRoutingsOwn) {
  for (int max_hosts : {0, 1, 2}) {
    EpPriceCase c;
    c.hosts = 3, c.ranks_per_host = 2, c.tokens = 50, c.hidden = 24, c.experts = 12, c.topk = 3;
    c.max_hosts = max_hosts, c.seed = 5;
    auto p = priceEp(c);
    ASSERT_TRUE(p.isOk()) << p.status().message();
    const int n = 6, L = 2;
    const double row = 48, wire = static_cast<double>(plan::ep::dispatchRowBytes(48, 3));
    std::vector<double> ep_up(3, 0), ep_down(3, 0), a_up(3, 0), a_down(3, 0);
    for (int r = 0; r < n; ++r)
      for (size_t t = 0; t < c.tokens; ++t) {
        int32_t ids[3];
        plan::ep::uniformRoute(c.seed, r, t, c.experts, c.topk, c.hosts, max_hosts, ids);
        std::set<int> dests;
        for (int32_t e : ids) {
          const int q = e / L;
          dests.insert(max_hosts > 0 ? q / 2 : q);
          if (q / 2 != r / 2) a_up[static_cast<size_t>(r / 2)] += row + 4, a_down[static_cast<size_t>(q / 2)] += row + 4;
        }
        for (int d : dests) {
          const int h = max_hosts > 0 ? d : d / 2;
          if (h != r / 2) ep_up[static_cast<size_t>(r / 2)] += wire, ep_down[static_cast<size_t>(h)] += wire;
        }
      }
    EXPECT_EQ(p->ep_dispatch.up, ep_up) << "max_hosts " << max_hosts;
    EXPECT_EQ(p->ep_dispatch.down, ep_down) << "max_hosts " << max_hosts;
    EXPECT_EQ(p->a2a_dispatch.up, a_up) << "max_hosts " << max_hosts;
    EXPECT_EQ(p->a2a_dispatch.down, a_down) << "max_hosts " << max_hosts;
    // Combine: the same rows back, in the datatype.
    for (size_t h = 0; h < 3; ++h) EXPECT_DOUBLE_EQ(p->ep_combine.down[h], ep_up[h] / wire * row);
    const double busiest = std::max(*std::max_element(ep_up.begin(), ep_up.end()),
                                    *std::max_element(ep_down.begin(), ep_down.end()));
    EXPECT_DOUBLE_EQ(p->bound(p->ep_dispatch), busiest / 125e6);
    if (max_hosts > 0) EXPECT_GT(p->ep_dispatch.inside, 0) << "node-limited routing forwards inside hosts";
  }
}

TEST(EpPrice, IssueCaseIsFourTimesFewerBytesOnTheBusiestLink) {
  EpPriceCase c;  // the defaults: 4 hosts x 2 ranks, 4096 x 7168 bf16, top-8 of 64, max 2 hosts, 1 Gbit/s
  c.tokens = 512;
  auto p = priceEp(c);
  ASSERT_TRUE(p.isOk());
  const double ratio = (p->bound(p->a2a_dispatch) + p->bound(p->a2a_combine)) /
                       (p->bound(p->ep_dispatch) + p->bound(p->ep_combine));
  EXPECT_GT(ratio, 3.5);
  EXPECT_LT(ratio, 4.5);
}

TEST(EpPrice, RefusesImpossibleCases) {
  EpPriceCase c;
  c.experts = 60;
  EXPECT_THAT(priceEp(c).status().message(), ::testing::HasSubstr("--experts 60 must be a positive multiple of the 8"));
  c = EpPriceCase{};
  c.max_hosts = 1, c.topk = 17;
  EXPECT_THAT(priceEp(c).status().message(), ::testing::HasSubstr("--topk 17 experts do not fit"));
  c = EpPriceCase{};
  c.dtype = "int8";
  EXPECT_THAT(priceEp(c).status().message(), ::testing::HasSubstr("--dtype int8"));
}

}  // namespace
}  // namespace chorus::sim
