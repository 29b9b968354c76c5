// Every registered plan, verified symbolically for 1..16 ranks (and a few
// larger counts), ragged counts, every root and in-place.
#include <gtest/gtest.h>

#include <fmt/ranges.h>

#include <map>
#include <set>

#include "plan/canonical.hpp"
#include "plan/plan.hpp"
#include "plan/verify.hpp"
#include "sim/network.hpp"
#include "toolkit/bench.hpp"
#include "trace/record.hpp"

namespace chorus::plan {
namespace {

VerifyCase makeCase(Collective c, int n, uint64_t count, int root, bool inplace, uint64_t chunk) {
  VerifyCase vc;
  vc.shape.coll = c;
  vc.shape.nranks = n;
  vc.shape.count = count;
  vc.shape.root = root;
  vc.shape.inplace = inplace;
  vc.shape.chunk_elems = chunk;
  if (c == Collective::AllGatherV) {
    size_t off = 0;
    for (int r = 0; r < n; ++r) {
      vc.counts.push_back((count + r * 3) % 5);  // ragged, some zero
      vc.displs.push_back(off);
      off += vc.counts.back() + (r % 2);  // gaps
    }
  }
  if (c == Collective::AllToAllV) {
    // send_counts[r][p] = amount r sends to p.
    vc.send_counts.assign(n, std::vector<size_t>(n));
    for (int r = 0; r < n; ++r)
      for (int p = 0; p < n; ++p) vc.send_counts[r][p] = (count + r * 7 + p * 3) % 4;
    vc.send_displs.assign(n, std::vector<size_t>(n));
    vc.recv_counts.assign(n, std::vector<size_t>(n));
    vc.recv_displs.assign(n, std::vector<size_t>(n));
    for (int r = 0; r < n; ++r) {
      size_t so = 0, ro = 0;
      for (int p = 0; p < n; ++p) {
        vc.send_displs[r][p] = so;
        so += vc.send_counts[r][p];
        vc.recv_counts[r][p] = vc.send_counts[p][r];
        vc.recv_displs[r][p] = ro;
        ro += vc.recv_counts[r][p] + 1;
      }
    }
  }
  return vc;
}

bool hasRoot(Collective c) {
  return c == Collective::Broadcast || c == Collective::Reduce || c == Collective::Gather || c == Collective::Scatter;
}
bool inplaceMeaningful(Collective c) { return c != Collective::Barrier && c != Collective::AllToAllV; }

TEST(Plan, EveryRegisteredAlgorithmVerifies) {
  Registry reg = Registry::builtin();
  ASSERT_FALSE(reg.all().empty());
  int verified = 0;
  for (const auto& algo : reg.all()) {
    const Collective c = algo->collective();
    for (int n : {1, 2, 3, 4, 5, 7, 8, 13, 16}) {
      for (uint64_t count : {0, 1, 7, 33}) {
        for (uint64_t chunk : {0, 2}) {
          for (bool inplace : {false, true}) {
            if (inplace && !inplaceMeaningful(c)) continue;
            for (int root = 0; root < (hasRoot(c) ? n : 1); ++root) {
              VerifyCase vc = makeCase(c, n, count, root, inplace, chunk);
              if (!algo->supports(vc.shape)) continue;
              Status st = verify(*algo, vc);
              ASSERT_TRUE(st.isOk()) << st.message();
              ++verified;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(verified, 1000);
}

TEST(Plan, LargeRankCounts) {
  Registry reg = Registry::builtin();
  for (const auto& algo : reg.all()) {
    for (int n : {31, 64}) {
      VerifyCase vc = makeCase(algo->collective(), n, 70, n / 3, false, 0);
      if (!algo->supports(vc.shape)) continue;
      Status st = verify(*algo, vc);
      ASSERT_TRUE(st.isOk()) << st.message();
    }
  }
}

// The algorithms that read Shape::hosts (direct, hierarchical), proven for
// 1..64 ranks on several host layouts: one host, contiguous blocks of ranks,
// ranks dealt round-robin over hosts, and uneven layouts, which an algorithm
// must either prove or refuse (supports() false).  Without a layout they
// refuse, so the simulator (which sets none) never picks them.
// gcc defines __SANITIZE_*__; clang answers __has_feature.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
constexpr bool kSanitized = __has_feature(address_sanitizer) || __has_feature(thread_sanitizer);
#else
constexpr bool kSanitized = false;
#endif

std::vector<std::vector<int>> hostLayouts(int n) {
  std::vector<std::vector<int>> ls;
  ls.push_back(std::vector<int>(n, 42));  // one host
  for (int H = 2; H <= n; ++H) {
    if (n % H != 0 || (H != 2 && H != n && H != n / 2 && H != 3)) continue;
    std::vector<int> blocks(n), strided(n);
    for (int r = 0; r < n; ++r) {
      blocks[r] = 100 + r / (n / H);  // ids need not be ranks
      strided[r] = (r % H) * 7;
    }
    ls.push_back(blocks);
    ls.push_back(strided);
  }
  if (n >= 3) {  // uneven: one rank alone, the rest on another host; and 1,2,3,... ranks
    std::vector<int> lone(n, 1), steps(n);
    lone[n / 2] = 0;
    for (int r = 0, h = 0, k = 1, left = 1; r < n; ++r) {
      steps[r] = h;
      if (--left == 0) left = ++k, ++h;
    }
    ls.push_back(lone);
    ls.push_back(steps);
  }
  return ls;
}

bool uniform(const std::vector<int>& hosts) {
  std::map<int, int> per;
  for (int h : hosts) ++per[h];
  for (auto& [h, c] : per)
    if (c != per.begin()->second) return false;
  return true;
}

TEST(Plan, LocalityAwareAlgorithmsVerifyOnHostLayouts) {
  Registry reg = Registry::builtin();
  std::map<std::string, int> verified;
  for (const auto& algo : reg.all()) {
    const Collective c = algo->collective();
    const std::string key = fmt::format("{}:{}", collectiveName(c), algo->name());
    if (algo->name() != "direct" && algo->name() != "hierarchical") continue;
    for (int n = 1; n <= 64; ++n) {
      // Under the sanitizers, every rank count to 16 and a sample of the
      // larger ones (primes, powers of two and their neighbours): 27 s
      // became 103 s under ASan (docs/hardening.md); the default build
      // verifies all of them.
      if (kSanitized && n > 16 && n != 17 && n != 24 && n != 31 && n != 32 && n != 33 && n != 48 && n != 63 && n != 64)
        continue;
      const bool big = n > 16 && n != 31 && n != 64;
      for (const std::vector<int>& hosts : hostLayouts(n)) {
        std::set<int> distinct(hosts.begin(), hosts.end());
        for (uint64_t count : {0, 1, 7, 33}) {
          if (big && count != 33) continue;
          for (uint64_t chunk : {0, 2}) {
            if (big && chunk != 0) continue;
            for (bool inplace : {false, true}) {
              VerifyCase vc = makeCase(c, n, count, 0, inplace, chunk);
              vc.hosts = hosts;
              vc.shape.hosts = vc.hosts;
              const bool ok = algo->supports(vc.shape);
              // What each refuses: direct every layout but one host;
              // hierarchical one host and uneven layouts.
              if (algo->name() == "direct") {
                EXPECT_EQ(ok, distinct.size() == 1) << key << " n=" << n;
              } else {
                EXPECT_EQ(ok, distinct.size() >= 2 && uniform(hosts)) << key << " n=" << n;
              }
              if (!ok) continue;
              Status st = verify(*algo, vc);
              ASSERT_TRUE(st.isOk()) << st.message() << " hosts=" << fmt::format("{}", fmt::join(hosts, ","));
              ++verified[key];
            }
          }
        }
      }
    }
    // Without a host layout, never.
    VerifyCase vc = makeCase(c, 4, 7, 0, false, 0);
    EXPECT_FALSE(algo->supports(vc.shape)) << key;
  }
  EXPECT_GT(verified["allreduce:direct"], 250);
  EXPECT_GT(verified["allreduce:hierarchical"], 500);
  EXPECT_GT(verified["allgather:hierarchical"], 500);
  EXPECT_GT(verified["alltoall:hierarchical"], 500);
}

// A deliberately wrong plan must be caught: a ring allreduce that forgets the
// last reduce-scatter step double-counts nothing but leaves blocks partial.
class BrokenAllReduce final : public Algorithm {
 public:
  std::string_view name() const override { return "broken"; }
  Collective collective() const override { return Collective::AllReduce; }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    // Each rank reduces its input with its successor's, once: misses the others.
    const int n = sh.nranks;
    b.copy(out(0, sh.count), in(0, sh.count));
    if (n == 1) return;
    Region tmp = b.scratch(sh.count);
    b.send((r + 1) % n, in(0, sh.count));
    b.recv((r + n - 1) % n, tmp);
    b.reduce(out(0, sh.count), out(0, sh.count), tmp);
  }
};

class DoubleCountingAllReduce final : public Algorithm {
 public:
  std::string_view name() const override { return "double_counting"; }
  Collective collective() const override { return Collective::AllReduce; }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    (void)r;
    b.reduce(out(0, sh.count), in(0, sh.count), in(0, sh.count));  // x + x
  }
};

TEST(Plan, WrongPlansAreRejected) {
  BrokenAllReduce broken;
  Status st = verify(broken, makeCase(Collective::AllReduce, 3, 5, 0, false, 0));
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("broken"), std::string::npos);
  EXPECT_NE(st.message().find("3 ranks"), std::string::npos);
  DoubleCountingAllReduce dc;
  st = verify(dc, makeCase(Collective::AllReduce, 2, 4, 0, false, 0));
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("poisoned"), std::string::npos);
}

TEST(Plan, DependenciesOrderAliasedBuffers) {
  // In-place allgather: the send of the own block reads the output slot that
  // the copy would write; the builder must not emit the copy at all.
  Registry reg = Registry::builtin();
  const Algorithm* ring = reg.find(Collective::AllGather, "ring");
  ASSERT_NE(ring, nullptr);
  Shape sh;
  sh.coll = Collective::AllGather;
  sh.nranks = 4;
  sh.count = 8;
  sh.inplace = true;
  Program p;
  expand(*ring, sh, 2, &p);
  for (const Step& s : p.steps) EXPECT_NE(s.op, StepOp::Copy);
  for (const Step& s : p.steps) {
    EXPECT_NE(s.dst.buf, Buf::Input);
    EXPECT_NE(s.src.buf, Buf::Input);
  }
}

}  // namespace
}  // namespace chorus::plan

// One vocabulary (issue 18 part 4): the bench, the trace reports and the
// simulator read the collectives' names and busbw factors from
// plan::kCollectiveFacts, so they agree for every collective and rank count,
// and each factor is nccl-tests' (doc/PERFORMANCE.md).
namespace chorus::plan {
namespace {
TEST(CollectiveFacts, EveryConsumerReadsTheSameTable) {
  for (int i = 0; i < kNumCollectives; ++i) {
    const auto c = static_cast<Collective>(i);
    Collective parsed{};
    ASSERT_TRUE(parseCollective(collectiveName(c), &parsed)) << collectiveName(c);
    EXPECT_EQ(parsed, c);
    for (int n : {1, 2, 3, 8, 72}) {
      const double f = busBwFactor(c, n);
      EXPECT_DOUBLE_EQ(trace::busBwFactor(static_cast<uint8_t>(i), n), f) << collectiveName(c) << " n " << n;
      EXPECT_DOUBLE_EQ(sim::busBandwidthFactor(c, n), f) << collectiveName(c) << " n " << n;
      for (tools::bench::Collective b : tools::bench::allCollectives())
        if (tools::bench::planCollective(b) == c)
          EXPECT_DOUBLE_EQ(tools::bench::busBwFactor(b, n), f) << collectiveName(c) << " n " << n;
      const double m = n > 1 ? (n - 1.0) / n : 0;
      const double want = c == Collective::AllReduce ? 2 * m
                          : c == Collective::Broadcast || c == Collective::Reduce ? 1
                          : c == Collective::Barrier ? 0
                                                     : m;
      EXPECT_DOUBLE_EQ(f, want) << collectiveName(c) << " n " << n;
    }
  }
  EXPECT_EQ(trace::busBwFactor(kNumCollectives, 8), 0.0);  // a value from a file that is no collective
  EXPECT_EQ(trace::algBytes(200, 1024, 4, 8), 0u);
  // The bench runs every collective but the v-variants, and sendrecv (not a
  // collective of plan's), and parses back what it prints.
  EXPECT_EQ(tools::bench::allCollectives().size(), static_cast<size_t>(kNumCollectives - 2 + 1));
  for (tools::bench::Collective b : tools::bench::allCollectives()) {
    auto p = tools::bench::parseCollective(tools::bench::collectiveName(b));
    ASSERT_TRUE(p.isOk());
    EXPECT_EQ(*p, b);
    const std::optional<Collective> c = tools::bench::planCollective(b);
    if (!c) continue;
    EXPECT_EQ(tools::bench::collectiveName(b), collectiveName(*c));
    EXPECT_EQ(tools::bench::takesOp(b), reduces(*c));
  }
  EXPECT_FALSE(tools::bench::parseCollective("allgatherv").isOk());
}

// Point-to-point operations are not collectives (issue 18 part 4): no entry
// of the facts table, the tuner or the parser; the trace and the bench count
// a send or receive as nccl-tests' sendrecv does (algbw = busbw, count x elem).
TEST(CollectiveFacts, PointToPointIsNoCollective) {
  Collective c{};
  EXPECT_FALSE(parseCollective("sendrecv", &c));
  EXPECT_FALSE(parseCollective("send", &c));
  for (int i = 0; i < kNumCollectives; ++i) {
    EXPECT_NE(kCollectiveFacts[i].name, "sendrecv");
    EXPECT_NE(kCollectiveFacts[i].name, pointToPointName(PointToPoint::Send));
    EXPECT_NE(kCollectiveFacts[i].name, pointToPointName(PointToPoint::Recv));
  }
  EXPECT_EQ(pointToPointName(PointToPoint::Send), "send");
  EXPECT_EQ(pointToPointName(PointToPoint::Recv), "recv");
  for (uint8_t k : {trace::kOpSend, trace::kOpRecv}) {
    EXPECT_TRUE(trace::isPointToPoint(k));
    EXPECT_GE(k, kNumCollectives);
    EXPECT_EQ(trace::busBwFactor(k, 8), 1.0);
    EXPECT_EQ(trace::algBytes(k, 1024, 4, 8), 4096u);
  }
  EXPECT_FALSE(trace::isPointToPoint(static_cast<uint8_t>(Collective::Barrier)));
  EXPECT_FALSE(tools::bench::planCollective(tools::bench::Collective::SendRecv).has_value());
  EXPECT_EQ(tools::bench::busBwFactor(tools::bench::Collective::SendRecv, 8), 1.0);
  EXPECT_EQ(tools::bench::collectiveName(tools::bench::Collective::SendRecv), "sendrecv");
}

// ---- Reproducible reductions, canonical mode (plan/canonical.hpp) -----------

namespace canonical_tests {

// Every plan a reducing call can run under canonical mode: the canonical
// plan a registered algorithm is replaced by, or the one-shot plan itself;
// proven to combine every element in the canonical tree for 1..16 ranks,
// ragged and sliced counts, every root, in and out of place.
TEST(PlanCanonical, EveryPlanRunUnderCanonicalCombinesInTheCanonicalTree) {
  Registry reg = Registry::builtin();
  const std::vector<int> one_host(16, 0);
  int verified = 0;
  std::set<std::string> plans;
  for (const auto& chosen : reg.all()) {
    const Collective c = chosen->collective();
    if (!reduces(c)) continue;
    for (int n = 1; n <= 16; ++n)
      for (uint64_t count : {0, 1, 5, 19})
        for (uint64_t chunk : {0, 2})
          for (bool inplace : {false, true})
            for (int root = 0; root < (hasRoot(c) ? n : 1); root += (n > 4 ? 3 : 1)) {
              VerifyCase vc = makeCase(c, n, count, root, inplace, chunk);
              vc.hosts.assign(one_host.begin(), one_host.begin() + n);
              vc.shape.canonical = true;
              const Algorithm* run = canonicalPlanFor(chosen.get(), vc.shape);
              ASSERT_NE(run, nullptr);
              if (!run->supports(vc.shape)) continue;
              Status st = verify(*run, vc);
              ASSERT_TRUE(st.isOk()) << "chosen " << chosen->name() << ": " << st.message();
              plans.insert(fmt::format("{}:{}", collectiveName(c), run->name()));
              ++verified;
            }
  }
  // Both canonical families ran for every reducing collective they cover.
  EXPECT_TRUE(plans.count("allreduce:canonical") && plans.count("allreduce:oneshot") &&
              plans.count("reducescatter:canonical") && plans.count("reducescatter:oneshot") &&
              plans.count("reduce:canonical"))
      << fmt::format("{}", plans);
  EXPECT_GT(verified, 1000);
}

// The canonical tree fixes the association: the ring (and the one-shot plan
// in its rank order) combine differently, and the verifier says so.
TEST(PlanCanonical, NonCanonicalPlansAreRejected) {
  Registry reg = Registry::builtin();
  for (auto [c, name] : {std::pair{Collective::AllReduce, "ring"}, std::pair{Collective::ReduceScatter, "ring"},
                         std::pair{Collective::Reduce, "binomial"}}) {
    const Algorithm* algo = reg.find(c, name);
    ASSERT_NE(algo, nullptr) << name;
    // (Recursive doubling is not here: with partners at distance 1, 2, 4 and
    // its fold of the first ranks it builds the canonical tree for some
    // counts, e.g. 4, 5 and 8, by coincidence of the two rules; the binomial
    // tree's association differs for 5 and 13 ranks.)
    const bool binomial = std::string_view(name) == "binomial";
    for (int n : {4, 5, 8, 13}) {
      if (binomial && (n & (n - 1)) == 0) continue;
      VerifyCase vc = makeCase(c, n, 7, 0, false, 0);
      if (!algo->supports(vc.shape)) continue;
      ASSERT_TRUE(verify(*algo, vc).isOk()) << name;  // a correct reduction ...
      vc.shape.canonical = true;
      Status st = verify(*algo, vc);  // ... but not in the canonical order
      ASSERT_FALSE(st.isOk()) << name << " with " << n << " ranks passed as canonical";
      EXPECT_NE(st.message().find("canonical tree"), std::string::npos) << st.message();
    }
  }
  // The one-shot plan in rank order: for 2 and 3 ranks that is the
  // canonical tree ((0+1)+2), for 4 it is not: ((0+1)+2)+3 against
  // (0+1)+(2+3).
  const Algorithm* oneshot = reg.find(Collective::AllReduce, "oneshot");
  ASSERT_NE(oneshot, nullptr);
  VerifyCase vc = makeCase(Collective::AllReduce, 4, 3, 0, false, 0);
  vc.shape.canonical = true;
  EXPECT_TRUE(verify(*oneshot, vc).isOk());  // the one-shot plan in tree order
  struct RankOrder final : Algorithm {
    const Algorithm* inner;
    explicit RankOrder(const Algorithm* a) : inner(a) {}
    std::string_view name() const override { return "oneshot_rank_order"; }
    Collective collective() const override { return Collective::AllReduce; }
    void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
      Shape s = sh;
      s.canonical = false;  // the plain one-shot plan: rank order
      inner->generate(s, r, b);
    }
  } rank_order(oneshot);
  Status st = verify(rank_order, vc);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("(((0+1)+2)+3)"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("((0+1)+(2+3))"), std::string::npos) << st.message();
}

}  // namespace canonical_tests
}  // namespace
}  // namespace chorus::plan
