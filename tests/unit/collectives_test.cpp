// Every collective through the C API, ranks as threads, checked element by
// element against the independent reference in support/collective_check.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdlib>

#include "support/collective_check.hpp"
#include "support/rank_threads.hpp"

namespace chorus::testing {
namespace {

std::string runAll(int rank, chorusComm_t comm, const std::vector<Case>& cases, chorusStream_t stream = nullptr) {
  const bool verbose = std::getenv("CHORUS_TEST_VERBOSE") != nullptr;
  for (const Case& c : cases) {
    if (verbose) fprintf(stderr, "rank %d: %s\n", rank, c.name().c_str());
    std::string err = runCase(comm, c, stream);
    if (!err.empty()) return err;
  }
  return "";
}

class RankCount : public ::testing::TestWithParam<int> {};

// Every dtype x op x collective x in-place at small ragged counts.
TEST_P(RankCount, AllDtypesAllOps) {
  const int n = GetParam();
  auto cases = standardCases(n, {0, 1, 7}, /*all_dtypes=*/true);
  auto msgs = runRanks(n, [&](int r, chorusComm_t c) { return runAll(r, c, cases); });
  EXPECT_EQ(failures(msgs), "");
}

// Large, non-divisible counts through the pipelined paths.
TEST_P(RankCount, LargeCountsFloat) {
  const int n = GetParam();
  auto cases = standardCases(n, {1000003}, /*all_dtypes=*/false);
  auto msgs = runRanks(n, [&](int r, chorusComm_t c) { return runAll(r, c, cases); });
  EXPECT_EQ(failures(msgs), "");
}

INSTANTIATE_TEST_SUITE_P(Ranks, RankCount, ::testing::Values(1, 2, 3, 4, 5, 7, 8));

// A configuration forcing algorithms (CHORUS_ALGO's syntax) and, with tcp,
// TCP between every pair of ranks (CHORUS_TRANSPORT=tcp).
Config configWith(const std::string& algo_spec, bool tcp) {
  Config cfg;
  cfg.tune.algo_spec = algo_spec;
  cfg.net.transport = tcp ? "tcp" : "auto";
  return cfg;
}

class TcpRankCount : public ::testing::TestWithParam<int> {};
TEST_P(TcpRankCount, ForcedTcp) {
  const int n = GetParam();
  auto cases = standardCases(n, {0, 7, 100003}, /*all_dtypes=*/false);
  auto msgs = runRanks(n, configWith("", true), [&](int r, chorusComm_t c) { return runAll(r, c, cases); });
  EXPECT_EQ(failures(msgs), "");
}
INSTANTIATE_TEST_SUITE_P(Ranks, TcpRankCount, ::testing::Values(2, 3, 5));

// Every allreduce algorithm, forced in turn (CHORUS_ALGO), against the
// reference: every dtype and op at small ragged counts, float32 at counts
// that cut into ragged blocks and pipeline slices.  The tuner falls back to
// its own choice when a forced algorithm does not handle the layout, so each
// rank also asserts (chorusCommPredict) that the forced one is what ran.
// The hierarchical algorithm needs several hosts: it runs over TCP, where every
// rank is a host of its own (several ranks per host: tests/integration).
struct AlgoCase {
  const char* algo;
  int nranks;
  bool tcp;
};
class AllReduceAlgorithm : public ::testing::TestWithParam<AlgoCase> {};
TEST_P(AllReduceAlgorithm, MatchesReference) {
  const AlgoCase p = GetParam();
  std::vector<Case> cases;
  for (const Case& c : standardCases(p.nranks, {0, 1, 7, 4099, 300007}, /*all_dtypes=*/true))
    if (c.coll == Coll::AllReduce && (c.count < 1000 || (c.dtype == chorusFloat32 && c.op == chorusSum)))
      cases.push_back(c);
  auto msgs = runRanks(p.nranks, configWith(fmt::format("allreduce:{}", p.algo), p.tcp),
                       [&](int r, chorusComm_t c) -> std::string {
    for (size_t count : {7, 300007}) {
      char algo[64] = {};
      double us = 0;
      if (chorusCommPredict(c, "allreduce", count, chorusFloat32, 0, algo, sizeof algo, &us) != chorusSuccess)
        return chorusGetLastError(c);
      if (std::string(algo) != p.algo) return fmt::format("rank {}: forced {} but the tuner ran {}", r, p.algo, algo);
    }
    return runAll(r, c, cases);
  });
  EXPECT_EQ(failures(msgs), "");
}
INSTANTIATE_TEST_SUITE_P(
    Algorithms, AllReduceAlgorithm,
    ::testing::Values(AlgoCase{"direct", 2, false}, AlgoCase{"direct", 3, false}, AlgoCase{"direct", 4, false},
                      AlgoCase{"direct", 7, false}, AlgoCase{"oneshot", 2, false}, AlgoCase{"oneshot", 3, false},
                      AlgoCase{"oneshot", 5, false}, AlgoCase{"oneshot", 3, true}, AlgoCase{"hierarchical", 3, true},
                      AlgoCase{"hierarchical", 4, true}),
    [](const auto& info) { return fmt::format("{}_{}{}", info.param.algo, info.param.nranks, info.param.tcp ? "_tcp" : ""); });

// The hierarchical allgather and alltoall, every rank its own host (TCP).
TEST(Collectives, HierarchicalAllGatherAndAllToAll) {
  const int n = 3;
  std::vector<Case> cases;
  for (const Case& c : standardCases(n, {0, 1, 7, 100003}, /*all_dtypes=*/true))
    if ((c.coll == Coll::AllGather || c.coll == Coll::AllToAll) && (c.count < 1000 || c.dtype == chorusFloat32))
      cases.push_back(c);
  auto msgs = runRanks(n, configWith("allgather:hierarchical,alltoall:hierarchical", true),
                       [&](int r, chorusComm_t c) -> std::string {
    for (const char* coll : {"allgather", "alltoall"}) {
      char algo[64] = {};
      double us = 0;
      if (chorusCommPredict(c, coll, 100003, chorusFloat32, 0, algo, sizeof algo, &us) != chorusSuccess)
        return chorusGetLastError(c);
      if (std::string(algo) != "hierarchical") return fmt::format("rank {}: {} ran {}", r, coll, algo);
    }
    return runAll(r, c, cases);
  });
  EXPECT_EQ(failures(msgs), "");
}

// Bruck allgather, forced, on shm and tcp: rotated gathering in scratch, one
// message per round, the rotation into the output; in place and out of place,
// n = 3, 5 (the last round sends n - 2^k < 2^k blocks), 8 and 13.
TEST(Collectives, BruckAllGather) {
  for (bool tcp : {false, true})
    for (int n : {3, 5, 8, 13}) {
      if (tcp && n > 5) continue;
      std::vector<Case> cases;
      for (const Case& c : standardCases(n, {0, 1, 7, 100003}, /*all_dtypes=*/true))
        if (c.coll == Coll::AllGather && (c.count < 1000 || c.dtype == chorusFloat32)) cases.push_back(c);
      auto msgs = runRanks(n, configWith("allgather:bruck", tcp), [&](int r, chorusComm_t c) -> std::string {
        char algo[64] = {};
        double us = 0;
        if (chorusCommPredict(c, "allgather", 100003, chorusFloat32, 0, algo, sizeof algo, &us) != chorusSuccess)
          return chorusGetLastError(c);
        if (std::string(algo) != "bruck") return fmt::format("rank {}: allgather ran {}", r, algo);
        return runAll(r, c, cases);
      });
      EXPECT_EQ(failures(msgs), "") << n << " ranks" << (tcp ? " over tcp" : "");
    }
}

// The one-shot allgather, reduce-scatter, all-to-all and broadcast, forced, on shm (the
// board within its size, the executor above it) and on tcp, against the
// reference: in place and out of place, ragged and zero counts.
TEST(Collectives, OneShotFamily) {
  for (bool tcp : {false, true})
    for (int n : {2, 3, 5}) {
      if (tcp && n != 3) continue;
      std::vector<Case> cases;
      for (const Case& c : standardCases(n, {0, 1, 7, 201, 100003}, /*all_dtypes=*/true))
        if ((c.coll == Coll::AllGather || c.coll == Coll::ReduceScatter || c.coll == Coll::AllToAll ||
             c.coll == Coll::Broadcast) &&
            (c.count < 1000 || c.dtype == chorusFloat32))
          cases.push_back(c);
      auto msgs = runRanks(n, configWith("allgather:oneshot;reducescatter:oneshot;alltoall:oneshot;broadcast:oneshot", tcp),
                           [&](int r, chorusComm_t c) -> std::string {
        for (const char* coll : {"allgather", "reducescatter", "alltoall", "broadcast"}) {
          char algo[64] = {};
          double us = 0;
          if (chorusCommPredict(c, coll, 201, chorusFloat32, 0, algo, sizeof algo, &us) != chorusSuccess)
            return chorusGetLastError(c);
          if (std::string(algo) != "oneshot") return fmt::format("rank {}: {} ran {}", r, coll, algo);
        }
        return runAll(r, c, cases);
      });
      EXPECT_EQ(failures(msgs), "") << n << " ranks" << (tcp ? " over tcp" : "");
    }
}

TEST(Collectives, ManyRanks) {
  for (int n : {13, 16}) {
    auto cases = standardCases(n, {5, 4099}, /*all_dtypes=*/false);
    auto msgs = runRanks(n, [&](int r, chorusComm_t c) { return runAll(r, c, cases); });
    EXPECT_EQ(failures(msgs), "") << n << " ranks";
  }
}

TEST(Collectives, StreamWithManyQueuedOps) {
  const int n = 4;
  auto msgs = runRanks(n, [&](int r, chorusComm_t comm) -> std::string {
    chorusStream_t s;
    if (chorusStreamCreate(&s) != chorusSuccess) return "stream create failed";
    const int kOps = 200;
    std::vector<std::vector<float>> bufs(kOps, std::vector<float>(257));
    for (int k = 0; k < kOps; ++k)
      for (size_t i = 0; i < bufs[k].size(); ++i) bufs[k][i] = static_cast<float>(r + k + i);
    for (int k = 0; k < kOps; ++k)
      if (chorusAllReduce(bufs[k].data(), bufs[k].data(), bufs[k].size(), chorusFloat32, chorusSum, comm, s) !=
          chorusSuccess)
        return "enqueue failed";
    if (chorusStreamSynchronize(s) != chorusSuccess) return std::string("sync: ") + chorusGetLastError(comm);
    if (chorusStreamQuery(s) != chorusSuccess) return "query after sync is not success";
    chorusStreamDestroy(s);
    for (int k = 0; k < kOps; ++k)
      for (size_t i = 0; i < bufs[k].size(); ++i) {
        float want = static_cast<float>(n * (k + i) + n * (n - 1) / 2);
        if (bufs[k][i] != want) return "wrong value in op " + std::to_string(k);
      }
    // A blocking call after stream work is ordered after it.
    float x = 1;
    if (chorusAllReduce(&x, &x, 1, chorusFloat32, chorusSum, comm, nullptr) != chorusSuccess || x != n)
      return "blocking call after stream failed";
    return "";
  });
  EXPECT_EQ(failures(msgs), "");
}

TEST(Collectives, StreamMixedWithBlockingCalls) {
  const int n = 3;
  auto msgs = runRanks(n, [&](int r, chorusComm_t comm) -> std::string {
    chorusStream_t s;
    chorusStreamCreate(&s);
    std::vector<int> a(1000, r + 1);
    int b = r;
    chorusAllReduce(a.data(), a.data(), a.size(), chorusInt32, chorusSum, comm, s);
    // Issued after the stream op: must match the other ranks' second op.
    if (chorusAllReduce(&b, &b, 1, chorusInt32, chorusMax, comm, nullptr) != chorusSuccess) return "blocking failed";
    chorusStreamSynchronize(s);
    chorusStreamDestroy(s);
    if (a[999] != n * (n + 1) / 2 || b != n - 1) return "wrong results";
    return "";
  });
  EXPECT_EQ(failures(msgs), "");
}

TEST(Collectives, GroupedSendRecvAnyOrder) {
  const int n = 5;
  auto msgs = runRanks(n, [&](int r, chorusComm_t comm) -> std::string {
    // Everyone exchanges 300000 ints with everyone (incl. self), receives
    // posted in reverse order, sends in forward order, all in one group.
    const size_t cnt = 300000;
    std::vector<std::vector<int>> out(n, std::vector<int>(cnt)), in(n, std::vector<int>(cnt, -1));
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < cnt; ++i) out[p][i] = r * 1000 + p + static_cast<int>(i % 7);
    chorusGroupStart();
    for (int p = n - 1; p >= 0; --p) chorusRecv(in[p].data(), cnt, chorusInt32, p, comm, nullptr);
    for (int p = 0; p < n; ++p) chorusSend(out[p].data(), cnt, chorusInt32, p, comm, nullptr);
    if (chorusGroupEnd() != chorusSuccess) return std::string("group: ") + chorusGetLastError(comm);
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < cnt; ++i)
        if (in[p][i] != p * 1000 + r + static_cast<int>(i % 7)) return "wrong data from " + std::to_string(p);
    return "";
  });
  EXPECT_EQ(failures(msgs), "");
}

