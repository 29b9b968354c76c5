// The transport registry (transport/registry.hpp): its rules, the routes it
// chooses, and a transport written in tests/ (support/loop_transport) that
// plugs in without any edit to src/ and runs the collective matrix against
// the independent reference.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "api/config.hpp"
#include "plan/plan.hpp"
#include "support/collective_check.hpp"
#include "support/loop_transport.hpp"
#include "support/rank_threads.hpp"
#include "transport/registry.hpp"

namespace chorus::testing {
namespace {

transport::TransportInfo dummy(std::string name, int pref, bool serves_all = true) {
  transport::TransportInfo t;
  t.name = std::move(name);
  t.preference = pref;
  t.serves = [serves_all](const transport::WireView& v, int peer) { return serves_all || v.sameHost(peer); };
  t.create = [](const transport::SetupContext&) -> Result<transport::Created> { return internalError("dummy"); };
  return t;
}

bootstrap::HostIdentity host(const char* name) {
  bootstrap::HostIdentity h;
  std::snprintf(h.hostname, sizeof h.hostname, "%s", name);
  return h;
}

TEST(TransportRegistry, RefusesBadNamesDuplicatesAndIncompleteEntries) {
  transport::TransportRegistry r;
  EXPECT_TRUE(r.add(dummy("net", 50)).isOk());
  EXPECT_FALSE(r.add(dummy("net", 60)).isOk());  // taken
  for (const char* bad : {"", "auto", "mixed", "Net", "a-b", "a+b", "abcdefghijklmnopq"})
    EXPECT_FALSE(r.add(dummy(bad, 1)).isOk()) << bad;
  transport::TransportInfo no_create = dummy("nocreate", 1);
  no_create.create = nullptr;
  EXPECT_FALSE(r.add(std::move(no_create)).isOk());
  EXPECT_EQ(r.names(), std::vector<std::string>{"net"});
  const Status unknown = r.checkName("ib");
  ASSERT_FALSE(unknown.isOk());
  EXPECT_NE(unknown.message().find("accepted: auto, net"), std::string::npos) << unknown.message();
  EXPECT_TRUE(r.checkName("auto").isOk());
  EXPECT_TRUE(r.checkName("net").isOk());
}

// Each peer takes the most preferred transport that serves it; a forced one
// goes first for every peer it serves; a peer nobody serves is an error
// naming it.
TEST(TransportRegistry, ChoosesEachPeersRouteByPreferenceAndForcing) {
  transport::TransportRegistry r;
  ASSERT_TRUE(r.add(dummy("wire", 50)).isOk());
  ASSERT_TRUE(r.add(dummy("local", 10, /*serves_all=*/false)).isOk());
  EXPECT_EQ(r.names(), (std::vector<std::string>{"local", "wire"}));
  const std::vector<transport::RankRecord> ranks = {{0, 1, host("a")}, {1, 2, host("a")}, {2, 3, host("b")}};
  Config cfg;
  const transport::WireView view{0, ranks, &cfg};
  auto rc = r.choose(view, "auto");
  ASSERT_TRUE(rc.isOk()) << rc.status().message();
  EXPECT_EQ(rc->by_rank[0], nullptr);
  EXPECT_EQ(rc->by_rank[1]->name, "local");
  EXPECT_EQ(rc->by_rank[2]->name, "wire");
  ASSERT_EQ(rc->used.size(), 2u);
  EXPECT_EQ(rc->used[0]->name, "local");
  auto forced = r.choose(view, "wire");
  ASSERT_TRUE(forced.isOk());
  EXPECT_EQ(forced->by_rank[1]->name, "wire");
  EXPECT_EQ(forced->used.size(), 1u);
  // Forcing a transport that serves only some peers leaves the others theirs.
  auto local_first = r.choose(view, "local");
  ASSERT_TRUE(local_first.isOk());
  EXPECT_EQ(local_first->by_rank[2]->name, "wire");
  EXPECT_FALSE(r.choose(view, "ib").isOk());
  // Any rank can work out any pair's route.
  EXPECT_EQ(r.routeFor(view, 1, 0, "auto")->name, "local");
  EXPECT_EQ(r.routeFor(view, 2, 1, "auto")->name, "wire");

  transport::TransportRegistry only_local;
  ASSERT_TRUE(only_local.add(dummy("local", 10, false)).isOk());
  auto none = only_local.choose(view, "auto");
  ASSERT_FALSE(none.isOk());
  EXPECT_NE(none.status().message().find("rank 2"), std::string::npos) << none.status().message();
}

// The built-in transports are registered from CHORUS_TRANSPORTS, and the
// config accepts any registered name, listing them when it does not know one.
TEST(TransportRegistry, BuiltinsAndTheConfigKnob) {
  const auto names = transport::registry().names();
  EXPECT_NE(std::find(names.begin(), names.end(), "shm"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "tcp"), names.end());
  EXPECT_TRUE(transport::registry().find("shm")->caps.board);
  EXPECT_TRUE(transport::registry().find("shm")->caps.rma);  // one-sided operations (docs/rma.md, rma_test)
  EXPECT_TRUE(transport::registry().find("tcp")->caps.rma);
  EXPECT_FALSE(transport::registry().find("tcp")->caps.board);
  EXPECT_TRUE(transport::registry().find("shm")->host_local);
  auto parse = [](const char* v) {
    return api::parseConfig([v](std::string_view k) -> std::optional<std::string> {
      if (k == "CHORUS_TRANSPORT") return std::string(v);
      return std::nullopt;
    });
  };
  auto bad = parse("loopy");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("accepted: auto, shm, tcp"), std::string::npos) << bad.status().message();
  registerLoopTransport();
  auto ok = parse("loop");
  ASSERT_TRUE(ok.isOk()) << ok.status().message();
  EXPECT_EQ(ok->net.transport, "loop");
}

std::string runAll(chorusComm_t comm, const std::vector<Case>& cases) {
  for (const Case& c : cases)
    if (std::string err = runCase(comm, c); !err.empty()) return err;
  return "";
}

// The communicator runs over "loop" alone (the route key the tuner and
// chorus-tune see says so), and every collective x dtype x op x in place
// matches the reference.
class LoopMatrix : public ::testing::TestWithParam<int> {};
TEST_P(LoopMatrix, EveryCollectiveMatchesTheReference) {
  registerLoopTransport();
  const int n = GetParam();
  Config cfg;
  cfg.net.transport = kLoopTransport;
  // Every dtype and op at small ragged counts, float32 through the pipelined
  // paths at a large one.
  auto cases = standardCases(n, {0, 1, 7}, /*all_dtypes=*/true);
  for (const Case& c : standardCases(n, {100003}, /*all_dtypes=*/false)) cases.push_back(c);
  auto msgs = runRanks(n, cfg, [&](int r, chorusComm_t c) -> std::string {
    const std::vector<std::string> used = api::commTransports(c);
    if (n > 1 && used != std::vector<std::string>{kLoopTransport})
      return fmt::format("rank {}: transports {}, not loop alone", r, fmt::join(used, ","));
    if (n > 1 && api::commRouteKey(c) != kLoopTransport)
      return fmt::format("rank {}: route key {}", r, api::commRouteKey(c));
    return runAll(c, cases);
  });
  EXPECT_EQ(failures(msgs), "");
}
INSTANTIATE_TEST_SUITE_P(Ranks, LoopMatrix, ::testing::Values(1, 2, 3, 5));

// Eight ranks (more threads than cores: every wait sleeps), small counts.
TEST(LoopTransport, EightRanksSmallCounts) {
  registerLoopTransport();
  Config cfg;
  cfg.net.transport = kLoopTransport;
  auto cases = standardCases(8, {0, 7}, /*all_dtypes=*/false);
  auto msgs = runRanks(8, cfg, [&](int, chorusComm_t c) { return runAll(c, cases); });
  EXPECT_EQ(failures(msgs), "");
}

// Every allreduce algorithm that takes the shape, forced in turn, over loop.
TEST(LoopTransport, EveryAllReduceAlgorithm) {
  registerLoopTransport();
  const plan::Registry reg = plan::Registry::builtin();
  const int n = 4;
  std::vector<Case> cases;
  for (const Case& c : standardCases(n, {0, 1, 7, 4099, 300007}, /*all_dtypes=*/false))
    if (c.coll == Coll::AllReduce) cases.push_back(c);
  for (const plan::Algorithm* a : reg.forCollective(plan::Collective::AllReduce)) {
    if (a->compressed() || a->exact() || a->name() == "hierarchical") continue;  // need their own shapes / hosts
    Config cfg;
    cfg.net.transport = kLoopTransport;
    cfg.tune.algo_spec = fmt::format("allreduce:{}", a->name());
    auto msgs = runRanks(n, cfg, [&](int, chorusComm_t c) { return runAll(c, cases); });
    EXPECT_EQ(failures(msgs), "") << a->name();
  }
}

// A message of another length or another call fails the receive with
// chorusMismatch on the loop transport too (its contract, transport.hpp).
TEST(LoopTransport, MismatchedCountsAreNamedNotCorrupted) {
  registerLoopTransport();
  Config cfg;
  cfg.net.transport = kLoopTransport;
  cfg.timeout = std::chrono::milliseconds(20000);
  auto msgs = runRanks(2, cfg, [&](int r, chorusComm_t c) -> std::string {
    std::vector<float> x(r == 0 ? 8 : 16, 1.0f);
    const chorusResult_t res = chorusAllReduce(x.data(), x.data(), x.size(), chorusFloat32, chorusSum, c, nullptr);
    if (res != chorusMismatch) return fmt::format("rank {}: got {} ({})", r, static_cast<int>(res), chorusGetLastError(c));
    return "";
  });
  EXPECT_EQ(failures(msgs), "");
}

}  // namespace
}  // namespace chorus::testing
