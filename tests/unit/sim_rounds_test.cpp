// The simulator prices a plan by its round patterns (Algorithm::rounds), the
// executor runs its expanded programs: these tests pin that both describe the
// same messages, for every registered algorithm and n <= 16, so the two
// cannot drift.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include <fmt/ranges.h>

#include "plan/plan.hpp"

namespace chorus::plan {
namespace {

using Pair = std::pair<int, int>;
struct Traffic {
  std::map<Pair, uint64_t> elems;                   // (src, dst) -> total elements
  std::multiset<std::tuple<int, int, uint64_t>> msgs;  // every message
};

Traffic fromPrograms(const Algorithm& algo, const Shape& sh) {
  Traffic t;
  Program p;
  for (int r = 0; r < sh.nranks; ++r) {
    expand(algo, sh, r, &p);
    for (const Step& s : p.steps)
      if (s.op == StepOp::Send) {
        t.elems[{r, s.peer}] += s.src.count;
        t.msgs.insert({r, s.peer, s.src.count});
      }
  }
  return t;
}

Traffic fromRounds(const std::vector<Round>& rounds, int n) {
  Traffic t;
  for (const Round& rd : rounds)
    for (uint64_t k = 0; k < rd.repeat; ++k)
      forEachMessage(rd, n, [&](int s, int d, uint64_t e) {
        t.elems[{s, d}] += e;
        t.msgs.insert({s, d, e});
      });
  return t;
}

bool rooted(Collective c) {
  return c == Collective::Broadcast || c == Collective::Reduce || c == Collective::Gather || c == Collective::Scatter;
}

// Counts that split evenly among 1..16 ranks (720720 = lcm(1..16)) so that
// the pattern's one message size is exact; per-rank collectives use 3.
uint64_t evenCount(Collective c) {
  switch (c) {
    case Collective::AllReduce:
    case Collective::Broadcast:
    case Collective::Reduce: return 720720;
    default: return 3;
  }
}

TEST(SimRounds, PatternsMatchExpandedPrograms) {
  Registry reg = Registry::builtin();
  int checked = 0;
  for (const auto& algo : reg.all()) {
    const Collective c = algo->collective();
    if (c == Collective::AllGatherV || c == Collective::AllToAllV) continue;
    for (int n = 1; n <= 16; ++n) {
      // Host layouts (Shape::hosts): unknown, one host, two and n/2 hosts
      // (blocks of ranks), and hosts interleaved by rank.
      std::vector<std::vector<int>> layouts(1);
      for (int H : {1, 2, n / 2})
        if (H >= 1 && n % H == 0) {
          std::vector<int> blocks(n), strided(n);
          for (int r = 0; r < n; ++r) {
            blocks[r] = r / (n / H);
            strided[r] = r % H;
          }
          layouts.push_back(blocks);
          layouts.push_back(strided);
        }
      for (const std::vector<int>& hosts : layouts)
      for (int root : {0, n / 2, n - 1}) {
        if (!rooted(c) && root != 0) continue;
        Shape sh;
        sh.coll = c;
        sh.nranks = n;
        sh.count = evenCount(c);
        sh.root = root;
        sh.hosts = hosts;
        if (!algo->supports(sh)) continue;
        auto rounds = algo->rounds(sh);
        ASSERT_TRUE(rounds.isOk()) << algo->name() << ": " << rounds.status().message();
        const Traffic want = fromPrograms(*algo, sh), got = fromRounds(*rounds, n);
        const std::string where =
            fmt::format("{} {} n={} root={} hosts={}", collectiveName(c), algo->name(), n, root, fmt::join(hosts, ","));
        EXPECT_EQ(got.elems, want.elems) << where;
        // Gather/scatter split a subtree where the rank order wraps past the
        // root, so message counts agree only for root 0.
        if (root == 0 || (c != Collective::Gather && c != Collective::Scatter)) {
          EXPECT_EQ(got.msgs, want.msgs) << where;
        }
        // A reducing collective must mark the rounds whose receivers reduce.
        if (reduces(c) && n > 1) {
          bool any = false;
          for (const Round& rd : *rounds) any = any || rd.reduce;
          EXPECT_TRUE(any) << where;
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 200);
}

// The families that scale describe a 131,072-rank call in O(rounds).
TEST(SimRounds, LargeRingIsTwoRounds) {
  Registry reg = Registry::builtin();
  Shape sh;
  sh.coll = Collective::AllReduce;
  sh.nranks = 131072;
  sh.count = uint64_t{1} << 28;
  auto rounds = reg.find(Collective::AllReduce, "ring")->rounds(sh);
  ASSERT_TRUE(rounds.isOk());
  ASSERT_EQ(rounds->size(), 2u);
  EXPECT_EQ((*rounds)[0].repeat, 131071u);
  EXPECT_EQ((*rounds)[0].elems, 2048u);  // 2^28 / 2^17
  EXPECT_TRUE((*rounds)[0].reduce);
  EXPECT_FALSE((*rounds)[1].reduce);

  auto rd = reg.find(Collective::AllReduce, "recursive_doubling")->rounds(sh);
  ASSERT_TRUE(rd.isOk());
  EXPECT_EQ(rd->size(), 17u);  // log2(131072) xor rounds, no fold
}

// Rabenseifner, recursive halving, Bruck all-to-all, double tree and
// scatter-allgather describe their rounds as patterns too: no 256-rank limit.
TEST(SimRounds, ScalableFamiliesBeyondDerivedLimit) {
  Registry reg = Registry::builtin();
  Shape sh;
  sh.coll = Collective::AllReduce;
  sh.nranks = 131072;
  sh.count = uint64_t{1} << 28;
  auto rab = reg.find(Collective::AllReduce, "rabenseifner")->rounds(sh);
  ASSERT_TRUE(rab.isOk()) << rab.status().message();
  ASSERT_EQ(rab->size(), 34u);          // 17 halving + 17 doubling rounds, no fold
  EXPECT_EQ((*rab)[0].elems, sh.count / 2);  // the first halving round moves half the data
  EXPECT_TRUE((*rab)[0].reduce);
  EXPECT_EQ((*rab)[33].elems, sh.count / 2);
  auto dt = reg.find(Collective::AllReduce, "double_tree")->rounds(sh);
  ASSERT_TRUE(dt.isOk());
  EXPECT_EQ(dt->size(), 34u);  // depth 17 up, 17 down
  sh.nranks = 1000;
  sh.coll = Collective::AllToAll;
  sh.count = 4;
  auto bruck = reg.find(Collective::AllToAll, "bruck")->rounds(sh);
  ASSERT_TRUE(bruck.isOk());
  EXPECT_EQ(bruck->size(), 10u);  // ceil(log2 1000)
  sh.coll = Collective::Broadcast;
  sh.count = 1000000;
  auto sag = reg.find(Collective::Broadcast, "scatter_allgather")->rounds(sh);
  ASSERT_TRUE(sag.isOk());
  EXPECT_EQ(sag->back().repeat, 999u);
}

// Bruck allgather sends one contiguous run of blocks per round, so its rounds
// are Shift patterns for any n: 131,072 ranks are log2 n = 17 rounds, round
// k sending min(2^k, n - 2^k) = 2^k blocks to r - 2^k (Shift by n - 2^k),
// without expanding a program (deriveRounds refuses n > 256).
TEST(SimRounds, BruckAllGatherBeyondDerivedLimit) {
  Registry reg = Registry::builtin();
  Shape sh;
  sh.coll = Collective::AllGather;
  sh.nranks = 131072;
  sh.count = 5;
  auto rs = reg.find(Collective::AllGather, "bruck")->rounds(sh);
  ASSERT_TRUE(rs.isOk()) << rs.status().message();
  ASSERT_EQ(rs->size(), 17u);
  uint64_t total = 0;
  for (size_t k = 0; k < rs->size(); ++k) {
    const Round& r = (*rs)[k];
    EXPECT_EQ(r.peers, Peers::Shift) << k;
    EXPECT_EQ(r.repeat, 1u) << k;
    EXPECT_EQ(r.arg, 131072 - (int64_t{1} << k)) << k;
    EXPECT_EQ(r.elems, (uint64_t{1} << k) * 5) << k;
    total += r.elems;
  }
  EXPECT_EQ(total, 131071u * 5);  // every rank receives the n - 1 other blocks once
  // A non-power of two: the last round sends only the n - 2^k missing blocks.
  sh.nranks = 100000;
  rs = reg.find(Collective::AllGather, "bruck")->rounds(sh);
  ASSERT_TRUE(rs.isOk());
  ASSERT_EQ(rs->size(), 17u);  // ceil(log2 100000)
  EXPECT_EQ(rs->back().arg, 100000 - 65536);
  EXPECT_EQ(rs->back().elems, (100000u - 65536u) * 5);
}

// Recursive doubling on a non-power of two: the fold pairs (0,1),(2,3) for
// rem = 6 - 4 = 2, then xor rounds over the 4 core ranks {1,3,4,5}.
TEST(SimRounds, FoldedRecursiveDoubling) {
  Registry reg = Registry::builtin();
  Shape sh;
  sh.nranks = 6;
  sh.count = 10;
  auto rd = reg.find(Collective::AllReduce, "recursive_doubling")->rounds(sh);
  ASSERT_TRUE(rd.isOk());
  ASSERT_EQ(rd->size(), 4u);  // fold in, mask 1, mask 2, fold out
  std::vector<Pair> xor1;
  forEachMessage((*rd)[1], 6, [&](int s, int d, uint64_t) { xor1.push_back({s, d}); });
  EXPECT_EQ(xor1, (std::vector<Pair>{{1, 3}, {3, 1}, {4, 5}, {5, 4}}));
}

TEST(SimRounds, DerivedRoundsRefuseLargeN) {
  Registry reg = Registry::builtin();
  Shape sh;
  sh.nranks = kMaxDerivedRanks + 1;
  sh.count = 1024;
  auto r = deriveRounds(*reg.find(Collective::AllReduce, "ring"), sh);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("rounds()"), std::string::npos);
}

}  // namespace
}  // namespace chorus::plan