TEST(Collectives, SplitCommunicatorsUsedConcurrently) {
  const int n = 6;
  auto msgs = runRanks(n, [&](int r, chorusComm_t comm) -> std::string {
    chorusComm_t even_odd = nullptr, halves = nullptr, none = nullptr;
    if (chorusCommSplit(comm, r % 2, -r, &even_odd) != chorusSuccess) return std::string("split1: ") + chorusGetLastError(comm);
    if (chorusCommSplit(comm, r / 3, r, &halves) != chorusSuccess) return "split2";
    if (chorusCommSplit(comm, r == 0 ? 0 : CHORUS_SPLIT_NOCOLOR, 0, &none) != chorusSuccess) return "split3";
    if ((r == 0) != (none != nullptr)) return "NOCOLOR handling wrong";
    int sz = 0, rk = 0;
    chorusCommCount(even_odd, &sz);
    chorusCommUserRank(even_odd, &rk);
    // key = -r: ranks ordered by descending parent rank.
    if (sz != 3 || rk != 2 - r / 2) return "split rank/size wrong: " + std::to_string(rk) + "/" + std::to_string(sz);
    // Use both split communicators at once from two threads of this rank.
    std::string e1, e2;
    std::thread t([&] {
      for (int k = 0; k < 20; ++k) {
        long v = r;
        if (chorusAllReduce(&v, &v, 1, chorusInt64, chorusSum, even_odd, nullptr) != chorusSuccess) e1 = "eo failed";
        long want = r % 2 == 0 ? 0 + 2 + 4 : 1 + 3 + 5;
        if (v != want) e1 = "eo wrong";
      }
    });
    for (int k = 0; k < 20; ++k) {
      std::vector<float> v(5000, static_cast<float>(r));
      if (chorusAllReduce(v.data(), v.data(), v.size(), chorusFloat32, chorusSum, halves, nullptr) != chorusSuccess)
        e2 = "halves failed";
      float want = r < 3 ? 0 + 1 + 2 : 3 + 4 + 5;
      if (v[4999] != want) e2 = "halves wrong";
    }
    t.join();
    chorusCommDestroy(even_odd);
    chorusCommDestroy(halves);
    if (none) chorusCommDestroy(none);
    return e1 + e2;
  });
  EXPECT_EQ(failures(msgs), "");
}

}  // namespace
}  // namespace chorus::testing
